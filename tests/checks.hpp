// Checks shared by the tests: all_close (docs/design.md's float64 tolerances by
// default) and all_finite on whole tensors, each naming the tensor and the
// worst element's index when it fails; product_worst_over_bound for 16-bit
// matrix products; contains on text; expect_invalid on
// an error message; read_text for a whole file; under_asan.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "headgrad/blas.hpp"
#include "headgrad/tensor.hpp"

// Whether this program is built with AddressSanitizer (gcc says so with
// __SANITIZE_ADDRESS__, clang through __has_feature): HG_UNDER_ASAN for the
// preprocessor, under_asan for C++.
#if defined(__SANITIZE_ADDRESS__)
#define HG_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HG_UNDER_ASAN 1
#endif
#endif

namespace headgrad::test {

#ifdef HG_UNDER_ASAN
inline constexpr bool under_asan = true;
#else
inline constexpr bool under_asan = false;
#endif

// The whole file as text ("" when it cannot be read: the caller's checks say what was missing).
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream is(p);
  std::stringstream ss;
  ss << is.rdbuf();
  return ss.str();
}

// The worst error over its bound of a 16-bit product C = op(A) op(B) [m, n]
// (row stride ldc), A(i, p) at a.flat(p * lda + i) when ta, else
// a.flat(i * lda + p), B(p, j) likewise: each element against the float64 sum
// of the same values, |got - exact| over the bound of k float32 additions of
// exact products, then one rounding (unit roundoff u), plus `floor` (the
// output's smallest spacing). At most 1 for a correct product.
// The exact sums and the sums of |products| are two float64 products of the
// upcast operands (the BLAS's own dgemm): a product of two 16-bit values is
// exact in float64, and the sums' own rounding (k 2^-53 |a||b|) is 2^-29 of
// the bound. One pass per product, not one per element (a k-term loop per
// element took 26 s of the sanitizer build's test time).
inline double product_worst_over_bound(const Tensor& c, std::int64_t ldc, const Tensor& a, std::int64_t lda,
                                       bool ta, const Tensor& b, std::int64_t ldb, bool tb, std::int64_t m,
                                       std::int64_t n, std::int64_t k, double u, double floor) {
  const std::vector<double> av = a.to(DType::float64).to_vector(), bv = b.to(DType::float64).to_vector();
  std::vector<double> a_abs(av.size()), b_abs(bv.size());
  for (std::size_t e = 0; e < av.size(); ++e) a_abs[e] = std::abs(av[e]);
  for (std::size_t e = 0; e < bv.size(); ++e) b_abs[e] = std::abs(bv[e]);
  std::vector<double> exact(static_cast<std::size_t>(m * n)), mag(exact.size());
  blas::library_gemm(ta, tb, m, n, k, 1.0, av.data(), lda, bv.data(), ldb, 0.0, exact.data(), n);
  blas::library_gemm(ta, tb, m, n, k, 1.0, a_abs.data(), lda, b_abs.data(), ldb, 0.0, mag.data(), n);
  double worst = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const double e = exact[i * n + j];
      const double bound = 1.01 * double(k) * 0x1p-24 * mag[i * n + j] * (1 + u) + u * std::abs(e) + floor;
      const double over = std::abs(c.flat(i * ldc + j) - e) / bound;
      if (!(over <= worst)) worst = over;  // a NaN is the worst
    }
  return worst;
}

// |a - b| <= atol + rtol * |b| elementwise; NaN never passes. On failure: how
// many elements fail, and the one furthest beyond its tolerance.
inline ::testing::AssertionResult all_close(const std::string& what, const Tensor& a, const Tensor& b,
                                            double atol = 1e-8, double rtol = 1e-6) {
  if (!a.defined() || !b.defined())
    return ::testing::AssertionFailure() << what << ": undefined on the "
                                         << (a.defined() ? "right" : "left") << " side";
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << what << ": shapes " << shape_str(a.shape()) << " vs "
                                         << shape_str(b.shape());
  const std::vector<double> va = a.to_vector(), vb = b.to_vector();
  std::int64_t bad = 0, worst = -1;
  double worst_excess = 0.0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double diff = std::abs(va[i] - vb[i]);
    const double tol = atol + rtol * std::abs(vb[i]);
    if (diff <= tol) continue;
    ++bad;
    const double excess = std::isnan(diff) ? std::numeric_limits<double>::infinity() : diff - tol;
    if (worst < 0 || excess > worst_excess) {
      worst = static_cast<std::int64_t>(i);
      worst_excess = excess;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os << what << " " << shape_str(a.shape()) << ": " << bad << " of " << va.size()
     << " elements beyond atol " << atol << " + rtol " << rtol << " * |b|; worst at "
     << shape_str(unravel_index(worst, a.shape())) << ": ";
  os.precision(17);
  os << va[static_cast<std::size_t>(worst)] << " vs " << vb[static_cast<std::size_t>(worst)];
  return ::testing::AssertionFailure() << os.str();
}

// The attention core's output and gradients (any result with out, dq, dk,
// dv) agree, each within atol + rtol * |b|.
template <class CoreResult>
void expect_core_close(const CoreResult& a, const CoreResult& b, double atol = 1e-8, double rtol = 1e-6) {
  EXPECT_TRUE(all_close("out", a.out, b.out, atol, rtol));
  EXPECT_TRUE(all_close("dq", a.dq, b.dq, atol, rtol));
  EXPECT_TRUE(all_close("dk", a.dk, b.dk, atol, rtol));
  EXPECT_TRUE(all_close("dv", a.dv, b.dv, atol, rtol));
}

// Every element finite; names the first that is not.
inline ::testing::AssertionResult all_finite(const std::string& what, const Tensor& t) {
  if (!t.defined()) return ::testing::AssertionFailure() << what << ": undefined";
  const std::vector<double> v = t.to_vector();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      return ::testing::AssertionFailure()
             << what << " " << shape_str(unravel_index(static_cast<std::int64_t>(i), t.shape()))
             << " is " << v[i];
  return ::testing::AssertionSuccess();
}

// `part` occurs in `text`; on failure shows the whole text.
inline ::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" not found in:\n  " << text;
}

// f throws std::invalid_argument whose message holds every one of `pieces`.
inline void expect_invalid(const std::function<void()>& f, std::initializer_list<std::string> pieces) {
  try {
    f();
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

}  // namespace headgrad::test
