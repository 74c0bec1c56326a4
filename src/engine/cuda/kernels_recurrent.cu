// The recurrent operators' element-wise kernels (see kernels.h for the contracts), written
// after the CPU engine's RecurrentLoop (ops/recurrent_loop.cc), expression for expression.
#include <cuda_runtime.h>

#include "engine/cuda/kernels.h"
#include "engine/cuda/launch.cuh"

namespace shoal::engine::cuda::internal {
namespace {

__device__ float Activate(const RnnActivationKernel& a, float x) {
  switch (a.kind) {
    case 0:  // Relu
      return x > 0.f ? x : 0.f;
    case 1:  // Tanh
      return tanhf(x);
    case 2:  // Sigmoid
      return 1.f / (1.f + expf(-x));
    case 3:  // Affine
      return a.alpha * x + a.beta;
    case 4:  // LeakyRelu
      return x >= 0.f ? x : a.alpha * x;
    case 5:  // ThresholdedRelu
      return x > a.alpha ? x : 0.f;
    case 6:  // ScaledTanh
      return a.alpha * tanhf(a.beta * x);
    case 7:  // HardSigmoid
      return fminf(fmaxf(a.alpha * x + a.beta, 0.f), 1.f);
    case 8:  // Elu
      return x >= 0.f ? x : a.alpha * (expf(x) - 1.f);
    case 9:  // Softsign
      return x / (1.f + fabsf(x));
    case 10:  // Softplus
      return x > 20.f ? x : log1pf(expf(x));
  }
  return x;
}

__device__ float Clip(float v, float clip) { return clip > 0.f ? fminf(fmaxf(v, -clip), clip) : v; }

// Row b's state in ONNX's state layout, for direction g.dir.
__device__ int64_t StateOffset(const RnnGeometry& g, int64_t b) {
  return g.batch_first ? (b * g.dirs + g.dir) * g.hidden : (g.dir * g.batch + b) * g.hidden;
}

// Row b's length, or -1 when sequence_lens holds one outside [0, seq].
__device__ int64_t Length(const RnnGeometry& g, const int32_t* sequence_lens, int64_t b) {
  if (sequence_lens == nullptr) return g.seq;
  const int64_t len = sequence_lens[b];
  return len < 0 || len > g.seq ? -1 : len;
}

// The time of this step for row b of length len, and its row of xw.
__device__ int64_t TimeOf(const RnnGeometry& g, int64_t len) {
  return g.backwards ? len - 1 - g.step : g.step;
}
__device__ int64_t XwRow(const RnnGeometry& g, int64_t t, int64_t b) {
  return g.batch_first ? b * g.seq + t : t * g.batch + b;
}

__global__ void StateInKernel(const float* __restrict__ initial, float* __restrict__ state,
                              RnnGeometry g) {
  const int64_t n = g.batch * g.hidden;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = i / g.hidden, j = i % g.hidden;
    state[i] = initial ? initial[StateOffset(g, b) + j] : 0.f;
  }
}

__global__ void StateOutKernel(const float* __restrict__ state, float* __restrict__ out,
                               RnnGeometry g) {
  const int64_t n = g.batch * g.hidden;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = i / g.hidden, j = i % g.hidden;
    out[StateOffset(g, b) + j] = state[i];
  }
}

__global__ void GruResetKernel(RnnGeometry g, float* __restrict__ xw, const float* __restrict__ hr,
                               const float* __restrict__ h, const int32_t* __restrict__ lens,
                               float* __restrict__ rh) {
  const int64_t H = g.hidden, n = g.batch * H, GH = 3 * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = i / H, j = i % H;
    const int64_t len = Length(g, lens, b);
    if (len < 0 || g.step >= len) {
      rh[i] = 0.f;
      continue;
    }
    float* x = xw + XwRow(g, TimeOf(g, len), b) * GH;
    const float* r = hr + b * 2 * H;
    x[j] = Activate(g.act[0], Clip(x[j] + r[j], g.clip));  // z, kept in place
    rh[i] = Activate(g.act[0], Clip(x[H + j] + r[H + j], g.clip)) * h[i];
  }
}

