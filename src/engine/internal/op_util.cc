#include "engine/internal/op_util.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace shoal::engine {
namespace internal {

StatusOr<int64_t> NormalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= std::max<int64_t>(rank, 1) ||
      (rank == 0 && axis != 0 && axis != -1)) {
    return InvalidArgument("axis " + std::to_string(axis) + " is out of range for rank " +
                           std::to_string(rank));
  }
  return axis < 0 ? axis + rank : axis;
}

StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da == db || db == 1) {
      out[i] = da;
    } else if (da == 1) {
      out[i] = db;
    } else {
      return InvalidArgument("shapes " + ShapeToString(a) + " and " + ShapeToString(b) +
                             " do not broadcast");
    }
  }
  return out;
}

std::vector<int64_t> BroadcastStrides(const Shape& shape, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    const size_t i = shape.size() - 1 - k;
    const size_t o = out.size() - 1 - k;
    strides[o] = shape[i] == 1 ? 0 : stride;
    stride *= shape[i];
  }
  return strides;
}

int64_t Product(const Shape& shape, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < std::min(end, shape.size()); ++i) p *= shape[i];
  return p;
}

StatusOr<std::vector<int64_t>> ReadInts(const Tensor& t) {
  std::vector<int64_t> out;
  if (t.dtype() == DataType::kInt64) {
    auto v = t.values<int64_t>();
    out.assign(v.begin(), v.end());
  } else if (t.dtype() == DataType::kInt32) {
    auto v = t.values<int32_t>();
    out.assign(v.begin(), v.end());
  } else {
    return InvalidArgument("expected an int32 or int64 tensor, got " +
                           std::string(DataTypeName(t.dtype())));
  }
  return out;
}

Status CheckFp32Inputs(const PrepareContext& ctx) {
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (ctx.has_input(i) && ctx.in_dtypes[i] != DataType::kFp32)
      return ctx.Error("only FP32 is supported");
  }
  return Status::Ok();
}

StatusOr<double> ReadScalar(const Tensor& t) {
  if (t.element_count() != 1)
    return InvalidArgument("expected one value, got shape " + ShapeToString(t.shape()));
  double v = 0;
  Status s =
      DispatchNumeric(t.dtype(), [&]<typename T>() { v = static_cast<double>(t.values<T>()[0]); });
  if (!s.ok()) return s;
  return v;
}

bool IsFloat(DataType t) { return t == DataType::kFp32 || t == DataType::kFp64; }
bool IsInteger(DataType t) {
  return VisitDType(
      t,
      [](auto tag) {
        using Tag = decltype(tag);
        return Tag::kPlainNumber && std::is_integral_v<typename Tag::type>;
      },
      [] { return false; });
}

void ForEachBroadcast(const Shape& out, const std::vector<int64_t>& sa,
                      const std::vector<int64_t>& sb,
                      const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const int64_t n = Product(out);
  if (n == 0) return;
  const size_t rank = out.size();
  std::vector<int64_t> idx(rank, 0);
  int64_t oa = 0, ob = 0;
  for (int64_t o = 0; o < n; ++o) {
    fn(o, oa, ob);
    for (size_t k = rank; k-- > 0;) {
      if (++idx[k] < out[k]) {
        oa += sa[k];
        ob += sb[k];
        break;
      }
      oa -= sa[k] * (out[k] - 1);
      ob -= sb[k] * (out[k] - 1);
      idx[k] = 0;
    }
  }
}

dnnl::memory::data_type DnnlType(DataType t) {
  using dt = dnnl::memory::data_type;
  switch (t) {
    case DataType::kFp32:
      return dt::f32;
    case DataType::kBf16:
      return dt::bf16;
    case DataType::kFp16:
      return dt::f16;
    case DataType::kInt32:
      return dt::s32;
    case DataType::kInt8:
      return dt::s8;
    case DataType::kUint8:
      return dt::u8;
    default:
      return dt::undef;
  }
}

dnnl::memory::dims ToDims(const Shape& shape) {
  if (shape.empty()) return {1};
  return dnnl::memory::dims(shape.begin(), shape.end());
}

dnnl::memory::desc PlainDesc(const Shape& shape, DataType t) {
  return PlainDesc(shape, DnnlType(t));
}

