// The recurrent operators' attributes and the engine's own loop (internal/recurrent.h).
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "engine/internal/recurrent.h"

namespace shoal::engine::internal {
namespace {

using Kind = RnnActivation::Kind;

struct ActivationName {
  const char* name;
  Kind kind;
  bool has_alpha, has_beta;
  float alpha, beta;  // defaults
};

// ONNX's list for recurrent operators, with the defaults ONNX Runtime uses.
constexpr ActivationName kActivations[] = {
    {"Relu", Kind::kRelu, false, false, 0.f, 0.f},
    {"Tanh", Kind::kTanh, false, false, 0.f, 0.f},
    {"Sigmoid", Kind::kSigmoid, false, false, 0.f, 0.f},
    {"Affine", Kind::kAffine, true, true, 1.f, 0.f},
    {"LeakyRelu", Kind::kLeakyRelu, true, false, 0.01f, 0.f},
    {"ThresholdedRelu", Kind::kThresholdedRelu, true, false, 1.f, 0.f},
    {"ScaledTanh", Kind::kScaledTanh, true, true, 1.f, 1.f},
    {"HardSigmoid", Kind::kHardSigmoid, true, true, 0.2f, 0.5f},
    {"Elu", Kind::kElu, true, false, 1.f, 0.f},
    {"Softsign", Kind::kSoftsign, false, false, 0.f, 0.f},
    {"Softplus", Kind::kSoftplus, false, false, 0.f, 0.f},
};

bool SameName(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::vector<std::string> DefaultActivations(CellKind cell) {
  switch (cell) {
    case CellKind::kRnn:
      return {"Tanh"};
    case CellKind::kGru:
      return {"Sigmoid", "Tanh"};
    case CellKind::kLstm:
      return {"Sigmoid", "Tanh", "Tanh"};
  }
  return {};
}

inline float Clip(float v, float clip) {
  return clip > 0.f ? std::min(std::max(v, -clip), clip) : v;
}

// Row-major C[m, n] = A[m, k] * B[n, k]^T (+ C when accumulate); leading dimensions given.
void GemmNT(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
            int64_t ldb, float* c, int64_t ldc, bool accumulate = false) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.f);
    return;
  }
  dnnl_sgemm('N', 'T', m, n, k, 1.f, a, lda, b, ldb, accumulate ? 1.f : 0.f, c, ldc);
}

}  // namespace

float RnnActivation::operator()(float x) const {
  switch (kind) {
    case Kind::kRelu:
      return x > 0.f ? x : 0.f;
    case Kind::kTanh:
      return std::tanh(x);
    case Kind::kSigmoid:
      return 1.f / (1.f + std::exp(-x));
    case Kind::kAffine:
      return alpha * x + beta;
    case Kind::kLeakyRelu:
      return x >= 0.f ? x : alpha * x;
    case Kind::kThresholdedRelu:
      return x > alpha ? x : 0.f;
    case Kind::kScaledTanh:
      return alpha * std::tanh(beta * x);
    case Kind::kHardSigmoid:
      return std::min(std::max(alpha * x + beta, 0.f), 1.f);
    case Kind::kElu:
      return x >= 0.f ? x : alpha * (std::exp(x) - 1.f);
    case Kind::kSoftsign:
      return x / (1.f + std::fabs(x));
    case Kind::kSoftplus:
      return x > 20.f ? x : std::log1p(std::exp(x));
  }
  return x;
}

bool RecurrentAttributes::default_activations() const {
  const auto names = DefaultActivations(cell);
  for (size_t i = 0; i < activations.size(); ++i) {
    const std::string& want = names[i % names.size()];
    Kind k = want == "Tanh" ? Kind::kTanh : want == "Sigmoid" ? Kind::kSigmoid : Kind::kRelu;
    if (activations[i].kind != k) return false;
  }
  return true;
}

