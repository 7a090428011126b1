// bfloat16 products on the CPU's bfloat16 dot products (blas::gemm_bf16,
// oneDNN on AVX512-BF16) and kernels::matmul's routing to them: each element
// within the float32 sum's error bound of the exact product of the same
// bfloat16 values (computed here in float64), the padding of C never written,
// a product split over two threads (by rows, by columns) within the same
// bound, and kernels::matmul sending its large bfloat16 products there and
// keeping its small ones (and every product under set_bf16_products(false))
// on the float32 upcasts, rounded once; a child forked after the parent
// multiplied multiplies too. Skipped, saying why, where the build
// or the CPU has no bfloat16 products.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include <sys/wait.h>

#include "checks.hpp"
#include "headgrad/blas.hpp"
#include "headgrad/child_process.hpp"
#include "headgrad/kernels.hpp"
#include "headgrad/ops.hpp"
#include "headgrad/parallel.hpp"

namespace test_bf16_products {  // this file's names: test files share unity builds (tests/meson.build)

namespace hg = headgrad;
using hg::DType;
using hg::Tensor;

namespace {

Tensor seeded(const hg::Shape& shape, std::uint64_t seed) {
  hg::Generator gen(seed);
  return hg::randn(shape, DType::bfloat16, gen);
}

// The largest error over its bound (checks.hpp) of C [m, n] (row stride
// ldc): bfloat16's unit roundoff 2^-8, its smallest normal 2^-126 as floor.
double worst_over_bound(const Tensor& c, std::int64_t ldc, const Tensor& a, std::int64_t lda, bool ta,
                        const Tensor& b, std::int64_t ldb, bool tb, std::int64_t m, std::int64_t n,
                        std::int64_t k) {
  return hg::test::product_worst_over_bound(c, ldc, a, lda, ta, b, ldb, tb, m, n, k, 0x1p-8, 0x1p-126);
}

// Elements of [rows, ld] past column n that are not 0.5 (the fill).
std::int64_t padding_written(const Tensor& c, std::int64_t rows, std::int64_t n, std::int64_t ld) {
  std::int64_t written = 0;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = n; j < ld; ++j) written += c.flat(i * ld + j) != 0.5;
  return written;
}

// The float32 product of the exact upcasts, rounded once: kernels::matmul's
// result where the bfloat16 products are not used.
Tensor rounded_float32(const Tensor& a, const Tensor& b) {
  return hg::kernels::matmul(a.to(DType::float32), b.to(DType::float32)).to(DType::bfloat16);
}

// |t| in float64, contiguous
Tensor abs64(const Tensor& t) {
  Tensor out = t.to(DType::float64).contiguous();
  double* d = out.mutable_data<double>();
  for (std::int64_t i = 0; i < out.numel(); ++i) d[i] = std::abs(d[i]);
  return out;
}

std::int64_t differing(const Tensor& x, const Tensor& y) {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) n += x.flat(i) != y.flat(i);
  return n;
}

class Bf16Products : public ::testing::Test {
 protected:
  // Skipped only where the optional oneDNN is not built in, the CPU has no
  // AVX512-BF16, or the run switched the products off; anywhere else their
  // absence is a failure, not a skip.
  void SetUp() override {
    if (hg::blas::bf16_products()) return;
    const std::string why = hg::blas::bf16_products_info();
    const char* env = std::getenv("HEADGRAD_BF16_GEMM");
    const bool cpu = __builtin_cpu_supports("avx512bf16");
    if (why.find("built without oneDNN") != std::string::npos || !cpu || (env && std::string(env) == "float32"))
      GTEST_SKIP() << "no bfloat16 products here (" << (cpu ? "" : "no AVX512-BF16 on this CPU; ") << why << ")";
    FAIL() << "built with oneDNN on a CPU with AVX512-BF16, yet no bfloat16 products: " << why;
  }
  void TearDown() override {
    hg::blas::set_bf16_products(true);
    hg::set_num_threads(0);
  }
};

}  // namespace

