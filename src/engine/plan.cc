#include "engine/plan.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <string>

#include "engine/internal/op_util.h"
#include "engine/memory_planner.h"

namespace shoal::engine {

using internal::Product;

int64_t NodeFlops(const Graph& g, const Node& node, const std::vector<Shape>& shapes) {
  auto shape = [&](int v) -> const Shape& { return shapes[v]; };
  if (node.outputs.empty() || node.outputs[0] < 0) return 0;
  const Shape& out = shape(node.outputs[0]);
  // Fused nodes (optimizer.h) count as the convolution or product they wrap; the
  // element-wise work folded into them is not counted.
  const std::string op = node.op_type == "FusedConv"     ? "Conv"
                         : node.op_type == "FusedMatMul" ? "MatMul"
                         : node.op_type == "FusedGemm"   ? "Gemm"
                                                         : node.op_type;
  if (op == "Conv" && node.has_input(1)) {
    const Shape& w = shape(node.inputs[1]);
    return 2 * Product(out) * Product(w, 1);
  }
  if (op == "ConvTranspose" && node.has_input(1)) {
    const Shape& w = shape(node.inputs[1]);
    return 2 * Product(shape(node.inputs[0])) * Product(w, 1);
  }
  if ((op == "MatMul" || op == "Gemm") && node.has_input(0)) {
    const Shape& a = shape(node.inputs[0]);
    if (a.empty()) return 0;
    int64_t k = a.back();
    if (op == "Gemm" && node.GetInt("transA", 0) && a.size() == 2) k = a[0];
    return 2 * Product(out) * k;
  }
  // Recurrent layers: every step multiplies the input by W and the state by R.
  if ((op == "LSTM" || op == "GRU" || op == "RNN") && node.has_input(1) && node.has_input(2)) {
    const Shape& x = shape(node.inputs[0]);
    if (x.size() != 3) return 0;
    return 2 * x[0] * x[1] * (Product(shape(node.inputs[1])) + Product(shape(node.inputs[2])));
  }
  static const std::set<std::string> kElementwise = {"Add",
                                                     "Sub",
                                                     "Mul",
                                                     "Div",
                                                     "Pow",
                                                     "Sqrt",
                                                     "Exp",
                                                     "Log",
                                                     "Erf",
                                                     "Neg",
                                                     "Abs",
                                                     "Reciprocal",
                                                     "Relu",
                                                     "LeakyRelu",
                                                     "PRelu",
                                                     "Sigmoid",
                                                     "Tanh",
                                                     "Clip",
                                                     "HardSigmoid",
                                                     "HardSwish",
                                                     "Gelu",
                                                     "Softmax",
                                                     "LogSoftmax",
                                                     "BatchNormalization",
                                                     "LayerNormalization",
                                                     "MaxPool",
                                                     "AveragePool",
                                                     "GlobalAveragePool",
                                                     "GlobalMaxPool",
                                                     "ReduceMean",
                                                     "ReduceSum",
                                                     "ReduceMax",
                                                     "Min",
                                                     "Max",
                                                     "Where",
                                                     "Resize"};
  if (kElementwise.count(op)) {
    // Pools and reductions read every input element once.
    const bool reads_input = op.find("Pool") != std::string::npos || op.rfind("Reduce", 0) == 0;
    return reads_input && node.has_input(0) ? Product(shape(node.inputs[0])) : Product(out);
  }
  return 0;
}

int64_t Plan::EstimatedFlops() const {
  int64_t flops = 0;
  for (const Node& node : graph_->nodes) flops += NodeFlops(*graph_, node, shapes_);
  return flops;
}

int Plan::kernel_steps() const {
  int n = 0;
  for (const Step& step : steps_)
    n += !step.skip && !step.dynamic && step.kernel->alias_input() < 0;
  return n;
}

std::vector<Plan::StepInfo> Plan::Steps() const {
  std::vector<StepInfo> out;
  out.reserve(steps_.size());
  for (const Step& step : steps_) {
    out.push_back({step.node, step.inputs, step.outputs, step.skip, step.dynamic,
                   step.kernel ? step.kernel->alias_input() : -1});
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> Plan::Implementations() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Step& step : steps_) {
    if (step.skip || !step.kernel) continue;
    std::string impl = step.kernel->implementation();
    const Node& node = graph_->nodes[step.node];
    if (!impl.empty()) out.emplace_back(node.qualified_type(), std::move(impl));
  }
  return out;
}

namespace {

using internal::Product;

Tensor ViewOf(const Tensor& src, DataType dtype, const Shape& shape) {
  const size_t offset = static_cast<size_t>(static_cast<const char*>(src.data()) -
                                            static_cast<const char*>(src.buffer()->data()));
  return Tensor(dtype, shape, src.buffer(), offset, src.byte_size());
}

Tensor CopyOf(const Tensor& t) {
  Tensor copy = Tensor::AllocateUninitialized(t.dtype(), t.shape(), t.byte_size());
  if (t.byte_size()) std::memcpy(copy.mutable_data(), t.data(), t.byte_size());
  return copy;
}

// Whether a dynamic step's preparation gets a value's data (`bound` now): plan
// constants (`known`), and plain integer values (indices, shapes) computed this run.
bool PassesData(const Tensor& known, const dnnl::memory::desc& desc, const Tensor& bound) {
  return !known.empty() || (desc.data.ndims == 0 && internal::IsInteger(bound.dtype()));
}

// A template, not std::function: it wraps every step of every run.
template <typename Fn>
Status WrapDnnl(const Graph& graph, int node, const Fn& fn) {
  try {
    return fn();
  } catch (const dnnl::error& e) {
    return InvalidArgument(graph.Describe(node) + ": oneDNN rejected it: " + e.what());
  } catch (const std::bad_alloc&) {
    return ResourceExhausted(graph.Describe(node) + ": out of memory");
  }
}

// Which values may stay in the layout their producer picks, and (int8 plans) quantised:
// per value, as PrepareContext::out_any_layout and out_quantizable describe.
struct ValueLayouts {
  std::vector<char> any_layout, quantizable;
};

// A value may stay in a layout its producer picks (blocked, for oneDNN's fastest
// convolutions) when every node that reads it accepts any layout at that input.
// In an int8 plan it may also stay quantised (s8/u8 with a scale) when every reader
// accepts that too, and every reader that passes the scale on (max pooling) can keep
// its own output quantised: a value is not rounded to 8 bits on its way to a reader
// that wants FP32 (values are decided last reader first; nodes are in topological
// order).
ValueLayouts DecideValueLayouts(const Graph& graph, const std::vector<char>& is_output,
                                const PlanOptions& options) {
  const Precision precision = options.precision;
  const size_t nv = graph.values.size();
  ValueLayouts l;
  l.any_layout.assign(nv, 0);
  l.quantizable.assign(nv, 0);
  struct Reader {
    const Node* node;
    const OpDef* def;
    size_t input;
  };
  std::vector<std::vector<Reader>> readers(nv);
  for (const Node& node : graph.nodes) {
    const OpDef* def = FindOp(node.domain, node.op_type);
    for (size_t i = 0; i < node.inputs.size(); ++i)
      if (node.inputs[i] >= 0) readers[node.inputs[i]].push_back({&node, def, i});
  }
  if (options.plain_layouts) return l;
  auto bit = [](uint32_t mask, size_t i) { return i < 32 && ((mask >> i) & 1); };
  for (size_t v = 0; v < nv; ++v) {
    l.any_layout[v] = !readers[v].empty() && !is_output[v] &&
                      std::all_of(readers[v].begin(), readers[v].end(), [&](const Reader& r) {
                        return r.def && bit(r.def->any_layout_inputs, r.input);
                      });
  }
  // In a bf16 plan a value in a producer's layout may be bf16; one that a node kept in
  // FP32 (PlanOptions::fp32_nodes) writes or reads stays plain FP32 instead, since a
  // fused residual must match its convolution's own type.
  if (precision == Precision::kBf16 && options.fp32_nodes) {
    for (int n : *options.fp32_nodes) {
      if (n < 0 || static_cast<size_t>(n) >= graph.nodes.size()) continue;
      for (int v : graph.nodes[n].inputs)
        if (v >= 0) l.any_layout[v] = 0;
      for (int v : graph.nodes[n].outputs)
        if (v >= 0) l.any_layout[v] = 0;
    }
  }
  if (precision != Precision::kInt8) return l;
  for (size_t n = graph.nodes.size(); n-- > 0;) {
    for (int v : graph.nodes[n].outputs) {
      if (v < 0 || !l.any_layout[v]) continue;
      l.quantizable[v] = std::all_of(readers[v].begin(), readers[v].end(), [&](const Reader& r) {
        if (!bit(r.def->quantized_inputs, r.input)) return false;
        // A node kept in FP32 reads FP32.
        if (options.KeepsFp32(static_cast<int>(r.node - graph.nodes.data()))) return false;
        if (!r.def->quantized_passthrough) return true;
        const int out = r.node->outputs.empty() ? -1 : r.node->outputs[0];
        return out >= 0 && l.quantizable[out] != 0;
      });
    }
  }
  return l;
}

}  // namespace

namespace {
std::atomic<int64_t> prepared_plans{0};
}  // namespace

int64_t Plan::PreparedCount() { return prepared_plans.load(std::memory_order_relaxed); }

StatusOr<std::unique_ptr<Plan>> Plan::Prepare(const Graph& graph,
                                              const std::vector<Shape>& input_shapes,
                                              const dnnl::engine& engine, dnnl::stream& stream,
                                              WeightCache* weights, const PlanOptions& options,
                                              const PlanLimits& limits,
                                              const std::vector<DataType>* input_dtypes,
                                              const std::vector<const Tensor*>* input_data) {
  if (input_shapes.size() != graph.inputs.size() ||
      (input_dtypes && input_dtypes->size() != graph.inputs.size()) ||
      (input_data && input_data->size() != graph.inputs.size())) {
    return InvalidArgument("expected " + std::to_string(graph.inputs.size()) +
                           " input shapes, got " + std::to_string(input_shapes.size()));
  }
  std::unique_ptr<Plan> plan(new Plan(graph));
  plan->weights_ = weights;
  plan->options_ = options;
  plan->limits_ = limits;
  std::vector<char> defined;  // per value: its shape and dtype are known
  plan->InitValues(input_shapes, input_dtypes, input_data, &defined);
  const ValueLayouts layouts = DecideValueLayouts(graph, plan->is_output_, options);
  // What nodes kept in FP32 (PlanOptions::fp32_nodes) see.
  PlanOptions fp32_options = options;
  fp32_options.precision = Precision::kFp32;
  // Their convolutions keep the tier's channels-last layout, which its bf16/int8 ones read
  // and write (a blocked fp32 residual would push an int8 one to a slower kernel).
  fp32_options.conv_layout = ConvLayout::kChannelsLast;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    const OpDef* def = FindOp(node.domain, node.op_type);
    if (def == nullptr) return InvalidArgument(graph.Describe(n) + ": operator is not supported");
    PrepareContext ctx;
    ctx.options = options.KeepsFp32(static_cast<int>(n)) ? &fp32_options : &options;
    ctx.dnnl_engine = &engine;
    ctx.weights = weights;
    ctx.limits = &limits;
    bool all_known = true;
    RETURN_IF_ERROR(plan->FillContext(static_cast<int>(n), defined, layouts.any_layout,
                                      layouts.quantizable, &ctx, &all_known));
    if (plan->AddDynamicStep(static_cast<int>(n), &defined)) continue;
    std::unique_ptr<Kernel> kernel;
    RETURN_IF_ERROR(WrapDnnl(graph, n, [&]() -> Status {
      ASSIGN_OR_RETURN(kernel, def->prepare(ctx));
      return Status::Ok();
    }));
    RETURN_IF_ERROR(plan->RecordOutputs(static_cast<int>(n), ctx, limits, &defined));
    if (plan->TakeComputedOutputs(node, ctx)) continue;
    if (!kernel) return Internal(graph.Describe(n) + ": operator returned no kernel");
    RETURN_IF_ERROR(plan->AddStep(static_cast<int>(n), std::move(kernel), all_known, stream));
  }
  for (int v : graph.outputs) {
    if (!defined[v])
      return InvalidArgument("graph output '" + graph.values[v].name + "' is never produced");
  }
  RETURN_IF_ERROR(plan->AssignOffsets());
  plan->BindOnce();
  prepared_plans.fetch_add(1, std::memory_order_relaxed);
  return plan;
}

