// Tensors: geometry, views and copies, element access, dtypes, the seeded
// generator and the memory counter.
//
// Shape legend: shapes are written outermost first; "x" below is usually the
// [2, 3, 4] tensor holding 0, 1, ..., 23 in row-major order, so x[i][j][k] =
// 12 i + 4 j + k and every expected value can be worked out by hand.
#include "headgrad/tensor.hpp"
#include "headgrad/parallel.hpp"

#include "checks.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace test_tensor {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using headgrad::DType;
using headgrad::dtype_name;
using headgrad::num_threads;
using headgrad::set_num_threads;
using headgrad::Generator;
using headgrad::Shape;
using headgrad::Tensor;
using headgrad::test::expect_invalid;

// [2, 3, 4] holding 0..23.
Tensor iota(const Shape& shape, DType dtype = DType::float64) {
  std::vector<double> v(static_cast<std::size_t>(headgrad::shape_numel(shape)));
  std::iota(v.begin(), v.end(), 0.0);
  return Tensor::from_values(v, shape, dtype);
}

// ---------------------------------------------------------------- geometry

TEST(TensorGeometry, ShapeStridesOffset) {
  const Tensor x = Tensor::zeros({2, 3, 4}, DType::float64);
  EXPECT_TRUE(x.defined());
  EXPECT_EQ(x.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(x.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(x.offset(), 0);
  EXPECT_EQ(x.dim(), 3);
  EXPECT_EQ(x.numel(), 24);
  EXPECT_EQ(x.size(0), 2);
  EXPECT_EQ(x.size(-1), 4);
  EXPECT_EQ(x.stride(-2), 4);
  EXPECT_EQ(x.dtype(), DType::float64);
  EXPECT_TRUE(x.is_contiguous());
  EXPECT_EQ(x.storage()->nbytes(), 24u * 8u);
  EXPECT_THROW((void)x.size(3), std::invalid_argument);
  EXPECT_THROW((void)x.stride(-4), std::invalid_argument);
  EXPECT_EQ(x.repr(), "Tensor(float64, [2, 3, 4], strides [12, 4, 1])");
  EXPECT_FALSE(Tensor().defined());
}

TEST(TensorGeometry, ShapeHelpers) {
  EXPECT_EQ(headgrad::shape_str(Shape{2, 3, 4}), "[2, 3, 4]");
  EXPECT_EQ(headgrad::shape_str(Shape{}), "[]");
  EXPECT_EQ(headgrad::shape_numel(Shape{2, 3, 4}), 24);
  EXPECT_EQ(headgrad::shape_numel(Shape{}), 1);
  EXPECT_EQ(headgrad::contiguous_strides(Shape{5, 1, 3}), (Shape{3, 3, 1}));
  EXPECT_EQ(headgrad::unravel_index(5, Shape{2, 3}), (Shape{1, 2}));
  EXPECT_EQ(headgrad::unravel_index(0, Shape{2, 3, 4}), (Shape{0, 0, 0}));
  EXPECT_EQ(headgrad::unravel_index(17, Shape{2, 3, 4}), (Shape{1, 1, 1}));  // 12 + 4 + 1
  EXPECT_EQ(headgrad::unravel_index(0, Shape{}), Shape{});
  const Tensor s = Tensor::scalar(2.5, DType::float32);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item(), 2.5);
}

TEST(TensorGeometry, FactoriesFillValues) {
  const Tensor f = Tensor::full({2, 2}, -1.25, DType::float32);
  EXPECT_EQ(f.to_vector(), (std::vector<double>{-1.25, -1.25, -1.25, -1.25}));
  EXPECT_EQ(Tensor::ones({3}, DType::float64).to_vector(), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(Tensor::zeros({2}, DType::boolean).to_vector(), (std::vector<double>{0, 0}));
  expect_invalid([] { Tensor::from_values(std::vector<double>{1, 2, 3}, {2, 2}, DType::float64); },
                 {"from_values", "3", "[2, 2]"});
  expect_invalid([] { Tensor::empty({2, -1}, DType::float64); }, {"negative", "[2, -1]"});
}

// ---------------------------------------------------------------- sizes

// Sizes are checked, never wrapped: a shape whose element count or byte count
// does not fit int64 is refused by name before anything is allocated.
TEST(TensorSizes, OverflowingShapesThrowCleanly) {
  constexpr std::int64_t k2p31 = std::int64_t{1} << 31, k2p32 = std::int64_t{1} << 32;
  const auto before = headgrad::memory_stats().current_bytes;
  // 2^62 elements fit int64, 2^64 bytes of float32 do not.
  expect_invalid([&] { (void)Tensor::empty({k2p31, k2p31}, DType::float32); },
                 {"[2147483648, 2147483648]", "float32", "bytes"});
  expect_invalid([&] { (void)Tensor::zeros({k2p31, k2p31}, DType::float64); },
                 {"[2147483648, 2147483648]"});
  // 2^67 elements: the count itself would wrap (to 0 in 64-bit arithmetic).
  const Shape wraps{k2p32, k2p32, 8};
  expect_invalid([&] { (void)Tensor::empty(wraps, DType::float32); },
                 {"[4294967296, 4294967296, 8]", "overflows"});
  expect_invalid([&] { (void)Tensor::full(wraps, 1.0, DType::float64); }, {"4294967296"});
  expect_invalid([&] { (void)headgrad::shape_numel(wraps); }, {"[4294967296, 4294967296, 8]"});
  expect_invalid([&] { (void)headgrad::contiguous_strides(wraps); }, {"overflows"});
  Generator gen(0);
  expect_invalid([&] { (void)headgrad::randn(wraps, DType::float32, gen); }, {"overflows"});
  EXPECT_EQ(headgrad::memory_stats().current_bytes, before);  // nothing was allocated
  // A broadcast view needs no memory, but its element count must still fit.
  const Tensor one = Tensor::scalar(1.0, DType::float32);
  expect_invalid([&] { (void)one.expand(wraps); }, {"overflows"});
  EXPECT_EQ(one.expand({k2p31, k2p31}).numel(), std::int64_t{1} << 62);  // fits: allowed
  expect_invalid([&] { (void)Tensor::zeros({4}, DType::float32).view({-1, k2p32, k2p32}); },
                 {"view", "overflows"});
  // Zero-size dims do not hide an overflow in the others' strides.
  expect_invalid([&] { (void)Tensor::empty({0, k2p32, k2p32}, DType::float32); }, {"overflows"});
  EXPECT_EQ(Tensor::empty({0, k2p31}, DType::float32).numel(), 0);
}

TEST(TensorSizes, NegativeSizesAndOutOfStorageViewsThrow) {
  expect_invalid([] { (void)Tensor::empty({2, -1}, DType::float64); }, {"[2, -1]", "negative"});
  expect_invalid([] { (void)headgrad::shape_numel(Shape{3, -2}); }, {"negative"});
  const Tensor x = iota({2, 3});
  expect_invalid([] { (void)Tensor::scalar(1.0, DType::float64).expand({-1, 3}); }, {"negative"});
  expect_invalid([&] { (void)x.view({-2, -3}); }, {"negative"});
  // A view built by hand must stay inside its storage (6 doubles).
  expect_invalid([&] { (void)Tensor(x.storage(), {2, 3}, {3, 1}, 1, DType::float64); },
                 {"outside its storage", "[2, 3]"});
  expect_invalid([&] { (void)Tensor(x.storage(), {3}, {-1}, 1, DType::float64); },
                 {"outside its storage"});
  expect_invalid([&] { (void)Tensor(x.storage(), {2}, {std::int64_t{1} << 62}, 0, DType::float64); },
                 {"outside"});
  EXPECT_EQ(Tensor(x.storage(), {3}, {-1}, 2, DType::float64).to_vector(), (std::vector<double>{2, 1, 0}));
  // narrow's bounds cannot wrap either.
  expect_invalid([&] { (void)x.narrow(1, 1, std::numeric_limits<std::int64_t>::max()); },
                 {"narrow", "[2, 3]"});
  EXPECT_THROW((void)headgrad::unravel_index(6, Shape{2, 3}), std::out_of_range);
  EXPECT_THROW((void)headgrad::unravel_index(0, Shape{0, 3}), std::out_of_range);
}

// ---------------------------------------------------------------- views

TEST(TensorViews, TransposeIsAView) {
  Tensor x = iota({2, 3, 4});
  Tensor xt = x.transpose(1, 2);
  EXPECT_EQ(xt.shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(xt.strides(), (Shape{12, 1, 4}));
  EXPECT_TRUE(xt.shares_storage(x));
  EXPECT_FALSE(xt.is_contiguous());
  EXPECT_EQ(xt.at({1, 3, 2}), 12 * 1 + 4 * 2 + 3);  // = x[1][2][3]
  xt.set({0, 1, 2}, 99.0);
  EXPECT_EQ(x.at({0, 2, 1}), 99.0);
  // Negative dims count from the end.
  EXPECT_EQ(x.transpose(-1, -3).shape(), (Shape{4, 3, 2}));
  EXPECT_THROW(x.transpose(0, 3), std::invalid_argument);
}

TEST(TensorViews, PermuteIsAView) {
  Tensor x = iota({2, 3, 4});
  Tensor p = x.permute({2, 0, 1});  // p[k][i][j] = x[i][j][k]
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_TRUE(p.shares_storage(x));
  EXPECT_EQ(p.at({3, 1, 2}), 12 * 1 + 4 * 2 + 3);
  p.set({1, 0, 2}, -5.0);
  EXPECT_EQ(x.at({0, 2, 1}), -5.0);
  expect_invalid([&] { x.permute({0, 1}); }, {"permute", "[0, 1]", "[2, 3, 4]"});
  expect_invalid([&] { x.permute({0, 1, 1}); }, {"permute", "repeat"});
}

TEST(TensorViews, NarrowIsAView) {
  Tensor x = iota({2, 3, 4});
  Tensor n = x.narrow(1, 1, 2);  // rows j = 1, 2
  EXPECT_EQ(n.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(n.strides(), (Shape{12, 4, 1}));
  EXPECT_EQ(n.offset(), 4);
  EXPECT_TRUE(n.shares_storage(x));
  EXPECT_FALSE(n.is_contiguous());
  EXPECT_EQ(n.at({1, 0, 2}), 12 + 4 + 2);
  n.set({0, 1, 3}, 100.0);
  EXPECT_EQ(x.at({0, 2, 3}), 100.0);
  // Narrowing the outermost dim keeps a contiguous block.
  const Tensor n0 = x.narrow(0, 1, 1);
  EXPECT_TRUE(n0.is_contiguous());
  EXPECT_EQ(n0.offset(), 12);
  expect_invalid([&] { x.narrow(2, 3, 2); }, {"narrow", "[3, 5)", "[2, 3, 4]"});
  EXPECT_THROW(x.narrow(1, -1, 1), std::invalid_argument);
}

TEST(TensorViews, UnsqueezeSqueeze) {
  const Tensor x = iota({2, 3});
  const Tensor u = x.unsqueeze(1);
  EXPECT_EQ(u.shape(), (Shape{2, 1, 3}));
  EXPECT_TRUE(u.shares_storage(x));
  EXPECT_EQ(u.at({1, 0, 2}), 5.0);
  EXPECT_EQ(x.unsqueeze(-1).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(u.squeeze(1).shape(), (Shape{2, 3}));
  EXPECT_THROW(x.squeeze(0), std::invalid_argument);
}

TEST(TensorViews, ViewOfContiguous) {
  Tensor x = iota({2, 3, 4});
  Tensor v = x.view({6, 4});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_EQ(v.strides(), (Shape{4, 1}));
  EXPECT_TRUE(v.shares_storage(x));
  EXPECT_EQ(v.at({4, 1}), 17.0);
  v.set({5, 3}, -1.0);
  EXPECT_EQ(x.at({1, 2, 3}), -1.0);
  EXPECT_EQ(x.view({24}).strides(), (Shape{1}));
  EXPECT_EQ(x.view({2, 1, 12}).at({1, 0, 5}), 17.0);
  EXPECT_EQ(x.view({4, 3, 2}).at({2, 2, 1}), 17.0);  // 6 * 2 + 2 * 2 + 1
}

TEST(TensorViews, ViewOfScalar) {
  const Tensor s = Tensor::scalar(4.0, DType::float64);
  const Tensor v = s.view({1});
  EXPECT_EQ(v.shape(), (Shape{1}));
  EXPECT_TRUE(v.shares_storage(s));
  EXPECT_EQ(v.at({0}), 4.0);
  EXPECT_EQ(s.view({1, 1}).shape(), (Shape{1, 1}));
  EXPECT_EQ(s.reshape({-1}).shape(), (Shape{1}));
  EXPECT_EQ(v.view({}).dim(), 0);
}

TEST(TensorViews, MinusOneIsInferred) {
  const Tensor x = iota({2, 3, 4});
  EXPECT_EQ(x.view({2, -1}).shape(), (Shape{2, 12}));
  EXPECT_EQ(x.view({-1, 4}).shape(), (Shape{6, 4}));
  EXPECT_EQ(x.reshape({-1}).shape(), (Shape{24}));
  EXPECT_EQ(x.transpose(0, 2).reshape({3, -1}).shape(), (Shape{3, 8}));
  expect_invalid([&] { x.view({-1, -1}); }, {"view", "more than one -1"});
  expect_invalid([&] { x.view({5, -1}); }, {"view", "[5, -1]", "[2, 3, 4]"});
  expect_invalid([&] { x.reshape({7, -1}); }, {"reshape", "[7, -1]", "[2, 3, 4]"});
}

TEST(TensorViews, ViewWithBadSizeThrows) {
  const Tensor x = iota({2, 3, 4});
  expect_invalid([&] { x.view({5, 5}); }, {"view", "[5, 5]", "[2, 3, 4]"});
  expect_invalid([&] { x.view({2, -3, 4}); }, {"view", "negative"});
}

TEST(TensorViews, ViewOfTransposedThatCannotBeViewedThrows) {
  const Tensor xt = iota({2, 3, 4}).transpose(1, 2);  // [2, 4, 3], strides [12, 1, 4]
  expect_invalid([&] { xt.view({2, 12}); },
                 {"view", "cannot be viewed", "reshape", "contiguous", "[2, 4, 3]", "[2, 12]"});
  EXPECT_FALSE(xt.try_view({2, 12}).has_value());
  // The copy route the message suggests works and holds xt's row-major values.
  const Tensor ok = xt.contiguous().view({2, 12});
  EXPECT_EQ(ok.at({0, 1}), 4.0);   // xt[0][0][1] = x[0][1][0]
  EXPECT_EQ(ok.at({1, 4}), 17.0);  // xt[1][1][1] = x[1][1][1]
}

TEST(TensorViews, ViewOfNonContiguousThatCanBeViewedDoesNotCopy) {
  Tensor x = iota({2, 5, 3});
  // Narrow on dim 1: [2, 2, 3] with strides [15, 3, 1], not contiguous, but its
  // two inner dims are one contiguous block of 6 per outer index.
  Tensor n = x.narrow(1, 1, 2);
  ASSERT_FALSE(n.is_contiguous());
  Tensor v = n.view({2, 6});
  EXPECT_TRUE(v.shares_storage(x));
  EXPECT_EQ(v.strides(), (Shape{15, 1}));
  EXPECT_EQ(v.offset(), 3);
  EXPECT_EQ(v.to_vector(), n.to_vector());
  EXPECT_EQ(v.at({1, 5}), 15 + 3 * 2 + 2);
  v.set({0, 0}, 42.0);
  EXPECT_EQ(x.at({0, 1, 0}), 42.0);

  // Splitting a transposed dim is a view too: [2, 4, 3] (strides [12, 1, 4]) -> [2, 2, 2, 3].
  const Tensor xt = iota({2, 3, 4}).transpose(1, 2);
  const Tensor split = xt.view({2, 2, 2, 3});
  EXPECT_TRUE(split.shares_storage(xt));
  EXPECT_EQ(split.strides(), (Shape{12, 2, 1, 4}));
  EXPECT_EQ(split.to_vector(), xt.to_vector());
}

TEST(TensorViews, ReshapeViewsWhenItCanAndCopiesWhenItMust) {
  const Tensor x = iota({2, 3, 4});
  const Tensor r = x.reshape({4, 6});
  EXPECT_TRUE(r.shares_storage(x));
  EXPECT_EQ(r.to_vector(), x.to_vector());

  const Tensor xt = x.transpose(1, 2);  // [2, 4, 3]
  const Tensor c = xt.reshape({2, 12});
  EXPECT_FALSE(c.shares_storage(x));
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector(), xt.to_vector());
  EXPECT_EQ(c.at({1, 11}), 23.0);
  EXPECT_EQ(c.at({0, 3}), 1.0);  // xt[0][1][0] = x[0][0][1]

  const Tensor n = x.narrow(1, 1, 2);  // [2, 2, 4], inner dims viewable
  EXPECT_TRUE(n.reshape({2, 8}).shares_storage(x));
  EXPECT_FALSE(n.reshape({16}).shares_storage(x));  // dims 0 and 1 are not one block
  EXPECT_EQ(n.reshape({16}).to_vector(), n.to_vector());
}

TEST(TensorViews, ContiguousCopiesOnlyWhenNeeded) {
  const Tensor x = iota({2, 3, 4});
  EXPECT_TRUE(x.contiguous().shares_storage(x));
  const Tensor xt = x.permute({2, 0, 1});
  ASSERT_FALSE(xt.is_contiguous());
  const Tensor c = xt.contiguous();
  EXPECT_FALSE(c.shares_storage(x));
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.strides(), (Shape{6, 3, 1}));
  for (std::int64_t k = 0; k < 4; ++k)
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t j = 0; j < 3; ++j)
        EXPECT_EQ(c.at({k, i, j}), static_cast<double>(12 * i + 4 * j + k));
  // Size-1 dims do not break contiguity whatever their stride.
  EXPECT_TRUE(Tensor(x.storage(), {1, 4}, {999, 1}, 0, DType::float64).is_contiguous());
  const Tensor cl = x.clone();
  EXPECT_FALSE(cl.shares_storage(x));
  EXPECT_EQ(cl.to_vector(), x.to_vector());
}

TEST(TensorViews, ExpandUsesStrideZero) {
  const Tensor col = iota({3, 1});  // 0, 1, 2
  Tensor e = col.expand({2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_TRUE(e.shares_storage(col));
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t k = 0; k < 4; ++k) EXPECT_EQ(e.at({b, i, k}), static_cast<double>(i));
  EXPECT_EQ(iota({4}).expand({3, 4}).strides(), (Shape{0, 1}));
  EXPECT_EQ(iota({4}).expand({4}).strides(), (Shape{1}));
}

TEST(TensorViews, ExpandErrors) {
  const Tensor x = iota({3, 2});
  expect_invalid([&] { x.expand({3, 4}); }, {"expand", "[3, 2]", "[3, 4]"});
  expect_invalid([&] { x.expand({6}); }, {"expand", "[3, 2]", "[6]"});
}

// ---------------------------------------------------------------- elements

TEST(TensorElements, AtSetFlat) {
  Tensor x = iota({2, 3});
  EXPECT_EQ(x.at({1, 2}), 5.0);
  x.set({0, 1}, 7.5);
  EXPECT_EQ(x.flat(1), 7.5);
  const Tensor xt = x.transpose(0, 1);  // [3, 2]: row-major order 0, 3, 7.5, 4, 2, 5
  EXPECT_EQ(xt.flat(1), 3.0);
  EXPECT_EQ(xt.flat(2), 7.5);
  EXPECT_EQ(xt.flat_to_offset(3), 4);
  EXPECT_EQ(xt.to_vector(), (std::vector<double>{0, 3, 7.5, 4, 2, 5}));
  Tensor xt_w = xt;
  xt_w.set_flat(5, -2.0);
  EXPECT_EQ(x.at({1, 2}), -2.0);
  EXPECT_THROW((void)x.at({2, 0}), std::out_of_range);
  EXPECT_THROW((void)x.at({0, -1}), std::out_of_range);
  EXPECT_THROW((void)x.flat(6), std::out_of_range);
  EXPECT_THROW((void)x.at({0}), std::invalid_argument);
  EXPECT_THROW(x.set({0, 0, 0}, 1.0), std::invalid_argument);
  EXPECT_THROW((void)x.item(), std::invalid_argument);
  EXPECT_EQ(x.narrow(1, 2, 1).narrow(0, 1, 1).item(), -2.0);
}

TEST(TensorElements, TypedDataPointer) {
  const Tensor x = iota({2, 3}).narrow(1, 1, 2);  // offset 1
  EXPECT_EQ(*x.data<double>(), 1.0);
  EXPECT_EQ(x.data<double>()[3], 4.0);  // storage element 4
  expect_invalid([&] { (void)x.data<float>(); }, {"float64", "float32"});
}

TEST(TensorElements, EveryWriteBumpsTheVersionReadsDoNot) {
  Tensor x = iota({2, 3});
  const Tensor view = x.transpose(0, 1);  // shares x's storage, so its version
  const std::uint64_t v0 = x.version();
  (void)x.data<double>();
  (void)x.at({1, 2});
  (void)x.to_vector();
  (void)x.clone();
  EXPECT_EQ(x.version(), v0);
  x.set({0, 0}, 1.0);
  EXPECT_EQ(x.version(), v0 + 1);
  x.set_flat(1, 2.0);
  EXPECT_EQ(view.version(), v0 + 2);
  Tensor row = x.narrow(0, 1, 1);
  row.fill_(0.0);
  EXPECT_GT(view.version(), v0 + 2);
  const std::uint64_t v1 = x.version();
  x.copy_(iota({2, 3}));
  EXPECT_GT(x.version(), v1);
  const std::uint64_t v2 = x.version();
  x.mutable_data<double>()[0] = 7.0;
  EXPECT_EQ(x.version(), v2 + 1);
  EXPECT_EQ(view.at({0, 0}), 7.0);
  EXPECT_EQ(Tensor().version(), 0u);
}

TEST(TensorElements, FillOnAViewFillsOnlyTheView) {
  Tensor x = Tensor::zeros({3, 4}, DType::float64);
  x.narrow(1, 1, 2).fill_(7.0);
  x.transpose(0, 1).narrow(1, 2, 1).fill_(-1.0);  // row 2 of x
  const std::vector<double> want = {0, 7, 7, 0, 0, 7, 7, 0, -1, -1, -1, -1};
  EXPECT_EQ(x.to_vector(), want);
}

TEST(TensorElements, CopyAcrossStridesAndDtypes) {
  // float64 contiguous -> float32 transposed view of a [4, 3] tensor.
  Tensor dst_base = Tensor::zeros({4, 3}, DType::float32);
  Tensor dst = dst_base.transpose(0, 1);  // [3, 4]
  const Tensor src = iota({3, 4});
  dst.copy_(src);
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t j = 0; j < 4; ++j) EXPECT_EQ(dst_base.at({j, i}), static_cast<double>(4 * i + j));
  // strided float32 source -> float64 narrowed destination.
  Tensor big = Tensor::full({3, 6}, -9.0, DType::float64);
  big.narrow(1, 1, 4).copy_(dst);
  EXPECT_EQ(big.at({0, 0}), -9.0);
  EXPECT_EQ(big.at({2, 4}), 11.0);
  EXPECT_EQ(big.at({2, 5}), -9.0);
  // bool <-> float: nonzero is true, true is 1.
  Tensor flags = Tensor::zeros({3}, DType::boolean);
  flags.copy_(Tensor::from_values(std::vector<double>{0.0, -2.5, 1e-300}, {3}, DType::float64));
  EXPECT_EQ(flags.to_vector(), (std::vector<double>{0, 1, 1}));
  // An expanded (stride-0) source is read correctly.
  Tensor rows = Tensor::zeros({2, 3}, DType::float64);
  rows.copy_(iota({3}).expand({2, 3}));
  EXPECT_EQ(rows.to_vector(), (std::vector<double>{0, 1, 2, 0, 1, 2}));
  expect_invalid([&] { rows.copy_(iota({3, 2})); }, {"copy_", "[3, 2]", "[2, 3]"});
}

TEST(TensorElements, ToConvertsDtype) {
  const Tensor x = Tensor::from_values(std::vector<double>{0.1, -3.0, 0.0}, {3}, DType::float64);
  EXPECT_TRUE(x.to(DType::float64).shares_storage(x));
  const Tensor f = x.to(DType::float32);
  EXPECT_EQ(f.dtype(), DType::float32);
  EXPECT_FALSE(f.shares_storage(x));
  EXPECT_EQ(f.flat(0), static_cast<double>(0.1f));
  EXPECT_NE(f.flat(0), 0.1);  // really rounded to float
  EXPECT_EQ(x.to(DType::boolean).to_vector(), (std::vector<double>{1, 1, 0}));
  // to() of a view gives a contiguous copy in the view's row-major order.
  const Tensor t = iota({2, 3}).transpose(0, 1).to(DType::float32);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(TensorDtype, NamesSizesAndErrors) {
  EXPECT_EQ(headgrad::dtype_size(DType::float32), 4u);
  EXPECT_EQ(headgrad::dtype_size(DType::float64), 8u);
  EXPECT_EQ(headgrad::dtype_size(DType::boolean), 1u);
  EXPECT_EQ(headgrad::dtype_name(DType::boolean), "bool");
  EXPECT_EQ(headgrad::dtype_from_name("float32"), DType::float32);
  EXPECT_EQ(headgrad::dtype_from_name("float64"), DType::float64);
  EXPECT_EQ(headgrad::dtype_from_name("bool"), DType::boolean);
  expect_invalid([] { headgrad::dtype_from_name("int8"); }, {"int8", "float32", "float64"});
  expect_invalid([] { headgrad::dispatch_float(DType::boolean, "my_op", []<class T>() { return 0; }); },
                 {"my_op", "bool"});
  EXPECT_EQ(headgrad::dispatch_float(DType::float32, "op", []<class T>() { return sizeof(T); }), 4u);
}

// ---------------------------------------------------------------- random

// Reference SplitMix64 (Steele, Lea, Flood 2014), written independently of core.
std::uint64_t splitmix64_ref(std::uint64_t& state) {
  std::uint64_t z = state += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

TEST(Generator, StreamIsSplitMix64) {
  // Published first outputs of SplitMix64 for seed 0.
  Generator g0(0);
  EXPECT_EQ(g0.next_u64(), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(g0.next_u64(), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(g0.next_u64(), 0x06c45d188009454fULL);
  for (std::uint64_t seed : {0ULL, 1ULL, 42ULL, 0xdeadbeefcafef00dULL}) {
    Generator g(seed);
    std::uint64_t ref = seed;
    for (int i = 0; i < 8; ++i) EXPECT_EQ(g.next_u64(), splitmix64_ref(ref)) << "seed " << seed << " draw " << i;
  }
}

TEST(Generator, UniformUsesTop53Bits) {
  Generator g(7);
  std::uint64_t ref = 7;
  for (int i = 0; i < 5; ++i) {
    const double u = g.uniform();
    EXPECT_EQ(u, static_cast<double>(splitmix64_ref(ref) >> 11) / 9007199254740992.0);  // 2^53
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

TEST(Generator, RandnIsReproducibleAndStandard) {
  Generator a(0), b(0), c(1);
  const Tensor x = headgrad::randn({100000}, DType::float64, a);
  const Tensor y = headgrad::randn({100000}, DType::float64, b);
  const Tensor z = headgrad::randn({100000}, DType::float64, c);
  const std::vector<double> vx = x.to_vector(), vy = y.to_vector(), vz = z.to_vector();
  EXPECT_EQ(vx, vy);
  EXPECT_NE(vx, vz);
  double sum = 0.0;
  for (double v : vx) sum += v;
  const double mean = sum / static_cast<double>(vx.size());
  double sq = 0.0;
  for (double v : vx) sq += (v - mean) * (v - mean);
  const double std = std::sqrt(sq / static_cast<double>(vx.size()));
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std, 1.0, 0.01);

  // stddev scales; float32 holds the same draws rounded.
  Generator d(0), e(0);
  const Tensor s = headgrad::randn({4}, DType::float64, d, 3.0);
  const Tensor f = headgrad::randn({4}, DType::float32, e);
  for (std::int64_t i = 0; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(s.flat(i), 3.0 * vx[static_cast<std::size_t>(i)]);
    EXPECT_EQ(f.flat(i), static_cast<double>(static_cast<float>(vx[static_cast<std::size_t>(i)])));
  }
}

// The normals of the sequential stream, written out as Generator::normal
// was before randn drew its pairs on every worker: the reference randn must
// match bit for bit (every seeded case and committed reference depends on it).
struct SequentialNormals {
  std::uint64_t state;
  bool has_spare = false;
  double spare = 0.0;
  double uniform() { return static_cast<double>(splitmix64_ref(state) >> 11) * 0x1.0p-53; }
  double normal() {
    if (has_spare) {
      has_spare = false;
      return spare;
    }
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * 3.14159265358979323846 * u2;
    spare = r * std::sin(theta);
    has_spare = true;
    return r * std::cos(theta);
  }
  Tensor randn(const Shape& shape, DType dtype, double stddev = 1.0) {
    Tensor t = Tensor::empty(shape, dtype);
    for (std::int64_t i = 0; i < t.numel(); ++i) t.set_flat(i, normal() * stddev);
    return t;
  }
};

// randn, then the next normal() of the same generator, against the sequence:
// equal values (to_vector widens every dtype exactly) and the stream left
// where the sequence leaves it (its spare normal included).
void expect_sequential_randn(std::uint64_t seed, const std::vector<std::pair<std::int64_t, DType>>& draws) {
  Generator g(seed);
  SequentialNormals ref{seed};
  for (const auto& [n, dtype] : draws) {
    const Tensor got = headgrad::randn({n}, dtype, g, 0.75);
    const Tensor want = ref.randn({n}, dtype, 0.75);
    ASSERT_EQ(got.to_vector(), want.to_vector()) << "seed " << seed << ", " << n << " " << dtype_name(dtype);
    ASSERT_EQ(g.normal(), ref.normal()) << "the draw after " << n;
  }
}

TEST(Generator, RandnOnEveryWorkerIsTheSequentialStream) {
  const int threads = num_threads();
  for (const int t : {1, 2, 3}) {
    set_num_threads(t);
    for (const std::uint64_t seed : {0ULL, 5ULL, 0xdeadbeefcafef00dULL})
      expect_sequential_randn(seed, {{1, DType::float64}, {7, DType::float32}, {300001, DType::float64},
                                     {200000, DType::bfloat16}, {99999, DType::float16}, {2, DType::float64},
                                     {0, DType::float32}, {123457, DType::float32}});
  }
  set_num_threads(threads);
}

// The inverse of SplitMix64's output function, so that a test can place a
// chosen output in the stream: each xor-shift and odd multiplier is undone.
std::uint64_t unmix(std::uint64_t z) {
  auto unshift = [](std::uint64_t y, int s) {
    std::uint64_t x = y;
    for (int i = 0; i < 64 / s + 1; ++i) x = y ^ (x >> s);
    return x;
  };
  auto inverse = [](std::uint64_t a) {  // a odd: Newton's iteration mod 2^64
    std::uint64_t x = a;
    for (int i = 0; i < 6; ++i) x *= 2 - a * x;
    return x;
  };
  z = unshift(z, 31) * inverse(0x94d049bb133111ebULL);
  z = unshift(z, 27) * inverse(0xbf58476d1ce4e5b9ULL);
  return unshift(z, 30);
}

// A first uniform of 0, which normal() rejects (the stream then shifts by one
// draw), placed at pair 70000 of a fill that every worker shares: randn still
// gives the sequence's values.
TEST(Generator, RandnKeepsTheSequenceAcrossARejectedUniform) {
  constexpr std::uint64_t gamma = 0x9e3779b97f4a7c15ULL;
  for (const std::uint64_t output : {0ULL, 0x7ffULL}) {  // both have no bit in the top 53: uniform 0
    const std::uint64_t pair = 70000;
    // output number 2 pair + 1 of the stream from `seed` is mix(seed + (2 pair + 1) gamma)
    const std::uint64_t seed = unmix(output) - (2 * pair + 1) * gamma;
    std::uint64_t check = seed + 2 * pair * gamma;
    ASSERT_EQ(splitmix64_ref(check), output);
    const int threads = num_threads();
    set_num_threads(2);
    for (const DType dtype : {DType::float64, DType::bfloat16})  // bfloat16: the bulk narrowing's fill
      expect_sequential_randn(seed, {{300000, dtype}, {5, DType::float32}});
    set_num_threads(threads);
  }
}

TEST(Generator, RandUniformRange) {
  Generator g(3);
  const Tensor u = headgrad::rand_uniform({1000}, DType::float64, g, 1.5, 2.5);
  double lo = 10, hi = -10, sum = 0;
  for (double v : u.to_vector()) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  EXPECT_GE(lo, 1.5);
  EXPECT_LT(hi, 2.5);
  EXPECT_NEAR(sum / 1000.0, 2.0, 0.05);
}

// ---------------------------------------------------------------- memory

TEST(Memory, StatsCountAllocations) {
  constexpr std::size_t mib = 1 << 20;
  const auto before = headgrad::memory_stats();
  std::size_t peak_during = 0;
  {
    const Tensor t = Tensor::empty({static_cast<std::int64_t>(mib / 8)}, DType::float64);
    const auto during = headgrad::memory_stats();
    EXPECT_EQ(during.current_bytes, before.current_bytes + mib);
    EXPECT_GE(during.peak_bytes, during.current_bytes);
    EXPECT_GE(during.peak_bytes, before.current_bytes + mib);
    // A view allocates nothing.
    const Tensor v = t.view({-1, 8}).transpose(0, 1);
    EXPECT_EQ(headgrad::memory_stats().current_bytes, before.current_bytes + mib);
    peak_during = during.peak_bytes;
  }
  const auto after = headgrad::memory_stats();
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_EQ(after.peak_bytes, peak_during);  // peak stays until reset
  headgrad::reset_peak_memory();
  EXPECT_EQ(headgrad::memory_stats().peak_bytes, after.current_bytes);
}

// ---------------------------------------------------------------- Shape

// Shape, the small-buffer vector of sizes and strides, against std::vector as
// the second implementation: the same random sequence of edits applied to
// both must leave the same values, whether the Shape holds its values inline
// (up to 6) or on the heap, and through copies and moves of either.

std::vector<std::int64_t> values_of(const Shape& s) { return {s.begin(), s.end()}; }

TEST(Shape, RandomEditsMatchStdVector) {
  std::mt19937_64 rng(7);
  Shape s;
  std::vector<std::int64_t> v;
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % (n + 1)); };
  for (int step = 0; step < 20000; ++step) {
    const std::int64_t x = static_cast<std::int64_t>(rng() % 1000) - 500;
    switch (rng() % 8) {
      case 0: s.push_back(x); v.push_back(x); break;
      case 1: if (!v.empty()) { s.pop_back(); v.pop_back(); } break;
      case 2: { const std::size_t at = pick(v.size()); s.insert(s.begin() + at, x); v.insert(v.begin() + at, x); break; }
      case 3: if (!v.empty()) { const std::size_t at = pick(v.size() - 1); s.erase(s.begin() + at); v.erase(v.begin() + at); } break;
      case 4: { const std::size_t n = pick(9); s.resize(n, x); v.resize(n, x); break; }
      case 5: { // insert a range of the Shape itself (the aliasing case)
        const std::size_t at = pick(v.size()), from = pick(v.size()), to = from + pick(v.size() - from);
        s.insert(s.begin() + at, s.begin() + from, s.begin() + to);
        const std::vector<std::int64_t> part(v.begin() + from, v.begin() + to);
        v.insert(v.begin() + at, part.begin(), part.end());
        break;
      }
      case 6: { Shape copy = s; s = std::move(copy); break; }  // through a copy and a move
      case 7: if (v.size() > 12) { s.erase(s.begin() + 2, s.end()); v.erase(v.begin() + 2, v.end()); } break;
    }
    ASSERT_EQ(values_of(s), v) << "after step " << step;
    ASSERT_EQ(s.size(), v.size());
  }
}

TEST(Shape, InlineUpToSixDimsThenHeap) {
  Shape s{1, 2, 3, 4, 5, 6};
  EXPECT_EQ(s.capacity(), Shape::inline_capacity);
  const std::int64_t* inline_data = s.data();
  EXPECT_GE(inline_data, reinterpret_cast<const std::int64_t*>(&s));
  EXPECT_LT(inline_data, reinterpret_cast<const std::int64_t*>(&s + 1));  // the values live in the object
  s.push_back(7);
  EXPECT_GT(s.capacity(), Shape::inline_capacity);
  EXPECT_EQ(values_of(s), (std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7}));
  // A moved heap Shape hands over its buffer; a moved inline one copies.
  const std::int64_t* heap_data = s.data();
  Shape moved = std::move(s);
  EXPECT_EQ(moved.data(), heap_data);
  EXPECT_TRUE(s.empty());
  Shape small{9, 8};
  Shape small_moved = std::move(small);
  EXPECT_EQ(values_of(small_moved), (std::vector<std::int64_t>{9, 8}));
}

TEST(Shape, ComparesAndConvertsLikeAVector) {
  const Shape a{2, 3}, b{2, 4}, c{2, 3, 1};
  EXPECT_EQ(a, (Shape{2, 3}));
  EXPECT_NE(a, b);
  EXPECT_LT(a, b);
  EXPECT_LT(a, c);  // a prefix sorts first, as for std::vector
  EXPECT_EQ((Shape(3, 7)), (Shape{7, 7, 7}));
  const std::span<const std::int64_t> span = c;
  EXPECT_EQ(span.size(), 3u);
  EXPECT_EQ(span[2], 1);
  EXPECT_EQ(headgrad::shape_numel(c), 6);
  EXPECT_EQ(c.to_vector(), (std::vector<std::int64_t>{2, 3, 1}));
  EXPECT_THROW(c.at(3), std::out_of_range);
}

}  // namespace

}  // namespace test_tensor
