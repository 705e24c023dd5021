# The bundled tiny pair (models/tiny, made by scripts/tiny/make_tiny.py):
#   test_tiny_models              (tests/test_tiny_models.c) configs, inspect, tokenizer, renderer
#   tiny_render_matches_training  the C renderer gives, for every sample conversation, turn and
#                                 reasoning effort, the ids the training data was rendered with
#   tiny_pipeline_selftest        the pipeline's MXFP4 rounding, TTT-vs-chain equivalence and
#                                 vocabulary map (needs torch; skipped without it)
if(Python3_Interpreter_FOUND)
  add_test(NAME tiny_render_matches_training
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/scripts/tiny/check_render.py
                   $<TARGET_FILE:draftscope> ${CMAKE_SOURCE_DIR}/models/tiny)
  set_tests_properties(tiny_render_matches_training PROPERTIES LABELS cpu TIMEOUT 300
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${DS_TEST_ENV}")

  add_test(NAME tiny_pipeline_selftest
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/scripts/tiny/selftest.py)
  set_tests_properties(tiny_pipeline_selftest PROPERTIES LABELS cpu TIMEOUT 300
                       SKIP_RETURN_CODE 77)
endif()
