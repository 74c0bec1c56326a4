// IEEE 754 binary16 (FP16) <-> float conversions, for code that stores FP16 tensors as
// their uint16_t bit patterns (dtype_visit.h) and computes in float: the engine's Cast
// and its FP16 model lowering (engine/fp16_lowering.h), and tests comparing FP16 outputs.
//
// Float to FP16 rounds to nearest, ties to even, as IEEE and every hardware converter do:
// values beyond the FP16 range (|x| >= 65520) become infinity, tiny ones subnormal or
// zero, NaN stays NaN (quiet, sign kept). FP16 to float is exact.
//
// The array forms use the CPU's F16C instructions where it has them (checked once at
// run time) and the scalar functions otherwise; both give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace shoal {

inline float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {  // infinity or NaN
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {  // normal
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {  // zero
    bits = sign;
  } else {  // subnormal: normalise
    uint32_t e = 113;
    while (!(mant & 0x400u)) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t FloatToFp16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // infinity, or NaN (kept quiet, top payload bits kept)
    return abs == 0x7F800000u ? (sign | 0x7C00u)
                              : static_cast<uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds to beyond 65504: infinity
  if (abs >= 0x38800000u) {                       // normal in FP16 (>= 2^-14)
    const uint32_t lsb = (abs >> 13) & 1u;
    const uint32_t rounded = abs + 0xFFFu + lsb;  // ties to even
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (abs < 0x33000000u) return sign;  // below half the smallest subnormal (2^-25): zero
  // Subnormal in FP16: value / 2^-24, rounded to nearest even, as an integer mantissa.
  const uint32_t exp = abs >> 23;  // 102..112
  const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // 14..24
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

// `n` elements; src and dst must not overlap.
void Fp16ToFloat(const uint16_t* src, float* dst, size_t n);
void FloatToFp16(const float* src, uint16_t* dst, size_t n);

}  // namespace shoal
