// Recurrent operators: RNN, GRU and LSTM, one layer each as ONNX defines them (a PyTorch
// nn.LSTM with several layers exports one node per layer).
//
// A plan runs a node on oneDNN's RNN primitive (vanilla_rnn_forward, gru_forward,
// lbr_gru_forward, lstm_forward) when the primitive computes what the node asks: W, R
// and B constant, the default activations (RNN: Tanh, Relu, Sigmoid or LeakyRelu), no
// clip, no input_forget, no peepholes, and every sequence at full length (a
// sequence_lens known when the plan is prepared, or checked per run when it arrives
// with the request). Everything else runs on the engine's own loop
// (internal/recurrent.h). The weights are reordered once, through the model's
// WeightCache, from ONNX's gate order (LSTM i, o, f, c) into oneDNN's (i, f, c~, o);
// GRU's z, r, h is oneDNN's u, r, o. States are staged through small kernel-owned
// buffers (oneDNN wants [dirs, batch, hidden]); Y is written in place except in the
// bidirectional layout-0 case, where oneDNN's [seq, batch, dirs*hidden] is transposed
// into ONNX's [seq, dirs, batch, hidden].
//
// Recurrent nodes compute in fp32 in every precision tier (precision.h): only
// convolutions and products change tier.
#include "engine/internal/recurrent.h"

#include <cstring>

#include "engine/internal/op_util.h"

namespace shoal::engine::internal {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

// ONNX input positions.
enum Input { kX = 0, kW, kR, kB, kSequenceLens, kInitialH, kInitialC, kP };

class RecurrentKernel : public Kernel {
 public:
  RecurrentKernel(RecurrentAttributes attrs, RecurrentDims dims) : a_(std::move(attrs)), n_(dims) {}

  Status Run(const RunContext& ctx) override;
  std::string implementation() const override { return impl_; }

  // The oneDNN path: the primitive, the layouts it was created with, and the reordered
  // weights and bias. The kernel then takes it whenever the lengths allow.
  struct DnnlParts {
    dnnl::primitive prim;
    dnnl::primitive_desc_base pd;
    memory::desc src_layer, iter, bias, dst_layer;
    memory weights_layer, weights_iter;
    std::shared_ptr<Buffer> bias_data;
    std::vector<std::shared_ptr<const void>> keep;
  };
  void UseDnnl(const dnnl::engine& eng, DnnlParts parts, bool has_y);

 private:
  Status RunLoop(const RunContext& ctx);
  Status RunDnnl(const RunContext& ctx);
  static const float* In(const RunContext& ctx, int i) {
    return i < static_cast<int>(ctx.inputs.size()) && ctx.inputs[i]
               ? static_cast<const float*>(ctx.inputs[i]->data())
               : nullptr;
  }
  static float* Out(const RunContext& ctx, int i) {
    return i < static_cast<int>(ctx.outputs.size()) && ctx.outputs[i]
               ? static_cast<float*>(ctx.outputs[i]->mutable_data())
               : nullptr;
  }

