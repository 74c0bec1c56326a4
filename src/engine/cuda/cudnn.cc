#include "engine/cuda/cudnn.h"

#include <dlfcn.h>

#include <algorithm>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#if SHOAL_HAVE_CUDNN
#include <cudnn.h>
#endif

namespace shoal::engine::cuda {

Status CheckCudnnConv(const CudnnConvOptions& o) {
  const Window2d& g = o.window;
  RETURN_IF_ERROR(CheckWindow(g));
  if (o.m < 1 || o.m % g.groups != 0)
    return InvalidArgument("cuDNN convolution: output channels " + std::to_string(o.m) +
                           " that the groups do not divide");
  if (g.ph != g.ph_end || g.pw != g.pw_end)
    return InvalidArgument(
        "cuDNN convolution: pads differ at the two ends of an axis (cuDNN pads both ends "
        "alike)");
  // The window's arithmetic (NodeWindow's, without ceil_mode): a convolution maps x's size
  // onto y's. A transposed one is the convolution of y's size onto x's, run backwards
  // (cuDNN's backward data), so it must map y's size back onto x's exactly.
  const int64_t from_h = o.transposed ? g.oh : g.h, from_w = o.transposed ? g.ow : g.w;
  const int64_t to_h = o.transposed ? g.h : g.oh, to_w = o.transposed ? g.w : g.ow;
  const int64_t mapped_h = (from_h + 2 * g.ph - ((g.kh - 1) * g.dh + 1)) / g.sh + 1;
  const int64_t mapped_w = (from_w + 2 * g.pw - ((g.kw - 1) * g.dw + 1)) / g.sw + 1;
  if (from_h + 2 * g.ph < (g.kh - 1) * g.dh + 1 || from_w + 2 * g.pw < (g.kw - 1) * g.dw + 1 ||
      mapped_h != to_h || mapped_w != to_w) {
    return InvalidArgument(
        std::string("cuDNN convolution: ") + (o.transposed ? "an input of " : "an output of ") +
        std::to_string(to_h) + "x" + std::to_string(to_w) + " where the window gives " +
        std::to_string(mapped_h) + "x" + std::to_string(mapped_w));
  }
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  for (int64_t v : {g.n, g.c, g.h, g.w, o.m, g.oh, g.ow, g.kh, g.kw, g.ph, g.pw})
    if (v > kMax) return InvalidArgument("cuDNN convolution: a size past 32 bits");
  if (g.n * g.c * g.h * g.w > kMax || g.n * o.m * g.oh * g.ow > kMax)
    return InvalidArgument("cuDNN convolution: a tensor of more than 2^31 elements");
  if (o.math == GemmMath::kInt8)
    return InvalidArgument("cuDNN convolution: int8 runs as im2col and int8 GEMMs (quantize.h)");
  if ((o.fused_bias_relu || o.residual) && o.math != GemmMath::kFp32 && o.math != GemmMath::kTf32)
    return InvalidArgument(
        "cuDNN convolution: bias, ReLU and residual fused only in fp32 and TF32");
  if (o.residual && !o.fused_bias_relu)
    return InvalidArgument("cuDNN convolution: a residual only with the fused bias and ReLU");
  if (o.transposed && o.fused_bias_relu)
    return InvalidArgument("cuDNN convolution: nothing fused into a transposed convolution");
  // (Fused convolutions run only in fp32 and TF32, above.)
  if (o.channels_last && ((o.math != GemmMath::kFp16 && o.math != GemmMath::kBf16) || o.transposed))
    return InvalidArgument(
        "cuDNN convolution: channels last only in fp16 and bf16, and not transposed");
  return Status::Ok();
}

StatusOr<size_t> PickCudnnCandidate(size_t count, CudnnAlgorithmSearch search,
                                    const std::function<StatusOr<double>(size_t)>& run,
                                    std::vector<std::pair<size_t, std::string>>* refused) {
  size_t best = count;
  double best_ms = 0;
  for (size_t i = 0; i < count; ++i) {
    StatusOr<double> ms = run(i);
    if (!ms.ok()) {
      // Refused (NOT_SUPPORTED), or its scratch did not fit: another may run.
      if (ms.status().code() != StatusCode::kUnimplemented &&
          ms.status().code() != StatusCode::kResourceExhausted)
        return ms.status();
      refused->emplace_back(i, ms.status().message());
      continue;
    }
    if (search == CudnnAlgorithmSearch::kHeuristic) return i;
    if (best == count || *ms < best_ms) {
      best = i;
      best_ms = *ms;
    }
  }
  if (best == count) return Unimplemented("no candidate ran");
  return best;
}

#if SHOAL_HAVE_CUDNN

// The entry points used, resolved by name from libcudnn.so.9.
struct Cudnn::Api {
  decltype(&cudnnGetVersion) get_version = nullptr;
  decltype(&cudnnGetErrorString) error_string = nullptr;
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnDestroy) destroy = nullptr;
  decltype(&cudnnSetStream) set_stream = nullptr;
  decltype(&cudnnCreateTensorDescriptor) create_tensor = nullptr;
  decltype(&cudnnSetTensor4dDescriptor) set_tensor = nullptr;
  decltype(&cudnnDestroyTensorDescriptor) destroy_tensor = nullptr;
  decltype(&cudnnCreateFilterDescriptor) create_filter = nullptr;
  decltype(&cudnnSetFilter4dDescriptor) set_filter = nullptr;
  decltype(&cudnnDestroyFilterDescriptor) destroy_filter = nullptr;
  decltype(&cudnnCreateConvolutionDescriptor) create_conv = nullptr;
  decltype(&cudnnSetConvolution2dDescriptor) set_conv = nullptr;
  decltype(&cudnnSetConvolutionGroupCount) set_groups = nullptr;
  decltype(&cudnnSetConvolutionMathType) set_math = nullptr;
  decltype(&cudnnDestroyConvolutionDescriptor) destroy_conv = nullptr;
  decltype(&cudnnGetConvolution2dForwardOutputDim) output_dim = nullptr;
  decltype(&cudnnGetConvolutionForwardAlgorithmMaxCount) algorithm_count = nullptr;
  decltype(&cudnnGetConvolutionForwardAlgorithm_v7) algorithms = nullptr;
  decltype(&cudnnGetConvolutionForwardWorkspaceSize) workspace_size = nullptr;
  decltype(&cudnnConvolutionForward) forward = nullptr;
  decltype(&cudnnGetConvolutionBackwardDataAlgorithmMaxCount) backward_count = nullptr;
  decltype(&cudnnGetConvolutionBackwardDataAlgorithm_v7) backward_algorithms = nullptr;
  decltype(&cudnnGetConvolutionBackwardDataWorkspaceSize) backward_workspace_size = nullptr;
  decltype(&cudnnConvolutionBackwardData) backward = nullptr;
  decltype(&cudnnConvolutionBiasActivationForward) fused_forward = nullptr;
  decltype(&cudnnCreateActivationDescriptor) create_act = nullptr;
  decltype(&cudnnSetActivationDescriptor) set_act = nullptr;
  decltype(&cudnnDestroyActivationDescriptor) destroy_act = nullptr;

