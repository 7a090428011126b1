// See tile_gemm.hpp. The micro-kernel holds a 12 x 32 block of C in 24 zmm
// registers: per step of k it loads one panel row (two vectors) and
// broadcasts 12 elements of A, 24 FMAs. Its remainders (m % 12 rows) are the
// same kernel instantiated for fewer rows; n's remainder is masked.
#include "headgrad/tile_gemm.hpp"

#include "headgrad/half_convert.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#define HEADGRAD_TILE_AVX512 1
#include <immintrin.h>
#endif

namespace headgrad::tile {

Packed make_packed(std::int64_t count, std::int64_t rows, std::int64_t cols, bool transposed) {
  Packed p;
  p.transposed = transposed;
  // as_rows: ceil(cols / 32) panels of rows x 32; as_transposed: ceil(rows / 32) of cols x 32
  const std::int64_t panels = ((transposed ? rows : cols) + kPanel - 1) / kPanel;
  p.stride = (transposed ? cols : rows) * kPanel;
  p.per_slice = panels * p.stride;
  // every element is written by pack_slice (padding included): no zeroing here, and
  // the caching allocator hands back the same pages pass after pass
  p.storage = Tensor::empty({count * p.per_slice}, DType::float32);
  p.data = p.storage.mutable_data<float>();
  return p;
}

#if HEADGRAD_TILE_AVX512
namespace {
__attribute__((target("avx512f"))) void pack_transposed_avx512(float* out, std::int64_t stride, const float* x,
                                                               std::int64_t ld, std::int64_t rows,
                                                               std::int64_t cols);
}  // namespace
#endif

void pack_slice(Packed& p, std::int64_t n, const float* x, std::int64_t ld, std::int64_t rows,
                std::int64_t cols) {
  float* out = p.data + n * p.per_slice;
#if HEADGRAD_TILE_AVX512
  // The panels of x^T are a transpose, element by element a gather down a
  // column of x: in 16 x 16 register blocks instead (the same values).
  static const bool avx512 = available();
  if (p.transposed && avx512) return pack_transposed_avx512(out, p.stride, x, ld, rows, cols);
#endif
  if (!p.transposed) {
    for (std::int64_t c0 = 0; c0 < cols; c0 += kPanel) {
      const std::int64_t w = std::min(kPanel, cols - c0);
      float* panel = out + c0 / kPanel * p.stride;
      for (std::int64_t r = 0; r < rows; ++r) {
        std::copy(x + r * ld + c0, x + r * ld + c0 + w, panel + r * kPanel);
        std::fill(panel + r * kPanel + w, panel + (r + 1) * kPanel, 0.0f);
      }
    }
    return;
  }
  for (std::int64_t r0 = 0; r0 < rows; r0 += kPanel) {
    const std::int64_t h = std::min(kPanel, rows - r0);
    float* panel = out + r0 / kPanel * p.stride;
    for (std::int64_t c = 0; c < cols; ++c) {
      for (std::int64_t r = 0; r < h; ++r) panel[c * kPanel + r] = x[(r0 + r) * ld + c];
      std::fill(panel + c * kPanel + h, panel + (c + 1) * kPanel, 0.0f);
    }
  }
}

#if HEADGRAD_TILE_AVX512

bool available() { return __builtin_cpu_supports("avx512f"); }

namespace {

// GCC 12's unpack intrinsics start from _mm512_undefined_ps(), which its
// -Wmaybe-uninitialized takes for a read of an unset value (GCC PR 105593).
#if !defined(__clang__)  // clang has no such warning (and would warn of the unknown name)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f"))) inline __m512 lo64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}
__attribute__((target("avx512f"))) inline __m512 hi64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}

// r[i] := column i of the 16 x 16 block whose rows are r[0..15].
__attribute__((target("avx512f"))) inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {  // pairs of rows interleaved by 32 bits
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // then by 64 bits: each 128-bit lane holds a 4 x 4 block transposed
    r[i] = lo64(t[i], t[i + 2]);
    r[i + 1] = hi64(t[i], t[i + 2]);
    r[i + 2] = lo64(t[i + 1], t[i + 3]);
    r[i + 3] = hi64(t[i + 1], t[i + 3]);
  }
  for (int g = 0; g < 16; g += 8)  // then the 128-bit lanes, twice
    for (int i = 0; i < 4; ++i) {
      t[g + i] = _mm512_shuffle_f32x4(r[g + i], r[g + i + 4], 0x88);
      t[g + i + 4] = _mm512_shuffle_f32x4(r[g + i], r[g + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}

#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// pack_slice's transposed panels: panel[c * 32 + r] = x[(r0 + r) * ld + c],
// zero where r0 + r >= rows.
__attribute__((target("avx512f"))) void pack_transposed_avx512(float* out, std::int64_t stride, const float* x,
                                                               std::int64_t ld, std::int64_t rows,
                                                               std::int64_t cols) {
  __m512 block[16];
  for (std::int64_t r0 = 0; r0 < rows; r0 += kPanel) {
    float* panel = out + r0 / kPanel * stride;
    for (std::int64_t half = 0; half < kPanel; half += 16) {
      const std::int64_t first = r0 + half, h = std::clamp<std::int64_t>(rows - first, 0, 16);
      for (std::int64_t c0 = 0; c0 < cols; c0 += 16) {
        const std::int64_t w = std::min<std::int64_t>(16, cols - c0);
        const __mmask16 lanes = w == 16 ? __mmask16(0xffff) : __mmask16((1u << w) - 1);
        for (std::int64_t i = 0; i < 16; ++i)
          block[i] = i < h ? _mm512_maskz_loadu_ps(lanes, x + (first + i) * ld + c0) : _mm512_setzero_ps();
        transpose16(block);
        for (std::int64_t j = 0; j < w; ++j) _mm512_storeu_ps(panel + (c0 + j) * kPanel + half, block[j]);
      }
    }
  }
}

// C[0:MR, 0:nr] = alpha * sum_p A(r, p) panel[p] + beta * C, nr <= 32.
template <int MR>
__attribute__((target("avx512f"))) void micro(std::int64_t k, const float* a, std::int64_t a_row,
                                              std::int64_t a_col, const float* b, float alpha,
                                              float beta, float* c, std::int64_t ldc,
                                              std::int64_t nr) {
  __m512 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < k; ++p) {
    const __m512 b0 = _mm512_loadu_ps(b + p * kPanel), b1 = _mm512_loadu_ps(b + p * kPanel + 16);
    const float* ap = a + p * a_col;
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      const __m512 x = _mm512_set1_ps(ap[r * a_row]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
    }
  }
  const auto lanes = [](std::int64_t count) -> __mmask16 {
    return count >= 16 ? __mmask16(0xffff) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
  };
  const __mmask16 m0 = lanes(nr), m1 = lanes(nr - 16);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
    __m512 x0 = _mm512_mul_ps(va, acc[r][0]), x1 = _mm512_mul_ps(va, acc[r][1]);
    if (beta != 0.0f) {
      x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), x0);
      x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), x1);
    }
    _mm512_mask_storeu_ps(cr, m0, x0);
    _mm512_mask_storeu_ps(cr + 16, m1, x1);
  }
}

