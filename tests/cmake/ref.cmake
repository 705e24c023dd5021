# The independent references behind the golden fixtures (tests/fixtures/golden): rerun each
# generator with --check and compare with the committed files (checkpoints bit for bit, golden
# floats within 1e-4, token ids exactly). Needs torch + transformers + safetensors; exits 77
# (skipped) without them, as on CI. Labelled slow: together they take about a minute.
if(Python3_Interpreter_FOUND)
  add_test(NAME ref_gptoss_golden_check
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/ref/gptoss_ref.py
                   ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/golden --check --skip-without-torch)
  add_test(NAME ref_eagle3_golden_check
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/ref/eagle3_ref.py
                   ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/golden --check --skip-without-torch)
  set_tests_properties(ref_gptoss_golden_check ref_eagle3_golden_check PROPERTIES
                       SKIP_RETURN_CODE 77 LABELS "cpu;slow" TIMEOUT 900)
endif()
