// Bulk 16-bit <-> float32 conversions (headgrad/half_convert.hpp): one scalar
// loop per direction (half.hpp's functions) and vector loops built with GCC
// target attributes, chosen once by what the CPU has.
#include "headgrad/half_convert.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HEADGRAD_HALF_X86 1
#include <immintrin.h>
// GCC 12 warns about the deliberately undefined vector (_mm512_undefined_epi32)
// inside its own AVX-512 shift intrinsics when inlined: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace headgrad {

namespace {

// ---------------------------------------------------------------- scalar

void narrow_bf16_scalar(const float* s, BFloat16* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = bfloat16_from_float(s[i]);
}
void widen_bf16_scalar(const BFloat16* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = to_float(s[i]);
}
void narrow_f16_scalar(const float* s, Float16* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = float16_from_float(s[i]);
}
void widen_f16_scalar(const Float16* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = to_float(s[i]);
}

#ifdef HEADGRAD_HALF_X86

// ---------------------------------------------------------------- AVX2 / F16C (8 lanes)

// bfloat16 rounding in integers, as bfloat16_from_float: x + 0x7fff + lsb,
// top half; a NaN keeps its top half with the quiet bit set.
__attribute__((target("avx2"))) void narrow_bf16_avx2(const float* s, BFloat16* d, std::size_t n) {
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, lsb)), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);  // |x| bits > inf's: NaN
    const __m256i nan_bits = _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet);
    const __m256i r = _mm256_blendv_epi8(rounded, nan_bits, nan);
    // 8 x u32 (each <= 0xffff) -> 8 x u16: pack within 128-bit halves, then put the halves together
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_castsi256_si128(packed));
  }
  narrow_bf16_scalar(s + i, d + i, n - i);
}

__attribute__((target("avx2"))) void widen_bf16_avx2(const BFloat16* s, float* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_slli_epi32(h, 16));
  }
  widen_bf16_scalar(s + i, d + i, n - i);
}

__attribute__((target("avx2,f16c"))) void narrow_f16_f16c(const float* s, Float16* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  narrow_f16_scalar(s + i, d + i, n - i);
}

// vcvtph2ps quiets a signalling NaN; the scalar rule keeps its bits: NaN
// lanes are rebuilt as sign | 0x7f800000 | mantissa << 13.
__attribute__((target("avx2,f16c"))) void widen_f16_f16c(const Float16* s, float* d, std::size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fff), inf = _mm256_set1_epi32(0x7c00);
  const __m256i sign_mask = _mm256_set1_epi32(0x8000), man_mask = _mm256_set1_epi32(0x3ff);
  const __m256i f32_inf = _mm256_set1_epi32(0x7f800000);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    __m256i f = _mm256_castps_si256(_mm256_cvtph_ps(raw));
    const __m256i h = _mm256_cvtepu16_epi32(raw);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(h, abs_mask), inf);
    if (!_mm256_testz_si256(nan, nan)) {
      const __m256i bits = _mm256_or_si256(
          _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(h, sign_mask), 16), f32_inf),
          _mm256_slli_epi32(_mm256_and_si256(h, man_mask), 13));
      f = _mm256_blendv_epi8(f, bits, nan);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), f);
  }
  widen_f16_scalar(s + i, d + i, n - i);
}

// ---------------------------------------------------------------- AVX-512 (16 lanes)

__attribute__((target("avx512f"))) void narrow_bf16_avx512(const float* s, BFloat16* d, std::size_t n) {
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i x = _mm512_loadu_si512(s + i);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), one);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(bias, lsb)), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, abs_mask), inf);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(x, 16), quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm512_cvtepi32_epi16(r));
  }
  narrow_bf16_scalar(s + i, d + i, n - i);
}

// vcvtneps2bf16 rounds to nearest even and quiets NaNs as the scalar rule
// does, but reads a subnormal float32 as zero: those lanes (exponent 0,
// mantissa not 0) are rounded in integers instead.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void narrow_bf16_avx512bf16(const float* s,
                                                                                         BFloat16* d,
                                                                                         std::size_t n) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000), man_mask = _mm512_set1_epi32(0x007fffff);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(s + i);
    __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
    const __m512i xi = _mm512_castps_si512(x);
    const __mmask16 sub = _mm512_testn_epi32_mask(xi, exp_mask) & _mm512_test_epi32_mask(xi, man_mask);
    if (sub) {
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(xi, 16), one);
      const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(xi, _mm512_add_epi32(bias, lsb)), 16);
      h = _mm256_mask_mov_epi16(h, sub, _mm512_cvtepi32_epi16(r));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), h);
  }
  narrow_bf16_scalar(s + i, d + i, n - i);
}

