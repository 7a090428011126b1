// A large matrix product split over headgrad's workers: blocks of 32 rows of
// C (or of 32 columns, when C has more columns than rows), one contiguous
// range of blocks per worker, each range a call of its own on one thread.
// blas.cpp splits BLIS's products this way (BLIS 0.9 starts and joins its
// pthreads on every call, 0.1-0.25 ms on a virtual machine: a 512^3 sgemm
// took 0.95 ms on BLIS's two threads, 0.70 ms split here), bf16_gemm.cpp
// oneDNN's (which must not start OpenMP threads). Every element of C is the
// same sum as in one call over the whole product: the split is over rows or
// columns, never over k. Also the size rule the three share: macs, and the
// product size below which none splits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "headgrad/parallel.hpp"

namespace headgrad::blas {

// m * n * k multiply-adds, saturated: sizes that each fit int64 may not
// multiply to one (the product only picks a code path).
inline std::int64_t macs(std::int64_t m, std::int64_t n, std::int64_t k) {
  std::int64_t mn = 0, mnk = 0;
  if (__builtin_mul_overflow(m, n, &mn) || __builtin_mul_overflow(mn, k, &mnk))
    return std::numeric_limits<std::int64_t>::max();
  return mnk;
}

// Below this many multiply-adds a product runs on one thread: splitting it
// (or BLIS starting its pthreads for it) costs more than it saves.
constexpr std::int64_t kSplitMinMacs = std::int64_t{1} << 21;

// piece(i0, rows, j0, cols) computes C's rows [i0, i0 + rows) and columns
// [j0, j0 + cols); a piece of op(A) starts at row i0: a + (trans_a ? i0 : i0 * lda),
// of op(B) at column j0: b + (trans_b ? j0 * ldb : j0), of C at c + i0 * ldc + j0.
template <class Piece>
void split_product(std::int64_t m, std::int64_t n, Piece&& piece) {
  constexpr std::int64_t kBlock = 32;
  const bool by_rows = m >= n;
  const std::int64_t total = by_rows ? m : n;
  parallel_for((total + kBlock - 1) / kBlock, [&](std::int64_t b0, std::int64_t b1, int) {
    const std::int64_t first = b0 * kBlock, count = std::min(total, b1 * kBlock) - first;
    if (by_rows)
      piece(first, count, std::int64_t{0}, n);
    else
      piece(std::int64_t{0}, m, first, count);
  });
}

}  // namespace headgrad::blas