  RecurrentAttributes a_;
  RecurrentDims n_;
  std::unique_ptr<RecurrentLoop> loop_;  // made on first use
  bool dnnl_ = false;
  bool y_direct_ = false;  // oneDNN writes Y itself
  dnnl::primitive prim_;
  std::unordered_map<int, memory> args_;
  memory src_layer_, dst_layer_;
  std::shared_ptr<Buffer> src_iter_, src_iter_c_, dst_iter_, dst_iter_c_, dst_scratch_;
  std::vector<std::shared_ptr<const void>> keep_;
  std::string impl_;
};

void RecurrentKernel::UseDnnl(const dnnl::engine& eng, DnnlParts parts, bool has_y) {
  const int64_t T = n_.seq, N = n_.batch, H = n_.hidden, D = a_.directions;
  const size_t state_bytes = sizeof(float) * D * N * H;
  const bool lstm = a_.cell == CellKind::kLstm;
  prim_ = std::move(parts.prim);
  src_layer_ = memory(parts.src_layer, eng, DNNL_MEMORY_NONE);
  src_iter_ = Buffer::Allocate(state_bytes);
  dst_iter_ = Buffer::Allocate(state_bytes);
  args_[DNNL_ARG_SRC_LAYER] = src_layer_;
  args_[DNNL_ARG_SRC_ITER] = memory(parts.iter, eng, src_iter_->data());
  args_[DNNL_ARG_WEIGHTS_LAYER] = std::move(parts.weights_layer);
  args_[DNNL_ARG_WEIGHTS_ITER] = std::move(parts.weights_iter);
  args_[DNNL_ARG_BIAS] = memory(parts.bias, eng, parts.bias_data->data());
  keep_ = std::move(parts.keep);
  keep_.push_back(std::move(parts.bias_data));
  args_[DNNL_ARG_DST_ITER] = memory(parts.iter, eng, dst_iter_->data());
  if (lstm) {
    src_iter_c_ = Buffer::Allocate(state_bytes);
    dst_iter_c_ = Buffer::Allocate(state_bytes);
    args_[DNNL_ARG_SRC_ITER_C] = memory(parts.iter, eng, src_iter_c_->data());
    args_[DNNL_ARG_DST_ITER_C] = memory(parts.iter, eng, dst_iter_c_->data());
  }
  y_direct_ = has_y && (D == 1 || a_.batch_first);
  if (y_direct_) {
    dst_layer_ = memory(parts.dst_layer, eng, DNNL_MEMORY_NONE);
  } else {
    dst_scratch_ = Buffer::Allocate(sizeof(float) * T * N * D * H);
    dst_layer_ = memory(parts.dst_layer, eng, dst_scratch_->data());
  }
  args_[DNNL_ARG_DST_LAYER] = dst_layer_;
  const char* info = nullptr;
  if (dnnl_primitive_desc_query(parts.pd.get(), dnnl_query_impl_info_str, 0, &info) ==
          dnnl_success &&
      info != nullptr) {
    impl_ = info;
  }
  dnnl_ = true;
}

Status RecurrentKernel::Run(const RunContext& ctx) {
  bool full = true;
  if (ctx.inputs.size() > kSequenceLens && ctx.inputs[kSequenceLens]) {
    auto lens = ctx.inputs[kSequenceLens]->values<int32_t>();
    for (int32_t l : lens) full &= l == n_.seq;
  }
  return dnnl_ && full ? RunDnnl(ctx) : RunLoop(ctx);
}

Status RecurrentKernel::RunLoop(const RunContext& ctx) {
  if (!loop_) loop_ = std::make_unique<RecurrentLoop>(a_, n_);
  RecurrentTensors t;
  t.x = In(ctx, kX);
  t.w = In(ctx, kW);
  t.r = In(ctx, kR);
  t.b = In(ctx, kB);
  if (ctx.inputs.size() > kSequenceLens && ctx.inputs[kSequenceLens])
    t.sequence_lens = static_cast<const int32_t*>(ctx.inputs[kSequenceLens]->data());
  t.initial_h = In(ctx, kInitialH);
  t.initial_c = In(ctx, kInitialC);
  t.p = In(ctx, kP);
  t.y = Out(ctx, 0);
  t.y_h = Out(ctx, 1);
  t.y_c = Out(ctx, 2);
  return loop_->Run(t);
}

Status RecurrentKernel::RunDnnl(const RunContext& ctx) {
  const int64_t T = n_.seq, N = n_.batch, H = n_.hidden, D = a_.directions;
  const bool bf = a_.batch_first;
  src_layer_.set_data_handle(const_cast<float*>(In(ctx, kX)));
  // Without an initial state the staging buffer keeps the zeros it was allocated with.
  if (const float* h0 = In(ctx, kInitialH))
    StatesToDirMajor(h0, static_cast<float*>(src_iter_->data()), D, N, H, bf);
  if (src_iter_c_) {
    if (const float* c0 = In(ctx, kInitialC))
      StatesToDirMajor(c0, static_cast<float*>(src_iter_c_->data()), D, N, H, bf);
  }
  float* y = Out(ctx, 0);
  if (y_direct_) dst_layer_.set_data_handle(y);
  prim_.execute(*ctx.stream, args_);
  ctx.stream->wait();
  if (y != nullptr && !y_direct_) {
    // [seq, batch, dirs, hidden] -> [seq, dirs, batch, hidden]
    const float* src = static_cast<const float*>(dst_scratch_->data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t b = 0; b < N; ++b)
        for (int64_t d = 0; d < D; ++d)
          std::memcpy(y + ((t * D + d) * N + b) * H, src + ((t * N + b) * D + d) * H,
                      sizeof(float) * H);
  }
  if (float* yh = Out(ctx, 1))
    StatesFromDirMajor(static_cast<const float*>(dst_iter_->data()), yh, D, N, H, bf);
  if (dst_iter_c_) {
    if (float* yc = Out(ctx, 2))
      StatesFromDirMajor(static_cast<const float*>(dst_iter_c_->data()), yc, D, N, H, bf);
  }
  return Status::Ok();
}

// Copies `w` ([dirs, gates * block] floats) with its gate blocks in `order` (new gate g
// takes old gate order[g]).
Tensor PermuteGates(const Tensor& w, int64_t dirs, int64_t gates, int64_t block,
                    const std::vector<int>& order) {
  Tensor out = Tensor::Allocate(DataType::kFp32, w.shape());
  const float* src = w.values<float>().data();
  float* dst = out.mutable_values<float>().data();
  for (int64_t d = 0; d < dirs; ++d)
    for (int64_t g = 0; g < gates; ++g)
      std::memcpy(dst + (d * gates + g) * block, src + (d * gates + order[g]) * block,
                  sizeof(float) * block);
  return out;
}

// Reorders constant weights `data` (plain `from`) into `to`, through the WeightCache
// when the plan has one.
StatusOr<memory> ReorderWeights(PrepareContext& ctx, int input, const Tensor& data,
                                const memory::desc& from, const memory::desc& to,
                                std::vector<std::shared_ptr<const void>>* keep) {
  const auto& eng = *ctx.dnnl_engine;
  std::shared_ptr<Buffer> buf;
  if (ctx.weights != nullptr) {
    ASSIGN_OR_RETURN(buf, ctx.weights->Get(ctx.in_values[input], data, from, to, eng));
  } else {
    buf = Buffer::Allocate(to.get_size());
    memory src(from, eng, const_cast<void*>(data.data()));
    memory dst(to, eng, buf->data());
    dnnl::stream stream(eng);
    dnnl::reorder(src, dst).execute(stream, src, dst);
    stream.wait();
  }
  keep->push_back(buf);
  return memory(to, eng, buf->data());
}

// Whether oneDNN's primitive computes this node (see the file comment).
bool DnnlFits(const PrepareContext& ctx, const RecurrentAttributes& a, const RecurrentDims& n,
              dnnl::algorithm* rnn_activation, float* rnn_alpha) {
  if (ctx.in_data[kW] == nullptr || ctx.in_data[kR] == nullptr) return false;
  if (ctx.has_input(kB) && ctx.in_data[kB] == nullptr) return false;
  if (ctx.has_input(kP)) return false;
  if (a.clip > 0.f || a.input_forget) return false;
  if (n.seq == 0 || n.batch == 0 || n.input == 0) return false;
  if (ctx.has_input(kSequenceLens) && ctx.in_data[kSequenceLens] != nullptr) {
    for (int32_t l : ctx.in_data[kSequenceLens]->values<int32_t>())
      if (l != n.seq) return false;
  }
  if (a.cell != CellKind::kRnn) return a.default_activations();
  for (const RnnActivation& act : a.activations)
    if (!(act == a.activations[0])) return false;
  *rnn_alpha = 0.f;
  switch (a.activations[0].kind) {
    case RnnActivation::Kind::kTanh:
      *rnn_activation = dnnl::algorithm::eltwise_tanh;
      return true;
    case RnnActivation::Kind::kSigmoid:
      *rnn_activation = dnnl::algorithm::eltwise_logistic;
      return true;
    case RnnActivation::Kind::kRelu:
      *rnn_activation = dnnl::algorithm::eltwise_relu;
      return true;
    case RnnActivation::Kind::kLeakyRelu:
      *rnn_activation = dnnl::algorithm::eltwise_relu;
      *rnn_alpha = a.activations[0].alpha;
      return true;
    default:
      return false;
  }
}

// Builds the oneDNN primitive for the node into `kernel`: true when it did, false (the loop runs
// every time) when oneDNN does not take it.
StatusOr<bool> BuildDnnl(PrepareContext& ctx, const RecurrentAttributes& a, const RecurrentDims& n,
                         RecurrentKernel* kernel) {
  dnnl::algorithm rnn_act = dnnl::algorithm::eltwise_tanh;
  float rnn_alpha = 0.f;
  if (!DnnlFits(ctx, a, n, &rnn_act, &rnn_alpha)) return false;
  const auto& eng = *ctx.dnnl_engine;
  const auto f32 = memory::data_type::f32;
  const int64_t T = n.seq, N = n.batch, I = n.input, H = n.hidden, D = a.directions;
  const int64_t G = a.gates;
  const bool lbr = a.cell == CellKind::kGru && a.linear_before_reset;
  const int64_t bias_gates = lbr ? 4 : G;
  const Tag data_tag = a.batch_first ? Tag::ntc : Tag::tnc;
  const memory::desc src_layer({T, N, I}, f32, data_tag);
  const memory::desc iter({1, D, N, H}, f32, Tag::ldnc);
  const memory::desc wl_any({1, D, I, G, H}, f32, Tag::any);
  const memory::desc wi_any({1, D, H, G, H}, f32, Tag::any);
  const memory::desc bias_md({1, D, bias_gates, H}, f32, Tag::ldgo);
  const memory::desc dst_layer({T, N, D * H}, f32, data_tag);
  const auto dir = D == 2      ? dnnl::rnn_direction::bidirectional_concat
                   : a.reverse ? dnnl::rnn_direction::unidirectional_right2left
                               : dnnl::rnn_direction::unidirectional_left2right;
  const auto pk = dnnl::prop_kind::forward_inference;

  RecurrentKernel::DnnlParts parts;
  try {
    switch (a.cell) {
      case CellKind::kLstm: {
        dnnl::lstm_forward::desc d(pk, dir, src_layer, iter, iter, wl_any, wi_any, bias_md,
                                   dst_layer, iter, iter);
        dnnl::lstm_forward::primitive_desc p(d, eng);
        parts.prim = dnnl::lstm_forward(p);
        parts.pd = p;
        break;
      }
      case CellKind::kGru:
        if (lbr) {
          dnnl::lbr_gru_forward::desc d(pk, dir, src_layer, iter, wl_any, wi_any, bias_md,
                                        dst_layer, iter);
          dnnl::lbr_gru_forward::primitive_desc p(d, eng);
          parts.prim = dnnl::lbr_gru_forward(p);
          parts.pd = p;
        } else {
          dnnl::gru_forward::desc d(pk, dir, src_layer, iter, wl_any, wi_any, bias_md, dst_layer,
                                    iter);
          dnnl::gru_forward::primitive_desc p(d, eng);
          parts.prim = dnnl::gru_forward(p);
          parts.pd = p;
        }
        break;
      case CellKind::kRnn: {
        dnnl::vanilla_rnn_forward::desc d(pk, rnn_act, dir, src_layer, iter, wl_any, wi_any,
                                          bias_md, dst_layer, iter, dnnl::rnn_flags::undef,
                                          rnn_alpha);
        dnnl::vanilla_rnn_forward::primitive_desc p(d, eng);
        parts.prim = dnnl::vanilla_rnn_forward(p);
        parts.pd = p;
        break;
      }
    }
  } catch (const dnnl::error&) {
    return false;  // no oneDNN implementation for this configuration: the loop runs it
  }
  parts.src_layer = src_layer;
  parts.iter = iter;
  parts.bias = bias_md;
  parts.dst_layer = dst_layer;

  // oneDNN's gate g is ONNX's gate order[g].
  std::vector<int> order(static_cast<size_t>(G));
  for (int g = 0; g < G; ++g) order[g] = g;
  if (a.cell == CellKind::kLstm) order = {0, 2, 3, 1};  // i, f, c~, o from i, o, f, c
  const Tensor w = PermuteGates(*ctx.in_data[kW], D, G, H * I, order);
  const Tensor r = PermuteGates(*ctx.in_data[kR], D, G, H * H, order);
  ASSIGN_OR_RETURN(parts.weights_layer,
                   ReorderWeights(ctx, kW, w, memory::desc({1, D, I, G, H}, f32, Tag::ldgoi),
                                  parts.pd.weights_desc(0), &parts.keep));
  ASSIGN_OR_RETURN(parts.weights_iter,
                   ReorderWeights(ctx, kR, r, memory::desc({1, D, H, G, H}, f32, Tag::ldgoi),
                                  parts.pd.weights_desc(1), &parts.keep));
  // Bias [dirs, gates, hidden]: Wb + Rb per gate; a linear-before-reset GRU keeps the h
  // gate's two apart (oneDNN's fourth gate is the R part, which the reset gate scales).
  auto bias = Buffer::Allocate(sizeof(float) * D * bias_gates * H);
  float* bp = static_cast<float*>(bias->data());
  if (ctx.has_input(kB)) {
    const float* b = ctx.in_data[kB]->values<float>().data();
    for (int64_t d = 0; d < D; ++d) {
      const float* wb = b + d * 2 * G * H;
      const float* rb = wb + G * H;
      float* out = bp + d * bias_gates * H;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t src = order[g] * H;
        for (int64_t j = 0; j < H; ++j)
          out[g * H + j] = wb[src + j] + (lbr && g == 2 ? 0.f : rb[src + j]);
      }
      if (lbr) std::memcpy(out + 3 * H, rb + 2 * H, sizeof(float) * H);
    }
  }
  parts.bias_data = std::move(bias);
  kernel->UseDnnl(eng, std::move(parts), ctx.node().has_output(0));
  return true;
}

