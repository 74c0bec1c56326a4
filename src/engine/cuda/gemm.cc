#include "engine/cuda/gemm.h"

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "engine/cuda/cuda_status.h"

namespace shoal::engine::cuda {

StatusOr<std::unique_ptr<LtHandle>> LtHandle::Create() {
  std::unique_ptr<LtHandle> handle(new LtHandle());
  RETURN_IF_ERROR(CublasStatus(cublasLtCreate(&handle->handle_), "cublasLtCreate"));
  return handle;
}

LtHandle::~LtHandle() {
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

namespace {

cublasLtEpilogue_t LtEpilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kRelu:
      return CUBLASLT_EPILOGUE_RELU;
    case GemmEpilogue::kBiasRelu:
      return CUBLASLT_EPILOGUE_RELU_BIAS;
    case GemmEpilogue::kBiasGelu:
      return CUBLASLT_EPILOGUE_GELU_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

cudaDataType_t ElementType(GemmMath math) {
  switch (math) {
    case GemmMath::kFp16:
      return CUDA_R_16F;
    case GemmMath::kBf16:
      return CUDA_R_16BF;
    case GemmMath::kInt8:
      return CUDA_R_8I;
    case GemmMath::kFp32:
    case GemmMath::kTf32:
      return CUDA_R_32F;
  }
  return CUDA_R_32F;
}

const char* MathName(GemmMath math) {
  switch (math) {
    case GemmMath::kFp32:
      return "fp32";
    case GemmMath::kTf32:
      return "tf32";
    case GemmMath::kFp16:
      return "fp16";
    case GemmMath::kBf16:
      return "bf16";
    case GemmMath::kInt8:
      return "int8";
  }
  return "?";
}

bool HasBias(GemmEpilogue e) {
  return e == GemmEpilogue::kBias || e == GemmEpilogue::kBiasRelu || e == GemmEpilogue::kBiasGelu;
}

}  // namespace

size_t GemmElementBytes(GemmMath math) {
  if (math == GemmMath::kInt8) return 1;
  return math == GemmMath::kFp16 || math == GemmMath::kBf16 ? 2 : 4;
}

size_t GemmOutputBytes(const GemmOptions& options) {
  // int8's sums are int32.
  return options.fp32_output || options.math == GemmMath::kInt8 ? 4
                                                                : GemmElementBytes(options.math);
}

StatusOr<std::unique_ptr<LtGemm>> LtGemm::Create(const LtHandle& handle,
                                                 const GemmOptions& options) {
  if (options.m <= 0 || options.n <= 0 || options.k <= 0) {
    return InvalidArgument("GEMM dimensions must be positive; were m=" + std::to_string(options.m) +
                           " n=" + std::to_string(options.n) + " k=" + std::to_string(options.k));
  }
  if (options.batch < 1 || options.x_batch_stride < 0 || options.w_batch_stride < 0 ||
      options.y_batch_stride < 0 ||
      (options.batch > 1 && options.y_batch_stride < options.m * options.n)) {
    return InvalidArgument("a batch of " + std::to_string(options.batch) +
                           " GEMMs needs strides >= 0 and outputs that do not overlap (Y's "
                           "stride at least m*n = " +
                           std::to_string(options.m * options.n) + "); was " +
                           std::to_string(options.y_batch_stride));
  }
  if (options.fp32_output && options.math != GemmMath::kFp16 && options.math != GemmMath::kBf16) {
    return InvalidArgument(
        std::string("fp32_output is for fp16 or bf16 operands; this GEMM's are ") +
        MathName(options.math));
  }
  const bool int8 = options.math == GemmMath::kInt8;
  if (int8) {
    // cuBLASLt's int8 kernels on the plain (not COL32) layouts: A transposed and B not ("TN",
    // here W stored [n, k]), leading dimensions multiples of 4, int32 out with no epilogue.
    std::string wrong;
    if (!options.transpose_w) wrong += ", W stored [k, n]";
    if (options.k % 4 != 0 || options.n % 4 != 0) wrong += ", k or n not a multiple of 4";
    if (options.batch > 1 && (options.x_batch_stride % 4 != 0 || options.w_batch_stride % 4 != 0))
      wrong += ", a batch stride not a multiple of 4";
    if (options.epilogue != GemmEpilogue::kNone) wrong += ", an epilogue";
    if (options.alpha != 1.f) wrong += ", alpha not 1";
    if (!wrong.empty()) {
      return InvalidArgument(
          "an int8 GEMM needs W stored [n, k], k, n and batch strides multiples of 4, no "
          "epilogue and alpha 1; m=" +
          std::to_string(options.m) + " n=" + std::to_string(options.n) +
          " k=" + std::to_string(options.k) + " has" + wrong.substr(1));
    }
  }
  std::unique_ptr<LtGemm> gemm(new LtGemm());
  gemm->options_ = options;
  gemm->handle_ = handle.get();
  const cublasComputeType_t compute = int8 ? CUBLAS_COMPUTE_32I
                                      : options.math == GemmMath::kTf32
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F;
  // alpha and beta are fp32 whatever the operands' type (the scale type), but int32 for
  // int8's int32 sums.
  RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescCreate(&gemm->op_, compute, int8 ? CUDA_R_32I : CUDA_R_32F),
                   "cublasLtMatmulDescCreate"));
  // Column-major view: D (n x m) = A (n x k) · B (k x m). A is W: row-major [k, n] is
  // column-major n x k as it stands; row-major [n, k] is column-major k x n, transposed.
  const cublasOperation_t trans_a = options.transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = LtEpilogue(options.epilogue);
  RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescSetAttribute(gemm->op_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                                  sizeof(trans_a)),
                   "set TRANSA"));
  RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescSetAttribute(gemm->op_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                                  sizeof(trans_b)),
                   "set TRANSB"));
  RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescSetAttribute(gemm->op_, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                  &epilogue, sizeof(epilogue)),
                   "set EPILOGUE"));
  if (options.fp32_output) {
    // Said, not left to the default (the output's type, which is also fp32 here).
    const cudaDataType_t bias_type = CUDA_R_32F;
    RETURN_IF_ERROR(
        CublasStatus(cublasLtMatmulDescSetAttribute(gemm->op_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &bias_type, sizeof(bias_type)),
                     "set BIAS_DATA_TYPE"));
  }
  const cudaDataType_t type = ElementType(options.math);
  const auto m = static_cast<uint64_t>(options.m), n = static_cast<uint64_t>(options.n),
             k = static_cast<uint64_t>(options.k);
  if (options.transpose_w) {
    RETURN_IF_ERROR(CublasStatus(cublasLtMatrixLayoutCreate(&gemm->w_layout_, type, k, n, k),
                                 "cublasLtMatrixLayoutCreate (W)"));
  } else {
    RETURN_IF_ERROR(CublasStatus(cublasLtMatrixLayoutCreate(&gemm->w_layout_, type, n, k, n),
                                 "cublasLtMatrixLayoutCreate (W)"));
  }
  RETURN_IF_ERROR(CublasStatus(cublasLtMatrixLayoutCreate(&gemm->x_layout_, type, k, m, k),
                               "cublasLtMatrixLayoutCreate (X)"));
  const cudaDataType_t y_type = int8 ? CUDA_R_32I : options.fp32_output ? CUDA_R_32F : type;
  RETURN_IF_ERROR(CublasStatus(cublasLtMatrixLayoutCreate(&gemm->y_layout_, y_type, n, m, n),
                               "cublasLtMatrixLayoutCreate (Y)"));
  // The alignment every matrix of the batch keeps: the pointers' 256 bytes, down to what
  // the strides (in bytes) allow.
  uint32_t alignment = kGemmAlignmentBytes;
  if (options.batch > 1) {
    const auto count = static_cast<int32_t>(options.batch);
    const size_t in_bytes = GemmElementBytes(options.math);
    const std::tuple<cublasLtMatrixLayout_t, int64_t, size_t> batched[] = {
        {gemm->w_layout_, options.w_batch_stride, in_bytes},
        {gemm->x_layout_, options.x_batch_stride, in_bytes},
        {gemm->y_layout_, options.y_batch_stride, GemmOutputBytes(options)}};
    for (const auto& [layout, stride, element_bytes] : batched) {
      RETURN_IF_ERROR(
          CublasStatus(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                        &count, sizeof(count)),
                       "set BATCH_COUNT"));
      RETURN_IF_ERROR(CublasStatus(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                           &stride, sizeof(stride)),
          "set STRIDED_BATCH_OFFSET"));
      const int64_t bytes = stride * static_cast<int64_t>(element_bytes);
      while (bytes % alignment != 0) alignment /= 2;
    }
  }

  cublasLtMatmulPreference_t preference = nullptr;
  RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate"));
  const uint64_t workspace = options.workspace_bytes;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  // The alignment of every operand (cuBLASLt otherwise guesses it from the pointers it is
  // given here, and the bias pointer is not known yet).
  for (const auto attribute :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment,
                                                    sizeof(alignment));
    }
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(gemm->handle_, gemm->op_, gemm->w_layout_,
                                            gemm->x_layout_, gemm->y_layout_, gemm->y_layout_,
                                            preference, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(preference);
  // Named with the GEMM's shape and math: a GPU instance falls back from an int8 GEMM the
  // device has no kernel for (" int8 GEMM" in the message), which cuBLASLt may refuse here
  // as NOT_SUPPORTED rather than by finding no algorithm below.
  RETURN_IF_ERROR(CublasStatus(status, "cublasLtMatmulAlgoGetHeuristic")
                      .WithPrefix("a " + std::to_string(options.m) + "x" +
                                  std::to_string(options.n) + "x" + std::to_string(options.k) +
                                  " " + MathName(options.math) + " GEMM"));
  if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    return Unimplemented("cuBLASLt has no algorithm for a " + std::to_string(options.m) + "x" +
                         std::to_string(options.n) + "x" + std::to_string(options.k) + " " +
                         MathName(options.math) + " GEMM with this epilogue on this device");
  }
  gemm->algo_ = result.algo;
  return gemm;
}

