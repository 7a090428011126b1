// The ops of core/src/ops/softmax_mask.cpp: softmax (each dim), masked_fill,
// causal_mask, logical_not, their composition into masked softmax, and the
// fused masked_softmax against that composition. For each op: forward
// against plain loops or numbers worked out by hand, gradcheck in float64 on
// contiguous, transposed and narrowed inputs, and gradcheck with fan-out.
// (The row kernels under them, exp_shift_row and row_max: test_kernels.cpp;
// the grouped kv helpers: test_attention_blocks.cpp.)
//
// Shape legend: x is [2, 3, 4] unless a case says otherwise; masks are bool,
// and causal masks are [Tq, Tk] with True = attend (j <= i, aligned top-left).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "headgrad/attention.hpp"
#include "headgrad/gradcheck.hpp"
#include "headgrad/ops.hpp"
#include "op_test_util.hpp"

namespace test_ops_softmax_mask {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using namespace headgrad::test;

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------- helpers

Tensor bools(const std::vector<double>& v, const Shape& shape) {
  return Tensor::from_values(v, shape, DType::boolean);
}

// ---------------------------------------------------------------- softmax

// Reference over x [2, 3, 4] and one dim: for each line along dim,
// exp(x - max) / sum exp(x - max).
std::vector<double> softmax_ref(const std::vector<double>& x, std::int64_t dim) {
  const std::int64_t n[3] = {2, 3, 4};
  const std::int64_t d = dim < 0 ? dim + 3 : dim;
  auto at = [](std::int64_t i, std::int64_t j, std::int64_t k) {
    return static_cast<std::size_t>((i * 3 + j) * 4 + k);
  };
  std::vector<double> y(x.size());
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 3; ++j)
      for (std::int64_t k = 0; k < 4; ++k) {
        // the line through (i, j, k) along d
        double mx = -kInf, s = 0.0;
        for (std::int64_t t = 0; t < n[d]; ++t)
          mx = std::max(mx, x[at(d == 0 ? t : i, d == 1 ? t : j, d == 2 ? t : k)]);
        for (std::int64_t t = 0; t < n[d]; ++t)
          s += std::exp(x[at(d == 0 ? t : i, d == 1 ? t : j, d == 2 ? t : k)] - mx);
        y[at(i, j, k)] = std::exp(x[at(i, j, k)] - mx) / s;
      }
  return y;
}

using SoftmaxParam = std::tuple<std::int64_t, Layout>;
class SoftmaxTest : public ::testing::TestWithParam<SoftmaxParam> {
 protected:
  std::int64_t dim() const { return std::get<0>(GetParam()); }
  Tensor input(std::uint64_t seed = 1) const { return make({2, 3, 4}, std::get<1>(GetParam()), seed); }
};

TEST_P(SoftmaxTest, ForwardMatchesLoop) {
  const Tensor x = input();
  expect_values(softmax(Variable(x), dim()).data(), {2, 3, 4}, softmax_ref(x.to_vector(), dim()));
}

TEST_P(SoftmaxTest, LinesSumToOne) {
  const Tensor y = softmax(Variable(input()), dim()).data();
  expect_values(sum(Variable(y), dim()).data(), [&] {
    Shape s = {2, 3, 4};
    s.erase(s.begin() + (dim() < 0 ? dim() + 3 : dim()));
    return s;
  }(), std::vector<double>(static_cast<std::size_t>(24 / y.size(dim())), 1.0));
}

TEST_P(SoftmaxTest, Gradcheck) {
  const std::int64_t d = dim();
  expect_gradcheck([d](const std::vector<Variable>& v) { return softmax(v[0], d); }, {input()});
}

TEST_P(SoftmaxTest, GradcheckFanOut) {
  // f(x) = softmax(x) * x: x feeds softmax and mul.
  const std::int64_t d = dim();
  expect_gradcheck([d](const std::vector<Variable>& v) { return mul(softmax(v[0], d), v[0]); }, {input()});
}

TEST_P(SoftmaxTest, Float32MatchesFloat64) {
  const Tensor x = input();
  const Tensor f = softmax(Variable(x.to(DType::float32)), dim()).data();
  EXPECT_EQ(f.dtype(), DType::float32);
  expect_values(f, {2, 3, 4}, softmax_ref(x.to_vector(), dim()), 1e-6);
}

