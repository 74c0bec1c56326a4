#include "engine/test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

namespace shoal::engine::testing {

Tensor F32(Shape shape, std::vector<float> values) {
  return Tensor::FromVector(DataType::kFp32, std::move(shape), values);
}
Tensor I64(Shape shape, std::vector<int64_t> values) {
  return Tensor::FromVector(DataType::kInt64, std::move(shape), values);
}
Tensor I32(Shape shape, std::vector<int32_t> values) {
  return Tensor::FromVector(DataType::kInt32, std::move(shape), values);
}
Tensor Bool(Shape shape, std::vector<uint8_t> values) {
  return Tensor::FromVector(DataType::kBool, std::move(shape), values);
}

Tensor Random(Shape shape, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return F32(std::move(shape), v);
}

std::vector<float> Values(const Tensor& t) {
  auto v = t.values<float>();
  return {v.begin(), v.end()};
}

std::vector<int64_t> IntValues(const Tensor& t) {
  auto v = t.values<int64_t>();
  return {v.begin(), v.end()};
}

Attribute AInt(int64_t v) {
  Attribute a;
  a.kind = Attribute::Kind::kInt;
  a.i = v;
  return a;
}
Attribute AFloat(float v) {
  Attribute a;
  a.kind = Attribute::Kind::kFloat;
  a.f = v;
  return a;
}
Attribute AString(std::string v) {
  Attribute a;
  a.kind = Attribute::Kind::kString;
  a.s = std::move(v);
  return a;
}
Attribute AInts(std::vector<int64_t> v) {
  Attribute a;
  a.kind = Attribute::Kind::kInts;
  a.ints = std::move(v);
  return a;
}
Attribute AFloats(std::vector<float> v) {
  Attribute a;
  a.kind = Attribute::Kind::kFloats;
  a.floats = std::move(v);
  return a;
}
Attribute ATensor(Tensor t) {
  Attribute a;
  a.kind = Attribute::Kind::kTensor;
  a.t = std::move(t);
  return a;
}

namespace {

Graph BuildGraph(const std::string& op, const std::vector<In>& inputs,
                 const std::map<std::string, Attribute>& attrs, int num_outputs, int64_t opset) {
  Graph g;
  g.opset = opset;
  Node node;
  node.op_type = op;
  node.name = "test_" + op;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].omitted) {
      node.inputs.push_back(-1);
      continue;
    }
    const Tensor& t = inputs[i].tensor;
    const int id = g.AddValue("in" + std::to_string(i), t.dtype());
    SymbolicShape s;
    for (int64_t d : t.shape()) s.push_back(Dim{d, ""});
    g.values[id].shape = s;
    if (inputs[i].constant) {
      g.values[id].constant = t;
    } else {
      g.inputs.push_back(id);
    }
    node.inputs.push_back(id);
  }
  for (const auto& [k, v] : attrs) node.attributes.emplace(k, v);
  for (int o = 0; o < num_outputs; ++o) {
    const int id = g.AddValue("out" + std::to_string(o));
    g.values[id].producer = 0;
    node.outputs.push_back(id);
    g.outputs.push_back(id);
  }
  g.nodes.push_back(std::move(node));
  return g;
}

}  // namespace

StatusOr<std::vector<Tensor>> RunOp(const std::string& op, const std::vector<In>& inputs,
                                    const std::map<std::string, Attribute>& attrs, int num_outputs,
                                    int64_t opset, const LoadOptions& load) {
  ASSIGN_OR_RETURN(auto model,
                   Model::FromGraph(BuildGraph(op, inputs, attrs, num_outputs, opset), load));
  ASSIGN_OR_RETURN(auto session, Session::Create(*model, Opts(1)));
  std::vector<NamedTensor> feeds, outputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].constant && !inputs[i].omitted)
      feeds.push_back({"in" + std::to_string(i), inputs[i].tensor});
  }
  RETURN_IF_ERROR(session->Run(feeds, &outputs));
  std::vector<Tensor> result;
  for (auto& o : outputs) result.push_back(std::move(o.tensor));
  return result;
}

Status LoadOp(const std::string& op, const std::vector<In>& inputs,
              const std::map<std::string, Attribute>& attrs, int num_outputs, int64_t opset) {
  auto model = Model::FromGraph(BuildGraph(op, inputs, attrs, num_outputs, opset));
  return model.ok() ? Status::Ok() : model.status();
}

