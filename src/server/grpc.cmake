# The gRPC front end (docs/open-inference-protocol.md section 3). Included by
# src/server/CMakeLists.txt; every gRPC target lives here.
#
#   shoal_grpc                GrpcServer (grpc_server.h), the handlers and the codec
#   server_grpc_codec_test    proto <-> runtime conversion, no network
#   server_grpc_handlers_test the RPC handlers on a real runtime::Server, no network
#   server_grpc_server_test   GrpcServer on a loopback port, in process

# The service's messages and stubs are src/proto's shoal_proto_grpc.
shoal_cc_library(NAME grpc
  SRCS grpc_server.cc grpc_calls.cc grpc_stream.cc grpc_handlers.cc grpc_extensions.cc
       grpc_codec.cc
  HDRS grpc_server.h grpc_calls.h grpc_handlers.h grpc_codec.h
  DEPS shoal_server_common shoal_server_extensions shoal_proto_grpc gRPC::grpc++ spdlog::spdlog)
target_compile_definitions(shoal_grpc PRIVATE SHOAL_VERSION="${PROJECT_VERSION}")


shoal_cc_test(NAME server_grpc_codec_test SRCS grpc_codec_test.cc DEPS shoal_grpc)
shoal_cc_test(NAME server_grpc_handlers_test SRCS grpc_handlers_test.cc
  DEPS shoal_grpc shoal_runtime_testing)
shoal_cc_test(NAME server_grpc_server_test SRCS grpc_server_test.cc
  DEPS shoal_grpc shoal_runtime_testing)
if(SHOAL_BUILD_TESTS)
  # The example plugins (examples/backends, a folder added after this one).
  add_dependencies(server_grpc_handlers_test shoal_identity shoal_add_sub shoal_cost_model)
  add_dependencies(server_grpc_server_test shoal_identity shoal_add_sub shoal_cost_model)
  if(SHOAL_SANITIZE STREQUAL "thread")
    # Races reported inside the uninstrumented gRPC/Abseil/protobuf libraries are
    # suppressed; see the file.
    set_property(TEST server_grpc_server_test APPEND PROPERTY ENVIRONMENT
      "TSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/grpc_tsan.supp")
  endif()
endif()