void Plan::InitValues(const std::vector<Shape>& input_shapes,
                      const std::vector<DataType>* input_dtypes,
                      const std::vector<const Tensor*>* input_data, std::vector<char>* defined) {
  const Graph& graph = *graph_;
  const size_t nv = graph.values.size();
  shapes_.assign(nv, Shape{});
  dtypes_.assign(nv, DataType::kInvalid);
  known_.assign(nv, Tensor());
  alias_of_.assign(nv, -1);
  offsets_.assign(nv, -1);
  is_output_.assign(nv, 0);
  dynamic_.assign(nv, 0);
  defined->assign(nv, 0);
  for (size_t v = 0; v < nv; ++v) {
    if (graph.values[v].is_constant()) {
      known_[v] = graph.values[v].constant;
      shapes_[v] = graph.values[v].constant.shape();
      dtypes_[v] = graph.values[v].constant.dtype();
      (*defined)[v] = 1;
    }
  }
  for (size_t i = 0; i < graph.inputs.size(); ++i) {
    const int v = graph.inputs[i];
    shapes_[v] = input_shapes[i];
    dtypes_[v] = input_dtypes ? (*input_dtypes)[i] : graph.values[v].dtype;
    if (input_data && (*input_data)[i]) known_[v] = *(*input_data)[i];
    (*defined)[v] = 1;
  }
  for (int v : graph.outputs) is_output_[v] = 1;
  descs_.assign(nv, dnnl::memory::desc());
  scales_.assign(nv, 0.f);
}

