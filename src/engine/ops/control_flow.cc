// Control flow: If and Loop (opsets 11 to 18), whose bodies are subgraphs.
//
// The importer makes a subgraph's reads of outer values explicit (Graph::captures): they
// are the node's trailing inputs, and every subgraph of the node takes them as its
// trailing inputs. A subgraph runs on its own Plan (plan.h), prepared once per set of
// input shapes and dtypes and kept by the node's kernel, so a Loop body is planned once
// and re-run per iteration (a body whose loop-carried values change shape every
// iteration is planned once per shape, up to kMaxPlans kept). A subgraph input whose
// data the outer plan knows (an outer constant or shape computation) is a constant of
// the subgraph's plan.
//
// Output shapes:
//   - If: when the condition is known at plan time, the branch taken decides; otherwise
//     an output whose shape is the same in both branches (and not data-dependent in
//     either) keeps it, and any other is data-dependent (PrepareContext::out_dynamic).
//     A branch that cannot be prepared for the plan's shapes (a branch never taken for
//     them) reports its error only if a run takes it;
//   - Loop: a loop-carried value whose body output keeps its input shape keeps it; the
//     others and every scan output (stacked along a new first axis, one row per
//     iteration) are data-dependent.
//
// Subgraphs run in FP32 whatever the plan's precision tier, with their own weight cache
// (value ids are per graph) and the outer plan's PlanLimits. A Loop runs at most
// PlanLimits::max_loop_iterations iterations, and its scan outputs count against
// max_tensor_bytes as they grow; a Loop (or an If whose branches hold one) never runs at
// load (Kernel::runs_at_plan_time), even when all its inputs are constants.
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/internal/op_util.h"
#include "engine/plan.h"
#include "engine/weight_cache.h"

namespace shoal::engine::internal {
namespace {

constexpr size_t kMaxPlans = 8;

Tensor Copy(const Tensor& t) {
  Tensor copy = Tensor::AllocateUninitialized(t.dtype(), t.shape(), t.byte_size());
  if (t.byte_size()) std::memcpy(copy.mutable_data(), t.data(), t.byte_size());
  return copy;
}

int NodeIndex(const Node& node, const Graph& graph) {
  return static_cast<int>(&node - graph.nodes.data());
}

const Graph* SubgraphAttr(const Node& node, std::string_view name) {
  const Attribute* a = node.attr(name);
  return a && a->kind == Attribute::Kind::kGraph ? a->g.get() : nullptr;
}

// Plans of one subgraph, one per set of input shapes and dtypes.
class SubgraphRunner {
 public:
  // `fixed`: per subgraph input, its data for the runner's whole life, or null.
  SubgraphRunner(std::shared_ptr<const Graph> graph, const PrepareContext& ctx,
                 std::vector<const Tensor*> fixed, std::string what)
      : graph_(std::move(graph)),
        engine_(*ctx.dnnl_engine),
        what_(std::move(what)),
        weights_(std::make_unique<WeightCache>()) {
    if (ctx.limits) limits_ = *ctx.limits;
    options_.conv_algorithm = ctx.options ? ctx.options->conv_algorithm : ConvAlgorithm::kDirect;
    options_.conv_layout = ctx.options ? ctx.options->conv_layout : ConvLayout::kBlocked;
    for (const Tensor* t : fixed) fixed_.push_back(t ? *t : Tensor());
  }

  const Graph& graph() const { return *graph_; }

