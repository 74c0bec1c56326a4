#include "engine/precision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/bf16.h"
#include "core/fp16.h"
#include "core/npy.h"
#include "engine/profile.h"

namespace shoal::engine {

std::string_view PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kInt8:
      return "int8";
  }
  return "?";
}

StatusOr<Precision> ParsePrecision(std::string_view name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "int8") return Precision::kInt8;
  return InvalidArgument("precision must be fp32, bf16 or int8; was '" + std::string(name) + "'");
}

std::string_view ConvAlgorithmName(ConvAlgorithm a) {
  return a == ConvAlgorithm::kWinograd ? "winograd" : "direct";
}

StatusOr<ConvAlgorithm> ParseConvAlgorithm(std::string_view name) {
  if (name == "direct") return ConvAlgorithm::kDirect;
  if (name == "winograd") return ConvAlgorithm::kWinograd;
  return InvalidArgument("conv_algorithm must be direct or winograd; was '" + std::string(name) +
                         "'");
}

std::string_view ConvLayoutName(ConvLayout l) {
  return l == ConvLayout::kChannelsLast ? "channels_last" : "blocked";
}

StatusOr<ConvLayout> ParseConvLayout(std::string_view name) {
  if (name == "blocked") return ConvLayout::kBlocked;
  if (name == "channels_last") return ConvLayout::kChannelsLast;
  return InvalidArgument("conv_layout must be blocked or channels_last; was '" + std::string(name) +
                         "'");
}

Status CheckPrecision(Precision p) {
  if (p != Precision::kBf16) return Status::Ok();
  // oneDNN's ISA values are cumulative bit masks.
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto need = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  if ((isa & need) == need) return Status::Ok();
  return FailedPrecondition(
      "precision bf16 needs a CPU with AVX512_BF16 (oneDNN reports a lesser ISA here)");
}

StatusOr<Calibration> Calibrate(const Model& fp32,
                                const std::vector<std::vector<NamedTensor>>& batches) {
  if (batches.empty()) return InvalidArgument("calibration needs at least one input batch");
  ASSIGN_OR_RETURN(auto session, Session::Create(fp32));
  const Graph& g = fp32.graph();
  std::vector<ValueRange> ranges(g.values.size());
  std::vector<char> seen(g.values.size(), 0);
  Plan::Observer observe = [&](int v, const Tensor& t) {
    if (t.dtype() != DataType::kFp32 || t.empty()) return;
    // Blocked layouts may pad with zeros; zero is inside every range a ReLU network
    // produces, and a pad can only widen a range, never narrow it.
    auto values =
        std::span<const float>(static_cast<const float*>(t.data()), t.byte_size() / sizeof(float));
    auto [lo, hi] = std::minmax_element(values.begin(), values.end());
    if (lo == values.end()) return;
    ValueRange& r = ranges[v];
    if (!seen[v]) {
      r = {*lo, *hi};
      seen[v] = 1;
    } else {
      r.min = std::min(r.min, *lo);
      r.max = std::max(r.max, *hi);
    }
  };
  std::vector<NamedTensor> outputs;
  for (const auto& batch : batches) RETURN_IF_ERROR(session->RunObserved(batch, &outputs, observe));
  Calibration table;
  for (size_t v = 0; v < ranges.size(); ++v)
    if (seen[v]) table[g.values[v].name] = ranges[v];
  return table;
}

std::string TierAccuracy::ToString() const {
  char buf[160];
  if (top1_agreement >= 0) {
    std::snprintf(buf, sizeof(buf), "max |diff| %.4g, top-1 agreement %.1f%% over %d samples",
                  max_abs_diff, 100 * top1_agreement, samples);
  } else {
    std::snprintf(buf, sizeof(buf), "max |diff| %.4g over %d samples", max_abs_diff, samples);
  }
  std::string out = buf;
  if (non_finite > 0) out += ", " + std::to_string(non_finite) + " outputs not finite";
  return out;
}

namespace {

// An FP32 or FP16 output's values as floats (FP16 models' outputs stay FP16,
// fp16_lowering.h); empty for other types, which are not compared.
std::vector<float> FloatValues(const Tensor& t) {
  if (t.dtype() == DataType::kFp32) {
    auto v = t.values<float>();
    return std::vector<float>(v.begin(), v.end());
  }
  std::vector<float> out;
  if (t.dtype() == DataType::kFp16) {
    auto h = t.values<uint16_t>();
    out.resize(h.size());
    Fp16ToFloat(h.data(), out.data(), h.size());
  }
  return out;
}

}  // namespace

