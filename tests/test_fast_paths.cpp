// The engine's fast paths: the caching allocator and its figures, the
// thread pool (elementwise kernels split over workers) and the BLAS layer.
// (The row kernels: test_kernels.cpp; the fused masked softmax against the
// ops it replaces: test_ops_softmax_mask.cpp.)
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <headgrad/blas.hpp>
#include <headgrad/kernels.hpp>
#include <headgrad/ops.hpp>
#include <headgrad/parallel.hpp>
#include <headgrad/tensor.hpp>
#include <headgrad/tile_gemm.hpp>

namespace test_fast_paths {  // this file's names: test files share unity builds (tests/meson.build)

using namespace headgrad;

namespace {

// ---------------------------------------------------------------- allocator

TEST(CachingAllocator, ReusesAFreedBufferOfTheSameSize) {
  if (allocator_name() != "caching") GTEST_SKIP() << "HEADGRAD_ALLOCATOR=system";
  const void* first = nullptr;
  {
    Tensor t = Tensor::empty({1000, 1000}, DType::float32);
    first = t.storage()->data();
  }
  Tensor again = Tensor::empty({1000, 1000}, DType::float32);
  EXPECT_EQ(again.storage()->data(), first);
}

// A request takes the smallest cached block of its size class up to twice
// that (a block already mapped instead of fresh pages), never a larger one;
// the block goes back to the cache under its own size.
TEST(CachingAllocator, TakesACachedBlockUpToTwiceItsSize) {
  empty_cache();
  const std::int64_t mib = 1 << 20;
  const void* twelve = nullptr;
  {
    Tensor t = Tensor::empty({12 * mib}, DType::boolean);  // class 12 MiB
    twelve = t.storage()->data();
  }
  if (allocator_name() != "caching") {  // HEADGRAD_ALLOCATOR=system: every block goes back at once
    EXPECT_EQ(memory_stats().cached_bytes, 0u);
    return;
  }
  EXPECT_EQ(memory_stats().cached_bytes, std::size_t(12 * mib));
  {
    Tensor small = Tensor::empty({3 * mib}, DType::boolean);  // class 4 MiB: 12 is more than twice
    EXPECT_NE(small.storage()->data(), twelve);
    EXPECT_EQ(memory_stats().cached_bytes, std::size_t(12 * mib));
  }
  // Now 12 and 4 MiB are cached; a 7 MiB request (class 8 MiB) takes the 12.
  Tensor seven = Tensor::empty({7 * mib}, DType::boolean);
  EXPECT_EQ(seven.storage()->data(), twelve);
  EXPECT_EQ(memory_stats().cached_bytes, std::size_t(4 * mib));
  seven = Tensor();
  EXPECT_EQ(memory_stats().cached_bytes, std::size_t(16 * mib));  // back as 12 MiB
  Tensor again = Tensor::empty({12 * mib}, DType::boolean);
  EXPECT_EQ(again.storage()->data(), twelve);
  empty_cache();
}

TEST(CachingAllocator, LiveBytesKeepTheirMeaningAndCachedBytesAreSeparate) {
  empty_cache();
  const MemoryStats before = memory_stats();
  const std::size_t bytes = 3 * 1000 * 8;
  {
    Tensor t = Tensor::zeros({3, 1000}, DType::float64);
    const MemoryStats during = memory_stats();
    EXPECT_EQ(during.current_bytes, before.current_bytes + bytes);  // what tensors asked for
    EXPECT_GE(during.reserved_bytes, before.reserved_bytes + bytes);
  }
  const MemoryStats after = memory_stats();
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  if (allocator_name() == "caching") {
    EXPECT_GE(after.cached_bytes, bytes);
  }
  empty_cache();
  EXPECT_EQ(memory_stats().cached_bytes, 0u);
}

TEST(CachingAllocator, LargeBuffersAreHugePageAligned) {
  if (allocator_name() != "caching") GTEST_SKIP() << "HEADGRAD_ALLOCATOR=system";
  Tensor big = Tensor::empty({3 << 20}, DType::float32);  // 12 MiB
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big.storage()->data()) % (2u << 20), 0u);
  Tensor small = Tensor::empty({5}, DType::float64);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small.storage()->data()) % 64, 0u);
}

