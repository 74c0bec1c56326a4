// Helpers for engine tests: building small graphs by hand and running them.
#pragma once

#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "core/thread_util.h"
#include "engine/graph.h"
#include "engine/model.h"

namespace shoal::engine::testing {

Tensor F32(Shape shape, std::vector<float> values);
Tensor I64(Shape shape, std::vector<int64_t> values);
Tensor I32(Shape shape, std::vector<int32_t> values);
Tensor Bool(Shape shape, std::vector<uint8_t> values);
Tensor Random(Shape shape, uint32_t seed, float lo = -1.f, float hi = 1.f);
std::vector<float> Values(const Tensor& t);  // FP32 tensor to a vector
std::vector<int64_t> IntValues(const Tensor& t);

Attribute AInt(int64_t v);
Attribute AFloat(float v);
Attribute AString(std::string v);
Attribute AInts(std::vector<int64_t> v);
Attribute AFloats(std::vector<float> v);
Attribute ATensor(Tensor t);

// OpenMP's runtime (libgomp) is not instrumented for ThreadSanitizer, whose reports on
// its barriers are false positives; TSan builds run sessions single-threaded.
#if defined(SHOAL_TSAN)
inline constexpr int kTestThreads = 1;
#else
inline constexpr int kTestThreads = 2;
#endif

// SessionOptions without designated initialisers (-Wmissing-field-initializers).
inline SessionOptions Opts(int threads, std::vector<int> cores = {}, int max_cached_plans = 16) {
  SessionOptions o;
  o.threads = threads;
  o.cpu_cores = std::move(cores);
  o.max_cached_plans = max_cached_plans;
  o.single_thread_below_flops = 0;  // tests ask for their thread count, whatever the size
  return o;
}

// One operator input: a run-time input (fed by the test) or a constant (initialiser).
struct In {
  Tensor tensor;
  bool constant = false;
  bool omitted = false;  // an omitted optional input ("")
};
inline In Const(Tensor t) { return In{std::move(t), true, false}; }
inline In Omitted() { return In{Tensor(), false, true}; }

// Builds a graph with one node of `op`, loads it with `load` and runs it once.
StatusOr<std::vector<Tensor>> RunOp(const std::string& op, const std::vector<In>& inputs,
                                    const std::map<std::string, Attribute>& attrs = {},
                                    int num_outputs = 1, int64_t opset = 17,
                                    const LoadOptions& load = LoadOptions());
// As RunOp, but only loads the model (for load-time errors).
Status LoadOp(const std::string& op, const std::vector<In>& inputs,
              const std::map<std::string, Attribute>& attrs, int num_outputs = 1,
              int64_t opset = 17);

// Max |a - b| over elements; +inf on shape mismatch.
float MaxAbsDiff(const Tensor& a, const Tensor& b);
float MaxAbs(const Tensor& t);

// Reads the reference format written by models/generate.py (see models/README.md).
StatusOr<std::vector<NamedTensor>> ReadTensorFile(const std::string& path);
std::string SourceDir();
// A file of the committed models (SourceDir()/models/).
std::string ModelPath(const std::string& file);

// A reference file's tensors split by their "in:" / "out:" name prefix (the prefix dropped).
struct Reference {
  std::vector<NamedTensor> inputs, outputs;
};
// Reads ModelPath(file); on error, records a test failure and returns an empty Reference.
Reference LoadReference(const std::string& file);
// Runs `session` on ref.inputs and expects its outputs to be ref.outputs: the same
// number, names, dtypes and shapes; FP32 values within 1e-4 of the output's scale (max
// |ref|), every other type bit for bit. Failures are recorded as test failures.
void ExpectMatchesReference(Session& session, const Reference& ref);

// As RunOp, expecting success: on failure, records a test failure and returns `outs` empty
// tensors.
std::vector<Tensor> Run1(const std::string& op, const std::vector<In>& in,
                         const std::map<std::string, Attribute>& attrs = {}, int outs = 1,
                         int64_t opset = 17);

// A graph built node by node.
class GraphBuilder {
 public:
  GraphBuilder() { g_.opset = 17; }
  int Input(const std::string& name, const Shape& shape, DataType dtype = DataType::kFp32) {
    const int v = g_.AddValue(name, dtype);
    g_.values[v].shape = KnownShape(shape);
    g_.inputs.push_back(v);
    return v;
  }
  int Constant(const std::string& name, Tensor t) {
    const int v = g_.AddValue(name, t.dtype());
    g_.values[v].shape = KnownShape(t.shape());
    g_.values[v].constant = std::move(t);
    return v;
  }
  int Op(const std::string& op, const std::string& out, std::vector<int> inputs,
         const std::map<std::string, Attribute>& attrs = {}) {
    Node node;
    node.op_type = op;
    node.name = out;
    node.inputs = std::move(inputs);
    for (const auto& [k, a] : attrs) node.attributes.emplace(k, a);
    const int v = g_.AddValue(out);
    g_.values[v].producer = static_cast<int>(g_.nodes.size());
    node.outputs.push_back(v);
    g_.nodes.push_back(std::move(node));
    return v;
  }
  Graph Finish(int output) { return Finish(std::vector<int>{output}); }
  Graph Finish(std::vector<int> outputs) {
    g_.outputs = std::move(outputs);
    return std::move(g_);
  }

 private:
  Graph g_;
};

}  // namespace shoal::engine::testing