// e.g. "dim_m1_transposed"
std::string softmax_param_name(const ::testing::TestParamInfo<SoftmaxParam>& info) {
  const auto& [dim, layout] = info.param;
  std::string name = dim < 0 ? "dim_m" : "dim_";
  name += std::to_string(dim < 0 ? -dim : dim);
  name += '_';
  name += layout_name(layout);
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, SoftmaxTest,
    ::testing::Combine(::testing::Values<std::int64_t>(0, 1, 2, -1, -2),
                       ::testing::Values(Layout::contiguous, Layout::transposed, Layout::narrowed)),
    softmax_param_name);

TEST(Softmax, HandWorkedValues) {
  // [0, ln 3] -> [1/4, 3/4]; [ln 2, 0, ln 5] -> [2/8, 1/8, 5/8]
  const Variable a(Tensor::from_values(std::vector<double>{0.0, std::log(3.0)}, {1, 2}, DType::float64));
  expect_values(softmax(a, -1).data(), {1, 2}, {0.25, 0.75});
  const Variable b(
      Tensor::from_values(std::vector<double>{std::log(2.0), 0.0, std::log(5.0)}, {3}, DType::float64));
  expect_values(softmax(b, 0).data(), {3}, {0.25, 0.125, 0.625});
}

TEST(Softmax, HandWorkedGradient) {
  // y = softmax([0, ln 3]) = [1/4, 3/4]; loss = y0: dx = y0 (e0 - y) = [3/16, -3/16].
  Variable x(Tensor::from_values(std::vector<double>{0.0, std::log(3.0)}, {2}, DType::float64), true);
  const Variable y = softmax(x, 0);
  y.backward(Tensor::from_values(std::vector<double>{1.0, 0.0}, {2}, DType::float64));
  expect_values(x.grad(), {2}, {3.0 / 16.0, -3.0 / 16.0});
}

TEST(Softmax, LargeInputsAreStable) {
  // softmax is shift-invariant: [1000, 1001] is [0, 1], no overflow to inf/inf.
  const Variable x(Tensor::from_values(std::vector<double>{1000.0, 1001.0, -1000.0, -1001.0}, {2, 2},
                                       DType::float64));
  const double e = std::exp(1.0);
  expect_values(softmax(x, -1).data(), {2, 2}, {1 / (1 + e), e / (1 + e), e / (1 + e), 1 / (1 + e)});
  const Tensor f = softmax(Variable(x.data().to(DType::float32)), -1).data();
  expect_values(f, {2, 2}, {1 / (1 + e), e / (1 + e), e / (1 + e), 1 / (1 + e)}, 1e-6);
}

TEST(Softmax, DimOutOfRangeThrows) {
  const Variable x(Tensor::zeros({2, 3}, DType::float64));
  expect_invalid([&] { softmax(x, 2); }, {"softmax", "2", "[2, 3]"});
}

// ---------------------------------------------------------------- causal mask, logical_not

TEST(CausalMask, ThreeByFiveIsTopLeftAligned) {
  // mask[i][j] = j <= i
  expect_values(causal_mask(3, 5), {3, 5},
                {1, 0, 0, 0, 0,
                 1, 1, 0, 0, 0,
                 1, 1, 1, 0, 0});
  EXPECT_EQ(causal_mask(3, 5).dtype(), DType::boolean);
}

TEST(CausalMask, FiveByThreeIsTopLeftAligned) {
  expect_values(causal_mask(5, 3), {5, 3},
                {1, 0, 0,
                 1, 1, 0,
                 1, 1, 1,
                 1, 1, 1,
                 1, 1, 1});
}

TEST(CausalMask, SquareAndEdges) {
  expect_values(causal_mask(1, 1), {1, 1}, {1});
  expect_values(causal_mask(2, 2), {2, 2}, {1, 0, 1, 1});
  EXPECT_EQ(causal_mask(0, 3).numel(), 0);
  expect_invalid([] { causal_mask(-1, 2); }, {"causal_mask", "-1"});
}