Status Plan::FillContext(int n, const std::vector<char>& defined,
                         const std::vector<char>& any_layout, const std::vector<char>& quantizable,
                         PrepareContext* ctx, bool* all_known) const {
  const Graph& graph = *graph_;
  const Node& node = graph.nodes[n];
  ctx->graph = &graph;
  ctx->node_index = n;
  *all_known = true;
  for (int v : node.inputs) {
    if (v >= 0 && !defined[v])
      return InvalidArgument(graph.Describe(n) + ": input used before it is defined");
    ctx->in_values.push_back(v);
    ctx->in_dtypes.push_back(v >= 0 ? dtypes_[v] : DataType::kInvalid);
    ctx->in_shapes.push_back(v >= 0 ? shapes_[v] : Shape{});
    ctx->in_data.push_back(v >= 0 && !known_[v].empty() ? &known_[v] : nullptr);
    ctx->in_descs.push_back(v >= 0 ? descs_[v] : dnnl::memory::desc());
    ctx->in_scales.push_back(v >= 0 ? scales_[v] : 0.f);
    if (v >= 0 && known_[v].empty()) *all_known = false;
  }
  ctx->SetOutputs(node.outputs.size());
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    const int v = node.outputs[o];
    ctx->out_any_layout[o] = v >= 0 && any_layout[v] && !*all_known;
    ctx->out_quantizable[o] = ctx->out_any_layout[o] && quantizable[v];
  }
  return Status::Ok();
}

