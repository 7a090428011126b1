// Attention-sized float32 products on AVX-512: C = alpha A B + beta C with B
// packed into panels of 32 columns and A read in place through any row and
// column strides (so A^T costs nothing). Two users:
// - fused_sdpa packs K, V, Q, dO ONCE per pass and multiplies every tile by
//   the packed panels (gemm below);
// - blas::gemm sends float32 products that fits_per_call (below) here
//   (gemm_packing_b: B packed per call, into a buffer per thread): the
//   per-head products of batched and per_head; kernels::matmul sends the
//   16-bit products whose upcasts would come here to gemm_16bit. Larger
//   float32 products (the projections) go to gemm_blocked, which packs op(B)
//   a chunk at a time and takes A a block of rows at a time, as a BLAS
//   blocks for the caches.
// BLIS packs both operands again on every call: on attention's shapes
// (128-256 rows, k 64-512) this runs 1.1x-1.6x its rate, and blocked, on the
// projections (2048 x 512 x 512) 1.05-1.1x; at 2048^3 the two are even
// (docs/performance.md). float64 and CPUs without AVX-512 keep the BLAS.
//
// Shape legend: m x n result, k the summed dimension; a panel is kPanel
// columns of B, row p of a panel at p * kPanel.
#pragma once

#include <cstdint>

#include <headgrad/half.hpp>
#include <headgrad/tensor.hpp>

namespace headgrad::tile {

constexpr std::int64_t kPanel = 32;

// AVX-512F at run time (the products below need it).
bool available();

// B operands of every slice of a [count, rows, cols] input, packed:
//   as_rows:       B = X [rows, cols] (k = rows, n = cols): panel c holds
//                  columns [32c, 32c + 32) of every row; a tile starts at any row.
//   as_transposed: B = X^T [cols, rows] (k = cols, n = rows): panel r holds
//                  rows [32r, 32r + 32); a tile starts at a multiple of 32 rows.
// Columns past the input's are zeros.
struct Packed {
  Tensor storage;  // [count * per_slice] float32, from the caching allocator
  float* data = nullptr;
  bool transposed = false;
  std::int64_t per_slice = 0;  // floats from one slice to the next
  std::int64_t stride = 0;     // floats from one panel to the next
  // the panels of the tile that starts at row r0 of slice n
  const float* at(std::int64_t n, std::int64_t r0) const {
    return data + n * per_slice + (transposed ? r0 / kPanel * stride : r0 * kPanel);
  }
};

// Sizes the pack for `count` slices of [rows, cols]; pack_slice fills slice n
// from x (row r at x + r * ld, columns contiguous). Slices are independent:
// threads may fill different ones.
Packed make_packed(std::int64_t count, std::int64_t rows, std::int64_t cols, bool transposed);
void pack_slice(Packed& p, std::int64_t n, const float* x, std::int64_t ld, std::int64_t rows,
                std::int64_t cols);

// C [m, n] (row stride ldc) = alpha * A B + beta * C, with A(i, p) at
// a[i * a_row + p * a_col] and B's panels from b (Packed::at), panel j at
// b + j * b_stride. beta = 0 ignores C (as BLAS does).
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t b_stride, float beta,
          float* c, std::int64_t ldc);

// C [m, n] = alpha op(A) op(B) + beta C as blas::gemm takes it (row-major,
// op(X) = X^T when trans_X), op(B) packed per call. For shapes that fits_per_call.
void gemm_packing_b(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                    float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                    float beta, float* c, std::int64_t ldc);
// The same for products of any size (gemm_packing_b's whole op(B) would not
// fit the caches): op(B) packed a chunk of k and n at a time, A taken a block
// of rows at a time. blas::gemm sends large float32 products here
// (float32_blocked): on this kernel they run faster than on BLIS's.
void gemm_blocked(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                  float beta, float* c, std::int64_t ldc);
// C [m, n] = op(A) op(B) on 16-bit operands and a 16-bit C: op(B) widened
// while it is packed, A widened a block of rows at a time, each block's
// float32 result rounded once into C. Every element is the same sum, in the
// same order, as gemm_packing_b on whole float32 upcasts (alpha 1, beta 0)
// followed by one rounding: the same bits, without float32 copies of the
// operands and of the result (kernels::matmul's 16-bit products).
void gemm_16bit(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                const BFloat16* a, std::int64_t lda, const BFloat16* b, std::int64_t ldb, BFloat16* c,
                std::int64_t ldc);
void gemm_16bit(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                const Float16* a, std::int64_t lda, const Float16* b, std::int64_t ldb, Float16* c,
                std::int64_t ldc);

// up to 512 rows, op(B) of up to 128K elements (half the L2): where packing B
// per call still beats BLIS; and any number of rows when op(B) is skinny (up
// to 16K elements, 64 KiB packed: P^T dO of a block of 128 queries against
// all its keys), where BLIS would pack the whole of A again for a product
// of so few columns or so short a sum
inline bool fits_per_call(std::int64_t m, std::int64_t n, std::int64_t k) {
  const std::int64_t b = n * k;
  return b <= (std::int64_t{1} << 14) || (m <= 512 && b <= (std::int64_t{1} << 17));
}

}  // namespace headgrad::tile
