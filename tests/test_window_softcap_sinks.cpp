// Sliding windows, logit soft-capping and attention sinks (docs/design.md,
// "Conventions"): the engine's window mask and sink column against values
// worked out by hand, fused_sdpa's kernel against finite differences in
// float64 with small tiles (at least three tiles each way), the kernel against
// the composed core and per_head (out, dq, dk, dv and dsinks), the kernel's
// skipped tiles (keys outside every window are never read), and the three
// plugins at the MHA level with GQA and RoPE.
//
// Shape legend: B batch, H query heads, Hkv kv heads, Tq/Tk query/key lengths,
// d head width, Br x Bc one kernel tile (query rows x keys).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "headgrad/attention.hpp"
#include "headgrad/gradcheck.hpp"
#include "headgrad/loader.hpp"
#include "headgrad/ops.hpp"
#include "headgrad/plugin.hpp"
#include "attention_run.hpp"
#include "checks.hpp"
#include "kernel.hpp"
#include "real_plugins.hpp"

namespace test_window_softcap_sinks {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using headgrad::test::all_close;
using headgrad::test::all_finite;

// ---------------------------------------------------------------- inputs

struct Problem {
  Tensor q, k, v;  // [B, H, Tq, d], [B, Hkv, Tk, d], [B, Hkv, Tk, d]
  Tensor sinks;    // [H], U(-1, 3): P_sink between about 0.01 and 0.97
  AttentionSpec spec;
};

Problem problem(std::int64_t b, std::int64_t h, std::int64_t hkv, std::int64_t tq, std::int64_t tk,
                std::int64_t d, std::uint64_t seed, double q_gain = 1.0) {
  Generator gen(seed);
  Problem p;
  p.q = randn({b, h, tq, d}, DType::float64, gen, q_gain);
  p.k = randn({b, hkv, tk, d}, DType::float64, gen);
  p.v = randn({b, hkv, tk, d}, DType::float64, gen);
  p.sinks = Tensor::empty({h}, DType::float64);
  for (std::int64_t i = 0; i < h; ++i) p.sinks.set_flat(i, -1.0 + 4.0 * gen.uniform());
  p.spec.num_heads = h;
  p.spec.num_kv_heads = hkv;
  return p;
}

// out and the gradients of q, k, v and (with sinks) the sinks under loss sum(out * R).
struct Result {
  Tensor out, dq, dk, dv, dsinks;
};

using Core = std::function<Variable(const Variable&, const Variable&, const Variable&, const AttentionSpec&)>;

Result run(const Core& core, const Problem& p, bool with_sinks, std::uint64_t r_seed = 5) {
  const Variable q(p.q, true), k(p.k, true), v(p.v, true);
  AttentionSpec spec = p.spec;
  if (with_sinks) spec.sinks = Variable(p.sinks, true);
  const Variable out = core(q, k, v, spec);
  Generator gen(r_seed);
  sum(mul(out, Variable(randn(out.shape(), out.dtype(), gen)))).backward();
  return {out.data(), q.grad(), k.grad(), v.grad(), with_sinks ? spec.sinks.grad() : Tensor()};
}

void expect_same(const Result& a, const Result& b, double atol, double rtol) {
  EXPECT_TRUE(all_close("out", a.out, b.out, atol, rtol));
  EXPECT_TRUE(all_close("dq", a.dq, b.dq, atol, rtol));
  EXPECT_TRUE(all_close("dk", a.dk, b.dk, atol, rtol));
  EXPECT_TRUE(all_close("dv", a.dv, b.dv, atol, rtol));
  if (a.dsinks.defined() || b.dsinks.defined()) {
    EXPECT_TRUE(all_close("dsinks", a.dsinks, b.dsinks, atol, rtol));
  }
}

// ---------------------------------------------------------------- the engine, by hand

// A decode step (Tq 3 of Tk 11), W 4 keys ({left: 3, right: 0}), causal
// bottom_right: query i reads keys i + 5 .. i + 8, not i - 3 .. i.
TEST(WindowMask, DecodeStepSitsOnTheBottomRightDiagonal) {
  AttentionSpec spec;
  spec.causal = true;
  spec.causal_alignment = CausalAlignment::bottom_right;
  spec.window.left = 3;
  spec.window.right = 0;
  const Tensor m = attention_mask(spec, 3, 11);
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t j = 0; j < 11; ++j)
      EXPECT_EQ(m.at({i, j}) != 0.0, j >= i + 5 && j <= i + 8) << "row " << i << ", key " << j;
  // top_left: the same window on the top-left diagonal, i - 3 .. i
  spec.causal_alignment = CausalAlignment::top_left;
  const Tensor t = attention_mask(spec, 3, 11);
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t j = 0; j < 11; ++j) EXPECT_EQ(t.at({i, j}) != 0.0, j >= i - 3 && j <= i) << i << "," << j;
}

