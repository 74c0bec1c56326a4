#include "engine/model.h"

#include <omp.h>

#include <algorithm>
#include <map>

#include "core/thread_util.h"
#include "engine/fp16_lowering.h"
#include "engine/internal/op_util.h"

namespace shoal::engine {
namespace {

// Key of a symbolic dimension: its name, or its position when anonymous.
std::string DimKey(const Dim& d, size_t pos) {
  return d.symbol.empty() ? "#" + std::to_string(pos) : d.symbol;
}

// Added to every symbolic dimension's probe value when a model does not prepare at the
// small ones (Model::Infer, ProbeShapes).
constexpr int64_t kLargeProbeBase = 64;

}  // namespace

Model::~Model() = default;

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path, const LoadOptions& options) {
  ASSIGN_OR_RETURN(Graph graph, ImportOnnxFile(path, options.import));
  auto model = FromGraph(std::move(graph), options);
  if (!model.ok()) return model.status().WithPrefix("'" + path + "'");
  return model;
}

namespace {

// Gives every intermediate value a shape for the optimiser to check fusions against,
// by preparing plans at two values of every symbolic input dimension (as Model::Infer
// does): a dimension equal in both is known; one that differs gets a symbol naming
// both values, so two values' dimensions compare equal exactly when they moved
// together. Graph inputs and outputs keep the names the file gives them. A graph that
// cannot be prepared is left as it is (the load reports why later).
// Prepares plans at two values of every symbolic input dimension (`base` added to
// small ones); false when the graph does not prepare at them.
bool PrepareAtProbes(const Graph& g, const LoadOptions& options, int64_t base,
                     std::vector<std::vector<Shape>>& shapes, std::vector<DataType>& dtypes,
                     std::vector<char>& dynamic) {
  std::vector<Shape> probes[2];
  for (int v : g.inputs) {
    for (int p = 0; p < 2; ++p) {
      Shape s;
      int64_t next = 0;
      for (const Dim& d : *g.values[v].shape)
        s.push_back(d.known() ? d.value : base + (p ? 5 : 3) + next++);
      probes[p].push_back(s);
    }
  }
  try {
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    for (int p = 0; p < 2; ++p) {
      WeightCache scratch;
      auto plan =
          Plan::Prepare(g, probes[p], engine, stream, &scratch, PlanOptions(), options.limits);
      if (!plan.ok()) return false;
      shapes[p] = (*plan)->shapes();
      dtypes = (*plan)->dtypes();
      dynamic = (*plan)->dynamic();
    }
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

void ProbeShapes(Graph& g, const LoadOptions& options) {
  for (int v : g.inputs)
    if (!g.values[v].shape) return;
  std::vector<std::vector<Shape>> shapes(2);
  std::vector<DataType> dtypes;
  std::vector<char> dynamic;
  if (!PrepareAtProbes(g, options, 0, shapes, dtypes, dynamic) &&
      !PrepareAtProbes(g, options, kLargeProbeBase, shapes, dtypes, dynamic))
    return;
  std::vector<char> keep(g.values.size(), 0);
  for (int v : g.inputs) keep[v] = 1;
  for (int v : g.outputs) keep[v] = 1;
  for (size_t v = 0; v < g.values.size(); ++v) {
    if (keep[v] || g.values[v].is_constant() || dtypes[v] == DataType::kInvalid || dynamic[v])
      continue;
    const Shape& a = shapes[0][v];
    const Shape& b = shapes[1][v];
    if (a.size() != b.size()) continue;
    SymbolicShape s;
    for (size_t d = 0; d < a.size(); ++d) {
      s.push_back(a[d] == b[d] ? Dim{a[d], ""}
                               : Dim{-1, "~" + std::to_string(a[d]) + "/" + std::to_string(b[d])});
    }
    g.values[v].shape = std::move(s);
  }
}

}  // namespace

StatusOr<std::unique_ptr<Model>> Model::FromGraph(Graph graph, const LoadOptions& options) {
  RETURN_IF_ERROR(graph.Validate());
  // FLOAT16 weights and activations compute in FP32; the graph's FP16 inputs and outputs
  // keep their type (fp16_lowering.h).
  RETURN_IF_ERROR(LowerFp16(&graph));
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    RETURN_IF_ERROR(CheckNode(graph, static_cast<int>(n)));
  std::unique_ptr<Model> model(new Model());
  if (options.optimize.enabled && options.optimize.fuse) ProbeShapes(graph, options);
  ASSIGN_OR_RETURN(graph,
                   OptimizeGraph(std::move(graph), options.optimize, &model->optimize_report_));
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    RETURN_IF_ERROR(CheckNode(graph, static_cast<int>(n)));
  model->graph_ = std::move(graph);
  model->options_ = options;
  model->weights_ = std::make_unique<WeightCache>();
  RETURN_IF_ERROR(model->Infer());
  return model;
}

bool Model::batch_dim_symbolic() const {
  auto first_symbolic = [](const TensorInfo& t) {
    return t.rank_known && !t.shape.empty() && !t.shape[0].known();
  };
  if (inputs_.empty()) return false;
  for (const auto& t : inputs_)
    if (!first_symbolic(t)) return false;
  for (const auto& t : outputs_)
    if (!first_symbolic(t)) return false;
  return true;
}

std::vector<std::string> Model::NonBatchMajorOutputs() const {
  std::vector<std::string> names;
  for (const auto& t : outputs_)
    if (!t.batch_major) names.push_back(t.name);
  return names;
}

Status Model::Infer() {
  const Graph& g = graph_;
  for (int v : g.inputs) {
    TensorInfo info{g.values[v].name, g.values[v].dtype, {}, g.values[v].shape.has_value()};
    if (info.rank_known) info.shape = *g.values[v].shape;
    inputs_.push_back(std::move(info));
  }
  bool probe = true;
  for (const auto& in : inputs_) probe &= in.rank_known;
  if (!probe) {  // nothing to infer from; report what the file declares
    for (int v : g.outputs) {
      TensorInfo info{g.values[v].name, g.values[v].dtype, {}, g.values[v].shape.has_value()};
      if (info.rank_known) info.shape = *g.values[v].shape;
      outputs_.push_back(std::move(info));
    }
    return Status::Ok();
  }
  // Two preparations with different values for each symbolic dimension: output dims that
  // differ are symbolic. They also validate every node and reorder the weights.
  std::map<std::string, int64_t> key_index;
  for (const auto& in : inputs_) {
    for (size_t d = 0; d < in.shape.size(); ++d) {
      if (!in.shape[d].known()) key_index.emplace(DimKey(in.shape[d], d), key_index.size());
    }
  }
  // Small probe values first (cheap, and within limits such as a position table's length);
  // a model that needs a symbolic dimension to be at least some size (TopK with a constant
  // K over a dynamic axis: a detector's top 5 of its n boxes) is probed again with large
  // values before the load reports the first error.
  int64_t probe_base = 0;
  auto probe_value = [&](const std::string& key, int p) {
    return probe_base + (p == 0 ? key_index[key] + 1 : 2 * (key_index[key] + 1) + 1);
  };
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::vector<Shape> out_shapes[2];
  std::vector<char> output_dynamic;
  std::vector<TensorInfo> outputs;
  auto prepare_probes = [&]() -> Status {
    for (int p = 0; p < 2; ++p) {
      out_shapes[p].clear();
      std::vector<Shape> shapes;
      for (const auto& in : inputs_) {
        Shape s;
        for (size_t d = 0; d < in.shape.size(); ++d) {
          s.push_back(in.shape[d].known() ? in.shape[d].value
                                          : probe_value(DimKey(in.shape[d], d), p));
        }
        shapes.push_back(std::move(s));
      }
      StatusOr<std::unique_ptr<Plan>> plan = Internal("unset");
      try {
        plan = Plan::Prepare(g, shapes, engine, stream, weights_.get(), options_.plan,
                             options_.limits);
      } catch (const dnnl::error& e) {
        return InvalidArgument(std::string("oneDNN error while preparing the model: ") + e.what());
      }
      if (!plan.ok()) return plan.status();
      for (int v : g.outputs) {
        out_shapes[p].push_back((*plan)->shapes()[v]);
        if (p == 0) {
          DataType dtype = (*plan)->dtypes()[v];
          // An output computed from a data-dependent shape (plan.h) may have its type known
          // only at run time: the model's declaration stands.
          if (dtype == DataType::kInvalid) dtype = g.values[v].dtype;
          outputs.push_back(TensorInfo{g.values[v].name, dtype, {}, true});
          output_dynamic.push_back((*plan)->dynamic()[v]);
        }
      }
    }
    return Status::Ok();
  };
  Status prepared = prepare_probes();
  if (!prepared.ok() && !key_index.empty()) {
    outputs.clear();
    output_dynamic.clear();
    probe_base = kLargeProbeBase;
    if (!prepare_probes().ok()) return prepared;
  } else if (!prepared.ok()) {
    return prepared;
  }
  outputs_ = std::move(outputs);
  // The inputs' batch dimensions: their symbolic first dimensions.
  std::vector<std::string> batch_keys, batch_symbols;
  for (const auto& in : inputs_) {
    if (in.shape.empty() || in.shape[0].known()) continue;
    batch_keys.push_back(DimKey(in.shape[0], 0));
    if (!in.shape[0].symbol.empty()) batch_symbols.push_back(in.shape[0].symbol);
  }
  for (size_t o = 0; o < outputs_.size(); ++o) {
    const Shape& a = out_shapes[0][o];
    const Shape& b = out_shapes[1][o];
    const auto& declared = g.values[g.outputs[o]].shape;
    if (output_dynamic[o]) {
      // Its shape is learned at run time: as the model declares it.
      if (declared) {
        outputs_[o].shape = *declared;
        const std::string& first = declared->empty() ? "" : (*declared)[0].symbol;
        outputs_[o].batch_major =
            !first.empty() &&
            std::find(batch_symbols.begin(), batch_symbols.end(), first) != batch_symbols.end();
      }
      continue;
    }
    for (const std::string& key : batch_keys) {
      if (!a.empty() && a[0] == probe_value(key, 0) && b[0] == probe_value(key, 1))
        outputs_[o].batch_major = true;
    }
    for (size_t d = 0; d < a.size(); ++d) {
      if (a[d] == b[d]) {
        outputs_[o].shape.push_back(Dim{a[d], ""});
        continue;
      }
      Dim dim{-1, ""};
      for (const auto& [key, idx] : key_index) {
        if (a[d] == probe_value(key, 0) && b[d] == probe_value(key, 1) && key[0] != '#')
          dim.symbol = key;
      }
      if (dim.symbol.empty() && declared && d < declared->size())
        dim.symbol = (*declared)[d].symbol;
      outputs_[o].shape.push_back(dim);
    }
  }
  return Status::Ok();
}

Session::Session(const Model& model, const SessionOptions& options)
    : model_(model), options_(options), engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

Session::~Session() = default;

StatusOr<std::unique_ptr<Session>> Session::Create(const Model& model,
                                                   const SessionOptions& options) {
  if (options.threads < 0)
    return InvalidArgument("threads must be >= 0; was " + std::to_string(options.threads));
  if (options.single_thread_below_flops < 0) {
    return InvalidArgument("single_thread_below_flops must be >= 0; was " +
                           std::to_string(options.single_thread_below_flops));
  }
  if (options.max_cached_plans < 1) {
    return InvalidArgument("max_cached_plans must be >= 1; was " +
                           std::to_string(options.max_cached_plans));
  }
  const int cpus = AvailableCpuCount();
  for (int c : options.cpu_cores) {
    if (c < 0) return InvalidArgument("cpu core " + std::to_string(c) + " does not exist");
  }
  std::unique_ptr<Session> session;
  try {
    session.reset(new Session(model, options));
  } catch (const dnnl::error& e) {
    return Internal(std::string("could not create a oneDNN engine: ") + e.what());
  }
  session->threads_ = options.threads > 0          ? options.threads
                      : !options.cpu_cores.empty() ? static_cast<int>(options.cpu_cores.size())
                                                   : std::max(1, cpus);
  RETURN_IF_ERROR(session->SetUpThreads());
  return session;
}

Status Session::SetUpThreads() {
  owner_ = std::this_thread::get_id();
  omp_set_num_threads(threads_);
  if (options_.cpu_cores.empty()) return Status::Ok();
  // libgomp keeps one worker team per calling thread and reuses it for every parallel
  // region of that thread, so pinning the team once pins oneDNN's workers too.
  std::vector<Status> results(static_cast<size_t>(threads_));
  const auto& cores = options_.cpu_cores;
#pragma omp parallel num_threads(threads_)
  {
    const int t = omp_get_thread_num();
    results[static_cast<size_t>(t)] =
        PinCurrentThread({cores[static_cast<size_t>(t) % cores.size()]});
  }
  for (const Status& s : results) RETURN_IF_ERROR(s);
  return Status::Ok();
}

StatusOr<Session::CachedPlan*> Session::PlanFor(const std::vector<Shape>& shapes) {
  for (auto it = plans_.begin(); it != plans_.end(); ++it) {
    if (it->shapes == shapes) {
      plans_.splice(plans_.begin(), plans_, it);
      return &plans_.front();
    }
  }
  // oneDNN sizes a primitive's work split for the thread count at creation (its primitive
  // cache keys on it too), so a plan runs on the threads it was created with.
  omp_set_num_threads(threads_);
  auto prepare = [&] {
    return Plan::Prepare(model_.graph(), shapes, engine_, stream_, model_.weight_cache(),
                         model_.options().plan, model_.options().limits);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<Plan> plan, prepare());
  int threads = threads_;
  if (threads_ > 1 && plan->EstimatedFlops() < options_.single_thread_below_flops) {
    // Shapes (and so FLOPs) are known only once prepared: prepare again for one thread.
    omp_set_num_threads(1);
    auto single = prepare();
    omp_set_num_threads(threads_);
    if (!single.ok()) return single.status();
    plan = std::move(single).value();
    threads = 1;
  }
  plans_.push_front(CachedPlan{shapes, std::move(plan), threads});
  ++plans_prepared_;
  while (static_cast<int>(plans_.size()) > options_.max_cached_plans) plans_.pop_back();
  RETURN_IF_ERROR(ShareArena());
  return &plans_.front();
}

Status Session::ShareArena() {
  int64_t needed = 0;
  for (const CachedPlan& c : plans_) needed = std::max(needed, c.plan->arena_bytes());
  const int64_t have = arena_ ? static_cast<int64_t>(arena_->size()) : -1;
  if (have >= needed && have <= 2 * needed) return plans_.front().plan->UseArena(arena_);
  // Every plan lets go of the old arena before the new one is allocated, so the two are
  // never held at once.
  arena_.reset();
  for (CachedPlan& c : plans_) RETURN_IF_ERROR(c.plan->UseArena(nullptr));
  arena_ = Buffer::Allocate(static_cast<size_t>(needed));
  for (CachedPlan& c : plans_) RETURN_IF_ERROR(c.plan->UseArena(arena_));
  return Status::Ok();
}

Status Session::CheckInputShapes(const std::vector<Shape>& input_shapes) const {
  const auto& infos = model_.inputs();
  if (input_shapes.size() != infos.size()) {
    return InvalidArgument("expected " + std::to_string(infos.size()) + " input shapes, got " +
                           std::to_string(input_shapes.size()));
  }
  for (size_t i = 0; i < infos.size(); ++i) {
    const Shape& s = input_shapes[i];
    bool match = !infos[i].rank_known || s.size() == infos[i].shape.size();
    for (size_t d = 0; match && infos[i].rank_known && d < s.size(); ++d)
      match = !infos[i].shape[d].known() || infos[i].shape[d].value == s[d];
    if (!match) {
      return InvalidArgument("input '" + infos[i].name + "' has shape " + ShapeToString(s) +
                             "; the model expects " + SymbolicShapeToString(infos[i].shape));
    }
  }
  return Status::Ok();
}

StatusOr<Session::CachedPlan*> Session::PlanForShapes(const std::vector<Shape>& input_shapes) {
  RETURN_IF_ERROR(CheckInputShapes(input_shapes));
  if (std::this_thread::get_id() != owner_) RETURN_IF_ERROR(SetUpThreads());
  return PlanFor(input_shapes);
}

StatusOr<PlanMemoryStats> Session::PlanStats(const std::vector<Shape>& input_shapes) {
  ASSIGN_OR_RETURN(CachedPlan * cached, PlanForShapes(input_shapes));
  return cached->plan->memory_stats();
}

DynamicPrepareStats Session::dynamic_stats() const {
  DynamicPrepareStats sum;
  for (const CachedPlan& cached : plans_) {
    sum.prepares += cached.plan->dynamic_stats().prepares;
    sum.cache_hits += cached.plan->dynamic_stats().cache_hits;
  }
  return sum;
}

StatusOr<int> Session::PlanThreads(const std::vector<Shape>& input_shapes) {
  ASSIGN_OR_RETURN(CachedPlan * cached, PlanForShapes(input_shapes));
  return cached->threads;
}

Status Session::Run(const std::vector<NamedTensor>& inputs, std::vector<NamedTensor>* outputs) {
  return RunImpl(inputs, outputs, nullptr);
}

Status Session::RunObserved(const std::vector<NamedTensor>& inputs,
                            std::vector<NamedTensor>* outputs, const Plan::Observer& observer) {
  return RunImpl(inputs, outputs, &observer);
}

Status Session::OrderInputs(const std::vector<NamedTensor>& inputs,
                            std::vector<const Tensor*>* ordered_out,
                            std::vector<Shape>* shapes_out) const {
  const Graph& g = model_.graph();
  std::vector<const Tensor*>& ordered = *ordered_out;
  std::vector<Shape>& shapes = *shapes_out;
  ordered.assign(g.inputs.size(), nullptr);
  shapes.resize(g.inputs.size());
  for (Shape& s : shapes) s.clear();  // keeps the capacity a reused vector had
  for (const NamedTensor& in : inputs) {
    size_t i = 0;
    while (i < g.inputs.size() && g.values[g.inputs[i]].name != in.name) ++i;
    if (i == g.inputs.size())
      return InvalidArgument("the model has no input named '" + in.name + "'");
    if (ordered[i]) return InvalidArgument("input '" + in.name + "' is given twice");
    const TensorInfo& info = model_.inputs()[i];
    if (in.tensor.dtype() != info.dtype) {
      return InvalidArgument("input '" + in.name + "' must be " +
                             std::string(DataTypeName(info.dtype)) + ", got " +
                             std::string(DataTypeName(in.tensor.dtype())));
    }
    const Shape& s = in.tensor.shape();
    if (info.rank_known) {
      bool match = s.size() == info.shape.size();
      for (size_t d = 0; match && d < s.size(); ++d)
        match = !info.shape[d].known() || info.shape[d].value == s[d];
      if (!match) {
        return InvalidArgument("input '" + in.name + "' has shape " + ShapeToString(s) +
                               "; the model expects " + SymbolicShapeToString(info.shape));
      }
    }
    // The limit is in bytes; ElementCount's is in elements.
    const int64_t elem_bytes = static_cast<int64_t>(DataTypeSize(in.tensor.dtype()));
    auto count = ElementCount(
        s, model_.options().limits.max_tensor_bytes / std::max<int64_t>(elem_bytes, 1));
    if (!count.ok()) return InvalidArgument("input '" + in.name + "': " + count.status().message());
    if (static_cast<size_t>(*count) * DataTypeSize(in.tensor.dtype()) != in.tensor.byte_size()) {
      return InvalidArgument(
          "input '" + in.name + "' has " + std::to_string(in.tensor.byte_size()) +
          " bytes; shape " + ShapeToString(s) + " needs " +
          std::to_string(*count * static_cast<int64_t>(DataTypeSize(in.tensor.dtype()))));
    }
    ordered[i] = &in.tensor;
    shapes[i] = s;
  }
  for (size_t i = 0; i < ordered.size(); ++i) {
    if (!ordered[i])
      return InvalidArgument("input '" + g.values[g.inputs[i]].name + "' is missing");
  }
  return Status::Ok();
}

StatusOr<std::vector<double>> Session::TimeStepsAlone(const std::vector<NamedTensor>& inputs,
                                                      int reps) {
  if (std::this_thread::get_id() != owner_) RETURN_IF_ERROR(SetUpThreads());
  std::vector<const Tensor*> ordered;
  std::vector<Shape> shapes;
  RETURN_IF_ERROR(OrderInputs(inputs, &ordered, &shapes));
  ASSIGN_OR_RETURN(CachedPlan * cached, PlanFor(shapes));
  omp_set_num_threads(cached->threads);
  return cached->plan->TimeStepsAlone(ordered, stream_, reps);
}

Status Session::RunImpl(const std::vector<NamedTensor>& inputs, std::vector<NamedTensor>* outputs,
                        const Plan::Observer* observer) {
  if (std::this_thread::get_id() != owner_) RETURN_IF_ERROR(SetUpThreads());
  const Graph& g = model_.graph();
  // Scratch kept between runs (one thread at a time): no allocation per run for them.
  std::vector<const Tensor*>& ordered = run_ordered_;
  std::vector<Shape>& shapes = run_shapes_;
  std::vector<Tensor>& results = run_results_;
  RETURN_IF_ERROR(OrderInputs(inputs, &ordered, &shapes));
  ASSIGN_OR_RETURN(CachedPlan * cached, PlanFor(shapes));
  omp_set_num_threads(cached->threads);
  const Status run = cached->plan->Run(ordered, stream_, &results, observer);
  ordered.assign(ordered.size(), nullptr);  // no pointer to the caller's inputs stays
  if (!run.ok()) {
    results.clear();
    return run;
  }
  outputs->clear();
  for (size_t o = 0; o < results.size(); ++o) {
    outputs->push_back(NamedTensor{g.values[g.outputs[o]].name, std::move(results[o])});
  }
  results.clear();
  return Status::Ok();
}

}  // namespace shoal::engine
