// Shared helpers for the op tests (tests/test_ops_*.cpp): the input layouts
// (Layout, layout_name), shape_name for parameter names, make() for fresh
// float64 inputs in a given layout, and the checks expect_gradcheck,
// expect_values and expect_exact_values (expect_invalid: checks.hpp).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checks.hpp"
#include "headgrad/gradcheck.hpp"
#include "headgrad/ops.hpp"

namespace headgrad::test {

enum class Layout { contiguous, transposed, narrowed };
inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::transposed: return "transposed";
    case Layout::narrowed: return "narrowed";
  }
  return "?";
}

// "2x3x4", or "scalar" for [].
inline std::string shape_name(const Shape& s) {
  if (s.empty()) return "scalar";
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += 'x';
    out += std::to_string(s[i]);
  }
  return out;
}

// Fresh float64 values of `shape` laid out as asked: normal, or in [1.5, 2.5)
// when `positive` (for div and log). Transposed: a [.., n, m] tensor seen as
// [.., m, n] (a GEMM gets a transposition flag); narrowed: a slice of a wider
// last dim (a leading dimension larger than the row; 1-D: every other element).
inline Tensor make(const Shape& shape, Layout layout, std::uint64_t seed, bool positive = false) {
  Generator gen(seed);
  auto fill = [&](const Shape& s) {
    return positive ? rand_uniform(s, DType::float64, gen, 1.5, 2.5) : randn(s, DType::float64, gen);
  };
  if (shape.empty() || layout == Layout::contiguous) return fill(shape);
  if (layout == Layout::transposed && shape.size() >= 2) {
    Shape base = shape;
    std::swap(base[base.size() - 1], base[base.size() - 2]);
    return fill(base).transpose(-2, -1);
  }
  if (shape.size() >= 2) {
    Shape base = shape;
    base.back() += 3;
    return fill(base).narrow(-1, 1, shape.back());
  }
  Shape base = shape;
  base.push_back(2);
  return fill(base).narrow(-1, 1, 1).squeeze(-1);
}

// gradcheck passes and checks every element of every input.
inline void expect_gradcheck(const GradcheckFn& f, const std::vector<Tensor>& in) {
  const GradcheckResult r = gradcheck(f, in);
  EXPECT_TRUE(r.ok) << r.message;
  std::int64_t n = 0;
  for (const auto& t : in) n += t.numel();
  EXPECT_EQ(r.elements_checked, n);
}

// `got` has `shape` and values within a relative `tol` of `want`; an infinite
// wanted value must be matched exactly.
inline void expect_values(const Tensor& got, const Shape& shape, const std::vector<double>& want,
                          double tol = 1e-12) {
  ASSERT_EQ(got.shape(), shape);
  const std::vector<double> g = got.to_vector();
  ASSERT_EQ(g.size(), want.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(g[i], want[i]) << "element " << i;
    } else {
      EXPECT_NEAR(g[i], want[i], tol * (1.0 + std::abs(want[i]))) << "element " << i;
    }
  }
}

// `got` has `shape` and exactly the values `want` (for ops that move values
// and never round them).
inline void expect_exact_values(const Tensor& got, const Shape& shape, const std::vector<double>& want) {
  ASSERT_EQ(got.shape(), shape);
  EXPECT_EQ(got.to_vector(), want);
}

}  // namespace headgrad::test