Status Plan::RecordOutputs(int n, const PrepareContext& ctx, const PlanLimits& limits,
                           std::vector<char>* defined) {
  const Graph& graph = *graph_;
  const Node& node = graph.nodes[n];
  if (ctx.out_shapes.size() != node.outputs.size() ||
      ctx.out_dtypes.size() != node.outputs.size()) {
    return Internal(graph.Describe(n) + ": operator produced the wrong number of output shapes");
  }
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    const int v = node.outputs[o];
    if (v < 0) continue;
    if (ctx.out_dynamic[o]) {
      if (ctx.out_dtypes[o] == DataType::kInvalid)
        return Internal(graph.Describe(n) + ": operator left an output without a data type");
      dtypes_[v] = ctx.out_dtypes[o];
      dynamic_[v] = 1;
      (*defined)[v] = 1;
      continue;
    }
    const int64_t elem =
        std::max<int64_t>(1, static_cast<int64_t>(DataTypeSize(ctx.out_dtypes[o])));
    auto count = ElementCount(ctx.out_shapes[o], limits.max_tensor_bytes / elem);
    if (!count.ok())
      return InvalidArgument(graph.Describe(n) + ": output " + std::to_string(o) + ": " +
                             count.status().message());
    if (ctx.out_dtypes[o] == DataType::kInvalid) {
      return Internal(graph.Describe(n) + ": operator left an output without a data type");
    }
    shapes_[v] = ctx.out_shapes[o];
    dtypes_[v] = ctx.out_dtypes[o];
    if (ctx.out_descs[o].data.ndims != 0) {
      if (!ctx.out_any_layout[o])
        return Internal(graph.Describe(n) + ": operator chose a layout for a plain output");
      descs_[v] = ctx.out_descs[o];
      ++blocked_values_;
    }
    // A quantised output has an s8/u8 layout and a scale, and is one the plan allowed;
    // an FP32 value never gets an 8-bit layout without a scale.
    const auto dt = static_cast<dnnl::memory::data_type>(ctx.out_descs[o].data.data_type);
    const bool eight_bit = ctx.out_descs[o].data.ndims != 0 &&
                           (dt == dnnl::memory::data_type::s8 || dt == dnnl::memory::data_type::u8);
    if ((ctx.out_scales[o] != 0.f &&
         (!ctx.out_quantizable[o] || !eight_bit || !(ctx.out_scales[o] > 0.f))) ||
        (ctx.out_scales[o] == 0.f && eight_bit && ctx.out_dtypes[o] == DataType::kFp32))
      return Internal(graph.Describe(n) + ": operator quantised an output it may not");
    if (ctx.out_scales[o] != 0.f) {
      scales_[v] = ctx.out_scales[o];
      ++quantized_values_;
    }
    (*defined)[v] = 1;
  }
  return Status::Ok();
}

bool Plan::TakeComputedOutputs(const Node& node, const PrepareContext& ctx) {
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    if (node.outputs[o] >= 0 && ctx.out_data[o].empty()) return false;
  }
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    if (node.outputs[o] >= 0) known_[node.outputs[o]] = ctx.out_data[o];
  }
  return true;
}

Status Plan::AddStep(int n, std::unique_ptr<Kernel> kernel, bool all_known, dnnl::stream& stream) {
  const Node& node = graph_->nodes[n];
  Step step;
  step.node = n;
  step.inputs = node.inputs;
  step.outputs = node.outputs;
  step.kernel = std::move(kernel);
  bool all_empty = true;
  for (int v : node.outputs) {
    if (v >= 0 && (dynamic_[v] || Product(shapes_[v]) != 0)) all_empty = false;
  }
  step.skip = all_empty;
  if (step.kernel->alias_input() >= 0) {
    const int src = node.inputs[step.kernel->alias_input()];
    const int out = node.outputs[0];
    alias_of_[out] = alias_of_[src] >= 0 ? alias_of_[src] : src;
    if (!known_[src].empty()) {
      known_[out] = ViewOf(known_[src], dtypes_[out], shapes_[out]);
      return Status::Ok();
    }
    steps_.push_back(std::move(step));
    return Status::Ok();
  }
  if (all_known && step.kernel->runs_at_plan_time()) {
    RETURN_IF_ERROR(RunNow(step, stream));
    // A data-dependent shape computed now is a plan constant like any other.
    for (int v : node.outputs) {
      if (v >= 0 && dynamic_[v]) {
        shapes_[v] = known_[v].shape();
        dynamic_[v] = 0;
      }
    }
    return Status::Ok();
  }
  steps_.push_back(std::move(step));
  return Status::Ok();
}

bool Plan::AddDynamicStep(int n, std::vector<char>* defined) {
  const Node& node = graph_->nodes[n];
  bool reads_dynamic = false;
  for (int v : node.inputs) {
    if (v >= 0 && dynamic_[v]) reads_dynamic = true;
  }
  if (!reads_dynamic) return false;
  Step step;
  step.node = n;
  step.inputs = node.inputs;
  step.outputs = node.outputs;
  step.dynamic = true;
  if (limits_.dynamic_cache_entries > 0) {
    step.prepared = std::make_unique<internal::PreparedCache>(
        static_cast<size_t>(limits_.dynamic_cache_entries));
  }
  for (int v : node.outputs) {
    if (v < 0) continue;
    dynamic_[v] = 1;
    (*defined)[v] = 1;
  }
  steps_.push_back(std::move(step));
  return true;
}