// Bottom-right alignment (FlashAttention 2.1+): query i attends j <= i + (Tk - Tq).
TEST(CausalMask, TwoByFiveBottomRight) {
  AttentionSpec spec;
  spec.causal = true;
  spec.causal_alignment = CausalAlignment::bottom_right;
  // shift 3: row 0 sees keys 0..3, row 1 (the last query) all five
  expect_values(attention_mask(spec, 2, 5), {2, 5},
                {1, 1, 1, 1, 0,
                 1, 1, 1, 1, 1});
  expect_values(causal_mask(2, 5, 3), {2, 5}, {1, 1, 1, 1, 0, 1, 1, 1, 1, 1});
  spec.causal_alignment = CausalAlignment::top_left;
  expect_values(attention_mask(spec, 2, 5), {2, 5},
                {1, 0, 0, 0, 0,
                 1, 1, 0, 0, 0});
}

TEST(CausalMask, FiveByThreeBottomRightHasEmptyRows) {
  AttentionSpec spec;
  spec.causal = true;
  spec.causal_alignment = CausalAlignment::bottom_right;
  // shift -2: rows 0 and 1 attend nothing, row 4 (the last query) every key
  expect_values(attention_mask(spec, 5, 3), {5, 3},
                {0, 0, 0,
                 0, 0, 0,
                 1, 0, 0,
                 1, 1, 0,
                 1, 1, 1});
  // with a user mask both must allow: key 1 hidden from every query
  spec.mask = bools({1, 0, 1}, {3});
  expect_values(attention_mask(spec, 5, 3), {5, 3},
                {0, 0, 0,
                 0, 0, 0,
                 1, 0, 0,
                 1, 0, 0,
                 1, 0, 1});
}

TEST(CausalMask, AlignmentsAgreeWhenSquare) {
  AttentionSpec top, bottom;
  top.causal = bottom.causal = true;
  bottom.causal_alignment = CausalAlignment::bottom_right;
  for (std::int64_t t : {1, 2, 4}) {
    EXPECT_EQ(bottom.causal_shift(t, t), 0);
    EXPECT_EQ(attention_mask(top, t, t).to_vector(), attention_mask(bottom, t, t).to_vector());
  }
  EXPECT_EQ(bottom.causal_shift(1, 7), 6);
  EXPECT_EQ(top.causal_shift(1, 7), 0);
  EXPECT_EQ(causal_alignment_name(CausalAlignment::top_left), "top_left");
  EXPECT_EQ(causal_alignment_name(CausalAlignment::bottom_right), "bottom_right");
}

TEST(LogicalNot, Values) {
  expect_values(logical_not(causal_mask(3, 5)), {3, 5},
                {0, 1, 1, 1, 1,
                 0, 0, 1, 1, 1,
                 0, 0, 0, 1, 1});
  // Of a non-contiguous (transposed) mask: its own row-major order.
  const Tensor t = logical_not(causal_mask(2, 3).transpose(0, 1));  // [3, 2]
  expect_values(t, {3, 2}, {0, 0, 1, 0, 1, 1});
  EXPECT_EQ(t.dtype(), DType::boolean);
  expect_invalid([] { logical_not(Tensor::zeros({2}, DType::float64)); }, {"logical_not", "float64"});
}

// ---------------------------------------------------------------- masked_fill

struct MaskCase {
  const char* name;
  Shape mask;
  double value;
};
void PrintTo(const MaskCase& c, std::ostream* os) { *os << c.name; }

const MaskCase kMaskCases[] = {
    {"mask_2x3x4_fill_0", {2, 3, 4}, 0.0},
    {"mask_3x4_fill_m5", {3, 4}, -5.0},  // broadcast over the batch
    {"mask_4_fill_2", {4}, 2.0},
    {"mask_2x1x4_fill_m1", {2, 1, 4}, -1.0},
};

// A fixed pattern of trues: element f is true when f % 3 == 1.
Tensor pattern_mask(const Shape& shape) {
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t f = 0; f < v.size(); ++f) v[f] = f % 3 == 1 ? 1.0 : 0.0;
  return bools(v, shape);
}

using MaskParam = std::tuple<MaskCase, Layout>;
class MaskedFillTest : public ::testing::TestWithParam<MaskParam> {
 protected:
  const MaskCase& mcase() const { return std::get<0>(GetParam()); }
  Tensor input() const { return make({2, 3, 4}, std::get<1>(GetParam()), 1); }
  Tensor mask() const { return pattern_mask(mcase().mask); }
};

