// The row kernels under softmax and the fused attention cores
// (<headgrad/kernels.hpp>, core/src/ops/exp_row.cpp and kernels.cpp):
// exp_shift_row against std::exp (ulps over float64's whole range, the
// float32 and float64 under/overflow edges, NaN, masked tails; float32 on its
// AVX-512 path and on the portable one) and row_max against a plain running max.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "headgrad/kernels.hpp"

namespace test_kernels {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;

// ---------------------------------------------------------------- exp of a row

// The float32 exponential on both its paths: exp_shift_row (AVX-512's own
// where the CPU has it) and exp_shift_row_portable (the AVX2 / baseline loop).
using ExpRow = float (*)(float*, std::int64_t, float);
struct ExpPath {
  const char* name;
  ExpRow fn;
};
class ExpShiftRowFloat32 : public ::testing::TestWithParam<ExpPath> {};

TEST_P(ExpShiftRowFloat32, WithinTwoUlpOfStdExpAndZeroForMinusInfinity) {
  std::vector<float> x;
  for (float v = -95.0f; v < 80.0f; v += 0.0137f) x.push_back(v);  // the sum stays finite
  x.push_back(-std::numeric_limits<float>::infinity());
  std::vector<float> y = x;
  const float shift = 0.25f;
  const float sum = GetParam().fn(y.data(), static_cast<std::int64_t>(y.size()), shift);
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

// Rows of every length from 1 to 40 (whole vectors and masked tails): each
// element within 2 ulp of std::exp, NaN kept, and a row's sum unchanged, bit
// for bit, by a tail of -inf (the lanes a causally cut row leaves out).
TEST_P(ExpShiftRowFloat32, TailsNaNAndTrailingZerosKeepTheSum) {
  for (std::int64_t n = 1; n <= 40; ++n) {
    std::vector<float> a(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) a[static_cast<std::size_t>(i)] = std::sin(1.7f * float(i)) * 9.0f;
    const std::vector<float> orig = a;
    std::vector<float> b = a;
    b.resize(a.size() + 21, -std::numeric_limits<float>::infinity());
    const float sa = GetParam().fn(a.data(), n, 1.0f);
    const float sb = GetParam().fn(b.data(), static_cast<std::int64_t>(b.size()), 1.0f);
    EXPECT_EQ(sa, sb) << "n " << n;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::size_t at = static_cast<std::size_t>(i);
      const float want = std::exp(orig[at] - 1.0f);
      const float ulp = std::nextafter(want, std::numeric_limits<float>::infinity()) - want;
      EXPECT_LE(std::abs(double(a[at]) - double(want)), 2.0 * double(ulp)) << "n " << n << ", element " << i;
    }
    for (std::size_t i = a.size(); i < b.size(); ++i) EXPECT_EQ(b[i], 0.0f);
    std::vector<float> with_nan = orig;
    with_nan[static_cast<std::size_t>(n / 2)] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(std::isnan(GetParam().fn(with_nan.data(), n, 0.0f))) << "n " << n;
    EXPECT_TRUE(std::isnan(with_nan[static_cast<std::size_t>(n / 2)])) << "n " << n;
  }
}

// |a - b| in units in the last place of b (a subnormal b: of the smallest
// subnormal), for doubles of the same sign.
double ulps_apart(double a, double b) {
  const double ulp = std::nextafter(b, std::numeric_limits<double>::infinity()) - b;
  return std::abs(a - b) / ulp;
}

// The float64 exponential (a vectorized polynomial, not std::exp) within 1
// ulp of std::exp across its whole range: from where exp is 0, through the
// subnormal results below -708.4, to the last finite value at ln(DBL_MAX).
TEST(ExpShiftRow, Float64WithinOneUlpOfStdExpOverItsWholeRange) {
  std::vector<double> x;
  for (double v = -746.0; v < 710.0; v += 0.000731) x.push_back(v);  // 2 M points
  for (double v = -1.0; v < 1.0; v += 1.37e-5) x.push_back(v);       // k = 0 and the first steps
  for (double v = 1e-300; v < 1e-3; v *= 3.7) x.push_back(v), x.push_back(-v);  // exp(v) near 1
  const double ln_max = std::log(std::numeric_limits<double>::max());
  for (int i = 0; i < 1000; ++i) x.push_back(ln_max - 1e-13 * i);      // the top edge, finite
  std::vector<double> y = x;
  kernels::exp_shift_row(y.data(), static_cast<std::int64_t>(y.size()), 0.0);
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(x[i]);
    ASSERT_EQ(std::isfinite(y[i]), std::isfinite(want)) << "exp(" << x[i] << ") = " << y[i];
    if (want == 0.0) {
      EXPECT_EQ(y[i], 0.0) << "exp(" << x[i] << ")";
      continue;
    }
    const double u = ulps_apart(y[i], want);
    if (u > worst) worst = u, at = i;
  }
  EXPECT_LE(worst, 1.0) << "at exp(" << x[at] << "): " << y[at] << " against " << std::exp(x[at]);
}

