// im2col, pooling and transposed-convolution kernels (see kernels.h for the contracts).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "engine/cuda/kernels.h"
#include "engine/cuda/launch.cuh"

namespace shoal::engine::cuda::internal {
namespace {

// The value stored for v in a column of type T; inv_scale and zero_point are int8's alone
// (quantize.h).
template <typename T>
__device__ T ColumnValue(float v, float inv_scale = 1.f, int zero_point = 0);
template <>
__device__ float ColumnValue<float>(float v, float, int) {
  return v;
}
template <>
__device__ __half ColumnValue<__half>(float v, float, int) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 ColumnValue<__nv_bfloat16>(float v, float, int) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ int8_t ColumnValue<int8_t>(float v, float inv_scale, int zero_point) {
  return QuantizeS8(v, inv_scale, zero_point);
}

// Column i's value of type T: x[at] where `inside` the input, else the padding's 0, from fp32
// x (converted as ColumnValue says) or from x already quantised (int8 to int8, the padding
// its zero point, the quantisation of 0).
template <typename T>
__device__ __forceinline__ T ColumnOf(const float* x, int64_t at, bool inside, float inv_scale,
                                      int zero_point) {
  return ColumnValue<T>(inside ? x[at] : 0.f, inv_scale, zero_point);
}
template <typename T>
__device__ __forceinline__ T ColumnOf(const int8_t* x, int64_t at, bool inside, float,
                                      int zero_point) {
  return inside ? x[at] : static_cast<int8_t>(zero_point);
}

template <typename T, typename S = float>
__global__ void Im2Col(const S* __restrict__ x, T* __restrict__ cols, Window2d g, int64_t total,
                       float inv_scale = 1.f, int zero_point = 0) {
  const int64_t cg = g.c / g.groups;
  const int64_t kg = cg * g.kh * g.kw;
  const int64_t rows = g.n * g.oh * g.ow;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t kk = i % kg;
    const int64_t row = (i / kg) % rows;
    const int64_t group = i / (kg * rows);
    const int64_t c = group * cg + kk / (g.kh * g.kw);
    const int64_t ky = (kk / g.kw) % g.kh;
    const int64_t kx = kk % g.kw;
    const int64_t ox = row % g.ow;
    const int64_t oy = (row / g.ow) % g.oh;
    const int64_t b = row / (g.ow * g.oh);
    const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
    const int64_t ix = ox * g.sw - g.pw + kx * g.dw;
    cols[i] = ColumnOf<T>(x, ((b * g.c + c) * g.h + iy) * g.w + ix,
                          iy >= 0 && iy < g.h && ix >= 0 && ix < g.w, inv_scale, zero_point);
  }
}

// A stored element as fp32: exact for every type here.
__device__ __forceinline__ float AsFloat(float v) { return v; }
__device__ __forceinline__ float AsFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float AsFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

// T is float, or a 16-bit type for max pooling alone: the largest of 16-bit values is one of
// them, so storing it back rounds nothing.
// With `channels_last` (max pooling in 16 bits only), x and y are NHWC: element i of y is
// [b, oy, ox, channel], and a window's inputs lie `g.c` elements apart.
template <typename T>
__global__ void Pool2d(PoolKernel op, const T* __restrict__ x, T* __restrict__ y, Window2d g,
                       int64_t total, bool channels_last = false) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t ox, oy, stride;
    const T* in;
    if (channels_last) {
      const int64_t channel = i % g.c, pixel = i / g.c;  // pixel: (b * oh + oy) * ow + ox
      ox = pixel % g.ow;
      oy = (pixel / g.ow) % g.oh;
      in = x + pixel / (g.ow * g.oh) * g.h * g.w * g.c + channel;
      stride = g.c;
    } else {
      ox = i % g.ow;
      oy = (i / g.ow) % g.oh;
      const int64_t plane = i / (g.ow * g.oh);  // b * c + channel
      in = x + plane * g.h * g.w;
      stride = 1;
    }
    // -inf, not -FLT_MAX: a window of -inf values pools to -inf, as on the CPU.
    float best = -INFINITY, sum = 0.f;
    int64_t inside = 0;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t ix = ox * g.sw - g.pw + kx * g.dw;
        if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
        const float v = AsFloat(in[(iy * g.w + ix) * stride]);
        best = fmaxf(best, v);
        sum += v;
        ++inside;
      }
    }
    if (inside == 0) {
      y[i] = ColumnValue<T>(0.f);
    } else if (op == PoolKernel::kMax) {
      y[i] = ColumnValue<T>(best);
    } else {
      // Counting the padding divides by the whole window, as the CPU engine (oneDNN's
      // avg_include_padding) does, also where a ceil_mode window runs past the padding.
      y[i] = ColumnValue<T>(sum /
                            static_cast<float>(op == PoolKernel::kAverage ? inside : g.kh * g.kw));
    }
  }
}

