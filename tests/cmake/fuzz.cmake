# Fuzz targets (tests/fuzz/): each is built with clang's libFuzzer by tests/fuzz/build.sh and its
# seed corpus is replayed once, without mutation, as a regression test. Skipped (77) when clang
# with libFuzzer is not installed. Long fuzzing runs are manual: see docs/fuzzing.md.
find_program(DS_BASH bash)
if(DS_BASH)
  add_test(NAME fuzz_safetensors_corpus
           COMMAND ${DS_BASH} ${CMAKE_SOURCE_DIR}/tests/fuzz/run_corpus.sh fuzz_safetensors
                   ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/safetensors
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(fuzz_safetensors_corpus PROPERTIES SKIP_RETURN_CODE 77 LABELS cpu
                       TIMEOUT 300 ENVIRONMENT "DS_FUZZ_OUT=${CMAKE_BINARY_DIR}/fuzz")
endif()
