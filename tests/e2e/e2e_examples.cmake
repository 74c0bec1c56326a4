# The example model repository end to end: the real `shoal serve` on examples/models, every
# model's metadata and one inference against tests/e2e/examples/<model>.json.
shoal_cc_test(NAME e2e_examples_test SRCS examples_test.cc
  DEPS shoal_e2e_util shoal_http_test_client LABELS e2e)
add_dependencies(e2e_examples_test shoal shoal_identity shoal_add_sub shoal_cost_model)