__attribute__((target("avx512f"))) void widen_bf16_avx512(const BFloat16* s, float* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    _mm512_storeu_si512(d + i, _mm512_slli_epi32(h, 16));
  }
  widen_bf16_scalar(s + i, d + i, n - i);
}

__attribute__((target("avx512f"))) void narrow_f16_avx512(const float* s, Float16* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), h);
  }
  narrow_f16_scalar(s + i, d + i, n - i);
}

__attribute__((target("avx512f"))) void widen_f16_avx512(const Float16* s, float* d, std::size_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fff), inf = _mm512_set1_epi32(0x7c00);
  const __m512i sign_mask = _mm512_set1_epi32(0x8000), man_mask = _mm512_set1_epi32(0x3ff);
  const __m512i f32_inf = _mm512_set1_epi32(0x7f800000);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m512i f = _mm512_castps_si512(_mm512_cvtph_ps(raw));
    const __m512i h = _mm512_cvtepu16_epi32(raw);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(h, abs_mask), inf);
    if (nan) {
      const __m512i bits = _mm512_or_si512(
          _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(h, sign_mask), 16), f32_inf),
          _mm512_slli_epi32(_mm512_and_si512(h, man_mask), 13));
      f = _mm512_mask_mov_epi32(f, nan, bits);
    }
    _mm512_storeu_si512(d + i, f);
  }
  widen_f16_scalar(s + i, d + i, n - i);
}

#endif  // HEADGRAD_HALF_X86

// ---------------------------------------------------------------- float64 -> 16-bit

// float_round_to_odd (half.hpp) without branches, so that the loop below
// vectorizes: float32 rounds to nearest, one step back toward zero when that
// went away from zero, then the lsb set when inexact. A NaN stays f.
inline float round_to_odd_branch_free(double d) {
  const float f = static_cast<float>(d);
  const double back = static_cast<double>(f);
  const std::uint32_t inexact = back != d ? 1u : 0u;                           // NaN: 1, undone below
  const std::uint32_t away = std::fabs(back) > std::fabs(d) ? 1u : 0u;        // NaN: 0
  const std::uint32_t odd = (std::bit_cast<std::uint32_t>(f) - (inexact & away)) | inexact;
  return d != d ? f : std::bit_cast<float>(odd);
}

#ifdef HEADGRAD_HALF_X86
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void round_to_odd_block(const double* s, float* d, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) d[i] = round_to_odd_branch_free(s[i]);
}

// float64 -> 16-bit with one rounding: a stack block of float32 rounded to
// odd, then narrowed by `narrow` (the path's float32 loop).
template <class H>
void narrow_from_double(const double* s, H* d, std::size_t n, void (*narrow)(const float*, H*, std::size_t)) {
  constexpr std::size_t kBlock = 1024;  // 4 KiB of float32: stays in L1
  float block[kBlock];
  for (std::size_t i = 0; i < n; i += kBlock) {
    const std::size_t m = std::min(kBlock, n - i);
    round_to_odd_block(s + i, block, m);
    narrow(block, d + i, m);
  }
}

// ---------------------------------------------------------------- dispatch

struct Kernels {
  void (*narrow_bf16)(const float*, BFloat16*, std::size_t) = narrow_bf16_scalar;
  void (*widen_bf16)(const BFloat16*, float*, std::size_t) = widen_bf16_scalar;
  void (*narrow_f16)(const float*, Float16*, std::size_t) = narrow_f16_scalar;
  void (*widen_f16)(const Float16*, float*, std::size_t) = widen_f16_scalar;
  const char* names[4] = {"scalar", "scalar", "scalar", "scalar"};
};

struct Cpu {
  bool avx2 = false, f16c = false, avx512 = false, avx512bf16 = false;
};

Cpu cpu() {
  Cpu c;
#ifdef HEADGRAD_HALF_X86
  __builtin_cpu_init();
  c.avx2 = __builtin_cpu_supports("avx2");
  c.f16c = c.avx2 && __builtin_cpu_supports("f16c");
  c.avx512 = __builtin_cpu_supports("avx512f");
  c.avx512bf16 = c.avx512 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                 __builtin_cpu_supports("avx512bf16");
#endif
  return c;
}

bool available(HalfPath p) {
  static const Cpu c = cpu();
  switch (p) {
    case HalfPath::best:
    case HalfPath::scalar: return true;
    case HalfPath::avx2: return c.avx2;
    case HalfPath::avx512: return c.avx512;
    case HalfPath::avx512bf16: return c.avx512bf16;
  }
  return false;
}

