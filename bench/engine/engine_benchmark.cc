// Engine benchmark: shoal's ONNX engine on the models bench/engine/export_models.py writes
// (ResNet-50, MobileNetV2, BERT-base at sequence 128, VAE, MLP recommender, LSTM and GRU
// text classifiers at 64 tokens, a detector with NMS post-processing at 3x320x320, a
// segmentation U-Net at 3x256x256) and on the
// trained classifiers models/digits.onnx and the example repository's image_classifier (a
// small CNN on 3x32x32 colour digits), at batch 1 and 8, in each precision tier (fp32,
// bf16, int8), in fp32 with Winograd convolutions ("winograd") and in fp32 with
// convolutions channels-last instead of blocked ("channels_last", PlanOptions::conv_layout),
// variants timed and compared with direct fp32 like a tier, one Session with THREADS
// threads per tier.
//
// - Peak (fma_peak.h): measures the machine's FMA peak itself (an FMA loop with 12
//   independent vector accumulators, AVX-512 when the CPU has it, else AVX2; one pinned
//   thread per --threads): once at the start (~0.5 s, median of 3), for the headline, and
//   again for 0.5 s just before every timed fp32 run and every library-ceiling run. "% of
//   peak" is the median over runs of each run's GFLOP/s over the peak probed beside it:
//   this VM's speed drifts by tens of percent between minutes (other tenants of the
//   host), and a peak measured minutes away from a run would carry that drift into the
//   fraction (see kProbeSeconds for what pairing cannot take out).
// - Library ceiling: then times oneDNN's own primitives, alone, on the largest shapes of
//   BERT-base and ResNet-50 at batch 8 (matmul with packed weights; convolution in the
//   engine's default blocked layout, nChw16c), with the same threads and timing rule as
//   the models, so a model's fraction of the peak can be read against what the library
//   reaches on this machine in the same minute.
// - Throughput: each timed run is a fixed number of Session::Run calls, sized after
//   warm-up so that a run lasts about MIN_SECONDS; the figure is the median items/s over
//   RUNS runs. A model's variants are all loaded
//   first and their runs interleave (each of RUNS rounds times every variant once), so the
//   ratios between tiers do not carry the machine's drift between minutes. GFLOP/s uses the FLOPs
//   per sample `shoal inspect` estimates (engine/inspect.h), for direct fp32 only: Winograd does
//   fewer multiplications than it counts, so its speed is given as a ratio to fp32, not a fraction
//   of the peak.
// - Tiers: bf16 only when CheckPrecision(kBf16) is OK (AVX512_BF16). int8 is calibrated
//   (engine::Calibrate) on the benchmark's own random inputs: the batch-8 timing input plus
//   CALIB_BATCHES-1 more batches of 8 drawn the same way. Each tier is loaded as the ONNX
//   backend serves it (LoadServedTier: timed against fp32 on one thread at batch 1 and 8 of
//   the calibration inputs, operators that do not pay kept fp32, the fp32 plan itself when
//   none pays); where that kept some fp32, the whole tier ("bf16_raw", "int8_raw") is loaded
//   and timed beside it.
// - Accuracy: CompareTiers against fp32 on ACC_BATCHES held-out batches of 8 (another
//   seed): max |diff| and, for classifiers, top-1 agreement. For the trained classifiers:
//   top-1 accuracy against the labels of their held-out images (<model>.test.sht; int8
//   calibrated on the first 100 images, every tier measured on the other 350).
// - Memory: Session::PlanStats of the fp32 plan at batch 1 and 8: the planned arena vs
//   the liveness bound (most bytes live at one step).
// A model or tier that fails is reported with the engine's error; the rest go on.
// - --profile N: also profiles every variant operator by operator (ProfileOperators, N runs
//   at each batch, the same threads) and prints where its time goes to stderr, to find
//   what makes a tier slower than fp32 or fp32 slower than PyTorch.
//
// With --peer FILE (lines "model<TAB>batch<TAB>items/s", or "model<TAB>note<TAB>text"),
// the PyTorch figures bench/engine/run.sh measured are merged into the tables.
//
// Usage: engine_benchmark --dir DIR [--models a,b,...] [--threads 2] [--runs 5]
//                         [--min-seconds 0.5] [--calib-batches 2] [--acc-batches 2]
//                         [--models-dir SRC/models] [--peer FILE] [--json OUT.json]
//                         [--tiers bf16,int8,winograd,channels_last] [--profile N]
// --tiers names the variants run beside direct fp32 (which always runs: int8 is calibrated
// on it and every variant's accuracy is measured against it); "--tiers none" times fp32
// alone.
#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/inspect.h"
#include "engine/model.h"
#include "engine/omp_wait_policy.h"
#include "engine/precision.h"
#include "engine/profile.h"
#include "fma_peak.h"

namespace fs = std::filesystem;
using namespace shoal;
using namespace shoal::engine;
using namespace shoal::bench;

namespace {

const int kBatches[] = {1, 8};
// What each model runs in: the precision tiers, fp32 with Winograd convolutions
// (PlanOptions::conv_algorithm) and fp32 with channels-last convolutions
// (PlanOptions::conv_layout), which are timed and compared with direct fp32 like a tier.
// bf16 and int8 are the tiers as the server serves them (LoadServedTier: operators the
// tier does not make faster stay fp32); "bf16 raw" and "int8 raw" are the same tiers with
// every convolution and product in bf16 or int8 ("bf16_raw", "int8_raw"), loaded and timed
// only where the served plan differs from them (RawOf).
struct Variant {
  const char* name;
  Precision precision;
  ConvAlgorithm conv;
  ConvLayout layout = ConvLayout::kBlocked;
};
const Variant kVariants[] = {
    {"fp32", Precision::kFp32, ConvAlgorithm::kDirect},
    {"bf16", Precision::kBf16, ConvAlgorithm::kDirect},
    {"int8", Precision::kInt8, ConvAlgorithm::kDirect},
    {"winograd", Precision::kFp32, ConvAlgorithm::kWinograd},
    {"channels_last", Precision::kFp32, ConvAlgorithm::kDirect, ConvLayout::kChannelsLast},
    {"bf16_raw", Precision::kBf16, ConvAlgorithm::kDirect},
    {"int8_raw", Precision::kInt8, ConvAlgorithm::kDirect}};
constexpr int kNumVariants = 7;
constexpr int kLoadedVariants = 5;  // the raw tiers are loaded beside the served ones
// The raw variant of a served tier (bf16, int8), or -1.
int RawOf(int t) { return t == 1 ? 5 : t == 2 ? 6 : -1; }
constexpr int kCalibBatchRows = 8;
constexpr int kLabelledCalibImages = 100;

// The trained classifiers, benchmarked on labelled held-out images rather than random
// inputs: digits (models/digits.onnx + digits.test.sht) and the example repository's
// image_classifier (bench/engine/run.sh copies it and renders its held-out images into
// --dir as image_classifier.onnx + image_classifier.test.sht).
bool Labelled(const std::string& name) { return name == "digits" || name == "image_classifier"; }

struct Options {
  std::string dir;
  std::vector<std::string> models = {
      "resnet50", "mobilenet_v2", "bert_base",       "vae", "mlp", "lstm", "gru", "detector",
      "unet",     "digits",       "image_classifier"};
  int threads = 2;
  int runs = 5;
  double min_seconds = 0.5;
  int calib_batches = 2;
  int acc_batches = 2;
  std::string models_dir;  // the repository's models/ (digits)
  std::string peer;
  std::string json;
  // beside fp32 (always runs)
  std::vector<std::string> tiers = {"bf16", "int8", "winograd", "channels_last"};
  int profile_runs = 0;  // --profile: per-operator profiles of every variant, to stderr
};

struct TierResult {
  bool available = false;  // loaded
  std::string note;        // why not available, or load error
  double load_s = 0;
  double items_per_s[2] = {0, 0};  // per kBatches entry; 0: failed
  PeakBeside beside[2];            // direct fp32 only: the peak probed beside each run
  std::string error[2];
  bool compared = false;
  TierAccuracy accuracy;
  std::string accuracy_error;
  std::string row_counts;      // RowCounts, when the tier's outputs differ from fp32's in shape
  double label_accuracy = -1;  // trained classifiers: top-1 accuracy against the labels
  // Served tiers: what the load-time selection kept fp32 (TierSelection).
  bool selected = false;
  int fp32_nodes = 0, candidates = 0;
  std::string selection;  // TierSelection::ToString
};

struct MemResult {
  bool ok = false;
  PlanMemoryStats stats;
  std::string error;
};

struct ModelResult {
  std::string model;
  double flops = 0;   // per item
  std::string error;  // fp32 load failure
  std::string optimize_summary;
  TierResult tiers[kNumVariants];
  MemResult mem[2];
  int label_samples = 0;
  std::vector<std::string> notes;
};

std::vector<std::string> Split(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '|', '/');
  return s;
}

