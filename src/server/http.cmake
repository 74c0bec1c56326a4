# HTTP/REST front end (Open Inference Protocol + Triton extensions) and the Prometheus
# metrics endpoint. Included by CMakeLists.txt beside this file.
find_package(ZLIB REQUIRED)
find_package(simdjson REQUIRED)

# The infer codec: parsing and serialization without sockets (HTTP messages themselves
# are src/proto's); it speaks in the runtime's request and response structs and limits.
# What the unit tests and the fuzzers (fuzz/http.cmake) exercise.
shoal_cc_library(NAME http_codec
  SRCS http_json.cc http_infer_parser.cc http_infer_codec.cc
  HDRS http_json.h http_infer_codec.h
  DEPS shoal_proto shoal_runtime shoal_server_extensions simdjson::simdjson ZLIB::ZLIB)

shoal_cc_library(NAME http
  SRCS http_core.cc http_loop.cc http_loop_request.cc http_loop_response.cc http_routes.cc http_server.cc
       http_extensions.cc
  HDRS http_core.h http_loop.h http_connection.h http_routes.h http_server.h http_extensions.h
  DEPS shoal_http_codec shoal_server_common shoal_runtime protobuf::libprotobuf Threads::Threads)
# simdjson's On-Demand API is compiled for the instruction set the compiler may assume;
# without flags that is its slow scalar "fallback". SSE4.2 + PCLMUL ("westmere") runs on
# every x86-64 CPU since 2010.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set_source_files_properties(http_json.cc http_infer_parser.cc http_extensions.cc PROPERTIES
    COMPILE_OPTIONS "-msse4.2;-mpclmul")
endif()
# The version reported by GET /v2.
set_source_files_properties(http_routes.cc PROPERTIES
  COMPILE_DEFINITIONS "SHOAL_VERSION=\"${PROJECT_VERSION}\"")

shoal_cc_library(NAME metrics
  SRCS metrics.cc
  HDRS metrics.h
  DEPS shoal_http shoal_dashboard)

# A small blocking HTTP/1.1 client for tests (unit and end-to-end).
shoal_cc_library(NAME http_test_client
  SRCS http_test_client.cc
  HDRS http_test_client.h
  DEPS shoal_proto ZLIB::ZLIB OpenSSL::SSL)

shoal_cc_test(NAME server_http_infer_parser_test SRCS http_infer_parser_test.cc
  DEPS shoal_http_codec shoal_http_test_client)
shoal_cc_test(NAME server_http_core_test SRCS http_core_test.cc DEPS shoal_http shoal_http_test_client)
shoal_cc_test(NAME server_http_core_tls_test SRCS http_core_tls_test.cc
  DEPS shoal_http shoal_http_test_client)
shoal_cc_test(NAME server_http_routes_test SRCS http_routes_test.cc DEPS shoal_http)
shoal_cc_test(NAME server_http_server_test SRCS http_server_test.cc
  DEPS shoal_http shoal_metrics shoal_http_test_client shoal_runtime_testing)
shoal_cc_test(NAME server_metrics_test SRCS metrics_test.cc DEPS shoal_metrics shoal_runtime_testing)
if(SHOAL_BUILD_TESTS)
  # The in-process server tests load the example plugins (built in examples/backends).
  add_dependencies(server_http_server_test shoal_identity shoal_add_sub shoal_cost_model)
  add_dependencies(server_metrics_test shoal_identity shoal_add_sub shoal_cost_model)
endif()