  // The plan for these input shapes and dtypes, prepared on first use.
  StatusOr<Plan*> PlanFor(const std::vector<Shape>& shapes, const std::vector<DataType>& dtypes,
                          dnnl::stream& stream) {
    for (size_t i = 0; i < plans_.size(); ++i) {
      if (plans_[i].shapes == shapes && plans_[i].dtypes == dtypes) {
        // Least recently used last to go: the entry found moves to the back.
        std::rotate(plans_.begin() + i, plans_.begin() + i + 1, plans_.end());
        return plans_.back().plan.get();
      }
    }
    if (shapes.size() != graph_->inputs.size())
      return Internal(what_ + ": wrong number of subgraph inputs");
    std::vector<const Tensor*> data;
    for (const Tensor& t : fixed_) data.push_back(t.empty() ? nullptr : &t);
    auto plan = Plan::Prepare(*graph_, shapes, engine_, stream, weights_.get(), options_, limits_,
                              &dtypes, &data);
    if (!plan.ok()) return plan.status().WithPrefix(what_);
    if (plans_.size() >= kMaxPlans) plans_.erase(plans_.begin());
    plans_.push_back({shapes, dtypes, std::move(*plan)});
    return plans_.back().plan.get();
  }

  // Prepares with a temporary stream (at plan time).
  StatusOr<Plan*> PlanFor(const std::vector<Shape>& shapes, const std::vector<DataType>& dtypes) {
    dnnl::stream stream(engine_);
    return PlanFor(shapes, dtypes, stream);
  }

  // Runs the subgraph. Its outputs never share bytes with `inputs` (copied when the
  // subgraph passes an input through) unless `may_share` says they may.
  Status Run(const std::vector<const Tensor*>& inputs, dnnl::stream& stream,
             std::vector<Tensor>* outputs, bool may_share = false) {
    std::vector<Shape> shapes;
    std::vector<DataType> dtypes;
    for (const Tensor* t : inputs) {
      shapes.push_back(t->shape());
      dtypes.push_back(t->dtype());
    }
    ASSIGN_OR_RETURN(Plan * plan, PlanFor(shapes, dtypes, stream));
    Status s = plan->Run(inputs, stream, outputs);
    if (!s.ok()) return s.WithPrefix(what_);
    if (may_share) return Status::Ok();
    for (Tensor& out : *outputs) {
      for (const Tensor* in : inputs) {
        if (!out.empty() && out.buffer() == in->buffer()) {
          out = Copy(out);
          break;
        }
      }
    }
    return Status::Ok();
  }

