// Comparison figures, element naming in each tensor's terms, the shared
// inputs' recipe and memory layouts. No plugin is loaded here.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "judge/compare.hpp"
#include "case/inputs.hpp"

namespace test_runner_compare {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using namespace headgrad::runner;

Tensor values(std::vector<double> v, Shape shape) { return Tensor::from_values(v, shape, DType::float64); }

// ---- naming an element ----

TEST(DescribeIndex, MhaActivationsNameBatchPositionHeadAndChannel) {
  // [B, T, D] = [2, 3, 8] with H = 2: d = 4, column 6 is head 1, channel 2
  const Shape shape = {2, 3, 8};
  EXPECT_EQ(describe_index(Level::mha, "out", shape, Shape{1, 2, 6}, 2), "b=1, t=2, head=1, ch=2");
  EXPECT_EQ(describe_index(Level::mha, "dx", shape, Shape{0, 0, 3}, 2), "b=0, t=0, head=0, ch=3");
}

TEST(DescribeIndex, WeightsNameTheHeadBlock) {
  const Shape shape = {12, 12};  // D = 12, H = 3, d = 4
  // dWq/dWk/dWv: head h owns rows [h*d, (h+1)*d)
  EXPECT_EQ(describe_index(Level::mha, "dwq", shape, Shape{9, 5}, 3), "head=2, row=1, in=5");
  EXPECT_EQ(describe_index(Level::mha, "dwk", shape, Shape{4, 0}, 3), "head=1, row=0, in=0");
  EXPECT_EQ(describe_index(Level::mha, "dwv", shape, Shape{3, 11}, 3), "head=0, row=3, in=11");
  // dWo: head h owns columns [h*d, (h+1)*d)
  EXPECT_EQ(describe_index(Level::mha, "dwo", shape, Shape{7, 9}, 3), "out=7, head=2, col=1");
}

TEST(DescribeIndex, GroupedKvWeightsNameTheirOwnHeadBlocks) {
  // D = 24, H = 12, Hkv = 3, d = 10: Wq [120, 24], Wk [30, 24], Wo [24, 120]
  EXPECT_EQ(describe_index(Level::mha, "dwq", {120, 24}, Shape{57, 23}, 12), "head=5, row=7, in=23");
  EXPECT_EQ(describe_index(Level::mha, "dwk", {30, 24}, Shape{25, 1}, 3), "head=2, row=5, in=1");
  EXPECT_EQ(describe_index(Level::mha, "dwo", {24, 120}, Shape{3, 119}, 12), "out=3, head=11, col=9");
}

TEST(DescribeIndex, CoreNamesQueryOrKeyPositions) {
  const Shape q = {2, 3, 5, 4}, k = {2, 3, 7, 4};
  EXPECT_EQ(describe_index(Level::core, "out", q, Shape{1, 2, 4, 3}, 0), "b=1, h=2, q=4, ch=3");
  EXPECT_EQ(describe_index(Level::core, "dq", q, Shape{0, 1, 2, 0}, 0), "b=0, h=1, q=2, ch=0");
  EXPECT_EQ(describe_index(Level::core, "dk", k, Shape{0, 0, 6, 1}, 0), "b=0, h=0, k=6, ch=1");
  EXPECT_EQ(describe_index(Level::core, "dv", k, Shape{1, 0, 3, 2}, 0), "b=1, h=0, k=3, ch=2");
  EXPECT_EQ(describe_index(Level::core, "out", {3, 5, 4}, Shape{2, 1, 0}, 0), "i0=2, q=1, ch=0");
  EXPECT_EQ(shape_str(Shape{1, 2, 3}), "[1, 2, 3]");
}

// ---- figures ----

TEST(CompareTensor, IdenticalTensorsAreClose) {
  const Tensor a = values({1, 2, 3, 4}, {2, 2});
  const TensorComparison c = compare_tensor("dwo", a, a.clone(), {}, Level::mha, 1);
  EXPECT_TRUE(c.allclose);
  EXPECT_EQ(c.max_abs, 0);
  EXPECT_EQ(c.max_rel, 0);
  EXPECT_EQ(c.mismatched, 0);
  EXPECT_EQ(c.numel, 4);
  EXPECT_TRUE(c.problem.empty());
}

TEST(CompareTensor, FindsTheWorstElementAndCountsMismatches) {
  // [B, T, D] = [1, 2, 4], H = 2
  const Tensor ref = values({1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 4});
  Tensor got = ref.clone();
  got.set({0, 1, 3}, 8.5);   // |Δ| 0.5 at b=0, t=1, head=1, ch=1
  got.set({0, 0, 0}, 1.01);  // |Δ| 0.01, rel 0.01
  const TensorComparison c = compare_tensor("out", got, ref, {1e-8, 1e-6}, Level::mha, 2);
  EXPECT_FALSE(c.allclose);
  EXPECT_EQ(c.mismatched, 2);
  EXPECT_NEAR(c.max_abs, 0.5, 1e-12);
  EXPECT_NEAR(c.max_rel, 0.5 / 8, 1e-12);
  ASSERT_TRUE(c.worst);
  EXPECT_EQ(c.worst->index, (Shape{0, 1, 3}));
  EXPECT_EQ(c.worst->where, "b=0, t=1, head=1, ch=1");
  EXPECT_DOUBLE_EQ(c.worst->lhs, 8.5);
  EXPECT_DOUBLE_EQ(c.worst->rhs, 8);
}

TEST(CompareTensor, AllcloseUsesTheReferenceSidesMagnitude) {
  // |a - b| <= atol + rtol * |b|: b is the second (reference) side
  const Tensor b = values({100}, {1});
  const Tensor a = values({101}, {1});
  EXPECT_TRUE(compare_tensor("out", a, b, {0, 0.01}, Level::core, 0).allclose);    // 1 <= 0.01 * 100
  EXPECT_FALSE(compare_tensor("out", b, a, {0, 0.0099}, Level::core, 0).allclose);  // 1 > 0.0099 * 100
  EXPECT_TRUE(compare_tensor("out", a, b, {1, 0}, Level::core, 0).allclose);        // exactly atol
}

TEST(CompareTensor, NanNeverMatchesAndZeroReferenceGivesInfiniteRelativeError) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const TensorComparison c = compare_tensor("out", values({nan, 1}, {2}), values({nan, 1}, {2}), {}, Level::core, 0);
  EXPECT_FALSE(c.allclose);
  EXPECT_TRUE(std::isnan(c.max_abs));
  EXPECT_EQ(c.worst->index, (Shape{0}));
  const TensorComparison z = compare_tensor("out", values({1e-3}, {1}), values({0}, {1}), {}, Level::core, 0);
  EXPECT_TRUE(std::isinf(z.max_rel));
  EXPECT_TRUE(compare_tensor("out", values({inf}, {1}), values({inf}, {1}), {}, Level::core, 0).allclose);
  EXPECT_FALSE(compare_tensor("out", values({1}, {1}), values({inf}, {1}), {0, 1}, Level::core, 0).allclose);
}