// Without causal the offset is 0 even at Tq != Tk: {right: 1} is j <= i + 1,
// {left: 1, right: 2} is i - 1 <= j <= i + 2.
TEST(WindowMask, WithoutCausalTheWindowIsAnchoredAtZero) {
  AttentionSpec spec;
  spec.causal_alignment = CausalAlignment::bottom_right;  // read only under causal
  spec.window.right = 1;
  const Tensor r = attention_mask(spec, 4, 7);
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 7; ++j) EXPECT_EQ(r.at({i, j}) != 0.0, j <= i + 1) << i << "," << j;
  spec.window.left = 1;
  spec.window.right = 2;
  const Tensor two = attention_mask(spec, 4, 7);
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 7; ++j)
      EXPECT_EQ(two.at({i, j}) != 0.0, j >= i - 1 && j <= i + 2) << i << "," << j;
}

TEST(WindowMask, NegativeBoundIsRefusedNamingIt) {
  AttentionSpec spec;
  spec.window.left = -1;
  try {
    attention_mask(spec, 3, 3);
    FAIL() << "a negative left bound was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("window left -1"), std::string::npos) << e.what();
  }
}

// The softcap op: C tanh(x / C) by value, and its backward against finite
// differences, at inputs far past C (where tanh saturates) and near 0.
TEST(SoftcapOp, ValueAndGradcheck) {
  const std::vector<double> values = {-40.0, -3.0, -0.5, 0.0, 0.25, 2.0, 7.5, 60.0};
  const Tensor x = Tensor::from_values(values, {2, 4}, DType::float64);
  const Variable y = softcap(Variable(x), 2.5);
  for (std::int64_t i = 0; i < x.numel(); ++i) EXPECT_DOUBLE_EQ(y.data().flat(i), 2.5 * std::tanh(x.flat(i) / 2.5));
  const GradcheckResult r = gradcheck([](const std::vector<Variable>& v) { return softcap(v[0], 2.5); }, {x});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_THROW(softcap(Variable(x), 0.0), std::invalid_argument);
}

// ---------------------------------------------------------------- the plugins, by hand

class ModernAttention : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = std::make_unique<PluginRegistry>();
    load_problems_ = test::load_real_plugins(*registry_);
  }
  static void TearDownTestSuite() { registry_.reset(); }
  void SetUp() override { ASSERT_EQ(load_problems_, "") << "the real plugins did not all load"; }

  static const Attention& plugin(const std::string& name) { return *registry_->get(name).attention; }
  static Core core_of(const std::string& name) {
    const Attention* a = &plugin(name);
    return [a](const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& s) {
      return a->core_forward(q, k, v, s);
    };
  }
  static inline std::unique_ptr<PluginRegistry> registry_;
  static inline std::string load_problems_;
};

TEST_F(ModernAttention, EveryPluginDeclaresTheThreeFeatures) {
  for (const char* name : {"per_head", "batched", "fused_sdpa"}) {
    const Capabilities c = plugin(name).info().capabilities;
    EXPECT_TRUE(c.window && c.softcap && c.sinks) << name;
  }
}

