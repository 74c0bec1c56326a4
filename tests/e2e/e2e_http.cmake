# HTTP/REST and metrics end-to-end tests: the real `shoal serve` and a plain HTTP client.
shoal_cc_test(NAME e2e_http_test SRCS http_test.cc
  DEPS shoal_e2e_util shoal_runtime_testing_configs shoal_http_test_client LABELS e2e)
shoal_cc_test(NAME e2e_metrics_test SRCS metrics_test.cc
  DEPS shoal_e2e_util shoal_http_test_client LABELS e2e)
add_dependencies(e2e_http_test shoal shoal_identity shoal_add_sub shoal_cost_model)
add_dependencies(e2e_metrics_test shoal shoal_identity shoal_add_sub shoal_cost_model)
