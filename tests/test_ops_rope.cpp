// The RoPE op: hand-worked values, two independent formulations (Meta's
// complex multiply for interleaved pairs, HF's rotate_half for half pairs),
// float64 gradcheck for both pairings, partial rotary and gapped / reversed
// positions, bitwise pass-through of the dims past r, the relative property,
// the positions broadcast rule, float64 tables for float32 inputs, errors, and
// in attention the interleaved <-> half equivalence under HF's row permutation.
//
// Shape legend: B batch, H heads, T sequence, d width of the last dim,
// r rotary width, p_t the position of token t.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <complex>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "headgrad/attention.hpp"
#include "headgrad/gradcheck.hpp"
#include "headgrad/ops.hpp"
#include "headgrad/parallel.hpp"
#include "attention_run.hpp"
#include "op_test_util.hpp"

namespace test_ops_rope {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using namespace headgrad::test;

RopeSpec rope_spec(RopeStyle style, std::int64_t r = 0, double theta = 10000.0) {
  RopeSpec s;
  s.enabled = true;
  s.style = style;
  s.rotary_dim = r;
  s.theta = theta;
  return s;
}

// [B = 2, T = 5]: gapped per row, the second row not even increasing.
Tensor gapped_positions() {
  return positions_tensor({0, 3, 4, 10, 1000, 7, 2, 9, 11, 40}, {2, 5});
}

// ---------------------------------------------------------------- by hand

// x = [1, 2, 3, 4] at p = 1, theta 1e4, d = r = 4: w = [1, 1e4^(-1/2) = 0.01].
TEST(Rope, HandWorkedInterleaved) {
  const Tensor x = Tensor::from_values(std::vector<double>{1, 2, 3, 4}, {1, 4}, DType::float64);
  RopeSpec s = rope_spec(RopeStyle::interleaved);
  s.offset = 1;
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
  expect_values(rope(Variable(x), s).data(), {1, 4},
                {1 * c1 - 2 * s1, 1 * s1 + 2 * c1, 3 * c2 - 4 * s2, 3 * s2 + 4 * c2}, 1e-15);
}

// The same x under the half pairing: pairs (0, 2) at w = 1 and (1, 3) at w = 0.01.
TEST(Rope, HandWorkedHalf) {
  const Tensor x = Tensor::from_values(std::vector<double>{1, 2, 3, 4}, {1, 4}, DType::float64);
  RopeSpec s = rope_spec(RopeStyle::half);
  s.positions = positions_tensor({1}, {1});
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
  expect_values(rope(Variable(x), s).data(), {1, 4},
                {1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 1 * s1 + 3 * c1, 2 * s2 + 4 * c2}, 1e-15);
}

// Partial, d = 6, r = 2 at p = 2: only pair (0, 1) turns, by 2 rad (w_0 = 1).
TEST(Rope, HandWorkedPartial) {
  const Tensor x =
      Tensor::from_values(std::vector<double>{1, 2, 3, 4, 5, 6}, {1, 6}, DType::float64);
  RopeSpec s = rope_spec(RopeStyle::half, 2);
  s.offset = 2;
  const double c = std::cos(2.0), sn = std::sin(2.0);
  expect_values(rope(Variable(x), s).data(), {1, 6}, {1 * c - 2 * sn, 1 * sn + 2 * c, 3, 4, 5, 6},
                1e-15);
}

// ---------------------------------------------------------------- two other formulations

// Meta Llama's form: pairs (2k, 2k+1) as complex numbers times exp(i phi).
std::vector<double> meta_complex(const std::vector<double>& x, std::int64_t rows, std::int64_t t,
                                 std::int64_t d, std::int64_t r, double theta,
                                 const std::vector<double>& pos, std::int64_t rows_per_pos) {
  std::vector<double> out = x;
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t i = 0; i < t; ++i) {
      const double p = pos[static_cast<std::size_t>((n / rows_per_pos) * t + i)];
      for (std::int64_t k = 0; k < r / 2; ++k) {
        const std::size_t at = static_cast<std::size_t>((n * t + i) * d + 2 * k);
        const double freq = 1.0 / std::pow(theta, static_cast<double>(2 * k) / r);
        const std::complex<double> z =
            std::complex<double>(x[at], x[at + 1]) * std::polar(1.0, p * freq);
        out[at] = z.real();
        out[at + 1] = z.imag();
      }
    }
  return out;
}