dnnl::memory::desc PlainDesc(const Shape& shape, dnnl::memory::data_type t) {
  dnnl::memory::dims dims = ToDims(shape);
  dnnl::memory::dims strides(dims.size(), 1);
  for (size_t k = dims.size(); k-- > 1;)
    strides[k - 1] = strides[k] * std::max<int64_t>(dims[k], 1);
  return dnnl::memory::desc(dims, t, strides);
}

void DnnlKernel::BindInput(int arg, const dnnl::memory::desc& md, const dnnl::engine& eng,
                           int input) {
  dnnl::memory mem(md, eng, DNNL_MEMORY_NONE);
  bound_.push_back({mem, input, -1});
  args_[arg] = mem;
}

void DnnlKernel::BindOutput(int arg, const dnnl::memory::desc& md, const dnnl::engine& eng,
                            int output) {
  dnnl::memory mem(md, eng, DNNL_MEMORY_NONE);
  bound_.push_back({mem, -1, output});
  args_[arg] = mem;
}

void DnnlKernel::BindFixed(int arg, const dnnl::memory& mem,
                           std::shared_ptr<const void> keep_alive) {
  args_[arg] = mem;
  if (keep_alive) keep_alive_.push_back(std::move(keep_alive));
}

void DnnlKernel::BindInputAs(int arg, const dnnl::memory::desc& outer,
                             const dnnl::memory::desc& inner, const dnnl::engine& eng, int input,
                             float scale) {
  if (outer == inner && scale == 1.f) return BindInput(arg, outer, eng, input);
  Reorder r;
  r.buffer = Buffer::Allocate(inner.get_size());
  r.outer = dnnl::memory(outer, eng, DNNL_MEMORY_NONE);
  r.inner = dnnl::memory(inner, eng, r.buffer->data());
  dnnl::primitive_attr attr;
  if (scale != 1.f) attr.set_output_scales(0, {scale});
  r.prim = dnnl::reorder(r.outer, r.inner, attr);
  r.index = input;
  args_[arg] = r.inner;
  pre_.push_back(std::move(r));
}

void DnnlKernel::BindOutputAs(int arg, const dnnl::memory::desc& inner,
                              const dnnl::memory::desc& outer, const dnnl::engine& eng,
                              int output) {
  if (outer == inner) return BindOutput(arg, outer, eng, output);
  Reorder r;
  r.buffer = Buffer::Allocate(inner.get_size());
  r.outer = dnnl::memory(outer, eng, DNNL_MEMORY_NONE);
  r.inner = dnnl::memory(inner, eng, r.buffer->data());
  r.prim = dnnl::reorder(r.inner, r.outer);
  r.index = output;
  args_[arg] = r.inner;
  post_.push_back(std::move(r));
}

std::string DnnlKernel::implementation() const {
  if (!primitive) return {};
  const char* info = nullptr;
  if (dnnl_primitive_desc_query(primitive.get_primitive_desc(), dnnl_query_impl_info_str, 0,
                                &info) != dnnl_success ||
      info == nullptr) {
    return {};
  }
  return info;
}

Status DnnlKernel::Run(const RunContext& ctx) {
  for (const Arg& a : bound_) {
    if (a.input >= 0) {
      a.mem.set_data_handle(const_cast<void*>(ctx.inputs[a.input]->data()));
    } else {
      a.mem.set_data_handle(ctx.outputs[a.output]->mutable_data());
    }
  }
  if (prefill_from >= 0) {
    const Tensor& src = *ctx.inputs[prefill_from];
    Tensor& dst = *ctx.outputs[0];
    if (src.data() != dst.data()) std::memcpy(dst.mutable_data(), src.data(), src.byte_size());
  }
  for (Reorder& r : pre_) {
    r.outer.set_data_handle(const_cast<void*>(ctx.inputs[r.index]->data()));
    r.prim.execute(*ctx.stream, r.outer, r.inner);
  }
  primitive.execute(*ctx.stream, args_);
  for (Reorder& r : post_) {
    r.outer.set_data_handle(ctx.outputs[r.index]->mutable_data());
    r.prim.execute(*ctx.stream, r.inner, r.outer);
  }
  return Status::Ok();
}

dnnl::memory::data_type ComputeType(const PrepareContext& ctx) {
  return ctx.options && ctx.options->precision == Precision::kBf16 ? dnnl::memory::data_type::bf16
                                                                   : dnnl::memory::data_type::f32;
}