TEST(CachingAllocator, IsThreadSafe) {
  std::atomic<int> bad{0};
  parallel_for(64, [&](std::int64_t i0, std::int64_t i1, int) {
    for (std::int64_t i = i0; i < i1; ++i)
      for (int rep = 0; rep < 50; ++rep) {
        Tensor t = Tensor::full({1 + (i * 7 + rep) % 300}, static_cast<double>(i), DType::float64);
        if (t.flat(t.numel() - 1) != static_cast<double>(i)) ++bad;
      }
  });
  EXPECT_EQ(bad.load(), 0);
}

// ---------------------------------------------------------------- threads

TEST(Parallel, EveryIndexOnceAndNestedLoopsRunSerially) {
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
  std::vector<std::atomic<int>> seen(1000);
  parallel_for(1000, [&](std::int64_t i0, std::int64_t i1, int w) {
    EXPECT_GE(w, 0);
    EXPECT_LT(w, 2);
    for (std::int64_t i = i0; i < i1; ++i) {
      parallel_for(3, [&](std::int64_t, std::int64_t, int inner) { EXPECT_EQ(inner, 0); });
      ++seen[static_cast<std::size_t>(i)];
    }
  });
  for (const auto& s : seen) EXPECT_EQ(s.load(), 1);
  std::vector<std::atomic<int>> items(37);
  parallel_items(37, [&](std::int64_t i, int) { ++items[static_cast<std::size_t>(i)]; });
  for (const auto& s : items) EXPECT_EQ(s.load(), 1);
}

// Chunks 1..n-1 go to whichever thread claims them first, the caller included
// (a worker the scheduler has not run yet must not hold it up). Back-to-back
// tiny jobs, with a third thread keeping a core busy so that workers wake
// late: every chunk of every job runs exactly once, with its own job's
// function and range (never a later job's chunk with an earlier job's
// function), chunk 0 on the caller. Chunk 1 ran on the caller's thread in
// 19993-20000 of the 20000 jobs here (a worker had not claimed it yet); a pool
// where worker w always runs chunk w never does that.
TEST(Parallel, EveryChunkRunsOnceWhenWorkersWakeLate) {
  set_num_threads(2);
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop.load()) {
    }
  });
  const auto caller = std::this_thread::get_id();
  std::atomic<int> wrong{0};  // counted by the chunks too, on either thread
  int by_caller = 0, by_worker = 0;
  for (int job = 0; job < 20000; ++job) {
    std::array<std::atomic<int>, 2> ran{};
    std::array<std::thread::id, 2> who{};
    const std::int64_t n = 2 + job % 5;
    parallel_for(n, [&, job](std::int64_t i0, std::int64_t i1, int w) {
      if (w < 0 || w > 1 || i0 != n * w / 2 || i1 != n * (w + 1) / 2) ++wrong;  // its own job's range
      ran[static_cast<std::size_t>(w)] += 1 + job % 3;
      who[static_cast<std::size_t>(w)] = std::this_thread::get_id();
    });
    for (const auto& r : ran)
      if (r.load() != 1 + job % 3) ++wrong;
    if (who[0] != caller) ++wrong;  // chunk 0 is always the caller's
    (who[1] == caller ? by_caller : by_worker)++;
  }
  stop = true;
  busy.join();
  set_num_threads(0);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(by_caller, 0);
  std::printf("chunk 1 ran on the caller's thread in %d of 20000 jobs, on a worker's in %d\n", by_caller, by_worker);
}

TEST(Parallel, ExceptionsReachTheCaller) {
  set_num_threads(2);
  EXPECT_THROW(parallel_for(10, [](std::int64_t i0, std::int64_t, int) {
                 if (i0 > 0) throw std::runtime_error("chunk failed");
               }),
               std::runtime_error);
  int sum = 0;  // the pool still works afterwards
  parallel_for(1, [&](std::int64_t, std::int64_t, int) { sum = 1; });
  EXPECT_EQ(sum, 1);
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(0);  // back to the default
}

