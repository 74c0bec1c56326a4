# The gRPC front end (docs/open-inference-protocol.md section 3). Included by
# src/server/CMakeLists.txt; every gRPC target lives here.
#
#   shoal_grpc_service_proto  inference.GRPCInferenceService + grpc.health.v1 messages and
#                             stubs (also used by tests/e2e for the client side)
#   shoal_grpc                GrpcServer (grpc_server.h), the handlers and the codec
#   server_grpc_codec_test    proto <-> runtime conversion, no network
#   server_grpc_handlers_test the RPC handlers on a real runtime::Server, no network
#   server_grpc_server_test   GrpcServer on a loopback port, in process

# Imported targets of gRPC (and of what its config finds: absl, c-ares, re2, OpenSSL) are
# made global, so the targets that link shoal_grpc from other folders (src/cli,
# tests/e2e) resolve them. CMAKE_FIND_PACKAGE_TARGETS_GLOBAL needs CMake >= 3.24.
set(_shoal_saved_targets_global ${CMAKE_FIND_PACKAGE_TARGETS_GLOBAL})
set(CMAKE_FIND_PACKAGE_TARGETS_GLOBAL ON)
find_package(gRPC CONFIG REQUIRED)
set(CMAKE_FIND_PACKAGE_TARGETS_GLOBAL ${_shoal_saved_targets_global})

set(SHOAL_GRPC_GEN_DIR ${CMAKE_CURRENT_BINARY_DIR}/gen)
file(MAKE_DIRECTORY ${SHOAL_GRPC_GEN_DIR}/server)
add_library(shoal_grpc_service_proto STATIC
  ${CMAKE_CURRENT_SOURCE_DIR}/grpc_service.proto
  ${CMAKE_CURRENT_SOURCE_DIR}/grpc_health.proto)
set(_shoal_grpc_import_dirs ${CMAKE_CURRENT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src/repository)
protobuf_generate(TARGET shoal_grpc_service_proto LANGUAGE cpp
  IMPORT_DIRS ${_shoal_grpc_import_dirs}
  PROTOC_OUT_DIR ${SHOAL_GRPC_GEN_DIR}/server)
protobuf_generate(TARGET shoal_grpc_service_proto LANGUAGE grpc
  GENERATE_EXTENSIONS .grpc.pb.h .grpc.pb.cc
  PLUGIN "protoc-gen-grpc=$<TARGET_FILE:gRPC::grpc_cpp_plugin>"
  IMPORT_DIRS ${_shoal_grpc_import_dirs}
  PROTOC_OUT_DIR ${SHOAL_GRPC_GEN_DIR}/server)
# The generated headers are included as "server/grpc_service.pb.h".
target_include_directories(shoal_grpc_service_proto PUBLIC ${SHOAL_GRPC_GEN_DIR})
target_link_libraries(shoal_grpc_service_proto PUBLIC
  shoal_model_config_proto protobuf::libprotobuf gRPC::grpc++)

shoal_cc_library(NAME grpc
  SRCS grpc_server.cc grpc_calls.cc grpc_stream.cc grpc_handlers.cc grpc_codec.cc
  HDRS grpc_server.h grpc_calls.h grpc_handlers.h grpc_codec.h
  DEPS shoal_server_common shoal_grpc_service_proto gRPC::grpc++ spdlog::spdlog)
target_compile_definitions(shoal_grpc PRIVATE SHOAL_VERSION="${PROJECT_VERSION}")


shoal_cc_test(NAME server_grpc_codec_test SRCS grpc_codec_test.cc DEPS shoal_grpc)
shoal_cc_test(NAME server_grpc_handlers_test SRCS grpc_handlers_test.cc DEPS shoal_grpc)
shoal_cc_test(NAME server_grpc_server_test SRCS grpc_server_test.cc DEPS shoal_grpc)
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