// q = 0: every score is 0, so with sigma = ln 4 and Tk = 4 keys the softmax
// denominator is exp(sigma) + 4 = 8: out = sum_j v_j / 8 and P_sink = 1/2.
// dsigma = -sum_i P_sink D_i = -(1/2) sum_i dO_i . out_i, with dO = R.
TEST_F(ModernAttention, SinkByHandEveryPlugin) {
  Problem p = problem(1, 1, 1, 3, 4, 2, 31);
  p.q = Tensor::zeros({1, 1, 3, 2}, DType::float64);
  p.sinks.set_flat(0, std::log(4.0));
  Tensor expected = Tensor::zeros({1, 1, 3, 2}, DType::float64);
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t c = 0; c < 2; ++c) {
      double s = 0;
      for (std::int64_t j = 0; j < 4; ++j) s += p.v.at({0, 0, j, c});
      expected.set_flat(i * 2 + c, s / 8.0);
    }
  Generator gen(5);  // run()'s R
  const Tensor r = randn({1, 1, 3, 2}, DType::float64, gen);
  double dsigma = 0;
  for (std::int64_t e = 0; e < 6; ++e) dsigma -= 0.5 * r.flat(e) * expected.flat(e);
  for (const char* name : {"per_head", "batched", "fused_sdpa"}) {
    SCOPED_TRACE(name);
    const Result res = run(core_of(name), p, true);
    EXPECT_TRUE(all_close("out", res.out, expected, 1e-14, 1e-12));
    ASSERT_TRUE(res.dsinks.defined());
    EXPECT_NEAR(res.dsinks.flat(0), dsigma, 1e-13);
  }
}

// d 1, q 2, keys +1 and -1, scale 1, cap 1: scores 2 and -2 become tanh(2)
// and -tanh(2); p0 = 1 / (1 + exp(-2 tanh 2)), out = p0 v0 + (1 - p0) v1.
TEST_F(ModernAttention, SoftcapByHandEveryPlugin) {
  Problem p = problem(1, 1, 1, 1, 2, 1, 3);
  p.q.set_flat(0, 2.0);
  p.k.set_flat(0, 1.0);
  p.k.set_flat(1, -1.0);
  p.spec.scale = 1.0;
  p.spec.softcap = 1.0;
  const double p0 = 1.0 / (1.0 + std::exp(-2.0 * std::tanh(2.0)));
  const double want = p0 * p.v.flat(0) + (1.0 - p0) * p.v.flat(1);
  for (const char* name : {"per_head", "batched", "fused_sdpa"}) {
    const Result res = run(core_of(name), p, false);
    EXPECT_NEAR(res.out.flat(0), want, 1e-14) << name;
  }
}

// A row with every key masked puts all its mass on the sink: out 0, and zero
// gradients, with or without a cap.
TEST_F(ModernAttention, FullyMaskedRowGoesToTheSink) {
  Problem p = problem(2, 3, 3, 4, 5, 3, 41);
  Tensor mask = Tensor::empty({4, 5}, DType::boolean);
  for (std::int64_t e = 0; e < 20; ++e) mask.set_flat(e, e / 5 == 2 ? 0.0 : 1.0);  // row 2: no key
  p.spec.mask = mask;
  p.spec.softcap = 2.0;
  for (const char* name : {"per_head", "batched", "fused_sdpa"}) {
    SCOPED_TRACE(name);
    const Result res = run(core_of(name), p, true);
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t h = 0; h < 3; ++h)
        for (std::int64_t c = 0; c < 3; ++c) {
          EXPECT_EQ(res.out.at({b, h, 2, c}), 0.0);
          EXPECT_EQ(res.dq.at({b, h, 2, c}), 0.0);
        }
    EXPECT_TRUE(all_finite("dsinks", res.dsinks));
  }
}

// ---------------------------------------------------------------- the fused kernel, tiled

struct TiledCase {
  std::string name;
  std::int64_t br, bc, tq, tk;
  std::int64_t h = 2, hkv = 2;
  bool causal = false;
  CausalAlignment align = CausalAlignment::top_left;
  std::optional<std::int64_t> left, right;
  double softcap = 0;
  bool sinks = false;
  bool masked_row = false;  // a bool mask with one row of no key
  double q_gain = 1.0;      // |s| up to a few C with a cap
  std::int64_t wide = 0;    // Tiles::wide: window tiles from the window's edge
};

void PrintTo(const TiledCase& c, std::ostream* os) { *os << c.name; }

