// Internal: walking the elements of strided tensors in row-major order.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace headgrad::detail {

// Calls f(offsets) for each element of `shape`, in row-major order, where
// offsets[k] is the storage offset (in elements) of that element in tensor k
// (described by strides[k] and base[k]). The innermost dimension runs in a
// tight loop; the outer dims carry an odometer.
template <std::size_t N, class F>
void for_each_offsets(std::span<const std::int64_t> shape,
                      const std::array<std::span<const std::int64_t>, N>& strides,
                      const std::array<std::int64_t, N>& base, F&& f) {
  const std::size_t nd = shape.size();
  for (auto s : shape)
    if (s == 0) return;
  if (nd == 0) {
    f(base);
    return;
  }
  std::vector<std::int64_t> idx(nd, 0);
  std::array<std::int64_t, N> off = base;
  const std::int64_t inner = shape[nd - 1];
  std::array<std::int64_t, N> step;
  for (std::size_t k = 0; k < N; ++k) step[k] = strides[k][nd - 1];
  while (true) {
    std::array<std::int64_t, N> o = off;
    for (std::int64_t i = 0; i < inner; ++i) {
      f(o);
      for (std::size_t k = 0; k < N; ++k) o[k] += step[k];
    }
    std::int64_t d = static_cast<std::int64_t>(nd) - 2;
    for (; d >= 0; --d) {
      ++idx[d];
      for (std::size_t k = 0; k < N; ++k) off[k] += strides[k][d];
      if (idx[d] < shape[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * shape[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace headgrad::detail
