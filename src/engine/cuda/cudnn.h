// cuDNN's convolutions for the GPU path. cuDNN is loaded at run time (dlopen of
// libcudnn.so.9) rather than linked: its libraries are several hundred megabytes, a GPU
// machine may or may not have them, and shoal runs without them, convolving by im2col and
// a cuBLASLt GEMM (gpu_lowering.h, GpuPlanOptions::conv). Built against cuDNN's headers
// when the toolkit has them (SHOAL_HAVE_CUDNN); without, Cudnn::Get says so.
//
// The legacy convolution API (cudnnConvolutionForward and
// cudnnConvolutionBiasActivationForward; cudnnConvolutionBackwardData for a transposed
// convolution), NCHW as ONNX lays tensors out:
//   fp32 (GemmMath::kFp32)  fp32 in and out, FMA kernels only (no TF32);
//   kTf32                   fp32 in and out, TF32 tensor cores allowed;
//   kFp16, kBf16            x, w and y 16-bit, fp32 accumulation on tensor cores.
// A fused convolution computes y = relu(conv(x, w) + z + bias) in one call (z, the
// residual, optional; fp32 and TF32 only): a Conv with its bias and ReLU, or ResNet's
// convolution, residual and ReLU.
//
// Threads: Cudnn is process-wide and read-only once loaded. A CudnnHandle and the
// CudnnConvs run with it belong to one GpuPlan (one thread at a time).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "engine/cuda/conv.h"
#include "engine/cuda/gemm.h"

namespace shoal::engine::cuda {

class Cudnn {
 public:
  // The process's cuDNN, loaded at the first call; UNAVAILABLE with the reason (a build
  // without cuDNN's headers, no libcudnn.so.9 on the library path, a version before 9, a
  // missing entry point) at this and every later call. Needs no device.
  static StatusOr<const Cudnn*> Get();
  // "9.19.0" for cudnnGetVersion's 91900.
  std::string version() const;

  struct Api;
  const Api& api() const { return *api_; }

 private:
  Cudnn() = default;
  const Api* api_ = nullptr;
};

// A cuDNN handle, on the device current when it was created.
class CudnnHandle {
 public:
  // UNAVAILABLE without cuDNN or a device (cudnnCreate's words).
  static StatusOr<std::unique_ptr<CudnnHandle>> Create();
  ~CudnnHandle();
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  void* get() const { return handle_; }  // cudnnHandle_t

