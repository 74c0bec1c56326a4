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
// OK when this CPU runs `p` natively; else FAILED_PRECONDITION saying what is missing.
Status CheckPrecision(Precision p);

// Ranges of every value over `batches` (each a full set of model inputs) on `fp32`.
StatusOr<Calibration> Calibrate(const Model& fp32,
                                const std::vector<std::vector<NamedTensor>>& batches);

struct TierAccuracy {
  int samples = 0;               // rows compared (batch items)
  double max_abs_diff = 0;       // over every output element
  double top1_agreement = -1;    // fraction of rows whose argmax agrees; -1: not a classifier
  std::string ToString() const;  // "max |diff| 0.0123, top-1 agreement 99.2% over 64 samples"
};

// Runs `variant` and `reference` on `batches` and compares their outputs. Top-1
// agreement is measured on the first output when it is [batch, classes] with classes > 1.
StatusOr<TierAccuracy> CompareTiers(const Model& reference, const Model& variant,
                                    const std::vector<std::vector<NamedTensor>>& batches);

// Reads calibration inputs from a NumPy .npz file holding one array per model input,
// named as the input, whose first dimension counts samples; splits them into batches
// of at most `batch` rows (the whole array when the model has no batch dimension).
StatusOr<std::vector<std::vector<NamedTensor>>> ReadCalibrationInputs(const Model& model,
                                                                      const std::string& path,
                                                                      int64_t batch);

}  // namespace shoal::engine
