# `shoal serve` start-up and connection options: port clashes before loading, bind
# addresses, HTTP connection limits from flags and --config.
shoal_cc_test(NAME e2e_serve_test SRCS serve_test.cc
  DEPS shoal_e2e_util shoal_runtime_testing_configs shoal_http_test_client LABELS e2e)
add_dependencies(e2e_serve_test shoal shoal_identity)
