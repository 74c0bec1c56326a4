// libFuzzer target for the ONNX importer and the load-time checks behind it.
//
// Feeds arbitrary bytes to ImportOnnxBytes and, when they import, to Model::FromGraph
// (operator checks and shape inference by plan preparation), with small size limits so
// that a claimed huge tensor is refused rather than allocated. Any return is fine; a
// crash, sanitizer report, leak or timeout is a bug.
//
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DSHOAL_BUILD_FUZZERS=ON \
//       -DSHOAL_SANITIZE=address -DSHOAL_BUILD_TESTS=OFF -DSHOAL_BUILD_BENCHMARKS=OFF
//   cmake --build build-fuzz --target importer_fuzzer
//   build-fuzz/fuzz/importer_fuzzer -max_len=200000 fuzz/corpus/ models/
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/model.h"
#include "engine/onnx_importer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shoal::engine;
  LoadOptions options;
  options.import.max_model_bytes = 1 << 20;
  options.import.max_tensor_bytes = 16 << 20;
  options.limits.max_tensor_bytes = 16 << 20;
  // ONNX's shape inference is ONNX's code, not ours; the fuzzer exercises shoal's importer.
  options.import.infer_shapes = false;
  auto graph = ImportOnnxBytes(std::string_view(reinterpret_cast<const char*>(data), size), "",
                               options.import);
  if (!graph.ok()) return 0;
  auto model = Model::FromGraph(*std::move(graph), options);
  (void)model;
  return 0;
}