std::string Fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// ---- Library ceiling ---------------------------------------------------------------

struct Ceiling {
  std::string primitive;  // "matmul" or "conv"
  std::string shape;      // as the model uses it
  double gflops = 0;      // median over the runs
  PeakBeside beside;
};

// Median GFLOP/s of `run` (each call does `flops`), timed as the models are: RUNS runs,
// each repeating the call until it lasts MIN_SECONDS, after one warm-up call, each after
// a probe of the peak (`beside`).
template <typename Fn>
double TimeGflops(const Fn& run, double flops, const Options& o, const FmaProbe& probe,
                  PeakBeside* beside) {
  run();
  std::vector<double> rates, peaks;
  for (int r = 0; r < o.runs; ++r) {
    peaks.push_back(probe.Measure(kProbeSeconds));
    int64_t calls = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0;
    do {
      run();
      ++calls;
      elapsed = Seconds(start, std::chrono::steady_clock::now());
    } while (elapsed < o.min_seconds);
    rates.push_back(static_cast<double>(calls) * flops / elapsed / 1e9);
  }
  *beside = Pair(rates, peaks);
  return Median(rates);
}

std::vector<Ceiling> MeasureLibraryCeiling(const Options& o, const FmaProbe& probe) {
  using dnnl::memory;
  omp_set_num_threads(std::max(1, o.threads));
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  // Times `prim` (a matmul or a convolution: source, weights, destination) on buffers of
  // its own descriptors, filled with small values.
  auto time_primitive = [&](const dnnl::primitive& prim, const memory::desc& src,
                            const memory::desc& weights, const memory::desc& dst, double flops,
                            PeakBeside* beside) {
    memory S(src, eng), W(weights, eng), D(dst, eng);
    for (memory* m : {&S, &W}) {
      float* p = static_cast<float*>(m->get_data_handle());
      const size_t n = m->get_desc().get_size() / sizeof(float);
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(i % 7) * 0.01f;
    }
    auto run = [&] {
      prim.execute(stream, {{DNNL_ARG_SRC, S}, {DNNL_ARG_WEIGHTS, W}, {DNNL_ARG_DST, D}});
      stream.wait();
    };
    return TimeGflops(run, flops, o, probe, beside);
  };
  std::vector<Ceiling> out;
  // BERT-base, 8 sequences of 128 tokens: Q/K/V/output projections, FFN up and down.
  const int64_t mm[][3] = {{1024, 768, 768}, {1024, 768, 3072}, {1024, 3072, 768}};
  for (const auto& d : mm) {
    const int64_t m = d[0], k = d[1], n = d[2];
    const memory::desc a({m, k}, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc b({k, n}, memory::data_type::f32, memory::format_tag::any);
    const memory::desc c({m, n}, memory::data_type::f32, memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), eng);
    Ceiling& ce = out.emplace_back();
    ce.primitive = "matmul";
    ce.shape = std::to_string(m) + "x" + std::to_string(k) + " * " + std::to_string(k) + "x" +
               std::to_string(n);
    ce.gflops =
        time_primitive(dnnl::matmul(pd), a, pd.weights_desc(), c, 2.0 * m * k * n, &ce.beside);
  }
  // ResNet-50, batch 8: a 3x3 convolution of each of two stages, and a 1x1 reduction.
  struct ConvShape {
    int64_t c_in, c_out, hw, k;
  };
  const ConvShape convs[] = {{128, 128, 28, 3}, {256, 256, 14, 3}, {1024, 256, 14, 1}};
  for (const ConvShape& cs : convs) {
    const int64_t mb = 8, pad = cs.k / 2;
    const memory::desc src({mb, cs.c_in, cs.hw, cs.hw}, memory::data_type::f32,
                           memory::format_tag::nChw16c);
    const memory::desc wei({cs.c_out, cs.c_in, cs.k, cs.k}, memory::data_type::f32,
                           memory::format_tag::any);
    const memory::desc dst({mb, cs.c_out, cs.hw, cs.hw}, memory::data_type::f32,
                           memory::format_tag::nChw16c);
    dnnl::convolution_forward::primitive_desc pd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                        dnnl::algorithm::convolution_direct, src, wei, dst, {1, 1},
                                        {pad, pad}, {pad, pad}),
        eng);
    const double flops = 2.0 * mb * cs.c_out * cs.hw * cs.hw * cs.c_in * cs.k * cs.k;
    Ceiling& ce = out.emplace_back();
    ce.primitive = "conv";
    ce.shape = "8x" + std::to_string(cs.c_in) + "x" + std::to_string(cs.hw) + "x" +
               std::to_string(cs.hw) + ", " + std::to_string(cs.k) + "x" + std::to_string(cs.k) +
               " -> " + std::to_string(cs.c_out);
    ce.gflops = time_primitive(dnnl::convolution_forward(pd), src, pd.weights_desc(), dst, flops,
                               &ce.beside);
  }
  return out;
}

std::string PeakCell(const PeakBeside& b) { return b.gflops > 0 ? Fmt("%.1f", b.gflops) : "—"; }
std::string PercentCell(const PeakBeside& b) {
  return b.fraction > 0 ? Fmt("%.0f%%", 100 * b.fraction) : "—";
}

