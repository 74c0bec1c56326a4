// Helpers shared by the operator implementations: axis handling, broadcasting, reading
// small index tensors, oneDNN descriptors and a generic oneDNN-primitive kernel.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype_visit.h"
#include "core/status.h"
#include "core/tensor.h"
#include "engine/kernel.h"
#include "engine/weight_cache.h"

namespace shoal::engine::internal {

// Maps a possibly negative axis into [0, rank); error when out of range.
StatusOr<int64_t> NormalizeAxis(int64_t axis, int64_t rank);
// Numpy broadcast of two shapes; error when incompatible.
StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b);
// Row-major strides (in elements) of `shape`, as seen from `out_rank` dimensions
// aligned to the right, with stride 0 where `shape` broadcasts (dim 1 or missing).
std::vector<int64_t> BroadcastStrides(const Shape& shape, const Shape& out);
int64_t Product(const Shape& shape, size_t begin = 0, size_t end = SIZE_MAX);
// Reads an integer (int32/int64) tensor into int64 values.
StatusOr<std::vector<int64_t>> ReadInts(const Tensor& t);
// Reads a scalar or one-element tensor of any numeric type as double.
StatusOr<double> ReadScalar(const Tensor& t);
bool IsFloat(DataType t);
bool IsInteger(DataType t);  // signed and unsigned integers (not bool)
// ctx.Error("only FP32 is supported") when an input that is present is not FP32.
Status CheckFp32Inputs(const PrepareContext& ctx);

// Calls `fn(offset_out, offset_a, offset_b)` for every element of `out` where a and b
// broadcast into it (strides from BroadcastStrides).
void ForEachBroadcast(const Shape& out, const std::vector<int64_t>& sa,
                      const std::vector<int64_t>& sb,
                      const std::function<void(int64_t, int64_t, int64_t)>& fn);

// ---- oneDNN ----
dnnl::memory::data_type DnnlType(DataType t);  // undef when oneDNN has none
// A plain row-major descriptor (rank 0 is treated as [1]).
dnnl::memory::desc PlainDesc(const Shape& shape, DataType t);
dnnl::memory::desc PlainDesc(const Shape& shape, dnnl::memory::data_type t);
dnnl::memory::dims ToDims(const Shape& shape);

}  // namespace shoal::engine::internal

namespace shoal::engine::internal {

// A kernel that runs one oneDNN primitive. Arguments are bound either to a node input,
// a node output, or a fixed memory (reordered weights, constants) owned by the kernel.
class DnnlKernel : public Kernel {
 public:
  dnnl::primitive primitive;
  // Kernel::inplace_input; set only for primitives that support dst == that src.
  int inplace = -1;
  int inplace_input() const override { return inplace; }
  // When >= 0, output 0 starts each run as a copy of that input (oneDNN's sum post-op
  // accumulates into the destination); no copy when the plan ran it in place.
  int prefill_from = -1;
  void BindInput(int arg, const dnnl::memory::desc& md, const dnnl::engine& eng, int input);
  void BindOutput(int arg, const dnnl::memory::desc& md, const dnnl::engine& eng, int output);
  void BindFixed(int arg, const dnnl::memory& mem, std::shared_ptr<const void> keep_alive);
  // Binds input `input` (laid out as `outer`) through a kernel-owned copy in `inner`, the
  // layout the primitive chose: reordered before every run. Same as BindInput when the
  // two are equal.
  // `scale` multiplies the values on the way (int8 quantisation).
  void BindInputAs(int arg, const dnnl::memory::desc& outer, const dnnl::memory::desc& inner,
                   const dnnl::engine& eng, int input, float scale = 1.f);
  // The primitive writes `inner` (kernel-owned), reordered into output `output` (laid out
  // as `outer`) after every run. Same as BindOutput when the two are equal.
  void BindOutputAs(int arg, const dnnl::memory::desc& inner, const dnnl::memory::desc& outer,
                    const dnnl::engine& eng, int output);
  Status Run(const RunContext& ctx) override;
  std::string implementation() const override;
  // Reorders added per run (for statistics and tests).
  int reorder_count() const { return static_cast<int>(pre_.size() + post_.size()); }