// Elementwise kernels split their rows over the workers, 32K elements or more each.
// With two threads every element must be what a direct read of the inputs
// gives: transposed and broadcast inputs (the odometer started mid-tensor),
// contiguous ones (the flat split), and rows that cannot split evenly.
TEST(Parallel, ElementwiseKernelsOnTwoThreadsMatchElementReads) {
  set_num_threads(2);
  Generator gen(7);
  const Tensor a = randn({16, 129, 65}, DType::float64, gen).transpose(1, 2);  // [16, 65, 129]: 134K elements, 1040 rows
  const Tensor b = randn({1, 65, 1}, DType::float64, gen);
  const Tensor c = randn({16, 65, 129}, DType::float64, gen);
  const Tensor mask = randn({16, 1, 129}, DType::float64, gen);
  Tensor attend = Tensor::empty({16, 1, 129}, DType::boolean);
  for (std::int64_t i = 0; i < 16; ++i)
    for (std::int64_t k = 0; k < 129; ++k) attend.set({i, 0, k}, mask.at({i, 0, k}) > 0 ? 1.0 : 0.0);
  const Tensor sum_ab = kernels::binary(kernels::BinaryOp::add, a, b);
  const Tensor prod_ac = kernels::binary(kernels::BinaryOp::mul, a, c);
  const Tensor scaled = kernels::scale(a, -1.5);
  const Tensor filled = kernels::masked_fill(a, attend, 9.0);
  const Tensor copied = a.contiguous();
  const Tensor soft = kernels::softmax(c, -1);
  set_num_threads(0);
  const Tensor soft_serial = [&] {
    set_num_threads(1);
    Tensor t = kernels::softmax(c, -1);
    set_num_threads(0);
    return t;
  }();
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < 16; ++i)
    for (std::int64_t j = 0; j < 65; ++j)
      for (std::int64_t k = 0; k < 129; ++k) {
        const double x = a.at({i, j, k});
        wrong += sum_ab.at({i, j, k}) != x + b.at({0, j, 0});
        wrong += prod_ac.at({i, j, k}) != x * c.at({i, j, k});
        wrong += scaled.at({i, j, k}) != x * -1.5;
        wrong += filled.at({i, j, k}) != (mask.at({i, 0, k}) > 0 ? 9.0 : x);
        wrong += copied.at({i, j, k}) != x;
        wrong += soft.at({i, j, k}) != soft_serial.at({i, j, k});
      }
  EXPECT_EQ(wrong, 0);
}

// masked_fill's row path (x contiguous, the mask a contiguous block of x's
// trailing dims: [Tq, Tk] masks on [B, H, Tq, Tk] scores) against a direct
// read of every element, and against the strided walk it skips (the same x
// read through a transposed copy), bit for bit, at 1 and 2 threads, float64
// and float32; a mask that broadcasts inside x's dims takes the walk.
TEST(Parallel, MaskedFillRowPathMatchesElementReadsAndTheStridedWalk) {
  Generator gen(11);
  const std::int64_t b = 3, h = 5, tq = 67, tk = 131;  // 1005 rows of 131: rows split unevenly
  Tensor attend = Tensor::empty({tq, tk}, DType::boolean);
  const Tensor coin = randn({tq, tk}, DType::float64, gen);
  for (std::int64_t i = 0; i < tq; ++i)
    for (std::int64_t j = 0; j < tk; ++j) attend.set({i, j}, coin.at({i, j}) > 0.3 ? 1.0 : 0.0);
  for (const DType dtype : {DType::float64, DType::float32})
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      const Tensor x = randn({b, h, tq, tk}, dtype, gen);
      const Tensor x_strided = x.transpose(2, 3).contiguous().transpose(2, 3);  // same values, not contiguous
      for (const Shape& mask_shape : {Shape{tq, tk}, Shape{1, 1, tq, tk}, Shape{h, tq, tk}}) {
        const Tensor m = mask_shape.size() == 3 ? attend.unsqueeze(0).expand(mask_shape).contiguous()
                                                : attend.reshape(mask_shape);
        const Tensor fast = kernels::masked_fill(x, m, -INFINITY);
        const Tensor walked = kernels::masked_fill(x_strided, m, -INFINITY);
        EXPECT_EQ(fast.to_vector(), walked.to_vector()) << dtype_name(dtype) << " " << shape_str(mask_shape);
        std::int64_t wrong = 0;
        for (std::int64_t i = 0; i < b; ++i)
          for (std::int64_t k = 0; k < h; ++k)
            for (std::int64_t r = 0; r < tq; ++r)
              for (std::int64_t c = 0; c < tk; ++c) {
                const double want = attend.at({r, c}) != 0 ? -INFINITY : x.at({i, k, r, c});
                wrong += fast.at({i, k, r, c}) != want;
              }
        EXPECT_EQ(wrong, 0) << dtype_name(dtype) << " " << shape_str(mask_shape) << ", " << threads << " threads";
      }
      // A [Tq, 1] mask broadcasts along the keys: not a trailing block, the walk.
      const Tensor column = attend.narrow(1, 0, 1).contiguous();
      const Tensor filled = kernels::masked_fill(x, column, 2.5);
      std::int64_t wrong = 0;
      for (std::int64_t r = 0; r < tq; ++r)
        for (std::int64_t c = 0; c < tk; ++c)
          wrong += filled.at({1, 2, r, c}) != (attend.at({r, 0}) != 0 ? 2.5 : x.at({1, 2, r, c}));
      EXPECT_EQ(wrong, 0);
    }
  set_num_threads(0);
}