using Micro = void (*)(std::int64_t, const float*, std::int64_t, std::int64_t, const float*, float,
                       float, float*, std::int64_t, std::int64_t);

template <int... R>
constexpr auto micro_table(std::integer_sequence<int, R...>) {
  return std::array<Micro, sizeof...(R)>{&micro<R + 1>...};
}

}  // namespace

// Refuses a call on a CPU without AVX-512F: the micro-kernel's instructions
// would fault there (callers ask available() first).
static void require_avx512(const char* what) {
  static const bool ok = available();
  if (!ok) throw std::logic_error(std::string(what) + ": this CPU has no AVX-512F; check tile::available()");
}

void gemm(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t b_stride, float beta,
          float* c, std::int64_t ldc) {
  require_avx512("tile::gemm");
  constexpr int kRows = 12;
  static constexpr auto kMicro = micro_table(std::make_integer_sequence<int, kRows>{});  // 1..12 rows
  for (std::int64_t j = 0; j < n; j += kPanel) {
    const std::int64_t nr = std::min(kPanel, n - j);
    const float* panel = b + j / kPanel * b_stride;
    for (std::int64_t i = 0; i < m; i += kRows) {
      const std::int64_t mr = std::min<std::int64_t>(kRows, m - i);
      kMicro[static_cast<std::size_t>(mr - 1)](k, a + i * a_row, a_row, a_col, panel, alpha, beta,
                                               c + i * ldc + j, ldc, nr);
    }
  }
}

