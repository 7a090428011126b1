// The fused_sdpa plugin: its hand-written backward against finite differences,
// its forward and backward against the batched core (composed from ops, with
// autodiff's backward), fully masked rows, dropout, and peak memory at long
// sequences against the batched core's [T, T] buffers.
//
// The plugins are loaded through the loader from the files the build lists,
// once per test suite. The kernel is also linked directly (kernel.hpp), so
// that tests choose its tiles: the plugin's default tile is 128 x 128, and a
// few rows with tiles of 2 or 3 cross several tiles in each direction (the
// online softmax's rescaling, dQ added from several key blocks, dropout's
// counters). Comparisons hand the SAME q, k, v, R tensors to both sides; each
// side wraps them in its own leaf Variables.
//
// Shape legend: [...] leading dims (batch x heads), Tq/Tk query/key lengths,
// d query/key width, dv value width, Br x Bc one kernel tile (query rows x
// keys), B batch, T sequence, D model width, H query heads, Hkv key/value heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "headgrad/attention.hpp"
#include "headgrad/gradcheck.hpp"
#include "headgrad/loader.hpp"
#include "headgrad/ops.hpp"
#include "headgrad/parallel.hpp"
#include "headgrad/plugin.hpp"
#include "checks.hpp"
#include "attention_run.hpp"
#include "kernel.hpp"
#include "headgrad/tile_gemm.hpp"
#include "real_plugins.hpp"

namespace test_fused_sdpa {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using headgrad::test::all_close;
using headgrad::test::expect_core_close;
using headgrad::test::all_finite;
using headgrad::test::CoreResult;
using headgrad::test::run_core;

constexpr double kAtol64 = 1e-8;  // the float64 checking tolerances (docs/design.md)
constexpr double kRtol64 = 1e-6;
constexpr double kAtol32 = 2e-5;  // float32: a few ulps of O(1) values, summed over T
constexpr double kRtol32 = 1e-4;

// ---------------------------------------------------------------- helpers

// A bool mask (True = attend) with each entry attended with probability `p`.
Tensor random_mask(const Shape& shape, double p, std::uint64_t seed) {
  Generator gen(seed);
  Tensor m = Tensor::empty(shape, DType::boolean);
  for (std::int64_t i = 0; i < m.numel(); ++i) m.set_flat(i, gen.uniform() < p ? 1.0 : 0.0);
  return m;
}

// ---------------------------------------------------------------- fixture

class FusedSdpaTest : public ::testing::Test {
 protected:
  // Once per suite: the registry (and so both libraries) outlives every
  // Variable a test makes.
  static void SetUpTestSuite() {
    registry_ = std::make_unique<PluginRegistry>();
    load_problems_ = test::load_real_plugins(*registry_);
  }
  static void TearDownTestSuite() { registry_.reset(); }

  void SetUp() override {
    ASSERT_EQ(load_problems_, "") << "the real plugins did not all load";
    ASSERT_NE(registry_->find("fused_sdpa"), nullptr);
    ASSERT_NE(registry_->find("batched"), nullptr);
  }

  static const Attention& fused() { return *registry_->get("fused_sdpa").attention; }
  static const Attention& batched() { return *registry_->get("batched").attention; }

  static inline std::unique_ptr<PluginRegistry> registry_;
  static inline std::string load_problems_;
};

TEST_F(FusedSdpaTest, AdvertisesItsCapabilities) {
  const PluginInfo info = registry_->get("fused_sdpa").info;
  EXPECT_EQ(info.name, "fused_sdpa");
  EXPECT_FALSE(info.mutant);
  EXPECT_NE(info.description.find("fully masked rows give zeros"), std::string::npos);
  const Capabilities& c = info.capabilities;
  EXPECT_TRUE(c.mha && c.core && c.causal && c.bool_mask && c.cross_lengths);
  EXPECT_TRUE(c.float32 && c.float64 && c.dropout && c.grouped_kv && c.rope);
}

// The kernel reads q, k and v again in its backward: writing one of them in
// place between the forward and the backward is an error naming the op, not
// silently wrong gradients.
TEST_F(FusedSdpaTest, WritingAnInputInPlaceBeforeTheBackwardIsCaught) {
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE("input " + std::to_string(which));
    Generator gen(5);
    Variable q(randn({2, 5, 4}, DType::float64, gen), true);
    Variable k(randn({2, 6, 4}, DType::float64, gen), true);
    Variable v(randn({2, 6, 3}, DType::float64, gen), true);
    const Variable loss = sum(fused_sdpa::sdpa(q, k, v, AttentionSpec{}, {2, 2}));
    Tensor written = (which == 0 ? q : which == 1 ? k : v).data();
    written.fill_(0.5);
    try {
      loss.backward();
      ADD_FAILURE() << "no error for an input written in place";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("fused_sdpa"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("written in place"), std::string::npos) << e.what();
    }
  }
}

TEST_F(FusedSdpaTest, RejectsBadInputsNamingTheOp) {
  Generator gen(1);
  const Variable q(randn({2, 3, 4}, DType::float64, gen));
  const Variable k(randn({2, 5, 4}, DType::float64, gen));
  const Variable v(randn({2, 5, 2}, DType::float64, gen));
  const Variable k_bad(randn({2, 5, 3}, DType::float64, gen));
  AttentionSpec spec;
  EXPECT_THROW(fused().core_forward(q, k_bad, v, spec), std::invalid_argument);
  spec.mask = random_mask({4, 5}, 0.5, 2);  // Tq is 3, not 4
  EXPECT_THROW(fused().core_forward(q, k, v, spec), std::invalid_argument);
  spec.mask = Tensor();
  spec.dropout_p = 1.0;
  try {
    fused().core_forward(q, k, v, spec);
    ADD_FAILURE() << "dropout_p = 1 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("fused_sdpa"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- core cases

enum class MaskKind { none, shared, per_slice };  // [Tq, Tk] or [..., Tq, Tk]
enum class QLayout { contiguous, transposed, narrowed };

struct CoreCase {
  std::string name;
  Shape lead;
  std::int64_t tq, tk, d, dv;
  bool causal;
  MaskKind mask = MaskKind::none;
  QLayout q_layout = QLayout::contiguous;
};

struct CoreInputs {
  Tensor q, k, v;
  AttentionSpec spec;
};

CoreInputs make_inputs(const CoreCase& c, DType dtype, std::uint64_t seed) {
  Generator gen(seed);
  CoreInputs in;
  switch (c.q_layout) {
    case QLayout::contiguous: in.q = randn(with_last2(c.lead, c.tq, c.d), dtype, gen); break;
    case QLayout::transposed:  // [..., d, Tq] seen as [..., Tq, d]: a copy inside the op
      in.q = randn(with_last2(c.lead, c.d, c.tq), dtype, gen).transpose(-2, -1);
      break;
    case QLayout::narrowed:  // rows longer than d: read in place with a wider stride
      in.q = randn(with_last2(c.lead, c.tq, c.d + 3), dtype, gen).narrow(-1, 1, c.d);
      break;
  }
  in.k = randn(with_last2(c.lead, c.tk, c.d), dtype, gen);
  in.v = randn(with_last2(c.lead, c.tk, c.dv), dtype, gen);
  in.spec.causal = c.causal;
  if (c.mask == MaskKind::shared) in.spec.mask = random_mask({c.tq, c.tk}, 0.7, seed + 1);
  if (c.mask == MaskKind::per_slice)
    in.spec.mask = random_mask(with_last2(c.lead, c.tq, c.tk), 0.7, seed + 1);
  return in;
}

std::string case_name(const ::testing::TestParamInfo<CoreCase>& info) { return info.param.name; }

// -------- gradcheck of the hand-written backward, float64

class FusedCoreGradcheck : public FusedSdpaTest,
                           public ::testing::WithParamInterface<CoreCase> {};

TEST_P(FusedCoreGradcheck, MatchesFiniteDifferences) {
  const CoreCase& c = GetParam();
  const CoreInputs in = make_inputs(c, DType::float64, 7);
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Variable>& x) {
        return fused().core_forward(x[0], x[1], x[2], in.spec);
      },
      {in.q, in.k, in.v});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.elements_checked, in.q.numel() + in.k.numel() + in.v.numel());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedCoreGradcheck,
    ::testing::Values(
        CoreCase{"square", {2, 2}, 3, 3, 4, 4, false},
        CoreCase{"square_causal", {2, 2}, 3, 3, 4, 4, true},
        CoreCase{"tq_lt_tk_dv_ne_d", {2}, 3, 5, 4, 2, false},
        CoreCase{"tq_lt_tk_causal", {2}, 3, 5, 4, 2, true},
        CoreCase{"tq_gt_tk_causal", {2}, 5, 3, 2, 3, true},
        CoreCase{"bool_mask", {2, 2}, 4, 5, 3, 2, false, MaskKind::per_slice},
        CoreCase{"bool_mask_causal", {2}, 4, 5, 3, 2, true, MaskKind::shared},
        CoreCase{"transposed_q", {2}, 4, 5, 3, 2, true, MaskKind::none, QLayout::transposed},
        CoreCase{"narrowed_q", {2}, 4, 5, 3, 2, false, MaskKind::none, QLayout::narrowed}),
    case_name);

