// Reads an ONNX model (opsets 11 to 18) into a Graph.
//
// Accepted: the default domain at opset 11..18 (other domains may be imported; their
// operators are rejected later by the op registry with the node named), subgraphs of If
// and Loop (a graph attribute becomes a Graph of its own; values it reads from enclosing
// scopes become explicit inputs, see Graph::captures), initialisers,
// Constant nodes (turned into constant values; no node is emitted), tensor data stored
// inline or as external data in files next to the model (relative paths only, never
// leaving the model's folder).
//
// Never crashes on malformed input: every size, index and name is checked, and each
// failure is an INVALID_ARGUMENT naming what was wrong (and the node where there is one).
// Does not check operator semantics; that is Model::Load's job (model.h).
//
// Thread safety: free functions, no shared state.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"
#include "engine/graph.h"

namespace shoal::engine {

struct ImportOptions {
  // Largest model file accepted, in bytes. Default 2 GiB (protobuf's own limit).
  int64_t max_model_bytes = int64_t{2} << 30;
  // Largest single tensor (initialiser, Constant or external data), in bytes. Default 4 GiB.
  int64_t max_tensor_bytes = int64_t{4} << 30;
  // Run ONNX's own shape inference first (onnx::shape_inference::InferShapes), so that
  // intermediate values carry shapes the graph optimiser can check fusions against. A
  // model it rejects still imports, with fewer shapes known. Default on.
  bool infer_shapes = true;
};

// Imports the file at `path`; external data is resolved relative to its folder.
StatusOr<Graph> ImportOnnxFile(const std::string& path, const ImportOptions& options = {});

// Imports a serialized ModelProto. External data is resolved relative to `base_dir`;
// when `base_dir` is empty, a model referring to external data is rejected.
StatusOr<Graph> ImportOnnxBytes(std::string_view bytes, const std::string& base_dir,
                                const ImportOptions& options = {});

}  // namespace shoal::engine