 private:
  struct Entry {
    std::vector<Shape> shapes;
    std::vector<DataType> dtypes;
    std::unique_ptr<Plan> plan;
  };
  std::shared_ptr<const Graph> graph_;
  dnnl::engine engine_;
  std::string what_;
  PlanOptions options_;
  PlanLimits limits_;
  std::vector<Tensor> fixed_;
  std::unique_ptr<WeightCache> weights_;
  std::vector<Entry> plans_;
};

// Does `g` (or a subgraph of one of its nodes, at any depth) hold a Loop?
bool ContainsLoop(const Graph& g) {
  for (const Node& node : g.nodes) {
    if (node.domain.empty() && node.op_type == "Loop") return true;
    for (const auto& [name, a] : node.attributes) {
      if (a.kind == Attribute::Kind::kGraph && a.g && ContainsLoop(*a.g)) return true;
    }
  }
  return false;
}

// Checks a subgraph's nodes as Model::Load checks the graph's, naming the outer node.
Status CheckSubgraph(const Graph& sub, const Node& node, const Graph& graph,
                     std::string_view attr) {
  for (size_t n = 0; n < sub.nodes.size(); ++n) {
    Status s = CheckNode(sub, static_cast<int>(n));
    if (!s.ok()) {
      return s.WithPrefix(graph.Describe(NodeIndex(node, graph)) + ": subgraph '" +
                          std::string(attr) + "'");
    }
  }
  return Status::Ok();
}

StatusOr<bool> ReadCondition(const Tensor& t, const std::string& what) {
  if (t.dtype() != DataType::kBool || Product(t.shape()) != 1)
    return InvalidArgument(what + ": the condition must be one bool; was " +
                           std::string(DataTypeName(t.dtype())) + " " + ShapeToString(t.shape()));
  return t.values<uint8_t>()[0] != 0;
}

// Writes `src` into the output slot `dst`: into its bytes when the plan allocated it
// (a static shape, which must match), else as the output itself.
Status Deliver(Tensor src, Tensor* dst, bool dynamic, DataType dtype, const std::string& what) {
  if (src.dtype() != dtype) {
    return InvalidArgument(what + ": produced " + std::string(DataTypeName(src.dtype())) +
                           ", planned " + std::string(DataTypeName(dtype)));
  }
  if (dynamic) {
    *dst = std::move(src);
    return Status::Ok();
  }
  if (src.shape() != dst->shape() || src.dtype() != dst->dtype()) {
    return Internal(what + ": produced " + ShapeToString(src.shape()) + ", planned " +
                    ShapeToString(dst->shape()));
  }
  if (src.byte_size()) std::memcpy(dst->mutable_data(), src.data(), src.byte_size());
  return Status::Ok();
}

// The dtype of subgraph value `v` under `plan`: the plan's, or for a value computed
// after a data-dependent shape (typed only when it runs) the one the file declares.
DataType ValueDType(const Plan& plan, const Graph& graph, int v) {
  const DataType d = plan.dtypes()[v];
  return d != DataType::kInvalid ? d : graph.values[v].dtype;
}

// ---- If ----

Status CheckIf(const Node& node, const Graph& graph) {
  const std::string what = graph.Describe(NodeIndex(node, graph));
  const Graph* then_g = SubgraphAttr(node, "then_branch");
  const Graph* else_g = SubgraphAttr(node, "else_branch");
  if (!then_g || !else_g) return InvalidArgument(what + ": needs then_branch and else_branch");
  if (!node.has_input(0)) return InvalidArgument(what + ": needs a condition");
  for (const Graph* g : {then_g, else_g}) {
    if (g->inputs.size() != static_cast<size_t>(g->captures))
      return InvalidArgument(what + ": a branch declares inputs; If branches take none");
    if (node.inputs.size() != 1 + g->inputs.size())
      return InvalidArgument(what + ": inputs do not match the branches' outer values");
    if (g->outputs.size() != node.outputs.size()) {
      return InvalidArgument(what + ": a branch has " + std::to_string(g->outputs.size()) +
                             " outputs, the node " + std::to_string(node.outputs.size()));
    }
  }
  RETURN_IF_ERROR(CheckSubgraph(*then_g, node, graph, "then_branch"));
  return CheckSubgraph(*else_g, node, graph, "else_branch");
}

class IfKernel : public Kernel {
 public:
  std::unique_ptr<SubgraphRunner> branch[2];  // else, then
  Status error[2];                            // why a branch could not be prepared
  std::vector<char> dynamic;                  // per output
  std::vector<DataType> dtypes;               // per output
  std::string what;
  bool holds_loop = false;  // a branch holds a Loop: never run at load

  bool runs_at_plan_time() const override { return !holds_loop; }