bool Plan::DynamicKey(const Step& step, std::string* key) const {
  key->clear();
  size_t data_bytes = 0;
  auto put = [key](const void* p, size_t n) { key->append(static_cast<const char*>(p), n); };
  for (int v : step.inputs) {
    const int64_t rank = v < 0 ? -1 : static_cast<int64_t>(bindings_[v].shape().size());
    put(&rank, sizeof rank);
    if (v < 0) continue;
    const Tensor& t = bindings_[v];
    const int32_t dtype = static_cast<int32_t>(t.dtype());
    put(&dtype, sizeof dtype);
    put(t.shape().data(), t.shape().size() * sizeof(int64_t));
    // A plan constant is the same at every run; other data passed is part of the key.
    if (!known_[v].empty() || !PassesData(known_[v], descs_[v], t)) continue;
    data_bytes += t.byte_size();
    if (data_bytes > kDynamicKeyDataBytes) return false;
    put(t.data(), t.byte_size());
  }
  return true;
}

Status Plan::PrepareDynamic(const Step& step, dnnl::stream& stream,
                            internal::PreparedStep* prepared) const {
  const Graph& graph = *graph_;
  const Node& node = graph.nodes[step.node];
  const OpDef* def = FindOp(node.domain, node.op_type);
  if (def == nullptr) return Internal(graph.Describe(step.node) + ": operator is not supported");
  PrepareContext ctx;
  ctx.graph = &graph;
  ctx.node_index = step.node;
  // A node tier selection kept in FP32 is prepared as Prepare does for it.
  PlanOptions fp32_options;
  if (options_.KeepsFp32(step.node)) {
    fp32_options = options_;
    fp32_options.precision = Precision::kFp32;
    fp32_options.conv_layout = ConvLayout::kChannelsLast;  // as Prepare's
    ctx.options = &fp32_options;
  } else {
    ctx.options = &options_;
  }
  const dnnl::engine engine = stream.get_engine();
  ctx.dnnl_engine = &engine;
  ctx.weights = weights_;
  ctx.limits = &limits_;
  for (int v : step.inputs) {
    ctx.in_values.push_back(v);
    if (v < 0) {
      ctx.in_dtypes.push_back(DataType::kInvalid);
      ctx.in_shapes.push_back(Shape{});
      ctx.in_data.push_back(nullptr);
      ctx.in_descs.push_back(dnnl::memory::desc());
      ctx.in_scales.push_back(0.f);
      continue;
    }
    const Tensor& t = bindings_[v];
    if (t.empty() && Product(t.shape()) != 0)
      return Internal(graph.Describe(step.node) + ": input is not computed");
    ctx.in_dtypes.push_back(t.dtype());
    ctx.in_shapes.push_back(t.shape());
    ctx.in_data.push_back(PassesData(known_[v], descs_[v], t) ? &t : nullptr);
    ctx.in_descs.push_back(descs_[v]);
    ctx.in_scales.push_back(scales_[v]);
  }
  ctx.SetOutputs(node.outputs.size());
  std::unique_ptr<Kernel> kernel;
  RETURN_IF_ERROR(WrapDnnl(graph, step.node, [&]() -> Status {
    ASSIGN_OR_RETURN(kernel, def->prepare(ctx));
    return Status::Ok();
  }));
  if (ctx.out_shapes.size() != node.outputs.size() || ctx.out_dtypes.size() != node.outputs.size())
    return Internal(graph.Describe(step.node) + ": operator produced the wrong number of outputs");
  bool computed = true;
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    if (node.outputs[o] >= 0 && ctx.out_data[o].empty()) computed = false;
  }
  if (computed) {
    prepared->computed = std::move(ctx.out_data);
    return Status::Ok();
  }
  if (!kernel) return Internal(graph.Describe(step.node) + ": operator returned no kernel");
  prepared->kernel = std::move(kernel);
  prepared->out_dtypes = std::move(ctx.out_dtypes);
  prepared->out_shapes = std::move(ctx.out_shapes);
  prepared->out_dynamic = std::move(ctx.out_dynamic);
  return Status::Ok();
}