  // "what: CUDNN_STATUS_...", as CudaStatus words its errors. cuDNN 9's codes come in
  // families (CUDNN_STATUS_CATEGORY): 1000 uncategorised (a sub-library that did not load,
  // a version mismatch), 2000 bad parameters, 3000 not supported (this shape, this
  // architecture), 4000 internal (allocations among them), 5000 execution failures.
  Status Check(cudnnStatus_t s, const std::string& what) const {
    if (s == CUDNN_STATUS_SUCCESS) return Status::Ok();
    const std::string text = what + ": " + error_string(s);
    if (s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
        s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
      return ResourceExhausted(text);
    switch (CUDNN_STATUS_CATEGORY(s)) {
      case 1000:
        return Unavailable(text);
      case 2000:
        return InvalidArgument(text);
      case 3000:
        return Unimplemented(text);
      default:
        return Internal(text);
    }
  }
};

StatusOr<const Cudnn*> Cudnn::Get() {
  // Loaded once; the library stays loaded for the process's life.
  static const StatusOr<const Cudnn*> loaded = []() -> StatusOr<const Cudnn*> {
    void* lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      return Unavailable(std::string("cuDNN not loaded: ") + (why ? why : "libcudnn.so.9"));
    }
    static Api api;
    std::string missing;
    auto find = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, name));
      if (!*fn) missing += std::string(missing.empty() ? "" : ", ") + name;
    };
    find(&api.get_version, "cudnnGetVersion");
    find(&api.error_string, "cudnnGetErrorString");
    find(&api.create, "cudnnCreate");
    find(&api.destroy, "cudnnDestroy");
    find(&api.set_stream, "cudnnSetStream");
    find(&api.create_tensor, "cudnnCreateTensorDescriptor");
    find(&api.set_tensor, "cudnnSetTensor4dDescriptor");
    find(&api.destroy_tensor, "cudnnDestroyTensorDescriptor");
    find(&api.create_filter, "cudnnCreateFilterDescriptor");
    find(&api.set_filter, "cudnnSetFilter4dDescriptor");
    find(&api.destroy_filter, "cudnnDestroyFilterDescriptor");
    find(&api.create_conv, "cudnnCreateConvolutionDescriptor");
    find(&api.set_conv, "cudnnSetConvolution2dDescriptor");
    find(&api.set_groups, "cudnnSetConvolutionGroupCount");
    find(&api.set_math, "cudnnSetConvolutionMathType");
    find(&api.destroy_conv, "cudnnDestroyConvolutionDescriptor");
    find(&api.output_dim, "cudnnGetConvolution2dForwardOutputDim");
    find(&api.algorithm_count, "cudnnGetConvolutionForwardAlgorithmMaxCount");
    find(&api.algorithms, "cudnnGetConvolutionForwardAlgorithm_v7");
    find(&api.workspace_size, "cudnnGetConvolutionForwardWorkspaceSize");
    find(&api.forward, "cudnnConvolutionForward");
    find(&api.backward_count, "cudnnGetConvolutionBackwardDataAlgorithmMaxCount");
    find(&api.backward_algorithms, "cudnnGetConvolutionBackwardDataAlgorithm_v7");
    find(&api.backward_workspace_size, "cudnnGetConvolutionBackwardDataWorkspaceSize");
    find(&api.backward, "cudnnConvolutionBackwardData");
    find(&api.fused_forward, "cudnnConvolutionBiasActivationForward");
    find(&api.create_act, "cudnnCreateActivationDescriptor");
    find(&api.set_act, "cudnnSetActivationDescriptor");
    find(&api.destroy_act, "cudnnDestroyActivationDescriptor");
    if (!missing.empty()) return Unavailable("cuDNN not loaded: libcudnn.so.9 lacks " + missing);
    if (api.get_version() < 90000)
      return Unavailable("cuDNN not loaded: version " + std::to_string(api.get_version()) +
                         ", shoal needs 9 or later");
    static Cudnn cudnn;
    cudnn.api_ = &api;
    return &cudnn;
  }();
  return loaded;
}

