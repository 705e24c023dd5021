# gpu_run_synthetic reads the run file back through the plain HDF5 C API, so it needs HDF5's
# headers (ds_profiler keeps them private).
if(TARGET gpu_run_synthetic)
  target_include_directories(gpu_run_synthetic PRIVATE ${HDF5_INCLUDE_DIRS})
  target_link_libraries(gpu_run_synthetic PRIVATE ${HDF5_C_LIBRARIES})
endif()
