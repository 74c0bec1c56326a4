#include "engine/precision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/npy.h"

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
  return buf;
}

StatusOr<TierAccuracy> CompareTiers(const Model& reference, const Model& variant,
                                    const std::vector<std::vector<NamedTensor>>& batches) {
  ASSIGN_OR_RETURN(auto ref_session, Session::Create(reference));
  ASSIGN_OR_RETURN(auto var_session, Session::Create(variant));
  TierAccuracy acc;
  int64_t agree = 0, rows = 0;
  bool classifier = true;
  for (const auto& batch : batches) {
    std::vector<NamedTensor> a, b;
    RETURN_IF_ERROR(ref_session->Run(batch, &a));
    RETURN_IF_ERROR(var_session->Run(batch, &b));
    if (a.size() != b.size()) return Internal("the variant has different outputs");
    for (size_t o = 0; o < a.size(); ++o) {
      const Tensor& x = a[o].tensor;
      const Tensor& y = b[o].tensor;
      if (x.shape() != y.shape() || x.dtype() != y.dtype())
        return Internal("output '" + a[o].name + "' differs in shape or type between tiers");
      if (x.dtype() != DataType::kFp32) continue;
      auto xv = x.values<float>(), yv = y.values<float>();
      for (size_t i = 0; i < xv.size(); ++i)
        acc.max_abs_diff =
            std::max(acc.max_abs_diff, static_cast<double>(std::fabs(xv[i] - yv[i])));
    }
    if (!a.empty()) acc.samples += a[0].tensor.shape().empty() ? 1 : a[0].tensor.shape()[0];
    const Tensor& x = a.empty() ? Tensor() : a[0].tensor;
    if (x.dtype() != DataType::kFp32 || x.shape().size() != 2 || x.shape()[1] < 2) {
      classifier = false;
      continue;
    }
    const int64_t n = x.shape()[0], c = x.shape()[1];
    auto xv = x.values<float>(), yv = b[0].tensor.values<float>();
    for (int64_t r = 0; r < n; ++r) {
      const auto xa = std::max_element(xv.begin() + r * c, xv.begin() + (r + 1) * c) - xv.begin();
      const auto ya = std::max_element(yv.begin() + r * c, yv.begin() + (r + 1) * c) - yv.begin();
      agree += xa == ya;
      ++rows;
    }
  }
  if (classifier && rows > 0) acc.top1_agreement = static_cast<double>(agree) / rows;
  return acc;
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

}  // namespace shoal::engine