// One thread per output element: it gathers the inputs that reach it, instead of each input
// scattering into the outputs it reaches (no atomics, and every output written once).
__global__ void ConvTransposeF32(const float* __restrict__ x, const float* __restrict__ w,
                                 const float* __restrict__ bias, float* __restrict__ y, Window2d g,
                                 int64_t m, int64_t total) {
  const int64_t cg = g.c / g.groups, mg = m / g.groups;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t ox = i % g.ow;
    const int64_t oy = (i / g.ow) % g.oh;
    const int64_t oc = (i / (g.ow * g.oh)) % m;
    const int64_t b = i / (g.ow * g.oh * m);
    const int64_t group = oc / mg, om = oc % mg;
    float sum = bias != nullptr ? bias[oc] : 0.f;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t ty = oy + g.ph - ky * g.dh;
      if (ty < 0 || ty % g.sh != 0) continue;
      const int64_t iy = ty / g.sh;
      if (iy >= g.h) continue;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t tx = ox + g.pw - kx * g.dw;
        if (tx < 0 || tx % g.sw != 0) continue;
        const int64_t ix = tx / g.sw;
        if (ix >= g.w) continue;
        for (int64_t c = group * cg; c < (group + 1) * cg; ++c) {
          sum +=
              x[((b * g.c + c) * g.h + iy) * g.w + ix] * w[((c * mg + om) * g.kh + ky) * g.kw + kx];
        }
      }
    }
    y[i] = sum;
  }
}

}  // namespace

cudaError_t LaunchConvTransposeF32(const float* x, const float* w, const float* bias, float* y,
                                   const Window2d& g, int64_t m, cudaStream_t stream) {
  const int64_t total = g.n * m * g.oh * g.ow;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  ConvTransposeF32<<<BlocksFor(total), kThreads, 0, stream>>>(x, w, bias, y, g, m, total);
  return cudaGetLastError();
}

cudaError_t LaunchIm2ColF32(const float* x, float* cols, const Window2d& g, cudaStream_t stream) {
  const int64_t total = g.n * g.oh * g.ow * g.c * g.kh * g.kw;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  Im2Col<float><<<BlocksFor(total), kThreads, 0, stream>>>(x, cols, g, total);
  return cudaGetLastError();
}

cudaError_t LaunchIm2ColHalf(HalfKernel to, const float* x, void* cols, const Window2d& g,
                             cudaStream_t stream) {
  const int64_t total = g.n * g.oh * g.ow * g.c * g.kh * g.kw;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();
  if (to == HalfKernel::kFp16) {
    Im2Col<__half>
        <<<BlocksFor(total), kThreads, 0, stream>>>(x, static_cast<__half*>(cols), g, total);
  } else {
    Im2Col<__nv_bfloat16>
        <<<BlocksFor(total), kThreads, 0, stream>>>(x, static_cast<__nv_bfloat16*>(cols), g, total);
  }
  return cudaGetLastError();
}

cudaError_t LaunchIm2ColInt8(const float* x, int8_t* cols, const Window2d& g, float inv_scale,
                             int zero_point, cudaStream_t stream) {
  const int64_t total = g.n * g.oh * g.ow * g.c * g.kh * g.kw;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();
  Im2Col<int8_t><<<BlocksFor(total), kThreads, 0, stream>>>(x, cols, g, total, inv_scale, zero_point);
  return cudaGetLastError();
}

cudaError_t LaunchIm2ColFromInt8(const int8_t* x, int8_t* cols, const Window2d& g, int8_t pad,
                                 cudaStream_t stream) {
  const int64_t total = g.n * g.oh * g.ow * g.c * g.kh * g.kw;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();
  Im2Col<int8_t, int8_t><<<BlocksFor(total), kThreads, 0, stream>>>(x, cols, g, total, 1.f, pad);
  return cudaGetLastError();
}

cudaError_t LaunchPool2dF32(PoolKernel op, const float* x, float* y, const Window2d& g,
                            cudaStream_t stream) {
  const int64_t total = g.n * g.c * g.oh * g.ow;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  Pool2d<float><<<BlocksFor(total), kThreads, 0, stream>>>(op, x, y, g, total);
  return cudaGetLastError();
}