StatusOr<RecurrentAttributes> ParseRecurrent(const Node& node) {
  RecurrentAttributes a;
  if (node.op_type == "RNN") {
    a.cell = CellKind::kRnn;
    a.gates = 1;
  } else if (node.op_type == "GRU") {
    a.cell = CellKind::kGru;
    a.gates = 3;
  } else {
    a.cell = CellKind::kLstm;
    a.gates = 4;
  }
  const std::string direction = node.GetString("direction", "forward");
  if (direction == "bidirectional") {
    a.directions = 2;
  } else if (direction == "reverse") {
    a.reverse = true;
  } else if (direction != "forward") {
    return InvalidArgument("direction must be forward, reverse or bidirectional; was '" +
                           direction + "'");
  }
  a.hidden = node.GetInt("hidden_size", -1);
  if (node.attr("hidden_size") && a.hidden <= 0)
    return InvalidArgument("hidden_size must be positive; was " + std::to_string(a.hidden));
  const int64_t layout = node.GetInt("layout", 0);
  if (layout != 0 && layout != 1)
    return InvalidArgument("layout must be 0 or 1; was " + std::to_string(layout));
  a.batch_first = layout == 1;
  const int64_t lbr = node.GetInt("linear_before_reset", 0);
  if (lbr != 0 && lbr != 1)
    return InvalidArgument("linear_before_reset must be 0 or 1; was " + std::to_string(lbr));
  a.linear_before_reset = lbr == 1;
  const int64_t input_forget = node.GetInt("input_forget", 0);
  if (input_forget != 0 && input_forget != 1)
    return InvalidArgument("input_forget must be 0 or 1; was " + std::to_string(input_forget));
  a.input_forget = input_forget == 1;
  if (node.attr("clip")) {
    a.clip = node.GetFloat("clip", 0.f);
    if (!(a.clip > 0.f))
      return InvalidArgument("clip must be positive; was " + std::to_string(a.clip));
  }
  const std::vector<std::string> defaults = DefaultActivations(a.cell);
  const size_t per_direction = defaults.size();
  std::vector<std::string> names = defaults;
  if (const Attribute* at = node.attr("activations")) names = at->strings;
  if (names.size() != per_direction && names.size() != per_direction * a.directions) {
    return InvalidArgument("activations must list " + std::to_string(per_direction) +
                           " function(s) per direction; got " + std::to_string(names.size()));
  }
  const std::vector<float> alphas = node.GetFloats("activation_alpha");
  const std::vector<float> betas = node.GetFloats("activation_beta");
  size_t next_alpha = 0, next_beta = 0;
  for (const std::string& name : names) {
    const ActivationName* found = nullptr;
    for (const ActivationName& c : kActivations)
      if (SameName(c.name, name)) found = &c;
    if (found == nullptr) {
      std::string allowed;
      for (const ActivationName& c : kActivations)
        allowed += std::string(allowed.empty() ? "" : ", ") + c.name;
      return InvalidArgument("activation '" + name + "' is not supported; ONNX allows " + allowed);
    }
    RnnActivation act{found->kind, found->alpha, found->beta};
    // Alphas and betas are consumed in order by the functions that take them.
    if (found->has_alpha && next_alpha < alphas.size()) act.alpha = alphas[next_alpha++];
    if (found->has_beta && next_beta < betas.size()) act.beta = betas[next_beta++];
    a.activations.push_back(act);
  }
  if (a.activations.size() < per_direction * a.directions) {
    const auto first = a.activations;
    a.activations.insert(a.activations.end(), first.begin(), first.end());
  }
  return a;
}

void StatesToDirMajor(const float* src, float* dst, int64_t dirs, int64_t batch, int64_t hidden,
                      bool batch_first) {
  if (!batch_first || dirs == 1) {
    std::memcpy(dst, src, sizeof(float) * dirs * batch * hidden);
    return;
  }
  for (int64_t d = 0; d < dirs; ++d)
    for (int64_t b = 0; b < batch; ++b)
      std::memcpy(dst + (d * batch + b) * hidden, src + (b * dirs + d) * hidden,
                  sizeof(float) * hidden);
}