void PrintCeiling(const std::vector<Ceiling>& ceiling) {
  std::printf(
      "\noneDNN alone on the models' largest shapes (same threads and timing rule, this run): "
      "what the library reaches here, beside the models' %% of peak above.\n\n"
      "| primitive | shape | GFLOP/s | FMA peak beside | %% of peak |\n|---|---|---|---|---|\n");
  for (const Ceiling& c : ceiling) {
    std::printf("| %s | %s | %.1f | %s | %s |\n", c.primitive.c_str(), c.shape.c_str(), c.gflops,
                PeakCell(c.beside).c_str(), PercentCell(c.beside).c_str());
  }
}

// ---- Models and inputs ---------------------------------------------------------------

// Estimated FLOPs per sample from InspectModel's report; 0 when unknown.
double FlopsPerSample(const std::string& path) {
  auto report = InspectModel(path);
  if (!report.ok()) return 0;
  const std::string key = "estimated FLOPs per sample: ";
  size_t at = report->find(key);
  if (at == std::string::npos) return 0;
  size_t open = report->find('(', at), close = report->find(')', at);
  if (open == std::string::npos || close == std::string::npos) return 0;
  return std::atof(report->substr(open + 1, close - open - 1).c_str());
}

// Random inputs at `batch`: floats ~ N(0, 1); integer inputs 1 (valid token / row ids and
// an all-ones attention mask); bools true.
StatusOr<std::vector<NamedTensor>> MakeInputs(const Model& model, int batch, std::mt19937& rng) {
  std::vector<NamedTensor> out;
  std::normal_distribution<float> normal;
  for (const TensorInfo& in : model.inputs()) {
    if (!in.rank_known) return InvalidArgument("input " + in.name + " has unknown rank");
    Shape shape;
    for (size_t i = 0; i < in.shape.size(); ++i) {
      const Dim& d = in.shape[i];
      if (d.known())
        shape.push_back(d.value);
      else if (i == 0)
        shape.push_back(batch);
      else
        return InvalidArgument("input " + in.name + " has a symbolic dimension other than batch");
    }
    Tensor t = Tensor::Allocate(in.dtype, shape);
    switch (in.dtype) {
      case DataType::kFp32:
        for (float& v : t.mutable_values<float>()) v = normal(rng);
        break;
      case DataType::kInt64:
        for (int64_t& v : t.mutable_values<int64_t>()) v = 1;
        break;
      case DataType::kInt32:
        for (int32_t& v : t.mutable_values<int32_t>()) v = 1;
        break;
      case DataType::kBool:
        for (bool& v : t.mutable_values<bool>()) v = true;
        break;
      default:
        return InvalidArgument("input " + in.name + ": unsupported dtype " +
                               std::string(DataTypeName(in.dtype)));
    }
    out.push_back({in.name, std::move(t)});
  }
  return out;
}

// The SHT1 tensor files models/generate.py writes (as engine/test_util.cc reads them).
StatusOr<std::vector<NamedTensor>> ReadTensorFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  auto take = [&](void* dst, size_t n) -> bool {
    if (pos + n > data.size()) return false;
    std::memcpy(dst, data.data() + pos, n);
    pos += n;
    return true;
  };
  char magic[4];
  uint32_t count = 0;
  if (!take(magic, 4) || std::memcmp(magic, "SHT1", 4) != 0 || !take(&count, 4))
    return InvalidArgument(path + ": not a tensor file");
  std::vector<NamedTensor> out;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t name_len = 0, dtype = 0, rank = 0;
    uint64_t bytes = 0;
    if (!take(&name_len, 4) || name_len > 4096) return InvalidArgument(path + ": truncated");
    std::string name(name_len, '\0');
    if (!take(name.data(), name_len) || !take(&dtype, 4) || !take(&rank, 4) || rank > 12)
      return InvalidArgument(path + ": truncated");
    Shape shape(rank);
    if (!take(shape.data(), 8 * rank) || !take(&bytes, 8) || pos + bytes > data.size())
      return InvalidArgument(path + ": truncated");
    Tensor t = Tensor::Allocate(static_cast<DataType>(dtype), shape, bytes);
    take(t.mutable_data(), bytes);
    out.push_back({name, std::move(t)});
  }
  return out;
}

// Rows [begin, end) as a tensor of its own.
StatusOr<Tensor> Rows(const Tensor& t, int64_t begin, int64_t end) {
  auto view = t.SliceRows(begin, end);
  if (!view.ok()) return view.status();
  Tensor copy = Tensor::Allocate(view->dtype(), view->shape());
  std::memcpy(copy.mutable_data(), view->data(), view->byte_size());
  return copy;
}

// The inputs the server times a tier at (ServedTierTimingInputs), from the first
// calibration batch cut to kCalibBatchRows rows (the backend's calibration batch when the
// config sets no max_batch_size).
StatusOr<std::vector<std::vector<NamedTensor>>> ServedTimingInputs(
    const Model& fp32, const std::vector<NamedTensor>& calibration) {
  std::vector<NamedTensor> batch;
  for (const NamedTensor& in : calibration) {
    const Shape& shape = in.tensor.shape();
    if (!fp32.batch_dim_symbolic() || shape.empty() || shape[0] <= kCalibBatchRows) {
      batch.push_back(in);
      continue;
    }
    ASSIGN_OR_RETURN(Tensor t, Rows(in.tensor, 0, kCalibBatchRows));
    batch.push_back({in.name, std::move(t)});
  }
  return ServedTierTimingInputs(fp32, {batch});
}

// One variant's timed runs at one batch size: Prepare warms the session up (the first run
// prepares the plan) and sizes a run to MIN_SECONDS; each Run is one timed run.
class BatchTimer {
 public:
  BatchTimer(Session& session, const std::vector<NamedTensor>& inputs, int batch)
      : session_(session), inputs_(inputs), batch_(batch) {}

  bool Prepare(const Options& o) {
    if (!Call() || !Call()) return false;
    const auto t0 = std::chrono::steady_clock::now();
    if (!Call()) return false;
    const double per_call = std::max(Seconds(t0, std::chrono::steady_clock::now()), 1e-6);
    iters_ = std::max(1, static_cast<int>(o.min_seconds / per_call + 0.999));
    return true;
  }
  // items/s of one timed run; 0 on failure (see error()).
  double Run() {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters_; ++i)
      if (!Call()) return 0;
    return batch_ * iters_ / Seconds(start, std::chrono::steady_clock::now());
  }
  const std::string& error() const { return error_; }

 private:
  bool Call() {
    outputs_.clear();
    Status s = session_.Run(inputs_, &outputs_);
    if (!s.ok()) error_ = s.ToString();
    return s.ok();
  }
  Session& session_;
  const std::vector<NamedTensor>& inputs_;
  int batch_;
  int iters_ = 1;
  std::vector<NamedTensor> outputs_;
  std::string error_;
};

