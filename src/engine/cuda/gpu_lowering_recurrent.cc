// Lowering of the recurrent operators (RNN, GRU, LSTM): the CPU engine's RecurrentLoop
// (engine/internal/recurrent.h) as GPU steps. Per direction, one GEMM of every step's
// input with W and the biases that add; the state copied in; then per step a GEMM of the
// state with R and the cell's kernel (a GRU without linear-before-reset: a GEMM of its z
// and r gates, the reset kernel, a GEMM of r * h with its h gate's R, then the cell); the
// final states copied out. The products are fp32 in every tier: rounding (to TF32 or 16
// bits) compounds over the steps of a sequence.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/internal/gpu_lowering_impl.h"
#include "engine/internal/op_util.h"
#include "engine/internal/recurrent.h"

namespace shoal::engine::cuda::internal {

using engine::internal::CellKind;
using engine::internal::Product;
using engine::internal::RecurrentAttributes;
using ActKind = engine::internal::RnnActivation::Kind;

// The kernels number the activations as RnnActivation::Kind does (kernels.h).
static_assert(static_cast<int>(ActKind::kRelu) == 0 && static_cast<int>(ActKind::kTanh) == 1 &&
              static_cast<int>(ActKind::kSigmoid) == 2 && static_cast<int>(ActKind::kAffine) == 3 &&
              static_cast<int>(ActKind::kLeakyRelu) == 4 &&
              static_cast<int>(ActKind::kThresholdedRelu) == 5 &&
              static_cast<int>(ActKind::kScaledTanh) == 6 &&
              static_cast<int>(ActKind::kHardSigmoid) == 7 &&
              static_cast<int>(ActKind::kElu) == 8 && static_cast<int>(ActKind::kSoftsign) == 9 &&
              static_cast<int>(ActKind::kSoftplus) == 10);

namespace {

// Rows [begin, begin + rows) of a constant viewed as [*, cols], as a [rows, cols] tensor.
Tensor Rows(const Tensor& t, int64_t begin, int64_t rows, int64_t cols) {
  Tensor out = Tensor::Allocate(DataType::kFp32, {rows, cols});
  const float* src = t.values<float>().data() + begin * cols;
  std::copy(src, src + rows * cols, out.mutable_values<float>().begin());
  return out;
}

}  // namespace

Status Lowerer::LowerRecurrent(int n) {
  const Node& node = graph_.nodes[n];
  auto parsed = engine::internal::ParseRecurrent(node);
  if (!parsed.ok()) return Fail(n, parsed.status().message());
  const RecurrentAttributes& a = *parsed;
  auto input = [&](size_t i) { return node.has_input(i) ? node.inputs[i] : -1; };
  auto output = [&](size_t i) {
    return i < node.outputs.size() && node.outputs[i] >= 0 ? node.outputs[i] : -1;
  };
  const int x = input(0), lens = input(4), h0 = input(5);
  const int c0 = a.cell == CellKind::kLstm ? input(6) : -1;
  const int y = output(0), yh = output(1), yc = a.cell == CellKind::kLstm ? output(2) : -1;
  for (int v : {x, h0, c0, y, yh, yc}) {
    if (v >= 0 && !IsFp32(v)) return Fail(n, "'" + graph_.values[v].name + "' is not fp32");
  }
  if (lens >= 0 && DtypeOf(lens) != DataType::kInt32) return Fail(n, "sequence_lens must be int32");
  RETURN_IF_ERROR(CheckPlainInputs(n));
  // W, R, B and P are the model's constants (or folded for these shapes).
  const Tensor* w = Known(input(1));
  const Tensor* r = Known(input(2));
  const Tensor* b = input(3) >= 0 ? Known(input(3)) : nullptr;
  const Tensor* p = a.cell == CellKind::kLstm && input(7) >= 0 ? Known(input(7)) : nullptr;
  if (!w || !r || (input(3) >= 0 && !b) || (a.cell == CellKind::kLstm && input(7) >= 0 && !p))
    return Fail(n, "weights computed at run time are not on the GPU path yet");
  for (const Tensor* t : {w, r, b, p})
    if (t && t->dtype() != DataType::kFp32) return Fail(n, "its weights are not fp32");

  const Shape xs = ShapeOf(x);
  const Shape rs = r->shape();
  if (xs.size() != 3 || rs.size() != 3) return Fail(n, "X and R must have rank 3");
  const int64_t T = a.batch_first ? xs[1] : xs[0], N = a.batch_first ? xs[0] : xs[1];
  const int64_t I = xs[2], H = rs[2], D = a.directions, G = a.gates, GH = G * H;
  if (rs[0] != D || rs[1] != GH || w->shape() != Shape{D, GH, I})
    return Fail(n, "W and R do not match the directions, gates and sizes");
  if (T == 0 || N == 0 || I == 0 || H == 0)
    return Fail(n, "an empty sequence, batch, input or state is not on the GPU path yet");
  const bool gru = a.cell == CellKind::kGru, lstm = a.cell == CellKind::kLstm;
  const bool split_h = gru && !a.linear_before_reset;

  GemmOptions products;
  products.math = GemmMath::kFp32;
  products.transpose_w = true;  // W and R are stored [gates * hidden, size]
  out_.workspace_bytes = std::max<int64_t>(out_.workspace_bytes, products.workspace_bytes);
  auto gemm = [&](int in, int64_t w_slot, int64_t bias_slot, int out, int64_t m, int64_t cols,
                  int64_t k) {
    GpuStep step = NewStep(GpuStep::Kind::kGemm, n);
    step.gemm = products;
    step.gemm.m = m;
    step.gemm.n = cols;
    step.gemm.k = k;
    step.gemm.epilogue = bias_slot >= 0 ? GemmEpilogue::kBias : GemmEpilogue::kNone;
    step.in = {in, -1, -1, -1};
    step.weight_slots = {w_slot, bias_slot};
    step.out = out;
    out_.steps.push_back(std::move(step));
  };
  RnnGeometry geometry;
  geometry.cell = a.cell == CellKind::kRnn ? 0 : gru ? 1 : 2;
  geometry.seq = T;
  geometry.batch = N;
  geometry.hidden = H;
  geometry.dirs = D;
  geometry.batch_first = a.batch_first;
  geometry.linear_before_reset = a.linear_before_reset;
  geometry.input_forget = a.input_forget;
  geometry.clip = a.clip;
  const size_t per_direction = a.activations.size() / static_cast<size_t>(D);
  // The blobs are this node's own (what they hold depends on its attributes too), and
  // the same for every plan of the model whose W, R, B and P are the same.
  std::string key = "n" + std::to_string(n) + "|" + KeyOf(input(1)) + "|" + KeyOf(input(2));
  if (b) key += "|" + KeyOf(input(3));
  if (p) key += "|" + KeyOf(input(7));
  const int flag = NewFlag(n);

  if (y >= 0 && lens >= 0) {  // rows past their length stay zero
    GpuStep zero = NewStep(GpuStep::Kind::kZero, n);
    zero.out = y;
    out_.steps.push_back(zero);
  }
  const int xw = NewTemp({T * N, GH});
  const int hr = NewTemp({N, split_h ? 2 * H : GH});
  const int rh = split_h ? NewTemp({N, H}) : -1;
  const int hr_h = split_h ? NewTemp({N, H}) : -1;
  for (int64_t d = 0; d < D; ++d) {
    const std::string dk = key + ":d" + std::to_string(d);
    RnnGeometry g = geometry;
    g.dir = d;
    g.backwards = D == 2 ? d == 1 : a.reverse;
    for (size_t k = 0; k < per_direction && k < 3; ++k) {
      const auto& act = a.activations[static_cast<size_t>(d) * per_direction + k];
      g.act[k] = {static_cast<int>(act.kind), act.alpha, act.beta};
    }
    // Every step's input product, with the biases that simply add (all but the R bias of
    // a linear-before-reset GRU's h gate, which the reset gate scales: the cell adds it).
    int64_t bias_slot = -1, rbh_slot = -1, p_slot = -1;
    if (b) {
      Tensor bias = Tensor::Allocate(DataType::kFp32, {GH});
      const float* wb = b->values<float>().data() + d * 2 * GH;
      const float* rb = wb + GH;
      for (int64_t j = 0; j < GH; ++j)
        bias.mutable_values<float>()[j] =
            wb[j] + (gru && a.linear_before_reset && j >= 2 * H ? 0.f : rb[j]);
      bias_slot = AddBlob(dk + ":bias", std::move(bias));
      if (gru && a.linear_before_reset) {
        Tensor rbh = Tensor::Allocate(DataType::kFp32, {H});
        std::copy(rb + 2 * H, rb + 3 * H, rbh.mutable_values<float>().begin());
        rbh_slot = AddBlob(dk + ":rbh", std::move(rbh));
      }
    }
    if (p) p_slot = AddBlob(dk + ":p", Rows(*p, d, 1, 3 * H));
    gemm(x, AddBlob(dk + ":w", Rows(*w, d * GH, GH, I)), bias_slot, xw, T * N, GH, I);
    // The states: this direction's rows of the initial ones, or zeros.
    const int h = NewTemp({N, H});
    const int c = lstm ? NewTemp({N, H}) : -1;
    for (const auto& [state, initial] : {std::pair{h, h0}, std::pair{c, c0}}) {
      if (state < 0) continue;
      GpuStep in = NewStep(GpuStep::Kind::kRnnStateIn, n);
      in.in = {initial};
      in.out = state;
      in.rnn = g;
      out_.steps.push_back(in);
    }
    const int64_t r_slot = AddBlob(dk + ":r", Rows(*r, d * GH, split_h ? 2 * H : GH, H));
    const int64_t rh_slot = split_h ? AddBlob(dk + ":r_h", Rows(*r, d * GH + 2 * H, H, H)) : -1;
    for (int64_t s = 0; s < T; ++s) {
      g.step = s;
      gemm(h, r_slot, -1, hr, N, split_h ? 2 * H : GH, H);
      if (split_h) {
        GpuStep reset = NewStep(GpuStep::Kind::kGruReset, n);
        reset.in = {xw, hr, h, lens};
        reset.out = rh;
        reset.rnn = g;
        out_.steps.push_back(reset);
        gemm(rh, rh_slot, -1, hr_h, N, H, H);
      }
      GpuStep cell = NewStep(GpuStep::Kind::kRnnCell, n);
      cell.in = {xw, hr, hr_h, h, c, lens};
      cell.out = y;
      cell.rnn = g;
      cell.length = split_h ? 2 * H : GH;
      cell.weight_slots = {rbh_slot, p_slot};
      cell.flag = flag;
      out_.steps.push_back(cell);
    }
    for (const auto& [state, final_state] : {std::pair{h, yh}, std::pair{c, yc}}) {
      if (state < 0 || final_state < 0) continue;
      GpuStep out = NewStep(GpuStep::Kind::kRnnStateOut, n);
      out.in = {state};
      out.out = final_state;
      out.rnn = g;
      out_.steps.push_back(out);
    }
  }
  return Status::Ok();
}

}  // namespace shoal::engine::cuda::internal