Status CheckShape(const PrepareContext& ctx, int input, const Shape& want, const char* name) {
  if (!ctx.has_input(input) || ctx.in_shapes[input] == want) return Status::Ok();
  return ctx.Error(std::string(name) + " must have shape " + ShapeToString(want) + "; got " +
                   ShapeToString(ctx.in_shapes[input]));
}

StatusOr<std::unique_ptr<Kernel>> PrepareRecurrent(PrepareContext& ctx) {
  auto parsed = ParseRecurrent(ctx.node());
  if (!parsed.ok()) return ctx.Error(parsed.status().message());
  const RecurrentAttributes& a = *parsed;
  const bool lstm = a.cell == CellKind::kLstm;
  if (!ctx.has_input(kX) || !ctx.has_input(kW) || !ctx.has_input(kR))
    return ctx.Error("needs X, W and R");
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) continue;
    const DataType want = i == kSequenceLens ? DataType::kInt32 : DataType::kFp32;
    if (ctx.in_dtypes[i] != want)
      return ctx.Error(i == kSequenceLens ? "sequence_lens must be INT32"
                                          : "only FP32 is supported");
  }
  const Shape& x = ctx.in_shapes[kX];
  const Shape& r = ctx.in_shapes[kR];
  if (x.size() != 3) return ctx.Error("X must be 3-D; got " + ShapeToString(x));
  if (r.size() != 3) return ctx.Error("R must be 3-D; got " + ShapeToString(r));
  RecurrentDims n;
  n.seq = a.batch_first ? x[1] : x[0];
  n.batch = a.batch_first ? x[0] : x[1];
  n.input = x[2];
  n.hidden = a.hidden > 0 ? a.hidden : r[2];
  const int64_t D = a.directions, G = a.gates, H = n.hidden, N = n.batch;
  RETURN_IF_ERROR(CheckShape(ctx, kW, {D, G * H, n.input}, "W"));
  RETURN_IF_ERROR(CheckShape(ctx, kR, {D, G * H, H}, "R"));
  RETURN_IF_ERROR(CheckShape(ctx, kB, {D, 2 * G * H}, "B"));
  RETURN_IF_ERROR(CheckShape(ctx, kSequenceLens, {N}, "sequence_lens"));
  const Shape state = a.batch_first ? Shape{N, D, H} : Shape{D, N, H};
  RETURN_IF_ERROR(CheckShape(ctx, kInitialH, state, "initial_h"));
  if (lstm) {
    RETURN_IF_ERROR(CheckShape(ctx, kInitialC, state, "initial_c"));
    RETURN_IF_ERROR(CheckShape(ctx, kP, {D, 3 * H}, "P"));
  }
  const Shape y = a.batch_first ? Shape{N, n.seq, D, H} : Shape{n.seq, D, N, H};
  for (size_t o = 0; o < ctx.out_shapes.size(); ++o) {
    ctx.out_shapes[o] = o == 0 ? y : state;
    ctx.out_dtypes[o] = DataType::kFp32;
  }
  auto kernel = std::make_unique<RecurrentKernel>(a, n);
  RETURN_IF_ERROR(BuildDnnl(ctx, a, n, kernel.get()).status());
  return std::unique_ptr<Kernel>(std::move(kernel));
}