cudaError_t LaunchMaxPool2dHalf(HalfKernel type, const void* x, void* y, const Window2d& g,
                                cudaStream_t stream, bool channels_last) {
  const int64_t total = g.n * g.c * g.oh * g.ow;
  if (total <= 0) return cudaSuccess;
  if (type != HalfKernel::kFp16 && type != HalfKernel::kBf16) return cudaErrorInvalidValue;
  (void)cudaGetLastError();
  if (type == HalfKernel::kFp16) {
    Pool2d<__half><<<BlocksFor(total), kThreads, 0, stream>>>(
        PoolKernel::kMax, static_cast<const __half*>(x), static_cast<__half*>(y), g, total,
        channels_last);
  } else {
    Pool2d<__nv_bfloat16><<<BlocksFor(total), kThreads, 0, stream>>>(
        PoolKernel::kMax, static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(y), g,
        total, channels_last);
  }
  return cudaGetLastError();
}

namespace {

// std::max's result, (a < b) ? b : a: which NaN passes through depends on the order, as on
// the CPU (fmaxf would drop it).
__device__ float StdMax(float a, float b) { return a < b ? b : a; }

// One bilinear sample of a channel plane at (y, x), as the CPU engine's RoiSample: nothing
// outside [-1, size], the coordinate clamped inside; the four weighted corners.
__device__ void RoiSample(const float* plane, int64_t h, int64_t w, float y, float x, float v[4]) {
  v[0] = v[1] = v[2] = v[3] = 0.f;
  if (h <= 0 || w <= 0) return;  // an empty plane has nothing to sample
  if (y < -1.f || y > static_cast<float>(h) || x < -1.f || x > static_cast<float>(w)) return;
  y = fmaxf(y, 0.f);
  x = fmaxf(x, 0.f);
  int64_t y0 = static_cast<int64_t>(y), x0 = static_cast<int64_t>(x), y1, x1;
  if (y0 >= h - 1) {
    y0 = y1 = h - 1;
    y = static_cast<float>(y0);
  } else {
    y1 = y0 + 1;
  }
  if (x0 >= w - 1) {
    x0 = x1 = w - 1;
    x = static_cast<float>(x0);
  } else {
    x1 = x0 + 1;
  }
  const float ly = __fsub_rn(y, static_cast<float>(y0)), lx = __fsub_rn(x, static_cast<float>(x0));
  const float hy = __fsub_rn(1.f, ly), hx = __fsub_rn(1.f, lx);
  v[0] = __fmul_rn(__fmul_rn(hy, hx), plane[y0 * w + x0]);
  v[1] = __fmul_rn(__fmul_rn(hy, lx), plane[y0 * w + x1]);
  v[2] = __fmul_rn(__fmul_rn(ly, hx), plane[y1 * w + x0]);
  v[3] = __fmul_rn(__fmul_rn(ly, lx), plane[y1 * w + x1]);
}

// One thread per output element. The coordinates are computed with explicitly rounded
// operations (never fused), in the CPU engine's order, so that a bin's sample count, which
// rounds its size up, is the same on both.
__global__ void RoiAlignF32(const float* __restrict__ x, const float* __restrict__ rois,
                            const int64_t* __restrict__ batch, float* __restrict__ y,
                            RoiAlignGeometry g, int32_t* flag, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t pw = i % g.out_w;
    const int64_t ph = (i / g.out_w) % g.out_h;
    const int64_t ch = (i / (g.out_w * g.out_h)) % g.c;
    const int64_t r = i / (g.out_w * g.out_h * g.c);
    const int64_t b = batch[r];
    if (b < 0 || b >= g.n) {
      if (pw == 0 && ph == 0 && ch == 0) atomicOr(flag, 4);
      y[i] = 0.f;
      continue;
    }
    const float* box = rois + r * 4;
    const float offset = g.half_pixel ? 0.5f : 0.f;
    const float x1 = __fsub_rn(__fmul_rn(box[0], g.spatial_scale), offset);
    const float y1 = __fsub_rn(__fmul_rn(box[1], g.spatial_scale), offset);
    float rw = __fsub_rn(__fsub_rn(__fmul_rn(box[2], g.spatial_scale), offset), x1);
    float rh = __fsub_rn(__fsub_rn(__fmul_rn(box[3], g.spatial_scale), offset), y1);
    if (!g.half_pixel) {
      rw = fmaxf(rw, 1.f);
      rh = fmaxf(rh, 1.f);
    }
    const float bin_h = __fdiv_rn(rh, static_cast<float>(g.out_h));
    const float bin_w = __fdiv_rn(rw, static_cast<float>(g.out_w));
    // As the CPU engine refuses it: an adaptive grid over a box not finite, or whose bins
    // span more than twice the input, would take for ever. Bit 16 of the flag.
    if (g.sampling_ratio == 0 && !(fabsf(bin_h) <= 2.f * static_cast<float>(g.h + 1) &&
                                   fabsf(bin_w) <= 2.f * static_cast<float>(g.w + 1))) {
      if (pw == 0 && ph == 0 && ch == 0) atomicOr(flag, 16);
      y[i] = 0.f;
      continue;
    }
    const int64_t grid_h =
        g.sampling_ratio > 0 ? g.sampling_ratio : static_cast<int64_t>(ceilf(bin_h));
    const int64_t grid_w =
        g.sampling_ratio > 0 ? g.sampling_ratio : static_cast<int64_t>(ceilf(bin_w));
    const float count = static_cast<float>(grid_h * grid_w > 1 ? grid_h * grid_w : 1);
    const float* plane = x + (b * g.c + ch) * g.h * g.w;
    float acc = 0.f;
    bool first = true;
    for (int64_t iy = 0; iy < grid_h; ++iy) {
      const float sy = __fadd_rn(
          __fadd_rn(y1, __fmul_rn(static_cast<float>(ph), bin_h)),
          __fdiv_rn(__fmul_rn(__fadd_rn(static_cast<float>(iy), 0.5f), bin_h),
                    static_cast<float>(grid_h)));
      for (int64_t ix = 0; ix < grid_w; ++ix) {
        const float sx = __fadd_rn(
            __fadd_rn(x1, __fmul_rn(static_cast<float>(pw), bin_w)),
            __fdiv_rn(__fmul_rn(__fadd_rn(static_cast<float>(ix), 0.5f), bin_w),
                      static_cast<float>(grid_w)));
        float v[4];
        RoiSample(plane, g.h, g.w, sy, sx, v);
        if (g.max) {
          const float m = StdMax(StdMax(v[0], v[1]), StdMax(v[2], v[3]));
          acc = first ? m : StdMax(acc, m);
          first = false;
        } else {
          acc = __fadd_rn(acc, __fadd_rn(__fadd_rn(__fadd_rn(v[0], v[1]), v[2]), v[3]));
        }
      }
    }
    y[i] = g.max ? acc : __fdiv_rn(acc, count);
  }
}

}  // namespace