// The kernels of one path (each direction the best that path has).
Kernels kernels_of(HalfPath p) {
  Kernels k;
#ifdef HEADGRAD_HALF_X86
  static const Cpu c = cpu();
  if (p == HalfPath::avx2 || p == HalfPath::avx512 || p == HalfPath::avx512bf16) {
    k.narrow_bf16 = narrow_bf16_avx2, k.widen_bf16 = widen_bf16_avx2;
    k.names[0] = k.names[1] = "avx2";
    if (c.f16c) {
      k.narrow_f16 = narrow_f16_f16c, k.widen_f16 = widen_f16_f16c;
      k.names[2] = k.names[3] = "f16c";
    }
  }
  if (p == HalfPath::avx512 || p == HalfPath::avx512bf16) {
    k.narrow_bf16 = narrow_bf16_avx512, k.widen_bf16 = widen_bf16_avx512;
    k.narrow_f16 = narrow_f16_avx512, k.widen_f16 = widen_f16_avx512;
    k.names[0] = k.names[1] = k.names[2] = k.names[3] = "avx512f";
  }
  if (p == HalfPath::avx512bf16) {
    k.narrow_bf16 = narrow_bf16_avx512bf16;
    k.names[0] = "avx512bf16";
  }
#else
  (void)p;
#endif
  return k;
}

HalfPath best_available() {
  for (HalfPath p : {HalfPath::avx512bf16, HalfPath::avx512, HalfPath::avx2})
    if (available(p)) return p;
  return HalfPath::scalar;
}

const Kernels& kernels(HalfPath p) {
  static const Kernels best = [] {
    const char* env = std::getenv("HEADGRAD_HALF_CONVERT");
    if (env && std::strcmp(env, "scalar") == 0) return kernels_of(HalfPath::scalar);
    return kernels_of(best_available());
  }();
  static const Kernels scalar = kernels_of(HalfPath::scalar);
  static const Kernels avx2 = kernels_of(available(HalfPath::avx2) ? HalfPath::avx2 : HalfPath::scalar);
  static const Kernels avx512 = kernels_of(available(HalfPath::avx512) ? HalfPath::avx512 : HalfPath::scalar);
  static const Kernels avx512bf16 =
      kernels_of(available(HalfPath::avx512bf16) ? HalfPath::avx512bf16 : HalfPath::scalar);
  if (!available(p))
    throw std::invalid_argument("convert: this CPU has no " + std::string(half_path_name(p)) + " conversions");
  switch (p) {
    case HalfPath::best: return best;
    case HalfPath::scalar: return scalar;
    case HalfPath::avx2: return avx2;
    case HalfPath::avx512: return avx512;
    case HalfPath::avx512bf16: return avx512bf16;
  }
  return scalar;
}

}  // namespace

bool half_path_available(HalfPath path) { return available(path); }

const char* half_path_name(HalfPath path) {
  switch (path) {
    case HalfPath::best: return "best";
    case HalfPath::scalar: return "scalar";
    case HalfPath::avx2: return "avx2";
    case HalfPath::avx512: return "avx512";
    case HalfPath::avx512bf16: return "avx512bf16";
  }
  return "?";
}

void convert(const float* src, BFloat16* dst, std::size_t n, HalfPath path) { kernels(path).narrow_bf16(src, dst, n); }
void convert(const BFloat16* src, float* dst, std::size_t n, HalfPath path) { kernels(path).widen_bf16(src, dst, n); }
void convert(const float* src, Float16* dst, std::size_t n, HalfPath path) { kernels(path).narrow_f16(src, dst, n); }
void convert(const Float16* src, float* dst, std::size_t n, HalfPath path) { kernels(path).widen_f16(src, dst, n); }

void convert(const double* src, BFloat16* dst, std::size_t n, HalfPath path) {
  if (kernels(path).narrow_bf16 == narrow_bf16_scalar) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = bfloat16_from_double(src[i]);
    return;
  }
  narrow_from_double(src, dst, n, kernels(path).narrow_bf16);
}
void convert(const double* src, Float16* dst, std::size_t n, HalfPath path) {
  if (kernels(path).narrow_f16 == narrow_f16_scalar) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = float16_from_double(src[i]);
    return;
  }
  narrow_from_double(src, dst, n, kernels(path).narrow_f16);
}

std::string half_convert_paths() {
  const Kernels& k = kernels(HalfPath::best);
  return std::string("float32->bfloat16 ") + k.names[0] + ", bfloat16->float32 " + k.names[1] +
         ", float32->float16 " + k.names[2] + ", float16->float32 " + k.names[3];
}

}  // namespace headgrad
