// The softmax kernels' exponential (core and fused plugins share it).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "headgrad/kernels.hpp"

namespace headgrad::kernels {

namespace {

// Sums x[0..n) in 8 lanes (lane j mod 8), then across them: vectorizable,
// unlike one running sum, and zeros appended to a row leave it unchanged, so
// a causally cut row sums exactly like the same row with its masked tail.
template <class T>
T lane_sum(const T* x, std::int64_t n) {
  T lane[8] = {};
  std::int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    for (int l = 0; l < 8; ++l) lane[l] += x[c + l];
  for (; c < n; ++c) lane[c & 7] += x[c];
  for (int l = 1; l < 8; ++l) lane[0] += lane[l];
  return lane[0];
}

}  // namespace

// float32: a branch-free Cephes-style expf that the compiler vectorizes,
// built for AVX-512, AVX2 and baseline x86-64 and picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
float exp_shift_row(float* x, std::int64_t n, float shift) {
  for (std::int64_t c = 0; c < n; ++c) {
    const float v = x[c] - shift;
    const float cv = std::min(std::max(v, -87.0f), 88.0f);
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
    const std::int32_t bits = (static_cast<std::int32_t>(k) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    x[c] = v < -87.0f ? 0.0f : e * scale;
  }
  return lane_sum(x, n);
}

// float64, the checking precision, keeps the C library's exp.
double exp_shift_row(double* x, std::int64_t n, double shift) {
  for (std::int64_t c = 0; c < n; ++c) x[c] = std::exp(x[c] - shift);
  return lane_sum(x, n);
}

}  // namespace headgrad::kernels
