// The one file that knows which BLAS is linked (HEADGRAD_BLAS_BLIS or
// HEADGRAD_BLAS_OPENBLAS, set by meson from the `blas` option).
#include "headgrad/blas.hpp"

#include <atomic>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "headgrad/parallel.hpp"
#include "headgrad/tile_gemm.hpp"
#include "ops/split_product.hpp"

#if defined(HEADGRAD_BLAS_BLIS)
#include <blis.h>
#elif defined(HEADGRAD_BLAS_OPENBLAS)
#include <cblas.h>
#else
#error "define HEADGRAD_BLAS_BLIS or HEADGRAD_BLAS_OPENBLAS (meson does)"
#endif

namespace headgrad::blas {

namespace {

// Products this small (the closed-book case's heads, a few tokens) cost less
// as a plain loop than a BLAS call's fixed ~1 us of setup (measured on BLIS 0.9).
constexpr std::int64_t kTinyMaxMacs = 512;

// A product the blocked packed kernel (tile::gemm_blocked) runs at least as
// fast as BLIS (docs/performance.md): every dimension at least a
// micro-kernel's block (12 rows, a 32-column panel) and a sum of 32 or more.
bool blocked_shape(std::int64_t m, std::int64_t n, std::int64_t k) { return m >= 12 && n >= 32 && k >= 32; }

template <class T>
void tiny_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
               const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
               std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      T acc = 0;
      for (std::int64_t p = 0; p < k; ++p)
        acc += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      T& out = c[i * ldc + j];
      out = beta == T(0) ? alpha * acc : alpha * acc + beta * out;  // BLAS: beta 0 ignores C
    }
}

#if defined(HEADGRAD_BLAS_BLIS)

// BLIS 0.9 takes its AVX-512 kernels (skx) only when it can tell from the
// CPU's model name that the core has two FMA units; a virtual machine's
// generic name ("Intel(R) Xeon(R) Processor") makes it fall back to its AVX2
// kernels (haswell) at half the speed: sgemm 67 against 136 GFLOP/s on such
// a machine. With one FMA unit skx does the same FLOPs per cycle as haswell,
// so an AVX-512 CPU loses nothing with skx. BLIS 0.9 has no API to choose the
// kernel set (its arch setter and context registry are not exported); it
// reads BLIS_ARCH_TYPE (a number: its arch_t id) once, at its first call.
bool avx512_kernels_wanted() {
  // BLIS_CONFIG_SKX: this BLIS was built with the skx kernels (naming an arch
  // it lacks would make it abort).
#if defined(__x86_64__) && defined(__GNUC__) && defined(BLIS_CONFIG_SKX)
  return !std::getenv("BLIS_ARCH_TYPE") && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

// BLIS takes a thread count per call (its runtime object), so the count lives
// here rather than in BLIS's global state; 0 = not yet set: headgrad's default.
std::atomic<int> g_threads{0};

int threads_for(std::int64_t m, std::int64_t n, std::int64_t k) {
  if (macs(m, n, k) < kSplitMinMacs) return 1;
  const int t = g_threads.load(std::memory_order_relaxed);
  return t > 0 ? t : headgrad::num_threads();
}

// One BLIS call on one thread.
template <class T>
void serial_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
                 const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
                 std::int64_t ldc) {
  rntm_t rntm = BLIS_RNTM_INITIALIZER;
  bli_rntm_set_num_threads(1, &rntm);
  const trans_t opa = ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE;
  const trans_t opb = tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE;
  // BLIS's typed API takes general strides and non-const pointers; it does not
  // write through a or b.
  if constexpr (std::is_same_v<T, float>)
    bli_sgemm_ex(opa, opb, m, n, k, &alpha, const_cast<T*>(a), lda, 1, const_cast<T*>(b), ldb, 1,
                 &beta, c, ldc, 1, nullptr, &rntm);
  else
    bli_dgemm_ex(opa, opb, m, n, k, &alpha, const_cast<T*>(a), lda, 1, const_cast<T*>(b), ldb, 1,
                 &beta, c, ldc, 1, nullptr, &rntm);
}