Status Plan::RunDynamic(const Step& step, dnnl::stream& stream) {
  const Graph& graph = *graph_;
  const Node& node = graph.nodes[step.node];
  std::string key;
  const bool cacheable = step.prepared != nullptr && DynamicKey(step, &key);
  const internal::PreparedStep* prepared = cacheable ? step.prepared->Find(key) : nullptr;
  internal::PreparedStep fresh;
  if (prepared != nullptr) {
    ++dynamic_stats_.cache_hits;
  } else {
    ++dynamic_stats_.prepares;
    RETURN_IF_ERROR(PrepareDynamic(step, stream, &fresh));
    if (!cacheable && !fresh.computed.empty()) {
      for (size_t o = 0; o < node.outputs.size(); ++o) {
        if (node.outputs[o] < 0) continue;
        Tensor t = std::move(fresh.computed[o]);
        // A result that shares a static input's bytes (a view of an arena value or of a
        // plan constant) would outlive them or let the caller write through: a copy.
        bool shared = false;
        for (int v : step.inputs) {
          if (v >= 0 && !dynamic_[v] && !t.empty() && bindings_[v].buffer() == t.buffer())
            shared = true;
        }
        bindings_[node.outputs[o]] = shared ? CopyOf(t) : std::move(t);
      }
      return Status::Ok();
    }
    // A cached result owns its bytes: the inputs' may change, and the copies handed out
    // below may be written through.
    for (Tensor& t : fresh.computed)
      if (!t.empty()) t = CopyOf(t);
    prepared = cacheable ? step.prepared->Insert(std::move(key), std::move(fresh)) : &fresh;
  }
  if (!prepared->computed.empty()) {
    for (size_t o = 0; o < node.outputs.size(); ++o) {
      if (node.outputs[o] >= 0) bindings_[node.outputs[o]] = CopyOf(prepared->computed[o]);
    }
    return Status::Ok();
  }
  Kernel* kernel = prepared->kernel.get();
  if (kernel->alias_input() >= 0) {
    const int out = node.outputs[0];
    const int src = step.inputs[kernel->alias_input()];
    Tensor view = ViewOf(bindings_[src], prepared->out_dtypes[0], prepared->out_shapes[0]);
    // The arena's bytes are planned without this view's readers, and a plan constant
    // must not be written through: a view of either is a copy.
    bindings_[out] = dynamic_[src] ? std::move(view) : CopyOf(view);
    return Status::Ok();
  }
  RunContext rc;
  rc.stream = &stream;
  bool all_empty = true;
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    const int v = node.outputs[o];
    if (v < 0) continue;
    if (prepared->out_dynamic[o]) {
      bindings_[v] = Tensor();
      all_empty = false;
      continue;
    }
    const DataType dtype = prepared->out_dtypes[o];
    const Shape& shape = prepared->out_shapes[o];
    const int64_t elem = std::max<int64_t>(1, static_cast<int64_t>(DataTypeSize(dtype)));
    auto count = ElementCount(shape, limits_.max_tensor_bytes / elem);
    if (!count.ok())
      return InvalidArgument(graph.Describe(step.node) + ": output " + std::to_string(o) + ": " +
                             count.status().message());
    if (*count != 0) all_empty = false;
    bindings_[v] = Tensor::Allocate(dtype, shape);
  }
  if (all_empty) return Status::Ok();
  for (int v : step.inputs) rc.inputs.push_back(v >= 0 ? &bindings_[v] : nullptr);
  for (int v : step.outputs) rc.outputs.push_back(v >= 0 ? &bindings_[v] : nullptr);
  return WrapDnnl(graph, step.node, [&]() -> Status {
    RETURN_IF_ERROR(kernel->Run(rc));
    // The next dynamic step's prepare may read this output's data.
    stream.wait();
    return Status::Ok();
  });
}

Status Plan::RunNow(const Step& step, dnnl::stream& stream) {
  RunContext rc;
  rc.stream = &stream;
  for (int v : step.inputs) rc.inputs.push_back(v >= 0 ? &known_[v] : nullptr);
  for (int v : step.outputs) {
    if (v >= 0) known_[v] = Tensor::Allocate(dtypes_[v], shapes_[v]);
    rc.outputs.push_back(v >= 0 ? &known_[v] : nullptr);
  }
  if (step.skip) return Status::Ok();
  return WrapDnnl(*graph_, step.node, [&]() -> Status {
    RETURN_IF_ERROR(step.kernel->Run(rc));
    stream.wait();
    return Status::Ok();
  });
}

int64_t Plan::ValueBytes(int v) const {
  // A oneDNN layout may pad (nChw16c rounds channels up to 16).
  if (descs_[v].data.ndims != 0) return static_cast<int64_t>(descs_[v].get_size());
  return Product(shapes_[v]) * static_cast<int64_t>(DataTypeSize(dtypes_[v]));
}

