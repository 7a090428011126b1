// The grouped kv head helpers of the attention blocks
// (core/src/attention/blocks.cpp): expand_kv_heads, kv_group, mha_dims.
//
// Shape legend: B batch, H query heads, Hkv kv heads, G = H / Hkv, T
// sequence, d head width, D model width.
#include <gtest/gtest.h>

#include <vector>

#include "headgrad/attention.hpp"
#include "headgrad/ops.hpp"
#include "op_test_util.hpp"

namespace test_attention_blocks {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using namespace headgrad::test;

// kv [1, Hkv=2, T=1, d=2] widened for G = 3: heads a a a b b b (repeat_interleave),
// not a b a b a b (tile); the backward sums each group's gradients.
TEST(ExpandKvHeads, RepeatsEachHeadForItsGroup) {
  const Tensor kv = Tensor::from_values(std::vector<double>{1, 2, 3, 4}, {1, 2, 1, 2}, DType::float64);
  Variable v(kv, true);
  const Variable wide = expand_kv_heads(v, 3);
  expect_exact_values(wide.data(), {1, 6, 1, 2}, {1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4});
  wide.backward(Tensor::from_values(std::vector<double>{1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60},
                                    {1, 6, 1, 2}, DType::float64));
  expect_exact_values(v.grad(), {1, 2, 1, 2}, {6, 60, 15, 150});
  expect_gradcheck([](const std::vector<Variable>& in) { return expand_kv_heads(in[0], 2); },
                   {make({2, 3, 4, 2}, Layout::transposed, 3)});
}

TEST(KvGroup, GroupSizeAndErrors) {
  auto var = [](const Shape& s) { return Variable(Tensor::zeros(s, DType::float64)); };
  EXPECT_EQ(kv_group(var({2, 12, 5, 4}), var({2, 3, 7, 4}), var({2, 3, 7, 6}), "t"), 4);
  EXPECT_EQ(kv_group(var({2, 12, 5, 4}), var({2, 12, 7, 4}), var({2, 12, 7, 4}), "t"), 1);
  EXPECT_EQ(kv_group(var({5, 4}), var({7, 4}), var({7, 4}), "t"), 1);
  expect_invalid([&] { kv_group(var({2, 12, 5, 4}), var({2, 5, 7, 4}), var({2, 5, 7, 4}), "who"); },
                 {"who", "q [2, 12, 5, 4]", "k [2, 5, 7, 4]", "H = 12"});
  expect_invalid([&] { kv_group(var({2, 12, 5, 4}), var({2, 3, 7, 4}), var({2, 4, 7, 4}), "who"); },
                 {"v [2, 4, 7, 4]"});
  EXPECT_EQ(kv_group(var({2, 12, 5, 4}), var({1, 1, 7, 4}), var({2, 1, 7, 4}), "t"), 12);
}

// mha_dims reads d from the spec when given (D need not be H * d) and names
// every weight that does not fit.
TEST(MhaDims, HeadWidthApartFromDAndWeightShapes) {
  auto var = [](const Shape& s) { return Variable(Tensor::zeros(s, DType::float64)); };
  AttentionSpec spec;
  spec.num_heads = 12;
  spec.num_kv_heads = 3;
  spec.head_width = 10;
  MhaWeights w{var({120, 32}), var({30, 32}), var({30, 32}), var({32, 120})};
  const MhaDims m = mha_dims(var({2, 7, 32}), w, spec, "t");
  EXPECT_EQ(m.d_model, 32);
  EXPECT_EQ(m.heads, 12);
  EXPECT_EQ(m.kv_heads, 3);
  EXPECT_EQ(m.head_dim, 10);
  EXPECT_EQ(m.group, 4);
  w.wv = var({120, 32});
  expect_invalid([&] { mha_dims(var({2, 7, 32}), w, spec, "who"); },
                 {"who", "wv is [120, 32]", "expected [30, 32]", "Hkv 3", "d 10"});
  spec.head_width = 0;
  expect_invalid([&] { mha_dims(var({2, 7, 32}), w, spec, "who"); }, {"D = 32", "H = 12"});
  spec.num_kv_heads = 8;
  expect_invalid([&] { mha_dims(var({2, 7, 32}), w, spec, "who"); },
                 {"num_kv_heads 8", "num_heads 12"});
}

}  // namespace

}  // namespace test_attention_blocks