namespace {

// Room for the panels of a [k, n] op(B) (transposed: packed from b [n, k]) in
// the calling thread's own buffer, kept at its largest size (a vector, not a
// Tensor: it may outlive the caching allocator at exit). gemm_packing_b and
// gemm_blocked share it: neither calls the other.
Packed thread_panels(bool transposed, std::int64_t k, std::int64_t n) {
  thread_local std::vector<float> buffer;
  Packed panels;
  panels.transposed = transposed;
  panels.stride = k * kPanel;
  panels.per_slice = (n + kPanel - 1) / kPanel * panels.stride;
  if (static_cast<std::int64_t>(buffer.size()) < panels.per_slice)
    buffer.resize(static_cast<std::size_t>(panels.per_slice));
  panels.data = buffer.data();
  return panels;
}

}  // namespace

void gemm_packing_b(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                    float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                    float beta, float* c, std::int64_t ldc) {
  // op(B) [k, n] in panels: from b [k, n] as it is, or from b [n, k] transposed
  Packed panels = thread_panels(trans_b, k, n);
  pack_slice(panels, 0, b, ldb, trans_b ? n : k, trans_b ? k : n);
  gemm(m, n, k, alpha, a, trans_a ? 1 : lda, trans_a ? lda : 1, panels.data, panels.stride, beta, c,
       ldc);
}

// Large products in blocks, as a BLAS blocks them for the caches: op(B) in
// chunks of kChunkK x kChunkN packed per chunk (2 MiB at most, L2/L3), A
// read in place a block of kBlockRows rows at a time (at most 192 KiB: L2)
// against every panel of the chunk, so neither operand streams from memory
// once per panel. Each element's sum runs over k in order, chunk after chunk
// (a chunk after the first adds into C).
void gemm_blocked(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                  float beta, float* c, std::int64_t ldc) {
  require_avx512("tile::gemm_blocked");
  constexpr std::int64_t kChunkK = 512, kChunkN = 1024, kBlockRows = 96;
  const std::int64_t a_row = trans_a ? 1 : lda, a_col = trans_a ? lda : 1;
  for (std::int64_t j0 = 0; j0 < n; j0 += kChunkN) {
    const std::int64_t nc = std::min(kChunkN, n - j0);
    for (std::int64_t p0 = 0; p0 < k; p0 += kChunkK) {
      const std::int64_t kc = std::min(kChunkK, k - p0);
      Packed panels = thread_panels(trans_b, kc, nc);
      // op(B) rows [p0, p0 + kc), columns [j0, j0 + nc): of b [k, n] as it
      // is, or of b [n, k] transposed
      if (trans_b)
        pack_slice(panels, 0, b + j0 * ldb + p0, ldb, nc, kc);
      else
        pack_slice(panels, 0, b + p0 * ldb + j0, ldb, kc, nc);
      const float chunk_beta = p0 == 0 ? beta : 1.0f;
      for (std::int64_t i0 = 0; i0 < m; i0 += kBlockRows)
        gemm(std::min(kBlockRows, m - i0), nc, kc, alpha, a + i0 * a_row + p0 * a_col, a_row, a_col,
             panels.data, panels.stride, chunk_beta, c + i0 * ldc + j0, ldc);
    }
  }
}