 private:
  CudnnHandle() = default;
  const Cudnn* cudnn_ = nullptr;
  void* handle_ = nullptr;
};

// How a convolution's algorithm is chosen among those cuDNN's heuristics rank
// (cudnnGetConvolutionForwardAlgorithm_v7) and that fit its workspace.
enum class CudnnAlgorithmSearch {
  kHeuristic,  // the first ranked (with a trial, the first its trial runs)
  kMeasured,   // each run by the trial and timed; the fastest (without a trial, kHeuristic)
};

// One 2-D convolution: x [n, c, h, w] (window.n .. window.w), w [m, c/groups, kh, kw],
// y [n, m, oh, ow].
struct CudnnConvOptions {
  Window2d window;  // its pads symmetric (ph == ph_end, pw == pw_end), as cuDNN takes them
  int64_t m = 0;    // output channels
  // ConvTranspose: w [c, m/groups, kh, kw], ph and pw the padding taken off y's edges, and
  // y's size one that the convolution from y back to x maps exactly onto x's (an
  // output_padding below the stride does). Nothing fused.
  bool transposed = false;
  GemmMath math = GemmMath::kFp32;
  // y = relu(conv + z + bias), bias one fp32 value per output channel (fp32 and TF32
  // only); otherwise y = conv(x, w).
  bool fused_bias_relu = false;
  bool residual = false;  // fused only: z, the shape of y
  // x, w and y channels last (NHWC: x [n, h, w, c], w [m, kh, kw, c/groups], y [n, oh, ow,
  // m]), the layout cuDNN's tensor-core kernels read and write without transposing; 16-bit
  // tiers only (so never fused), not transposed.
  bool channels_last = false;
  CudnnAlgorithmSearch search = CudnnAlgorithmSearch::kHeuristic;
  std::string what;  // names it in a plan's errors ("node 'conv1' (Conv)")
};

// Runs a convolution with the algorithm it holds (synchronously) and returns the time one
// run took, in milliseconds; UNIMPLEMENTED (cuDNN's NOT_SUPPORTED family, or a failure that
// left the device sound) or RESOURCE_EXHAUSTED (its scratch did not fit) when that algorithm
// cannot run it, so that the next is tried; any other error stops the search.
class CudnnConv;
using CudnnTrial = std::function<StatusOr<double>(const CudnnConv&)>;

// Which of `count` candidates, ranked best first, a convolution keeps, where `run(i)` is
// candidate i's trial: kHeuristic, the first that runs; kMeasured, the one with the least
// time (the earlier ranked on a tie), every one run. A candidate refused as a trial refuses
// (UNIMPLEMENTED, RESOURCE_EXHAUSTED) is passed over, its index and words appended to
// `refused`; any other error is returned at once. UNIMPLEMENTED when none runs. Pure host
// work, for CudnnConv::Create and its tests.
StatusOr<size_t> PickCudnnCandidate(size_t count, CudnnAlgorithmSearch search,
                                    const std::function<StatusOr<double>(size_t)>& run,
                                    std::vector<std::pair<size_t, std::string>>* refused);

// OK when cuDNN can run `o`; INVALID_ARGUMENT saying why not: a window CheckWindow
// refuses, pads that differ at the two ends, an output of another size than the window's,
// a size past 32 bits, a fused convolution in 16 bits, or channels last in fp32 or TF32, or
// with a transposed convolution. Pure host work.
Status CheckCudnnConv(const CudnnConvOptions& o);

// [n, m, oh, ow] as cuDNN computes the output of `o` (cudnnGetConvolution2dForwardOutputDim);
// for a transposed convolution, the output of the convolution from y's shape back to x's,
// which must be [n, c, h, w]. No device needed. For tests: it must be the window's.
StatusOr<std::array<int64_t, 4>> CudnnConvOutputDims(const Cudnn& cudnn, const CudnnConvOptions& o);

class CudnnConv {
 public:
  // The descriptors of `o` and an algorithm among the deterministic ones cuDNN's heuristics
  // rank that run it within `max_workspace` bytes of scratch
  // (cudnnGetConvolutionForwardAlgorithm_v7, or
  // ..BackwardDataAlgorithm_v7 for a transposed convolution): without a `trial`, the first
  // ranked; with one, the candidate PickCudnnCandidate picks by o.search. A trial is needed
  // where the fused call may refuse what the heuristics rank (they rank algorithms for the
  // plain convolution), and to measure. INVALID_ARGUMENT as CheckCudnnConv; UNIMPLEMENTED
  // when no algorithm runs it; a trial's other errors as they are.
  static StatusOr<std::unique_ptr<CudnnConv>> Create(const CudnnHandle& handle,
                                                     const CudnnConvOptions& o,
                                                     size_t max_workspace,
                                                     const CudnnTrial& trial = nullptr);
  ~CudnnConv();
  CudnnConv(const CudnnConv&) = delete;
  CudnnConv& operator=(const CudnnConv&) = delete;

  // The scratch Run needs, and the algorithm chosen (cudnnConvolutionFwdAlgo_t).
  size_t workspace_bytes() const { return workspace_bytes_; }
  int algorithm() const { return algorithm_; }
  const CudnnConvOptions& options() const { return options_; }
  // With a measured search: how many candidates ran, and the time of the one kept (ms);
  // otherwise 0 and -1.
  int measured() const { return measured_; }
  double measured_ms() const { return measured_ms_; }

  // Queues the convolution on `stream`: y = conv(x, w), or, fused, relu(conv + z + bias)
  // (z null without a residual), or y = ConvTranspose(x, w). x, w and y in the math's element type
  // (16-bit in fp16 and bf16); `workspace` at least workspace_bytes(). y must not overlap x or w
  // (it may be z).
  Status Run(const CudnnHandle& handle, const void* x, const void* w, const float* bias,
             const void* z, void* y, void* workspace, cudaStream_t stream) const;

 private:
  CudnnConv() = default;
  const Cudnn* cudnn_ = nullptr;
  CudnnConvOptions options_;
  // cudnnTensorDescriptor_t x, y and the bias; cudnnFilterDescriptor_t;
  // cudnnConvolutionDescriptor_t; cudnnActivationDescriptor_t (fused only).
  void* x_desc_ = nullptr;
  void* y_desc_ = nullptr;
  void* bias_desc_ = nullptr;
  void* w_desc_ = nullptr;
  void* conv_desc_ = nullptr;
  void* act_desc_ = nullptr;
  int algorithm_ = 0;
  size_t workspace_bytes_ = 0;
  int measured_ = 0;
  double measured_ms_ = -1;
};

}  // namespace shoal::engine::cuda