// -------- the kernel with small tiles: every case crosses >= 3 tiles each way

struct TiledCase {
  std::string name;
  std::int64_t br, bc;  // the kernel's tile
  std::int64_t tq, tk;
  bool causal;
  double dropout_p;
  MaskKind mask = MaskKind::none;
  CausalAlignment align = CausalAlignment::top_left;
};

void PrintTo(const TiledCase& c, std::ostream* os) { *os << c.name; }

std::int64_t tiles_over(std::int64_t n, std::int64_t tile) { return (n + tile - 1) / tile; }

CoreInputs make_tiled_inputs(const TiledCase& c, DType dtype, std::uint64_t seed) {
  CoreInputs in = make_inputs(CoreCase{c.name, {2}, c.tq, c.tk, 3, 2, c.causal, c.mask}, dtype, seed);
  in.spec.dropout_p = c.dropout_p;
  in.spec.dropout_seed = 4242;
  in.spec.causal_alignment = c.align;
  return in;
}

class FusedTiles : public ::testing::TestWithParam<TiledCase> {};

TEST_P(FusedTiles, GradcheckAcrossTiles) {
  const TiledCase& c = GetParam();
  ASSERT_GE(tiles_over(c.tq, c.br), 3) << "query tiles";
  ASSERT_GE(tiles_over(c.tk, c.bc), 3) << "key tiles";
  const CoreInputs in = make_tiled_inputs(c, DType::float64, 17);
  const fused_sdpa::Tiles tiles{c.br, c.bc};
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Variable>& x) { return fused_sdpa::sdpa(x[0], x[1], x[2], in.spec, tiles); },
      {in.q, in.k, in.v});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.elements_checked, in.q.numel() + in.k.numel() + in.v.numel());
}

// The tiling is an implementation detail: small tiles, one tile per row and
// the default tile give the same output and gradients (dropout included: its
// mask is a function of (seed, n, i, j), not of the tile).
TEST_P(FusedTiles, TilingDoesNotChangeTheResult) {
  const TiledCase& c = GetParam();
  const CoreInputs in = make_tiled_inputs(c, DType::float64, 19);
  const auto run = [&](fused_sdpa::Tiles tiles) {
    return run_core([&](const Variable& q, const Variable& k, const Variable& v) {
      return fused_sdpa::sdpa(q, k, v, in.spec, tiles);
    }, in.q, in.k, in.v, 5);
  };
  const CoreResult small = run({c.br, c.bc});
  for (const fused_sdpa::Tiles other : {fused_sdpa::Tiles{1, 1}, fused_sdpa::Tiles{}}) {
    SCOPED_TRACE("tiles " + std::to_string(other.rows) + " x " + std::to_string(other.keys));
    expect_core_close(small, run(other), 1e-12, 1e-12);
  }
}

// Without dropout (the composed core has none) the kernel with small tiles is
// the composed core.
class FusedTilesExact : public FusedTiles {};

TEST_P(FusedTilesExact, MatchesTheComposedCore) {
  const TiledCase& c = GetParam();
  ASSERT_EQ(c.dropout_p, 0.0);
  const CoreInputs in = make_tiled_inputs(c, DType::float64, 23);
  const CoreResult fused = run_core([&](const Variable& q, const Variable& k, const Variable& v) {
    return fused_sdpa::sdpa(q, k, v, in.spec, {c.br, c.bc});
  }, in.q, in.k, in.v, 99);
  const CoreResult composed = run_core([&](const Variable& q, const Variable& k, const Variable& v) {
    return attention_core(q, k, v, in.spec);
  }, in.q, in.k, in.v, 99);
  expect_core_close(fused, composed, 1e-12, 1e-10);
}

const std::vector<TiledCase> kTiledCases = {
    TiledCase{"tq11_tk8_br3_bc2", 3, 2, 11, 8, false, 0.0},
    TiledCase{"tq11_tk8_br3_bc2_causal", 3, 2, 11, 8, true, 0.0},
    TiledCase{"tq7_tk10_br2_bc3", 2, 3, 7, 10, false, 0.0},
    TiledCase{"tq7_tk10_br2_bc3_causal", 2, 3, 7, 10, true, 0.0},
    TiledCase{"tq11_tk8_br3_bc2_dropout", 3, 2, 11, 8, false, 0.3},
    TiledCase{"tq11_tk8_br3_bc2_causal_dropout", 3, 2, 11, 8, true, 0.3},
    TiledCase{"tq7_tk10_br2_bc3_dropout", 2, 3, 7, 10, false, 0.3},
    TiledCase{"tq7_tk10_br2_bc3_causal_dropout", 2, 3, 7, 10, true, 0.3},
    TiledCase{"tq9_tk10_br3_bc3_mask_causal", 3, 3, 9, 10, true, 0.0, MaskKind::per_slice},
    TiledCase{"tq5_tk4_br1_bc1_dropout", 1, 1, 5, 4, false, 0.5},
    // bottom-right: the diagonal moves by Tk - Tq, and with Tq > Tk whole query
    // blocks (rows 0..3 of 11 at Br = 3) see no key and are skipped
    TiledCase{"tq7_tk11_br2_bc3_bottom_right", 2, 3, 7, 11, true, 0.0, MaskKind::none,
              CausalAlignment::bottom_right},
    TiledCase{"tq11_tk7_br3_bc2_bottom_right", 3, 2, 11, 7, true, 0.0, MaskKind::none,
              CausalAlignment::bottom_right},
    TiledCase{"tq11_tk7_br3_bc2_bottom_right_dropout", 3, 2, 11, 7, true, 0.3, MaskKind::none,
              CausalAlignment::bottom_right},
    TiledCase{"tq9_tk10_br3_bc3_mask_bottom_right", 3, 3, 9, 10, true, 0.0, MaskKind::per_slice,
              CausalAlignment::bottom_right},
};