cudaError_t LaunchRoiAlignF32(const float* x, const float* rois, const int64_t* batch, float* y,
                              const RoiAlignGeometry& g, int32_t* flag, cudaStream_t stream) {
  const int64_t total = g.rois * g.c * g.out_h * g.out_w;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  RoiAlignF32<<<BlocksFor(total), kThreads, 0, stream>>>(x, rois, batch, y, g, flag, total);
  return cudaGetLastError();
}

namespace {

// GridSample's helpers, as ops/sampling.cc has them; the coordinate arithmetic in explicitly
// rounded operations in its order, so that a nearest or reflected coordinate lands where the
// CPU's does.
__device__ float GsReflect(float x, float lo, float hi) {
  if (!isfinite(x)) return x;
  if (hi <= lo) return lo;
  const float span = __fsub_rn(hi, lo);
  const float d = fabsf(__fsub_rn(x, lo));
  const float flips = floorf(__fdiv_rn(d, span));
  const float extra = __fsub_rn(d, __fmul_rn(flips, span));
  return fmodf(flips, 2.f) == 0.f ? __fadd_rn(lo, extra) : __fsub_rn(hi, extra);
}

__device__ float GsInRange(float x) { return fabsf(x) <= 1e9f ? x : -100.f; }

__device__ float GsUnnormalize(const GridGeometry& g, float v, int64_t size) {
  const float s = static_cast<float>(size);
  return g.align_corners ? __fmul_rn(__fdiv_rn(__fadd_rn(v, 1.f), 2.f), __fsub_rn(s, 1.f))
                         : __fdiv_rn(__fsub_rn(__fmul_rn(__fadd_rn(v, 1.f), s), 1.f), 2.f);
}

// std::clamp's result, NaN passing through.
__device__ float GsClamp(float x, float lo, float hi) { return x < lo ? lo : hi < x ? hi : x; }

__device__ float GsPad(const GridGeometry& g, float x, int64_t size) {
  const float s = static_cast<float>(size);
  if (g.padding == 1) {
    x = GsClamp(x, 0.f, __fsub_rn(s, 1.f));
  } else if (g.padding == 2) {
    x = g.align_corners ? GsReflect(x, 0.f, __fsub_rn(s, 1.f))
                        : GsReflect(x, -0.5f, __fsub_rn(s, 0.5f));
    x = GsClamp(x, 0.f, __fsub_rn(s, 1.f));
  }
  return GsInRange(x);
}

// The plane or volume value at (z, y, x); zeros outside.
__device__ float GsAt(const float* img, const GridGeometry& g, int64_t z, int64_t y, int64_t x) {
  return z < 0 || z >= g.d || y < 0 || y >= g.h || x < 0 || x >= g.w
             ? 0.f
             : img[(z * g.h + y) * g.w + x];
}

__device__ void GsCubic(float t, float w[4]) {
  constexpr float a = -0.75f;
  auto far = [](float d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };
  auto near = [](float d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };
  w[0] = far(t + 1);
  w[1] = near(t);
  w[2] = near(1 - t);
  w[3] = far(2 - t);
}

__global__ void GridSampleF32(const float* __restrict__ x, const float* __restrict__ grid,
                              float* __restrict__ y, GridGeometry g, int64_t total) {
  const int64_t volume = g.out_d * g.out_h * g.out_w;
  const int64_t dims = g.volume ? 3 : 2;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % volume;
    const int64_t ch = (idx / volume) % g.c;
    const int64_t b = idx / (volume * g.c);
    const float* gp = grid + (b * volume + i) * dims;
    const float* img = x + (b * g.c + ch) * g.d * g.h * g.w;
    const float ux = GsUnnormalize(g, gp[0], g.w), uy = GsUnnormalize(g, gp[1], g.h);
    const float uz = g.volume ? GsUnnormalize(g, gp[2], g.d) : 0.f;
    float v;
    if (g.mode == 2) {
      // Bicubic taps are padded one by one, from the unpadded coordinate.
      const float cx = GsInRange(ux), cy = GsInRange(uy);
      const float fy = floorf(cy), fx = floorf(cx);
      float wy[4], wx[4];
      GsCubic(cy - fy, wy);
      GsCubic(cx - fx, wx);
      v = 0.f;
      for (int a = 0; a < 4; ++a) {
        const float ty = GsPad(g, __fadd_rn(__fsub_rn(fy, 1.f), static_cast<float>(a)), g.h);
        for (int k = 0; k < 4; ++k) {
          const float tx = GsPad(g, __fadd_rn(__fsub_rn(fx, 1.f), static_cast<float>(k)), g.w);
          v += wy[a] * wx[k] *
               GsAt(img, g, 0, static_cast<int64_t>(ty), static_cast<int64_t>(tx));
        }
      }
    } else {
      const float sx = GsPad(g, ux, g.w), sy = GsPad(g, uy, g.h);
      const float sz = g.volume ? GsPad(g, uz, g.d) : 0.f;
      if (g.mode == 1) {
        v = GsAt(img, g, static_cast<int64_t>(rintf(sz)), static_cast<int64_t>(rintf(sy)),
                 static_cast<int64_t>(rintf(sx)));
      } else {
        const float fz = floorf(sz), fy = floorf(sy), fx = floorf(sx);
        const int64_t z0 = static_cast<int64_t>(fz), y0 = static_cast<int64_t>(fy),
                      x0 = static_cast<int64_t>(fx);
        const float lz = sz - fz, ly = sy - fy, lx = sx - fx;
        auto plane = [&](int64_t z) {
          return (1 - ly) * ((1 - lx) * GsAt(img, g, z, y0, x0) + lx * GsAt(img, g, z, y0, x0 + 1)) +
                 ly * ((1 - lx) * GsAt(img, g, z, y0 + 1, x0) + lx * GsAt(img, g, z, y0 + 1, x0 + 1));
        };
        v = g.volume ? (1 - lz) * plane(z0) + lz * plane(z0 + 1) : plane(0);
      }
    }
    y[idx] = v;
  }
}

}  // namespace

cudaError_t LaunchGridSampleF32(const float* x, const float* grid, float* y,
                                const GridGeometry& g, cudaStream_t stream) {
  const int64_t total = g.n * g.c * g.out_d * g.out_h * g.out_w;
  if (total <= 0) return cudaSuccess;
  (void)cudaGetLastError();  // an earlier call's error is not this launch's
  GridSampleF32<<<BlocksFor(total), kThreads, 0, stream>>>(x, grid, y, g, total);
  return cudaGetLastError();
}

}  // namespace shoal::engine::cuda::internal