// HF's form: x * cos + rotate_half(x) * sin over the first r dims, with
// cos/sin of [phi_0 .. phi_{r/2-1}, phi_0 .. phi_{r/2-1}].
std::vector<double> hf_rotate_half(const std::vector<double>& x, std::int64_t rows, std::int64_t t,
                                   std::int64_t d, std::int64_t r, double theta,
                                   const std::vector<double>& pos, std::int64_t rows_per_pos) {
  std::vector<double> out = x;
  const std::int64_t half = r / 2;
  for (std::int64_t n = 0; n < rows; ++n)
    for (std::int64_t i = 0; i < t; ++i) {
      const double p = pos[static_cast<std::size_t>((n / rows_per_pos) * t + i)];
      const std::size_t base = static_cast<std::size_t>((n * t + i) * d);
      for (std::int64_t e = 0; e < r; ++e) {
        const double phi = p / std::pow(theta, static_cast<double>(2 * (e % half)) / r);
        const double rotated = e < half ? -x[base + e + half] : x[base + e - half];
        out[base + e] = x[base + e] * std::cos(phi) + rotated * std::sin(phi);
      }
    }
  return out;
}

using FormParam = std::tuple<RopeStyle, std::int64_t>;  // style, r (d = 8)

class RopeForms : public ::testing::TestWithParam<FormParam> {};

// x [B=2, H=3, T=5, d=8] with gapped [B, T] positions, theta 500000 (Llama 3).
TEST_P(RopeForms, MatchesTheReferenceFormulation) {
  const auto [style, r] = GetParam();
  const Tensor x = make({2, 3, 5, 8}, Layout::transposed, 3);
  RopeSpec s = rope_spec(style, r, 500000.0);
  s.positions = gapped_positions();
  const std::vector<double> pos = s.positions.to_vector();
  const auto reference = style == RopeStyle::interleaved ? meta_complex : hf_rotate_half;
  expect_values(rope(Variable(x), s).data(), {2, 3, 5, 8},
                reference(x.to_vector(), 6, 5, 8, r, 500000.0, pos, 3), 1e-13);
}

// The angles of a (positions, rotary width, theta) are built once and kept
// (a few recent ones): a run of calls that changes one of the three at a time,
// more of them than are kept, then the first again, each against the
// reference formulation; x [1, 2, 600, 8] (1200 token vectors, split across
// two workers).
TEST(Rope, KeptAnglesFollowPositionsWidthAndTheta) {
  const int threads = num_threads();
  set_num_threads(2);
  const Tensor x = make({1, 2, 600, 8}, Layout::contiguous, 4);
  std::vector<std::int64_t> steps(600);
  for (std::int64_t t = 0; t < 600; ++t) steps[static_cast<std::size_t>(t)] = 3 * t;
  std::vector<std::int64_t> one_moved = steps;
  one_moved[599] += 1;
  struct Call {
    std::vector<std::int64_t> pos;
    std::int64_t r;
    double theta;
  };
  const std::vector<Call> calls = {{steps, 8, 10000.0}, {one_moved, 8, 10000.0}, {steps, 6, 10000.0},
                                   {steps, 8, 500000.0}, {one_moved, 6, 500000.0}, {steps, 2, 10000.0},
                                   {steps, 8, 10000.0},  {one_moved, 8, 10000.0}};
  for (const RopeStyle style : {RopeStyle::half, RopeStyle::interleaved})
    for (const Call& c : calls) {
      SCOPED_TRACE(std::string(rope_style_name(style)) + ", r " + std::to_string(c.r) + ", theta " +
                   std::to_string(c.theta) + (c.pos == steps ? "" : ", last position moved"));
      RopeSpec s = rope_spec(style, c.r, c.theta);
      s.positions = positions_tensor(c.pos, {600});
      std::vector<double> pos(c.pos.begin(), c.pos.end());
      const auto reference = style == RopeStyle::interleaved ? meta_complex : hf_rotate_half;
      expect_values(rope(Variable(x), s).data(), {1, 2, 600, 8},
                    reference(x.to_vector(), 2, 600, 8, c.r, c.theta, pos, 2), 1e-12);
    }
  set_num_threads(threads);
}