// Its edges: -inf and everything below -745.14 give exactly 0, +inf and
// everything above ln(DBL_MAX) give inf (so a softmax without its max
// subtracted overflows as with std::exp), NaN stays NaN; the shift is
// subtracted first.
TEST(ExpShiftRow, Float64UnderflowOverflowAndNaN) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double ln_max = std::log(std::numeric_limits<double>::max());
  const std::vector<double> x = {-inf, -1e300, -800.0, -745.2, -745.0, -740.0, -708.5, 0.0,
                                 ln_max, std::nextafter(709.79, 0.0), 709.79, 710.0, 1e300, inf, nan};
  std::vector<double> y = x;
  for (std::size_t i = 0; i < x.size(); ++i) {
    kernels::exp_shift_row(&y[i], 1, 0.0);
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]));
      continue;
    }
    const double want = std::exp(x[i]);
    if (want == 0.0 || std::isinf(want))
      EXPECT_EQ(y[i], want) << "exp(" << x[i] << ")";
    else
      EXPECT_LE(ulps_apart(y[i], want), 1.0) << "exp(" << x[i] << ") = " << y[i] << ", std::exp " << want;
  }
  EXPECT_EQ(y[0], 0.0);
  EXPECT_GT(y[5], 0.0);  // exp(-740) is a subnormal, not flushed
  EXPECT_LT(y[5], std::numeric_limits<double>::min());
  EXPECT_EQ(y[11], inf);  // exp(710)
  // the shift moves the edge with it: exp(710 - 1) is finite, exp(711 - 0.5) is not
  std::vector<double> z = {710.0, 711.0};
  kernels::exp_shift_row(z.data(), 1, 1.0);
  kernels::exp_shift_row(z.data() + 1, 1, 0.5);
  EXPECT_LE(ulps_apart(z[0], std::exp(709.0)), 1.0);
  EXPECT_EQ(z[1], inf);
}

TEST(ExpShiftRow, Float64TrailingZerosKeepTheSum) {
  const std::vector<double> orig = {0.5, -1.25, 3.0, -7.5, 2.25, 0.0, -0.125, 1.5, 4.0, -2.0, 0.75};
  std::vector<double> a = orig, b = orig;
  b.resize(a.size() + 13, -std::numeric_limits<double>::infinity());  // a masked tail
  const double sa = kernels::exp_shift_row(a.data(), static_cast<std::int64_t>(a.size()), 1.0);
  const double sb = kernels::exp_shift_row(b.data(), static_cast<std::int64_t>(b.size()), 1.0);
  EXPECT_EQ(sa, sb);  // bit for bit
  double total = 0;
  for (std::size_t i = 0; i < orig.size(); ++i) {
    EXPECT_LE(ulps_apart(a[i], std::exp(orig[i] - 1.0)), 1.0);
    total += a[i];
  }
  EXPECT_NEAR(sa, total, 1e-15 * total);
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
TEST_P(ExpShiftRowFloat32, OverflowsToInfinityPastItsRange) {
  const float kFloatInf = std::numeric_limits<float>::infinity();
  std::vector<float> x;
  for (float v = 85.0f; v < 88.72f; v += 0.00731f) x.push_back(v);
  x.push_back(std::nextafter(std::log(std::numeric_limits<float>::max()), 0.0f));
  const std::size_t finite = x.size();
  x.insert(x.end(), {88.75f, 89.0f, 100.0f, 1.0e30f, kFloatInf});
  std::vector<float> y = x;
  const float sum = GetParam().fn(y.data(), static_cast<std::int64_t>(y.size()), 0.0f);
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
  GetParam().fn(z.data(), 1, 0.5f);
  GetParam().fn(z.data() + 1, 1, 0.25f);
  EXPECT_FLOAT_EQ(z[0], std::exp(88.5f));
  EXPECT_EQ(z[1], kFloatInf);
}

INSTANTIATE_TEST_SUITE_P(Paths, ExpShiftRowFloat32,
                         ::testing::Values(ExpPath{"dispatched", &kernels::exp_shift_row},
                                           ExpPath{"portable", &kernels::exp_shift_row_portable}),
                         [](const ::testing::TestParamInfo<ExpPath>& p) { return std::string(p.param.name); });

}  // namespace

}  // namespace test_kernels
