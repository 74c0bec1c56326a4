// GatherElements, ScatterElements, ScatterND, CumSum and Trilu kernels (see kernels.h for
// the contracts).
#include <cuda_runtime.h>

#include "engine/cuda/kernels.h"
#include "engine/cuda/launch.cuh"

namespace shoal::engine::cuda::internal {
namespace {

// Data's element offset for position i of the indices, or -1 when its index is out of range.
__device__ int64_t ElementsOffset(const ElementsIndex& index, const int64_t* indices, int64_t i) {
  int64_t v = indices[i];
  if (v < 0) v += index.axis_dim;
  if (v < 0 || v >= index.axis_dim) return -1;
  int64_t rest = i, off = 0;
  for (int d = index.rank - 1; d >= 0; --d) {
    const int64_t c = rest % index.idx_dims[d];
    rest /= index.idx_dims[d];
    off += (d == index.axis ? v : c) * index.data_strides[d];
  }
  return off;
}

template <typename T>
__global__ void GatherElementsKernel(const T* __restrict__ data,
                                     const int64_t* __restrict__ indices, T* __restrict__ y,
                                     ElementsIndex index, int64_t n, int32_t* error_flag) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t off = ElementsOffset(index, indices, i);
    if (off < 0) {
      atomicOr(error_flag, 1);
      y[i] = T(0);
      continue;
    }
    y[i] = data[off];
  }
}

template <typename T>
__global__ void GatherNdKernel(const T* __restrict__ data, const int64_t* __restrict__ indices,
                               T* __restrict__ y, GatherNdIndex index, int64_t n,
                               int32_t* error_flag) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e % index.slice, row = e / index.slice;  // row: b * per_batch + t
    const int64_t b = row / index.per_batch;
    const int64_t* tuple = indices + row * index.k;
    int64_t off = 0;
    bool ok = true;
    for (int d = 0; d < index.k; ++d) {
      int64_t v = tuple[d];
      if (v < 0) v += index.dims[d];
      if (v < 0 || v >= index.dims[d]) ok = false;
      off = off * index.dims[d] + v;
    }
    if (!ok) {
      atomicOr(error_flag, 1);
      y[e] = T(0);
      continue;
    }
    y[e] = data[b * index.batch_stride + off * index.slice + j];
  }
}

// ScatterND: y's element offset for update position e, or -1 when its tuple's index is out
// of range.
__device__ int64_t NdOffset(const ScatterNdIndex& index, const int64_t* indices, int64_t e) {
  const int64_t t = e / index.slice, j = e % index.slice;
  const int64_t* tuple = indices + t * index.k;
  int64_t off = 0;
  for (int d = 0; d < index.k; ++d) {
    int64_t v = tuple[d];
    if (v < 0) v += index.dims[d];
    if (v < 0 || v >= index.dims[d]) return -1;
    off = off * index.dims[d] + v;
  }
  return off * index.slice + j;
}

struct ElementsTarget {
  ElementsIndex index;
  __device__ int64_t operator()(const int64_t* indices, int64_t e) const {
    return ElementsOffset(index, indices, e);
  }
};
struct NdTarget {
  ScatterNdIndex index;
  __device__ int64_t operator()(const int64_t* indices, int64_t e) const {
    return NdOffset(index, indices, e);
  }
};

// y[at] = op(y[at], u) atomically, for the reductions other than kNone.
__device__ void CombineAtomic(ScatterKernel op, float* at, float u) {
  if (op == ScatterKernel::kAdd) {
    atomicAdd(at, u);
    return;
  }
  int* word = reinterpret_cast<int*>(at);
  int old = *word, assumed;
  do {
    assumed = old;
    const float cur = __int_as_float(assumed);
    float next;
    if (op == ScatterKernel::kMul) {
      next = __fmul_rn(cur, u);
    } else if (op == ScatterKernel::kMax) {
      next = cur < u ? u : cur;  // std::max(cur, u)
    } else {
      next = u < cur ? u : cur;  // std::min(cur, u)
    }
    const int bits = __float_as_int(next);
    if (bits == assumed) return;
    old = atomicCAS(word, assumed, bits);
  } while (old != assumed);
}

// kNone's first pass: last[target] = the largest update position naming it.
template <typename Target>
__global__ void ScatterRecordLast(Target target, const int64_t* __restrict__ indices, int32_t* last,
                                  int64_t n, int32_t* error_flag) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t at = target(indices, e);
    if (at < 0) {
      atomicOr(error_flag, 1);
      continue;
    }
    atomicMax(last + at, static_cast<int32_t>(e));
  }
}

// kNone's second pass: only the update the first pass recorded writes; the others combine
// atomically.
template <typename Target>
__global__ void ScatterWrite(ScatterKernel op, Target target, const int64_t* __restrict__ indices,
                             const float* __restrict__ updates, float* y,
                             const int32_t* __restrict__ last, int64_t n, int32_t* error_flag) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t at = target(indices, e);
    if (op == ScatterKernel::kNone) {
      if (at >= 0 && last[at] == static_cast<int32_t>(e)) y[at] = updates[e];
      continue;
    }
    if (at < 0) {
      atomicOr(error_flag, 1);
      continue;
    }
    CombineAtomic(op, y + at, updates[e]);
  }
}

