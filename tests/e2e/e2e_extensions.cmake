# Triton's protocol extensions end to end: system and CUDA shared memory, classification, logging
# and trace settings, load with a config override (HTTP and gRPC).
shoal_cc_test(NAME e2e_extensions_test SRCS extensions_test.cc
  DEPS shoal_e2e_util shoal_runtime_testing_configs shoal_http_test_client shoal_proto_grpc rt
  LABELS e2e)
add_dependencies(e2e_extensions_test shoal shoal_identity shoal_add_sub)
# Whether the shoal under test has the CUDA path decides how CUDA shared memory answers.
target_compile_definitions(e2e_extensions_test PRIVATE SHOAL_E2E_CUDA_BUILD=$<BOOL:${SHOAL_CUDA}>)