std::string Cudnn::version() const {
  const size_t v = api_->get_version();
  return std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." +
         std::to_string(v % 100);
}

StatusOr<std::unique_ptr<CudnnHandle>> CudnnHandle::Create() {
  ASSIGN_OR_RETURN(const Cudnn* cudnn, Cudnn::Get());
  std::unique_ptr<CudnnHandle> h(new CudnnHandle());
  cudnnHandle_t handle = nullptr;
  RETURN_IF_ERROR(cudnn->api().Check(cudnn->api().create(&handle), "cudnnCreate"));
  h->cudnn_ = cudnn;
  h->handle_ = handle;
  return h;
}

CudnnHandle::~CudnnHandle() {
  if (handle_) cudnn_->api().destroy(static_cast<cudnnHandle_t>(handle_));
}

namespace {

cudnnDataType_t ElementType(GemmMath math) {
  switch (math) {
    case GemmMath::kFp16:
      return CUDNN_DATA_HALF;
    case GemmMath::kBf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      return CUDNN_DATA_FLOAT;
  }
}

// The descriptors of one convolution, each made by the caller's Create and owned by it.
struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
};

// Fills `d` (created already) for `o`.
Status Describe(const Cudnn::Api& api, const CudnnConvOptions& o, const Descriptors& d) {
  const Window2d& g = o.window;
  const cudnnDataType_t type = ElementType(o.math);
  auto i = [](int64_t v) { return static_cast<int>(v); };
  // The dimensions are given as n, c, h, w in either format; NHWC lays them out channels
  // last (and a filter [m, kh, kw, c/groups]).
  const cudnnTensorFormat_t format = o.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  RETURN_IF_ERROR(api.Check(api.set_tensor(d.x, format, type, i(g.n), i(g.c), i(g.h), i(g.w)),
                            "cudnnSetTensor4dDescriptor (x)"));
  // A convolution's filter is [m, c/groups, kh, kw]; a transposed one's (ONNX's
  // ConvTranspose weight) is that of the convolution from y back to x, [c, m/groups, kh, kw].
  const int64_t filters = o.transposed ? g.c : o.m;
  const int64_t per_group = (o.transposed ? o.m : g.c) / g.groups;
  RETURN_IF_ERROR(
      api.Check(api.set_filter(d.w, type, format, i(filters), i(per_group), i(g.kh), i(g.kw)),
                "cudnnSetFilter4dDescriptor"));
  // Products and sums in fp32 in every tier (PSEUDO_HALF and PSEUDO_BFLOAT16 in 16 bits).
  RETURN_IF_ERROR(api.Check(api.set_conv(d.conv, i(g.ph), i(g.pw), i(g.sh), i(g.sw), i(g.dh),
                                         i(g.dw), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                            "cudnnSetConvolution2dDescriptor"));
  RETURN_IF_ERROR(api.Check(api.set_groups(d.conv, i(g.groups)), "cudnnSetConvolutionGroupCount"));
  // fp32: FMA kernels only (the default would allow TF32 on tensor cores).
  const cudnnMathType_t math = o.math == GemmMath::kFp32   ? CUDNN_FMA_MATH
                               : o.math == GemmMath::kTf32 ? CUDNN_DEFAULT_MATH
                                                           : CUDNN_TENSOR_OP_MATH;
  RETURN_IF_ERROR(api.Check(api.set_math(d.conv, math), "cudnnSetConvolutionMathType"));
  RETURN_IF_ERROR(api.Check(api.set_tensor(d.y, format, type, i(g.n), i(o.m), i(g.oh), i(g.ow)),
                            "cudnnSetTensor4dDescriptor (y)"));
  if (d.bias) {
    RETURN_IF_ERROR(
        api.Check(api.set_tensor(d.bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, i(o.m), 1, 1),
                  "cudnnSetTensor4dDescriptor (bias)"));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::array<int64_t, 4>> CudnnConvOutputDims(const Cudnn& cudnn,
                                                     const CudnnConvOptions& o) {
  RETURN_IF_ERROR(CheckCudnnConv(o));
  const Cudnn::Api& api = cudnn.api();
  Descriptors d;
  Status made = api.Check(api.create_tensor(&d.x), "cudnnCreateTensorDescriptor");
  if (made.ok()) made = api.Check(api.create_tensor(&d.y), "cudnnCreateTensorDescriptor");
  if (made.ok()) made = api.Check(api.create_filter(&d.w), "cudnnCreateFilterDescriptor");
  if (made.ok()) made = api.Check(api.create_conv(&d.conv), "cudnnCreateConvolutionDescriptor");
  if (made.ok()) made = Describe(api, o, d);
  int dims[4] = {};
  if (made.ok()) {
    // A transposed convolution's: the convolution from y's shape back to x's.
    made = api.Check(api.output_dim(d.conv, o.transposed ? d.y : d.x, d.w, &dims[0], &dims[1],
                                    &dims[2], &dims[3]),
                     "cudnnGetConvolution2dForwardOutputDim");
  }
  if (d.x) api.destroy_tensor(d.x);
  if (d.y) api.destroy_tensor(d.y);
  if (d.w) api.destroy_filter(d.w);
  if (d.conv) api.destroy_conv(d.conv);
  RETURN_IF_ERROR(made);
  return std::array<int64_t, 4>{dims[0], dims[1], dims[2], dims[3]};
}

namespace {

// An algorithm the heuristics ranked, with the math it runs in and the scratch it needs.
struct Candidate {
  int algorithm = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t bytes = 0;
};

// The heuristics' ranking (forward, or backward data for a transposed convolution), best
// first, less what cannot run `o`: a failed status, a tensor-core algorithm in fp32, more
// than `max_workspace` bytes of scratch (named in `over`); and less a non-deterministic
// algorithm.
template <typename Perf>
std::vector<Candidate> Candidates(const Cudnn::Api& api, cudnnHandle_t h, const Descriptors& d,
                                  const CudnnConvOptions& o, const std::vector<Perf>& ranked,
                                  int returned, size_t max_workspace, std::string* over) {
  std::vector<Candidate> out;
  for (int r = 0; r < returned; ++r) {
    const Perf& p = ranked[static_cast<size_t>(r)];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    // The same input always gives the same output: no algorithm whose sums' order varies
    // from run to run (a transposed convolution's BWD_DATA_ALGO_0, with atomics).
    if (p.determinism == CUDNN_NON_DETERMINISTIC) continue;
    // fp32 keeps the descriptor's FMA math, and no algorithm ranked for tensor cores (they
    // would round to TF32); TF32 refuses conversions to fp16; the other tiers take the math
    // the ranking names.
    if (o.math == GemmMath::kFp32) {
      if (p.mathType != CUDNN_FMA_MATH && p.mathType != CUDNN_DEFAULT_MATH) continue;
    } else if (o.math == GemmMath::kTf32 && p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) {
      continue;  // it would round fp32 data to fp16, not TF32
    } else if (api.set_math(d.conv, p.mathType) != CUDNN_STATUS_SUCCESS) {
      continue;
    }
    size_t bytes = 0;
    const cudnnStatus_t sized =
        o.transposed ? api.backward_workspace_size(
                           h, d.w, d.x, d.conv, d.y,
                           static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo), &bytes)
                     : api.workspace_size(h, d.x, d.w, d.conv, d.y,
                                          static_cast<cudnnConvolutionFwdAlgo_t>(p.algo), &bytes);
    if (sized != CUDNN_STATUS_SUCCESS) continue;
    if (bytes > max_workspace) {
      *over += " " + std::to_string(static_cast<int>(p.algo)) + " (" + std::to_string(bytes) +
               " bytes of workspace)";
      continue;
    }
    out.push_back(
        {static_cast<int>(p.algo), o.math == GemmMath::kFp32 ? CUDNN_FMA_MATH : p.mathType, bytes});
  }
  return out;
}

}  // namespace

StatusOr<std::unique_ptr<CudnnConv>> CudnnConv::Create(const CudnnHandle& handle,
                                                       const CudnnConvOptions& o,
                                                       size_t max_workspace,
                                                       const CudnnTrial& trial) {
  RETURN_IF_ERROR(CheckCudnnConv(o));
  ASSIGN_OR_RETURN(const Cudnn* cudnn, Cudnn::Get());
  const Cudnn::Api& api = cudnn->api();
  std::unique_ptr<CudnnConv> conv(new CudnnConv());
  conv->cudnn_ = cudnn;
  conv->options_ = o;
  Descriptors d;
  // Owned by `conv` as soon as made, so its destructor frees them on any error below.
  RETURN_IF_ERROR(api.Check(api.create_tensor(&d.x), "cudnnCreateTensorDescriptor"));
  conv->x_desc_ = d.x;
  RETURN_IF_ERROR(api.Check(api.create_tensor(&d.y), "cudnnCreateTensorDescriptor"));
  conv->y_desc_ = d.y;
  RETURN_IF_ERROR(api.Check(api.create_filter(&d.w), "cudnnCreateFilterDescriptor"));
  conv->w_desc_ = d.w;
  RETURN_IF_ERROR(api.Check(api.create_conv(&d.conv), "cudnnCreateConvolutionDescriptor"));
  conv->conv_desc_ = d.conv;
  if (o.fused_bias_relu) {
    RETURN_IF_ERROR(api.Check(api.create_tensor(&d.bias), "cudnnCreateTensorDescriptor"));
    conv->bias_desc_ = d.bias;
    cudnnActivationDescriptor_t act = nullptr;
    RETURN_IF_ERROR(api.Check(api.create_act(&act), "cudnnCreateActivationDescriptor"));
    conv->act_desc_ = act;
    RETURN_IF_ERROR(api.Check(api.set_act(act, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0),
                              "cudnnSetActivationDescriptor"));
  }
  RETURN_IF_ERROR(Describe(api, o, d));
  auto h = static_cast<cudnnHandle_t>(handle.get());
  std::vector<Candidate> candidates;
  std::string over;
  int count = 0, returned = 0;
  if (o.transposed) {
    // y = ConvTranspose(x, w) is the backward data of the convolution from y to x: x its dy,
    // y its dx.
    RETURN_IF_ERROR(api.Check(api.backward_count(h, &count),
                              "cudnnGetConvolutionBackwardDataAlgorithmMaxCount"));
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> ranked(static_cast<size_t>(std::max(count, 1)));
    RETURN_IF_ERROR(api.Check(
        api.backward_algorithms(h, d.w, d.x, d.conv, d.y, count, &returned, ranked.data()),
        "cudnnGetConvolutionBackwardDataAlgorithm_v7"));
    candidates = Candidates(api, h, d, o, ranked, returned, max_workspace, &over);
  } else {
    RETURN_IF_ERROR(
        api.Check(api.algorithm_count(h, &count), "cudnnGetConvolutionForwardAlgorithmMaxCount"));
    std::vector<cudnnConvolutionFwdAlgoPerf_t> ranked(static_cast<size_t>(std::max(count, 1)));
    RETURN_IF_ERROR(
        api.Check(api.algorithms(h, d.x, d.w, d.conv, d.y, count, &returned, ranked.data()),
                  "cudnnGetConvolutionForwardAlgorithm_v7"));
    candidates = Candidates(api, h, d, o, ranked, returned, max_workspace, &over);
  }
  // The descriptor's math and the algorithm of candidate `c`, held for a trial or kept.
  auto hold = [&](const Candidate& c) -> Status {
    RETURN_IF_ERROR(api.Check(api.set_math(d.conv, c.math), "cudnnSetConvolutionMathType"));
    conv->algorithm_ = c.algorithm;
    conv->workspace_bytes_ = c.bytes;
    return Status::Ok();
  };
  if (!candidates.empty() && !trial) {
    RETURN_IF_ERROR(hold(candidates[0]));
    return conv;
  }
  std::vector<std::pair<size_t, std::string>> refused;
  std::vector<double> times(candidates.size(), -1);  // each candidate's, once run
  auto picked = PickCudnnCandidate(
      candidates.size(), o.search,
      [&](size_t i) -> StatusOr<double> {
        RETURN_IF_ERROR(hold(candidates[i]));
        ASSIGN_OR_RETURN(times[i], trial(*conv));
        return times[i];
      },
      &refused);
  if (!picked.ok()) {
    if (picked.status().code() != StatusCode::kUnimplemented) return picked.status();
    std::string words;
    for (const auto& [i, why] : refused)
      words += " " + std::to_string(candidates[i].algorithm) + " (" + why + ")";
    return Unimplemented("cuDNN has no convolution algorithm for this window within " +
                         std::to_string(max_workspace) + " bytes of workspace" +
                         (over.empty() ? std::string() : "; over it:" + over) +
                         (words.empty() ? std::string() : "; refused when run:" + words));
  }
  RETURN_IF_ERROR(hold(candidates[*picked]));
  if (o.search == CudnnAlgorithmSearch::kMeasured) {
    conv->measured_ = static_cast<int>(
        std::count_if(times.begin(), times.end(), [](double t) { return t >= 0; }));
    conv->measured_ms_ = times[*picked];
  }
  return conv;
}

CudnnConv::~CudnnConv() {
  if (!cudnn_) return;
  const Cudnn::Api& api = cudnn_->api();
  for (void* t : {x_desc_, y_desc_, bias_desc_})
    if (t) api.destroy_tensor(static_cast<cudnnTensorDescriptor_t>(t));
  if (w_desc_) api.destroy_filter(static_cast<cudnnFilterDescriptor_t>(w_desc_));
  if (conv_desc_) api.destroy_conv(static_cast<cudnnConvolutionDescriptor_t>(conv_desc_));
  if (act_desc_) api.destroy_act(static_cast<cudnnActivationDescriptor_t>(act_desc_));
}

Status CudnnConv::Run(const CudnnHandle& handle, const void* x, const void* w, const float* bias,
                      const void* z, void* y, void* workspace, cudaStream_t stream) const {
  const Cudnn::Api& api = cudnn_->api();
  auto h = static_cast<cudnnHandle_t>(handle.get());
  RETURN_IF_ERROR(api.Check(api.set_stream(h, stream), "cudnnSetStream"));
  auto xd = static_cast<cudnnTensorDescriptor_t>(x_desc_);
  auto yd = static_cast<cudnnTensorDescriptor_t>(y_desc_);
  auto wd = static_cast<cudnnFilterDescriptor_t>(w_desc_);
  auto cd = static_cast<cudnnConvolutionDescriptor_t>(conv_desc_);
  const auto algo = static_cast<cudnnConvolutionFwdAlgo_t>(algorithm_);
  const float one = 1.f, zero = 0.f;
  if (options_.transposed) {
    return api.Check(api.backward(h, &one, wd, w, xd, x, cd,
                                  static_cast<cudnnConvolutionBwdDataAlgo_t>(algorithm_), workspace,
                                  workspace_bytes_, &zero, yd, y),
                     "cudnnConvolutionBackwardData");
  }
  if (!options_.fused_bias_relu) {
    return api.Check(
        api.forward(h, &one, xd, x, wd, w, cd, algo, workspace, workspace_bytes_, &zero, yd, y),
        "cudnnConvolutionForward");
  }
  // Without a residual, z is y with a weight of 0 (cuDNN allows the alias).
  const float alpha2 = options_.residual ? 1.f : 0.f;
  return api.Check(
      api.fused_forward(h, &one, xd, x, wd, w, cd, algo, workspace, workspace_bytes_, &alpha2, yd,
                        options_.residual ? z : y, static_cast<cudnnTensorDescriptor_t>(bias_desc_),
                        bias, static_cast<cudnnActivationDescriptor_t>(act_desc_), yd, y),
      "cudnnConvolutionBiasActivationForward");
}

#else  // !SHOAL_HAVE_CUDNN

struct Cudnn::Api {};

StatusOr<const Cudnn*> Cudnn::Get() {
  return Unavailable("cuDNN not loaded: shoal was built without cuDNN's headers (cudnn.h)");
}
std::string Cudnn::version() const { return ""; }
StatusOr<std::unique_ptr<CudnnHandle>> CudnnHandle::Create() { return Cudnn::Get().status(); }
CudnnHandle::~CudnnHandle() = default;
StatusOr<std::array<int64_t, 4>> CudnnConvOutputDims(const Cudnn&, const CudnnConvOptions&) {
  return Cudnn::Get().status();
}
StatusOr<std::unique_ptr<CudnnConv>> CudnnConv::Create(const CudnnHandle&, const CudnnConvOptions&,
                                                       size_t, const CudnnTrial&) {
  return Cudnn::Get().status();
}
CudnnConv::~CudnnConv() = default;
Status CudnnConv::Run(const CudnnHandle&, const void*, const void*, const float*, const void*,
                      void*, void*, cudaStream_t) const {
  return Cudnn::Get().status();
}

#endif  // SHOAL_HAVE_CUDNN

}  // namespace shoal::engine::cuda