  Status Run(const RunContext& ctx) override {
    ASSIGN_OR_RETURN(bool cond, ReadCondition(*ctx.inputs[0], what));
    // Null when not taken (the plan knew the condition) or unpreparable (its error kept).
    if (!branch[cond]) {
      return error[cond].ok() ? Internal(what + ": the branch taken was not prepared")
                              : error[cond];
    }
    std::vector<const Tensor*> in(ctx.inputs.begin() + 1, ctx.inputs.end());
    std::vector<Tensor> outs;
    RETURN_IF_ERROR(branch[cond]->Run(in, *ctx.stream, &outs));
    for (size_t o = 0; o < ctx.outputs.size(); ++o) {
      if (!ctx.outputs[o]) continue;
      RETURN_IF_ERROR(Deliver(std::move(outs[o]), ctx.outputs[o], dynamic[o], dtypes[o], what));
    }
    return Status::Ok();
  }
};

StatusOr<std::unique_ptr<Kernel>> PrepareIf(PrepareContext& ctx) {
  const Node& node = ctx.node();
  auto k = std::make_unique<IfKernel>();
  k->what = ctx.graph->Describe(ctx.node_index);
  const std::vector<Shape> shapes(ctx.in_shapes.begin() + 1, ctx.in_shapes.end());
  const std::vector<DataType> dtypes(ctx.in_dtypes.begin() + 1, ctx.in_dtypes.end());
  const std::vector<const Tensor*> fixed(ctx.in_data.begin() + 1, ctx.in_data.end());
  for (const DataType d : dtypes) {
    if (d == DataType::kInvalid) return ctx.Error("an outer value a branch reads is omitted");
  }
  // Only the branch taken matters when the plan knows the condition.
  bool taken[2] = {true, true};
  if (ctx.in_data[0]) {
    ASSIGN_OR_RETURN(bool cond, ReadCondition(*ctx.in_data[0], k->what));
    taken[!cond] = false;
  }
  const char* names[2] = {"else_branch", "then_branch"};
  Plan* plans[2] = {nullptr, nullptr};
  for (int b = 0; b < 2; ++b) {
    if (!taken[b]) continue;
    k->branch[b] = std::make_unique<SubgraphRunner>(node.attr(names[b])->g, ctx, fixed,
                                                    k->what + ": subgraph '" + names[b] + "'");
    auto plan = k->branch[b]->PlanFor(shapes, dtypes);
    if (plan.ok()) {
      plans[b] = *plan;
      k->holds_loop |= ContainsLoop(k->branch[b]->graph());
    } else {
      // Not prepared again at every run that takes it: the error is returned directly.
      k->error[b] = plan.status();
      k->branch[b].reset();
    }
  }
  if (!plans[0] && !plans[1]) return taken[1] ? k->error[1] : k->error[0];
  const size_t n = node.outputs.size();
  ctx.SetOutputs(n);
  k->dynamic.assign(n, 0);
  for (size_t o = 0; o < n; ++o) {
    DataType dtype = DataType::kInvalid;
    bool dynamic = false;
    const Shape* shape = nullptr;
    for (int b = 0; b < 2; ++b) {
      if (!taken[b]) continue;
      const Plan* p = plans[b];
      if (!p) {  // prepared at run time, if ever taken
        dynamic = true;
        continue;
      }
      const int v = k->branch[b]->graph().outputs[o];
      const DataType d = ValueDType(*p, k->branch[b]->graph(), v);
      if (d == DataType::kInvalid)
        return ctx.Error("the type of output " + std::to_string(o) + " is not known");
      if (dtype != DataType::kInvalid && d != dtype) {
        return ctx.Error("output " + std::to_string(o) + " is " + std::string(DataTypeName(dtype)) +
                         " in one branch and " + std::string(DataTypeName(d)) + " in the other");
      }
      dtype = d;
      if (p->dynamic()[v] || (shape && *shape != p->shapes()[v])) dynamic = true;
      shape = &p->shapes()[v];
    }
    ctx.out_dtypes[o] = dtype;
    k->dtypes.push_back(dtype);
    if (dynamic) {
      ctx.out_dynamic[o] = 1;
      k->dynamic[o] = 1;
    } else {
      ctx.out_shapes[o] = *shape;
    }
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

// ---- Loop ----

// Loop's inputs: max trip count M, condition, N loop-carried values, then the outer
// values its body reads. Body inputs: iteration number, condition, the N values, the
// outer values. Body outputs: condition, the N values, K scan outputs.
struct LoopShape {
  size_t carried = 0;  // N
  size_t scans = 0;    // K
};

StatusOr<LoopShape> LoopSignature(const Node& node, const Graph& graph) {
  const std::string what = graph.Describe(NodeIndex(node, graph));
  const Graph* body = SubgraphAttr(node, "body");
  if (!body) return InvalidArgument(what + ": needs a body");
  const size_t captures = static_cast<size_t>(body->captures);
  if (node.inputs.size() < 2 + captures)
    return InvalidArgument(what + ": needs the trip count and condition inputs (may be empty)");
  LoopShape s;
  s.carried = node.inputs.size() - 2 - captures;
  if (body->inputs.size() != 2 + s.carried + captures) {
    return InvalidArgument(what + ": the body takes " +
                           std::to_string(body->inputs.size() - captures) + " inputs; with " +
                           std::to_string(s.carried) + " loop-carried values it needs " +
                           std::to_string(2 + s.carried));
  }
  if (body->outputs.size() < 1 + s.carried)
    return InvalidArgument(what +
                           ": the body needs the condition and every loop-carried value "
                           "among its outputs");
  s.scans = body->outputs.size() - 1 - s.carried;
  if (node.outputs.size() != s.carried + s.scans) {
    return InvalidArgument(what + ": has " + std::to_string(node.outputs.size()) +
                           " outputs; its body gives " + std::to_string(s.carried + s.scans));
  }
  return s;
}

Status CheckLoop(const Node& node, const Graph& graph) {
  ASSIGN_OR_RETURN(LoopShape s, LoopSignature(node, graph));
  (void)s;
  if (!node.has_input(0) && !node.has_input(1)) {
    return InvalidArgument(graph.Describe(NodeIndex(node, graph)) +
                           ": has neither a trip count nor a condition, so it never ends");
  }
  return CheckSubgraph(*SubgraphAttr(node, "body"), node, graph, "body");
}

class LoopKernel : public Kernel {
 public:
  std::unique_ptr<SubgraphRunner> body;
  LoopShape sig;
  std::vector<char> dynamic;     // per output
  std::vector<Shape> scan_rows;  // per scan output: a row's shape when no iteration runs
                                 // (scan output [0, row...])
  std::vector<DataType> scan_dtypes;
  std::string what;
  int64_t max_iterations = 0;  // PlanLimits::max_loop_iterations
  int64_t max_bytes = 0;       // PlanLimits::max_tensor_bytes, per scan output

  bool runs_at_plan_time() const override { return false; }

  Status Run(const RunContext& ctx) override {
    int64_t max_trips = std::numeric_limits<int64_t>::max();
    if (ctx.inputs[0]) {
      const Tensor& m = *ctx.inputs[0];
      if (m.dtype() != DataType::kInt64 || Product(m.shape()) != 1)
        return InvalidArgument(what + ": the trip count must be one int64");
      max_trips = m.values<int64_t>()[0];
    }
    const bool has_cond = ctx.inputs[1] != nullptr;
    bool cond = true;
    if (has_cond) {
      ASSIGN_OR_RETURN(cond, ReadCondition(*ctx.inputs[1], what));
    }
    const size_t n = sig.carried;
    std::vector<Tensor> carried;
    for (size_t i = 0; i < n; ++i) carried.push_back(*ctx.inputs[2 + i]);
    std::vector<std::vector<Tensor>> scans(sig.scans);
    std::vector<int64_t> scan_bytes(sig.scans, 0);
    std::vector<const Tensor*> in(ctx.inputs.size());
    for (size_t i = 2 + n; i < ctx.inputs.size(); ++i) in[i] = ctx.inputs[i];
    Tensor iter_t = Tensor::FromVector<int64_t>(DataType::kInt64, {}, {0});
    Tensor cond_t = Tensor::FromVector<uint8_t>(DataType::kBool, {}, {1});
    std::vector<Tensor> outs;
    int64_t trips = 0;
    for (; trips < max_trips && cond; ++trips) {
      if (trips >= max_iterations) {
        return ResourceExhausted(what + ": runs more than " + std::to_string(max_iterations) +
                                 " iterations (PlanLimits::max_loop_iterations)");
      }
      // Fresh scalars: a body may pass them through to a scan output.
      iter_t = Tensor::FromVector<int64_t>(DataType::kInt64, {}, {trips});
      cond_t = Tensor::FromVector<uint8_t>(DataType::kBool, {}, {1});
      in[0] = &iter_t;
      in[1] = &cond_t;
      for (size_t i = 0; i < n; ++i) in[2 + i] = &carried[i];
      // Outputs may share an input's bytes here (a value carried unchanged); what
      // leaves the loop is checked below.
      RETURN_IF_ERROR(body->Run(in, *ctx.stream, &outs, /*may_share=*/true));
      if (has_cond) {
        ASSIGN_OR_RETURN(cond, ReadCondition(outs[0], what + ": body condition"));
      }
      for (size_t i = 0; i < n; ++i) {
        if (outs[1 + i].dtype() != carried[i].dtype()) {
          return InvalidArgument(what + ": loop-carried value " + std::to_string(i) +
                                 " changes type in the body");
        }
        carried[i] = std::move(outs[1 + i]);
      }
      for (size_t k = 0; k < sig.scans; ++k) {
        Tensor& row = outs[1 + n + k];
        if (!scans[k].empty() && row.shape() != scans[k][0].shape()) {
          return InvalidArgument(what + ": scan output " + std::to_string(k) + " is " +
                                 ShapeToString(scans[k][0].shape()) + " in the first iteration, " +
                                 ShapeToString(row.shape()) + " in iteration " +
                                 std::to_string(trips));
        }
        if (row.dtype() != scan_dtypes[k]) {
          return InvalidArgument(what + ": scan output " + std::to_string(k) + " is " +
                                 std::string(DataTypeName(row.dtype())) + ", planned " +
                                 std::string(DataTypeName(scan_dtypes[k])));
        }
        scan_bytes[k] += static_cast<int64_t>(row.byte_size());
        if (scan_bytes[k] > max_bytes) {
          return ResourceExhausted(what + ": scan output " + std::to_string(k) + " grows past " +
                                   std::to_string(max_bytes) +
                                   " bytes (PlanLimits::max_tensor_bytes) in iteration " +
                                   std::to_string(trips));
        }
        scans[k].push_back(std::move(row));
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (!ctx.outputs[i]) continue;
      Tensor t = std::move(carried[i]);
      // What leaves the loop never shares bytes with the loop's own inputs (outer values
      // the plan may reuse).
      for (const Tensor* src : ctx.inputs) {
        if (src && !t.empty() && t.buffer() == src->buffer()) {
          t = Copy(t);
          break;
        }
      }
      const DataType d = ctx.inputs[2 + i]->dtype();  // kept by every iteration
      RETURN_IF_ERROR(Deliver(std::move(t), ctx.outputs[i], dynamic[i], d, what));
    }
    for (size_t k = 0; k < sig.scans; ++k) {
      Tensor* dst = ctx.outputs[n + k];
      if (!dst) continue;
      Shape row = scans[k].empty() ? scan_rows[k] : scans[k][0].shape();
      const DataType dtype = scans[k].empty() ? scan_dtypes[k] : scans[k][0].dtype();
      Shape shape{trips};
      shape.insert(shape.end(), row.begin(), row.end());
      const int64_t elem = std::max<int64_t>(1, static_cast<int64_t>(DataTypeSize(dtype)));
      auto count = ElementCount(shape, max_bytes / elem);
      if (!count.ok()) {
        return ResourceExhausted(what + ": scan output " + std::to_string(k) + " " +
                                 ShapeToString(shape) + ": " + count.status().message());
      }
      Tensor t = Tensor::Allocate(dtype, shape);
      char* p = static_cast<char*>(t.mutable_data());
      for (const Tensor& r : scans[k]) {
        if (r.byte_size()) std::memcpy(p, r.data(), r.byte_size());
        p += r.byte_size();
      }
      *dst = std::move(t);
    }
    return Status::Ok();
  }
};

StatusOr<std::unique_ptr<Kernel>> PrepareLoop(PrepareContext& ctx) {
  const Node& node = ctx.node();
  auto k = std::make_unique<LoopKernel>();
  k->what = ctx.graph->Describe(ctx.node_index);
  const PlanLimits limits = ctx.limits ? *ctx.limits : PlanLimits();
  k->max_iterations = limits.max_loop_iterations;
  k->max_bytes = limits.max_tensor_bytes;
  ASSIGN_OR_RETURN(k->sig, LoopSignature(node, *ctx.graph));
  const size_t n = k->sig.carried;
  if (ctx.has_input(0) && (ctx.in_dtypes[0] != DataType::kInt64 || Product(ctx.in_shapes[0]) != 1))
    return ctx.Error("the trip count must be one int64");
  if (ctx.has_input(1) && (ctx.in_dtypes[1] != DataType::kBool || Product(ctx.in_shapes[1]) != 1))
    return ctx.Error("the condition must be one bool");
  std::vector<Shape> shapes{Shape{}, Shape{}};
  std::vector<DataType> dtypes{DataType::kInt64, DataType::kBool};
  std::vector<const Tensor*> fixed{nullptr, nullptr};
  for (size_t i = 2; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.Error("input " + std::to_string(i) + " is omitted");
    shapes.push_back(ctx.in_shapes[i]);
    dtypes.push_back(ctx.in_dtypes[i]);
    // Loop-carried values change from one iteration to the next; outer values do not.
    fixed.push_back(i < 2 + n ? nullptr : ctx.in_data[i]);
  }
  k->body = std::make_unique<SubgraphRunner>(node.attr("body")->g, ctx, fixed,
                                             k->what + ": subgraph 'body'");
  ASSIGN_OR_RETURN(Plan * plan, k->body->PlanFor(shapes, dtypes));
  const Graph& body = k->body->graph();
  ctx.SetOutputs(node.outputs.size());
  k->dynamic.assign(node.outputs.size(), 1);
  for (size_t i = 0; i < n; ++i) {
    const int v = body.outputs[1 + i];
    // Unknown until it runs when it follows a data-dependent shape: checked then.
    const DataType d = ValueDType(*plan, body, v);
    if (d != DataType::kInvalid && d != dtypes[2 + i]) {
      return ctx.Error("loop-carried value " + std::to_string(i) + " is " +
                       std::string(DataTypeName(dtypes[2 + i])) + " but the body makes it " +
                       std::string(DataTypeName(d)));
    }
    ctx.out_dtypes[i] = dtypes[2 + i];
    // A body that keeps a value's shape keeps it at every iteration (the same plan).
    if (!plan->dynamic()[v] && plan->shapes()[v] == shapes[2 + i]) {
      k->dynamic[i] = 0;
      ctx.out_shapes[i] = shapes[2 + i];
    } else {
      ctx.out_dynamic[i] = 1;
    }
  }
  for (size_t s = 0; s < k->sig.scans; ++s) {
    const int v = body.outputs[1 + n + s];
    const DataType d = ValueDType(*plan, body, v);
    if (d == DataType::kInvalid)
      return ctx.Error("the type of scan output " + std::to_string(s) + " is not known");
    ctx.out_dtypes[n + s] = d;
    ctx.out_dynamic[n + s] = 1;
    k->scan_dtypes.push_back(d);
    // A row of data-dependent shape is unknown when the loop runs no iteration (the
    // shapes a body declares are dropped at load): such a scan output is then [0].
    k->scan_rows.push_back(plan->dynamic()[v] ? Shape{} : plan->shapes()[v]);
  }
  return std::unique_ptr<Kernel>(std::move(k));
}

}  // namespace

void RegisterControlFlowOps(std::vector<OpDef>* ops) {
  ops->push_back({"", "If", {"then_branch", "else_branch"}, CheckIf, PrepareIf});
  ops->push_back({"", "Loop", {"body"}, CheckLoop, PrepareLoop});
}

}  // namespace shoal::engine::internal
