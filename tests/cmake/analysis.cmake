# The metrics summary test reads and writes raw HDF5 (malformed files), so it needs HDF5's headers
# (ds_profiler keeps them private).
if(TARGET test_summary)
  target_include_directories(test_summary PRIVATE ${HDF5_INCLUDE_DIRS})
  target_link_libraries(test_summary PRIVATE ${HDF5_C_LIBRARIES})
endif()

# The Python analysis package's tests (analysis/tests, pytest), run with the project's virtual
# environment (.venv at the repository root, made by scripts/setup_venv.sh). They read files that
# the C test programs write, so the C writer and the Python reader are tested against each other,
# and compare the Python metrics with `draftscope summary --json`. One ctest entry per test file
# so they run in parallel. Skipped (77) when the virtual environment is missing; pytest's "no
# tests collected" (5) is reported as a skip too, never as a failure.
set(DS_VENV_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python)
if(TARGET test_summary AND TARGET test_record)
  foreach(part reader metrics plots report notebook)
    add_test(NAME analysis_${part}
             COMMAND sh -c "if [ ! -x '${DS_VENV_PYTHON}' ]; then \
echo 'skipped: no .venv (run scripts/setup_venv.sh)'; exit 77; fi; \
cd '${CMAKE_SOURCE_DIR}/analysis' && '${DS_VENV_PYTHON}' -m pytest -q -p no:cacheprovider \
tests/test_${part}.py; rc=$?; [ $rc -eq 5 ] && exit 77; exit $rc")
    set_tests_properties(analysis_${part} PROPERTIES SKIP_RETURN_CODE 77 LABELS cpu TIMEOUT 600
      ENVIRONMENT "DS_SOURCE_DIR=${CMAKE_SOURCE_DIR};DS_BINARY_DIR=${CMAKE_BINARY_DIR};\
DS_TEST_SUMMARY=$<TARGET_FILE:test_summary>;DS_TEST_RECORD=$<TARGET_FILE:test_record>;\
DS_DRAFTSCOPE=$<TARGET_FILE:draftscope>;MPLBACKEND=Agg;\
ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=0;\
LSAN_OPTIONS=suppressions=${CMAKE_SOURCE_DIR}/tests/lsan.supp")
  endforeach()
endif()
