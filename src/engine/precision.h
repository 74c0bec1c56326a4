// Precision tiers: variants of one model that run its convolutions and matrix products
// in bf16 or int8 instead of fp32 (everything else, and the model's inputs and outputs,
// stay fp32; so do recurrent layers, RNN, GRU and LSTM, whose products are inside them).
//
//   fp32  always available.
//   bf16  weights and activations between convolutions in bfloat16, accumulation in
//         fp32; needs a CPU with AVX512_BF16 (CheckPrecision says why not).
//   int8  post-training quantisation: weights symmetric per output channel; each
//         convolution's or product's input quantised with a scale from its range over
//         calibration inputs (u8 when it never went negative, else s8), fp32 out, except
//         that a convolution's output stays quantised (with its own range's scale) when
//         only convolutions and max pools read it, and the max pools' outputs can stay
//         quantised in turn (kernel.h: quantized_inputs, quantized_passthrough).
//
// A variant is a Model loaded with LoadOptions::plan.precision (and, for int8, the
// Calibration that Calibrate measured on the fp32 model). CompareTiers then measures
// its accuracy against fp32 on the calibration inputs; the ONNX backend refuses a
// variant beyond the bound its config sets.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "engine/kernel.h"
#include "engine/model.h"

namespace shoal::engine {

std::string_view PrecisionName(Precision p);  // "fp32", "bf16", "int8"
StatusOr<Precision> ParsePrecision(std::string_view name);
std::string_view ConvAlgorithmName(ConvAlgorithm a);  // "direct", "winograd"
StatusOr<ConvAlgorithm> ParseConvAlgorithm(std::string_view name);
std::string_view ConvLayoutName(ConvLayout l);  // "blocked", "channels_last"
StatusOr<ConvLayout> ParseConvLayout(std::string_view name);
// OK when this CPU runs `p` natively; else FAILED_PRECONDITION saying what is missing.
Status CheckPrecision(Precision p);

// Ranges of every value over `batches` (each a full set of model inputs) on `fp32`.
StatusOr<Calibration> Calibrate(const Model& fp32,
                                const std::vector<std::vector<NamedTensor>>& batches);

struct TierAccuracy {
  int samples = 0;          // rows compared (batch items)
  double max_abs_diff = 0;  // over every output element; +inf when one is not finite
  int64_t non_finite =
      0;  // output elements NaN or infinite in the variant, finite in the reference
  double top1_agreement = -1;  // fraction of rows whose argmax agrees; -1: not a classifier
  // "max |diff| 0.0123, top-1 agreement 99.2% over 64 samples", and how many outputs were
  // not finite when any were.
  std::string ToString() const;
};

// Runs `variant` and `reference` on `batches` and compares their outputs. Top-1
// agreement is measured on the first output when it is [batch, classes] with classes > 1.
StatusOr<TierAccuracy> CompareTiers(const Model& reference, const Model& variant,
                                    const std::vector<std::vector<NamedTensor>>& batches);
// The same comparison of any two ways to run one model (a GPU plan against the CPU engine):
// each runner takes a batch of named inputs and gives the outputs in the model's order.
using TierRunner = std::function<Status(const std::vector<NamedTensor>& inputs,
                                        std::vector<NamedTensor>* outputs)>;
StatusOr<TierAccuracy> CompareRunners(const TierRunner& reference, const TierRunner& variant,
                                      const std::vector<std::vector<NamedTensor>>& batches);

// Per-operator tier selection: a lower tier must never be slower than fp32. Where bf16
// or int8 does not pay (a small model at a small batch: reorders and quantisation cost
// more than the arithmetic saves), the tier keeps those operators in fp32
// (PlanOptions::fp32_nodes). The backend times the tier against fp32 at load, operator
// by operator, at each batch size it prepares, and keeps in fp32 every convolution or
// product that is not faster at one of them; a plan serves only when its whole run is
// clearly faster than fp32 (at most 0.9x fp32's time at every timed batch), and when
// neither the mixed plan nor the whole tier is, every one of them stays fp32.

// One timed batch size: medians over a few alternating rounds, fp32 and the variant.
struct TierTiming {
  int64_t batch = 0;                                  // rows of the inputs timed (0: no batch axis)
  double fp32_ms = 0, variant_ms = 0;                 // a whole run
  std::vector<double> fp32_node_ms, variant_node_ms;  // per node of the optimised graph
};

// Nodes whose arithmetic a tier changes: convolutions and matrix products, fused or not.
bool TierChangesNode(const Node& node);
// Those of them not faster in the variant than in fp32 at some timed batch, ascending.
std::vector<int> SlowerTierNodes(const Graph& graph, const std::vector<TierTiming>& timings);
// True when the variant's whole run is faster than fp32's at every timed batch.
bool TierPays(const std::vector<TierTiming>& timings);

// Loads the variant with the given nodes kept fp32 (null: none).
using TierLoader =
    std::function<StatusOr<std::unique_ptr<Model>>(std::shared_ptr<const std::vector<int>>)>;
// Times `variant` against `fp32` on `inputs`.
using TierTimer = std::function<StatusOr<TierTiming>(const Model& fp32, const Model& variant,
                                                     const std::vector<NamedTensor>& inputs)>;

// Profiles each model (ProfileOperators) for `rounds` alternating rounds of up to
// `runs` runs each (fewer when a run takes long: a round lasts about 20 ms or one run),
// and takes medians over the rounds. Both run on one thread.
StatusOr<TierTiming> TimeTiers(const Model& fp32, const Model& variant,
                               const std::vector<NamedTensor>& inputs, int rounds = 5,
                               int runs = 20);

struct TierSelection {
  std::unique_ptr<Model> model;     // the variant to serve
  std::vector<int> fp32_nodes;      // nodes it keeps in fp32, ascending
  int candidates = 0;               // nodes the tier could change (TierChangesNode)
  std::vector<TierTiming> timings;  // of the first, all-lower-precision variant
  std::string why;  // empty, or why nodes stayed fp32 ("not faster at batch 1: conv1, fc")
  // "all 4 convolutions and products in int8", "2 of 4 ... kept fp32 (...)".
  std::string ToString(Precision precision) const;
};

// Loads the variant (`load`), times it at each entry of `timed_inputs` (one set of
// model inputs per batch size), and reloads it with the nodes that do not pay kept fp32.
StatusOr<TierSelection> SelectTierNodes(const Model& fp32, const TierLoader& load,
                                        const std::vector<std::vector<NamedTensor>>& timed_inputs,
                                        const TierTimer& timer);

// How the ONNX backend loads a tier's plans for SelectTierNodes: the model at `path` with
// `options` and the given nodes kept fp32; when they are every convolution and product of
// `fp32`'s graph, the fp32 plan itself (precision fp32), which computes and runs as fp32.
TierLoader ServedTierLoader(const Model& fp32, const std::string& path, const LoadOptions& options);
// What the ONNX backend serves for a tier, so that a benchmark times the same plan: the
// model at `path` loaded with `options` (the tier's precision and, for int8, its
// calibration), with SelectTierNodes timing it against `fp32` by TimeTiers at each entry of
// `timed_inputs` (ServedTierTimingInputs). No timed inputs: the whole tier, unselected.
StatusOr<TierSelection> LoadServedTier(const Model& fp32, const std::string& path,
                                       const LoadOptions& options,
                                       const std::vector<std::vector<NamedTensor>>& timed_inputs);
// The inputs the backend times a tier at, from its calibration batches (`batches`, each of
// at most the calibration batch size, as ReadCalibrationInputs splits them): the first
// row alone when the model has a batch dimension, and the first batch when it has more
// than one row.
StatusOr<std::vector<std::vector<NamedTensor>>> ServedTierTimingInputs(
    const Model& fp32, const std::vector<std::vector<NamedTensor>>& batches);

// Inputs of `shapes` (one per model input) made up where no real ones are at hand (a
// description without calibration inputs, a benchmark): floating-point values uniform in
// [-1, 1), the same every call; integers 1 (a valid token id, a mask keeping every
// position); other types zeros.
std::vector<NamedTensor> MadeUpInputs(const Model& model, const std::vector<Shape>& shapes);

// Reads calibration inputs from a NumPy .npz file holding one array per model input,
// named as the input, whose first dimension counts samples; splits them into batches
// of at most `batch` rows (the whole array when the model has no batch dimension).
StatusOr<std::vector<std::vector<NamedTensor>>> ReadCalibrationInputs(const Model& model,
                                                                      const std::string& path,
                                                                      int64_t batch);

}  // namespace shoal::engine