template <typename Target>
cudaError_t Scatter(ScatterKernel op, Target target, const int64_t* indices, const float* updates,
                    float* y, int32_t* last, int64_t y_elements, int64_t n, int32_t* error_flag,
                    cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  if (op == ScatterKernel::kNone) {
    // Every byte 0xff: every element's last position -1, below any update's.
    const cudaError_t set =
        cudaMemsetAsync(last, 0xff, static_cast<size_t>(y_elements) * sizeof(int32_t), stream);
    if (set != cudaSuccess) return set;
    ScatterRecordLast<<<BlocksFor(n), kThreads, 0, stream>>>(target, indices, last, n, error_flag);
    const cudaError_t launched = cudaGetLastError();
    if (launched != cudaSuccess) return launched;
  }
  ScatterWrite<<<BlocksFor(n), kThreads, 0, stream>>>(op, target, indices, updates, y, last, n,
                                                      error_flag);
  return cudaGetLastError();
}

template <typename T>
__global__ void CumSumKernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t dim,
                             int64_t inner, bool exclusive, bool reverse) {
  const int64_t lines = outer * inner;
  for (int64_t line = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; line < lines;
       line += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = line / inner, c = line % inner;
    T sum = T(0);
    for (int64_t s = 0; s < dim; ++s) {
      const int64_t j = reverse ? dim - 1 - s : s;
      const int64_t at = (o * dim + j) * inner + c;
      const T v = x[at];
      if (exclusive) {
        y[at] = sum;
        sum = sum + v;
      } else {
        sum = sum + v;
        y[at] = sum;
      }
    }
  }
}

template <typename T>
__global__ void TriluKernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t cols,
                            int64_t k, bool upper, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = i % cols, r = (i / cols) % rows;
    const bool keep = upper ? j - r >= k : j - r <= k;
    y[i] = keep ? x[i] : T(0);
  }
}

}  // namespace

cudaError_t LaunchGatherNd(bool eight_bytes, const void* data, const int64_t* indices, void* y,
                           const GatherNdIndex& index, int64_t n, int32_t* error_flag,
                           cudaStream_t stream) {
  if (n <= 0 || index.slice <= 0 || index.per_batch <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  if (eight_bytes) {
    GatherNdKernel<<<BlocksFor(n), kThreads, 0, stream>>>(
        static_cast<const unsigned long long*>(data), indices, static_cast<unsigned long long*>(y),
        index, n, error_flag);
  } else {
    GatherNdKernel<<<BlocksFor(n), kThreads, 0, stream>>>(static_cast<const unsigned*>(data),
                                                          indices, static_cast<unsigned*>(y), index,
                                                          n, error_flag);
  }
  return cudaGetLastError();
}

cudaError_t LaunchGatherElements(bool eight_bytes, const void* data, const int64_t* indices,
                                 void* y, const ElementsIndex& index, int64_t n,
                                 int32_t* error_flag, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  if (eight_bytes) {
    GatherElementsKernel<<<BlocksFor(n), kThreads, 0, stream>>>(
        static_cast<const unsigned long long*>(data), indices, static_cast<unsigned long long*>(y),
        index, n, error_flag);
  } else {
    GatherElementsKernel<<<BlocksFor(n), kThreads, 0, stream>>>(static_cast<const unsigned*>(data),
                                                                indices, static_cast<unsigned*>(y),
                                                                index, n, error_flag);
  }
  return cudaGetLastError();
}

cudaError_t LaunchScatterElementsF32(ScatterKernel op, const int64_t* indices, const float* updates,
                                     float* y, int32_t* last, int64_t y_elements,
                                     const ElementsIndex& index, int64_t n, int32_t* error_flag,
                                     cudaStream_t stream) {
  return Scatter(op, ElementsTarget{index}, indices, updates, y, last, y_elements, n, error_flag,
                 stream);
}

cudaError_t LaunchScatterNdF32(ScatterKernel op, const int64_t* indices, const float* updates,
                               float* y, int32_t* last, int64_t y_elements,
                               const ScatterNdIndex& index, int32_t* error_flag,
                               cudaStream_t stream) {
  if (index.slice <= 0) return cudaSuccess;
  return Scatter(op, NdTarget{index}, indices, updates, y, last, y_elements,
                 index.tuples * index.slice, error_flag, stream);
}

cudaError_t LaunchCumSum(bool int64_data, const void* x, void* y, int64_t outer, int64_t dim,
                         int64_t inner, bool exclusive, bool reverse, cudaStream_t stream) {
  const int64_t lines = outer * inner;
  if (lines <= 0 || dim <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  if (int64_data) {
    // Unsigned: wraps on overflow, as the CPU's two's-complement sums do in practice.
    CumSumKernel<<<BlocksFor(lines), kThreads, 0, stream>>>(
        static_cast<const unsigned long long*>(x), static_cast<unsigned long long*>(y), outer, dim,
        inner, exclusive, reverse);
  } else {
    CumSumKernel<<<BlocksFor(lines), kThreads, 0, stream>>>(static_cast<const float*>(x),
                                                            static_cast<float*>(y), outer, dim,
                                                            inner, exclusive, reverse);
  }
  return cudaGetLastError();
}

cudaError_t LaunchTrilu(bool eight_bytes, const void* x, void* y, int64_t mats, int64_t rows,
                        int64_t cols, int64_t k, bool upper, cudaStream_t stream) {
  const int64_t n = mats * rows * cols;
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  if (eight_bytes) {
    TriluKernel<<<BlocksFor(n), kThreads, 0, stream>>>(static_cast<const unsigned long long*>(x),
                                                       static_cast<unsigned long long*>(y), rows,
                                                       cols, k, upper, n);
  } else {
    TriluKernel<<<BlocksFor(n), kThreads, 0, stream>>>(
        static_cast<const unsigned*>(x), static_cast<unsigned*>(y), rows, cols, k, upper, n);
  }
  return cudaGetLastError();
}

}  // namespace shoal::engine::cuda::internal