std::vector<TiledCase> without_dropout(const std::vector<TiledCase>& cases) {
  std::vector<TiledCase> out;
  for (const TiledCase& c : cases)
    if (c.dropout_p == 0.0) out.push_back(c);
  return out;
}

std::string tiled_name(const ::testing::TestParamInfo<TiledCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Tiles, FusedTiles, ::testing::ValuesIn(kTiledCases), tiled_name);

// The kernel's causal tile logic (skipped tiles, diagonal tiles, empty query
// blocks) against its own mask path: the same bottom-right mask built by hand
// and given as a bool tensor, causal off. Equal to rounding, forward and backward,
// and the queries with no key give zeros and zero dq.
TEST(FusedKernel, BottomRightEqualsItsHandBuiltMaskAcrossTiles) {
  for (const auto& [tq, tk] : {std::pair<std::int64_t, std::int64_t>{1, 7}, {7, 11}, {11, 7}, {10, 10}}) {
    SCOPED_TRACE("Tq " + std::to_string(tq) + ", Tk " + std::to_string(tk));
    Generator gen(31);
    const Tensor q = randn({2, tq, 3}, DType::float64, gen);
    const Tensor k = randn({2, tk, 3}, DType::float64, gen);
    const Tensor v = randn({2, tk, 2}, DType::float64, gen);
    const Tensor r = randn({2, tq, 2}, DType::float64, gen);
    AttentionSpec causal;
    causal.causal = true;
    causal.causal_alignment = CausalAlignment::bottom_right;
    AttentionSpec by_hand;
    by_hand.mask = Tensor::empty({tq, tk}, DType::boolean);
    for (std::int64_t i = 0; i < tq; ++i)
      for (std::int64_t j = 0; j < tk; ++j) by_hand.mask.set({i, j}, j <= i + (tk - tq));
    const auto run = [&](const AttentionSpec& spec) {
      return run_core([&](const Variable& vq, const Variable& vk, const Variable& vv) {
        return fused_sdpa::sdpa(vq, vk, vv, spec, {3, 2});
      }, q, k, v, r);
    };
    const CoreResult a = run(causal), b = run(by_hand);
    expect_core_close(a, b, 1e-13, 1e-12);
    for (std::int64_t i = 0; i < tq - tk; ++i)
      for (std::int64_t c = 0; c < 3; ++c) {
        EXPECT_EQ(a.dq.at({0, i, c}), 0.0);
        if (c < 2) {
          EXPECT_EQ(a.out.at({1, i, c}), 0.0);
        }
      }
  }
}
INSTANTIATE_TEST_SUITE_P(Tiles, FusedTilesExact, ::testing::ValuesIn(without_dropout(kTiledCases)),
                         tiled_name);

// dQ is added from several key blocks under per-block locks: many workers on
// many key blocks give one worker's result to rounding.
TEST(FusedKernel, DqFromManyWorkersMatchesOneWorker) {
  Generator gen(29);
  const Tensor q = randn({3, 40, 5}, DType::float64, gen);
  const Tensor k = randn({3, 48, 5}, DType::float64, gen);
  const Tensor v = randn({3, 48, 4}, DType::float64, gen);
  AttentionSpec spec;
  spec.causal = true;
  const auto run = [&](int threads) {
    const int before = num_threads();
    set_num_threads(threads);
    const CoreResult res = run_core([&](const Variable& vq, const Variable& vk, const Variable& vv) {
      return fused_sdpa::sdpa(vq, vk, vv, spec, {4, 2});  // 10 x 24 tiles per slice
    }, q, k, v, 7);
    set_num_threads(before);
    return res;
  };
  const CoreResult one = run(1), many = run(8);
  EXPECT_EQ(one.out.to_vector(), many.out.to_vector());  // owned rows: bit for bit
  EXPECT_EQ(one.dk.to_vector(), many.dk.to_vector());
  EXPECT_EQ(one.dv.to_vector(), many.dv.to_vector());
  EXPECT_TRUE(all_close("dq", many.dq, one.dq, 1e-13, 1e-12));
}

// Heads split from [B, T, D] are views whose rows lie D apart, and so is the
// gradient merge_heads sends back; the kernel copies q and dO to dense rows
// for its products (as_rows). Through split_heads / merge_heads it gives, bit
// for bit on one thread, what it gives on dense copies of the same heads,
// with products on packed panels (float32) and on the BLAS (float64).
TEST(FusedKernel, HeadSplitRowsGiveTheDenseResult) {
  for (const DType dt : {DType::float32, DType::float64}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator gen(53);
    const std::int64_t b = 2, t = 150, h = 4, d = 32;
    const Tensor xq = randn({b, t, h * d}, dt, gen), xk = randn({b, t, h * d}, dt, gen);
    const Tensor xv = randn({b, t, h * d}, dt, gen), r = randn({b, t, h * d}, dt, gen);
    AttentionSpec spec;
    spec.causal = true;
    const fused_sdpa::Tiles tiles{64, 64};
    const int before = num_threads();
    set_num_threads(1);
    // spread: the heads as views of [B, T, D], dO from merge_heads' backward
    const CoreResult spread = run_core([&](const Variable& q, const Variable& k, const Variable& v) {
      return merge_heads(fused_sdpa::sdpa(split_heads(q, h), split_heads(k, h), split_heads(v, h), spec, tiles));
    }, xq, xk, xv, r);
    const auto heads = [&](const Tensor& x) { return split_heads(Variable(x), h).data().contiguous(); };
    const CoreResult dense = run_core([&](const Variable& q, const Variable& k, const Variable& v) {
      return fused_sdpa::sdpa(q, k, v, spec, tiles);
    }, heads(xq), heads(xk), heads(xv), heads(r));
    set_num_threads(before);
    ASSERT_TRUE(heads(xq).is_contiguous());
    const auto merged = [](const Tensor& x) { return merge_heads(Variable(x)).data().to_vector(); };
    EXPECT_EQ(spread.out.to_vector(), merged(dense.out));
    EXPECT_EQ(spread.dq.to_vector(), merged(dense.dq));
    EXPECT_EQ(spread.dk.to_vector(), merged(dense.dk));
    EXPECT_EQ(spread.dv.to_vector(), merged(dense.dv));
  }
}