TEST(CompareTensor, ShapeMismatchAndMissingTensorsAreProblems) {
  const TensorComparison s = compare_tensor("out", values({1, 2}, {2}), values({1, 2}, {1, 2}), {}, Level::core, 0);
  EXPECT_FALSE(s.allclose);
  EXPECT_EQ(s.problem, "shape [2] vs [1, 2]");
  const TensorComparison m = compare_tensor("dx", Tensor(), values({1}, {1}), {}, Level::mha, 1);
  EXPECT_FALSE(m.allclose);
  EXPECT_EQ(m.problem, "missing");
}

TEST(CompareSets, UsesPerTensorTolerancesAndNamesMissingSides) {
  CaseSpec c;
  c.level = Level::mha;
  c.dims = {1, 1, 2, 1, 0, 0, 0};
  c.check = {"out", "dx"};
  c.tensor_tolerance["dx"] = {0.5, 0};
  const TensorSet lhs = {{"out", values({1, 2}, {1, 1, 2})}, {"dx", values({1, 2.4}, {1, 1, 2})}};
  const TensorSet rhs = {{"out", values({1, 2}, {1, 1, 2})}, {"dx", values({1, 2}, {1, 1, 2})}};
  const auto cmp = compare_sets(lhs, rhs, c, "A", "B");
  ASSERT_EQ(cmp.size(), 2u);
  EXPECT_TRUE(cmp[1].allclose);  // 0.4 <= atol 0.5 for dx only
  const auto missing = compare_sets({{"out", values({1, 2}, {1, 1, 2})}}, rhs, c, "A", "B");
  EXPECT_EQ(missing[1].problem, "A gives no dx (the graph does not reach that input)");
}

TEST(FirstNonFinite, NamesTheFirstBadElement) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto bad = first_non_finite(values({0, 1, nan, 3}, {1, 1, 4}), Level::mha, "out", 2);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->index, (Shape{0, 0, 2}));
  EXPECT_EQ(bad->where, "b=0, t=0, head=1, ch=0");
  EXPECT_FALSE(first_non_finite(values({0, 1}, {2}), Level::core, "out", 0));
}

// ---- layouts and the inputs' recipe ----