Status Plan::AssignOffsets() {
  const int num_steps = static_cast<int>(steps_.size());
  // The arena holds what steps compute, except views and graph outputs.
  std::vector<int> tensor_of(shapes_.size(), -1);
  std::vector<int> value_of;
  std::vector<TensorLifetime> tensors;
  for (int i = 0; i < num_steps; ++i) {
    const Step& step = steps_[i];
    if (step.dynamic || step.kernel->alias_input() >= 0) continue;
    for (int v : step.outputs) {
      if (v < 0 || is_output_[v] || dynamic_[v]) continue;
      tensor_of[v] = static_cast<int>(tensors.size());
      value_of.push_back(v);
      tensors.push_back({ValueBytes(v), i, i});
    }
  }
  // A view's uses are uses of the bytes it views (alias_of_ names the owner directly).
  auto owner = [&](int v) { return alias_of_[v] >= 0 ? alias_of_[v] : v; };
  for (int i = 0; i < num_steps; ++i) {
    for (int v : steps_[i].inputs) {
      if (v >= 0 && tensor_of[owner(v)] >= 0) tensors[tensor_of[owner(v)]].last = i;
    }
  }
  // A graph output that views the arena is copied out after the last step.
  for (int v : graph_->outputs) {
    if (tensor_of[owner(v)] >= 0) tensors[tensor_of[owner(v)]].last = num_steps;
  }
  std::vector<InplaceRequest> requests;
  for (int i = 0; i < num_steps; ++i) {
    const Step& step = steps_[i];
    if (step.dynamic) continue;
    const int k = step.kernel->inplace_input();
    if (k < 0 || step.skip || static_cast<size_t>(k) >= step.inputs.size() ||
        step.outputs.empty()) {
      continue;
    }
    const int src = step.inputs[k];
    const int out = step.outputs[0];
    // Only an arena value (not a view, input, constant or graph output) may be
    // overwritten, and only with the same dtype, element count and bytes (a quantised
    // value takes fewer).
    if (src < 0 || out < 0 || tensor_of[src] < 0 || tensor_of[out] < 0) continue;
    if (dtypes_[src] != dtypes_[out] || Product(shapes_[src]) != Product(shapes_[out]) ||
        ValueBytes(src) != ValueBytes(out))
      continue;
    // Another input reading the same bytes would see them change under it.
    bool shared = false;
    for (size_t j = 0; j < step.inputs.size(); ++j) {
      if (static_cast<int>(j) != k && step.inputs[j] >= 0 && owner(step.inputs[j]) == src)
        shared = true;
    }
    // The planner grants it only when this step is the last use of `src`'s bytes.
    if (!shared) requests.push_back({tensor_of[out], tensor_of[src]});
  }
  auto planned = PlanMemory(tensors, requests);
  if (!planned.ok()) return Internal("memory planner: " + planned.status().message());
  layout_.clear();
  for (size_t t = 0; t < tensors.size(); ++t) {
    const int v = value_of[t];
    offsets_[v] = planned->offsets[t];
    const int from = planned->inplace_of[t];
    layout_.push_back({v, offsets_[v], tensors[t].bytes, tensors[t].first, tensors[t].last,
                       from >= 0 ? value_of[from] : -1});
  }
  memory_.planned_bytes = planned->arena_bytes;
  memory_.liveness_bound_bytes = planned->liveness_bound_bytes;
  memory_.no_reuse_bytes = planned->no_reuse_bytes;
  memory_.inplace_count = planned->inplace_count;
  arena_bytes_ = planned->arena_bytes;
  return Status::Ok();
}

void Plan::BindOnce() {
  const Graph& graph = *graph_;
  const size_t nv = graph.values.size();
  bindings_.assign(nv, Tensor());
  std::vector<char> per_run(nv, 0);
  for (size_t v = 0; v < nv; ++v) {
    if (!known_[v].empty()) {
      bindings_[v] = known_[v];
    } else if (offsets_[v] >= 0) {
      // An arena value: bound by UseArena.
    } else {
      per_run[v] = 1;  // an input, an output, a view: bound by each run
    }
  }
  for (int v : graph.inputs) per_run[v] = 1;
  for (int v : graph.outputs)
    if (known_[v].empty()) per_run[v] = 1;
  per_run_values_.clear();
  for (size_t v = 0; v < nv; ++v)
    if (per_run[v]) per_run_values_.push_back(static_cast<int>(v));
  for (Step& step : steps_) {
    step.in_ptrs.clear();
    step.out_ptrs.clear();
    for (int v : step.inputs) step.in_ptrs.push_back(v >= 0 ? &bindings_[v] : nullptr);
    for (int v : step.outputs) step.out_ptrs.push_back(v >= 0 ? &bindings_[v] : nullptr);
  }
}

Status Plan::UseArena(std::shared_ptr<Buffer> arena) {
  if (arena && arena->size() < static_cast<size_t>(arena_bytes_)) {
    return InvalidArgument("an arena of " + std::to_string(arena->size()) +
                           " bytes is smaller than the plan's " + std::to_string(arena_bytes_));
  }
  arena_ = std::move(arena);
  for (size_t v = 0; v < offsets_.size(); ++v) {
    if (offsets_[v] < 0 || !known_[v].empty()) continue;
    bindings_[v] = arena_ ? Tensor(dtypes_[v], shapes_[v], arena_, static_cast<size_t>(offsets_[v]),
                                   static_cast<size_t>(ValueBytes(v)))
                          : Tensor();
  }
  return Status::Ok();
}

void Plan::EnsureArena() {
  if (!arena_) (void)UseArena(Buffer::Allocate(static_cast<size_t>(arena_bytes_)));
}

void Plan::BindRun(const std::vector<const Tensor*>& inputs) {
  const Graph& graph = *graph_;
  // Constants and arena values stay bound from one run to the next (BindOnce); only
  // inputs, outputs and views are bound here, and unbound as the run ends.
  for (int v : per_run_values_) bindings_[v] = Tensor();
  for (size_t i = 0; i < inputs.size(); ++i) bindings_[graph.inputs[i]] = *inputs[i];
  for (int v : graph.outputs) {
    if (known_[v].empty() && alias_of_[v] < 0 && !dynamic_[v] && bindings_[v].empty()) {
      bindings_[v] = Tensor::Allocate(dtypes_[v], shapes_[v]);
    }
  }
}

