# Tokenizer and dataset extras: the two benchmark programs (built, not run by ctest: they time
# things and generate a 650 MB file), bench_dataset's command line and the check of the committed
# tiktoken ids.
foreach(bench bench_tokenizer bench_dataset)
  ds_executable(${bench} ${CMAKE_CURRENT_SOURCE_DIR}/${bench}.c)
  target_compile_definitions(${bench} PRIVATE DS_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
endforeach()

# bench_dataset's --help and usage errors (exit 2, one line); its one run is on 3 conversations.
add_test(NAME bench_dataset_options
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/bench_dataset_options.sh
                 $<TARGET_FILE:bench_dataset> ${CMAKE_BINARY_DIR}/bench_dataset_options)
set_tests_properties(bench_dataset_options PROPERTIES LABELS cpu ENVIRONMENT "${DS_TEST_ENV}"
                     TIMEOUT 120)

# Reruns tests/ref/make_tokenizer_golden.py --check: the committed ids must equal tiktoken's.
# Skipped (77) where tiktoken is not installed.
if(Python3_Interpreter_FOUND)
  add_test(NAME tokenizer_golden_tiktoken
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/ref/make_tokenizer_golden.py
                   --check --skip-without-tiktoken)
  set_tests_properties(tokenizer_golden_tiktoken PROPERTIES SKIP_RETURN_CODE 77 LABELS cpu
                       TIMEOUT 300)
endif()