Problem tiled_problem(const TiledCase& c, std::uint64_t seed) {
  Problem p = problem(2, c.h, c.hkv, c.tq, c.tk, 3, seed, c.q_gain);
  p.spec.causal = c.causal;
  p.spec.causal_alignment = c.align;
  p.spec.window.left = c.left;
  p.spec.window.right = c.right;
  p.spec.softcap = c.softcap;
  if (c.masked_row) {
    Tensor mask = Tensor::empty({c.tq, c.tk}, DType::boolean);
    for (std::int64_t e = 0; e < mask.numel(); ++e)
      mask.set_flat(e, e / c.tk == 1 ? 0.0 : (e % 7 != 3 ? 1.0 : 0.0));  // row 1 empty, a few holes
    p.spec.mask = mask;
  }
  return p;
}

const std::vector<TiledCase> kTiled = {
    {"window_causal_left2", 3, 3, 9, 10, 2, 2, true, CausalAlignment::top_left, 2, 0},
    {"window_decode_bottom_right", 2, 3, 7, 11, 2, 2, true, CausalAlignment::bottom_right, 3, 0},
    {"window_two_sided", 3, 3, 9, 10, 2, 2, false, CausalAlignment::top_left, 2, 1},
    {"window_right_only", 3, 3, 9, 10, 2, 2, false, CausalAlignment::top_left, std::nullopt, 1},
    {"softcap", 3, 3, 9, 10, 2, 2, false, CausalAlignment::top_left, std::nullopt, std::nullopt, 1.5, false,
     false, 3.0},
    {"softcap_causal", 3, 3, 9, 10, 2, 2, true, CausalAlignment::top_left, std::nullopt, std::nullopt, 1.5,
     false, false, 3.0},
    {"sinks", 3, 3, 9, 10, 2, 2, false, CausalAlignment::top_left, std::nullopt, std::nullopt, 0, true},
    {"sinks_bottom_right_tq_gt_tk", 3, 2, 11, 7, 2, 2, true, CausalAlignment::bottom_right, std::nullopt,
     std::nullopt, 0, true},
    {"all_gqa_masked_row", 3, 3, 9, 10, 4, 2, true, CausalAlignment::bottom_right, 3, 0, 1.5, true, true, 3.0},
    {"all_two_sided_gqa", 2, 3, 7, 11, 6, 2, false, CausalAlignment::top_left, 2, 3, 2.0, true, true, 3.0},
    // Wide tiles: a block's 6-7 visible keys (rows) in tiles of 4 that start at
    // the window's edge, off the 3-row grid of the dQ locks, so that one tile's
    // dQ rows cross two lock blocks.
    {"wide_window_causal", 3, 3, 13, 14, 2, 2, true, CausalAlignment::top_left, 3, 0, 0, false, false, 1.0, 4},
    {"wide_two_sided_all_gqa", 3, 3, 13, 14, 4, 2, false, CausalAlignment::top_left, 2, 1, 1.5, true, true, 3.0,
     4},
    {"wide_decode_bottom_right", 2, 3, 7, 12, 2, 2, true, CausalAlignment::bottom_right, 3, 0, 0, true, false,
     1.0, 4},
};

class TiledKernel : public ::testing::TestWithParam<TiledCase> {};

std::int64_t tiles_over(std::int64_t n, std::int64_t tile) { return (n + tile - 1) / tile; }

TEST_P(TiledKernel, GradcheckAcrossTiles) {
  const TiledCase& c = GetParam();
  ASSERT_GE(tiles_over(c.tq, c.br), 3) << "query tiles";
  ASSERT_GE(tiles_over(c.tk, c.bc), 3) << "key tiles";
  const Problem p = tiled_problem(c, 17);
  const fused_sdpa::Tiles tiles{c.br, c.bc, c.wide};
  std::vector<Tensor> inputs = {p.q, p.k, p.v};
  if (c.sinks) inputs.push_back(p.sinks);
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Variable>& x) {
        AttentionSpec s = p.spec;
        if (c.sinks) s.sinks = x[3];
        return fused_sdpa::sdpa(x[0], x[1], x[2], s, tiles);
      },
      inputs);
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.elements_checked, p.q.numel() + p.k.numel() + p.v.numel() + (c.sinks ? p.sinks.numel() : 0));
  // an all-zero attention would pass any gradcheck: the output must carry the values
  const Result res = run([&](const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& s) {
    return fused_sdpa::sdpa(q, k, v, s, tiles);
  }, p, c.sinks);
  double largest = 0;
  for (std::int64_t e = 0; e < res.out.numel(); ++e) largest = std::max(largest, std::abs(res.out.flat(e)));
  EXPECT_GT(largest, 0.1);
}

