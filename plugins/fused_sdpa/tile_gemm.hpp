// fused_sdpa's tile products on AVX-512, float32: C = alpha A B + beta C with
// B packed ONCE per call of the op into panels of 32 columns, and A read in
// place through any row and column strides (so A^T costs nothing). BLIS packs
// both operands again on every call, which at fused_sdpa's tiles (256 x 256 x
// 64, 256 x 64 x 256) was a quarter of the product's time: these run at
// 160-172 GFLOP/s where BLIS ran 90-129 on the same tiles (best of 200, one
// thread; docs/performance.md). float64 and CPUs without AVX-512 keep BLIS.
//
// Shape legend: m x n result, k the summed dimension; a panel is kPanel
// columns of B, row p of a panel at p * kPanel.
#pragma once

#include <cstdint>

#include <headgrad/tensor.hpp>

namespace headgrad::fused_sdpa::tile {

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

}  // namespace headgrad::fused_sdpa::tile
