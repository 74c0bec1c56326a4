# `shoal bench` end to end: the real `shoal serve` and the real `shoal bench` against it.
shoal_cc_test(NAME e2e_bench_test SRCS bench_test.cc DEPS shoal_e2e_util shoal_runtime_testing_configs LABELS e2e)
add_dependencies(e2e_bench_test shoal shoal_identity shoal_cost_model)
