# libFuzzer targets of the HTTP front end. Include this file from fuzz/CMakeLists.txt
# after its SHOAL_BUILD_FUZZERS / Clang checks:
#   include(${CMAKE_CURRENT_SOURCE_DIR}/http.cmake)
# Build:  CC=clang CXX=clang++ cmake -B build-fuzz -DSHOAL_BUILD_FUZZERS=ON \
#           -DSHOAL_SANITIZE=address -DSHOAL_BUILD_TESTS=OFF -DSHOAL_BUILD_BENCHMARKS=OFF
#         cmake --build build-fuzz --target http_infer_fuzzer binary_splitter_fuzzer
# Run:    build-fuzz/fuzz/http_infer_fuzzer fuzz/http_corpus/infer -max_len=65536
#         build-fuzz/fuzz/binary_splitter_fuzzer fuzz/http_corpus/binary_splitter

# Coverage feedback from the codec itself, not only from the fuzzers' own files.
target_compile_options(shoal_http_codec PRIVATE -fsanitize=fuzzer-no-link)
target_compile_options(shoal_proto PRIVATE -fsanitize=fuzzer-no-link)

foreach(fuzzer http_infer_fuzzer binary_splitter_fuzzer)
  add_executable(${fuzzer} ${fuzzer}.cc)
  target_link_libraries(${fuzzer} PRIVATE shoal_http_codec)
  target_compile_options(${fuzzer} PRIVATE -fsanitize=fuzzer ${SHOAL_WARNINGS})
  target_link_options(${fuzzer} PRIVATE -fsanitize=fuzzer)
endforeach()
