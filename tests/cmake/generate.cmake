# test_generate reads the --logits-out file back through the plain HDF5 C API, so it needs HDF5's
# headers (ds_profiler keeps them private).
if(TARGET test_generate)
  target_include_directories(test_generate PRIVATE ${HDF5_INCLUDE_DIRS})
  target_link_libraries(test_generate PRIVATE ${HDF5_C_LIBRARIES})
endif()