TEST_P(MaskedFillTest, ForwardMatchesLoop) {
  const Tensor x = input(), m = mask();
  const std::vector<double> xv = x.to_vector(), mv = m.to_vector();
  const Shape& ms = mcase().mask;
  std::vector<double> want;
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 3; ++j)
      for (std::int64_t k = 0; k < 4; ++k) {
        // mask index, right-aligned, size-1 dims read 0
        const std::int64_t idx[3] = {i, j, k};
        std::int64_t off = 0;
        for (std::size_t d = 0; d < ms.size(); ++d) {
          const std::int64_t id = idx[3 - ms.size() + d];
          off = off * ms[d] + (ms[d] == 1 ? 0 : id);
        }
        const bool masked = mv[static_cast<std::size_t>(off)] != 0.0;
        want.push_back(masked ? mcase().value : xv[static_cast<std::size_t>((i * 3 + j) * 4 + k)]);
      }
  expect_values(masked_fill(Variable(x), m, mcase().value).data(), {2, 3, 4}, want);
}

TEST_P(MaskedFillTest, Gradcheck) {
  const Tensor m = mask();
  const double value = mcase().value;
  expect_gradcheck([m, value](const std::vector<Variable>& v) { return masked_fill(v[0], m, value); },
                   {input()});
}

TEST_P(MaskedFillTest, GradcheckFanOut) {
  // f(x) = masked_fill(x) * x: filled elements still get x's gradient through mul.
  const Tensor m = mask();
  const double value = mcase().value;
  expect_gradcheck(
      [m, value](const std::vector<Variable>& v) { return mul(masked_fill(v[0], m, value), v[0]); },
      {input()});
}

TEST_P(MaskedFillTest, FilledElementsGetNoGradient) {
  Variable x(input(), true);
  const Tensor filled_where = masked_fill(Variable(Tensor::zeros({2, 3, 4}, DType::float64)), mask(), 1.0).data();
  sum(masked_fill(x, mask(), mcase().value)).backward();
  std::vector<double> want;
  for (double f : filled_where.to_vector()) want.push_back(1.0 - f);
  expect_values(x.grad(), {2, 3, 4}, want);
}

// e.g. "mask_3x4_fill_m5_narrowed"
std::string mask_param_name(const ::testing::TestParamInfo<MaskParam>& info) {
  return std::string(std::get<0>(info.param).name) + "_" + layout_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, MaskedFillTest,
    ::testing::Combine(::testing::ValuesIn(kMaskCases),
                       ::testing::Values(Layout::contiguous, Layout::transposed, Layout::narrowed)),
    mask_param_name);

TEST(MaskedFill, NonContiguousMask) {
  // A transposed mask view is read with its own strides.
  const Variable x(Tensor::from_values(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::float64));
  const Tensor m = bools({1, 0, 0, 1, 0, 0}, {3, 2}).transpose(0, 1);  // [[1, 0, 0], [0, 1, 0]]
  expect_values(masked_fill(x, m, -7.0).data(), {2, 3}, {-7, 2, 3, 4, -7, 6});
}

TEST(MaskedFill, ShapeAndDtypeErrors) {
  const Variable x(Tensor::zeros({3, 4}, DType::float64));
  expect_invalid([&] { masked_fill(x, pattern_mask({4, 3}), 0.0); }, {"masked_fill", "[3, 4]", "[4, 3]"});
  // Broadcastable, but only by growing x: the output must keep x's shape.
  expect_invalid([&] { masked_fill(x, pattern_mask({2, 3, 4}), 0.0); },
                 {"masked_fill", "[3, 4]", "[2, 3, 4]"});
  expect_invalid([&] { masked_fill(x, Tensor::zeros({3, 4}, DType::float64), 0.0); },
                 {"masked_fill", "bool", "float64"});
}

// ---------------------------------------------------------------- masked softmax

