# test_record reads the run file back through the plain HDF5 C API, so it needs HDF5's headers
# (ds_profiler keeps them private).
if(TARGET test_record)
  target_include_directories(test_record PRIVATE ${HDF5_INCLUDE_DIRS})
  target_link_libraries(test_record PRIVATE ${HDF5_C_LIBRARIES})
endif()

# The sample run files read back with h5py (skipped, 77, where h5py is not installed).
# The project's virtual environment (scripts/setup_venv.sh) has h5py; prefer it.
set(DS_H5PY_PYTHON ${Python3_EXECUTABLE})
if(EXISTS ${CMAKE_SOURCE_DIR}/.venv/bin/python)
  set(DS_H5PY_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python)
endif()
if(TARGET test_record AND (Python3_Interpreter_FOUND OR EXISTS ${DS_H5PY_PYTHON}))
  set(DS_RECORD_SAMPLES ${CMAKE_BINARY_DIR}/record_samples)
  add_test(NAME record_h5py
           COMMAND sh -c "mkdir -p '${DS_RECORD_SAMPLES}' && \
'$<TARGET_FILE:test_record>' --write-samples '${DS_RECORD_SAMPLES}' && \
'${DS_H5PY_PYTHON}' '${CMAKE_SOURCE_DIR}/tests/data/check_run_file_h5py.py' '${DS_RECORD_SAMPLES}'")
  set_tests_properties(record_h5py PROPERTIES SKIP_RETURN_CODE 77 LABELS cpu
                       ENVIRONMENT "${DS_TEST_ENV}" TIMEOUT 120)
endif()