// A product with more than one thread is split over headgrad's workers
// (split_product.hpp), not handed to BLIS's threads, which it would start
// and join on this call.
// on_tiles: float32 pieces may run on the packed kernel (false: the BLAS's
// own product, library_gemm).
template <class T>
void gemm_impl(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
               const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
               std::int64_t ldc, bool on_tiles) {
  if (threads_for(m, n, k) < 2) return serial_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  static const bool tiles = tile::available();
  split_product(m, n, [&](std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) {
    const T* pa = a + (ta ? i0 : i0 * lda);
    const T* pb = b + (tb ? j0 * ldb : j0);
    T* pc = c + i0 * ldc + j0;
    // a piece of float32 small enough for the packed kernel goes there, as a
    // one-thread call of its shape would (float32_on_tiles)
    if constexpr (std::is_same_v<T, float>)
      if (tiles && on_tiles) {
        if (tile::fits_per_call(rows, cols, k))
          return tile::gemm_packing_b(ta, tb, rows, cols, k, alpha, pa, lda, pb, ldb, beta, pc, ldc);
        if (blocked_shape(rows, cols, k))
          return tile::gemm_blocked(ta, tb, rows, cols, k, alpha, pa, lda, pb, ldb, beta, pc, ldc);
      }
    serial_gemm(ta, tb, rows, cols, k, alpha, pa, lda, pb, ldb, beta, pc, ldc);
  });
}

Info make_info() {
  bli_init();  // the kernel registry first: querying the arch before it aborts
  return {"BLIS", bli_info_get_version_str(), bli_arch_string(bli_arch_query_id())};
}

#else  // OpenBLAS

template <class T>
void gemm_impl(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, T alpha,
               const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c,
               std::int64_t ldc, bool /*on_tiles: OpenBLAS keeps its own threads*/) {
  const auto opa = ta ? CblasTrans : CblasNoTrans;
  const auto opb = tb ? CblasTrans : CblasNoTrans;
  // CBLAS takes blasint (32-bit unless OpenBLAS was built with INTERFACE64):
  // a size it cannot hold is refused, not truncated.
  for (const std::int64_t v : {m, n, k, lda, ldb, ldc})
    if (v > std::numeric_limits<blasint>::max())
      throw std::invalid_argument("gemm: size " + std::to_string(v) + " (m " + std::to_string(m) +
                                  ", n " + std::to_string(n) + ", k " + std::to_string(k) +
                                  ") does not fit this OpenBLAS's " +
                                  std::to_string(8 * sizeof(blasint)) + "-bit integers");
  const auto i = [](std::int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, opa, opb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
  else
    cblas_dgemm(CblasRowMajor, opa, opb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
}

Info make_info() { return {"OpenBLAS", openblas_get_config(), openblas_get_corename()}; }

#endif

}  // namespace

// attention-sized products when the BLAS runs one thread (one-thread runs,
// and the workers under SerialBlasScope): B packed, A read in place
// (tile_gemm.hpp), where the BLAS would pack both
bool float32_on_tiles(std::int64_t m, std::int64_t n, std::int64_t k) {
  static const bool tiles = tile::available();
  return tiles && macs(m, n, k) > kTinyMaxMacs && tile::fits_per_call(m, n, k) && num_threads() == 1;
}

bool float32_blocked(std::int64_t m, std::int64_t n, std::int64_t k) {
  static const bool tiles = tile::available();
  return tiles && !tile::fits_per_call(m, n, k) && blocked_shape(m, n, k) && num_threads() == 1;
}

std::string float32_products_info() {
  if (!tile::available()) return "the BLAS";
#if defined(HEADGRAD_BLAS_OPENBLAS)
  return "the packed AVX-512 kernel (on one thread; OpenBLAS on more)";  // gemm_impl keeps OpenBLAS's threads
#else
  return "the packed AVX-512 kernel";
#endif
}

void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  if (macs(m, n, k) <= kTinyMaxMacs) return tiny_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (float32_on_tiles(m, n, k))
    return tile::gemm_packing_b(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (float32_blocked(m, n, k))
    return tile::gemm_blocked(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  gemm_impl(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, /*on_tiles=*/true);
}

void gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta,
          double* c, std::int64_t ldc) {
  if (macs(m, n, k) <= kTinyMaxMacs) return tiny_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  gemm_impl(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, /*on_tiles=*/false);
}

void library_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                  std::int64_t ldc) {
  gemm_impl(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, /*on_tiles=*/false);
}

void library_gemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
                  const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta,
                  double* c, std::int64_t ldc) {
  gemm_impl(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, /*on_tiles=*/false);
}

#if defined(HEADGRAD_BLAS_BLIS)
void set_num_threads(int n) { g_threads.store(n > 0 ? n : 0); }
int num_threads() {
  const int t = g_threads.load();
  return t > 0 ? t : headgrad::num_threads();
}
#else
void set_num_threads(int n) { openblas_set_num_threads(n > 0 ? n : headgrad::num_threads()); }
int num_threads() { return openblas_get_num_threads(); }
#endif

void select_kernels_for_this_cpu() {
#if defined(HEADGRAD_BLAS_BLIS)
  if (avx512_kernels_wanted())
    ::setenv("BLIS_ARCH_TYPE", std::to_string(static_cast<int>(BLIS_ARCH_SKX)).c_str(), /*overwrite=*/0);
#endif
}

const Info& info() {
  static const Info i = make_info();
  return i;
}

}  // namespace headgrad::blas