namespace {

// Int8 scale of graph value `v` from the calibration table (see QuantizeInput).
bool QuantizeValue(const PrepareContext& ctx, int v, float* scale, bool* is_unsigned) {
  if (!ctx.options || ctx.options->precision != Precision::kInt8 || !ctx.options->calibration)
    return false;
  if (v < 0) return false;
  const auto& name = ctx.graph->values[v].name;
  auto it = ctx.options->calibration->find(name);
  if (it == ctx.options->calibration->end()) return false;
  const ValueRange& r = it->second;
  *is_unsigned = r.min >= 0.f;
  const float amax = std::max(std::fabs(r.min), std::fabs(r.max));
  if (!(amax > 0.f) || !std::isfinite(amax)) return false;
  *scale = amax / (*is_unsigned ? 255.f : 127.f);
  return true;
}

}  // namespace

bool QuantizeInput(const PrepareContext& ctx, size_t input, float* scale, bool* is_unsigned) {
  return input < ctx.in_values.size() &&
         QuantizeValue(ctx, ctx.in_values[input], scale, is_unsigned);
}

bool QuantizeOutput(const PrepareContext& ctx, size_t output, float* scale, bool* is_unsigned) {
  const auto& outputs = ctx.node().outputs;
  return output < outputs.size() && output < ctx.out_quantizable.size() &&
         ctx.out_quantizable[output] && QuantizeValue(ctx, outputs[output], scale, is_unsigned);
}

void QuantizeWeights(const Tensor& w, int64_t slices, bool contiguous, Tensor* q,
                     std::vector<float>* scales) {
  const auto src = w.values<float>();
  const int64_t n = static_cast<int64_t>(src.size());
  const int64_t per = slices > 0 ? n / slices : 0;
  *q = Tensor::Allocate(DataType::kInt8, w.shape());
  auto dst = q->mutable_values<int8_t>();
  scales->assign(slices, 0.f);
  auto slice_of = [&](int64_t i) { return contiguous ? i / per : i % slices; };
  for (int64_t i = 0; i < n; ++i) {
    float& m = (*scales)[slice_of(i)];
    m = std::max(m, std::fabs(src[i]));
  }
  for (float& m : *scales) m = m > 0.f ? m / 127.f : 1.f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::nearbyint(src[i] / (*scales)[slice_of(i)]);
    dst[i] = static_cast<int8_t>(std::clamp(v, -127.f, 127.f));
  }
}

std::vector<std::string_view> ActivationAttributes(bool with_post) {
  std::vector<std::string_view> names = {"activation", "activation_alpha", "activation_beta"};
  if (with_post) {
    names.insert(names.end(), {"post_activation", "post_activation_alpha", "post_activation_beta"});
  }
  return names;
}

Status AppendActivation(const Node& node, const std::string& prefix, dnnl::post_ops* po) {
  const std::string name = node.GetString(prefix, "");
  if (name.empty()) return Status::Ok();
  const float alpha = node.GetFloat(prefix + "_alpha", 0.f);
  const float beta = node.GetFloat(prefix + "_beta", 0.f);
  using alg = dnnl::algorithm;
  alg a;
  float pa = 0.f, pb = 0.f;
  if (name == "Relu") {
    a = alg::eltwise_relu;
  } else if (name == "LeakyRelu") {
    a = alg::eltwise_relu;
    pa = alpha;
  } else if (name == "Sigmoid") {
    a = alg::eltwise_logistic;
  } else if (name == "Tanh") {
    a = alg::eltwise_tanh;
  } else if (name == "HardSwish") {
    a = alg::eltwise_hardswish;
  } else if (name == "Gelu") {
    a = alg::eltwise_gelu_erf;
  } else if (name == "GeluTanh") {
    a = alg::eltwise_gelu_tanh;
  } else if (name == "Clip") {
    a = alg::eltwise_clip_v2;
    pa = alpha;
    pb = beta;
  } else {
    return InvalidArgument("unknown fused activation '" + name + "'");
  }
  po->append_eltwise(1.f, a, pa, pb);
  return Status::Ok();
}

Status BindWeights(PrepareContext& ctx, DnnlKernel* kernel, int arg, int input,
                   const dnnl::memory::desc& plain, const dnnl::memory::desc& preferred) {
  const Tensor* data = ctx.in_data[input];
  if (data == nullptr || ctx.weights == nullptr) {
    if (!(plain == preferred)) {
      return ctx.Error("weights that are not constant must be usable in the plain layout");
    }
    kernel->BindInput(arg, plain, *ctx.dnnl_engine, input);
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buf, ctx.weights->Get(ctx.in_values[input], *data, plain,
                                                                 preferred, *ctx.dnnl_engine));
  kernel->BindFixed(arg, dnnl::memory(preferred, *ctx.dnnl_engine, buf->data()), buf);
  return Status::Ok();
}