// Transposed panels (x^T, packed in 16 x 16 register blocks on AVX-512):
// panel[c * 32 + r] of the panel starting at row r0 is x[r0 + r][c], and 0
// past x's last row, for every size around the 16-row blocks, the 32-row
// panels and the 16-column loads, with a row stride wider than the rows, and
// two slices side by side.
TEST(FusedTileGemm, TransposedPanelsHoldEveryElementAndZeroPadding) {
  for (const std::int64_t rows : {1, 15, 16, 17, 31, 32, 33, 70})
    for (const std::int64_t cols : {1, 15, 16, 17, 64, 70}) {
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
      const std::int64_t ld = cols + 3;
      std::vector<float> x(static_cast<std::size_t>(2 * rows * ld));
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) + 0.5f;
      tile::Packed p = tile::make_packed(2, rows, cols, true);
      std::fill(p.data, p.data + 2 * p.per_slice, std::nanf(""));
      for (std::int64_t n = 0; n < 2; ++n) tile::pack_slice(p, n, x.data() + n * rows * ld, ld, rows, cols);
      std::int64_t checked = 0;
      for (std::int64_t n = 0; n < 2; ++n)
        for (std::int64_t r0 = 0; r0 < rows; r0 += tile::kPanel)
          for (std::int64_t c = 0; c < cols; ++c)
            for (std::int64_t r = 0; r < tile::kPanel; ++r) {
              const float got = p.at(n, r0)[c * tile::kPanel + r];
              const float want = r0 + r < rows ? x[static_cast<std::size_t>(n * rows * ld + (r0 + r) * ld + c)] : 0.0f;
              ASSERT_EQ(got, want) << "slice " << n << ", row " << r0 + r << ", column " << c;
              ++checked;
            }
      EXPECT_EQ(checked, 2 * p.per_slice);  // every float of both slices
    }
}

// The tile products on packed panels (tile_gemm.hpp) against a float64 loop:
// sizes off the micro-kernel's 12 x 32 block, A read transposed through its
// strides, beta 0 ignoring NaNs in C and beta 1 adding to it. On a CPU
// without AVX-512 nothing may call it (fused_sdpa and blas::gemm ask
// available() first), and a call is refused rather than run wrong.
TEST(FusedTileGemm, MatchesAFloat64Product) {
  if (!tile::available()) {
    float c = 0.0f;
    const tile::Packed p = tile::make_packed(1, 1, 1, false);
    EXPECT_THROW(tile::gemm(1, 1, 1, 1.0f, &c, 1, 1, p.at(0, 0), p.stride, 0.0f, &c, 1), std::logic_error);
    return;
  }
  Generator gen(5);
  for (const auto& [m, n, k] : {std::array<std::int64_t, 3>{37, 45, 19}, {12, 32, 1}, {1, 1, 3},
                                {25, 70, 64}, {256, 64, 256}}) {
    for (const bool ta : {false, true}) {
      SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) +
                   (ta ? ", A transposed" : ""));
      const Tensor a = randn(ta ? Shape{k, m} : Shape{m, k}, DType::float32, gen);
      const Tensor b = randn({k, n}, DType::float32, gen);  // B = b as it is
      const Tensor bt = randn({n, k}, DType::float32, gen);  // B = bt^T
      tile::Packed pb = tile::make_packed(1, k, n, false);
      tile::Packed pbt = tile::make_packed(1, n, k, true);
      tile::pack_slice(pb, 0, b.data<float>(), n, k, n);
      tile::pack_slice(pbt, 0, bt.data<float>(), k, n, k);
      const Tensor c0 = randn({m, n}, DType::float32, gen);
      const std::vector<double> av = a.to_vector(), bv = b.to_vector(), btv = bt.to_vector();
      for (const auto* packed : {&pb, &pbt})
        for (const float beta : {0.0f, 1.0f}) {
          const std::vector<double> start = c0.to_vector();
          std::vector<float> c(start.begin(), start.end());
          if (beta == 0.0f) std::fill(c.begin(), c.end(), std::nanf(""));
          const std::int64_t lda = ta ? m : k;
          tile::gemm(m, n, k, 0.5f, a.data<float>(), ta ? 1 : lda, ta ? lda : 1,
                                 packed->at(0, 0), packed->stride, beta, c.data(), n);
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              double want = beta == 0.0f ? 0.0 : start[static_cast<std::size_t>(i * n + j)];
              double mag = std::abs(want);
              for (std::int64_t p = 0; p < k; ++p) {
                const double x = av[static_cast<std::size_t>(ta ? p * m + i : i * k + p)];
                const double y = packed == &pb ? bv[static_cast<std::size_t>(p * n + j)]
                                               : btv[static_cast<std::size_t>(j * k + p)];
                want += 0.5 * x * y;
                mag += std::abs(0.5 * x * y);
              }
              ASSERT_NEAR(c[static_cast<std::size_t>(i * n + j)], want, 1e-5 * mag + 1e-6)
                  << "C[" << i << ", " << j << "], beta " << beta
                  << (packed == &pb ? ", B as is" : ", B transposed");
            }
        }
    }
  }
}

// float32 with tiles of 32 and 128 keys runs its products on packed panels;
// against the float64 kernel on the same inputs (48 x 32 tiles) it stays
// within float32's tolerance, as the same float32 kernel on BLAS does, across
// the features that touch the tiles: causal both ways, masks, windows, caps,
// sinks, GQA, dropout, lengths and widths off the panels, a transposed q.
// 128 x 128 tiles that the diagonal crosses run their products in strips
// (Sdpa::row_strips, key_strips); in float64 they give the 48 x 32 tiles'
// result (no strips there) to rounding. On a CPU without AVX-512 the same
// float32 kernel runs its products on the BLAS, and the same bounds hold.
TEST(FusedKernel, PackedProductsMatchFloat64) {
  struct Case {
    std::string name;
    CoreCase shape;
    std::function<void(AttentionSpec&)> more = [](AttentionSpec&) {};
  };
  const std::vector<Case> cases = {
      {"causal", {"", {2, 2}, 150, 150, 40, 24, true}},
      {"bottom_right_tq_gt_tk", {"", {2}, 130, 75, 64, 64, true}, [](AttentionSpec& s) {
         s.causal_alignment = CausalAlignment::bottom_right;
       }},
      {"mask_transposed_q", {"", {2}, 100, 140, 16, 33, false, MaskKind::per_slice, QLayout::transposed}},
      {"window_softcap", {"", {2}, 160, 160, 32, 32, true}, [](AttentionSpec& s) {
         s.window.left = 50;
         s.softcap = 5.0;
       }},
      {"causal_dropout", {"", {3}, 150, 140, 20, 20, true}, [](AttentionSpec& s) {
         s.dropout_p = 0.2;
         s.dropout_seed = 7;
       }},
  };
  for (const Case& c : cases)
    for (const std::int64_t tile : {32, 128}) {
      SCOPED_TRACE(c.name + ", tiles " + std::to_string(tile == 32 ? 48 : tile) + " x " + std::to_string(tile));
      CoreInputs in = make_inputs(c.shape, DType::float64, 41);
      c.more(in.spec);
      Generator gen(43);
      const Tensor r = randn(with_last2(c.shape.lead, c.shape.tq, c.shape.dv), DType::float64, gen);
      const auto run = [&](DType dtype, bool packed, fused_sdpa::Tiles tiles) {
        tiles.packed = packed;
        return run_core([&](const Variable& q, const Variable& k, const Variable& v) {
          return fused_sdpa::sdpa(q, k, v, in.spec, tiles);
        }, in.q.to(dtype), in.k.to(dtype), in.v.to(dtype), r.to(dtype));
      };
      const fused_sdpa::Tiles tiles{tile == 32 ? 48 : tile, tile};
      const CoreResult want = run(DType::float64, true, {48, 32});
      expect_core_close(run(DType::float64, true, tiles), want, 1e-12, 1e-10);
      expect_core_close(run(DType::float32, true, tiles), want, kAtol32, kRtol32);
      expect_core_close(run(DType::float32, false, tiles), want, kAtol32, kRtol32);
    }
  // sinks and grouped kv heads: q [2, 4, T, d], k and v [2, 2, T, .]
  Generator gen(47);
  const Tensor q = randn({2, 4, 70, 24}, DType::float64, gen);
  const Tensor k = randn({2, 2, 90, 24}, DType::float64, gen);
  const Tensor v = randn({2, 2, 90, 16}, DType::float64, gen);
  const Tensor r = randn({2, 4, 70, 16}, DType::float64, gen);
  const Tensor sinks = randn({4}, DType::float64, gen);
  const auto run = [&](DType dtype, bool packed) {
    AttentionSpec spec;
    spec.causal = true;
    spec.sinks = Variable(sinks.to(dtype));
    return run_core([&](const Variable& vq, const Variable& vk, const Variable& vv) {
      return fused_sdpa::sdpa(vq, vk, vv, spec, {32, 32, 0, packed});
    }, q.to(dtype), k.to(dtype), v.to(dtype), r.to(dtype));
  };
  const CoreResult want = run(DType::float64, true);
  expect_core_close(run(DType::float32, true), want, kAtol32, kRtol32);
  expect_core_close(run(DType::float32, false), want, kAtol32, kRtol32);
}