// Sizes off every block (odd, a single row or column, a short and a long
// sum), both transpositions, leading dims wider than the rows; on one thread
// and on two, where the products of at least 2^21 multiply-adds are split
// (rows when m >= n: 300 x 40; columns otherwise: 40 x 300).
TEST_F(Bf16Products, WithinTheFloat32SumBoundOfTheExactProduct) {
  for (const int threads : {1, 2}) {
    hg::set_num_threads(threads);
    for (const auto& [m, n, k] : {std::array<std::int64_t, 3>{37, 45, 19}, {1, 70, 300}, {70, 1, 300},
                                  {64, 64, 64}, {13, 2100, 5}, {300, 40, 200}, {40, 300, 200}, {128, 256, 64}}) {
      for (const bool ta : {false, true})
        for (const bool tb : {false, true}) {
          SCOPED_TRACE(std::to_string(threads) + " thread(s), " + std::to_string(m) + " x " + std::to_string(n) +
                       " x " + std::to_string(k) + (ta ? ", A^T" : "") + (tb ? ", B^T" : ""));
          const std::int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
          const Tensor a = seeded({ta ? k : m, lda}, static_cast<std::uint64_t>(m + k));
          const Tensor b = seeded({tb ? n : k, ldb}, static_cast<std::uint64_t>(n + 7 * k));
          Tensor c = Tensor::full({m, ldc}, 0.5, DType::bfloat16);
          hg::blas::gemm_bf16(ta, tb, m, n, k, a.data<hg::BFloat16>(), lda, b.data<hg::BFloat16>(), ldb,
                              c.mutable_data<hg::BFloat16>(), ldc);
          EXPECT_LE(worst_over_bound(c, ldc, a, lda, ta, b, ldb, tb, m, n, k), 1.0) << "the largest error over its bound";
          EXPECT_EQ(padding_written(c, m, n, ldc), 0) << "C's padding written";
        }
    }
  }
}

// kernels::matmul in bfloat16: the products a run makes (q K^T of a batch of
// heads, P V, P^T dO through a transposed view, a projection [B, T, D] @ W^T
// folded into one product, one b broadcast to every head), on one thread and
// on two (products spread over the workers, or one product split), within
// the bound; switched off, each is the rounded float32 product of the
// upcasts, as a product under 2^18 multiply-adds is with them on. Which path
// each took: the next test.
TEST_F(Bf16Products, MatmulProductsAreWithinTheBoundOnEitherPath) {
  namespace k = hg::kernels;
  const Tensor q = seeded({2, 3, 300, 64}, 31), kv = seeded({2, 3, 300, 64}, 32);
  const Tensor p = seeded({2, 3, 300, 300}, 33), x = seeded({2, 150, 96}, 34), w = seeded({80, 96}, 35);
  struct Product {
    const char* what;
    Tensor a, b;
  };
  const Product products[] = {{"q K^T", q, kv.transpose(-2, -1)},
                              {"P V", p, kv},
                              {"P^T dO", p.transpose(-2, -1), q},
                              {"x W^T", x, w.transpose(0, 1)},
                              {"broadcast b", p, kv.narrow(0, 0, 1).narrow(1, 0, 1)}};
  for (const int threads : {1, 2}) {
    hg::set_num_threads(threads);
    for (const Product& pr : products) {
      SCOPED_TRACE(std::string(pr.what) + ", " + std::to_string(threads) + " thread(s)");
      const Tensor got = k::matmul(pr.a, pr.b);
      const Tensor exact = k::matmul(pr.a.to(DType::float64), pr.b.to(DType::float64));
      const Tensor mag = k::matmul(abs64(pr.a), abs64(pr.b));
      const double kk = static_cast<double>(pr.a.size(-1));
      double worst = 0;
      for (std::int64_t i = 0; i < got.numel(); ++i) {
        const double bound = 1.01 * kk * 0x1p-24 * mag.flat(i) * (1 + 0x1p-8) + 0x1p-8 * std::abs(exact.flat(i)) + 0x1p-126;
        worst = std::max(worst, std::abs(got.flat(i) - exact.flat(i)) / bound);
      }
      EXPECT_LE(worst, 1.0) << "the largest error over its bound";
      hg::blas::set_bf16_products(false);
      const Tensor upcast = k::matmul(pr.a, pr.b);
      hg::blas::set_bf16_products(true);
      EXPECT_EQ(differing(upcast, rounded_float32(pr.a, pr.b)), 0) << "switched off: the rounded float32 product";
    }
  }
  // 32 x 32 x 32 (2^15 multiply-adds): the upcasts, bit for bit
  const Tensor s = seeded({4, 32, 32}, 36);
  EXPECT_EQ(differing(k::matmul(s, s), rounded_float32(s, s)), 0);
}

