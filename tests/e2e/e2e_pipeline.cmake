# A model run as pipeline stages (the onnx backend's pipeline_stages) served over HTTP:
# outputs equal the whole model's, and the bubble-ratio gauge is exported.
shoal_cc_test(NAME e2e_pipeline_test SRCS pipeline_test.cc
  DEPS shoal_e2e_util shoal_http_test_client LABELS e2e)
add_dependencies(e2e_pipeline_test shoal)
