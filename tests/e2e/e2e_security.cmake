# Authentication (--auth-token-file) and TLS (--tls-*, Triton's --grpc-use-ssl...) end to
# end: the real `shoal serve`, HTTP(S) and gRPC(-with-TLS) clients, the committed test
# certificates of src/server/testdata/tls.
shoal_cc_test(NAME e2e_security_test SRCS security_test.cc
  DEPS shoal_e2e_util shoal_runtime_testing_configs shoal_proto_grpc shoal_http_test_client
  LABELS e2e)
add_dependencies(e2e_security_test shoal shoal_identity)