TEST(FusedKernel, RejectsTilesBelowOne) {
  const Variable q(Tensor::zeros({2, 3}, DType::float64));
  try {
    fused_sdpa::sdpa(q, q, q, AttentionSpec{}, {0, 4});
    ADD_FAILURE() << "a tile of 0 rows accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("fused_sdpa: tiles 0 x 4"), std::string::npos) << e.what();
  }
}

// The plugin runs this kernel with the default tiles.
TEST_F(FusedSdpaTest, PluginIsTheKernelWithDefaultTiles) {
  Generator gen(31);
  const Tensor q = randn({2, 150, 4}, DType::float64, gen);
  const Tensor k = randn({2, 140, 4}, DType::float64, gen);
  const Tensor v = randn({2, 140, 3}, DType::float64, gen);
  AttentionSpec spec;
  spec.causal = true;
  EXPECT_EQ(fused().core_forward(Variable(q), Variable(k), Variable(v), spec).data().to_vector(),
            fused_sdpa::sdpa(Variable(q), Variable(k), Variable(v), spec).data().to_vector());
}

// -------- agreement with the batched core

class FusedCoreAgreement : public FusedSdpaTest, public ::testing::WithParamInterface<CoreCase> {};

TEST_P(FusedCoreAgreement, Float64MatchesBatched) {
  const CoreCase& c = GetParam();
  const CoreInputs in = make_inputs(c, DType::float64, 11);
  const CoreResult f = run_core(fused(), in.q, in.k, in.v, in.spec);
  const CoreResult b = run_core(batched(), in.q, in.k, in.v, in.spec);
  expect_core_close(f, b, kAtol64, kRtol64);
}

TEST_P(FusedCoreAgreement, Float32MatchesBatched) {
  const CoreCase& c = GetParam();
  const CoreInputs in = make_inputs(c, DType::float32, 13);
  const CoreResult f = run_core(fused(), in.q, in.k, in.v, in.spec);
  const CoreResult b = run_core(batched(), in.q, in.k, in.v, in.spec);
  ASSERT_EQ(f.out.dtype(), DType::float32);
  ASSERT_EQ(f.dq.dtype(), DType::float32);
  expect_core_close(f, b, kAtol32, kRtol32);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedCoreAgreement,
    ::testing::Values(
        CoreCase{"tq5_tk7", {2, 3}, 5, 7, 4, 3, false},
        CoreCase{"tq5_tk7_causal", {2, 3}, 5, 7, 4, 3, true},
        CoreCase{"tq7_tk5_causal", {2, 3}, 7, 5, 4, 4, true},
        CoreCase{"tq5_tk7_mask", {2, 3}, 5, 7, 4, 3, false, MaskKind::per_slice},
        CoreCase{"t130", {2, 2}, 130, 130, 16, 16, false},
        CoreCase{"t130_causal", {2, 2}, 130, 130, 16, 16, true},
        CoreCase{"t130_causal_mask", {2, 2}, 130, 130, 16, 8, true, MaskKind::shared},
        CoreCase{"tq65_tk129_mask", {3}, 65, 129, 8, 12, false, MaskKind::per_slice},
        CoreCase{"tq129_tk65_causal", {3}, 129, 65, 8, 8, true},
        CoreCase{"t200_transposed_q", {2}, 200, 200, 8, 8, true, MaskKind::none,
                 QLayout::transposed},
        CoreCase{"no_leading_dims", {}, 70, 90, 5, 6, false}),
    case_name);

// Broadcast leading dims: k and v shared by every head; their gradients are
// summed back over the heads.
TEST_F(FusedSdpaTest, BroadcastLeadingDimsMatchBatched) {
  Generator gen(21);
  const Tensor q = randn({2, 3, 6, 4}, DType::float64, gen);
  const Tensor k = randn({2, 1, 9, 4}, DType::float64, gen);
  const Tensor v = randn({1, 1, 9, 5}, DType::float64, gen);
  AttentionSpec spec;
  spec.causal = true;
  const CoreResult f = run_core(fused(), q, k, v, spec);
  const CoreResult b = run_core(batched(), q, k, v, spec);
  expect_core_close(f, b, kAtol64, kRtol64);
}

// ---------------------------------------------------------------- grouped KV heads

// k, v [B, Hkv, Tk, .] with q [B, H, Tq, d], G = H / Hkv = 3, Hkv = 2: query
// head h reads kv head h / G inside the kernel. The independent computation is
// the same core on k, v with each head repeated G times in place, whose dK, dV
// summed over each group of G heads are the grouped dK, dV.
struct GqaCase {
  std::string name;
  fused_sdpa::Tiles tiles;
  std::int64_t tq, tk;
  bool causal;
  double dropout_p;
};

void PrintTo(const GqaCase& c, std::ostream* os) { *os << c.name; }

constexpr std::int64_t kGqaBatch = 2, kGqaHeads = 6, kGqaKvHeads = 2, kGqaGroup = 3;

// x [B, Hkv, T, c] -> [B, H, T, c], head j of the result = head j / G of x.
Tensor repeat_heads(const Tensor& x, std::int64_t group) {
  const Shape s = x.shape();
  Tensor out = Tensor::empty({s[0], s[1] * group, s[2], s[3]}, x.dtype());
  for (std::int64_t b = 0; b < s[0]; ++b)
    for (std::int64_t h = 0; h < s[1] * group; ++h)
      for (std::int64_t t = 0; t < s[2]; ++t)
        for (std::int64_t c = 0; c < s[3]; ++c) out.set({b, h, t, c}, x.at({b, h / group, t, c}));
  return out;
}

// g [B, H, T, c] -> [B, H / G, T, c]: the sum over each group of G heads.
Tensor group_sums(const Tensor& g, std::int64_t group) {
  const Shape s = g.shape();
  Tensor out = Tensor::zeros({s[0], s[1] / group, s[2], s[3]}, g.dtype());
  for (std::int64_t b = 0; b < s[0]; ++b)
    for (std::int64_t h = 0; h < s[1]; ++h)
      for (std::int64_t t = 0; t < s[2]; ++t)
        for (std::int64_t c = 0; c < s[3]; ++c)
          out.set({b, h / group, t, c}, out.at({b, h / group, t, c}) + g.at({b, h, t, c}));
  return out;
}