void StatesFromDirMajor(const float* src, float* dst, int64_t dirs, int64_t batch, int64_t hidden,
                        bool batch_first) {
  if (!batch_first || dirs == 1) {
    std::memcpy(dst, src, sizeof(float) * dirs * batch * hidden);
    return;
  }
  for (int64_t d = 0; d < dirs; ++d)
    for (int64_t b = 0; b < batch; ++b)
      std::memcpy(dst + (b * dirs + d) * hidden, src + (d * batch + b) * hidden,
                  sizeof(float) * hidden);
}

RecurrentLoop::RecurrentLoop(RecurrentAttributes attrs, RecurrentDims dims)
    : a_(std::move(attrs)), n_(dims) {
  const int64_t gh = a_.gates * n_.hidden;
  xw_.assign(static_cast<size_t>(n_.seq * n_.batch * gh), 0.f);
  hr_.assign(static_cast<size_t>(n_.batch * gh), 0.f);
  h_.assign(static_cast<size_t>(n_.batch * n_.hidden), 0.f);
  c_.assign(h_.size(), 0.f);
  rh_.assign(h_.size(), 0.f);
}

Status RecurrentLoop::Run(const RecurrentTensors& t) {
  if (t.sequence_lens != nullptr) {
    for (int64_t b = 0; b < n_.batch; ++b) {
      if (t.sequence_lens[b] < 0 || t.sequence_lens[b] > n_.seq) {
        return InvalidArgument("sequence_lens[" + std::to_string(b) + "] is " +
                               std::to_string(t.sequence_lens[b]) + "; must be in [0, " +
                               std::to_string(n_.seq) + "]");
      }
    }
    if (t.y != nullptr) std::fill(t.y, t.y + n_.seq * a_.directions * n_.batch * n_.hidden, 0.f);
  }
  for (int64_t d = 0; d < a_.directions; ++d)
    RunDirection(t, d, a_.directions == 2 ? d == 1 : a_.reverse);
  return Status::Ok();
}

