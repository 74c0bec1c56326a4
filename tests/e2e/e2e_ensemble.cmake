# Ensembles end to end: the real `shoal serve` on the example repository's VAE pipelines,
# over HTTP, gRPC and gRPC streaming (each answer compared with running its steps one by
# one), and through `shoal run`.
shoal_cc_test(NAME e2e_ensemble_test SRCS ensemble_test.cc
  DEPS shoal_e2e_util shoal_proto_grpc shoal_http_test_client shoal_npy LABELS e2e)
add_dependencies(e2e_ensemble_test shoal)