// ---------------------------------------------------------------- BLAS layer

// blas::gemm against a plain triple loop: both transpositions, alpha and beta,
// leading dims wider than the rows, sizes on both sides of the tiny-product
// loop (512 multiply-adds) and of the threading threshold, with 1 and 2 threads.
struct GemmCase {
  bool ta, tb;
  std::int64_t m, n, k;
  int threads;
};

class Gemm : public ::testing::TestWithParam<GemmCase> {};

template <class T>
void check_gemm(const GemmCase& c, double tol) {
  const std::int64_t pad = 3;  // every leading dim is wider than its rows
  const std::int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const std::int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  const std::int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = c.n + pad;
  std::vector<T> a(static_cast<std::size_t>(a_rows * lda)), b(static_cast<std::size_t>(b_rows * ldb)),
      out(static_cast<std::size_t>(c.m * ldc));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<T>(std::sin(0.37 * double(i)));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<T>(std::cos(0.91 * double(i)));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(0.5 + 0.01 * double(i % 17));
  const std::vector<T> before = out;
  const T alpha = T(0.75), beta = T(-0.5);
  set_num_threads(c.threads);
  blas::gemm(c.ta, c.tb, c.m, c.n, c.k, alpha, a.data(), lda, b.data(), ldb, beta, out.data(), ldc);
  set_num_threads(0);
  double worst = 0;
  for (std::int64_t i = 0; i < c.m; ++i)
    for (std::int64_t j = 0; j < ldc; ++j) {
      const std::size_t at = static_cast<std::size_t>(i * ldc + j);
      if (j >= c.n) {  // the padding between rows is never written
        ASSERT_EQ(out[at], before[at]) << "row " << i << " pad col " << j;
        continue;
      }
      double acc = 0;
      for (std::int64_t p = 0; p < c.k; ++p) {
        const double x = c.ta ? a[static_cast<std::size_t>(p * lda + i)] : a[static_cast<std::size_t>(i * lda + p)];
        const double y = c.tb ? b[static_cast<std::size_t>(j * ldb + p)] : b[static_cast<std::size_t>(p * ldb + j)];
        acc += x * y;
      }
      const double want = double(alpha) * acc + double(beta) * double(before[at]);
      worst = std::max(worst, std::abs(double(out[at]) - want) / (1.0 + std::abs(want)));
    }
  EXPECT_LT(worst, tol) << "through " << blas::info().library;
}

TEST_P(Gemm, MatchesAPlainLoopFloat64) { check_gemm<double>(GetParam(), 1e-12); }
TEST_P(Gemm, MatchesAPlainLoopFloat32) { check_gemm<float>(GetParam(), 1e-4); }

INSTANTIATE_TEST_SUITE_P(
    Shapes, Gemm,
    ::testing::Values(GemmCase{false, false, 3, 5, 4, 1}, GemmCase{true, false, 3, 5, 4, 1},
                      GemmCase{false, true, 3, 5, 4, 2}, GemmCase{true, true, 1, 7, 2, 2},
                      // above the tiny-product loop
                      GemmCase{false, false, 9, 8, 8, 1}, GemmCase{true, false, 8, 9, 8, 1},
                      GemmCase{false, true, 8, 8, 9, 1}, GemmCase{true, true, 17, 3, 11, 2},
                      // above the threading threshold (2^21 multiply-adds)
                      GemmCase{false, false, 160, 150, 140, 2}, GemmCase{true, true, 160, 150, 140, 2},
                      GemmCase{false, true, 130, 170, 128, 1}, GemmCase{true, false, 130, 170, 128, 2},
                      // split over two workers by columns (more columns than rows), and by
                      // rows in blocks that do not divide them (split_product.hpp)
                      GemmCase{false, true, 40, 300, 200, 2}, GemmCase{true, false, 40, 300, 200, 2},
                      GemmCase{true, true, 301, 90, 100, 2},
                      // one thread, float32 on AVX-512: tile_gemm.hpp's panels, rows and
                      // columns off its 12 x 32 block, every transposition
                      GemmCase{true, true, 37, 45, 19, 1}, GemmCase{false, true, 256, 64, 256, 1},
                      GemmCase{true, false, 300, 200, 100, 1}, GemmCase{false, false, 512, 33, 64, 1},
                      // more than 512 rows of a skinny op(B) (16K elements at most): on the
                      // panels too, A read in place either way
                      GemmCase{true, false, 1300, 64, 128, 1}, GemmCase{false, true, 777, 40, 300, 1}));

