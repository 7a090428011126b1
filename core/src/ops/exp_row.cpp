// The softmax kernels' exponential (core and fused plugins share it).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "headgrad/kernels.hpp"

namespace headgrad::kernels {

namespace {

// Sums go to 16 lanes (lane j mod 16), added up in lane order at the end:
// vectorizable, unlike one running sum, and zeros appended to a row leave
// every lane unchanged, so a causally cut row sums exactly like the same row
// with its masked tail.
constexpr int kLanes = 16;

template <class T>
T add_lanes(const T* lane) {
  T sum = lane[0];
  for (int l = 1; l < kLanes; ++l) sum += lane[l];
  return sum;
}

// float32 exp: a branch-free Cephes-style polynomial within 2 ulp of
// std::exp over float's whole range, exactly 0 below -87 (so for -inf) and
// inf above ln(FLT_MAX) = 88.72 (so for +inf).
[[gnu::always_inline]] inline float exp_poly(float v) {
  // 89 > ln(FLT_MAX): anything above overflows to inf like std::exp
  const float cv = std::min(std::max(v, -87.0f), 89.0f);
  // 2^k with k = round(cv / ln 2) (the magic constant rounds to nearest)
  const float k = (cv * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (cv - k * 0.693359375f) - k * -2.12194440e-4f;  // cv - k ln 2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  // k reaches 128 near the top, past float's largest exponent (127): 2^127
  // is built from bits and the extra factor 2 (exact) goes on e, so the one
  // rounding is the final product, which overflows to inf where exp does.
  const float k_low = std::min(k, 127.0f);
  const std::int32_t bits = (static_cast<std::int32_t>(k_low) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return v < -87.0f ? 0.0f : (e * (1.0f + (k - k_low))) * scale;
}


// float64 exp: fdlibm's e_exp.c (error < 1 ulp) without its branches, so
// that a loop of it vectorizes. k = round(v / ln 2), r = v - k ln 2 in two
// parts (ln2_hi has 32 bits, so k ln2_hi is exact), exp(r) from fdlibm's
// rational form, then 2^k. 2^k is applied as 2^k1 2^k2 (k1 = round(k / 2)):
// each factor is a normal double for every k from -1075 to 1024 and the first
// product is exact, so the one rounding is the last, which gives exp's
// subnormals below -708.4, 0 below -745.13 (so for -inf) and inf above
// ln(DBL_MAX) = 709.78 (so for +inf). NaN stays NaN.
[[gnu::always_inline]] inline double pow2_of_integer(double k) {
  // k + 1.5 2^52 holds k + 1023 in its low mantissa bits (|k| < 2^51)
  const double biased = k + (0x1.8p52 + 1023.0);
  return std::bit_cast<double>((std::bit_cast<std::uint64_t>(biased) - std::bit_cast<std::uint64_t>(0x1.8p52)) << 52);
}

[[gnu::always_inline]] inline double exp_poly64(double v) {
  constexpr double kRound = 0x1.8p52;  // adding and subtracting it rounds to an integer
  const double cv = std::min(std::max(v, -746.0), 710.0);  // keeps k within the two factors' range
  const double k = (cv * 1.44269504088896338700e+00 + kRound) - kRound;
  const double hi = cv - k * 6.93147180369123816490e-01;  // ln2_hi
  const double lo = k * 1.90821492927058770002e-10;        // ln2_lo
  const double r = hi - lo;
  const double t = r * r;
  const double c = r - t * (1.66666666666666019037e-01 +
                            t * (-2.77777777770155933842e-03 +
                                 t * (6.61375632143793436117e-05 +
                                      t * (-1.65339022054652515390e-06 + t * 4.13813679705723846039e-08))));
  const double e = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi);
  const double k1 = (k * 0.5 + kRound) - kRound;
  const double y = e * pow2_of_integer(k1) * pow2_of_integer(k - k1);
  return v > 709.782712893383973096 ? std::numeric_limits<double>::infinity()
         : v < -745.133219101941108420 ? 0.0
         : v != v ? v : y;
}

// x[j] := exp(x[j] - shift) and their sum in lanes, in one pass that the
// compiler vectorizes: inlined into each exp_shift_row below, which are built
// for AVX-512, AVX2 and baseline x86-64 and picked at load time.
template <class T, T (*exp)(T)>
[[gnu::always_inline]] inline T exp_and_sum(T* x, std::int64_t n, T shift) {
  T lane[kLanes] = {};
  std::int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const T e = exp(x[c + l] - shift);
      x[c + l] = e;
      lane[l] += e;
    }
  for (; c < n; ++c) {
    const T e = exp(x[c] - shift);
    x[c] = e;
    lane[c % kLanes] += e;
  }
  return add_lanes(lane);
}

}  // namespace

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
float exp_shift_row(float* x, std::int64_t n, float shift) { return exp_and_sum<float, exp_poly>(x, n, shift); }

// float64, the checking precision: exp_poly64, within 1 ulp of std::exp
// (std::exp is a call per element and took most of a float64 softmax).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
double exp_shift_row(double* x, std::int64_t n, double shift) {
  return exp_and_sum<double, exp_poly64>(x, n, shift);
}

}  // namespace headgrad::kernels
