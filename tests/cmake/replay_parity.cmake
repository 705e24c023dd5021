# gpu_replay_parity and test_run_activations read the run file back through the plain HDF5 C API,
# so they need HDF5's headers (ds_profiler keeps them private).
foreach(t gpu_replay_parity test_run_activations)
  if(TARGET ${t})
    target_include_directories(${t} PRIVATE ${HDF5_INCLUDE_DIRS})
    target_link_libraries(${t} PRIVATE ${HDF5_C_LIBRARIES})
  endif()
endforeach()