Status BindWeightsData(PrepareContext& ctx, DnnlKernel* kernel, int arg, int input,
                       const Tensor& data, const dnnl::memory::desc& plain,
                       const dnnl::memory::desc& preferred) {
  if (ctx.weights == nullptr) {
    auto buf = Buffer::Allocate(preferred.get_size());
    dnnl::memory src(plain, *ctx.dnnl_engine, const_cast<void*>(data.data()));
    dnnl::memory dst(preferred, *ctx.dnnl_engine, buf->data());
    dnnl::stream stream(*ctx.dnnl_engine);
    dnnl::reorder(src, dst).execute(stream, src, dst);
    stream.wait();
    kernel->BindFixed(arg, dnnl::memory(preferred, *ctx.dnnl_engine, buf->data()), buf);
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buf, ctx.weights->Get(ctx.in_values[input], data, plain,
                                                                 preferred, *ctx.dnnl_engine));
  kernel->BindFixed(arg, dnnl::memory(preferred, *ctx.dnnl_engine, buf->data()), buf);
  return Status::Ok();
}

}  // namespace internal

StatusOr<std::shared_ptr<Buffer>> WeightCache::Get(int value_id, const Tensor& weights,
                                                   const dnnl::memory::desc& from,
                                                   const dnnl::memory::desc& to,
                                                   const dnnl::engine& engine) {
  MutexLock lock(&mu_);
  for (const Entry& e : entries_) {
    if (e.value_id == value_id && e.desc == to) return e.buffer;
  }
  if (from.get_size() != weights.byte_size()) {
    return Internal("weight size mismatch: " + std::to_string(weights.byte_size()) +
                    " bytes, layout needs " + std::to_string(from.get_size()));
  }
  auto buf = Buffer::Allocate(to.get_size());
  dnnl::memory src(from, engine, const_cast<void*>(weights.data()));
  dnnl::memory dst(to, engine, buf->data());
  dnnl::stream stream(engine);
  dnnl::reorder(src, dst).execute(stream, src, dst);
  stream.wait();
  entries_.push_back({value_id, to, buf});
  return buf;
}

size_t WeightCache::size() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

namespace {
const std::vector<OpDef>& Registry() {
  static const std::vector<OpDef> ops = [] {
    std::vector<OpDef> v;
    internal::RegisterElementwiseOps(&v);
    internal::RegisterConvOps(&v);
    internal::RegisterMatMulOps(&v);
    internal::RegisterNormOps(&v);
    internal::RegisterShapeOps(&v);
    internal::RegisterIndexingOps(&v);
    internal::RegisterReduceOps(&v);
    internal::RegisterRecurrentOps(&v);
    internal::RegisterSortScanOps(&v);
    internal::RegisterDataMovementOps(&v);
    internal::RegisterGroupNormOps(&v);
    internal::RegisterDetectionOps(&v);
    internal::RegisterEinsumOps(&v);
    internal::RegisterSamplingOps(&v);
    internal::RegisterControlFlowOps(&v);
    return v;
  }();
  return ops;
}
}  // namespace

const OpDef* FindOp(std::string_view domain, std::string_view op_type) {
  for (const OpDef& def : Registry()) {
    if (def.domain == domain && def.op_type == op_type) return &def;
  }
  return nullptr;
}

std::vector<const OpDef*> AllOps() {
  std::vector<const OpDef*> out;
  for (const OpDef& def : Registry()) out.push_back(&def);
  return out;
}

Status CheckNode(const Graph& graph, int node_index) {
  const Node& node = graph.nodes[node_index];
  const OpDef* def = FindOp(node.domain, node.op_type);
  if (def == nullptr) {
    return InvalidArgument(graph.Describe(node_index) + ": operator '" + node.qualified_type() +
                           "' is not supported");
  }
  for (const auto& [name, attr] : node.attributes) {
    bool known = false;
    for (std::string_view a : def->attributes) known |= (a == name);
    if (!known) {
      return InvalidArgument(graph.Describe(node_index) + ": attribute '" + name +
                             "' is not supported");
    }
  }
  if (def->check) RETURN_IF_ERROR(def->check(node, graph));
  return Status::Ok();
}

}  // namespace shoal::engine
