#include "engine/cuda/gpu_lowering.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string_view>
#include <utility>

#include "core/bf16.h"
#include "core/data_type.h"
#include "core/fp16.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/internal/gpu_lowering_impl.h"
#include "engine/cuda/normalization.h"
#include "engine/internal/op_util.h"
#include "engine/memory_planner.h"

namespace shoal::engine::cuda {
namespace internal {

using engine::internal::Product;

int64_t PadTo(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

std::optional<UnaryOp> UnaryByName(std::string_view op) {
  static const std::pair<std::string_view, UnaryOp> kOps[] = {{"Relu", UnaryOp::kRelu},
                                                              {"Sigmoid", UnaryOp::kSigmoid},
                                                              {"Tanh", UnaryOp::kTanh},
                                                              {"Exp", UnaryOp::kExp},
                                                              {"Log", UnaryOp::kLog},
                                                              {"Neg", UnaryOp::kNeg},
                                                              {"Abs", UnaryOp::kAbs},
                                                              {"Sqrt", UnaryOp::kSqrt},
                                                              {"Erf", UnaryOp::kErf},
                                                              {"Gelu", UnaryOp::kGelu},
                                                              {"Floor", UnaryOp::kFloor},
                                                              {"Ceil", UnaryOp::kCeil},
                                                              {"Reciprocal", UnaryOp::kReciprocal},
                                                              {"Softplus", UnaryOp::kSoftplus}};
  for (const auto& [name, u] : kOps)
    if (name == op) return u;
  return std::nullopt;
}

namespace {

std::optional<BinaryOp> BinaryByName(std::string_view op) {
  static const std::pair<std::string_view, BinaryOp> kOps[] = {
      {"Add", BinaryOp::kAdd}, {"Sub", BinaryOp::kSub},    {"Mul", BinaryOp::kMul},
      {"Div", BinaryOp::kDiv}, {"Max", BinaryOp::kMax},    {"Min", BinaryOp::kMin},
      {"Pow", BinaryOp::kPow}, {"PRelu", BinaryOp::kPRelu}};
  for (const auto& [name, b] : kOps)
    if (name == op) return b;
  return std::nullopt;
}

}  // namespace

Status Lowerer::CheckFp32(int n) const {
  const Node& node = graph_.nodes[n];
  for (int v : node.inputs) {
    if (v >= 0 && !IsFp32(v))
      return Fail(n, "input '" + graph_.values[v].name + "' is " +
                         std::string(DataTypeName(DtypeOf(v))) + "; this kernel takes fp32");
  }
  if (!node.has_output(0) || !IsFp32(node.outputs[0])) return Fail(n, "output 0 is not fp32");
  return CheckPlain(n);
}

Status Lowerer::CheckPlain(int n) const {
  const Node& node = graph_.nodes[n];
  if (!node.has_output(0)) return Fail(n, "has no output 0");
  for (size_t o = 1; o < node.outputs.size(); ++o)
    if (node.outputs[o] >= 0) return Fail(n, "only its first output is supported");
  return CheckPlainInputs(n);
}

Status Lowerer::CheckPlainInputs(int n) const {
  for (int v : graph_.nodes[n].inputs)
    if (v >= 0 && plan_.ValueLayout(v).data.ndims != 0)
      return Fail(n,
                  "reads a value in a blocked CPU layout (prepare the plan with "
                  "GpuLoweringPlanOptions())");
  return Status::Ok();
}

int64_t Lowerer::AddBlob(const std::string& key, Tensor data, int shard) {
  for (size_t i = 0; i < out_.blobs.size(); ++i)
    if (out_.blobs[i].key == key && out_.blobs[i].shard == shard) return static_cast<int64_t>(i);
  out_.weight_bytes += static_cast<int64_t>(data.byte_size());
  out_.blobs.push_back({key, std::move(data), shard});
  return static_cast<int64_t>(out_.blobs.size()) - 1;
}

std::string Lowerer::KeyOf(int v) const {
  std::string key = "v" + std::to_string(v);
  if (graph_.values[v].is_constant()) return key;
  // Folded for this plan's shapes: the same value may hold other data at other shapes.
  const Tensor& t = *Known(v);
  char hash[24];
  std::snprintf(hash, sizeof(hash), "#%016llx",
                static_cast<unsigned long long>(XXH3_64bits(t.data(), t.byte_size())));
  return key + "@" + ShapeToString(t.shape()) + hash;
}

int64_t Lowerer::KnownSlot(int v) {
  auto it = known_slots_.find(v);
  if (it != known_slots_.end()) return it->second;
  const int64_t offset = AddBlob(KeyOf(v), *Known(v));
  known_slots_[v] = offset;
  return offset;
}

int64_t Lowerer::AddWeightBlob(const std::string& key, const Tensor& data, int shard) {
  if (!Mixed()) return AddBlob(key, data, shard);
  const DataType dtype = OperandDtype();
  const std::string half_key = key + (dtype == DataType::kFp16 ? "~fp16" : "~bf16");
  for (size_t i = 0; i < out_.blobs.size(); ++i)
    if (out_.blobs[i].key == half_key && out_.blobs[i].shard == shard)
      return static_cast<int64_t>(i);
  Tensor half = Tensor::Allocate(dtype, data.shape());
  auto src = data.values<float>();
  auto* dst = static_cast<uint16_t*>(half.mutable_data());
  if (dtype == DataType::kFp16) {
    FloatToFp16(src.data(), dst, src.size());
  } else {
    for (size_t i = 0; i < src.size(); ++i) dst[i] = FloatToBf16(src[i]);
  }
  return AddBlob(half_key, std::move(half), shard);
}

void Lowerer::FuseRoundingsIntoEpilogues() {
  std::vector<GpuStep>& steps = out_.steps;
  const int num_steps = static_cast<int>(steps.size());
  // Each rounding's step, by its 16-bit temporary.
  std::map<int, int> rounding_at;
  for (int i = 0; i < num_steps; ++i)
    if (steps[i].kind == GpuStep::Kind::kToHalf) rounding_at[steps[i].out] = i;
  std::vector<bool> drop(steps.size(), false);
  // Products that could write v in 16 bits themselves, if nothing else reads v: {writer,
  // rounding, v}.
  std::vector<std::array<int, 3>> products;
  for (const auto& [v, half] : rounded_) {
    auto at = rounding_at.find(half);
    if (at == rounding_at.end()) continue;
    const int rounding = at->second;
    const int writer = LastWriter(v, rounding);
    if (writer < 0) continue;
    GpuStep& w = steps[writer];
    // v itself, or a view of all of its bytes (a Reshape's: the same values in the same
    // order, so the rounding of w's output is v's), on the plan's stream.
    const bool whole_view =
        Owner(v) != v && w.out == Owner(v) && Product(ShapeOf(v)) == Product(ShapeOf(w.out));
    if ((w.out != v && !whole_view) || w.shard >= 0 || w.half_out >= 0) continue;
    // A product writing fp32 whose epilogue does all it does (no activation or residual
    // after it), one at a time.
    // (A constant weight: a product of computed operands is batched over the model's batch,
    // and its plans at other batch sizes must name the same blobs.)
    if (w.kind == GpuStep::Kind::kGemm && w.gemm.fp32_output && w.gemm.batch == 1 && !w.post &&
        w.in[3] < 0 && w.weight_slots[0] >= 0 && !whole_view) {
      products.push_back({writer, rounding, v});
      continue;
    }
    // A convolution's epilogue, a layer normalisation, an element-wise activation, or a
    // product's activation that its epilogue lacks (an exact GELU, say) when nothing is added
    // after it: it writes the rounding beside v.
    if (w.kind == GpuStep::Kind::kConvEpilogue || RoundsAlone(w.kind) ||
        (w.kind == GpuStep::Kind::kLayerNorm && w.weight_slots.empty()) ||
        (w.kind == GpuStep::Kind::kGemm && w.post && w.in[3] < 0)) {
      w.half_out = half;
      drop[rounding] = true;
    }
  }
  // The residuals first: a pool's output that an epilogue then reads in 16 bits may pool in
  // 16 bits itself.
  ResidualsIn16Bits(rounding_at, drop);
  PoolIn16Bits(rounding_at, drop);
  // What the steps that stay read, besides the products' candidate roundings.
  std::vector<bool> read(out_.shapes.size(), false);
  std::vector<bool> candidate(steps.size(), false);
  for (const auto& [writer, rounding, v] : products) candidate[rounding] = true;
  for (int i = 0; i < num_steps; ++i) {
    if (drop[i] || candidate[i]) continue;
    for (int u : steps[i].in)
      if (u >= 0) read[Owner(u)] = true;
    if (steps[i].scratch >= 0) read[Owner(steps[i].scratch)] = true;
  }
  for (int u : graph_.outputs) read[Owner(u)] = true;
  // A product whose fp32 result only its rounding reads writes the 16-bit value itself
  // (cuBLASLt's epilogue in fp32, rounded once at the end), with its bias in 16 bits, as
  // such a product's output and bias are (GemmOptions::fp32_output false).
  bool biases_rounded = false;
  for (const auto& [writer, rounding, v] : products) {
    if (Owner(v) != v || read[v]) continue;
    GpuStep& w = steps[writer];
    w.gemm.fp32_output = false;
    w.out = steps[rounding].out;
    if (w.weight_slots[1] >= 0) {
      const GpuLowering::Blob bias = out_.blobs[static_cast<size_t>(w.weight_slots[1])];
      w.weight_slots[1] = AddWeightBlob(bias.key, bias.data, bias.shard);
      biases_rounded = true;
    }
    drop[rounding] = true;
  }
  // An epilogue from a 16-bit output, or an activation, whose fp32 result nothing reads now
  // writes 16 bits alone.
  for (GpuStep& w : steps) {
    const bool alone =
        (w.kind == GpuStep::Kind::kConvEpilogue && w.conv_epilogue.source) || RoundsAlone(w.kind);
    if (alone && w.half_out >= 0 && w.out >= 0 && Owner(w.out) == w.out && !read[w.out]) w.out = -1;
  }
  DropSteps(drop);
  // An fp32 bias whose products all now read its 16-bit copy need not be uploaded.
  if (biases_rounded) DropUnusedBlobs();
}

bool Lowerer::ReadBesides(int v, int a, int b, const std::vector<bool>& drop) const {
  const int owner = Owner(v);
  for (int u : graph_.outputs)
    if (Owner(u) == owner) return true;
  for (int i = 0; i < static_cast<int>(out_.steps.size()); ++i) {
    if (i == a || i == b || drop[i]) continue;
    const GpuStep& s = out_.steps[i];
    for (int u : s.in)
      if (u >= 0 && Owner(u) == owner) return true;
    if (s.scratch >= 0 && Owner(s.scratch) == owner) return true;
  }
  return false;
}

int Lowerer::LastWriter(int v, int before) const {
  const int owner = Owner(v);
  int writer = -1;
  for (int i = 0; i < before; ++i) {
    const GpuStep& s = out_.steps[i];
    bool writes = s.out >= 0 && Owner(s.out) == owner;
    // Recurrent states are updated in place: these steps write values they list as inputs.
    if (s.kind == GpuStep::Kind::kGruReset || s.kind == GpuStep::Kind::kRnnCell)
      for (int u : s.in) writes |= u >= 0 && Owner(u) == owner;
    if (writes) writer = i;
  }
  return writer;
}

void Lowerer::PoolIn16Bits(const std::map<int, int>& rounding_at, std::vector<bool>& drop) {
  std::vector<GpuStep>& steps = out_.steps;
  const int num_steps = static_cast<int>(steps.size());
  for (int p = 0; p < num_steps; ++p) {
    if (steps[p].kind != GpuStep::Kind::kPool || steps[p].pool != PoolOp::kMax ||
        steps[p].shard >= 0)
      continue;
    const int x = steps[p].in[0], y = steps[p].out;
    if (Owner(y) != y) continue;
    auto r = rounded_.find(y);
    if (r == rounded_.end()) continue;
    auto at = rounding_at.find(r->second);
    if (at == rounding_at.end() || drop[at->second]) continue;
    const int rounding = at->second;
    if (LastWriter(y, rounding) != p) continue;  // what the rounding reads is the pool's
    // Nothing but its rounding reads the pool's fp32 output (a graph output counts).
    if (ReadBesides(y, rounding, -1, drop)) continue;
    const int writer = LastWriter(x, p);
    if (writer < 0) continue;
    GpuStep& w = steps[writer];
    if (w.kind != GpuStep::Kind::kConvEpilogue || w.out != x || w.shard >= 0) continue;
    if (w.half_out < 0) {
      const Shape shape = ShapeOf(x);  // a copy: NewTemp may move the shapes
      w.half_out = NewTemp(shape, OperandDtype());
      rounded_[x] = w.half_out;
    }
    steps[p].in[0] = w.half_out;
    steps[p].out = steps[rounding].out;
    drop[rounding] = true;
  }
}

void Lowerer::ResidualsIn16Bits(const std::map<int, int>& rounding_at,
                                const std::vector<bool>& drop) {
  std::vector<GpuStep>& steps = out_.steps;
  const int num_steps = static_cast<int>(steps.size());
  const HalfType type = HalfOf(OperandDtype());
  // Whether step e alone reads z in fp32 (z's rounding step aside): then reading z in 16
  // bits lets z's fp32 go; otherwise it would change the result and save nothing.
  auto only_fp32_reader = [&](int e, int z) {
    int rounding = -1;
    if (auto r = rounded_.find(z); r != rounded_.end())
      if (auto at = rounding_at.find(r->second); at != rounding_at.end()) rounding = at->second;
    return !ReadBesides(z, e, rounding, drop);
  };
  for (int e = 0; e < num_steps; ++e) {
    // A 16-bit cuDNN convolution's epilogue (an im2col one runs in place on fp32, and its
    // block's next im2col reads fp32 anyway).
    if (drop[e] || steps[e].kind != GpuStep::Kind::kConvEpilogue || steps[e].in[1] < 0 ||
        steps[e].shard >= 0 || !steps[e].conv_epilogue.source)
      continue;
    const int z = steps[e].in[1];
    const int writer = LastWriter(z, e);  // z as the epilogue reads it
    if (writer < 0 || !only_fp32_reader(e, z)) continue;
    GpuStep& w = steps[writer];
    int half = -1;
    if (auto r = rounded_.find(z); r != rounded_.end()) {
      // z's rounding: made by its writer in its pass, or by a kToHalf step that stays,
      // between the writer and the epilogue.
      if (w.half_out == r->second) {
        half = r->second;
      } else if (auto at = rounding_at.find(r->second); at != rounding_at.end() &&
                                                        !drop[at->second] && at->second > writer &&
                                                        at->second < e) {
        half = r->second;
      }
    } else if (w.kind == GpuStep::Kind::kConvEpilogue && w.conv_epilogue.source && w.out == z &&
               w.shard < 0 && w.half_out < 0) {
      // Nothing else reads z (a downsampling block's shortcut), which a 16-bit convolution's
      // epilogue wrote: that epilogue rounds it, and then writes no fp32.
      const Shape shape = ShapeOf(z);  // a copy: NewTemp may move the shapes
      w.half_out = NewTemp(shape, OperandDtype());
      rounded_[z] = half = w.half_out;
    }
    if (half < 0) continue;
    steps[e].in[1] = half;
    steps[e].conv_epilogue.residual = type;
  }
}

void Lowerer::ChannelsLastBetweenConvolutions() {
  std::vector<GpuStep>& steps = out_.steps;
  const size_t total = out_.shapes.size();
  const DataType half = OperandDtype();
  // written: a step that can write it channels last does; refused: something cannot.
  std::vector<bool> written(total, false), refused(total, false);
  auto refuse = [&](int v) {
    if (v >= 0) refused[Owner(v)] = true;
  };
  // Pairs that must share a layout: a convolution's x and y, a pool's x and y.
  std::vector<std::pair<int, int>> together;
  auto is_conv = [&](const GpuStep& s) {
    return s.kind == GpuStep::Kind::kConv && !s.conv.transposed && !s.conv.fused_bias_relu &&
           (s.conv.math == GemmMath::kFp16 || s.conv.math == GemmMath::kBf16);
  };
  auto is_half_pool = [&](const GpuStep& s) {
    return s.kind == GpuStep::Kind::kPool && s.out >= 0 && out_.dtypes[s.out] == half;
  };
  for (const GpuStep& s : steps) {
    // Readers.
    for (size_t k = 0; k < s.in.size(); ++k) {
      const int u = s.in[k];
      if (u < 0) continue;
      const bool can =
          (k == 0 && (is_conv(s) || is_half_pool(s))) ||
          (s.kind == GpuStep::Kind::kConvEpilogue &&
           ((k == 0 && s.conv_epilogue.source) || (k == 1 && s.conv_epilogue.residual)));
      if (!can || s.shard >= 0) refuse(u);
    }
    refuse(s.scratch);
    // Writers.
    const bool writes =
        s.shard < 0 && (s.kind == GpuStep::Kind::kToHalf || is_conv(s) || is_half_pool(s));
    if (s.out >= 0) {
      if (writes && out_.dtypes[s.out] == half) {
        written[s.out] = true;
      } else if (out_.dtypes[s.out] == half) {
        refuse(s.out);  // a 16-bit value some other step writes
      }
    }
    if (s.half_out >= 0) {
      // An epilogue lays its rounding out by its own [n, m, spatial]: not a rounding of a view
      // of its output with another shape (a Reshape's), whose NHWC order would differ.
      if (s.kind == GpuStep::Kind::kConvEpilogue && s.shard < 0 &&
          out_.shapes[s.half_out] == out_.shapes[s.in[0]]) {
        written[s.half_out] = true;
      } else {
        refuse(s.half_out);
      }
    }
    if ((is_conv(s) || is_half_pool(s)) && s.out >= 0) together.emplace_back(s.in[0], s.out);
  }
  for (int v : graph_.inputs) refuse(v);
  for (int v : graph_.outputs) refuse(v);
  for (size_t v = 0; v < total; ++v) {
    if (Owner(static_cast<int>(v)) != static_cast<int>(v)) {
      refuse(static_cast<int>(v));  // a view, and its owner
      continue;
    }
    if (out_.dtypes[v] != half || out_.shapes[v].size() != 4 || Known(static_cast<int>(v)))
      refused[v] = true;
  }
  // A pair is channels last together or not at all.
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& [x, y] : together) {
      const bool no =
          refused[Owner(x)] || !written[Owner(x)] || refused[Owner(y)] || !written[Owner(y)];
      if (no && !(refused[Owner(x)] && refused[Owner(y)])) {
        refused[Owner(x)] = refused[Owner(y)] = true;
        changed = true;
      }
    }
  }
  out_.channels_last.assign(total, false);
  for (size_t v = 0; v < total; ++v)
    out_.channels_last[v] =
        Owner(static_cast<int>(v)) == static_cast<int>(v) && written[v] && !refused[v];
  const auto& last = out_.channels_last;
  bool weights_moved = false;
  for (GpuStep& s : steps) {
    if (is_conv(s) && last[s.in[0]]) {
      s.conv.channels_last = true;
      // The weight [m, c/groups, kh, kw] stored [m, kh, kw, c/groups].
      const GpuLowering::Blob w = out_.blobs[static_cast<size_t>(s.weight_slots[0])];
      const Shape& d = w.data.shape();
      const int64_t m = d[0], c = d[1], area = d[2] * d[3];
      Tensor moved = Tensor::Allocate(w.data.dtype(), d);
      const auto* from = static_cast<const uint16_t*>(w.data.data());
      auto* to = static_cast<uint16_t*>(moved.mutable_data());
      for (int64_t o = 0; o < m; ++o)
        for (int64_t ch = 0; ch < c; ++ch)
          for (int64_t p = 0; p < area; ++p)
            to[(o * area + p) * c + ch] = from[(o * c + ch) * area + p];
      s.weight_slots[0] = AddBlob(w.key + "~nhwc", std::move(moved), w.shard);
      weights_moved = true;
    } else if (s.kind == GpuStep::Kind::kConvEpilogue) {
      ConvEpilogueOptions& o = s.conv_epilogue;
      // (An int8 convolution's int32 sums are its GEMM's rows: always channels last.)
      o.source_channels_last = o.int32_sums || (o.source && last[s.in[0]]);
      o.residual_channels_last = o.residual && s.in[1] >= 0 && last[s.in[1]];
      o.half_channels_last = s.half_out >= 0 && last[s.half_out];
    } else if ((s.kind == GpuStep::Kind::kToHalf || is_half_pool(s)) && s.out >= 0) {
      s.channels_last = last[s.out];
    }
  }
  if (weights_moved) DropUnusedBlobs();
}

void Lowerer::DropSteps(const std::vector<bool>& drop) {
  std::vector<GpuStep> kept;
  kept.reserve(out_.steps.size());
  for (size_t i = 0; i < out_.steps.size(); ++i)
    if (!drop[i]) kept.push_back(std::move(out_.steps[i]));
  out_.steps = std::move(kept);
}

void Lowerer::DropUnusedBlobs() {
  std::vector<bool> used(out_.blobs.size(), false);
  for (const GpuStep& s : out_.steps)
    for (int64_t slot : s.weight_slots)
      if (slot >= 0) used[static_cast<size_t>(slot)] = true;
  for (const auto& [v, slot] : known_slots_) used[static_cast<size_t>(slot)] = true;
  std::vector<int64_t> index(out_.blobs.size(), -1);
  std::vector<GpuLowering::Blob> kept;
  out_.weight_bytes = 0;
  for (size_t i = 0; i < out_.blobs.size(); ++i) {
    if (!used[i]) continue;
    index[i] = static_cast<int64_t>(kept.size());
    out_.weight_bytes += static_cast<int64_t>(out_.blobs[i].data.byte_size());
    kept.push_back(std::move(out_.blobs[i]));
  }
  out_.blobs = std::move(kept);
  for (GpuStep& s : out_.steps)
    for (int64_t& slot : s.weight_slots)
      if (slot >= 0) slot = index[static_cast<size_t>(slot)];
  for (auto& [v, slot] : known_slots_) slot = index[static_cast<size_t>(slot)];
}

int Lowerer::GemmOperand(int n, int v) {
  if (!Mixed()) return v;
  // One rounding per value, whoever reads it: every writer of v runs before its first
  // reader (the nodes are in topological order), and the 16-bit copy is a temporary that
  // only this step writes, so a later in-place write to v's bytes cannot change it.
  if (auto it = rounded_.find(v); it != rounded_.end()) return it->second;
  const Shape shape = ShapeOf(v);  // a copy: NewTemp may move the shapes
  GpuStep step = NewStep(GpuStep::Kind::kToHalf, n);
  step.in = {v};
  step.out = NewTemp(shape, OperandDtype());
  out_.steps.push_back(step);
  rounded_[v] = step.out;
  return step.out;
}

Status Lowerer::LowerNode(int n) {
  const Node& node = graph_.nodes[n];
  const std::string& op = node.op_type;
  if (node.domain.empty()) {
    if (op == "MatMul" || op == "Gemm") return LowerProduct(n);
    if (auto u = UnaryByName(op)) return LowerUnary(n, *u);
    if (auto b = BinaryByName(op)) return LowerBinary(n, *b);
    if (op == "Softmax" || op == "LogSoftmax") return LowerSoftmax(n);
    if (op == "Elu") return LowerUnary(n, UnaryOp::kElu, node.GetFloat("alpha", 1.f));
    if (op == "LayerNormalization") return LowerLayerNorm(n);
    if (op == "Transpose") return LowerTranspose(n);
    if (op == "Gather") return LowerGather(n);
    if (op == "Split") return LowerSplit(n);
    if (op == "ReduceSum") return LowerReduce(n, ReduceOp::kSum);
    if (op == "ReduceMean") return LowerReduce(n, ReduceOp::kMean);
    if (op == "ReduceMax") return LowerReduce(n, ReduceOp::kMax);
    if (op == "ReduceMin") return LowerReduce(n, ReduceOp::kMin);
    if (op == "ReduceProd") return LowerReduce(n, ReduceOp::kProd);
    if (op == "ReduceSumSquare") return LowerReduce(n, ReduceOp::kSumSquare);
    if (op == "ReduceL2") return LowerReduce(n, ReduceOp::kL2);
    if (op == "Cast") return LowerCast(n);
    if (op == "Conv") return LowerConv(n);
    if (op == "LeakyRelu") return LowerUnary(n, UnaryOp::kLeakyRelu, node.GetFloat("alpha", 0.01f));
    if (op == "HardSigmoid")
      return LowerUnary(n, UnaryOp::kHardSigmoid, node.GetFloat("alpha", 0.2f),
                        node.GetFloat("beta", 0.5f));
    if (op == "HardSwish") return LowerUnary(n, UnaryOp::kHardSwish);
    if (op == "Clip") return LowerClip(n);
    if (op == "BatchNormalization") return LowerBatchNorm(n);
    if (op == "Concat") return LowerConcat(n);
    if (op == "Pad") return LowerPad(n);
    if (op == "Slice") return LowerSlice(n);
    if (op == "Equal") return LowerCompare(n, CompareOp::kEqual);
    if (op == "Less") return LowerCompare(n, CompareOp::kLess);
    if (op == "Greater") return LowerCompare(n, CompareOp::kGreater);
    if (op == "LessOrEqual") return LowerCompare(n, CompareOp::kLessOrEqual);
    if (op == "GreaterOrEqual") return LowerCompare(n, CompareOp::kGreaterOrEqual);
    if (op == "Where") return LowerWhere(n);
    if (op == "And") return LowerLogical(n, LogicalOp::kAnd);
    if (op == "Or") return LowerLogical(n, LogicalOp::kOr);
    if (op == "Xor") return LowerLogical(n, LogicalOp::kXor);
    if (op == "Not") return LowerLogical(n, LogicalOp::kNot);
    if (op == "Tile") return LowerTile(n);
    if (op == "ConvTranspose") return LowerConvTranspose(n);
    if (op == "Resize") return LowerResize(n);
    if (op == "Mod") return LowerMod(n);
    if (op == "ArgMax" || op == "ArgMin") return LowerArgExtreme(n);
    if (op == "InstanceNormalization" || op == "GroupNormalization") return LowerGroupNorm(n);
    if (op == "DepthToSpace" || op == "SpaceToDepth") return LowerDepthSpace(n);
    if (op == "RoiAlign") return LowerRoiAlign(n);
    if (op == "Expand") return LowerExpand(n);
    if (op == "GridSample") return LowerGridSample(n);
    if (op == "GatherElements") return LowerGatherElements(n);
    if (op == "GatherND") return LowerGatherNd(n);
    if (op == "TopK") return LowerTopK(n);
    if (op == "ScatterElements" || op == "ScatterND") return LowerScatter(n);
    if (op == "CumSum") return LowerCumSum(n);
    if (op == "Trilu") return LowerTrilu(n);
    if (op == "RNN" || op == "GRU" || op == "LSTM") return LowerRecurrent(n);
    if (op == "MaxPool" || op == "AveragePool" || op == "GlobalAveragePool" ||
        op == "GlobalMaxPool")
      return LowerPool(n);
  } else if (node.domain == "shoal" && (op == "FusedMatMul" || op == "FusedGemm")) {
    return LowerProduct(n);
  } else if (node.domain == "shoal" && op == "FusedConv") {
    return LowerConv(n);
  }
  return Fail(n, "the GPU path has no kernel for this operator yet");
}

StatusOr<GpuLowering> Lowerer::Run() {
  const size_t nv = graph_.values.size();
  out_.values.assign(nv, GpuValue{});
  out_.inputs = graph_.inputs;
  out_.outputs = graph_.outputs;
  out_.dtypes = plan_.dtypes();
  out_.shapes = plan_.shapes();
  alias_of_.assign(nv, -1);
  const std::vector<Plan::StepInfo> steps = plan_.Steps();
  std::string failures;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Plan::StepInfo& s = steps[i];
    if (s.dynamic) {
      failures +=
          graph_.Describe(s.node) + ": a shape known only at run time is not on the GPU path yet\n";
      refused_.push_back(s.node);
      continue;
    }
    if (s.skip) continue;
    if (s.alias_input >= 0) {
      const int src = s.inputs[s.alias_input];
      alias_of_[s.outputs[0]] = Owner(src);
      continue;
    }
    const Status lowered = LowerNode(s.node);
    if (!lowered.ok()) {
      failures += lowered.message() + "\n";
      refused_.push_back(s.node);
    }
  }
  if (!failures.empty()) {
    failures.pop_back();
    return Unimplemented("the GPU path cannot run this model yet:\n" + failures);
  }
  if (Mixed()) FuseRoundingsIntoEpilogues();
  if (Mixed() && options_.channels_last && options_.conv == ConvEngine::kCudnn)
    ChannelsLastBetweenConvolutions();
  if (options_.int8_calibration) KeepValuesInt8();
  const size_t total = out_.shapes.size();  // the graph's values and the temporaries
  out_.values.assign(total, GpuValue{});