// Times every loaded variant at batch kBatches[i], interleaved: each of RUNS rounds does
// one timed run of every variant in turn, starting one variant later each round (direct
// fp32 always right after a probe of the FMA peak), so a slow minute of the shared
// machine falls on every variant alike and the ratios between variants do not carry it.
// Each variant's figure is its median run.
void TimeVariants(ModelResult& m, std::unique_ptr<Session> (&sessions)[kNumVariants],
                  const std::vector<NamedTensor>& inputs, int i, const Options& o,
                  const FmaProbe& probe) {
  std::vector<std::unique_ptr<BatchTimer>> timers(kNumVariants);
  std::vector<double> rates[kNumVariants], peaks, gflops;
  for (int t = 0; t < kNumVariants; ++t) {
    if (!sessions[t]) continue;
    timers[t] = std::make_unique<BatchTimer>(*sessions[t], inputs, kBatches[i]);
    if (!timers[t]->Prepare(o)) {
      m.tiers[t].error[i] = timers[t]->error();
      timers[t].reset();
    }
  }
  for (int r = 0; r < o.runs; ++r) {
    for (int k = 0; k < kNumVariants; ++k) {
      // Each round starts one variant later, so that no variant always follows the same
      // one (or the probe): what a run leaves behind falls on each in turn.
      const int t = (r + k) % kNumVariants;
      if (!timers[t]) continue;
      if (t == 0) peaks.push_back(probe.Measure(kProbeSeconds));
      const double rate = timers[t]->Run();
      if (rate <= 0) {
        m.tiers[t].error[i] = timers[t]->error();
        timers[t].reset();
        continue;
      }
      rates[t].push_back(rate);
      if (t == 0) gflops.push_back(rate * m.flops / 1e9);
    }
  }
  for (int t = 0; t < kNumVariants; ++t) {
    TierResult& tr = m.tiers[t];
    if (!tr.available) continue;
    if (timers[t]) tr.items_per_s[i] = Median(rates[t]);
    if (tr.items_per_s[i] == 0 && tr.error[i].empty()) tr.error[i] = "no figure";
    std::fprintf(
        stderr, "%s: %s batch %d: %s\n", m.model.c_str(), kVariants[t].name, kBatches[i],
        tr.error[i].empty() ? Fmt("%.2f items/s", tr.items_per_s[i]).c_str() : tr.error[i].c_str());
  }
  if (timers[0] && m.flops > 0) m.tiers[0].beside[i] = Pair(gflops, peaks);
}

// What one model is benchmarked on: timing inputs per batch, calibration batches, held-out
// batches, and (trained classifiers) the held-out labels.
struct Workload {
  std::vector<NamedTensor> timing[2];
  std::vector<std::vector<NamedTensor>> calibration;
  std::vector<std::vector<NamedTensor>> held_out;
  Tensor labels;  // int64 [rows of held_out, in order]; empty when there are none
};

Status RandomWorkload(const Model& model, const Options& o, Workload* w) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_RETURN(w->timing[i], MakeInputs(model, kBatches[i], rng));
  }
  w->calibration.push_back(w->timing[1]);
  for (int i = 1; i < o.calib_batches; ++i) {
    ASSIGN_OR_RETURN(auto b, MakeInputs(model, kCalibBatchRows, rng));
    w->calibration.push_back(std::move(b));
  }
  std::mt19937 held(5678);
  for (int i = 0; i < o.acc_batches; ++i) {
    ASSIGN_OR_RETURN(auto b, MakeInputs(model, kCalibBatchRows, held));
    w->held_out.push_back(std::move(b));
  }
  return Status::Ok();
}

Status LabelledWorkload(const Model& model, const std::string& sht, Workload* w) {
  ASSIGN_OR_RETURN(auto tensors, ReadTensorFile(sht));
  Tensor images, labels;
  for (auto& t : tensors) {
    if (t.name == "in:image") images = t.tensor;
    if (t.name == "labels") labels = t.tensor;
  }
  if (images.shape().empty() || labels.shape().empty())
    return InvalidArgument(sht + " lacks in:image or labels");
  if (model.inputs().size() != 1)
    return InvalidArgument("a labelled classifier should have one input");
  const std::string input = model.inputs()[0].name;
  const int64_t n = images.shape()[0];
  if (n <= kLabelledCalibImages) return InvalidArgument(sht + ": too few images");
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_RETURN(Tensor t,
                     Rows(images, kLabelledCalibImages, kLabelledCalibImages + kBatches[i]));
    w->timing[i] = {{input, std::move(t)}};
  }
  ASSIGN_OR_RETURN(Tensor calib, Rows(images, 0, kLabelledCalibImages));
  w->calibration.push_back({{input, std::move(calib)}});
  ASSIGN_OR_RETURN(Tensor rest, Rows(images, kLabelledCalibImages, n));
  w->held_out.push_back({{input, std::move(rest)}});
  ASSIGN_OR_RETURN(w->labels, Rows(labels, kLabelledCalibImages, n));
  return Status::Ok();
}

// Rows of each model's first output summed over `batches`, as "fp32 N, <tier> M rows of
// '<output>'": a detector's outputs have one row per kept detection, so a tier that keeps
// other detections than fp32 differs in shape and CompareTiers cannot compare it
// element by element; the counts say by how much the kept sets differ.
StatusOr<std::string> RowCounts(const Model& reference, const Model& variant,
                                const std::string& tier, const Options& o,
                                const std::vector<std::vector<NamedTensor>>& batches) {
  SessionOptions so;
  so.threads = o.threads;
  int64_t rows[2] = {0, 0};
  std::string output;
  const Model* models[2] = {&reference, &variant};
  for (int m = 0; m < 2; ++m) {
    ASSIGN_OR_RETURN(auto session, Session::Create(*models[m], so));
    for (const auto& batch : batches) {
      std::vector<NamedTensor> out;
      RETURN_IF_ERROR(session->Run(batch, &out));
      if (out.empty() || out[0].tensor.shape().empty()) return Internal("no rows to count");
      output = out[0].name;
      rows[m] += out[0].tensor.shape()[0];
    }
  }
  return "fp32 " + std::to_string(rows[0]) + ", " + tier + " " + std::to_string(rows[1]) +
         " rows of '" + output + "' (outputs differ in shape: no element-wise diff)";
}

// Top-1 accuracy of `model`'s first output against `labels` over `batches`.
StatusOr<double> LabelAccuracy(const Model& model, const Options& o,
                               const std::vector<std::vector<NamedTensor>>& batches,
                               const Tensor& labels) {
  SessionOptions so;
  so.threads = o.threads;
  ASSIGN_OR_RETURN(auto session, Session::Create(model, so));
  auto truth = labels.values<int64_t>();
  size_t row = 0, correct = 0;
  for (const auto& batch : batches) {
    std::vector<NamedTensor> out;
    RETURN_IF_ERROR(session->Run(batch, &out));
    const Tensor& logits = out[0].tensor;
    if (logits.shape().size() != 2) return Internal("logits are not [batch, classes]");
    const int64_t rows = logits.shape()[0], c = logits.shape()[1];
    auto v = logits.values<float>();
    for (int64_t r = 0; r < rows; ++r, ++row) {
      if (row >= truth.size()) return Internal("more rows than labels");
      auto best =
          std::max_element(v.begin() + r * c, v.begin() + (r + 1) * c) - (v.begin() + r * c);
      correct += best == truth[row];
    }
  }
  if (row != truth.size()) return Internal("fewer rows than labels");
  return static_cast<double>(correct) / static_cast<double>(row);
}

