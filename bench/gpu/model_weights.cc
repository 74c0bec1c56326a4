// The GPU benchmark's large models without their weights: ResNet-50 and BERT-base are
// ~100 and ~440 MB of random weights, too large to commit or to carry to the GPU machine,
// and random weights do not compress. So the repository holds their graphs with the large
// weights stripped (bench/gpu/models/*.onnx.stripped), and the device script fills them in
// there, deterministically, before timing them.
//   gpu_model_weights strip IN.onnx OUT   every fp32 initializer of >= 4096 values loses its
//                                         data (dims kept) and is marked to be filled
//   gpu_model_weights fill IN OUT.onnx    fills every marked initializer with seeded uniform
//                                         values scaled by its fan-in, as a fresh model's are
// The fan-in comes from the node that reads the weight: a Conv's [M, C/g, kh, kw] weight
// has C/g·kh·kw, a Gemm's [K, N] (or [N, K] with transB) and a MatMul's [K, N] have K; a
// Gather's table is an embedding. Values are uniform in ±sqrt(6 / fan-in) for a Conv (He,
// for the ReLU after it), ±sqrt(3 / fan-in) for a product and ±0.035 for an embedding
// (standard deviation 0.02), so activations stay in range through the network in every
// precision, and the timing is that of real data. Small initializers (biases, norms,
// shapes) stay as exported.
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

namespace {

constexpr int64_t kStripFrom = 4096;                  // values
constexpr const char* kMark = "shoal:filled-weight";  // the stripped initializers' doc_string

bool Read(const std::string& path, onnx::ModelProto* model) {
  std::ifstream in(path, std::ios::binary);
  if (!in || !model->ParseFromIstream(&in)) {
    std::fprintf(stderr, "gpu_model_weights: cannot read an ONNX model from %s\n", path.c_str());
    return false;
  }
  return true;
}

bool Write(const std::string& path, const onnx::ModelProto& model) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out || !model.SerializeToOstream(&out)) {
    std::fprintf(stderr, "gpu_model_weights: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

int64_t Count(const onnx::TensorProto& t) {
  int64_t n = 1;
  for (int64_t d : t.dims()) n *= d;
  return n;
}

int Strip(onnx::ModelProto& model) {
  int stripped = 0;
  int64_t values = 0;
  for (onnx::TensorProto& t : *model.mutable_graph()->mutable_initializer()) {
    if (t.data_type() != onnx::TensorProto::FLOAT || Count(t) < kStripFrom) continue;
    if (t.data_location() == onnx::TensorProto::EXTERNAL) {
      std::fprintf(stderr,
                   "gpu_model_weights: '%s' is stored outside the model; export it inline\n",
                   t.name().c_str());
      return -1;
    }
    t.clear_raw_data();
    t.clear_float_data();
    t.set_doc_string(kMark);
    ++stripped;
    values += Count(t);
  }
  std::printf("stripped %d initializers, %lld values\n", stripped, static_cast<long long>(values));
  return stripped;
}

// How a weight is filled: the half-width of its uniform distribution.
double HalfWidth(const onnx::TensorProto& t, const onnx::NodeProto* reader) {
  const auto& d = t.dims();
  auto product_from = [&](int first) {
    double p = 1;
    for (int i = first; i < d.size(); ++i) p *= static_cast<double>(d[i]);
    return p;
  };
  if (reader != nullptr && reader->op_type() == "Gather") return 0.02 * std::sqrt(3.0);
  if (reader != nullptr && reader->op_type() == "Conv") return std::sqrt(6.0 / product_from(1));
  double fan_in = d.size() >= 2 ? static_cast<double>(d[0]) : 1.0;
  if (reader != nullptr && reader->op_type() == "Gemm") {
    for (const onnx::AttributeProto& a : reader->attribute())
      if (a.name() == "transB" && a.i() != 0 && d.size() == 2) fan_in = static_cast<double>(d[1]);
  }
  return std::sqrt(3.0 / std::max(1.0, fan_in));
}

int Fill(onnx::ModelProto& model) {
  // The first node that reads each initializer.
  std::map<std::string, const onnx::NodeProto*> reader;
  for (const onnx::NodeProto& n : model.graph().node())
    for (const std::string& in : n.input()) reader.emplace(in, &n);
  int filled = 0;
  uint64_t state = 0x5eed;
  for (onnx::TensorProto& t : *model.mutable_graph()->mutable_initializer()) {
    if (t.doc_string() != kMark) continue;
    auto it = reader.find(t.name());
    const double a = HalfWidth(t, it == reader.end() ? nullptr : it->second);
    const int64_t n = Count(t);
    std::string bytes(static_cast<size_t>(n) * sizeof(float), '\0');
    auto* values = reinterpret_cast<float*>(bytes.data());
    for (int64_t i = 0; i < n; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;  // PCG's LCG step
      const double u = static_cast<double>(state >> 40) / static_cast<double>(1ull << 24);
      values[i] = static_cast<float>((2 * u - 1) * a);
    }
    t.set_raw_data(std::move(bytes));
    t.clear_doc_string();
    ++filled;
  }
  std::printf("filled %d initializers\n", filled);
  return filled;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || (std::strcmp(argv[1], "strip") != 0 && std::strcmp(argv[1], "fill") != 0)) {
    std::fprintf(stderr, "usage: gpu_model_weights strip|fill IN OUT\n");
    return 2;
  }
  onnx::ModelProto model;
  if (!Read(argv[2], &model)) return 1;
  const int changed = std::strcmp(argv[1], "strip") == 0 ? Strip(model) : Fill(model);
  if (changed < 0) return 1;
  if (changed == 0) {
    std::fprintf(stderr, "gpu_model_weights: %s: no initializer to %s\n", argv[2], argv[1]);
    return 1;
  }
  return Write(argv[3], model) ? 0 : 1;
}