CoreResult run_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                      fused_sdpa::Tiles tiles) {
  return run_core([&](const Variable& vq, const Variable& vk, const Variable& vv) {
    return fused_sdpa::sdpa(vq, vk, vv, spec, tiles);
  }, q, k, v, 99);
}

class FusedGqa : public FusedSdpaTest, public ::testing::WithParamInterface<GqaCase> {
 protected:
  CoreInputs inputs(std::uint64_t seed) const {
    const GqaCase& c = GetParam();
    Generator gen(seed);
    CoreInputs in;
    in.q = randn({kGqaBatch, kGqaHeads, c.tq, 4}, DType::float64, gen);
    in.k = randn({kGqaBatch, kGqaKvHeads, c.tk, 4}, DType::float64, gen);
    in.v = randn({kGqaBatch, kGqaKvHeads, c.tk, 3}, DType::float64, gen);
    in.spec.causal = c.causal;
    in.spec.dropout_p = c.dropout_p;
    in.spec.dropout_seed = 555;
    return in;
  }
};

TEST_P(FusedGqa, EqualsTheCoreOnRepeatedHeads) {
  const GqaCase& c = GetParam();
  const CoreInputs in = inputs(71);
  const CoreResult grouped = run_kernel(in.q, in.k, in.v, in.spec, c.tiles);
  const Tensor k_rep = repeat_heads(in.k, kGqaGroup), v_rep = repeat_heads(in.v, kGqaGroup);
  const CoreResult repeated = run_kernel(in.q, k_rep, v_rep, in.spec, c.tiles);
  ASSERT_EQ(grouped.dk.shape(), in.k.shape());
  ASSERT_EQ(grouped.dv.shape(), in.v.shape());
  EXPECT_TRUE(all_close("out", grouped.out, repeated.out, 1e-12, 0.0));
  EXPECT_TRUE(all_close("dq", grouped.dq, repeated.dq, 1e-12, 0.0));
  EXPECT_TRUE(all_close("dk = group sums", grouped.dk, group_sums(repeated.dk, kGqaGroup), 1e-12, 0.0));
  EXPECT_TRUE(all_close("dv = group sums", grouped.dv, group_sums(repeated.dv, kGqaGroup), 1e-12, 0.0));
  if (c.dropout_p > 0.0) return;  // the composed core has no dropout
  // and the composed core (ops and autodiff) on the repeated heads, through the plugin
  const CoreResult composed = run_core(batched(), in.q, k_rep, v_rep, in.spec);
  EXPECT_TRUE(all_close("out vs batched", grouped.out, composed.out, 1e-12, 0.0));
  EXPECT_TRUE(all_close("dq vs batched", grouped.dq, composed.dq, 1e-12, 0.0));
  EXPECT_TRUE(all_close("dk vs batched group sums", grouped.dk, group_sums(composed.dk, kGqaGroup), 1e-12, 0.0));
  EXPECT_TRUE(all_close("dv vs batched group sums", grouped.dv, group_sums(composed.dv, kGqaGroup), 1e-12, 0.0));
}

TEST_P(FusedGqa, Gradcheck) {
  const GqaCase& c = GetParam();
  const CoreInputs in = inputs(73);
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Variable>& x) { return fused_sdpa::sdpa(x[0], x[1], x[2], in.spec, c.tiles); },
      {in.q, in.k, in.v});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.elements_checked, in.q.numel() + in.k.numel() + in.v.numel());
}

INSTANTIATE_TEST_SUITE_P(
    Groups, FusedGqa,
    ::testing::Values(GqaCase{"tq7_tk9_tiles_2x3", {2, 3}, 7, 9, false, 0.0},
                      GqaCase{"tq7_tk9_tiles_2x3_causal", {2, 3}, 7, 9, true, 0.0},
                      GqaCase{"tq9_tk7_tiles_3x2_causal_dropout", {3, 2}, 9, 7, true, 0.3},
                      GqaCase{"tq5_tk6_default_tiles", {}, 5, 6, false, 0.0},
                      GqaCase{"tq5_tk6_default_tiles_causal", {}, 5, 6, true, 0.0}),
    [](const ::testing::TestParamInfo<GqaCase>& info) { return info.param.name; });

TEST_F(FusedSdpaTest, GqaHeadsThatDoNotDivideAreRejected) {
  Generator gen(75);
  const Variable q(randn({1, 6, 3, 4}, DType::float64, gen));
  const Variable kv(randn({1, 4, 3, 4}, DType::float64, gen));
  try {
    fused().core_forward(q, kv, kv, AttentionSpec{});
    ADD_FAILURE() << "H = 6 with Hkv = 4 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("H to be a multiple of Hkv"), std::string::npos) << e.what();
  }
}

// Through mha_forward the plugin hands the kernel the Hkv projected heads: its
// peak memory is below the same kernel behind batched_mha's repeat_interleave by
// at least the repeated K and V it never makes ([B, H - Hkv, T, d] each).
TEST_F(FusedSdpaTest, GqaMhaDoesNotRepeatKeysAndValues) {
  const std::int64_t b = 1, t = 256, h = 8, hkv = 2, d = 32, dm = h * d;
  Generator gen(77);
  const Tensor x = randn({b, t, dm}, DType::float32, gen);
  const double s = 1.0 / std::sqrt(static_cast<double>(dm));
  const Tensor wq = randn({dm, dm}, DType::float32, gen, s), wo = randn({dm, dm}, DType::float32, gen, s);
  const Tensor wk = randn({hkv * d, dm}, DType::float32, gen, s), wv = randn({hkv * d, dm}, DType::float32, gen, s);
  AttentionSpec spec;
  spec.d_model = dm;
  spec.num_heads = h;
  spec.num_kv_heads = hkv;
  spec.causal = true;
  const auto peak = [&](const std::function<Variable(const Variable&, const MhaWeights&)>& mha) {
    reset_peak_memory();
    const std::size_t base = memory_stats().current_bytes;
    Tensor out;
    {
      const Variable vx(x, true);
      const MhaWeights w{Variable(wq, true), Variable(wk, true), Variable(wv, true), Variable(wo, true)};
      const Variable o = mha(vx, w);
      sum(o).backward();
      out = o.data();
    }
    return std::pair{memory_stats().peak_bytes - base, out};
  };
  const auto [grouped, out_grouped] = peak([&](const Variable& vx, const MhaWeights& w) {
    return fused().mha_forward(vx, w, spec);
  });
  const auto [repeated, out_repeated] = peak([&](const Variable& vx, const MhaWeights& w) {
    return batched_mha(vx, w, spec, [](const Variable& q, const Variable& k, const Variable& v,
                                       const AttentionSpec& sp) { return fused_sdpa::sdpa(q, k, v, sp); });
  });
  const std::size_t repeated_kv = 2 * static_cast<std::size_t>(b * (h - hkv) * t * d) * sizeof(float);
  std::cout << "GQA mha peak extra memory, float32, B 1, T 256, H 8, Hkv 2, d 32: kernel reads Hkv heads "
            << grouped / 1024 << " KiB, behind repeat_interleave " << repeated / 1024
            << " KiB; the repeated K and V are " << repeated_kv / 1024 << " KiB\n";
  EXPECT_TRUE(all_close("out", out_grouped, out_repeated, 1e-6, 1e-5));
  EXPECT_LE(grouped + repeated_kv, repeated);
}