TEST(MaskedSoftmax, CausalByHand) {
  // scores [3, 3]; causal rows keep keys j <= i:
  //   row 0: [0.5]            -> [1, 0, 0]
  //   row 1: [0, ln 3]        -> [1/4, 3/4, 0]
  //   row 2: [ln 2, 0, ln 5]  -> [2/8, 1/8, 5/8]
  const Variable s(Tensor::from_values(
      std::vector<double>{0.5, 7.0, -3.0, 0.0, std::log(3.0), 9.0, std::log(2.0), 0.0, std::log(5.0)},
      {3, 3}, DType::float64));
  const Variable filled = masked_fill(s, logical_not(causal_mask(3, 3)), -kInf);
  expect_values(filled.data(), {3, 3}, {0.5, -kInf, -kInf, 0.0, std::log(3.0), -kInf, std::log(2.0), 0.0,
                                        std::log(5.0)});
  expect_values(softmax(filled, -1).data(), {3, 3}, {1, 0, 0, 0.25, 0.75, 0, 0.25, 0.125, 0.625});
}

TEST(MaskedSoftmax, RectangularCausal) {
  // Tq = 2, Tk = 3, top-left aligned: row 0 sees key 0, row 1 keys 0 and 1.
  const Variable s(Tensor::from_values(std::vector<double>{4.0, 1.0, 2.0, 0.0, std::log(3.0), 5.0}, {2, 3},
                                       DType::float64));
  const Variable p = softmax(masked_fill(s, logical_not(causal_mask(2, 3)), -kInf), -1);
  expect_values(p.data(), {2, 3}, {1, 0, 0, 0.25, 0.75, 0});
}

// The fused op's causal shift equals the same mask given as a tensor, rows
// with no key included (zeros, zero gradient), for both alignments' shifts.
TEST(MaskedSoftmax, CausalShiftEqualsItsMaskTensor) {
  for (const auto& [tq, tk] : {std::pair<std::int64_t, std::int64_t>{2, 5}, {5, 3}, {1, 7}, {4, 4}}) {
    SCOPED_TRACE(std::to_string(tq) + " x " + std::to_string(tk));
    const std::int64_t shift = tk - tq;
    const Tensor x = make({2, tq, tk}, Layout::contiguous, 8);
    const Tensor r = make({2, tq, tk}, Layout::contiguous, 9);
    Variable a(x, true), b(x, true);
    const Variable pa = masked_softmax(a, 0.7, Tensor(), true, shift);
    const Variable pb = masked_softmax(b, 0.7, causal_mask(tq, tk, shift), false);
    sum(mul(pa, Variable(r))).backward();
    sum(mul(pb, Variable(r))).backward();
    EXPECT_EQ(pa.data().to_vector(), pb.data().to_vector());
    EXPECT_EQ(a.grad().to_vector(), b.grad().to_vector());
    for (std::int64_t i = 0; i < std::max<std::int64_t>(0, -shift); ++i)  // empty rows
      for (std::int64_t j = 0; j < tk; ++j) {
        EXPECT_EQ(pa.data().at({1, i, j}), 0.0);
        EXPECT_EQ(a.grad().at({1, i, j}), 0.0);
      }
    expect_gradcheck(
        [shift](const std::vector<Variable>& v) { return masked_softmax(v[0], 0.7, Tensor(), true, shift); },
        {x});
  }
}

class MaskedSoftmaxLayout : public ::testing::TestWithParam<Layout> {};

TEST_P(MaskedSoftmaxLayout, GradcheckThroughMinusInf) {
  // [B, Tq, Tk] = [2, 3, 5] scores; masked keys get exactly zero gradient.
  const Tensor x = make({2, 3, 5}, GetParam(), 4);
  const Tensor keep_out = logical_not(causal_mask(3, 5));
  expect_gradcheck(
      [keep_out](const std::vector<Variable>& v) { return softmax(masked_fill(v[0], keep_out, -kInf), -1); },
      {x});
  // fan-out: the scores also feed a mul
  expect_gradcheck(
      [keep_out](const std::vector<Variable>& v) {
        return mul(softmax(masked_fill(v[0], keep_out, -kInf), -1), v[0]);
      },
      {x});
}