// A float64 product split over two workers (by rows, by columns) gives the
// bits of the same product in one call: every element is the same sum, the
// split is never over k.
TEST(GemmSplit, TwoWorkersGiveTheOneThreadBits) {
  for (const auto& [ta, tb, m, n, k] : {std::tuple{false, false, std::int64_t{301}, std::int64_t{90}, std::int64_t{100}},
                                        std::tuple{true, true, std::int64_t{40}, std::int64_t{300}, std::int64_t{200}}}) {
    const std::int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n;
    std::vector<double> a(static_cast<std::size_t>((ta ? k : m) * lda)), b(static_cast<std::size_t>((tb ? n : k) * ldb));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37 * double(i));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.91 * double(i));
    std::vector<double> one(static_cast<std::size_t>(m * ldc)), two(one.size());
    set_num_threads(1);
    blas::gemm(ta, tb, m, n, k, 1.0, a.data(), lda, b.data(), ldb, 0.0, one.data(), ldc);
    set_num_threads(2);
    blas::gemm(ta, tb, m, n, k, 1.0, a.data(), lda, b.data(), ldb, 0.0, two.data(), ldc);
    set_num_threads(0);
    std::int64_t differ = 0;
    for (std::size_t i = 0; i < one.size(); ++i) differ += one[i] != two[i];
    EXPECT_EQ(differ, 0) << m << " x " << n << " x " << k;
  }
}