ModelResult BenchModel(const std::string& name, const Options& o, const FmaProbe& probe) {
  ModelResult m;
  m.model = name;
  const bool labelled = Labelled(name);
  const fs::path folder = name == "digits" ? fs::path(o.models_dir) : fs::path(o.dir);
  const std::string path = (folder / (name + ".onnx")).string();
  if (!fs::exists(path)) {
    m.error = "missing " + path;
    return m;
  }
  try {
    m.flops = FlopsPerSample(path);
    // Every variant's model and session, kept until the timing (sessions before models:
    // a session must not outlive its model).
    std::unique_ptr<Model> models[kNumVariants];
    std::unique_ptr<Session> sessions[kNumVariants];
    Workload w;
    for (int t = 0; t < kLoadedVariants; ++t) {
      const Precision p = kVariants[t].precision;
      const std::string tier(kVariants[t].name);
      const bool reference = t == 0;  // direct fp32: every variant is compared with it
      TierResult& tr = m.tiers[t];
      if (!reference && std::find(o.tiers.begin(), o.tiers.end(), tier) == o.tiers.end()) {
        tr.note = "not run (--tiers)";
        continue;
      }
      // Winograd and channels-last change convolutions only: a model without any would
      // time a second copy of its fp32 plan.
      if (!reference && kVariants[t].precision == Precision::kFp32 &&
          std::none_of(models[0]->graph().nodes.begin(), models[0]->graph().nodes.end(),
                       [](const Node& n) { return n.op_type.find("Conv") != std::string::npos; })) {
        tr.note = "no convolutions";
        continue;
      }
      Status check = CheckPrecision(p);
      if (!check.ok()) {
        tr.note = p == Precision::kBf16 ? "n/a (no AVX512_BF16)" : OneLine(check.ToString());
        continue;
      }
      LoadOptions lo = reference ? LoadOptions{} : models[0]->options();
      lo.plan.precision = p;
      lo.plan.conv_algorithm = kVariants[t].conv;
      lo.plan.conv_layout = kVariants[t].layout;
      if (p == Precision::kInt8) {
        auto cal = Calibrate(*models[0], w.calibration);
        if (!cal.ok()) {
          tr.note = "calibration: " + OneLine(cal.status().ToString());
          continue;
        }
        lo.plan.calibration = std::make_shared<const Calibration>(std::move(*cal));
      }
      auto load_start = std::chrono::steady_clock::now();
      StatusOr<std::unique_ptr<Model>> loaded = InvalidArgument("not loaded");
      if (RawOf(t) >= 0) {
        // As the server loads a tier: timed against fp32 at batch 1 and at a calibration
        // batch of 8 rows (the backend's default calibration batch), on one thread.
        auto timed = ServedTimingInputs(*models[0], w.calibration.front());
        loaded = timed.status();
        if (timed.ok()) {
          auto sel = LoadServedTier(*models[0], path, lo, *timed);
          if (sel.ok()) {
            tr.selected = true;
            tr.fp32_nodes = static_cast<int>(sel->fp32_nodes.size());
            tr.candidates = sel->candidates;
            tr.selection = sel->ToString(p);
            std::fprintf(stderr, "%s: %s as served: %s\n", name.c_str(), tier.c_str(),
                         tr.selection.c_str());
            loaded = std::move(sel->model);
          } else {
            loaded = sel.status();
          }
        }
      } else {
        loaded = Model::Load(path, lo);
      }
      if (!loaded.ok()) {
        tr.note = "load: " + OneLine(loaded.status().ToString());
        if (reference) {
          m.error = tr.note;
          return m;
        }
        continue;
      }
      models[t] = std::move(*loaded);  // held before any session is made from it
      const Model* model = models[t].get();
      tr.load_s = Seconds(load_start, std::chrono::steady_clock::now());
      tr.available = true;
      if (reference) {
        m.optimize_summary = model->optimize_report().Summary();
        Status ws = labelled
                        ? LabelledWorkload(*model, (folder / (name + ".test.sht")).string(), &w)
                        : RandomWorkload(*model, o, &w);
        if (!ws.ok()) {
          m.error = "inputs: " + OneLine(ws.ToString());
          return m;
        }
        if (labelled) m.label_samples = static_cast<int>(w.labels.shape()[0]);
      }
      std::fprintf(stderr, "%s: %s loaded in %.1f s, %.3g GFLOP per sample\n", name.c_str(),
                   tier.c_str(), tr.load_s, m.flops / 1e9);
      SessionOptions so;
      so.threads = o.threads;
      auto session = Session::Create(*model, so);
      if (session.ok()) {
        sessions[t] = std::move(*session);
      } else {
        tr.error[0] = tr.error[1] = "session: " + session.status().ToString();
      }
      const int raw = RawOf(t);
      if (raw >= 0 && tr.fp32_nodes > 0) {
        // The selection kept some operators fp32: the whole tier too, timed beside it.
        TierResult& rr = m.tiers[raw];
        auto whole = Model::Load(path, lo);
        if (whole.ok()) {
          models[raw] = std::move(*whole);
          rr.available = true;
          auto rs = Session::Create(*models[raw], so);
          if (rs.ok())
            sessions[raw] = std::move(*rs);
          else
            rr.error[0] = rr.error[1] = "session: " + rs.status().ToString();
        } else {
          rr.note = "load: " + OneLine(whole.status().ToString());
        }
      }
      if (!reference) {
        auto acc = CompareTiers(*models[0], *model, w.held_out);
        if (acc.ok()) {
          tr.compared = true;
          tr.accuracy = *acc;
          std::fprintf(stderr, "%s: %s vs fp32: %s\n", name.c_str(), tier.c_str(),
                       acc->ToString().c_str());
        } else {
          tr.accuracy_error = OneLine(acc.status().ToString());
          if (acc.status().message().find("differs in shape") != std::string::npos) {
            auto rows = RowCounts(*models[0], *model, tier, o, w.held_out);
            if (rows.ok()) {
              tr.row_counts = *rows;
              tr.accuracy_error.clear();
            }
          }
        }
      }
      if (labelled) {
        auto a = LabelAccuracy(*model, o, w.held_out, w.labels);
        if (a.ok()) {
          tr.label_accuracy = *a;
          std::fprintf(stderr, "%s: %s top-1 accuracy %.2f%%\n", name.c_str(), tier.c_str(),
                       100 * *a);
        } else {
          tr.accuracy_error = OneLine(a.status().ToString());
        }
      }
    }
    for (int t = 0; t < kNumVariants && o.profile_runs > 0; ++t) {
      if (!models[t]) continue;
      for (int i = 0; i < 2; ++i) {
        SessionOptions so;
        so.threads = o.threads;
        auto prof = ProfileOperators(*models[t], w.timing[i], o.profile_runs, so);
        if (!prof.ok()) {
          std::fprintf(stderr, "%s: %s batch %d: profile: %s\n", name.c_str(), kVariants[t].name,
                       kBatches[i], prof.status().ToString().c_str());
          continue;
        }
        std::fprintf(stderr, "%s: %s batch %d: %.3f ms per run:", name.c_str(), kVariants[t].name,
                     kBatches[i], prof->ms_per_run);
        for (const OperatorTime& op : prof->operators)
          if (op.ms_per_run >= 0.01 * prof->ms_per_run)
            std::fprintf(stderr, " %s(%d) %.3f;", op.op_type.c_str(), op.nodes, op.ms_per_run);
        std::fprintf(stderr, " outside %.3f\n", prof->outside_ms_per_run);
        // The slowest nodes, by name, so that a tier's slower ones can be told apart.
        const auto& nodes = models[t]->graph().nodes;
        std::vector<size_t> order(prof->node_ms.size());
        for (size_t n = 0; n < order.size(); ++n) order[n] = n;
        std::sort(order.begin(), order.end(),
                  [&](size_t a, size_t b) { return prof->node_ms[a] > prof->node_ms[b]; });
        std::fprintf(stderr, "  slowest:");
        for (size_t n = 0; n < std::min<size_t>(order.size(), 12) && n < nodes.size(); ++n)
          std::fprintf(stderr, " %s %.3f;", nodes[order[n]].name.c_str(), prof->node_ms[order[n]]);
        std::fprintf(stderr, "\n");
      }
    }
    // Timed once every variant is loaded, so that their runs can interleave.
    for (int i = 0; i < 2; ++i) TimeVariants(m, sessions, w.timing[i], i, o, probe);
    for (int i = 0; i < 2 && sessions[0]; ++i) {
      std::vector<Shape> shapes;
      for (const auto& in : w.timing[i]) shapes.push_back(in.tensor.shape());
      auto stats = sessions[0]->PlanStats(shapes);
      if (stats.ok()) {
        m.mem[i].ok = true;
        m.mem[i].stats = *stats;
      } else {
        m.mem[i].error = OneLine(stats.status().ToString());
      }
    }
  } catch (const std::exception& e) {
    m.notes.push_back(std::string("exception: ") + e.what());
  }
  return m;
}

}  // namespace
namespace {

// PyTorch's figures: "model\tbatch\titems/s" or "model\tnote\ttext" per line.
struct Peer {
  std::map<std::pair<std::string, int>, double> items_per_s;
  std::map<std::string, std::string> notes;
};

Peer ReadPeer(const std::string& path) {
  Peer peer;
  if (path.empty()) return peer;
  std::ifstream in(path);
  if (!in) std::fprintf(stderr, "warning: cannot read %s\n", path.c_str());
  for (std::string line; std::getline(in, line);) {
    auto f = Split(line, '\t');
    if (f.size() < 3) continue;
    if (f[1] == "note")
      peer.notes[f[0]] = f[2];
    else
      peer.items_per_s[{f[0], std::atoi(f[1].c_str())}] = std::atof(f[2].c_str());
  }
  return peer;
}

std::string Cell(const TierResult& t, int i) {
  if (!t.available) return t.note.empty() ? "—" : t.note;
  if (!t.error[i].empty()) return "failed: " + OneLine(t.error[i]);
  return Fmt("%.2f", t.items_per_s[i]);
}

// items/s of served tier `t`'s raw variant at kBatches[i]: its own figure where it was
// timed, the served figure where the selection kept nothing fp32 (the same plan); else 0.
double RawRate(const ModelResult& m, int t, int i) {
  const TierResult& served = m.tiers[t];
  const TierResult& raw = m.tiers[RawOf(t)];
  if (raw.available) return raw.error[i].empty() ? raw.items_per_s[i] : 0;
  if (served.available && served.selected && served.fp32_nodes == 0 && served.error[i].empty())
    return served.items_per_s[i];
  return 0;
}

std::string Ratio(double a, double b) { return a > 0 && b > 0 ? Fmt("%.2f", a / b) : "—"; }

std::string MiB(int64_t bytes) {
  const double v = static_cast<double>(bytes) / (1024.0 * 1024.0);
  return Fmt(v >= 10 ? "%.1f" : "%.3g", v);
}

void PrintTables(const std::vector<ModelResult>& all, const Peer& peer, const Peak& peak) {
  std::printf(
      "FMA peak (measured, %s): %.1f GFLOP/s at the start of the run (median of 3). %% of peak "
      "is against the peak probed beside each timed run instead (FMA peak beside: the median "
      "probe; %% of peak: the median over runs of the run's GFLOP/s over its probe, which can "
      "differ from the ratio of the two medians).\n\n",
      peak.isa.c_str(), peak.gflops);
  std::printf(
      "bf16 and int8 are the tiers as the server serves them: loaded with the load-time "
      "selection (engine/precision.h: operators the tier does not make faster stay fp32). raw: "
      "the same tier with every convolution and product in it, timed beside it where the "
      "selection kept some fp32 (else the same plan and figure).\n\n");
  std::printf(
      "| model | batch | PyTorch items/s | shoal fp32 items/s | fp32/PyTorch | fp32 GFLOP/s | FMA "
      "peak beside | %% of peak | bf16 items/s | bf16/fp32 | bf16 raw/fp32 | int8 items/s | "
      "int8/fp32 | int8 raw/fp32 | winograd items/s | winograd/fp32 | channels-last items/s | "
      "channels-last/fp32 | notes |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const ModelResult& m : all) {
    for (int i = 0; i < 2; ++i) {
      const int b = kBatches[i];
      auto it = peer.items_per_s.find({m.model, b});
      const double pt = it == peer.items_per_s.end() ? 0 : it->second;
      std::vector<std::string> notes = m.notes;
      if (i == 0 && peer.notes.count(m.model))
        notes.push_back("PyTorch: " + peer.notes.at(m.model));
      if (Labelled(m.model) && i == 0) notes.push_back("PyTorch not timed (trained model)");
      if (!m.error.empty()) {
        std::printf("| %s | %d | %s | failed: %s | | | | | | | | | | | | | | | |\n",
                    m.model.c_str(), b, pt > 0 ? Fmt("%.2f", pt).c_str() : "—",
                    OneLine(m.error).c_str());
        continue;
      }
      const TierResult &f = m.tiers[0], &h = m.tiers[1], &q = m.tiers[2], &wg = m.tiers[3],
                       &cl = m.tiers[4];
      const double fr = f.available && f.error[i].empty() ? f.items_per_s[i] : 0;
      const double hr = h.available && h.error[i].empty() ? h.items_per_s[i] : 0;
      const double qr = q.available && q.error[i].empty() ? q.items_per_s[i] : 0;
      const double wr = wg.available && wg.error[i].empty() ? wg.items_per_s[i] : 0;
      const double cr = cl.available && cl.error[i].empty() ? cl.items_per_s[i] : 0;
      const double gf = fr * m.flops / 1e9;
      if (i == 0) {
        for (int t : {1, 2}) {
          const TierResult& tr = m.tiers[t];
          if (tr.selected && tr.fp32_nodes > 0)
            notes.push_back(std::string(kVariants[t].name) + " keeps " +
                            std::to_string(tr.fp32_nodes) + " of " + std::to_string(tr.candidates) +
                            " convolutions and products fp32");
        }
      }
      std::string joined;
      for (const auto& n : notes) joined += (joined.empty() ? "" : "; ") + OneLine(n);
      const bool timed = gf > 0;
      std::printf(
          "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | "
          "%s | %s |\n",
          m.model.c_str(), b, pt > 0 ? Fmt("%.2f", pt).c_str() : "—", Cell(f, i).c_str(),
          Ratio(fr, pt).c_str(), timed ? Fmt("%.1f", gf).c_str() : "—",
          timed ? PeakCell(f.beside[i]).c_str() : "—",
          timed ? PercentCell(f.beside[i]).c_str() : "—", Cell(h, i).c_str(), Ratio(hr, fr).c_str(),
          Ratio(RawRate(m, 1, i), fr).c_str(), Cell(q, i).c_str(), Ratio(qr, fr).c_str(),
          Ratio(RawRate(m, 2, i), fr).c_str(), Cell(wg, i).c_str(), Ratio(wr, fr).c_str(),
          Cell(cl, i).c_str(), Ratio(cr, fr).c_str(), joined.c_str());
    }
  }

  // Issue 5's targets, checked on this run's figures.
  auto find = [&](const std::string& name) -> const ModelResult* {
    for (const ModelResult& m : all)
      if (m.model == name && m.error.empty()) return &m;
    return nullptr;
  };
  auto rate = [](const TierResult& t, int i) {
    return t.available && t.error[i].empty() ? t.items_per_s[i] : 0.0;
  };
  std::printf("\nTargets (batch 8):");
  for (const char* name : {"resnet50", "bert_base"}) {
    const ModelResult* m = find(name);
    if (!m || rate(m->tiers[0], 1) <= 0 || m->tiers[0].beside[1].fraction <= 0) continue;
    const double frac = m->tiers[0].beside[1].fraction;
    std::printf(" %s fp32 %.0f%% of peak (>= 85%%: %s);", name, 100 * frac,
                frac >= 0.85 ? "met" : "not met");
  }
  for (const char* classifier : {"image_classifier", "digits"}) {
    const ModelResult* d = find(classifier);
    if (!d) continue;
    const double f = rate(d->tiers[0], 1);
    for (int t = 1; t < 3; ++t) {
      const double want = t == 1 ? 1.6 : 2.5, r = f > 0 ? rate(d->tiers[t], 1) / f : 0;
      const double change = d->tiers[t].label_accuracy >= 0 && d->tiers[0].label_accuracy >= 0
                                ? 100 * (d->tiers[t].label_accuracy - d->tiers[0].label_accuracy)
                                : 1e9;
      std::printf(" %s %s %.2fx fp32 (>= %.1fx: %s), top-1 %+.2f pp (<= 1 pp: %s);", classifier,
                  kVariants[t].name, r, want, r >= want ? "met" : "not met",
                  change < 1e8 ? change : 0.0, std::fabs(change) <= 1 ? "met" : "not met");
    }
  }
  std::printf("\n");
  // Issue 21: no tier, as served, slower than fp32 on any model at batch 1 or 8.
  std::string slower;
  int served = 0;
  for (const ModelResult& m : all) {
    if (!m.error.empty()) continue;
    for (int t : {1, 2}) {
      for (int i = 0; i < 2; ++i) {
        const double f = rate(m.tiers[0], i), v = rate(m.tiers[t], i);
        if (f <= 0 || v <= 0) continue;
        ++served;
        if (v < f)
          slower += " " + m.model + " " + kVariants[t].name + " batch " +
                    std::to_string(kBatches[i]) + Fmt(" %.2fx;", v / f);
      }
    }
  }
  if (served > 0)
    std::printf("Served tiers below fp32 (of %d timed, batch 1 and 8):%s\n", served,
                slower.empty() ? " none" : slower.c_str());

  std::printf(
      "\nMemory (fp32 plan): the arena planned vs the liveness bound (most bytes live at one "
      "step)\n\n"
      "| model | planned MiB (b1 / b8) | liveness bound MiB (b1 / b8) | planned/bound (b1 / b8) "
      "| no-reuse MiB (b8) | in-place steps (b1 / b8) |\n|---|---|---|---|---|---|\n");
  for (const ModelResult& m : all) {
    if (!m.error.empty()) continue;
    const MemResult &a = m.mem[0], &b = m.mem[1];
    if (!a.ok || !b.ok) {
      std::printf("| %s | failed: %s | | | | |\n", m.model.c_str(),
                  (a.ok ? b.error : a.error).c_str());
      continue;
    }
    std::printf("| %s | %s / %s | %s / %s | %s / %s | %s | %d / %d |\n", m.model.c_str(),
                MiB(a.stats.planned_bytes).c_str(), MiB(b.stats.planned_bytes).c_str(),
                MiB(a.stats.liveness_bound_bytes).c_str(),
                MiB(b.stats.liveness_bound_bytes).c_str(),
                Ratio(static_cast<double>(a.stats.planned_bytes),
                      static_cast<double>(a.stats.liveness_bound_bytes))
                    .c_str(),
                Ratio(static_cast<double>(b.stats.planned_bytes),
                      static_cast<double>(b.stats.liveness_bound_bytes))
                    .c_str(),
                MiB(b.stats.no_reuse_bytes).c_str(), a.stats.inplace_count, b.stats.inplace_count);
  }

  std::printf(
      "\nAccuracy of each tier (and of Winograd and channels-last) vs direct fp32 on held-out "
      "inputs (random models: "
      "the benchmark's random "
      "inputs, another seed; int8 calibrated on the timing inputs). Trained classifiers (digits, "
      "image_classifier): top-1 accuracy against the labels of held-out images (int8 calibrated "
      "on the first %d)\n\n"
      "| model | tier | samples | max \\|diff\\| vs fp32 | top-1 agreement | top-1 accuracy | "
      "change vs fp32 |\n|---|---|---|---|---|---|---|\n",
      kLabelledCalibImages);
  for (const ModelResult& m : all) {
    if (!m.error.empty()) continue;
    for (int t = 0; t < kLoadedVariants; ++t) {
      const TierResult& tr = m.tiers[t];
      const std::string tier(kVariants[t].name);
      if (!tr.available) {
        std::printf("| %s | %s | %s | | | | |\n", m.model.c_str(), tier.c_str(), tr.note.c_str());
        continue;
      }
      std::string samples = "—", diff = "—", agree = "—", acc = "—", change = "—";
      if (t == 0) {
        diff = "(reference)";
      } else if (tr.compared) {
        samples = std::to_string(tr.accuracy.samples);
        diff = Fmt("%.3g", tr.accuracy.max_abs_diff);
        agree = tr.accuracy.top1_agreement >= 0 ? Fmt("%.1f%%", 100 * tr.accuracy.top1_agreement)
                                                : "n/a (not a classifier)";
      }
      if (tr.label_accuracy >= 0) {
        samples = std::to_string(m.label_samples);
        acc = Fmt("%.2f%%", 100 * tr.label_accuracy);
        if (t > 0 && m.tiers[0].label_accuracy >= 0)
          change = Fmt("%+.2f pp", 100 * (tr.label_accuracy - m.tiers[0].label_accuracy));
      }
      if (!tr.row_counts.empty()) diff = tr.row_counts;
      if (!tr.accuracy_error.empty()) diff = "failed: " + tr.accuracy_error;
      std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", m.model.c_str(), tier.c_str(),
                  samples.c_str(), diff.c_str(), agree.c_str(), acc.c_str(), change.c_str());
    }
  }
}