TEST(Layouts, HoldTheSameValuesInADifferentLayout) {
  Generator gen(1);
  const Tensor x = randn({2, 3, 5}, DType::float64, gen);
  const Tensor t = with_layout(x, InputLayout::transposed);
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.shape(), x.shape());
  EXPECT_EQ(t.strides(), (Shape{15, 1, 3}));  // stored as [B, D, T]
  EXPECT_EQ(t.to_vector(), x.to_vector());
  const Tensor s = with_layout(x, InputLayout::sliced);
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_NE(s.offset(), 0);
  EXPECT_EQ(s.to_vector(), x.to_vector());
  // the rest of the wider storage is NaN: a plugin reading outside its view sees it
  EXPECT_TRUE(std::isnan(static_cast<const double*>(s.storage()->data())[0]));
  EXPECT_TRUE(with_layout(x, InputLayout::contiguous).shares_storage(x));
}

CaseSpec mha_case(InputLayout layout) {
  CaseSpec c;
  c.name = "c";
  c.compare = {"a", "b"};
  c.dims = {2, 3, 8, 2, 0, 0, 0};
  c.seed = 5;
  c.layout = layout;
  return c;
}

TEST(SeededInputs, SeededRecipeIsTheSameInEveryLayout) {
  const CaseInputs a = make_inputs(mha_case(InputLayout::contiguous));
  const CaseInputs b = make_inputs(mha_case(InputLayout::transposed));
  const CaseInputs c = make_inputs(mha_case(InputLayout::sliced));
  EXPECT_EQ(a.x.shape(), (Shape{2, 3, 8}));
  EXPECT_EQ(a.wq.shape(), (Shape{8, 8}));
  EXPECT_EQ(a.r.shape(), (Shape{2, 3, 8}));
  EXPECT_EQ(a.x.to_vector(), b.x.to_vector());
  EXPECT_EQ(a.x.to_vector(), c.x.to_vector());
  EXPECT_EQ(a.wo.to_vector(), c.wo.to_vector());
  EXPECT_FALSE(b.x.is_contiguous());
  // the recipe: x first, then the weights scaled to N(0, 1/D); a fixed stream
  Generator gen(5);
  EXPECT_EQ(a.x.to_vector(), randn({2, 3, 8}, DType::float64, gen).to_vector());
  EXPECT_EQ(a.wq.to_vector(), randn({8, 8}, DType::float64, gen, 1 / std::sqrt(8.0)).to_vector());
  // another seed, other values
  CaseSpec other = mha_case(InputLayout::contiguous);
  other.seed = 6;
  EXPECT_NE(make_inputs(other).x.to_vector(), a.x.to_vector());
  const AttentionSpec spec = attention_spec(mha_case(InputLayout::contiguous), a);
  EXPECT_EQ(spec.num_heads, 2);
  EXPECT_EQ(spec.d_model, 8);
  EXPECT_EQ(spec.dropout_p, 0.0);
  EXPECT_FALSE(spec.causal);
  CaseSpec bottom = mha_case(InputLayout::contiguous);
  bottom.causal = true;
  bottom.causal_alignment = CausalAlignment::bottom_right;
  const AttentionSpec bspec = attention_spec(bottom, a);
  EXPECT_TRUE(bspec.causal);
  EXPECT_EQ(bspec.causal_alignment, CausalAlignment::bottom_right);
  EXPECT_EQ(bspec.causal_shift(1, 7), 6);
}

TEST(SeededInputs, CoreLevelShapes) {
  CaseSpec c;
  c.name = "core";
  c.level = Level::core;
  c.compare = {"a", "b"};
  c.dims.B = 2;
  c.dims.H = 3;
  c.dims.Tq = 5;
  c.dims.Tk = 7;
  c.dims.d = 4;
  c.layout = InputLayout::transposed;
  const CaseInputs in = make_inputs(c);
  EXPECT_EQ(in.q.shape(), (Shape{2, 3, 5, 4}));
  EXPECT_EQ(in.k.shape(), (Shape{2, 3, 7, 4}));
  EXPECT_EQ(in.v.shape(), (Shape{2, 3, 7, 4}));
  EXPECT_EQ(in.r.shape(), (Shape{2, 3, 5, 4}));
  EXPECT_FALSE(in.mask.defined());
  EXPECT_FALSE(in.k.is_contiguous());
  const TensorSet named = input_tensors(in);
  ASSERT_EQ(named.size(), 4u);
  EXPECT_EQ(named[0].name, "q");
  EXPECT_TRUE(named[0].tensor.is_contiguous());
}

}  // namespace

}  // namespace test_runner_compare