void RecurrentLoop::RunDirection(const RecurrentTensors& t, int64_t d, bool backwards) {
  const int64_t T = n_.seq, N = n_.batch, I = n_.input, H = n_.hidden, G = a_.gates;
  const int64_t D = a_.directions, GH = G * H;
  const bool gru = a_.cell == CellKind::kGru, lstm = a_.cell == CellKind::kLstm;
  const bool lbr = a_.linear_before_reset;
  const float* w = t.w + d * GH * I;
  const float* r = t.r + d * GH * H;
  const float* wb = t.b ? t.b + d * 2 * GH : nullptr;
  const float* rb = wb ? wb + GH : nullptr;
  const float* p = t.p ? t.p + d * 3 * H : nullptr;
  const RnnActivation* act = a_.activations.data() + d * (a_.activations.size() / D);
  const float clip = a_.clip;

  // Every step's input product at once, with the biases that simply add (all but the
  // R bias of a linear-before-reset GRU's h gate, which the reset gate scales).
  GemmNT(T * N, GH, I, t.x, I, w, I, xw_.data(), GH);
  if (wb != nullptr) {
    std::vector<float> bias(wb, wb + GH);
    for (int64_t j = 0; j < GH; ++j)
      if (!(gru && lbr && j >= 2 * H)) bias[j] += rb[j];
    for (int64_t row = 0; row < T * N; ++row) {
      float* x = xw_.data() + row * GH;
      for (int64_t j = 0; j < GH; ++j) x[j] += bias[j];
    }
  }
  const float* rbh = gru && lbr && rb ? rb + 2 * H : nullptr;

  const bool bf = a_.batch_first;
  auto x_row = [&](int64_t tt, int64_t b) { return bf ? b * T + tt : tt * N + b; };
  auto state = [&](int64_t b) { return bf ? (b * D + d) * H : (d * N + b) * H; };
  auto y_at = [&](int64_t tt, int64_t b) {
    return bf ? ((b * T + tt) * D + d) * H : ((tt * D + d) * N + b) * H;
  };
  for (int64_t b = 0; b < N; ++b) {
    float* h = h_.data() + b * H;
    float* c = c_.data() + b * H;
    if (t.initial_h) {
      std::memcpy(h, t.initial_h + state(b), sizeof(float) * H);
    } else {
      std::fill(h, h + H, 0.f);
    }
    if (lstm) {
      if (t.initial_c) {
        std::memcpy(c, t.initial_c + state(b), sizeof(float) * H);
      } else {
        std::fill(c, c + H, 0.f);
      }
    }
  }
  auto length = [&](int64_t b) { return t.sequence_lens ? int64_t{t.sequence_lens[b]} : T; };
  auto time_of = [&](int64_t s, int64_t b) { return backwards ? length(b) - 1 - s : s; };

  for (int64_t s = 0; s < T; ++s) {
    // State times R; a GRU without linear-before-reset takes its h gate's part later.
    const int64_t cols = gru && !lbr ? 2 * H : GH;
    GemmNT(N, cols, H, h_.data(), H, r, H, hr_.data(), GH);
    if (gru && !lbr) {
      for (int64_t b = 0; b < N; ++b) {
        if (s >= length(b)) continue;
        float* x = xw_.data() + x_row(time_of(s, b), b) * GH;
        const float* hr = hr_.data() + b * GH;
        const float* h = h_.data() + b * H;
        float* rh = rh_.data() + b * H;
        for (int64_t j = 0; j < H; ++j) {
          x[j] = act[0](Clip(x[j] + hr[j], clip));  // z, kept in place
          rh[j] = act[0](Clip(x[H + j] + hr[H + j], clip)) * h[j];
        }
      }
      GemmNT(N, H, H, rh_.data(), H, r + 2 * H * H, H, hr_.data() + 2 * H, GH);
    }
    for (int64_t b = 0; b < N; ++b) {
      if (s >= length(b)) continue;
      const int64_t tt = time_of(s, b);
      float* x = xw_.data() + x_row(tt, b) * GH;
      const float* hr = hr_.data() + b * GH;
      float* h = h_.data() + b * H;
      float* c = c_.data() + b * H;
      switch (a_.cell) {
        case CellKind::kRnn:
          for (int64_t j = 0; j < H; ++j) h[j] = act[0](Clip(x[j] + hr[j], clip));
          break;
        case CellKind::kGru:
          for (int64_t j = 0; j < H; ++j) {
            float z, n;
            if (lbr) {
              z = act[0](Clip(x[j] + hr[j], clip));
              const float rg = act[0](Clip(x[H + j] + hr[H + j], clip));
              n = act[1](Clip(x[2 * H + j] + rg * (hr[2 * H + j] + (rbh ? rbh[j] : 0.f)), clip));
            } else {
              z = x[j];
              n = act[1](Clip(x[2 * H + j] + hr[2 * H + j], clip));
            }
            h[j] = (1.f - z) * n + z * h[j];
          }
          break;
        case CellKind::kLstm:
          // ONNX gate order: i, o, f, c; peepholes i, o, f.
          for (int64_t j = 0; j < H; ++j) {
            const float cp = c[j];
            const float ig = act[0](Clip(x[j] + hr[j] + (p ? p[j] * cp : 0.f), clip));
            const float fg =
                a_.input_forget
                    ? 1.f - ig
                    : act[0](
                          Clip(x[2 * H + j] + hr[2 * H + j] + (p ? p[2 * H + j] * cp : 0.f), clip));
            const float cc = act[1](Clip(x[3 * H + j] + hr[3 * H + j], clip));
            const float cn = fg * cp + ig * cc;
            const float og = act[0](Clip(x[H + j] + hr[H + j] + (p ? p[H + j] * cn : 0.f), clip));
            c[j] = cn;
            h[j] = og * act[2](cn);
          }
          break;
      }
      if (t.y) std::memcpy(t.y + y_at(tt, b), h, sizeof(float) * H);
    }
  }
  for (int64_t b = 0; b < N; ++b) {
    if (t.y_h) std::memcpy(t.y_h + state(b), h_.data() + b * H, sizeof(float) * H);
    if (t.y_c && lstm) std::memcpy(t.y_c + state(b), c_.data() + b * H, sizeof(float) * H);
  }
}

}  // namespace shoal::engine::internal
