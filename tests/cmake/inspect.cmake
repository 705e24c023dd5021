# draftscope inspect and the checkpoint fixtures:
#   inspect_fixture_<draft>      each committed draft against the committed tiny target: exit 0
#   inspect_fixtures_up_to_date  the committed fixtures are byte for byte what make_fixtures.py
#                                writes
#   inspect_real_shapes          the real gpt-oss-120b / -20b tensor tables as sparse files in the
#                                build tree; inspect must report 116.8 B / 20.9 B parameters and
#                                65,248,815,744 / 13,761,264,768 tensor bytes, with no problem
#   fuzz_config_corpus           the config fuzz target over its seed corpus (skipped without clang)
set(DS_CKPT ${CMAKE_SOURCE_DIR}/tests/fixtures/ckpt)
foreach(draft draft-lmsys draft-speculators draft-nvidia-v3)
  add_test(NAME inspect_fixture_${draft}
           COMMAND draftscope inspect --target ${DS_CKPT}/target --draft ${DS_CKPT}/${draft})
  set_tests_properties(inspect_fixture_${draft} PROPERTIES LABELS cpu TIMEOUT 60
                       ENVIRONMENT "${DS_TEST_ENV}")
endforeach()

if(Python3_Interpreter_FOUND)
  add_test(NAME inspect_fixtures_up_to_date
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/fixtures/make_fixtures.py
                   --check ${DS_CKPT})
  set_tests_properties(inspect_fixtures_up_to_date PROPERTIES LABELS cpu TIMEOUT 120)

  add_test(NAME inspect_real_shapes
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/fixtures/make_real_shapes.py
                   ${CMAKE_BINARY_DIR}/real-shapes --check $<TARGET_FILE:draftscope>)
  set_tests_properties(inspect_real_shapes PROPERTIES LABELS cpu TIMEOUT 120
                       ENVIRONMENT "${DS_TEST_ENV}")
endif()

find_program(DS_BASH bash)
if(DS_BASH AND EXISTS ${CMAKE_SOURCE_DIR}/tests/fuzz/run_corpus.sh)
  add_test(NAME fuzz_config_corpus
           COMMAND ${DS_BASH} ${CMAKE_SOURCE_DIR}/tests/fuzz/run_corpus.sh fuzz_config
                   ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/config models/config.c
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(fuzz_config_corpus PROPERTIES SKIP_RETURN_CODE 77 LABELS cpu TIMEOUT 300
                       ENVIRONMENT "DS_FUZZ_OUT=${CMAKE_BINARY_DIR}/fuzz")
endif()