StatusOr<TierAccuracy> CompareTiers(const Model& reference, const Model& variant,
                                    const std::vector<std::vector<NamedTensor>>& batches) {
  ASSIGN_OR_RETURN(auto ref_session, Session::Create(reference));
  ASSIGN_OR_RETURN(auto var_session, Session::Create(variant));
  return CompareRunners([&](const std::vector<NamedTensor>& in,
                            std::vector<NamedTensor>* out) { return ref_session->Run(in, out); },
                        [&](const std::vector<NamedTensor>& in, std::vector<NamedTensor>* out) {
                          return var_session->Run(in, out);
                        },
                        batches);
}

StatusOr<TierAccuracy> CompareRunners(const TierRunner& reference, const TierRunner& variant,
                                      const std::vector<std::vector<NamedTensor>>& batches) {
  TierAccuracy acc;
  int64_t agree = 0, rows = 0;
  bool classifier = true;
  for (const auto& batch : batches) {
    std::vector<NamedTensor> a, b;
    RETURN_IF_ERROR(reference(batch, &a));
    RETURN_IF_ERROR(variant(batch, &b));
    if (a.size() != b.size()) return Internal("the variant has different outputs");
    for (size_t o = 0; o < a.size(); ++o) {
      const Tensor& x = a[o].tensor;
      const Tensor& y = b[o].tensor;
      if (x.shape() != y.shape() || x.dtype() != y.dtype())
        return Internal("output '" + a[o].name + "' differs in shape or type between tiers");
      const std::vector<float> xv = FloatValues(x), yv = FloatValues(y);
      for (size_t i = 0; i < xv.size(); ++i) {
        // A NaN or an infinity in the variant is as far off as can be (std::max would
        // drop a NaN difference).
        if (!std::isfinite(yv[i]) && std::isfinite(xv[i])) ++acc.non_finite;
        const double d = std::fabs(static_cast<double>(xv[i]) - static_cast<double>(yv[i]));
        if (!(d <= acc.max_abs_diff)) acc.max_abs_diff = std::isnan(d) ? INFINITY : d;
      }
    }
    if (!a.empty()) acc.samples += a[0].tensor.shape().empty() ? 1 : a[0].tensor.shape()[0];
    const Tensor& x = a.empty() ? Tensor() : a[0].tensor;
    if ((x.dtype() != DataType::kFp32 && x.dtype() != DataType::kFp16) || x.shape().size() != 2 ||
        x.shape()[1] < 2) {
      classifier = false;
      continue;
    }
    const int64_t n = x.shape()[0], c = x.shape()[1];
    const std::vector<float> xv = FloatValues(x), yv = FloatValues(b[0].tensor);
    for (int64_t r = 0; r < n; ++r) {
      const auto xa = std::max_element(xv.begin() + r * c, xv.begin() + (r + 1) * c) - xv.begin();
      const auto ya = std::max_element(yv.begin() + r * c, yv.begin() + (r + 1) * c) - yv.begin();
      // A row with a NaN has no argmax to agree with.
      const bool finite = std::all_of(yv.begin() + r * c, yv.begin() + (r + 1) * c,
                                      [](float v) { return !std::isnan(v); });
      agree += finite && xa == ya;
      ++rows;
    }
  }
  if (classifier && rows > 0) acc.top1_agreement = static_cast<double>(agree) / rows;
  return acc;
}

bool TierChangesNode(const Node& node) {
  if (!node.domain.empty() && node.domain != "ai.onnx" && node.domain != "shoal") return false;
  static const char* const kOps[] = {"Conv",      "ConvTranspose", "MatMul",   "Gemm",
                                     "FusedConv", "FusedMatMul",   "FusedGemm"};
  for (const char* op : kOps)
    if (node.op_type == op) return true;
  return false;
}

std::vector<int> SlowerTierNodes(const Graph& graph, const std::vector<TierTiming>& timings) {
  std::vector<int> out;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (!TierChangesNode(graph.nodes[n])) continue;
    for (const TierTiming& t : timings) {
      if (n >= t.fp32_node_ms.size() || n >= t.variant_node_ms.size()) continue;
      // A node that never ran (folded at plan time) costs nothing either way.
      if (t.fp32_node_ms[n] <= 0 && t.variant_node_ms[n] <= 0) continue;
      if (!(t.variant_node_ms[n] < t.fp32_node_ms[n])) {
        out.push_back(static_cast<int>(n));
        break;
      }
    }
  }
  return out;
}

bool TierPays(const std::vector<TierTiming>& timings) {
  return std::all_of(timings.begin(), timings.end(),
                     [](const TierTiming& t) { return t.variant_ms < t.fp32_ms; });
}

namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

int64_t BatchOf(const std::vector<NamedTensor>& inputs) {
  return inputs.empty() || inputs[0].tensor.shape().empty() ? 0 : inputs[0].tensor.shape()[0];
}

std::string BatchList(const std::vector<TierTiming>& timings) {
  std::string s;
  for (const TierTiming& t : timings) {
    if (!s.empty()) s += ", ";
    s += std::to_string(t.batch);
  }
  return s;
}

// "fp32 0.0123 ms vs 0.0456 ms at batch 1, ..." (medians of whole runs).
std::string RunFigures(const std::vector<TierTiming>& timings) {
  std::string s;
  for (const TierTiming& t : timings) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "%sfp32 %.4g ms vs %.4g ms at batch %lld",
                  s.empty() ? "" : ", ", t.fp32_ms, t.variant_ms, static_cast<long long>(t.batch));
    s += buf;
  }
  return s;
}

// True when `a`'s whole run is no slower than `b`'s at every batch both timed, each
// against the fp32 run timed beside it (two TimeTiers calls have their own baselines).
bool NoSlower(const std::vector<TierTiming>& a, const std::vector<TierTiming>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (a[i].variant_ms * b[i].fp32_ms > b[i].variant_ms * a[i].fp32_ms) return false;
  }
  return true;
}

// The whole tier overrides the per-node verdict only when it is clearly faster: at most
// 0.9x fp32's time at every timed batch. A tiny model's run (microseconds) differs by
// noise alone, and a tier picked on a coin flip can serve slower than fp32.
bool ClearlyPays(const std::vector<TierTiming>& timings) {
  return !timings.empty() && std::all_of(timings.begin(), timings.end(), [](const TierTiming& t) {
    return t.variant_ms <= 0.9 * t.fp32_ms;
  });
}

}  // namespace

StatusOr<TierTiming> TimeTiers(const Model& fp32, const Model& variant,
                               const std::vector<NamedTensor>& inputs, int rounds, int runs) {
  if (rounds < 1 || runs < 1) return InvalidArgument("rounds and runs must be >= 1");
  SessionOptions one;
  one.threads = 1;
  const size_t nodes = fp32.graph().nodes.size();
  std::vector<std::vector<double>> a(nodes), b(nodes);
  std::vector<double> whole_a, whole_b;
  // Each profile runs for about 20 ms (a big model at a big batch: once), so that a
  // large model's load does not take minutes.
  ASSIGN_OR_RETURN(OperatorProfile probe, ProfileOperators(fp32, inputs, 1, one));
  const int n_runs = std::clamp(static_cast<int>(20.0 / std::max(probe.ms_per_run, 1e-3)), 1, runs);
  for (int r = 0; r < rounds; ++r) {
    // Alternate which runs first, so neither always finds the caches and clock warm.
    OperatorProfile pa, pb;
    if (r % 2 == 0) {
      ASSIGN_OR_RETURN(pa, ProfileOperators(fp32, inputs, n_runs, one));
      ASSIGN_OR_RETURN(pb, ProfileOperators(variant, inputs, n_runs, one));
    } else {
      ASSIGN_OR_RETURN(pb, ProfileOperators(variant, inputs, n_runs, one));
      ASSIGN_OR_RETURN(pa, ProfileOperators(fp32, inputs, n_runs, one));
    }
    if (pa.node_ms.size() != nodes || pb.node_ms.size() != nodes)
      return Internal("the variant's graph differs from fp32's");
    for (size_t n = 0; n < nodes; ++n) {
      a[n].push_back(pa.node_ms[n]);
      b[n].push_back(pb.node_ms[n]);
    }
    whole_a.push_back(pa.ms_per_run);
    whole_b.push_back(pb.ms_per_run);
  }
  TierTiming t;
  t.batch = BatchOf(inputs);
  t.fp32_ms = Median(whole_a);
  t.variant_ms = Median(whole_b);
  for (size_t n = 0; n < nodes; ++n) {
    t.fp32_node_ms.push_back(Median(a[n]));
    t.variant_node_ms.push_back(Median(b[n]));
  }
  return t;
}

std::string TierSelection::ToString(Precision precision) const {
  const std::string tier(PrecisionName(precision));
  if (fp32_nodes.empty())
    return "all " + std::to_string(candidates) + " convolutions and products in " + tier;
  return std::to_string(fp32_nodes.size()) + " of " + std::to_string(candidates) +
         " convolutions and products kept fp32 (" + why + ")";
}

