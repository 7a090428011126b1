// The matrix product under every op, through the BLAS headgrad was built with
// (BLIS or OpenBLAS, chosen at configure time: meson option `blas`). Fused
// plugins call blas::gemm on raw tiles and so need no BLAS of their own.
#pragma once

#include <cstdint>
#include <string>

#include <headgrad/half.hpp>

namespace headgrad::blas {

// C [m, n] = alpha * op(A) op(B) + beta * C, all row-major, op(X) = X^T when
// trans_X. lda/ldb/ldc are the row strides of A, B, C as stored.
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
          const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc);
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
          const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta,
          double* c, std::int64_t ldc);

// The BLAS's own product: what gemm does, without the packed kernel
// (tile_gemm.hpp) that gemm sends float32 products to. `headgrad bench`'s
// sgemm/dgemm yardstick times this, so its rate is the BLAS's.
void library_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                  std::int64_t ldc);
void library_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
                  const double* a, std::int64_t lda, const double* b, std::int64_t ldb, double beta,
                  double* c, std::int64_t ldc);

// Whether gemm (float32) sends a product of this shape, called now on this
// thread, to tile_gemm.hpp's per-call packing rather than the BLAS: AVX-512,
// one BLAS thread, more than the tiny-product loop takes and within
// tile::fits_per_call. kernels::matmul runs its 16-bit products there only
// when their float32 upcasts would have gone there, so both give one result.
bool float32_on_tiles(std::int64_t m, std::int64_t n, std::int64_t k);
// Whether gemm (float32) sends a product of this shape, on one thread, to
// tile::gemm_blocked: AVX-512, one BLAS thread, larger than float32_on_tiles
// takes, at least 12 x 32 x 32. On two or more threads each worker's piece of
// a split product asks the same of its own shape.
bool float32_blocked(std::int64_t m, std::int64_t n, std::int64_t k);
// Where float32 products run, for reports: "the packed AVX-512 kernel" on a
// CPU with AVX-512F (nearly all: those float32_on_tiles or float32_blocked
// take, and with BLIS each worker's piece alike; the BLAS the rest), else
// "the BLAS".
std::string float32_products_info();

// bfloat16 products on the CPU's bfloat16 dot products (bf16_gemm.cpp):
// C [m, n] = op(A) op(B), bfloat16 in and out, each element a float32 sum
// rounded once to bfloat16 (to nearest even). Not the bits of the float32
// product of the upcasts: the sum runs in another order, within the same
// error bound (k float32 additions, then the one rounding). gemm_bf16 splits
// a large product over headgrad's workers as the BLAS would (one thread under
// SerialBlasScope). kernels::matmul sends its bfloat16 products here when
// bf16_products(): built with oneDNN (meson option `onednn`), a CPU with
// AVX512-BF16, and not switched off by HEADGRAD_BF16_GEMM=float32 (read once)
// or set_bf16_products(false) (tests and benchmarks compare both paths).
bool bf16_products();
void set_bf16_products(bool on);
std::string bf16_products_info();  // e.g. "oneDNN 2.6.3 (avx512_core_bf16)", or why not
void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const BFloat16* a,
               std::int64_t lda, const BFloat16* b, std::int64_t ldb, BFloat16* c, std::int64_t ldc);

// Threads one large product may use (on BLIS, and for gemm_bf16, such a
// product is split over headgrad's workers by blocks of rows or columns,
// each block one call on one thread; OpenBLAS keeps its own threads).
// headgrad::set_num_threads sets it along with headgrad's own workers;
// SerialBlasScope lowers it to 1 for a while.
void set_num_threads(int n);
int num_threads();

// For a program's main(), before its first matrix product and before it
// starts threads: lets BLIS use its AVX-512 kernels on an AVX-512 CPU that it
// would otherwise not trust with them (a virtual machine's), by setting
// BLIS_ARCH_TYPE in the process environment unless the user set it. The
// library never calls it itself: loading libheadgrad changes no environment.
void select_kernels_for_this_cpu();

struct Info {
  std::string library;  // "BLIS" or "OpenBLAS"
  std::string version;  // e.g. "0.9.0", or OpenBLAS's build configuration
  std::string kernel;   // the kernel set picked for this CPU, e.g. "haswell"
};
const Info& info();

}  // namespace headgrad::blas