INSTANTIATE_TEST_SUITE_P(Styles, RopeForms,
                         ::testing::Combine(::testing::Values(RopeStyle::interleaved,
                                                              RopeStyle::half),
                                            ::testing::Values<std::int64_t>(8, 6, 2)),
                         [](const ::testing::TestParamInfo<FormParam>& info) {
                           return std::string(rope_style_name(std::get<0>(info.param))) + "_r" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---------------------------------------------------------------- gradcheck

enum class Positions { offset, gapped_rows, reversed_rows, reversed };
const char* positions_name(Positions p) {
  switch (p) {
    case Positions::offset: return "offset3";
    case Positions::gapped_rows: return "gapped_BT";
    case Positions::reversed_rows: return "reversed_BT";
    case Positions::reversed: return "reversed_T";
  }
  return "?";
}

using GradParam = std::tuple<RopeStyle, std::int64_t, Positions, Layout>;  // style, r, positions, layout

class RopeGradcheck : public ::testing::TestWithParam<GradParam> {};

// x [B=2, H=3, T=5, d=6]: every element of x against central differences.
TEST_P(RopeGradcheck, Float64CentralDifferences) {
  const auto [style, r, positions, layout] = GetParam();
  RopeSpec s = rope_spec(style, r);
  if (positions == Positions::offset) s.offset = 3;
  if (positions == Positions::gapped_rows) s.positions = gapped_positions();
  if (positions == Positions::reversed_rows)
    s.positions = positions_tensor({4, 3, 2, 1, 0, 1500, 1200, 9, 5, 2}, {2, 5});
  if (positions == Positions::reversed) s.positions = positions_tensor({1200, 9, 5, 2, 0}, {5});
  expect_gradcheck([&](const std::vector<Variable>& v) { return rope(v[0], s); },
                   {make({2, 3, 5, 6}, layout, 5)});
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, RopeGradcheck,
    ::testing::Combine(::testing::Values(RopeStyle::interleaved, RopeStyle::half),
                       ::testing::Values<std::int64_t>(6, 4),
                       ::testing::Values(Positions::offset, Positions::gapped_rows,
                                         Positions::reversed_rows, Positions::reversed),
                       ::testing::Values(Layout::contiguous, Layout::narrowed)),
    [](const ::testing::TestParamInfo<GradParam>& info) {
      return std::string(rope_style_name(std::get<0>(info.param))) + "_r" +
             std::to_string(std::get<1>(info.param)) + "_" +
             positions_name(std::get<2>(info.param)) + "_" + layout_name(std::get<3>(info.param));
    });

// Fan-out: x rotated twice and added to itself; gradients must accumulate.
TEST(Rope, GradcheckFanOut) {
  RopeSpec s = rope_spec(RopeStyle::half, 4);
  s.positions = gapped_positions();
  expect_gradcheck(
      [&](const std::vector<Variable>& v) { return add(rope(rope(v[0], s), s), v[0]); },
      {make({2, 5, 6}, Layout::contiguous, 6)});
}

// R^T R = I: the backward of the rotated values gives back x.
TEST(Rope, BackwardIsTheInverseRotation) {
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half}) {
    RopeSpec s = rope_spec(style, 6);
    s.positions = gapped_positions();
    const Tensor x = make({2, 5, 8}, Layout::contiguous, 7);
    Variable xv(x, true);
    const Variable y = rope(xv, s);
    y.backward(y.data());
    EXPECT_TRUE(all_close(std::string(rope_style_name(style)), xv.grad(), x, 1e-14, 1e-14));
  }
}

// ---------------------------------------------------------------- pass-through

std::uint64_t bits(double v) { return std::bit_cast<std::uint64_t>(v); }

// d = 10, r = 6: dims 6..9 of out are x's, and of dx are dy's, bit for bit.
TEST(Rope, PassThroughDimsAreBitwiseUnchanged) {
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half}) {
    SCOPED_TRACE(rope_style_name(style));
    RopeSpec s = rope_spec(style, 6);
    s.positions = gapped_positions();
    const Tensor x = make({2, 3, 5, 10}, Layout::contiguous, 8);
    const Tensor dy = make({2, 3, 5, 10}, Layout::contiguous, 9);
    Variable xv(x, true);
    const Variable y = rope(xv, s);
    y.backward(dy);
    std::int64_t rotated_changed = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      if (i % 10 >= 6) {
        ASSERT_EQ(bits(y.data().flat(i)), bits(x.flat(i))) << "out element " << i;
        ASSERT_EQ(bits(xv.grad().flat(i)), bits(dy.flat(i))) << "dx element " << i;
      } else {
        rotated_changed += y.data().flat(i) != x.flat(i);
      }
    }
    EXPECT_GT(rotated_changed, 2 * 3 * 5 * 6 - 2 * 3 * 6);  // all but the p = 0 tokens turn
  }
}

// ---------------------------------------------------------------- the relative property

