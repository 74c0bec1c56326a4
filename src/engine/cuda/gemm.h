// Matrix products on cuBLASLt with the bias and activation fused into its epilogue, in
// fp32, TF32, fp16 or bf16 (and int8 with int32 sums, quantize.h): the GPU path's MatMul,
// Gemm and the MatMul+Add(+Relu) chains the optimiser fuses.
//
// Row-major, as the engine stores tensors: Y[m, n] = X[m, k] · W + bias, where W is
// [k, n], or [n, k] with `transpose_w` (ONNX Gemm's transB, a PyTorch Linear's weight).
// cuBLASLt is column-major; a row-major product is the column-major product of the
// transposes, Yᵀ = Wᵀ·Xᵀ, so the weight is cuBLASLt's A, the activations its B, and the
// bias, one value per output column of Y, is its per-row epilogue bias.
//
// An LtGemm is planned once for one shape (the algorithm chosen by cuBLASLt's heuristic
// at Create) and run many times. Run is not thread-safe (it sets the bias pointer on the
// shared descriptor): one LtGemm per instance, as the engine's plans are. The LtHandle it
// was planned on must outlive it.
//
// Every operand and the workspace must be aligned to kGemmAlignmentBytes (cudaMalloc's
// alignment; the device memory planner aligns its offsets to it): the algorithm is chosen
// for that alignment, and Run refuses a pointer that is not. A batched product's later
// matrices are only as aligned as their batch strides make them: its algorithm is chosen
// for the largest power of two, up to that, that divides every stride in bytes.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/status.h"

namespace shoal::engine::cuda {

// One cuBLASLt handle per device (cublasLtCreate), shared by the LtGemms planned on it.
class LtHandle {
 public:
  static StatusOr<std::unique_ptr<LtHandle>> Create();
  ~LtHandle();
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  LtHandle() = default;
  cublasLtHandle_t handle_ = nullptr;
};

inline constexpr size_t kGemmAlignmentBytes = 256;

// cuBLASLt's GELU epilogue is the tanh approximation (ONNX Gelu approximate="tanh").
enum class GemmEpilogue { kNone, kBias, kRelu, kBiasRelu, kBiasGelu };
// The element type of X, W, Y and the bias, and how the products are computed. The
// reduced precisions accumulate in fp32 and run on tensor cores.
enum class GemmMath {
  kFp32,  // fp32 in and out, fp32 arithmetic
  kTf32,  // fp32 in and out, products with 10-bit mantissas (CUBLAS_COMPUTE_32F_FAST_TF32)
  kFp16,  // IEEE half in, and out unless fp32_output
  kBf16,  // bfloat16 in, and out unless fp32_output
  // int8 in (quantize.h), exact int32 sums out (int32 arithmetic on tensor cores): W stored
  // [n, k] (transpose_w), k and n multiples of 4, no epilogue, alpha 1. The scales, bias and
  // activation follow in a pass of their own (quantize.h's DequantizeInt8).
  kInt8,
};
// Bytes per element of X and W under `math`: 4, 2 or 1.
size_t GemmElementBytes(GemmMath math);

struct GemmOptions {
  int64_t m = 0, n = 0, k = 0;  // Y is m x n, the inner dimension k; all positive
  bool transpose_w = false;     // W stored [n, k] instead of [k, n]
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  GemmMath math = GemmMath::kFp32;
  size_t workspace_bytes = 4 << 20;  // the most scratch the algorithm may use; Run gets it
  float alpha = 1.f;                 // Y = epilogue(alpha · X·W + bias)
  // kFp16 and kBf16 only: Y and the bias in fp32 while X and W stay 16-bit (a mixed-precision
  // plan's products: the operands rounded, the sums and the output kept fp32; false for a
  // product whose output only the next products read, which write it in 16 bits).
  bool fp32_output = false;
  // Batched products (attention's scores and context): `batch` products, product b's
  // operands at the base pointers plus b times their batch stride, in elements. A stride
  // of 0 uses the same matrix for every product (a broadcast); Y's must not make two
  // products' outputs overlap. The bias, when there is one, is the same for every product.
  int64_t batch = 1;
  int64_t x_batch_stride = 0, w_batch_stride = 0, y_batch_stride = 0;
};

// Bytes per element of Y and the bias: GemmElementBytes, or 4 with fp32_output or int8.
size_t GemmOutputBytes(const GemmOptions& options);

class LtGemm {
 public:
  // InvalidArgument for a non-positive dimension or batch, a negative batch stride,
  // batched outputs that overlap, or an int8 GEMM outside kInt8's terms; Unimplemented when
  // cuBLASLt has no algorithm for the combination on this device.
  static StatusOr<std::unique_ptr<LtGemm>> Create(const LtHandle& handle,
                                                  const GemmOptions& options);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  const GemmOptions& options() const { return options_; }
  // Queues Y = epilogue(X·W + bias) on `stream`, X and W of the element type
  // options().math names (GemmElementBytes), Y and the bias of GemmOutputBytes'. bias: n values,
  // required by the kBias* epilogues and ignored otherwise; workspace: options().workspace_bytes of
  // device memory (or null when that is 0).
  Status Run(const void* x, const void* w, const void* bias, void* y, void* workspace,
             cudaStream_t stream);

 private:
  LtGemm() = default;
  GemmOptions options_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t w_layout_ = nullptr, x_layout_ = nullptr, y_layout_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
};

}  // namespace shoal::engine::cuda