// q with one head and k, v with three is broadcasting of q, not a group.
TEST_F(FusedSdpaTest, OneQueryHeadBroadcastsOverKvHeads) {
  Generator gen(79);
  const Tensor q = randn({2, 1, 5, 4}, DType::float64, gen);
  const Tensor k = randn({2, 3, 6, 4}, DType::float64, gen);
  const Tensor v = randn({2, 3, 6, 2}, DType::float64, gen);
  AttentionSpec spec;
  spec.causal = true;
  expect_core_close(run_core(fused(), q, k, v, spec), run_core(batched(), q, k, v, spec), kAtol64,
                    kRtol64);
}

// ---------------------------------------------------------------- fully masked rows

TEST_F(FusedSdpaTest, FullyMaskedRowGivesZerosAndFiniteGradients) {
  Generator gen(31);
  const std::int64_t tq = 4, tk = 6;
  const Tensor q = randn({2, tq, 3}, DType::float64, gen);
  const Tensor k = randn({2, tk, 3}, DType::float64, gen);
  const Tensor v = randn({2, tk, 2}, DType::float64, gen);
  AttentionSpec spec;
  spec.mask = Tensor::ones({tq, tk}, DType::boolean);
  for (std::int64_t j = 0; j < tk; ++j) spec.mask.set({1, j}, 0.0);  // query 1 sees no key
  spec.mask.set({0, 0}, 0.0);  // with causal, query 0's only key is gone too

  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    spec.causal = causal;
    const CoreResult f = run_core(fused(), q, k, v, spec);
    for (std::int64_t n = 0; n < 2; ++n)
      for (std::int64_t c = 0; c < 2; ++c) {
        EXPECT_EQ(f.out.at({n, 1, c}), 0.0);
        if (causal) {
          EXPECT_EQ(f.out.at({n, 0, c}), 0.0);
        }
      }
    for (std::int64_t n = 0; n < 2; ++n)
      for (std::int64_t c = 0; c < 3; ++c) EXPECT_EQ(f.dq.at({n, 1, c}), 0.0);
    EXPECT_TRUE(all_finite("out", f.out));
    EXPECT_TRUE(all_finite("dq", f.dq));
    EXPECT_TRUE(all_finite("dk", f.dk));
    EXPECT_TRUE(all_finite("dv", f.dv));
    EXPECT_NE(f.out.at({0, 2, 0}), 0.0);  // the other rows are untouched
    // core's softmax has the same zeros rule: both sides agree everywhere
    const CoreResult b = run_core(batched(), q, k, v, spec);
    expect_core_close(f, b, kAtol64, kRtol64);
  }
  // and the hand-written backward is right around the masked rows
  spec.causal = true;
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Variable>& x) { return fused().core_forward(x[0], x[1], x[2], spec); },
      {q, k, v});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST_F(FusedSdpaTest, EveryKeyMaskedGivesAllZeros) {
  Generator gen(32);
  const Tensor q = randn({1, 70, 4}, DType::float32, gen);
  const Tensor k = randn({1, 80, 4}, DType::float32, gen);
  const Tensor v = randn({1, 80, 4}, DType::float32, gen);
  AttentionSpec spec;
  spec.mask = Tensor::zeros({70, 80}, DType::boolean);
  const CoreResult f = run_core(fused(), q, k, v, spec);
  for (const Tensor* t : {&f.out, &f.dq, &f.dk, &f.dv}) {
    const std::vector<double> x = t->to_vector();
    EXPECT_TRUE(std::all_of(x.begin(), x.end(), [](double e) { return e == 0.0; }));
  }
}

// ---------------------------------------------------------------- dropout

TEST_F(FusedSdpaTest, DropoutIsDeterministicForASeed) {
  Generator gen(41);
  const Tensor q = randn({2, 2, 70, 8}, DType::float32, gen);
  const Tensor k = randn({2, 2, 90, 8}, DType::float32, gen);
  const Tensor v = randn({2, 2, 90, 8}, DType::float32, gen);
  AttentionSpec spec;
  spec.causal = true;
  spec.dropout_p = 0.5;
  spec.dropout_seed = 1234;
  const CoreResult a = run_core(fused(), q, k, v, spec);
  const CoreResult b = run_core(fused(), q, k, v, spec);
  EXPECT_EQ(a.out.to_vector(), b.out.to_vector());
  EXPECT_EQ(a.dq.to_vector(), b.dq.to_vector());
  EXPECT_EQ(a.dk.to_vector(), b.dk.to_vector());
  EXPECT_EQ(a.dv.to_vector(), b.dv.to_vector());
  spec.dropout_seed = 1235;
  EXPECT_NE(run_core(fused(), q, k, v, spec).out.to_vector(), a.out.to_vector());
  spec.dropout_p = 0.0;  // p = 0: exact, the seed is ignored
  const CoreResult plain = run_core(fused(), q, k, v, spec);
  EXPECT_NE(plain.out.to_vector(), a.out.to_vector());
  EXPECT_TRUE(all_close("out", plain.out, run_core(batched(), q, k, v, spec).out, kAtol32,
                        kRtol32));
}

TEST_F(FusedSdpaTest, DropoutGradcheckRegeneratesTheMask) {
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    Generator gen(43);
    const Tensor q = randn({2, 5, 3}, DType::float64, gen);
    const Tensor k = randn({2, 6, 3}, DType::float64, gen);
    const Tensor v = randn({2, 6, 2}, DType::float64, gen);
    AttentionSpec spec;
    spec.causal = causal;
    spec.dropout_p = 0.5;
    spec.dropout_seed = 77;
    const GradcheckResult r = gradcheck(
        [&](const std::vector<Variable>& x) {
          return fused().core_forward(x[0], x[1], x[2], spec);
        },
        {q, k, v});
    EXPECT_TRUE(r.ok) << r.message;
  }
}

// q = 0 makes every weight 1/Tk and v = identity puts weight (i, j) at out[i, j]:
// it is exactly 0 where dropped and 1/(Tk (1 - p)) where kept.
TEST_F(FusedSdpaTest, DropoutDropsAFractionNearP) {
  const std::int64_t n = 4, tq = 64, tk = 96;
  const double p = 0.5;
  const Tensor q = Tensor::zeros({n, tq, 8}, DType::float64);
  Generator gen(45);
  const Tensor k = randn({n, tk, 8}, DType::float64, gen);
  Tensor eye = Tensor::zeros({tk, tk}, DType::float64);
  for (std::int64_t j = 0; j < tk; ++j) eye.set({j, j}, 1.0);
  AttentionSpec spec;
  spec.dropout_p = p;
  spec.dropout_seed = 2024;
  const Variable out = fused().core_forward(Variable(q), Variable(k), Variable(eye), spec);
  ASSERT_EQ(out.shape(), (Shape{n, tq, tk}));
  const std::vector<double> w = out.data().to_vector();
  std::int64_t dropped = 0, odd = 0;
  const double kept_value = 1.0 / (static_cast<double>(tk) * (1.0 - p));
  for (double x : w) {
    if (x == 0.0) ++dropped;
    else if (std::abs(x - kept_value) > 1e-12) ++odd;
  }
  const double fraction = static_cast<double>(dropped) / static_cast<double>(w.size());
  std::cout << "dropout p = " << p << ": dropped fraction " << fraction << " of " << w.size()
            << " weights\n";
  EXPECT_EQ(odd, 0);
  EXPECT_NEAR(fraction, p, 0.03);  // sd of the fraction is 0.002 here
  // the leading index is part of the counter: slices do not share a mask
  std::int64_t same = 0;
  for (std::int64_t e = 0; e < tq * tk; ++e) same += (w[e] == 0.0) == (w[tq * tk + e] == 0.0);
  EXPECT_LT(static_cast<double>(same) / static_cast<double>(tq * tk), 0.6);
}

