# The bundled tiny pair's acceptance band (tests/tiny_acceptance.sh says how the figure was made).
if(Python3_Interpreter_FOUND)
  add_test(NAME tiny_acceptance_band
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/tiny_acceptance.sh $<TARGET_FILE:draftscope>
                   ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/tiny_band)
  set_tests_properties(tiny_acceptance_band PROPERTIES SKIP_RETURN_CODE 77 LABELS cpu
                       ENVIRONMENT "${DS_TEST_ENV}" TIMEOUT 600)
endif()
