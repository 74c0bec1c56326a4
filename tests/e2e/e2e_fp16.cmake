# An FP16 ONNX model (models/fp16_cnn.onnx) served over HTTP (binary) and gRPC (raw
# contents): FP16 metadata, outputs matching PyTorch, clear errors where FP16 cannot go.
shoal_cc_test(NAME e2e_fp16_test SRCS fp16_test.cc
  DEPS shoal_e2e_util shoal_core shoal_proto_grpc shoal_http_test_client LABELS e2e)
add_dependencies(e2e_fp16_test shoal)