StatusOr<std::vector<double>> Plan::TimeStepsAlone(const std::vector<const Tensor*>& inputs,
                                                   dnnl::stream& stream, int reps) {
  const Graph& graph = *graph_;
  if (inputs.size() != graph.inputs.size()) return InvalidArgument("wrong number of inputs");
  if (reps < 1) return InvalidArgument("reps must be >= 1");
  EnsureArena();
  BindRun(inputs);
  std::vector<double> out;
  std::vector<double> samples(static_cast<size_t>(reps));
  RunContext rc;
  rc.stream = &stream;
  Status status = Status::Ok();
  for (const Step& step : steps_) {
    if (step.dynamic) {  // prepared at each run from its inputs: run, not timed alone
      status = RunDynamic(step, stream);
      if (!status.ok()) break;
      continue;
    }
    const int alias = step.kernel->alias_input();
    if (alias >= 0) {
      const int o = step.outputs[0];
      bindings_[o] = ViewOf(bindings_[step.inputs[alias]], dtypes_[o], shapes_[o]);
      continue;
    }
    if (step.skip) continue;
    rc.inputs.assign(step.in_ptrs.begin(), step.in_ptrs.end());
    rc.outputs.assign(step.out_ptrs.begin(), step.out_ptrs.end());
    // Once for the steps after it, then `reps` times alone.
    for (int r = -1; r < reps && status.ok(); ++r) {
      const auto start = std::chrono::steady_clock::now();
      status = WrapDnnl(graph, step.node, [&]() {
        RETURN_IF_ERROR(step.kernel->Run(rc));
        stream.wait();
        return Status::Ok();
      });
      const auto end = std::chrono::steady_clock::now();
      if (r >= 0) samples[r] = std::chrono::duration<double, std::milli>(end - start).count();
    }
    if (!status.ok()) break;
    std::sort(samples.begin(), samples.end());
    out.push_back(samples[samples.size() / 2]);
  }
  for (int v : per_run_values_) bindings_[v] = Tensor();
  if (!status.ok()) return status;
  return out;
}

Status Plan::Run(const std::vector<const Tensor*>& inputs, dnnl::stream& stream,
                 std::vector<Tensor>* outputs, const Observer* observer) {
  const Graph& graph = *graph_;
  if (inputs.size() != graph.inputs.size()) return InvalidArgument("wrong number of inputs");
  EnsureArena();
  BindRun(inputs);
  // However the run ends, it keeps no reference to the caller's tensors, this run's
  // outputs or its data-dependent values (a cached plan may not run again for long).
  struct Unbind {
    Plan* plan;
    ~Unbind() {
      for (int v : plan->per_run_values_) plan->bindings_[v] = Tensor();
    }
  } unbind{this};
  // Seen last before the first step, so that an observer timing the steps
  // (ProfileOperators) counts the outputs' allocation above as no step's (when the graph
  // has inputs; without, the first step's interval starts with the run).
  if (observer) {
    for (size_t i = 0; i < inputs.size(); ++i) (*observer)(graph.inputs[i], *inputs[i]);
  }
  RunContext rc;
  rc.stream = &stream;
  for (const Step& step : steps_) {
    if (step.dynamic) {
      RETURN_IF_ERROR(RunDynamic(step, stream));
      if (observer) {
        for (int v : step.outputs)
          if (v >= 0) (*observer)(v, bindings_[v]);
      }
      continue;
    }
    const int alias = step.kernel->alias_input();
    if (alias >= 0) {
      const int out = step.outputs[0];
      bindings_[out] = ViewOf(bindings_[step.inputs[alias]], dtypes_[out], shapes_[out]);
      if (observer) (*observer)(out, bindings_[out]);
      continue;
    }
    if (step.skip) continue;
    rc.inputs.assign(step.in_ptrs.begin(), step.in_ptrs.end());
    rc.outputs.assign(step.out_ptrs.begin(), step.out_ptrs.end());
    RETURN_IF_ERROR(WrapDnnl(graph, step.node, [&]() { return step.kernel->Run(rc); }));
    if (observer) {
      RETURN_IF_ERROR(WrapDnnl(graph, step.node, [&]() {
        stream.wait();
        return Status::Ok();
      }));
      for (int v : step.outputs)
        if (v >= 0) (*observer)(v, bindings_[v]);
    }
  }
  RETURN_IF_ERROR(WrapDnnl(graph, -1, [&]() {
    stream.wait();
    return Status::Ok();
  }));
  outputs->clear();
  for (int v : graph.outputs) {
    Tensor t = bindings_[v];
    // A view into the arena must not outlive this run, and a plan constant must not be
    // written through by the caller: both leave as copies.
    if (t.buffer() == arena_ || (!known_[v].empty() && t.buffer() == known_[v].buffer())) {
      Tensor copy = Tensor::AllocateUninitialized(t.dtype(), t.shape(), t.byte_size());
      if (t.byte_size()) std::memcpy(copy.mutable_data(), t.data(), t.byte_size());
      t = std::move(copy);
    }
    outputs->push_back(std::move(t));
  }
  return Status::Ok();
}

}  // namespace shoal::engine