float MaxAbsDiff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    return std::numeric_limits<float>::infinity();
  auto x = a.values<float>(), y = b.values<float>();
  float m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float d = std::fabs(x[i] - y[i]);
    if (!(d <= m)) m = d;  // NaN propagates as a failure
  }
  return m;
}

float MaxAbs(const Tensor& t) {
  float m = 0;
  for (float v : t.values<float>()) m = std::max(m, std::fabs(v));
  return m;
}

// Format (little-endian): magic "SHT1", u32 count, then per tensor: u32 name length,
// name bytes, u32 dtype (shoal DataType number), u32 rank, i64 dims[rank], u64 byte
// count, bytes.
StatusOr<std::vector<NamedTensor>> ReadTensorFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  auto take = [&](void* dst, size_t n) -> bool {
    if (pos + n > data.size()) return false;
    if (n) std::memcpy(dst, data.data() + pos, n);  // dst may be null for 0 bytes
    pos += n;
    return true;
  };
  char magic[4];
  uint32_t count = 0;
  if (!take(magic, 4) || std::memcmp(magic, "SHT1", 4) != 0 || !take(&count, 4)) {
    return InvalidArgument(path + ": not a tensor file");
  }
  std::vector<NamedTensor> out;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t name_len = 0, dtype = 0, rank = 0;
    uint64_t bytes = 0;
    if (!take(&name_len, 4) || name_len > 4096) return InvalidArgument(path + ": truncated");
    std::string name(name_len, '\0');
    if (!take(name.data(), name_len) || !take(&dtype, 4) || !take(&rank, 4) || rank > 12) {
      return InvalidArgument(path + ": truncated");
    }
    Shape shape(rank);
    if (!take(shape.data(), 8 * rank) || !take(&bytes, 8) || pos + bytes > data.size()) {
      return InvalidArgument(path + ": truncated");
    }
    Tensor t = Tensor::Allocate(static_cast<DataType>(dtype), shape, bytes);
    take(t.mutable_data(), bytes);
    out.push_back({name, std::move(t)});
  }
  return out;
}

std::string SourceDir() {
  const char* s = std::getenv("SHOAL_SOURCE_DIR");
  return s ? s : ".";
}

std::string ModelPath(const std::string& file) { return SourceDir() + "/models/" + file; }

Reference LoadReference(const std::string& file) {
  auto tensors = ReadTensorFile(ModelPath(file));
  EXPECT_TRUE(tensors.ok()) << tensors.status().ToString();
  Reference ref;
  if (!tensors.ok()) return ref;
  for (auto& t : *tensors) {
    if (t.name.rfind("in:", 0) == 0) ref.inputs.push_back({t.name.substr(3), t.tensor});
    if (t.name.rfind("out:", 0) == 0) ref.outputs.push_back({t.name.substr(4), t.tensor});
  }
  return ref;
}

std::vector<Tensor> Run1(const std::string& op, const std::vector<In>& in,
                         const std::map<std::string, Attribute>& attrs, int outs, int64_t opset) {
  auto r = RunOp(op, in, attrs, outs, opset);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<Tensor>(outs);
}

void ExpectMatchesReference(Session& session, const Reference& ref) {
  std::vector<NamedTensor> outputs;
  Status s = session.Run(ref.inputs, &outputs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(outputs.size(), ref.outputs.size());
  for (const NamedTensor& want : ref.outputs) {
    auto it = std::find_if(outputs.begin(), outputs.end(),
                           [&](const NamedTensor& o) { return o.name == want.name; });
    ASSERT_NE(it, outputs.end()) << "missing output " << want.name;
    const Tensor& got = it->tensor;
    ASSERT_EQ(got.dtype(), want.tensor.dtype()) << want.name;
    ASSERT_EQ(got.shape(), want.tensor.shape()) << want.name;
    if (want.tensor.dtype() == DataType::kFp32) {
      const float scale = std::max(MaxAbs(want.tensor), 1e-6f);
      EXPECT_LE(MaxAbsDiff(got, want.tensor), 1e-4f * scale)
          << want.name << ": max |ref| " << scale << ", max error " << MaxAbsDiff(got, want.tensor);
    } else {
      EXPECT_EQ(got.bytes(), want.tensor.bytes()) << want.name << " differs";
    }
  }
}

}  // namespace shoal::engine::testing