// <R_m q, R_n k> = <q, R_{n-m} k>: scores depend on position differences only.
TEST(Rope, ScoresDependOnPositionDifferencesOnly) {
  const Tensor q = make({1, 8}, Layout::contiguous, 10), k = make({1, 8}, Layout::contiguous, 11);
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half})
    for (std::int64_t r : {8, 4})
      for (auto [m, n] : {std::pair<std::int64_t, std::int64_t>{3, 17}, {1000, 999}, {-5, 40}}) {
        SCOPED_TRACE(std::string(rope_style_name(style)) + " r " + std::to_string(r) + " m " +
                     std::to_string(m) + " n " + std::to_string(n));
        auto at = [&](const Tensor& x, std::int64_t p) {
          RopeSpec s = rope_spec(style, r);
          s.positions = positions_tensor({p}, {1});
          return rope(Variable(x), s).data().to_vector();
        };
        auto dot = [](const std::vector<double>& a, const std::vector<double>& b) {
          double acc = 0.0;
          for (std::size_t i = 0; i < a.size(); ++i) acc += a[i] * b[i];
          return acc;
        };
        const double lhs = dot(at(q, m), at(k, n)), rhs = dot(q.to_vector(), at(k, n - m));
        EXPECT_NEAR(lhs, rhs, 1e-12 * (1.0 + std::abs(rhs)));
        EXPECT_GT(std::abs(lhs - dot(q.to_vector(), k.to_vector())), 1e-6);  // it did rotate
      }
}

// ---------------------------------------------------------------- positions

// offset c is positions c, c+1, ...; and a [B, T] tensor is shared by every
// head of its batch row (not spread over the head axis).
TEST(Rope, OffsetEqualsExplicitPositions) {
  const Tensor x = make({3, 4, 6}, Layout::contiguous, 12);
  RopeSpec by_offset = rope_spec(RopeStyle::half), by_tensor = by_offset;
  by_offset.offset = 5;
  by_tensor.positions = positions_tensor({5, 6, 7, 8}, {4});
  EXPECT_EQ(rope(Variable(x), by_offset).data().to_vector(),
            rope(Variable(x), by_tensor).data().to_vector());
}

TEST(Rope, BatchPositionsBroadcastOverHeads) {
  const std::int64_t b = 2, h = 3, t = 5, d = 6;
  const Tensor x = make({b, h, t, d}, Layout::contiguous, 13);
  RopeSpec s = rope_spec(RopeStyle::interleaved);
  s.positions = gapped_positions();
  const Tensor all = rope(Variable(x), s).data();
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t hi = 0; hi < h; ++hi) {
      RopeSpec row = s;
      row.positions = s.positions.narrow(0, bi, 1).squeeze(0);  // [T]
      const Tensor one = rope(Variable(x.narrow(0, bi, 1).narrow(1, hi, 1)), row).data();
      EXPECT_EQ(one.to_vector(), all.narrow(0, bi, 1).narrow(1, hi, 1).to_vector())
          << "batch " << bi << " head " << hi;
    }
  // [H, T] positions on [B, H, T, d] with B != H: refused, not read as per head.
  s.positions = positions_tensor(std::vector<std::int64_t>(h * t, 1), {h, t});
  expect_invalid([&] { rope(Variable(x), s); }, {"rope", "positions [3, 5]", "[2, 3, 5, 6]"});
}

// ---------------------------------------------------------------- precision

// float32 inputs use the float64 tables: their result is the float64 result
// on the same values, rounded once. At p >= 1000 a float32 table would not be.
TEST(Rope, Float32IsTheFloat64ResultRounded) {
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half}) {
    RopeSpec s = rope_spec(style, 0, 500000.0);
    s.positions = positions_tensor({1000, 4097, 65536, 100000, 3}, {5});
    const Tensor x32 = make({2, 5, 16}, Layout::contiguous, 14).to(DType::float32);
    const Tensor got = rope(Variable(x32), s).data();
    EXPECT_EQ(got.dtype(), DType::float32);
    EXPECT_EQ(got.to_vector(),
              rope(Variable(x32.to(DType::float64)), s).data().to(DType::float32).to_vector());
  }
}

// ---------------------------------------------------------------- errors

TEST(Rope, TypedErrors) {
  const Variable x(make({2, 5, 6}, Layout::contiguous, 15));
  RopeSpec s = rope_spec(RopeStyle::interleaved, 5);
  expect_invalid([&] { rope(x, s); }, {"rope", "rotary_dim 5", "even"});
  s.rotary_dim = 8;
  expect_invalid([&] { rope(x, s); }, {"rotary_dim 8", "d = 6"});
  s.rotary_dim = -2;
  expect_invalid([&] { rope(x, s); }, {"rotary_dim -2"});
  s.rotary_dim = 0;
  s.positions = positions_tensor({0, 1, 2, 3}, {4});
  expect_invalid([&] { rope(x, s); }, {"positions [4]", "T = 5"});
  s.positions = positions_tensor(std::vector<std::int64_t>(15, 0), {3, 5});
  expect_invalid([&] { rope(x, s); }, {"positions [3, 5]", "first dim of x"});
  s.positions = Tensor::from_values(std::vector<double>{0, 1, 2.5, 3, 4}, {5}, DType::float64);
  expect_invalid([&] { rope(x, s); }, {"not an integer"});
  s.positions = positions_tensor({0, 1, 2, 3, 4}, {5});
  s.offset = 2;
  expect_invalid([&] { rope(x, s); }, {"not both"});
  s = rope_spec(RopeStyle::half, 0, -1.0);
  expect_invalid([&] { rope(x, s); }, {"theta"});
  s = rope_spec(RopeStyle::half);
  expect_invalid([&] { rope(Variable(make({6}, Layout::contiguous, 16)), s); }, {"[..., T, d]"});
}