// bfloat16 values below 2^-126 (subnormal) count as zero in the bfloat16
// dot products (the instruction's rule): a product of 2^-130 and 2^100 is 0
// there and 2^-30 per term on the float32 upcasts. So this shows which path
// each product took: every form of the test above (a batch of heads, a
// transposed view, a projection folded into one product, a broadcast b) on
// one thread and on two goes to the bfloat16 products, and 32 x 32 x 32 (under
// the size limit) and every product switched off keep the upcasts.
TEST_F(Bf16Products, SubnormalOperandsShowWhichPathEachProductTook) {
  namespace k = hg::kernels;
  const double tiny = std::ldexp(1.0, -130), big = std::ldexp(1.0, 100);
  const auto full = [](const hg::Shape& shape, double v) { return Tensor::full(shape, v, DType::bfloat16); };
  struct Product {
    const char* what;
    Tensor a, b;
  };
  const Product large[] = {{"q K^T", full({2, 3, 300, 64}, tiny), full({2, 3, 300, 64}, big).transpose(-2, -1)},
                           {"P^T dO", full({2, 3, 300, 300}, tiny).transpose(-2, -1), full({2, 3, 300, 64}, big)},
                           {"x W^T", full({2, 150, 96}, tiny), full({80, 96}, big).transpose(0, 1)},
                           {"broadcast b", full({2, 3, 300, 300}, tiny), full({1, 1, 300, 64}, big)}};
  const auto all_zero = [](const Tensor& t) {
    for (std::int64_t i = 0; i < t.numel(); ++i)
      if (t.flat(i) != 0.0) return false;
    return true;
  };
  for (const int threads : {1, 2}) {
    hg::set_num_threads(threads);
    for (const Product& p : large) {
      SCOPED_TRACE(std::string(p.what) + ", " + std::to_string(threads) + " thread(s)");
      EXPECT_TRUE(all_zero(k::matmul(p.a, p.b))) << "not on the bfloat16 products";
      hg::blas::set_bf16_products(false);
      const Tensor upcast = k::matmul(p.a, p.b);
      hg::blas::set_bf16_products(true);
      const double want = static_cast<double>(p.a.size(-1)) * tiny * big;
      EXPECT_EQ(upcast.flat(0), want) << "switched off: the float32 upcasts";
    }
  }
  const Tensor small = k::matmul(full({32, 32}, tiny), full({32, 32}, big));
  EXPECT_EQ(small.flat(0), 32 * tiny * big) << "32 x 32 x 32, under the size limit: the float32 upcasts";
}

// The runner forks a child for each side after its parent has multiplied:
// a child that multiplies bfloat16 on two threads finishes, with the
// parent's bits (oneDNN never started an OpenMP pool in the parent, whose
// threads a fork would not copy).
TEST_F(Bf16Products, AChildForkedAfterProductsMultipliesToo) {
  hg::set_num_threads(2);
  const Tensor a = seeded({600, 64}, 41), b = seeded({64, 500}, 42);
  const Tensor want = hg::kernels::matmul(a, b);
  hg::ChildProcess child = hg::ChildProcess::spawn({}, [&](const hg::ChildEnds&) {
    hg::set_num_threads(2);
    return differing(hg::kernels::matmul(a, b), want) == 0 ? 0 : 1;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::optional<int> status;
  while (!(status = child.try_reap()) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!status) {
    child.kill_and_reap();
    FAIL() << "the child did not finish within 60 s";
  }
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "wait status " << *status;
}

// Off, the product is refused rather than run elsewhere (callers ask
// first), and the report of the path says why it is off; a value of
// HEADGRAD_BF16_GEMM other than float32 is named as ignored.
TEST_F(Bf16Products, SwitchedOffRefusesACallAndTheReportSaysWhy) {
  hg::blas::set_bf16_products(false);
  EXPECT_FALSE(hg::blas::bf16_products());
  const Tensor a = seeded({4, 4}, 1);
  Tensor c = Tensor::zeros({4, 4}, DType::bfloat16);
  EXPECT_THROW(hg::blas::gemm_bf16(false, false, 4, 4, 4, a.data<hg::BFloat16>(), 4, a.data<hg::BFloat16>(), 4,
                                   c.mutable_data<hg::BFloat16>(), 4),
               std::logic_error);
  EXPECT_EQ(hg::blas::bf16_products_info(), "float32 upcasts (set_bf16_products(false))");
  hg::blas::set_bf16_products(true);
  // HEADGRAD_BF16_GEMM takes float32 only (read once, at the first product);
  // another value is named as ignored wherever the path is reported
  ::setenv("HEADGRAD_BF16_GEMM", "off", 1);
  const std::string info = hg::blas::bf16_products_info();
  ::unsetenv("HEADGRAD_BF16_GEMM");
  EXPECT_NE(info.find("oneDNN"), std::string::npos) << info;
  EXPECT_NE(info.find("HEADGRAD_BF16_GEMM=off ignored: only float32 is understood"), std::string::npos) << info;
}

}  // namespace test_bf16_products
