# libFuzzer target of the gRPC front end: the ModelInferRequest codec (grpc_codec.h).
# Included by fuzz/CMakeLists.txt after its SHOAL_BUILD_FUZZERS / Clang checks.
#   cmake --build build-fuzz --target grpc_infer_fuzzer
#   build-fuzz/fuzz/grpc_infer_fuzzer fuzz/grpc_corpus/infer -max_len=65536
if(NOT TARGET shoal_grpc)
  return()
endif()

# Coverage feedback from the codec itself, not only from the fuzzer's own file.
target_compile_options(shoal_grpc PRIVATE -fsanitize=fuzzer-no-link)

add_executable(grpc_infer_fuzzer grpc_infer_fuzzer.cc)
target_link_libraries(grpc_infer_fuzzer PRIVATE shoal_grpc)
target_compile_options(grpc_infer_fuzzer PRIVATE -fsanitize=fuzzer ${SHOAL_WARNINGS})
target_link_options(grpc_infer_fuzzer PRIVATE -fsanitize=fuzzer)