TEST_P(MaskedSoftmaxLayout, MaskedKeysGetZeroGradient) {
  Variable x(make({2, 3, 5}, GetParam(), 5), true);
  const Tensor r = make({2, 3, 5}, Layout::contiguous, 6);
  sum(mul(softmax(masked_fill(x, logical_not(causal_mask(3, 5)), -kInf), -1), Variable(r))).backward();
  const Tensor mask = causal_mask(3, 5);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t j = 0; j < 5; ++j) {
        if (mask.at({i, j}) == 0.0) {
          EXPECT_EQ(x.grad().at({b, i, j}), 0.0) << b << " " << i << " " << j;
        } else if (i > 0) {
          EXPECT_NE(x.grad().at({b, i, j}), 0.0) << b << " " << i << " " << j;  // rows with one key are constant
        }
      }
}

// The attention core's graph keeps the weights P, not the scores S = q k^T:
// masked_softmax's backward reads only its output. So after the forward only
// P and the output are alive, and the backward's peak is three [T, T] buffers
// (P, dP, dS) plus [T, d]-sized ones, not four.
TEST(MaskedSoftmax, AttentionGraphKeepsWeightsNotScores) {
  constexpr std::int64_t h = 2, t = 64, d = 8;
  constexpr std::size_t tt = h * t * t * sizeof(double), td = h * t * d * sizeof(double);
  Generator gen(7);
  Variable q(randn({1, h, t, d}, DType::float64, gen), true);
  Variable k(randn({1, h, t, d}, DType::float64, gen), true);
  Variable v(randn({1, h, t, d}, DType::float64, gen), true);
  const Tensor r = randn({1, h, t, d}, DType::float64, gen);
  const std::size_t base = memory_stats().current_bytes;
  Variable out = matmul(masked_softmax(matmul(q, transpose(k, -2, -1)), 0.125, Tensor(), true), v);
  EXPECT_EQ(memory_stats().current_bytes - base, tt + td);  // P and out
  reset_peak_memory();
  out.backward(r);
  const std::size_t peak = memory_stats().peak_bytes - base;
  EXPECT_GE(peak, 3 * tt);            // P, dP and dS at masked_softmax's backward
  EXPECT_LE(peak, 3 * tt + 4 * td);   // ... and only [T, d] buffers besides (out, dv, dq, dk)
  // Gradients are right too: against the same graph built from plain ops.
  Variable q2(q.data(), true), k2(k.data(), true), v2(v.data(), true);
  matmul(softmax(masked_fill(scale(matmul(q2, transpose(k2, -2, -1)), 0.125),
                             logical_not(causal_mask(t, t)), -kInf), -1), v2)
      .backward(r);
  for (const auto& [a, b] : {std::pair{&q, &q2}, {&k, &k2}, {&v, &v2}}) {
    const std::vector<double> ga = a->grad().to_vector(), gb = b->grad().to_vector();
    for (std::size_t i = 0; i < ga.size(); ++i) ASSERT_NEAR(ga[i], gb[i], 1e-12) << i;
  }
}

std::string layout_param_name(const ::testing::TestParamInfo<Layout>& info) { return layout_name(info.param); }

INSTANTIATE_TEST_SUITE_P(Sweep, MaskedSoftmaxLayout,
                         ::testing::Values(Layout::contiguous, Layout::transposed, Layout::narrowed),
                         layout_param_name);

// ---------------------------------------------------------------- masked softmax: the fused op

// masked_softmax must give exactly what the ops it replaces give.

// About 70% attended, element 0 masked.
Tensor random_mask(const Shape& shape, std::uint64_t seed) {
  Generator gen(seed);
  Tensor m = Tensor::empty(shape, DType::boolean);
  for (std::int64_t i = 0; i < m.numel(); ++i) m.set_flat(i, gen.uniform() < 0.7);
  if (m.numel() > 0) m.set_flat(0, 0.0);
  return m;
}

// softmax(masked_fill(scale(x), !attend, -inf)) from the separate ops, as attention_core did.
Variable composed(const Variable& x, double s, const Tensor& attend) {
  Variable scores = scale(x, s);
  if (attend.defined()) scores = masked_fill(scores, logical_not(attend), -kInf);
  return softmax(scores, -1);
}

struct MaskedSoftmaxCase {
  Shape shape;
  bool causal;
  bool mask;
};

class MaskedSoftmaxShapes : public ::testing::TestWithParam<MaskedSoftmaxCase> {};

