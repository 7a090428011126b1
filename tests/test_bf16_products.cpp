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
  double worst = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      worst = std::max(worst, hg::test::product_error_over_bound(c.flat(i * ldc + j), a, lda, ta, b, ldb, tb, i, j,
                                                                 k, 0x1p-8, 0x1p-126));
  return worst;
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
  void SetUp() override {
    if (!hg::blas::bf16_products())
      GTEST_SKIP() << "no bfloat16 products in this build or on this CPU: " << hg::blas::bf16_products_info();
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
// folded into one product, one b broadcast to every head) are the bfloat16
// products, on one thread and on two (products spread over the workers, or
// one product split); a product under 2^18 multiply-adds keeps the rounded
// float32 product of the upcasts, as every product does with them switched off.
TEST_F(Bf16Products, MatmulSendsItsLargeBfloat16ProductsThere) {
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
// there and 2^-30 on the float32 upcasts. This also shows which path a
// product took: the 300 x 300 x 64 product above its size limit, the 32 x 32
// x 32 one below it.
TEST_F(Bf16Products, SubnormalOperandsCountAsZero) {
  namespace k = hg::kernels;
  for (const std::int64_t n : {300, 32}) {
    const Tensor a = Tensor::full({n, n < 64 ? 32 : 64}, std::ldexp(1.0, -130), DType::bfloat16);
    const Tensor b = Tensor::full({a.size(1), n}, std::ldexp(1.0, 100), DType::bfloat16);
    const double want = n == 300 ? 0.0 : static_cast<double>(a.size(1)) * std::ldexp(1.0, -30);
    EXPECT_EQ(k::matmul(a, b).flat(0), want) << n << " x " << n << " x " << a.size(1);
  }
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
