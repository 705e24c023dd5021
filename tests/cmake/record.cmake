# test_record reads the run file back through the plain HDF5 C API, so it needs HDF5's headers
# (ds_profiler keeps them private).
if(TARGET test_record)
  target_include_directories(test_record PRIVATE ${HDF5_INCLUDE_DIRS})
  target_link_libraries(test_record PRIVATE ${HDF5_C_LIBRARIES})
endif()