void WriteJson(const std::string& path, const std::vector<ModelResult>& all, const Options& o,
               const Peak& peak, const std::vector<Ceiling>& ceiling) {
  std::ofstream j(path);
  j << "{\"threads\": " << o.threads << ", \"fma_isa\": \"" << peak.isa
    << "\", \"fma_peak_gflops\": " << peak.gflops << ",\n \"onednn_alone\": [";
  for (size_t i = 0; i < ceiling.size(); ++i) {
    j << (i ? ", " : "") << "{\"primitive\": \"" << ceiling[i].primitive << "\", \"shape\": \""
      << ceiling[i].shape << "\", \"gflops\": " << ceiling[i].gflops
      << ", \"fma_peak_beside_gflops\": " << ceiling[i].beside.gflops
      << ", \"fraction_of_peak\": " << ceiling[i].beside.fraction << "}";
  }
  j << "],\n \"results\": [";
  bool first = true;
  for (const ModelResult& m : all) {
    for (int i = 0; i < 2; ++i) {
      const TierResult& f = m.tiers[0];
      std::string error = !m.error.empty() ? m.error : f.error[i];
      j << (first ? "\n  " : ",\n  ") << "{\"model\": \"" << JsonEscape(m.model)
        << "\", \"batch\": " << kBatches[i]
        << ", \"items_per_s\": " << (error.empty() ? f.items_per_s[i] : 0)
        << ", \"flops_per_item\": " << m.flops
        << ", \"fma_peak_beside_gflops\": " << (error.empty() ? f.beside[i].gflops : 0)
        << ", \"fraction_of_peak\": " << (error.empty() ? f.beside[i].fraction : 0)
        << ", \"error\": \"" << JsonEscape(error) << "\"";
      for (int t = 1; t < kNumVariants; ++t) {
        const TierResult& tr = m.tiers[t];
        const std::string tier(kVariants[t].name);
        const double rate = t >= kLoadedVariants ? RawRate(m, t == RawOf(1) ? 1 : 2, i)
                            : tr.available && tr.error[i].empty() ? tr.items_per_s[i]
                                                                  : 0;
        j << ", \"" << tier << "_items_per_s\": " << rate << ", \"" << tier << "_error\": \""
          << JsonEscape(tr.available ? tr.error[i] : tr.note) << "\"";
      }
      j << "}";
      first = false;
    }
  }
  j << "\n ],\n \"models\": [";
  first = true;
  for (const ModelResult& m : all) {
    j << (first ? "\n  " : ",\n  ") << "{\"model\": \"" << JsonEscape(m.model)
      << "\", \"error\": \"" << JsonEscape(m.error) << "\", \"optimize\": \""
      << JsonEscape(m.optimize_summary) << "\", \"memory\": {";
    for (int i = 0; i < 2; ++i) {
      const MemResult& mr = m.mem[i];
      j << (i ? ", " : "") << "\"" << kBatches[i] << "\": ";
      if (mr.ok)
        j << "{\"planned_bytes\": " << mr.stats.planned_bytes
          << ", \"liveness_bound_bytes\": " << mr.stats.liveness_bound_bytes
          << ", \"no_reuse_bytes\": " << mr.stats.no_reuse_bytes
          << ", \"inplace_count\": " << mr.stats.inplace_count << "}";
      else
        j << "null";
    }
    j << "}, \"tiers\": {";
    for (int t = 0; t < kNumVariants; ++t) {
      const TierResult& tr = m.tiers[t];
      j << (t ? ", " : "") << "\"" << kVariants[t].name
        << "\": {\"available\": " << (tr.available ? "true" : "false") << ", \"note\": \""
        << JsonEscape(tr.note) << "\", \"load_s\": " << tr.load_s;
      if (tr.compared)
        j << ", \"samples\": " << tr.accuracy.samples
          << ", \"max_abs_diff\": " << tr.accuracy.max_abs_diff
          << ", \"top1_agreement\": " << tr.accuracy.top1_agreement;
      if (tr.label_accuracy >= 0) j << ", \"label_accuracy\": " << tr.label_accuracy;
      if (tr.selected)
        j << ", \"fp32_nodes\": " << tr.fp32_nodes << ", \"candidates\": " << tr.candidates
          << ", \"selection\": \"" << JsonEscape(tr.selection) << "\"";
      j << ", \"accuracy_error\": \"" << JsonEscape(tr.accuracy_error) << "\"}";
    }
    j << "}}";
    first = false;
  }
  j << "\n ]}\n";
}

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: engine_benchmark --dir DIR [--models a,b,...] [--threads N] [--runs N] "
               "[--min-seconds S] [--calib-batches N] [--acc-batches N] [--models-dir DIR] "
               "[--peer FILE] [--json OUT.json] [--tiers bf16,int8,winograd,channels_last] "
               "[--profile N]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  // The engine's threads wait as they do in `shoal` (engine/omp_wait_policy.h).
  shoal::engine::ExecWithOmpWaitDefault(argv);
  Options o;
  const char* src = std::getenv("SHOAL_SOURCE_DIR");
  o.models_dir = (fs::path(src ? src : ".") / "models").string();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) Usage();
    std::string v = argv[++i];
    if (a == "--dir")
      o.dir = v;
    else if (a == "--models")
      o.models = Split(v);
    else if (a == "--threads")
      o.threads = std::atoi(v.c_str());
    else if (a == "--runs")
      o.runs = std::max(1, std::atoi(v.c_str()));
    else if (a == "--min-seconds")
      o.min_seconds = std::atof(v.c_str());
    else if (a == "--calib-batches")
      o.calib_batches = std::max(1, std::atoi(v.c_str()));
    else if (a == "--acc-batches")
      o.acc_batches = std::max(1, std::atoi(v.c_str()));
    else if (a == "--models-dir")
      o.models_dir = v;
    else if (a == "--peer")
      o.peer = v;
    else if (a == "--json")
      o.json = v;
    else if (a == "--tiers")
      o.tiers = Split(v);
    else if (a == "--profile")
      o.profile_runs = std::max(0, std::atoi(v.c_str()));
    else
      Usage();
  }
  if (o.dir.empty()) Usage();

  const FmaProbe probe(o.threads);
  const Peak peak = MeasureFmaPeak(probe);
  std::fprintf(stderr, "engine threads wait with %s\n",
               shoal::engine::CurrentOmpWaitPolicy().description.c_str());
  std::fprintf(stderr, "FMA peak (%s, %d threads, median of 3): %.1f GFLOP/s\n", peak.isa.c_str(),
               o.threads, peak.gflops);
  std::vector<Ceiling> ceiling;
  try {
    ceiling = MeasureLibraryCeiling(o, probe);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "oneDNN ceiling not measured: %s\n", e.what());
  }
  for (const Ceiling& c : ceiling)
    std::fprintf(stderr, "oneDNN %s %s: %.1f GFLOP/s\n", c.primitive.c_str(), c.shape.c_str(),
                 c.gflops);
  std::vector<ModelResult> all;
  for (const std::string& name : o.models) all.push_back(BenchModel(name, o, probe));
  PrintTables(all, ReadPeer(o.peer), peak);
  if (!ceiling.empty()) PrintCeiling(ceiling);
  if (!o.json.empty()) WriteJson(o.json, all, o, peak, ceiling);
  return 0;
}