Status CheckRecurrent(const Node& node, const Graph& graph) {
  auto describe = [&] { return graph.Describe(static_cast<int>(&node - graph.nodes.data())); };
  auto parsed = ParseRecurrent(node);
  if (!parsed.ok()) return InvalidArgument(describe() + ": " + parsed.status().message());
  const bool lstm = node.op_type == "LSTM";
  if (node.inputs.size() > (lstm ? 8u : 6u))
    return InvalidArgument(describe() + ": too many inputs");
  if (node.outputs.size() > (lstm ? 3u : 2u))
    return InvalidArgument(describe() + ": too many outputs");
  return Status::Ok();
}

}  // namespace

void RegisterRecurrentOps(std::vector<OpDef>* ops) {
  const std::vector<std::string_view> common = {
      "activation_alpha", "activation_beta", "activations", "clip",
      "direction",        "hidden_size",     "layout"};
  auto with = [&](std::vector<std::string_view> more) {
    more.insert(more.begin(), common.begin(), common.end());
    return more;
  };
  ops->push_back({"", "RNN", with({}), CheckRecurrent, PrepareRecurrent});
  ops->push_back({"", "GRU", with({"linear_before_reset"}), CheckRecurrent, PrepareRecurrent});
  ops->push_back({"", "LSTM", with({"input_forget"}), CheckRecurrent, PrepareRecurrent});
}

}  // namespace shoal::engine::internal