StatusOr<TierSelection> SelectTierNodes(const Model& fp32, const TierLoader& load,
                                        const std::vector<std::vector<NamedTensor>>& timed_inputs,
                                        const TierTimer& timer) {
  const Graph& graph = fp32.graph();
  TierSelection sel;
  std::vector<int> all;
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    if (TierChangesNode(graph.nodes[n])) all.push_back(static_cast<int>(n));
  sel.candidates = static_cast<int>(all.size());
  ASSIGN_OR_RETURN(sel.model, load(nullptr));
  if (all.empty() || timed_inputs.empty()) return sel;
  for (const auto& inputs : timed_inputs) {
    ASSIGN_OR_RETURN(TierTiming t, timer(fp32, *sel.model, inputs));
    sel.timings.push_back(std::move(t));
  }
  std::vector<int> slow = SlowerTierNodes(graph, sel.timings);
  const std::string batches = BatchList(sel.timings);
  // A plan serves only when clearly faster than fp32 (ClearlyPays) at every timed batch:
  // a run of microseconds differs by noise alone, and a plan picked on a few percent
  // served slower than fp32 (the recommender MLP's bf16 tier, timed 0.94x fp32 at load,
  // ran 0.88x in the engine benchmark).
  const bool whole_pays = ClearlyPays(sel.timings);
  if (slow.empty() && whole_pays) return sel;
  if (!slow.empty() && slow.size() < all.size()) {
    auto keep = std::make_shared<const std::vector<int>>(slow);
    ASSIGN_OR_RETURN(auto mixed, load(keep));
    std::vector<TierTiming> mixed_timings;
    for (const auto& inputs : timed_inputs) {
      ASSIGN_OR_RETURN(TierTiming t, timer(fp32, *mixed, inputs));
      mixed_timings.push_back(std::move(t));
    }
    // The mixed plan serves when it pays and, if the whole tier pays too, is no slower
    // than it at any timed batch (the fp32 nodes add conversions at their edges).
    if (ClearlyPays(mixed_timings) && (!whole_pays || NoSlower(mixed_timings, sel.timings))) {
      std::string names;
      for (int n : slow) {
        if (!names.empty()) names += ", ";
        names += graph.nodes[n].name.empty() ? "#" + std::to_string(n) : graph.nodes[n].name;
      }
      sel.model = std::move(mixed);
      sel.fp32_nodes = std::move(slow);
      sel.why = "not faster than fp32 at one of batch " + batches + ": " + names + "; whole run " +
                RunFigures(mixed_timings);
      return sel;
    }
  }
  // Per-node timings are noisy, and a lower tier's conversions land on the nodes next to
  // them: when the whole run of the all-lower-precision plan is clearly faster at every
  // timed batch, it serves, whatever single nodes said. (Falling back to fp32 here
  // made an int8 tier that ran 2x faster compute exactly as fp32, and the precision ladder gain
  // nothing.)
  if (whole_pays) return sel;  // sel.model is still the all-lower-precision plan
  // Nothing or too little pays: the whole tier computes as fp32 does.
  ASSIGN_OR_RETURN(sel.model, load(std::make_shared<const std::vector<int>>(all)));
  sel.fp32_nodes = all;
  sel.why = "the tier is not clearly faster than fp32 at batch " + batches + ": " +
            RunFigures(sel.timings);
  return sel;
}

TierLoader ServedTierLoader(const Model& fp32, const std::string& path,
                            const LoadOptions& options) {
  size_t candidates = 0;
  for (const Node& node : fp32.graph().nodes) candidates += TierChangesNode(node);
  return
      [candidates, path, options](
          std::shared_ptr<const std::vector<int>> fp32_nodes) -> StatusOr<std::unique_ptr<Model>> {
        LoadOptions o = options;
        if (fp32_nodes && !fp32_nodes->empty() && fp32_nodes->size() == candidates) {
          // Every convolution and product stays fp32: the fp32 plan itself. A bf16 plan
          // that keeps them all still differs from it (values beside the kept nodes stay in
          // plain layouts where fp32 keeps the convolutions' blocked ones) and served the
          // digits classifier at 0.7-0.8x fp32 at batch 8.
          o.plan.precision = Precision::kFp32;
          o.plan.calibration = nullptr;
          o.plan.fp32_nodes = nullptr;
        } else {
          o.plan.fp32_nodes = std::move(fp32_nodes);
        }
        return Model::Load(path, o);
      };
}

StatusOr<TierSelection> LoadServedTier(const Model& fp32, const std::string& path,
                                       const LoadOptions& options,
                                       const std::vector<std::vector<NamedTensor>>& timed_inputs) {
  auto timer = [](const Model& a, const Model& b, const std::vector<NamedTensor>& in) {
    return TimeTiers(a, b, in);
  };
  return SelectTierNodes(fp32, ServedTierLoader(fp32, path, options), timed_inputs, timer);
}

