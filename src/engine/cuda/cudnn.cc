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
  // The output the window's arithmetic gives (NodeWindow's, without ceil_mode).
  const int64_t oh = (g.h + 2 * g.ph - ((g.kh - 1) * g.dh + 1)) / g.sh + 1;
  const int64_t ow = (g.w + 2 * g.pw - ((g.kw - 1) * g.dw + 1)) / g.sw + 1;
  if (oh != g.oh || ow != g.ow)
    return InvalidArgument("cuDNN convolution: an output of " + std::to_string(g.oh) + "x" +
                           std::to_string(g.ow) + " where the window gives " + std::to_string(oh) +
                           "x" + std::to_string(ow));
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  for (int64_t v : {g.n, g.c, g.h, g.w, o.m, g.oh, g.ow, g.kh, g.kw, g.ph, g.pw})
    if (v > kMax) return InvalidArgument("cuDNN convolution: a size past 32 bits");
  if (g.n * g.c * g.h * g.w > kMax || g.n * o.m * g.oh * g.ow > kMax)
    return InvalidArgument("cuDNN convolution: a tensor of more than 2^31 elements");
  if ((o.fused_bias_relu || o.residual) && o.math != GemmMath::kFp32 && o.math != GemmMath::kTf32)
    return InvalidArgument(
        "cuDNN convolution: bias, ReLU and residual fused only in fp32 and TF32");
  if (o.residual && !o.fused_bias_relu)
    return InvalidArgument("cuDNN convolution: a residual only with the fused bias and ReLU");
  return Status::Ok();
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
  decltype(&cudnnConvolutionBiasActivationForward) fused_forward = nullptr;
  decltype(&cudnnCreateActivationDescriptor) create_act = nullptr;
  decltype(&cudnnSetActivationDescriptor) set_act = nullptr;
  decltype(&cudnnDestroyActivationDescriptor) destroy_act = nullptr;

  // "what: CUDNN_STATUS_...", as CudaStatus words its errors.
  Status Check(cudnnStatus_t s, const std::string& what) const {
    if (s == CUDNN_STATUS_SUCCESS) return Status::Ok();
    const std::string text = what + ": " + error_string(s);
    switch (s) {
      case CUDNN_STATUS_ALLOC_FAILED:
        return ResourceExhausted(text);
      case CUDNN_STATUS_NOT_SUPPORTED:
        return Unimplemented(text);
      case CUDNN_STATUS_BAD_PARAM:
        return InvalidArgument(text);
      case CUDNN_STATUS_NOT_INITIALIZED:
        return Unavailable(text);
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
  RETURN_IF_ERROR(
      api.Check(api.set_tensor(d.x, CUDNN_TENSOR_NCHW, type, i(g.n), i(g.c), i(g.h), i(g.w)),
                "cudnnSetTensor4dDescriptor (x)"));
  RETURN_IF_ERROR(api.Check(
      api.set_filter(d.w, type, CUDNN_TENSOR_NCHW, i(o.m), i(g.c / g.groups), i(g.kh), i(g.kw)),
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
  RETURN_IF_ERROR(
      api.Check(api.set_tensor(d.y, CUDNN_TENSOR_NCHW, type, i(g.n), i(o.m), i(g.oh), i(g.ow)),
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
    made = api.Check(api.output_dim(d.conv, d.x, d.w, &dims[0], &dims[1], &dims[2], &dims[3]),
                     "cudnnGetConvolution2dForwardOutputDim");
  }
  if (d.x) api.destroy_tensor(d.x);
  if (d.y) api.destroy_tensor(d.y);
  if (d.w) api.destroy_filter(d.w);
  if (d.conv) api.destroy_conv(d.conv);
  RETURN_IF_ERROR(made);
  return std::array<int64_t, 4>{dims[0], dims[1], dims[2], dims[3]};
}

StatusOr<std::unique_ptr<CudnnConv>> CudnnConv::Create(const CudnnHandle& handle,
                                                       const CudnnConvOptions& o,
                                                       size_t max_workspace) {
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
  // The heuristics' ranking, best first; the first that runs within the workspace wins.
  auto h = static_cast<cudnnHandle_t>(handle.get());
  int count = 0;
  RETURN_IF_ERROR(
      api.Check(api.algorithm_count(h, &count), "cudnnGetConvolutionForwardAlgorithmMaxCount"));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> ranked(static_cast<size_t>(std::max(count, 1)));
  int returned = 0;
  RETURN_IF_ERROR(
      api.Check(api.algorithms(h, d.x, d.w, d.conv, d.y, count, &returned, ranked.data()),
                "cudnnGetConvolutionForwardAlgorithm_v7"));
  std::string tried;
  for (int r = 0; r < returned; ++r) {
    const cudnnConvolutionFwdAlgoPerf_t& p = ranked[static_cast<size_t>(r)];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    // fp32 keeps the descriptor's FMA math, and no algorithm ranked for tensor cores (they
    // would round to TF32); the other tiers take the math the ranking names.
    if (o.math == GemmMath::kFp32) {
      if (p.mathType != CUDNN_FMA_MATH && p.mathType != CUDNN_DEFAULT_MATH) continue;
    } else if (api.set_math(d.conv, p.mathType) != CUDNN_STATUS_SUCCESS) {
      continue;
    }
    size_t bytes = 0;
    if (api.workspace_size(h, d.x, d.w, d.conv, d.y, p.algo, &bytes) != CUDNN_STATUS_SUCCESS)
      continue;
    if (bytes > max_workspace) {
      tried += " " + std::to_string(static_cast<int>(p.algo)) + " (" + std::to_string(bytes) +
               " bytes of workspace)";
      continue;
    }
    conv->algorithm_ = static_cast<int>(p.algo);
    conv->workspace_bytes_ = bytes;
    return conv;
  }
  return Unimplemented("cuDNN has no convolution algorithm for this window within " +
                       std::to_string(max_workspace) + " bytes of workspace" +
                       (tried.empty() ? std::string() : "; over it:" + tried));
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
                                                       size_t) {
  return Cudnn::Get().status();
}
CudnnConv::~CudnnConv() = default;
Status CudnnConv::Run(const CudnnHandle&, const void*, const void*, const float*, const void*,
                      void*, void*, cudaStream_t) const {
  return Cudnn::Get().status();
}

#endif  // SHOAL_HAVE_CUDNN

}  // namespace shoal::engine::cuda
