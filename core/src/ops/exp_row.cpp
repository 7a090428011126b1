// The softmax kernels' exponential (core and fused plugins share it).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

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

}  // namespace

// float32: exp and sum in one pass that the compiler vectorizes, built for
// AVX-512, AVX2 and baseline x86-64 and picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
float exp_shift_row(float* x, std::int64_t n, float shift) {
  float lane[kLanes] = {};
  std::int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float e = exp_poly(x[c + l] - shift);
      x[c + l] = e;
      lane[l] += e;
    }
  for (; c < n; ++c) {
    const float e = exp_poly(x[c] - shift);
    x[c] = e;
    lane[c % kLanes] += e;
  }
  return add_lanes(lane);
}

// float64, the checking precision, keeps the C library's exp.
double exp_shift_row(double* x, std::int64_t n, double shift) {
  double lane[kLanes] = {};
  for (std::int64_t c = 0; c < n; ++c) {
    x[c] = std::exp(x[c] - shift);
    lane[c % kLanes] += x[c];
  }
  return add_lanes(lane);
}

}  // namespace headgrad::kernels