namespace {

// op(B) [k, n] of 16-bit storage into float32 panels (the layout pack_slice
// gives the upcasts): rows of B widened whole, then cut into panels; rows of
// B^T (n of them, k long) widened 32 at a time in runs of kRun and written
// out transposed.
template <class H>
void pack_16bit(bool trans_b, std::int64_t n, std::int64_t k, const H* b, std::int64_t ldb,
                float* out, std::int64_t stride) {
  if (!trans_b) {
    thread_local std::vector<float> row;
    if (static_cast<std::int64_t>(row.size()) < n) row.resize(static_cast<std::size_t>(n));
    for (std::int64_t p = 0; p < k; ++p) {
      convert(b + p * ldb, row.data(), static_cast<std::size_t>(n));
      for (std::int64_t c0 = 0; c0 < n; c0 += kPanel) {
        const std::int64_t w = std::min(kPanel, n - c0);
        float* dst = out + c0 / kPanel * stride + p * kPanel;
        std::copy(row.data() + c0, row.data() + c0 + w, dst);
        std::fill(dst + w, dst + kPanel, 0.0f);
      }
    }
    return;
  }
  constexpr std::int64_t kRun = 128;
  float block[kPanel][kRun];
  for (std::int64_t r0 = 0; r0 < n; r0 += kPanel) {
    const std::int64_t h = std::min(kPanel, n - r0);
    float* panel = out + r0 / kPanel * stride;
    for (std::int64_t p0 = 0; p0 < k; p0 += kRun) {
      const std::int64_t len = std::min(kRun, k - p0);
      for (std::int64_t r = 0; r < h; ++r)
        convert(b + (r0 + r) * ldb + p0, block[r], static_cast<std::size_t>(len));
      for (std::int64_t r = h; r < kPanel; ++r) std::fill(block[r], block[r] + len, 0.0f);
      for (std::int64_t p = 0; p < len; ++p)
        for (std::int64_t r = 0; r < kPanel; ++r) panel[(p0 + p) * kPanel + r] = block[r][p];
    }
  }
}

template <class H>
void gemm_16bit_impl(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                     const H* a, std::int64_t lda, const H* b, std::int64_t ldb, H* c,
                     std::int64_t ldc) {
  require_avx512("tile::gemm_16bit");
  // the thread's own buffers, kept at their largest size (see gemm_packing_b)
  thread_local std::vector<float> panels, rows, result;
  const std::int64_t stride = k * kPanel;
  const std::int64_t packed = (n + kPanel - 1) / kPanel * stride;
  if (static_cast<std::int64_t>(panels.size()) < packed) panels.resize(static_cast<std::size_t>(packed));
  pack_16bit(trans_b, n, k, b, ldb, panels.data(), stride);
  // A and C in blocks of whole micro-kernel row groups, about 192 KiB of
  // float32 each at most (L2), never less than one group
  constexpr std::int64_t kGroup = 12, kBlockFloats = std::int64_t{48} << 10;
  const std::int64_t mb = std::min(
      m, std::max(kGroup, kBlockFloats / std::max<std::int64_t>({n, k, 1}) / kGroup * kGroup));
  if (static_cast<std::int64_t>(rows.size()) < mb * k) rows.resize(static_cast<std::size_t>(mb * k));
  if (static_cast<std::int64_t>(result.size()) < mb * n) result.resize(static_cast<std::size_t>(mb * n));
  for (std::int64_t i0 = 0; i0 < m; i0 += mb) {
    const std::int64_t h = std::min(mb, m - i0);
    // A(i, p) for the block's rows: row i of A stored (a_row k), or, for A =
    // X^T, row p of X's columns [i0, i0 + h) (a_row 1, a_col h)
    std::int64_t a_row = k, a_col = 1;
    if (!trans_a) {
      for (std::int64_t i = 0; i < h; ++i)
        convert(a + (i0 + i) * lda, rows.data() + i * k, static_cast<std::size_t>(k));
    } else {
      a_row = 1;
      a_col = h;
      for (std::int64_t p = 0; p < k; ++p)
        convert(a + p * lda + i0, rows.data() + p * h, static_cast<std::size_t>(h));
    }
    gemm(h, n, k, 1.0f, rows.data(), a_row, a_col, panels.data(), stride, 0.0f, result.data(), n);
    for (std::int64_t i = 0; i < h; ++i)
      convert(result.data() + i * n, c + (i0 + i) * ldc, static_cast<std::size_t>(n));
  }
}

}  // namespace

void gemm_16bit(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb, BFloat16* c,
                std::int64_t ldc) {
  gemm_16bit_impl(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
}

void gemm_16bit(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                const Float16* a, std::int64_t lda, const Float16* b, std::int64_t ldb, Float16* c,
                std::int64_t ldc) {
  gemm_16bit_impl(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
}

#else

bool available() { return false; }

void gemm(std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t, std::int64_t,
          const float*, std::int64_t, float, float*, std::int64_t) {
  throw std::logic_error("tile::gemm: built without AVX-512 support; check available()");
}

void gemm_packing_b(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                    std::int64_t, const float*, std::int64_t, float, float*, std::int64_t) {
  throw std::logic_error("tile::gemm_packing_b: built without AVX-512 support; check available()");
}

void gemm_blocked(bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*,
                  std::int64_t, const float*, std::int64_t, float, float*, std::int64_t) {
  throw std::logic_error("tile::gemm_blocked: built without AVX-512 support; check available()");
}

void gemm_16bit(bool, bool, std::int64_t, std::int64_t, std::int64_t, const BFloat16*, std::int64_t,
                const BFloat16*, std::int64_t, BFloat16*, std::int64_t) {
  throw std::logic_error("tile::gemm_16bit: built without AVX-512 support; check available()");
}

void gemm_16bit(bool, bool, std::int64_t, std::int64_t, std::int64_t, const Float16*, std::int64_t,
                const Float16*, std::int64_t, Float16*, std::int64_t) {
  throw std::logic_error("tile::gemm_16bit: built without AVX-512 support; check available()");
}

#endif

}  // namespace headgrad::tile
