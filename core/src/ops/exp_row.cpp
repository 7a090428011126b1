// The softmax kernels' exponential (core and fused plugins share it).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "headgrad/kernels.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define HEADGRAD_EXP_AVX512 1
#include <immintrin.h>
#endif

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
  // (a NaN k takes 127: converting NaN to an integer is undefined, and e,
  // NaN already, makes the result NaN)
  const float k_low = k < 127.0f ? k : 127.0f;
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
// compiler vectorizes: inlined into exp_shift_row_portable (built for AVX2
// and baseline x86-64, picked at load time) and the float64 exp_shift_row.
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

#if HEADGRAD_EXP_AVX512
// GCC 12's intrinsics start from _mm512_undefined_ps(), which its
// -Wmaybe-uninitialized takes for a read of an unset value (GCC PR 105593).
#if !defined(__clang__)  // clang has no such warning (and would warn of the unknown name)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// exp_poly on 16 lanes with AVX-512's own 2^k: the same reduction and
// polynomial, k rounded by vrndscaleps and applied by vscalefps (one exact
// scaling, whose rounding overflows to inf where exp does), and the results
// below -87 zeroed by a mask instead of clamping first: half the time of the
// compiler's vectorized exp_poly, which builds 2^k from bits.
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 v) {
  const __m512 cv = _mm512_min_ps(_mm512_set1_ps(89.0f), v);  // NaN passes (min returns its 2nd operand)
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(cv, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), cv);  // cv - k ln 2, in two parts
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  // 0 below -87 (-inf included: its r is NaN); NaN is not below and stays NaN
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ),
                             _mm512_scalef_ps(e, k));
}

// exp_and_sum's lanes, on exp16: lane l sums the elements j with j mod 16 = l.
__attribute__((target("avx512f"))) float exp_shift_row_avx512(float* x, std::int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  std::int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + c), s));
    _mm512_storeu_ps(x + c, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (c < n) {
    const auto tail = static_cast<__mmask16>((1u << (n - c)) - 1);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + c), s));
    _mm512_mask_storeu_ps(x + c, tail, e);
    sum = _mm512_mask_add_ps(sum, tail, sum, e);
  }
  float lane[kLanes];
  _mm512_storeu_ps(lane, sum);
  return add_lanes(lane);
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

}  // namespace

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
float exp_shift_row_portable(float* x, std::int64_t n, float shift) {
  return exp_and_sum<float, exp_poly>(x, n, shift);
}

float exp_shift_row(float* x, std::int64_t n, float shift) {
#if HEADGRAD_EXP_AVX512
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) return exp_shift_row_avx512(x, n, shift);
#endif
  return exp_shift_row_portable(x, n, shift);
}

// float64, the checking precision: exp_poly64, within 1 ulp of std::exp
// (std::exp is a call per element and took most of a float64 softmax).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
double exp_shift_row(double* x, std::int64_t n, double shift) {
  return exp_and_sum<double, exp_poly64>(x, n, shift);
}

}  // namespace headgrad::kernels