  // Homes. Known values a step reads are weights; every other value a step reads or
  // writes, and every graph input and output, is an arena value (views take their
  // owner's home).
  std::vector<int> tensor_of(total, -1);
  std::vector<TensorLifetime> tensors;
  std::vector<int> value_of;
  const int num_steps = static_cast<int>(out_.steps.size());
  auto bytes_of = [&](int v) {
    return Product(out_.shapes[v]) * static_cast<int64_t>(DataTypeSize(out_.dtypes[v]));
  };
  // Defines value `v` (an owner) as an arena value at GPU step `first`, unless it is known.
  auto define = [&](int v, int first) {
    if (Known(v)) return;
    if (tensor_of[v] >= 0) {
      // Written again (Concat's pieces, an in-place bias or activation): live until then.
      tensors[tensor_of[v]].last = std::max(tensors[tensor_of[v]].last, first);
      return;
    }
    tensor_of[v] = static_cast<int>(tensors.size());
    value_of.push_back(v);
    tensors.push_back({PadTo(bytes_of(v), kAlign), first, first});
  };
  // The first value read before any step writes it (nor a graph input): a lowering bug,
  // which would read whatever the arena held.
  int unwritten = -1, unwritten_at = -1;
  auto use = [&](int v, int at) {
    if (shard_values_.count(v)) return;  // in a shard's own arena
    const int o = Owner(v);
    if (Known(o) || Known(v)) {
      KnownSlot(Known(o) ? o : v);
      return;
    }
    if (tensor_of[o] < 0 && unwritten < 0) {
      unwritten = v;
      unwritten_at = at;
    }
    define(o, 0);
    tensors[tensor_of[o]].last = std::max(tensors[tensor_of[o]].last, at);
  };
  for (int v : graph_.inputs) define(v, 0);
  // The steps between a kFork and its kJoin run concurrently on the shards' streams: each
  // counts as running from the fork to the join, so nothing they touch shares bytes with
  // anything another of them touches.
  std::vector<int> from(num_steps), to(num_steps);
  for (int i = 0, fork = -1; i < num_steps; ++i) {
    const GpuStep::Kind kind = out_.steps[i].kind;
    if (kind == GpuStep::Kind::kFork) fork = i;
    from[i] = to[i] = i;
    if (fork >= 0) from[i] = fork;
    if (kind == GpuStep::Kind::kJoin && fork >= 0) {
      for (int j = fork; j <= i; ++j) to[j] = i;
      fork = -1;
    }
  }
  for (int i = 0; i < num_steps; ++i) {
    const GpuStep& step = out_.steps[i];
    if (step.scratch >= 0) {  // the step's own: written and read by it alone
      define(step.scratch, from[i]);
      use(step.scratch, to[i]);
    }
    for (int v : step.in)
      if (v >= 0) use(v, to[i]);
    if (step.out >= 0 && !shard_values_.count(step.out)) define(Owner(step.out), from[i]);
    if (step.half_out >= 0) define(step.half_out, from[i]);
  }
  for (int v : graph_.outputs) use(v, num_steps);
  if (unwritten >= 0) {
    return Internal("GPU lowering: " +
                    (unwritten_at < num_steps ? "step " + std::to_string(unwritten_at)
                                              : std::string("the graph's outputs")) +
                    " read value " + std::to_string(unwritten) +
                    (unwritten < static_cast<int>(graph_.values.size())
                         ? " ('" + graph_.values[unwritten].name + "')"
                         : std::string(" (a temporary)")) +
                    " before any step writes it");
  }
  // Every size is a multiple of the alignment, so the planner's offsets are too.
  ASSIGN_OR_RETURN(MemoryPlan memory, PlanMemory(tensors));
  out_.arena_bytes = memory.arena_bytes;
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (memory.offsets[t] % kAlign != 0)
      return Internal("memory planner: an offset not aligned to " + std::to_string(kAlign));
    out_.values[value_of[t]] = {GpuValue::Home::kArena, memory.offsets[t], bytes_of(value_of[t])};
  }
  for (const auto& [v, blob] : known_slots_)
    out_.values[v] = {GpuValue::Home::kWeights, blob, bytes_of(v)};
  for (const auto& [v, place] : shard_values_)
    out_.values[v] = {GpuValue::Home::kShard, place.second, bytes_of(v), place.first};
  for (size_t v = 0; v < total; ++v) {
    const int o = Owner(static_cast<int>(v));
    if (o != static_cast<int>(v) && out_.values[v].home == GpuValue::Home::kNone) {
      out_.values[v] = out_.values[o];
      out_.values[v].bytes = bytes_of(static_cast<int>(v));
    }
  }
  return std::move(out_);
}

}  // namespace internal

StatusOr<GpuLowering> LowerPlan(const Graph& graph, const Plan& plan, const GpuPlanOptions& options,
                                std::vector<int>* refused) {
  if (plan.blocked_values() != 0) {
    return InvalidArgument(
        "the plan keeps values in oneDNN's blocked layouts; prepare it with "
        "GpuLoweringPlanOptions() to lower it");
  }
  if (options.int8_calibration && options.math != GemmMath::kFp32) {
    return InvalidArgument(
        "an int8 plan keeps the products int8 cannot take in fp32: its math must be fp32");
  }
  if (options.math == GemmMath::kInt8)
    return InvalidArgument("int8 is asked for by GpuPlanOptions::int8_calibration, not math");
  internal::Lowerer lowerer(graph, plan, options);
  auto lowered = lowerer.Run();
  if (refused) *refused = lowerer.refused();
  if (!lowered.ok()) return lowered.status();
  lowered->cuda_graph = options.cuda_graph;
  return lowered;
}

}  // namespace shoal::engine::cuda
