// 16-bit storage types: bfloat16 and IEEE float16 (binary16), and their
// conversions to and from float32 (and from float64).
//
//   BFloat16 b = bfloat16_from_float(1.0f / 3.0f);   // bits 0x3eab
//   float f = to_float(b);                           // 0.333984375f
//
// Only storage: headgrad computes in float32 and rounds each result to the
// storage type (as PyTorch does on a CPU), so these types have no arithmetic.
// Every conversion to 16 bits rounds to nearest, ties to even; infinities stay
// infinities, a NaN stays a (quiet) NaN of the same sign, float16 subnormals
// are produced and read exactly, and a finite value past the largest finite
// 16-bit value (past its rounding midpoint) becomes an infinity.
#pragma once

#include <bit>
#include <cstdint>

namespace headgrad {

struct BFloat16 {
  std::uint16_t bits = 0;
};
struct Float16 {
  std::uint16_t bits = 0;
};

// bfloat16 is the top half of a float32: widening is a shift.
inline float to_float(BFloat16 h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h.bits) << 16); }

inline BFloat16 bfloat16_from_float(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)  // NaN: keep sign and top payload, force quiet
    return {static_cast<std::uint16_t>((x >> 16) | 0x0040u)};
  // Adding 0x7fff plus the kept lsb rounds the dropped 16 bits to nearest even;
  // a carry into the exponent is right (up to inf for the largest values).
  const std::uint32_t lsb = (x >> 16) & 1u;
  return {static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16)};
}

// float16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
inline float to_float(Float16 h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  std::uint32_t e = (h.bits >> 10) & 0x1fu;
  std::uint32_t m = h.bits & 0x3ffu;
  if (e == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));  // inf, NaN
  if (e == 0) {
    if (m == 0) return std::bit_cast<float>(sign);  // +-0
    // Subnormal m * 2^-24: normalize so that bit 10 is the implicit one.
    e = 1;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --e;
    }
    m &= 0x3ffu;
  }
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));  // rebias 15 -> 127
}

inline Float16 float16_from_float(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t x = bits & 0x7fffffffu;
  if (x > 0x7f800000u)  // NaN: top payload bits, forced quiet
    return {static_cast<std::uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu))};
  if (x >= 0x477ff000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};  // >= 65520 (and inf)
  if (x < 0x38800000u) {  // below 2^-14: a subnormal float16, or zero
    const std::uint32_t e = x >> 23;
    if (e < 102) return {sign};  // below 2^-25: rounds to zero
    // value = mant * 2^(e - 150); in float16's subnormal unit 2^-24 that is
    // mant >> (126 - e), rounded to nearest even on the dropped bits.
    const std::uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;
    std::uint32_t r = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // may carry into the smallest normal: right
    return {static_cast<std::uint16_t>(sign | r)};
  }
  // Normal: rebias 127 -> 15 and round the 13 dropped bits to nearest even.
  const std::uint32_t y = x - 0x38000000u;
  return {static_cast<std::uint16_t>(sign | ((y + 0xfffu + ((y >> 13) & 1u)) >> 13))};
}

// From float64 with ONE rounding: float64 -> float32 rounded to odd (truncate,
// then set the lsb when inexact) keeps 13+ extra bits and a sticky bit, so the
// float32 -> 16-bit rounding that follows is the correctly rounded result
// (a plain float64 -> float32 -> 16-bit would round twice).
inline float float_round_to_odd(double d) {
  float f = static_cast<float>(d);
  if (f != f) return f;  // NaN
  const double back = static_cast<double>(f);
  if (back == d) return f;
  std::uint32_t b = std::bit_cast<std::uint32_t>(f);
  // Step toward zero when rounding went away from zero (an inf included).
  if ((back > d && d > 0) || (back < d && d < 0)) --b;
  return std::bit_cast<float>(b | 1u);
}
inline BFloat16 bfloat16_from_double(double d) { return bfloat16_from_float(float_round_to_odd(d)); }
inline Float16 float16_from_double(double d) { return float16_from_float(float_round_to_odd(d)); }

}  // namespace headgrad