StatusOr<std::vector<std::vector<NamedTensor>>> ServedTierTimingInputs(
    const Model& fp32, const std::vector<std::vector<NamedTensor>>& batches) {
  std::vector<std::vector<NamedTensor>> timed;
  if (batches.empty() || batches.front().empty()) return timed;
  const std::vector<NamedTensor>& first = batches.front();
  const Shape& shape = first.front().tensor.shape();
  if (fp32.batch_dim_symbolic()) {
    std::vector<NamedTensor> single;
    for (const NamedTensor& in : first) {
      ASSIGN_OR_RETURN(Tensor row, in.tensor.SliceRows(0, 1));
      Tensor copy = Tensor::Allocate(row.dtype(), row.shape());
      std::memcpy(copy.mutable_data(), row.data(), row.byte_size());
      single.push_back({in.name, std::move(copy)});
    }
    timed.push_back(std::move(single));
  }
  if (timed.empty() || (!shape.empty() && shape.front() > 1)) timed.push_back(first);
  return timed;
}

StatusOr<std::vector<std::vector<NamedTensor>>> ReadCalibrationInputs(const Model& model,
                                                                      const std::string& path,
                                                                      int64_t batch) {
  ASSIGN_OR_RETURN(auto arrays, ReadNpz(path));
  const bool batching = model.batch_dim_symbolic();
  int64_t samples = -1;
  for (const TensorInfo& in : model.inputs()) {
    auto it = arrays.find(in.name);
    if (it == arrays.end())
      return InvalidArgument("calibration file '" + path + "' has no array named '" + in.name +
                             "' (one per model input)");
    const NpyArray& t = it->second;
    if (t.dtype != in.dtype)
      return InvalidArgument("calibration array '" + in.name + "' is " +
                             std::string(DataTypeName(t.dtype)) + "; the input is " +
                             std::string(DataTypeName(in.dtype)));
    if (t.shape.empty()) return InvalidArgument("calibration array '" + in.name + "' is a scalar");
    if (samples >= 0 && t.shape[0] != samples)
      return InvalidArgument("calibration arrays have different numbers of samples");
    samples = t.shape[0];
  }
  if (samples <= 0) return InvalidArgument("calibration file '" + path + "' holds no samples");
  const int64_t step = batching ? std::max<int64_t>(1, batch) : samples;
  std::vector<std::vector<NamedTensor>> out;
  for (int64_t start = 0; start < samples; start += step) {
    const int64_t rows = std::min(step, samples - start);
    std::vector<NamedTensor> inputs;
    for (const TensorInfo& in : model.inputs()) {
      const NpyArray& t = arrays.at(in.name);
      Shape shape = t.shape;
      const size_t row_bytes = t.row_bytes();
      shape[0] = rows;
      Tensor part = Tensor::Allocate(t.dtype, shape);
      std::memcpy(part.mutable_data(), static_cast<const char*>(t.data->data()) + start * row_bytes,
                  rows * row_bytes);
      inputs.push_back({in.name, std::move(part)});
    }
    out.push_back(std::move(inputs));
  }
  return out;
}

std::vector<NamedTensor> MadeUpInputs(const Model& model, const std::vector<Shape>& shapes) {
  std::vector<NamedTensor> inputs;
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {  // uniform in [-1, 1), 24 bits of PCG's LCG
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int64_t>(state >> 40) - (int64_t{1} << 23)) /
           static_cast<float>(int64_t{1} << 23);
  };
  for (size_t i = 0; i < shapes.size() && i < model.inputs().size(); ++i) {
    const TensorInfo& info = model.inputs()[i];
    Tensor t = Tensor::Allocate(info.dtype, shapes[i]);
    if (info.dtype == DataType::kFp32) {
      for (float& v : t.mutable_values<float>()) v = next();
    } else if (info.dtype == DataType::kFp16 || info.dtype == DataType::kBf16) {
      for (uint16_t& v : t.mutable_values<uint16_t>())
        v = info.dtype == DataType::kFp16 ? FloatToFp16(next()) : FloatToBf16(next());
    } else if (info.dtype == DataType::kInt64) {
      for (int64_t& v : t.mutable_values<int64_t>()) v = 1;
    } else if (info.dtype == DataType::kInt32) {
      for (int32_t& v : t.mutable_values<int32_t>()) v = 1;
    }
    inputs.push_back({info.name, std::move(t)});
  }
  return inputs;
}

}  // namespace shoal::engine