LtGemm::~LtGemm() {
  if (y_layout_ != nullptr) cublasLtMatrixLayoutDestroy(y_layout_);
  if (x_layout_ != nullptr) cublasLtMatrixLayoutDestroy(x_layout_);
  if (w_layout_ != nullptr) cublasLtMatrixLayoutDestroy(w_layout_);
  if (op_ != nullptr) cublasLtMatmulDescDestroy(op_);
}

Status LtGemm::Run(const void* x, const void* w, const void* bias, void* y, void* workspace,
                   cudaStream_t stream) {
  if (workspace == nullptr && options_.workspace_bytes > 0) {
    return InvalidArgument("this GEMM was planned with " +
                           std::to_string(options_.workspace_bytes) +
                           " bytes of workspace; none was given");
  }
  for (const void* p :
       {x, w, bias, static_cast<const void*>(y), static_cast<const void*>(workspace)}) {
    if (reinterpret_cast<uintptr_t>(p) % kGemmAlignmentBytes != 0) {
      return InvalidArgument("GEMM operands must be aligned to " +
                             std::to_string(kGemmAlignmentBytes) + " bytes");
    }
  }
  if (HasBias(options_.epilogue)) {
    if (bias == nullptr) return InvalidArgument("this GEMM's epilogue adds a bias; none was given");
    RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
        "set BIAS_POINTER"));
  }
  const float alpha = options_.alpha, beta = 0.f;
  const int32_t int_alpha = 1, int_beta = 0;  // int8's scale type (Create: alpha is 1)
  const bool int8 = options_.math == GemmMath::kInt8;
  return CublasStatus(
      cublasLtMatmul(handle_, op_, int8 ? static_cast<const void*>(&int_alpha) : &alpha, w,
                     w_layout_, x, x_layout_, int8 ? static_cast<const void*>(&int_beta) : &beta, y,
                     y_layout_, y, y_layout_, &algo_, workspace, options_.workspace_bytes, stream),
      "cublasLtMatmul");
}

}  // namespace shoal::engine::cuda