// The kernel with small tiles, the composed core (batched) and per_head: one
// computation, three implementations (dsinks included).
TEST_P(TiledKernel, AgreesWithTheComposedCoreAndPerHead) {
  const TiledCase& c = GetParam();
  const Problem p = tiled_problem(c, 23);
  const Result fused = run([&](const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& s) {
    return fused_sdpa::sdpa(q, k, v, s, {c.br, c.bc, c.wide});
  }, p, c.sinks);
  PluginRegistry registry;
  ASSERT_EQ(test::load_real_plugins(registry), "");
  for (const char* name : {"per_head", "batched"}) {
    SCOPED_TRACE(name);
    const Attention* a = registry.get(name).attention.get();
    const Result other = run([a](const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& s) {
      return a->core_forward(q, k, v, s);
    }, p, c.sinks);
    expect_same(fused, other, 1e-12, 1e-10);
  }
  // and the features change the result: the case is no plain attention
  AttentionSpec plain = p.spec;
  plain.window = {};
  plain.softcap = 0;
  plain.mask = Tensor();
  Problem bare = p;
  bare.spec = plain;
  const Result none = run([&](const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& s) {
    return fused_sdpa::sdpa(q, k, v, s, {c.br, c.bc});
  }, bare, false);
  EXPECT_FALSE(all_close("out", fused.out, none.out, 1e-6, 1e-6));
}

INSTANTIATE_TEST_SUITE_P(Features, TiledKernel, ::testing::ValuesIn(kTiled),
                         [](const auto& info) { return info.param.name; });

// The plugin's own tiling for a window narrow against Tk (span * 8 <= Tk: 64 x
// 64 blocks with wide tiles, tiles_for in fused_sdpa.cpp), at a length where
// each pass crosses several blocks and the dQ locks: fused_sdpa's core against
// batched's, a window each way, with GQA, a cap and sinks.
TEST(TiledKernelPlugin, NarrowWindowTilingAgreesWithBatched) {
  PluginRegistry registry;
  ASSERT_EQ(test::load_real_plugins(registry), "");
  const Attention& fused = *registry.get("fused_sdpa").attention;
  const Attention& batched = *registry.get("batched").attention;
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "two-sided");
    Problem p = problem(1, 4, 2, 300, 300, 8, 41, 3.0);
    p.spec.causal = causal;
    p.spec.window.left = 20;
    p.spec.window.right = causal ? 0 : 5;  // span 21 or 26 keys: 8 spans <= 300
    p.spec.softcap = 1.5;
    const auto core = [](const Attention& a) {
      return [&a](const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& s) {
        return a.core_forward(q, k, v, s);
      };
    };
    expect_same(run(core(fused), p, true), run(core(batched), p, true), 1e-12, 1e-10);
  }
}

