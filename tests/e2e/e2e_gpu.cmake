# A KIND_GPU model beside its KIND_CPU twin over HTTP: the same scores where a GPU is
# usable, a load failure with its reason (and the twin serving) everywhere else. With the
# CUDA path built, the test also shares device memory with the server (CUDA shared memory).
shoal_cc_test(NAME e2e_gpu_test SRCS gpu_test.cc
  DEPS shoal_e2e_util shoal_http_test_client LABELS e2e)
add_dependencies(e2e_gpu_test shoal)
if(SHOAL_BUILD_TESTS AND SHOAL_CUDA)
  target_link_libraries(e2e_gpu_test PRIVATE shoal_cuda)
  target_compile_definitions(e2e_gpu_test PRIVATE SHOAL_E2E_CUDA_BUILD=1)
endif()
