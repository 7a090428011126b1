// The row kernels under softmax and the fused attention cores
// (<headgrad/kernels.hpp>, core/src/ops/exp_row.cpp and kernels.cpp):
// exp_shift_row against std::exp (ulps, the float32 overflow edge, masked
// tails) and row_max against a plain running max.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "headgrad/kernels.hpp"

namespace {

using namespace headgrad;

// ---------------------------------------------------------------- exp of a row

TEST(ExpShiftRow, Float32WithinTwoUlpOfStdExpAndZeroForMinusInfinity) {
  std::vector<float> x;
  for (float v = -95.0f; v < 80.0f; v += 0.0137f) x.push_back(v);  // the sum stays finite
  x.push_back(-std::numeric_limits<float>::infinity());
  std::vector<float> y = x;
  const float shift = 0.25f;
  const float sum = kernels::exp_shift_row(y.data(), static_cast<std::int64_t>(y.size()), shift);
  double worst_ulps = 0, total = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float v = x[i] - shift;
    total += y[i];
    if (v < -87.0f) {  // below expf's normal range: flushed to exactly 0
      EXPECT_EQ(y[i], 0.0f) << "exp(" << v << ")";
      continue;
    }
    const float want = std::exp(v);
    const float ulp = std::nextafter(want, std::numeric_limits<float>::infinity()) - want;
    worst_ulps = std::max(worst_ulps, std::abs(double(y[i]) - double(want)) / double(ulp));
  }
  EXPECT_LE(worst_ulps, 2.0);
  EXPECT_NEAR(sum, total, 1e-6 * total);
}

TEST(ExpShiftRow, Float64IsStdExpAndTrailingZerosKeepTheSum) {
  const std::vector<double> orig = {0.5, -1.25, 3.0, -7.5, 2.25, 0.0, -0.125, 1.5, 4.0, -2.0, 0.75};
  std::vector<double> a = orig, b = orig;
  b.resize(a.size() + 13, -std::numeric_limits<double>::infinity());  // a masked tail
  const double sa = kernels::exp_shift_row(a.data(), static_cast<std::int64_t>(a.size()), 1.0);
  const double sb = kernels::exp_shift_row(b.data(), static_cast<std::int64_t>(b.size()), 1.0);
  EXPECT_EQ(sa, sb);  // bit for bit
  for (std::size_t i = 0; i < orig.size(); ++i) EXPECT_EQ(a[i], std::exp(orig[i] - 1.0));
  for (std::size_t i = orig.size(); i < b.size(); ++i) EXPECT_EQ(b[i], 0.0);
}

// ---------------------------------------------------------------- max of a row

// kernels::row_max (16 lanes) against a plain running max, at lengths around
// the lane count, with the maximum placed at every position in turn.
TEST(RowMax, EqualsAPlainRunningMaxAtEveryLengthAndPosition) {
  constexpr float neg_inf = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(kernels::row_max(static_cast<const float*>(nullptr), 0), neg_inf);
  for (const std::int64_t n : {1, 2, 15, 16, 17, 31, 33, 100}) {
    for (std::int64_t at = 0; at < n; ++at) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (std::int64_t j = 0; j < n; ++j) x[static_cast<std::size_t>(j)] = std::sin(0.7f * j) - 2.0f;
      x[static_cast<std::size_t>(at)] = 1.5f + 0.001f * static_cast<float>(at);
      float plain = neg_inf;
      for (const float v : x) plain = std::max(plain, v);
      EXPECT_EQ(kernels::row_max(x.data(), n), plain) << "n " << n << ", max at " << at;
    }
  }
  // a fully masked row stays -inf; a NaN is skipped as by std::max(running, x)
  const std::vector<double> masked(40, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(kernels::row_max(masked.data(), 40), -std::numeric_limits<double>::infinity());
  std::vector<double> with_nan(20, -1.0);
  with_nan[3] = std::numeric_limits<double>::quiet_NaN();
  with_nan[19] = 2.0;
  EXPECT_EQ(kernels::row_max(with_nan.data(), 20), 2.0);
}

// exp_shift_row's float32 top edge: within 2 ulp of std::exp up to
// ln(FLT_MAX) = 88.72, and inf past it (a saturated exp(88) would let a
// softmax without max subtraction pass for a finite one).
TEST(ExpShiftRow, Float32OverflowsToInfinityPastItsRange) {
  const float kFloatInf = std::numeric_limits<float>::infinity();
  std::vector<float> x;
  for (float v = 85.0f; v < 88.72f; v += 0.00731f) x.push_back(v);
  x.push_back(std::nextafter(std::log(std::numeric_limits<float>::max()), 0.0f));
  const std::size_t finite = x.size();
  x.insert(x.end(), {88.75f, 89.0f, 100.0f, 1.0e30f, kFloatInf});
  std::vector<float> y = x;
  const float sum = kernels::exp_shift_row(y.data(), static_cast<std::int64_t>(y.size()), 0.0f);
  EXPECT_EQ(sum, kFloatInf);
  double worst_ulps = 0;
  for (std::size_t i = 0; i < finite; ++i) {
    const float want = std::exp(x[i]);
    ASSERT_TRUE(std::isfinite(want)) << x[i];
    ASSERT_TRUE(std::isfinite(y[i])) << "exp(" << x[i] << ") = " << y[i];
    const float ulp = std::nextafter(want, kFloatInf) - want;
    worst_ulps = std::max(worst_ulps, std::abs(double(y[i]) - double(want)) / double(ulp));
  }
  EXPECT_LE(worst_ulps, 2.0);
  for (std::size_t i = finite; i < x.size(); ++i) {
    EXPECT_EQ(std::exp(x[i]), kFloatInf) << x[i];
    EXPECT_EQ(y[i], kFloatInf) << "exp(" << x[i] << ")";
  }
  // the shift moves the edge with it: exp(89 - 0.5) is finite, exp(89.5 - 0.25) is not
  std::vector<float> z = {89.0f, 89.5f};
  kernels::exp_shift_row(z.data(), 1, 0.5f);
  kernels::exp_shift_row(z.data() + 1, 1, 0.25f);
  EXPECT_FLOAT_EQ(z[0], std::exp(88.5f));
  EXPECT_EQ(z[1], kFloatInf);
}

}  // namespace