__global__ void CellKernel(RnnGeometry g, const float* __restrict__ xw,
                           const float* __restrict__ hr, int64_t hr_ld,
                           const float* __restrict__ hr_h, const float* __restrict__ rbh,
                           const float* __restrict__ p, const int32_t* __restrict__ lens,
                           float* __restrict__ h, float* __restrict__ c, float* __restrict__ y,
                           int32_t* error_flag) {
  const int64_t H = g.hidden, n = g.batch * H;
  const int64_t gates = g.cell == 0 ? 1 : g.cell == 1 ? 3 : 4, GH = gates * H;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = i / H, j = i % H;
    const int64_t len = Length(g, lens, b);
    if (len < 0) {
      atomicOr(error_flag, 8);
      continue;
    }
    if (g.step >= len) continue;
    const int64_t t = TimeOf(g, len);
    const float* x = xw + XwRow(g, t, b) * GH;
    const float* r = hr + b * hr_ld;
    const float clip = g.clip;
    float hn;
    if (g.cell == 0) {
      hn = Activate(g.act[0], Clip(x[j] + r[j], clip));
    } else if (g.cell == 1) {
      float z, cand;
      if (g.linear_before_reset) {
        z = Activate(g.act[0], Clip(x[j] + r[j], clip));
        const float rg = Activate(g.act[0], Clip(x[H + j] + r[H + j], clip));
        cand = Activate(g.act[1],
                        Clip(x[2 * H + j] + rg * (r[2 * H + j] + (rbh ? rbh[j] : 0.f)), clip));
      } else {
        z = x[j];  // the reset kernel's
        cand = Activate(g.act[1], Clip(x[2 * H + j] + hr_h[i], clip));
      }
      hn = (1.f - z) * cand + z * h[i];
    } else {
      // ONNX gate order: i, o, f, c; peepholes i, o, f.
      const float cp = c[i];
      const float ig = Activate(g.act[0], Clip(x[j] + r[j] + (p ? p[j] * cp : 0.f), clip));
      const float fg =
          g.input_forget
              ? 1.f - ig
              : Activate(g.act[0],
                         Clip(x[2 * H + j] + r[2 * H + j] + (p ? p[2 * H + j] * cp : 0.f), clip));
      const float cc = Activate(g.act[1], Clip(x[3 * H + j] + r[3 * H + j], clip));
      const float cn = fg * cp + ig * cc;
      const float og =
          Activate(g.act[0], Clip(x[H + j] + r[H + j] + (p ? p[H + j] * cn : 0.f), clip));
      c[i] = cn;
      hn = og * Activate(g.act[2], cn);
    }
    h[i] = hn;
    if (y) {
      const int64_t at = g.batch_first ? ((b * g.seq + t) * g.dirs + g.dir) * H
                                       : ((t * g.dirs + g.dir) * g.batch + b) * H;
      y[at + j] = hn;
    }
  }
}

}  // namespace

cudaError_t LaunchRnnStateIn(const float* initial, float* state, const RnnGeometry& g,
                             cudaStream_t stream) {
  const int64_t n = g.batch * g.hidden;
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  StateInKernel<<<BlocksFor(n), kThreads, 0, stream>>>(initial, state, g);
  return cudaGetLastError();
}

cudaError_t LaunchRnnStateOut(const float* state, float* out, const RnnGeometry& g,
                              cudaStream_t stream) {
  const int64_t n = g.batch * g.hidden;
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();
  StateOutKernel<<<BlocksFor(n), kThreads, 0, stream>>>(state, out, g);
  return cudaGetLastError();
}

cudaError_t LaunchGruReset(const RnnGeometry& g, float* xw, const float* hr, const float* h,
                           const int32_t* sequence_lens, float* rh, cudaStream_t stream) {
  const int64_t n = g.batch * g.hidden;
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();
  GruResetKernel<<<BlocksFor(n), kThreads, 0, stream>>>(g, xw, hr, h, sequence_lens, rh);
  return cudaGetLastError();
}

cudaError_t LaunchRnnCell(const RnnGeometry& g, const float* xw, const float* hr, int64_t hr_ld,
                          const float* hr_h, const float* rbh, const float* peepholes,
                          const int32_t* sequence_lens, float* h, float* c, float* y,
                          int32_t* error_flag, cudaStream_t stream) {
  const int64_t n = g.batch * g.hidden;
  if (n <= 0) return cudaSuccess;
  (void)cudaGetLastError();
  CellKernel<<<BlocksFor(n), kThreads, 0, stream>>>(g, xw, hr, hr_ld, hr_h, rbh, peepholes,
                                                    sequence_lens, h, c, y, error_flag);
  return cudaGetLastError();
}

}  // namespace shoal::engine::cuda::internal
