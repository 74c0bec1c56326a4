#include "core/fp16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define SHOAL_HAVE_F16C_PATH 1
#endif

namespace shoal {
namespace {

#ifdef SHOAL_HAVE_F16C_PATH
// CPUID rather than __builtin_cpu_supports: clang 14 (the fuzz and lock-analysis builds)
// does not know the "f16c" feature string. AVX needs the OS to save YMM state too.
bool HasF16c() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    if ((c & bit_OSXSAVE) == 0 || (c & bit_AVX) == 0 || (c & bit_F16C) == 0) return false;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;  // XMM and YMM state
  }();
  return has;
}

__attribute__((target("avx,f16c"))) size_t Fp16ToFloatF16c(const uint16_t* src, float* dst,
                                                           size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  return i;
}

__attribute__((target("avx,f16c"))) size_t FloatToFp16F16c(const float* src, uint16_t* dst,
                                                           size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  return i;
}
#endif

}  // namespace

void Fp16ToFloat(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
#ifdef SHOAL_HAVE_F16C_PATH
  if (HasF16c()) i = Fp16ToFloatF16c(src, dst, n);
#endif
  for (; i < n; ++i) dst[i] = Fp16ToFloat(src[i]);
}

void FloatToFp16(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
#ifdef SHOAL_HAVE_F16C_PATH
  if (HasF16c()) i = FloatToFp16F16c(src, dst, n);
#endif
  for (; i < n; ++i) dst[i] = FloatToFp16(src[i]);
}

}  // namespace shoal
