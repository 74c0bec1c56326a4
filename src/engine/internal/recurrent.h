// Recurrent operators (ONNX RNN, GRU, LSTM): the attributes every implementation reads,
// and the engine's own loop, which runs what oneDNN's RNN primitives do not cover
// (sequence_lens with padded batches, activations other than the defaults, clip,
// input_forget, peepholes, weights computed at run time). ops/recurrent.cc chooses
// between the two per plan (and, when sequence_lens arrives at run time, per run).
//
// Layouts are ONNX's: X [seq, batch, input] (layout 0) or [batch, seq, input]
// (layout 1); W [dirs, gates*hidden, input], R [dirs, gates*hidden, hidden], B [dirs,
// 2*gates*hidden] (W biases then R biases), gates in ONNX order (LSTM i, o, f, c; GRU z,
// r, h); P [dirs, 3*hidden] (i, o, f); Y [seq, dirs, batch, hidden] or [batch, seq, dirs,
// hidden]; initial_h, initial_c, Y_h, Y_c [dirs, batch, hidden] or [batch, dirs, hidden].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/graph.h"

namespace shoal::engine::internal {

enum class CellKind { kRnn, kGru, kLstm };

// One of the activations ONNX lists for recurrent operators, with its alpha and beta.
struct RnnActivation {
  enum class Kind {
    kRelu,
    kTanh,
    kSigmoid,
    kAffine,           // alpha * x + beta
    kLeakyRelu,        // x >= 0 ? x : alpha * x
    kThresholdedRelu,  // x > alpha ? x : 0
    kScaledTanh,       // alpha * tanh(beta * x)
    kHardSigmoid,      // clamp(alpha * x + beta, 0, 1)
    kElu,              // x >= 0 ? x : alpha * (exp(x) - 1)
    kSoftsign,         // x / (1 + |x|)
    kSoftplus,         // log(1 + exp(x))
  };
  Kind kind = Kind::kTanh;
  float alpha = 0.f, beta = 0.f;
  float operator()(float x) const;
  bool operator==(const RnnActivation&) const = default;
};

// A node's attributes, checked.
struct RecurrentAttributes {
  CellKind cell = CellKind::kLstm;
  int64_t gates = 4;                 // RNN 1, GRU 3, LSTM 4
  int64_t directions = 1;            // 2 for "bidirectional"
  bool reverse = false;              // direction "reverse": one direction, last step first
  int64_t hidden = -1;               // hidden_size; -1 when the node does not say (taken from R)
  bool batch_first = false;          // layout 1 (opset 14)
  bool linear_before_reset = false;  // GRU
  bool input_forget = false;         // LSTM: forget gate = 1 - input gate
  float clip = 0.f;                  // > 0: gate inputs clamped to [-clip, clip]
  // Per direction, in order: RNN f; GRU f, g; LSTM f, g, h (directions * that many).
  std::vector<RnnActivation> activations;
  // The activations are ONNX's defaults (RNN Tanh; GRU Sigmoid, Tanh; LSTM Sigmoid,
  // Tanh, Tanh) in every direction.
  bool default_activations() const;
};

// Reads and checks the attributes of an RNN, GRU or LSTM node. Errors name what is
// unsupported ("activation 'Foo' is not supported; ONNX allows ...").
StatusOr<RecurrentAttributes> ParseRecurrent(const Node& node);

// Shapes of one run (see the file comment for the layouts).
struct RecurrentDims {
  int64_t seq = 0, batch = 0, input = 0, hidden = 0;
};

// Run-time tensors; null for omitted inputs and outputs. sequence_lens values must lie
// in [0, seq] (checked by Run): a sequence of length L reads steps [0, L) (the reverse
// direction from L - 1 down to 0); Y is zero past L; Y_h and Y_c hold the state after
// the last step read (the initial state when L is 0).
struct RecurrentTensors {
  const float* x = nullptr;
  const float* w = nullptr;
  const float* r = nullptr;
  const float* b = nullptr;
  const int32_t* sequence_lens = nullptr;
  const float* initial_h = nullptr;
  const float* initial_c = nullptr;
  const float* p = nullptr;
  float* y = nullptr;
  float* y_h = nullptr;
  float* y_c = nullptr;
};

// The engine's own implementation: per direction, one product of every step's input
// with W up front, then per step one product of the state with R (oneDNN's sgemm, on
// the session's threads) and the cell's element-wise work. Holds its scratch; Run is
// called by one thread at a time.
class RecurrentLoop {
 public:
  RecurrentLoop(RecurrentAttributes attrs, RecurrentDims dims);
  Status Run(const RecurrentTensors& t);

 private:
  void RunDirection(const RecurrentTensors& t, int64_t d, bool backwards);

  RecurrentAttributes a_;
  RecurrentDims n_;
  std::vector<float> xw_, hr_, h_, c_, rh_;
};

// Converts between the state layout of the node (layout 0 [dirs, batch, hidden] or 1
// [batch, dirs, hidden]) and [dirs, batch, hidden].
void StatesToDirMajor(const float* src, float* dst, int64_t dirs, int64_t batch, int64_t hidden,
                      bool batch_first);
void StatesFromDirMajor(const float* src, float* dst, int64_t dirs, int64_t batch, int64_t hidden,
                        bool batch_first);

}  // namespace shoal::engine::internal
