# Triton-compatibility end-to-end tests: health while models load, --strict-readiness, the
# request log (--log-verbose), Triton's metric names, the model config within Triton's
# schema. Over HTTP and gRPC, against the real `shoal serve`.
shoal_cc_test(NAME e2e_compat_test SRCS compat_test.cc
  DEPS shoal_e2e_util shoal_runtime_testing_configs shoal_proto_grpc shoal_http_test_client
  LABELS e2e)
add_dependencies(e2e_compat_test shoal shoal_identity shoal_cost_model)