// Keys outside every query's window are never read, forward or backward: NaN
// there leaves out and the gradients finite (a tile that was multiplied would
// carry 0 * NaN = NaN into P V), and those keys get exactly zero dk and dv.
// Decode: Tq 2 of Tk 12, bottom_right, left 1: rows see keys 9..10 and 10..11;
// with 2-key tiles the first read key tile starts at 8 (wide tiles: the
// forward's at 9; the backward's key blocks stay on the 2-key grid).
TEST(TiledKernelSkips, KeysOutsideEveryWindowAreNeverRead) {
  for (const fused_sdpa::Tiles tiles : {fused_sdpa::Tiles{1, 2}, fused_sdpa::Tiles{1, 2, 3}}) {
    SCOPED_TRACE("wide " + std::to_string(tiles.wide));
    Problem p = problem(1, 2, 2, 2, 12, 3, 9);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t j = 0; j < 8; ++j)
        for (std::int64_t c = 0; c < 3; ++c) {
          p.k.set_flat((h * 12 + j) * 3 + c, nan);
          p.v.set_flat((h * 12 + j) * 3 + c, nan);
        }
    p.spec.causal = true;
    p.spec.causal_alignment = CausalAlignment::bottom_right;
    p.spec.window.left = 1;
    const Result res = run([&](const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& s) {
      return fused_sdpa::sdpa(q, k, v, s, tiles);
    }, p, true);
    // the composed core on the same inputs with those keys finite (any value: no window sees them)
    Problem finite = p;
    finite.k = p.k.clone();
    finite.v = p.v.clone();
    for (std::int64_t e = 0; e < finite.k.numel(); ++e)
      if (std::isnan(finite.k.flat(e))) {
        finite.k.set_flat(e, 7.0);
        finite.v.set_flat(e, -3.0);
      }
    const Result composed = run([](const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& s) {
      return attention_core(q, k, v, s);
    }, finite, true);
    EXPECT_TRUE(all_close("out", res.out, composed.out, 1e-12, 1e-10));
    EXPECT_TRUE(all_close("dq", res.dq, composed.dq, 1e-12, 1e-10));
    EXPECT_TRUE(all_close("dsinks", res.dsinks, composed.dsinks, 1e-12, 1e-10));
    EXPECT_TRUE(all_finite("out", res.out));
    EXPECT_TRUE(all_finite("dq", res.dq));
    EXPECT_TRUE(all_finite("dsinks", res.dsinks));
    for (std::int64_t e = 0; e < res.dk.numel(); ++e)
      if ((e / 3) % 12 < 8) {
        ASSERT_EQ(res.dk.flat(e), 0.0) << e;
        ASSERT_EQ(res.dv.flat(e), 0.0) << e;
      }
  }
}

// ---------------------------------------------------------------- MHA level

// Every feature at once with GQA (H 6, Hkv 2) and RoPE: per_head, batched and
// fused_sdpa agree on out, dx, every dW and dsinks in float64.
TEST_F(ModernAttention, MhaLevelThreePluginsAgreeWithGqaAndRope) {
  const std::int64_t b = 2, t = 11, dm = 24, h = 6, hkv = 2, d = 4;
  Generator gen(77);
  const Tensor x = randn({b, t, dm}, DType::float64, gen);
  const double sd = 1.0 / std::sqrt(static_cast<double>(dm));
  const Tensor wq = randn({h * d, dm}, DType::float64, gen, 3.0 * sd);  // |s| past the cap
  const Tensor wk = randn({hkv * d, dm}, DType::float64, gen, sd);
  const Tensor wv = randn({hkv * d, dm}, DType::float64, gen, sd);
  const Tensor wo = randn({dm, h * d}, DType::float64, gen, sd);
  const Tensor r = randn({b, t, dm}, DType::float64, gen);
  Tensor sinks = Tensor::empty({h}, DType::float64);
  for (std::int64_t i = 0; i < h; ++i) sinks.set_flat(i, -1.0 + 4.0 * gen.uniform());
  AttentionSpec spec = test::causal_mha_spec(dm, h, hkv, d);
  spec.window.left = 3;
  spec.window.right = 0;
  spec.softcap = 1.0;
  spec.rope.enabled = true;
  spec.rope.style = RopeStyle::half;
  const auto run_mha = [&](const Attention& a) {
    Variable vx(x, true);
    MhaWeights w{Variable(wq, true), Variable(wk, true), Variable(wv, true), Variable(wo, true)};
    AttentionSpec s = spec;
    s.sinks = Variable(sinks, true);
    const Variable out = a.mha_forward(vx, w, s);
    sum(mul(out, Variable(r))).backward();
    return std::vector<Tensor>{out.data(), vx.grad(), w.wq.grad(), w.wk.grad(), w.wv.grad(), w.wo.grad(),
                               s.sinks.grad()};
  };
  const std::vector<std::string> names = {"out", "dx", "dwq", "dwk", "dwv", "dwo", "dsinks"};
  const auto oracle = run_mha(plugin("per_head"));
  for (const char* other : {"batched", "fused_sdpa"}) {
    SCOPED_TRACE(other);
    const auto res = run_mha(plugin(other));
    for (std::size_t i = 0; i < names.size(); ++i) EXPECT_TRUE(all_close(names[i], res[i], oracle[i], 1e-10, 1e-8));
  }
}

}  // namespace

}  // namespace test_window_softcap_sinks