 private:
  struct Arg {
    dnnl::memory mem;
    int input = -1;
    int output = -1;
  };
  struct Reorder {
    dnnl::memory outer, inner;
    dnnl::reorder prim;
    int index = -1;
    std::shared_ptr<Buffer> buffer;
  };
  std::vector<Arg> bound_;
  std::vector<Reorder> pre_, post_;
  std::unordered_map<int, dnnl::memory> args_;
  std::vector<std::shared_ptr<const void>> keep_alive_;
};

// Binds a weight input of `kernel`: when the input is a constant, reorders it once into
// `preferred` through the model's WeightCache; otherwise binds it per run in `plain`.
Status BindWeights(PrepareContext& ctx, DnnlKernel* kernel, int arg, int input,
                   const dnnl::memory::desc& plain, const dnnl::memory::desc& preferred);

// Appends to `po` the eltwise post-op the optimiser recorded on `node` as attributes
// `<prefix>`, `<prefix>_alpha`, `<prefix>_beta` (see optimizer.h); nothing when absent.
Status AppendActivation(const Node& node, const std::string& prefix, dnnl::post_ops* po);
// The attribute names AppendActivation reads for `prefix`.
std::vector<std::string_view> ActivationAttributes(bool with_post);

// oneDNN data type of activations and weights for a convolution or product under the
// plan's precision tier: f32, or bf16 when the tier is kBf16 (the CPU was checked when
// the model loaded).
dnnl::memory::data_type ComputeType(const PrepareContext& ctx);
// Int8 quantisation of a node input from the calibration table: scale (real value of one
// step) and whether the value is non-negative (u8) or signed (s8). False when the tier
// is not int8 or the value has no range.
bool QuantizeInput(const PrepareContext& ctx, size_t input, float* scale, bool* is_unsigned);
// The same for output `output`, when the plan lets it be stored quantised
// (PrepareContext::out_quantizable) and the value has a range.
bool QuantizeOutput(const PrepareContext& ctx, size_t output, float* scale, bool* is_unsigned);
// Symmetric per-slice int8 quantisation of constant weights: `w` is viewed as `slices`
// rows (per output channel) of contiguous values when `contiguous`, else as columns
// (the last dimension, per output column of a [K, N] matrix). Writes q and scales.
void QuantizeWeights(const Tensor& w, int64_t slices, bool contiguous, Tensor* q,
                     std::vector<float>* scales);

// As BindWeights, with `data` standing for the constant input `input` (quantised
// weights): cached per (input value, `preferred`).
Status BindWeightsData(PrepareContext& ctx, DnnlKernel* kernel, int arg, int input,
                       const Tensor& data, const dnnl::memory::desc& plain,
                       const dnnl::memory::desc& preferred);

// A kernel from a lambda (engine-side implementations of small operators).
class FnKernel : public Kernel {
 public:
  explicit FnKernel(std::function<Status(const RunContext&)> fn, int alias = -1, int inplace = -1)
      : fn_(std::move(fn)), alias_(alias), inplace_(inplace) {}
  Status Run(const RunContext& ctx) override { return fn_(ctx); }
  int alias_input() const override { return alias_; }
  int inplace_input() const override { return inplace_; }

 private:
  std::function<Status(const RunContext&)> fn_;
  int alias_;
  int inplace_;
};

inline StatusOr<std::unique_ptr<Kernel>> MakeFn(std::function<Status(const RunContext&)> fn) {
  return std::unique_ptr<Kernel>(new FnKernel(std::move(fn)));
}
// As MakeFn, for a function that may run with output 0 in `input`'s bytes (see
// Kernel::inplace_input); -1 for none.
inline StatusOr<std::unique_ptr<Kernel>> MakeInplaceFn(
    int input, std::function<Status(const RunContext&)> fn) {
  return std::unique_ptr<Kernel>(new FnKernel(std::move(fn), -1, input));
}
inline StatusOr<std::unique_ptr<Kernel>> MakeAlias(int input) {
  return std::unique_ptr<Kernel>(
      new FnKernel([](const RunContext&) { return Status::Ok(); }, input));
}

// Dispatches `fn.template operator()<T>()` on the dtypes the engine's own loops compute
// in (FP32, FP64, INT64, INT32, INT8, UINT8); error for others.
template <typename Fn>
Status DispatchNumeric(DataType t, Fn&& fn) {
  auto unsupported = [t] {
    return InvalidArgument("unsupported data type " + std::string(DataTypeName(t)));
  };
  return VisitDType(
      t,
      [&](auto tag) -> Status {
        constexpr DataType kType = decltype(tag)::kType;
        if constexpr (kType == DataType::kFp32 || kType == DataType::kFp64 ||
                      kType == DataType::kInt64 || kType == DataType::kInt32 ||
                      kType == DataType::kInt8 || kType == DataType::kUint8) {
          fn.template operator()<typename decltype(tag)::type>();
          return Status::Ok();
        } else {
          return unsupported();
        }
      },
      unsupported);
}

// Dispatches on element size for type-agnostic data movement (1, 2, 4, 8 bytes).
template <typename Fn>
Status DispatchBySize(DataType t, Fn&& fn) {
  switch (DataTypeSize(t)) {
    case 1:
      fn.template operator()<uint8_t>();
      return Status::Ok();
    case 2:
      fn.template operator()<uint16_t>();
      return Status::Ok();
    case 4:
      fn.template operator()<uint32_t>();
      return Status::Ok();
    case 8:
      fn.template operator()<uint64_t>();
      return Status::Ok();
    default:
      return InvalidArgument("unsupported data type " + std::string(DataTypeName(t)));
  }
}

// Op registration, one function per ops/*.cc file.
void RegisterElementwiseOps(std::vector<OpDef>* ops);
void RegisterConvOps(std::vector<OpDef>* ops);
void RegisterMatMulOps(std::vector<OpDef>* ops);
void RegisterNormOps(std::vector<OpDef>* ops);
void RegisterShapeOps(std::vector<OpDef>* ops);
void RegisterIndexingOps(std::vector<OpDef>* ops);
void RegisterReduceOps(std::vector<OpDef>* ops);
void RegisterRecurrentOps(std::vector<OpDef>* ops);
void RegisterSortScanOps(std::vector<OpDef>* ops);
void RegisterDataMovementOps(std::vector<OpDef>* ops);
void RegisterGroupNormOps(std::vector<OpDef>* ops);
void RegisterDetectionOps(std::vector<OpDef>* ops);
void RegisterEinsumOps(std::vector<OpDef>* ops);
void RegisterSamplingOps(std::vector<OpDef>* ops);
void RegisterControlFlowOps(std::vector<OpDef>* ops);

}  // namespace shoal::engine::internal