TEST_P(MaskedSoftmaxShapes, SameValuesAndGradientsAsTheComposedOps) {
  const MaskedSoftmaxCase c = GetParam();
  for (DType dtype : {DType::float64, DType::float32}) {
    Generator gen(3);
    const Tensor x0 = randn(c.shape, dtype, gen);
    const Tensor r = randn(c.shape, dtype, gen);
    const std::int64_t tq = c.shape[c.shape.size() - 2], tk = c.shape.back();
    Tensor attend = c.mask ? random_mask({tq, tk}, 5) : Tensor();
    AttentionSpec spec;
    spec.causal = c.causal;
    spec.mask = attend;
    const Tensor combined = attention_mask(spec, tq, tk);

    Variable xa(x0, true), xb(x0, true);
    const Variable fused = masked_softmax(xa, 0.37, attend, c.causal);
    const Variable ref = composed(xb, 0.37, combined);
    sum(mul(fused, Variable(r))).backward();
    sum(mul(ref, Variable(r))).backward();
    const auto fv = fused.data().to_vector(), rv = ref.data().to_vector();
    const auto fg = xa.grad().to_vector(), rg = xb.grad().to_vector();
    for (std::size_t i = 0; i < fv.size(); ++i) {
      EXPECT_EQ(fv[i], rv[i]) << "value " << i;  // bit for bit
      EXPECT_NEAR(fg[i], rg[i], 1e-12 + 1e-6 * std::abs(rg[i])) << "grad " << i;
    }
  }
}

TEST_P(MaskedSoftmaxShapes, GradcheckFloat64) {
  const MaskedSoftmaxCase c = GetParam();
  Generator gen(4);
  const std::int64_t tq = c.shape[c.shape.size() - 2], tk = c.shape.back();
  const Tensor attend = c.mask ? random_mask({tq, tk}, 6) : Tensor();
  const auto r = gradcheck(
      [&](const std::vector<Variable>& v) { return masked_softmax(v[0], 0.8, attend, c.causal); },
      {randn(c.shape, DType::float64, gen)});
  EXPECT_TRUE(r.ok) << r.message;
}

INSTANTIATE_TEST_SUITE_P(Shapes, MaskedSoftmaxShapes,
                         ::testing::Values(MaskedSoftmaxCase{{2, 3, 5, 5}, true, false},
                                           MaskedSoftmaxCase{{2, 3, 5, 5}, false, false},
                                           MaskedSoftmaxCase{{2, 4, 7}, true, true},
                                           MaskedSoftmaxCase{{3, 5, 7}, false, true},
                                           MaskedSoftmaxCase{{1, 2, 9, 4}, true, false},
                                           MaskedSoftmaxCase{{2, 40, 33}, true, true}),
                         [](const auto& info) {
                           std::string name;
                           for (auto s : info.param.shape) name += std::to_string(s) + "x";
                           name.pop_back();
                           return name + (info.param.causal ? "_causal" : "_full") +
                                  (info.param.mask ? "_mask" : "");
                         });

TEST(MaskedSoftmax, FullyMaskedRowGivesZeros) {
  // Tq = 2, Tk = 3, the mask hides every key of row 0.
  const Tensor attend = Tensor::from_values(std::vector<double>{0, 0, 0, 1, 0, 1}, {2, 3}, DType::boolean);
  Variable x(Tensor::from_values(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::float64), true);
  const Variable y = masked_softmax(x, 1.0, attend, false);
  sum(y).backward();
  EXPECT_EQ(y.data().at({0, 0}), 0.0);
  EXPECT_EQ(y.data().at({0, 2}), 0.0);
  EXPECT_EQ(y.data().at({1, 1}), 0.0);
  EXPECT_NEAR(y.data().at({1, 0}) + y.data().at({1, 2}), 1.0, 1e-15);
  for (double g : x.grad().to_vector()) EXPECT_TRUE(std::isfinite(g));
}

TEST(MaskedSoftmax, RejectsBadMasks) {
  Variable x(Tensor::zeros({2, 3}, DType::float64));
  EXPECT_THROW(masked_softmax(x, 1.0, Tensor::zeros({2, 3}, DType::float64), false), std::invalid_argument);
  EXPECT_THROW(masked_softmax(x, 1.0, Tensor::zeros({3, 2}, DType::boolean), false), std::invalid_argument);
}

}  // namespace

}  // namespace test_ops_softmax_mask
