# A KIND_GPU model beside its KIND_CPU twin over HTTP: the same scores where a GPU is
# usable, a load failure with its reason (and the twin serving) everywhere else.
shoal_cc_test(NAME e2e_gpu_test SRCS gpu_test.cc
  DEPS shoal_e2e_util shoal_http_test_client LABELS e2e)
add_dependencies(e2e_gpu_test shoal)
