# `shoal run` end to end: the real binary over files, resumed and refused as a user sees it.
shoal_cc_test(NAME e2e_run_test SRCS run_test.cc
  DEPS shoal_e2e_util shoal_runtime_testing_configs shoal_npy LABELS e2e)
add_dependencies(e2e_run_test shoal shoal_add_sub)
