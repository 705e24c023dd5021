# The metrics summary test reads and writes raw HDF5 (malformed files), so it needs HDF5's headers
# (ds_profiler keeps them private).
if(TARGET test_summary)
  target_include_directories(test_summary PRIVATE ${HDF5_INCLUDE_DIRS})
  target_link_libraries(test_summary PRIVATE ${HDF5_C_LIBRARIES})
endif()