// ---------------------------------------------------------------- the two pairings in attention

// HF's conversion permute(w, n_heads): row h*d + s*(d/2) + p of the half layout
// is row h*d + 2p + s of the interleaved one (w [heads*d, D]). By hand.
Tensor interleaved_to_half_rows(const Tensor& w, std::int64_t heads, std::int64_t d) {
  Tensor out = Tensor::empty(w.shape(), w.dtype());
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t s = 0; s < 2; ++s)
      for (std::int64_t p = 0; p < d / 2; ++p)
        out.narrow(0, h * d + s * (d / 2) + p, 1).copy_(w.narrow(0, h * d + 2 * p + s, 1));
  return out;
}

using MhaRun = test::MhaResult;

// batched_mha around attention_core, loss = sum(out * r).
MhaRun run_batched_mha(const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& wv,
                       const Tensor& wo, const Tensor& r, const AttentionSpec& spec) {
  return test::run_mha([&](const Variable& xv, const MhaWeights& w) { return batched_mha(xv, w, spec, attention_core); },
                       x, wq, wk, wv, wo, r);
}

// Interleaved RoPE with (Wq, Wk) is half RoPE with Wq permuted per query head
// (H) and Wk per kv head (Hkv): the same out and gradients, dWq and dWk
// permuted alike. Without the permutation the two pairings disagree.
TEST(RopeInAttention, InterleavedEqualsHalfUnderTheHfPermutation) {
  const std::int64_t b = 2, t = 7, dm = 32, h = 12, hkv = 3, d = 10;
  Generator gen(20);
  const Tensor x = randn({b, t, dm}, DType::float64, gen);
  const Tensor wq = randn({h * d, dm}, DType::float64, gen, 0.5);
  const Tensor wk = randn({hkv * d, dm}, DType::float64, gen, 0.5);
  const Tensor wv = randn({hkv * d, dm}, DType::float64, gen, 0.5);
  const Tensor wo = randn({dm, h * d}, DType::float64, gen, 0.5);
  const Tensor r = randn({b, t, dm}, DType::float64, gen);
  AttentionSpec spec = causal_mha_spec(dm, h, hkv, d);
  spec.rope = rope_spec(RopeStyle::interleaved);
  spec.rope.positions = positions_tensor({0, 3, 4, 10, 1000, 7, 2, 9, 11, 40, 41, 60, 5, 1}, {b, t});
  const MhaRun inter = run_batched_mha(x, wq, wk, wv, wo, r, spec);
  AttentionSpec half = spec;
  half.rope.style = RopeStyle::half;
  const Tensor wq_half = interleaved_to_half_rows(wq, h, d), wk_half = interleaved_to_half_rows(wk, hkv, d);
  const MhaRun got = run_batched_mha(x, wq_half, wk_half, wv, wo, r, half);
  EXPECT_TRUE(all_close("out", got.out, inter.out, 1e-12, 1e-12));
  EXPECT_TRUE(all_close("dX", got.dx, inter.dx, 1e-12, 1e-12));
  EXPECT_TRUE(all_close("dWq", got.dwq, interleaved_to_half_rows(inter.dwq, h, d), 1e-12, 1e-12));
  EXPECT_TRUE(all_close("dWk", got.dwk, interleaved_to_half_rows(inter.dwk, hkv, d), 1e-12, 1e-12));
  EXPECT_TRUE(all_close("dWv", got.dwv, inter.dwv, 1e-12, 1e-12));
  EXPECT_TRUE(all_close("dWo", got.dwo, inter.dwo, 1e-12, 1e-12));
  // the trap itself: the other pairing on the same weights
  EXPECT_FALSE(all_close("out", run_batched_mha(x, wq, wk, wv, wo, r, half).out, inter.out, 1e-6, 1e-6));
}

}  // namespace

}  // namespace test_ops_rope