// Large float32 products on the blocked packed kernel (tile::gemm_blocked):
// op(B) packed 512 x 1024 at a time, A taken 96 rows at a time. Shapes that
// cross each edge (k over two chunks, n over one, rows off the block and the
// micro-kernel's 12), every transposition, padded leading dims, alpha, beta
// (and beta 0 ignoring a NaN in C, as BLAS does), on 1 and 2 threads (each
// worker's piece blocked on its own). Each element against its float64 sum
// (the BLAS's float64 product), within the bound of k float32 additions plus
// the chunks' and beta's few roundings; the BLAS's own float32 product
// (library_gemm) within the same bound.
TEST(GemmBlocked, LargeFloat32ProductsAreWithinTheirBoundOnEveryChunkEdge) {
  // Without AVX-512F the BLAS runs these products, held to the same bound.
  const bool avx512 = tile::available();
  struct Shape3 { bool ta, tb; std::int64_t m, n, k; };
  for (const Shape3& c : {Shape3{false, false, 110, 1040, 530}, Shape3{true, false, 97, 300, 1030},
                          Shape3{false, true, 13, 1040, 600}, Shape3{true, true, 301, 64, 2100}}) {
    const std::int64_t a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
    const std::int64_t b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
    const std::int64_t lda = a_cols + 3, ldb = b_cols + 5, ldc = c.n + 2;
    std::vector<float> a(static_cast<std::size_t>(a_rows * lda)), b(static_cast<std::size_t>(b_rows * ldb));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(std::sin(0.37 * double(i)));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(std::cos(0.91 * double(i)));
    // The float64 sum of op(A) op(B) and of its terms' magnitudes |op(A)| |op(B)|,
    // once per shape: two float64 products of the BLAS (not the float32 path
    // under test), each off the exact sums by k 2^-53 of the magnitudes at
    // most, 2^-29 of the bound below (a loop here took most of this case's
    // time, six seconds under the sanitizers).
    const std::vector<double> a64(a.begin(), a.end()), b64(b.begin(), b.end());
    std::vector<double> a_abs(a64.size()), b_abs(b64.size());
    std::transform(a64.begin(), a64.end(), a_abs.begin(), [](double x) { return std::abs(x); });
    std::transform(b64.begin(), b64.end(), b_abs.begin(), [](double x) { return std::abs(x); });
    std::vector<double> exact(static_cast<std::size_t>(c.m * c.n)), mag(exact.size());
    blas::library_gemm(c.ta, c.tb, c.m, c.n, c.k, 1.0, a64.data(), lda, b64.data(), ldb, 0.0, exact.data(), c.n);
    blas::library_gemm(c.ta, c.tb, c.m, c.n, c.k, 1.0, a_abs.data(), lda, b_abs.data(), ldb, 0.0, mag.data(), c.n);
    for (const bool nan_in_c : {false, true})
      for (const int threads : {1, 2}) {
        std::vector<float> out(static_cast<std::size_t>(c.m * ldc));
        for (std::size_t i = 0; i < out.size(); ++i)
          out[i] = nan_in_c ? NAN : static_cast<float>(0.5 + 0.01 * double(i % 17));
        const std::vector<float> before = out;
        std::vector<float> library = out;
        const float alpha = 0.75f, beta = nan_in_c ? 0.0f : -0.5f;
        set_num_threads(threads);
        // one thread: the whole product blocked; two: split, each piece on its own
        ASSERT_EQ(blas::float32_blocked(c.m, c.n, c.k), avx512 && threads == 1)
            << c.m << " x " << c.n << " x " << c.k;
        blas::gemm(c.ta, c.tb, c.m, c.n, c.k, alpha, a.data(), lda, b.data(), ldb, beta, out.data(), ldc);
        blas::library_gemm(c.ta, c.tb, c.m, c.n, c.k, alpha, a.data(), lda, b.data(), ldb, beta, library.data(), ldc);
        set_num_threads(0);
        double worst = 0, worst_library = 0;
        for (std::int64_t i = 0; i < c.m; ++i)
          for (std::int64_t j = 0; j < ldc; ++j) {
            const std::size_t at = static_cast<std::size_t>(i * ldc + j);
            if (j >= c.n) {  // the padding between rows is never written
              if (nan_in_c)
                ASSERT_TRUE(std::isnan(out[at])) << "row " << i << " pad col " << j;
              else
                ASSERT_EQ(out[at], before[at]) << "row " << i << " pad col " << j;
              continue;
            }
            const std::size_t e = static_cast<std::size_t>(i * c.n + j);
            const double c0 = nan_in_c ? 0.0 : double(before[at]);
            const double want = double(alpha) * exact[e] + double(beta) * c0;
            const double bound =
                1.01 * double(c.k + 4) * 0x1p-24 * (double(alpha) * mag[e] + std::abs(double(beta) * c0)) + 1e-30;
            const auto over = [&](float got) {  // a NaN result counts as over
              const double r = std::abs(double(got) - want) / bound;
              return std::isnan(r) ? 2.0 : r;
            };
            worst = std::max(worst, over(out[at]));
            worst_library = std::max(worst_library, over(library[at]));
          }
        EXPECT_LE(worst, 1.0) << c.m << " x " << c.n << " x " << c.k << " on " << threads << " thread(s)";
        EXPECT_LE(worst_library, 1.0) << "the BLAS: " << c.m << " x " << c.n << " x " << c.k;
      }
  }
}

TEST(BlasInfo, NamesTheLibraryAndItsKernels) {
  const auto& i = blas::info();
  EXPECT_TRUE(i.library == "BLIS" || i.library == "OpenBLAS") << i.library;
  EXPECT_FALSE(i.kernel.empty());
}

// BLIS 0.9 would take its AVX2 kernels on a virtual machine's AVX-512 CPU;
// headgrad points it at its AVX-512 ones (BLIS_ARCH_TYPE = 0, BLIS's id of skx).
TEST(BlasInfo, BlisRunsItsAvx512KernelsOnAnAvx512Cpu) {
  if (blas::info().library != "BLIS") GTEST_SKIP() << "built with " << blas::info().library;
#if defined(__x86_64__) && defined(__GNUC__)
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512dq") ||
      !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl"))
    GTEST_SKIP() << "no AVX-512 here";
#endif
  const char* chosen = std::getenv("BLIS_ARCH_TYPE");
  if (!chosen) GTEST_SKIP() << "this BLIS was built without its skx kernels";
  if (std::string(chosen) != "0") GTEST_SKIP() << "BLIS_ARCH_TYPE=" << chosen << " set outside";
  EXPECT_EQ(blas::info().kernel, "skx");
}

}  // namespace

}  // namespace test_fast_paths