// ---------------------------------------------------------------- mha level

struct MhaCase {
  std::string name;
  std::int64_t b, t, dm, h, hkv;
  bool causal;
  bool transposed_x;
};

MhaWeights make_weights(const MhaCase& c, Generator& gen) {
  const std::int64_t d = c.dm / c.h;
  const double s = 1.0 / std::sqrt(static_cast<double>(c.dm));
  return {Variable(randn({c.dm, c.dm}, DType::float64, gen, s), true),
          Variable(randn({c.hkv * d, c.dm}, DType::float64, gen, s), true),
          Variable(randn({c.hkv * d, c.dm}, DType::float64, gen, s), true),
          Variable(randn({c.dm, c.dm}, DType::float64, gen, s), true)};
}

Tensor make_x(const MhaCase& c, Generator& gen) {
  return c.transposed_x ? randn({c.b, c.dm, c.t}, DType::float64, gen).transpose(1, 2)
                        : randn({c.b, c.t, c.dm}, DType::float64, gen);
}

AttentionSpec mha_spec(const MhaCase& c) {
  AttentionSpec spec;
  spec.d_model = c.dm;
  spec.num_heads = c.h;
  spec.num_kv_heads = c.hkv;
  spec.causal = c.causal;
  return spec;
}

class FusedMha : public FusedSdpaTest, public ::testing::WithParamInterface<MhaCase> {};

TEST_P(FusedMha, GradcheckInputAndWeights) {
  const MhaCase& c = GetParam();
  Generator gen(51);
  const Tensor x = make_x(c, gen);
  const MhaWeights w = make_weights(c, gen);
  const AttentionSpec spec = mha_spec(c);
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Variable>& in) {
        return fused().mha_forward(in[0], {in[1], in[2], in[3], in[4]}, spec);
      },
      {x, w.wq.data(), w.wk.data(), w.wv.data(), w.wo.data()});
  EXPECT_TRUE(r.ok) << r.message;
}

TEST_P(FusedMha, MatchesBatched) {
  const MhaCase& c = GetParam();
  Generator gen(53);
  const Tensor x = make_x(c, gen);
  const MhaWeights w = make_weights(c, gen);
  const AttentionSpec spec = mha_spec(c);
  Generator rgen(54);
  const Tensor r = randn({c.b, c.t, c.dm}, DType::float64, rgen);
  auto run = [&](const Attention& a) {
    return test::run_mha(a, x, w.wq.data(), w.wk.data(), w.wv.data(), w.wo.data(), spec, r).all();
  };
  const std::vector<Tensor> f = run(fused()), b = run(batched());
  const char* names[] = {"out", "dx", "dwq", "dwk", "dwv", "dwo"};
  for (std::size_t i = 0; i < f.size(); ++i)
    EXPECT_TRUE(all_close(names[i], f[i], b[i], kAtol64, kRtol64));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FusedMha,
    ::testing::Values(MhaCase{"closed_book_causal", 2, 3, 8, 2, 2, true, false},
                      MhaCase{"b2_t5_d12_h3", 2, 5, 12, 3, 3, false, false},
                      MhaCase{"transposed_x_causal", 2, 5, 12, 3, 3, true, true},
                      MhaCase{"grouped_kv", 2, 4, 8, 4, 2, true, false},
                      MhaCase{"grouped_kv_g3_hkv2", 2, 5, 12, 6, 2, true, false},
                      MhaCase{"grouped_kv_g3_hkv2_full", 2, 5, 12, 6, 2, false, true}),
    [](const ::testing::TestParamInfo<MhaCase>& info) { return info.param.name; });

// ---------------------------------------------------------------- memory

// Peak bytes of tensor storage allocated on top of the inputs during one
// forward + backward of loss = sum(out * R), float32, [1, T, 64].
struct MemoryRun {
  std::size_t peak_extra;
  double seconds;
};

MemoryRun measure_core(const Attention& a, std::int64_t t) {
  Generator gen(61);
  const std::int64_t d = 64;
  const Tensor q = randn({1, t, d}, DType::float32, gen);
  const Tensor k = randn({1, t, d}, DType::float32, gen);
  const Tensor v = randn({1, t, d}, DType::float32, gen);
  const Tensor r = randn({1, t, d}, DType::float32, gen);
  const auto start = std::chrono::steady_clock::now();
  reset_peak_memory();
  const std::size_t base = memory_stats().current_bytes;
  {
    const Variable vq(q, true), vk(k, true), vv(v, true);
    const Variable out = a.core_forward(vq, vk, vv, AttentionSpec{});
    sum(mul(out, Variable(r))).backward();
    EXPECT_TRUE(all_finite("dq of the attended rows", vq.grad().narrow(1, 0, 4)));
  }
  const std::size_t peak = memory_stats().peak_bytes;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {peak - base, secs};
}

TEST_F(FusedSdpaTest, PeakMemoryGrowsLinearlyNotQuadratically) {
  const MemoryRun fused_1k = measure_core(fused(), 1024);
  const MemoryRun fused_4k = measure_core(fused(), 4096);
  const MemoryRun batched_4k = measure_core(batched(), 4096);
  constexpr double mib = 1024.0 * 1024.0;
  std::cout << "peak extra memory, core forward + backward, float32, [1, T, 64], not causal:\n"
            << "  fused_sdpa T=1024: " << fused_1k.peak_extra / mib << " MiB (" << fused_1k.seconds
            << " s)\n"
            << "  fused_sdpa T=4096: " << fused_4k.peak_extra / mib << " MiB (" << fused_4k.seconds
            << " s)\n"
            << "  batched    T=4096: " << batched_4k.peak_extra / mib << " MiB ("
            << batched_4k.seconds << " s); one [T, T] float32 buffer is 64 MiB\n"
            << "  fused growth 1024 -> 4096: "
            << static_cast<double>(fused_4k.peak_extra) / static_cast<double>(fused_1k.peak_extra)
            << "x (T^2 growth would be 16x)\n";
  EXPECT_GT(batched_4k.peak_extra, std::size_t{64} << 20);  // it does hold a [T, T] buffer
  EXPECT_LT(fused_4k.peak_extra * 8, batched_4k.peak_extra);
  EXPECT_LT(static_cast<double>(fused_4k.peak_extra),
            6.0 * static_cast<double>(fused_1k.peak_extra));
  EXPECT_LT(fused_4k.peak_extra, std::size_t{64} << 20);  // less than ONE [T, T] buffer
}

}  // namespace

}  // namespace test_fused_sdpa
