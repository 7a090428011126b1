// Internal: walking the elements of strided tensors in row-major order.
//
// Shapes and strides here come from Tensors, whose constructor checked that
// the product of the sizes and every element's offset fit int64 (tensor.cpp):
// no product below can wrap.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "headgrad/parallel.hpp"

namespace headgrad::detail {

// Calls f(offsets) for each element of rows [row_begin, row_end) of `shape`
// (a row: one run of the innermost dim), in row-major order, where offsets[k]
// is the storage offset (in elements) of that element in tensor k (described
// by strides[k] and base[k]). The innermost dimension runs in a tight loop;
// the outer dims carry an odometer.
template <std::size_t N, class F>
void for_each_offsets_rows(std::span<const std::int64_t> shape,
                           const std::array<std::span<const std::int64_t>, N>& strides,
                           const std::array<std::int64_t, N>& base, std::int64_t row_begin,
                           std::int64_t row_end, F&& f) {
  const std::size_t nd = shape.size();
  if (row_begin >= row_end) return;
  if (nd == 0) {
    f(base);
    return;
  }
  std::vector<std::int64_t> idx(nd, 0);
  std::array<std::int64_t, N> off = base;
  for (std::int64_t d = static_cast<std::int64_t>(nd) - 2, rest = row_begin; d >= 0; --d) {
    idx[d] = rest % shape[d];
    rest /= shape[d];
    for (std::size_t k = 0; k < N; ++k) off[k] += idx[d] * strides[k][d];
  }
  const std::int64_t inner = shape[nd - 1];
  std::array<std::int64_t, N> step;
  for (std::size_t k = 0; k < N; ++k) step[k] = strides[k][nd - 1];
  for (std::int64_t row = row_begin; row < row_end; ++row) {
    std::array<std::int64_t, N> o = off;
    for (std::int64_t i = 0; i < inner; ++i) {
      f(o);
      for (std::size_t k = 0; k < N; ++k) o[k] += step[k];
    }
    for (std::int64_t d = static_cast<std::int64_t>(nd) - 2; d >= 0; --d) {
      ++idx[d];
      for (std::size_t k = 0; k < N; ++k) off[k] += strides[k][d];
      if (idx[d] < shape[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * shape[d];
      idx[d] = 0;
    }
  }
}

inline std::int64_t row_count(std::span<const std::int64_t> shape) {
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < shape.size(); ++d) rows *= shape[d];
  for (auto s : shape)
    if (s == 0) return 0;
  return rows;
}

// Every element of `shape`, in row-major order (see for_each_offsets_rows).
template <std::size_t N, class F>
void for_each_offsets(std::span<const std::int64_t> shape,
                      const std::array<std::span<const std::int64_t>, N>& strides,
                      const std::array<std::int64_t, N>& base, F&& f) {
  for_each_offsets_rows<N>(shape, strides, base, 0, row_count(shape), f);
}

// Below this many elements an elementwise loop stays on the calling thread.
inline constexpr std::int64_t kParallelMinElements = 1 << 15;

// for_each_offsets split by rows over headgrad's workers, for loops where f
// writes tensor 0 at its own offset only. A written tensor that repeats an
// element (a stride-0 dim of size > 1) keeps the serial order.
template <std::size_t N, class F>
void parallel_for_each_offsets(std::span<const std::int64_t> shape,
                               const std::array<std::span<const std::int64_t>, N>& strides,
                               const std::array<std::int64_t, N>& base, F&& f) {
  const std::int64_t rows = row_count(shape);
  bool aliased = false;
  for (std::size_t d = 0; d < shape.size(); ++d) aliased |= shape[d] > 1 && strides[0][d] == 0;
  if (aliased || shape.empty()) return for_each_offsets_rows<N>(shape, strides, base, 0, rows, f);
  const std::int64_t inner = std::max<std::int64_t>(shape.back(), 1);
  parallel_for(
      rows,
      [&](std::int64_t r0, std::int64_t r1, int) {
        for_each_offsets_rows<N>(shape, strides, base, r0, r1, f);
      },
      std::max<std::int64_t>(1, kParallelMinElements / inner));
}

// f(i) for i in [0, n) over headgrad's workers, for contiguous elementwise loops.
template <class F>
void parallel_elements(std::int64_t n, F&& f) {
  parallel_for(
      n,
      [&](std::int64_t i0, std::int64_t i1, int) {
        for (std::int64_t i = i0; i < i1; ++i) f(i);
      },
      kParallelMinElements);
}

}  // namespace headgrad::detail
