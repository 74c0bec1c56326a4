# gRPC end-to-end tests: the real `shoal serve`, a client from src/server/grpc_service.proto
# (and the HTTP test client, to read the metrics endpoint).
shoal_cc_test(NAME e2e_grpc_test SRCS grpc_test.cc
  DEPS shoal_e2e_util shoal_runtime_testing_configs shoal_proto_grpc shoal_http_test_client LABELS e2e)
add_dependencies(e2e_grpc_test shoal shoal_identity shoal_add_sub shoal_cost_model)
