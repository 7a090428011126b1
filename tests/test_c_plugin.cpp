// The C ABI escape hatch (<headgrad/c_plugin.h>): naive_c, an attention core
// written in C99 with a hand-written backward, loads through the loader, passes
// a float64 gradient check, and agrees with fused_sdpa on out, dq, dk, dv;
// broken C plugins are skipped or report their error naming the plugin; and the
// headgrad program runs a suite comparing the two. Grouped KV heads (C ABI 2):
// naive_c agrees with fused_sdpa and per_head on k, v with Hkv < H heads; a
// plugin built against C ABI 1 still loads and runs, and is refused them.
//
// Shape legend: B batch, H (query) heads, Hkv kv heads, G = H / Hkv, Tq/Tk
// query/key lengths, d query/key width, dv value width.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "headgrad/attention.hpp"
#include "headgrad/c_plugin.h"
#include "headgrad/gradcheck.hpp"
#include "headgrad/loader.hpp"
#include "headgrad/ops.hpp"
#include "headgrad/plugin.hpp"
#include "checks.hpp"
#include "attention_run.hpp"

namespace test_c_plugin {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using headgrad::test::all_close;
using headgrad::test::expect_core_close;
using headgrad::test::contains;
using headgrad::test::CoreResult;
using headgrad::test::run_core;
namespace fs = std::filesystem;

const fs::path kCPluginDir = C_PLUGIN_DIR;                 // build/tests/c_plugin
const fs::path kBrokenCPluginDir = BROKEN_C_PLUGIN_DIR;    // build/tests/c_plugin_broken
const fs::path kCPluginV1Dir = C_PLUGIN_V1_DIR;            // build/tests/c_plugin_v1
const fs::path kV1GqaSuite = C_V1_GQA_SUITE;               // tests/c_plugin/c_v1_gqa.yaml
const fs::path kBuiltPluginDir = HEADGRAD_BUILD_PLUGIN_DIR;  // build/plugins
const fs::path kSuite = C_VS_FUSED_SUITE;                  // tests/c_plugin/c_vs_fused.yaml
const fs::path kHeadgrad = HEADGRAD_EXE;                   // build/tools/headgrad/headgrad

constexpr double kAtol64 = 1e-8;  // the float64 checking tolerances (docs/design.md)
constexpr double kRtol64 = 1e-6;
constexpr double kAtol32 = 2e-5;
constexpr double kRtol32 = 1e-4;

// The plugins, loaded once for the whole program: naive_c, failing_c,
// naive_c_top_left, naive_c_v1, fused_sdpa and per_head, each from its own file.
const PluginRegistry& registry() {
  static const std::unique_ptr<PluginRegistry> reg = [] {
    auto r = std::make_unique<PluginRegistry>();
    r->load_file(kCPluginDir / "naive_c.so");
    r->load_file(kBrokenCPluginDir / "failing_c.so");
    r->load_file(kBrokenCPluginDir / "naive_c_top_left.so");
    r->load_file(kCPluginV1Dir / "naive_c_v1.so");
    r->load_file(kBuiltPluginDir / "fused_sdpa" / "fused_sdpa.so");
    r->load_file(kBuiltPluginDir / "per_head" / "per_head.so");
    return r;
  }();
  return *reg;
}

const Attention& plugin(const std::string& name) { return *registry().get(name).attention; }

// A bool mask [rows, cols] from a seeded stream, about 70% attended, with the
// given query row fully masked (or none when it is out of range).
Tensor random_mask(std::int64_t rows, std::int64_t cols, std::uint64_t seed, std::int64_t masked_row) {
  Generator gen(seed);
  Tensor m = Tensor::empty({rows, cols}, DType::boolean);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) m.set({i, j}, i != masked_row && gen.uniform() < 0.7);
  return m;
}

// ---------------------------------------------------------------- cases

struct CoreCase {
  std::string name;
  std::int64_t B, H, Tq, Tk, d, dv;
  bool causal = false;
  bool mask = false;
  bool transposed = false;   // q, k, v as transposed views of their storage
  bool broadcast_kv = false; // k, v with one batch: broadcast over B
  CausalAlignment align = CausalAlignment::top_left;
  std::int64_t Hkv = 0;      // k, v heads; 0: H
};

std::string case_name(const ::testing::TestParamInfo<CoreCase>& info) { return info.param.name; }

const std::vector<CoreCase> kCases = {
    {"plain", 2, 3, 5, 5, 4, 4},
    {"causal", 2, 2, 6, 6, 4, 3, true},
    {"mask", 2, 2, 5, 7, 4, 4, false, true},
    {"causal_and_mask", 1, 3, 5, 7, 6, 6, true, true},
    {"cross_causal", 2, 2, 7, 4, 3, 5, true},
    {"transposed", 2, 2, 6, 6, 4, 4, true, false, true},
    {"broadcast_kv", 2, 2, 4, 5, 3, 3, false, true, false, true},
    {"bottom_right_decode", 2, 2, 1, 7, 4, 3, true, false, false, false, CausalAlignment::bottom_right},
    // Tq > Tk: queries 0..2 attend no key (zeros, zero gradients)
    {"bottom_right_tq_gt_tk_mask", 1, 2, 7, 4, 3, 5, true, true, false, false,
     CausalAlignment::bottom_right},
    // Grouped KV heads: 1 < Hkv < H and H != Hkv^2 (G = 4 > Hkv = 3), then MQA.
    {"gqa_causal", 2, 12, 5, 7, 4, 3, true, false, false, false, CausalAlignment::top_left, 3},
    {"gqa_mask_transposed", 2, 6, 5, 7, 3, 4, false, true, true, false, CausalAlignment::top_left, 2},
    {"gqa_broadcast_kv", 2, 4, 4, 5, 3, 3, true, false, false, true, CausalAlignment::top_left, 2},
    {"gqa_bottom_right_decode", 2, 6, 1, 7, 4, 3, true, false, false, false, CausalAlignment::bottom_right, 3},
    {"mqa", 2, 4, 6, 6, 4, 4, true, false, false, false, CausalAlignment::top_left, 1},
};

struct Inputs {
  Tensor q, k, v;
  AttentionSpec spec;
};

Inputs make_inputs(const CoreCase& c, DType dtype, std::uint64_t seed) {
  Generator gen(seed);
  auto make = [&](std::int64_t b, std::int64_t heads, std::int64_t rows, std::int64_t cols) {
    if (!c.transposed) return randn({b, heads, rows, cols}, DType::float64, gen).to(dtype);
    return randn({b, heads, cols, rows}, DType::float64, gen).to(dtype).transpose(-2, -1);
  };
  Inputs in;
  const std::int64_t bkv = c.broadcast_kv ? 1 : c.B, hkv = c.Hkv > 0 ? c.Hkv : c.H;
  in.q = make(c.B, c.H, c.Tq, c.d);
  in.k = make(bkv, hkv, c.Tk, c.d);
  in.v = make(bkv, hkv, c.Tk, c.dv);
  in.spec.causal = c.causal;
  in.spec.causal_alignment = c.align;
  if (c.mask) in.spec.mask = random_mask(c.Tq, c.Tk, seed + 5, /*masked_row=*/1);
  return in;
}

class CPluginAgreement : public ::testing::TestWithParam<CoreCase> {};

TEST_P(CPluginAgreement, MatchesFusedSdpaInFloat64) {
  const Inputs in = make_inputs(GetParam(), DType::float64, 11);
  const CoreResult c = run_core(plugin("naive_c"), in.q, in.k, in.v, in.spec, 1003);
  const CoreResult f = run_core(plugin("fused_sdpa"), in.q, in.k, in.v, in.spec, 1003);
  expect_core_close(c, f, kAtol64, kRtol64);
}

TEST_P(CPluginAgreement, MatchesFusedSdpaInFloat32) {
  const Inputs in = make_inputs(GetParam(), DType::float32, 12);
  const CoreResult c = run_core(plugin("naive_c"), in.q, in.k, in.v, in.spec, 1004);
  const CoreResult f = run_core(plugin("fused_sdpa"), in.q, in.k, in.v, in.spec, 1004);
  EXPECT_EQ(c.out.dtype(), DType::float32);
  expect_core_close(c, f, kAtol32, kRtol32);
}

// per_head, the oracle, slices kv head h / G for query head h (no kernel shared
// with either). Its core does not broadcast leading dims of k and v over q's,
// so the broadcast_kv cases are left out here.
class CPluginVsPerHead : public ::testing::TestWithParam<CoreCase> {};

std::vector<CoreCase> cases_per_head_takes() {
  std::vector<CoreCase> out;
  for (const CoreCase& c : kCases)
    if (!c.broadcast_kv) out.push_back(c);
  return out;
}

TEST_P(CPluginVsPerHead, MatchesPerHeadInFloat64) {
  const Inputs in = make_inputs(GetParam(), DType::float64, 14);
  const CoreResult c = run_core(plugin("naive_c"), in.q, in.k, in.v, in.spec, 1008);
  const CoreResult p = run_core(plugin("per_head"), in.q, in.k, in.v, in.spec, 1008);
  expect_core_close(c, p, kAtol64, kRtol64);
}

TEST_P(CPluginAgreement, PassesGradcheck) {
  const Inputs in = make_inputs(GetParam(), DType::float64, 13);
  const Attention& a = plugin("naive_c");
  const AttentionSpec spec = in.spec;
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Variable>& v) { return a.core_forward(v[0], v[1], v[2], spec); },
      {in.q, in.k, in.v});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_GT(r.elements_checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, CPluginAgreement, ::testing::ValuesIn(kCases), case_name);
INSTANTIATE_TEST_SUITE_P(Cases, CPluginVsPerHead, ::testing::ValuesIn(cases_per_head_takes()), case_name);

// ---------------------------------------------------------------- causal alignment

// [Tq, Tk] bool built by hand: query i attends keys j <= i + shift.
Tensor diagonal_mask(std::int64_t tq, std::int64_t tk, std::int64_t shift) {
  Tensor m = Tensor::empty({tq, tk}, DType::boolean);
  for (std::int64_t i = 0; i < tq; ++i)
    for (std::int64_t j = 0; j < tk; ++j) m.set({i, j}, j <= i + shift);
  return m;
}

TEST(CPluginCausal, BottomRightEqualsItsMaskBuiltByHand) {
  for (const auto& [tq, tk] : {std::pair<std::int64_t, std::int64_t>{1, 7}, {2, 5}, {5, 3}}) {
    SCOPED_TRACE("Tq " + std::to_string(tq) + ", Tk " + std::to_string(tk));
    Inputs in = make_inputs({"br", 2, 2, tq, tk, 4, 3, true}, DType::float64, 21);
    in.spec.causal_alignment = CausalAlignment::bottom_right;
    AttentionSpec by_hand;
    by_hand.mask = diagonal_mask(tq, tk, tk - tq);
    const CoreResult c = run_core(plugin("naive_c"), in.q, in.k, in.v, in.spec, 1006);
    expect_core_close(c, run_core(plugin("naive_c"), in.q, in.k, in.v, by_hand, 1006), 1e-14, 1e-12);
    // and it is not the top-left mask at these shapes
    AttentionSpec top_left = in.spec;
    top_left.causal_alignment = CausalAlignment::top_left;
    const CoreResult t = run_core(plugin("naive_c"), in.q, in.k, in.v, top_left, 1006);
    const std::vector<double> a = c.out.to_vector(), b = t.out.to_vector();
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
    EXPECT_GT(worst, 1e-3);
  }
}

// A plugin that predates bottom-right (no HG_CAP_CAUSAL_BOTTOM_RIGHT) fails the
// call if it sees HG_CAUSAL_BOTTOM_RIGHT; headgrad hands it a bool mask instead.
TEST(CPluginCausal, APluginWithoutBottomRightNeverSeesItAndStillAgrees) {
  const Capabilities& caps = registry().get("naive_c_top_left").info.capabilities;
  EXPECT_TRUE(caps.causal && caps.bool_mask);
  for (const auto& [tq, tk, mask] : {std::tuple<std::int64_t, std::int64_t, bool>{1, 7, false},
                                     {6, 6, false}, {7, 4, true}}) {
    SCOPED_TRACE("Tq " + std::to_string(tq) + ", Tk " + std::to_string(tk));
    Inputs in = make_inputs({"old", 2, 2, tq, tk, 4, 3, true, mask}, DType::float64, 22);
    in.spec.causal_alignment = CausalAlignment::bottom_right;
    const CoreResult old = run_core(plugin("naive_c_top_left"), in.q, in.k, in.v, in.spec, 1007);
    expect_core_close(old, run_core(plugin("naive_c"), in.q, in.k, in.v, in.spec, 1007), 1e-14, 1e-12);
  }
}

TEST(CPluginCausal, ANonBoolMaskIsRefusedNamingThePluginOnEveryPath) {
  Generator gen(23);
  const Variable q(randn({1, 1, 2, 4}, DType::float64, gen)), k(randn({1, 1, 5, 4}, DType::float64, gen));
  AttentionSpec spec;
  spec.causal = true;
  spec.causal_alignment = CausalAlignment::bottom_right;
  spec.mask = Tensor::zeros({2, 5}, DType::float64);
  for (const char* name : {"naive_c", "naive_c_top_left"})
    headgrad::test::expect_invalid([&] { (void)plugin(name).core_forward(q, k, k, spec); },
                                   {"plugin '" + std::string(name) + "'", "must be bool", "float64"});
}

// ---------------------------------------------------------------- loading

TEST(CPlugin, LoadsAsACoreLevelPlugin) {
  const LoadedPlugin& p = registry().get("naive_c");
  EXPECT_EQ(p.file, kCPluginDir / "naive_c.so");
  EXPECT_EQ(p.abi_version, HEADGRAD_C_ABI_VERSION);
  EXPECT_EQ(p.info.version, "1.0.0");
  EXPECT_TRUE(contains(p.info.description, "C99"));
  const Capabilities& c = p.info.capabilities;
  EXPECT_TRUE(c.core);
  EXPECT_FALSE(c.mha);
  EXPECT_TRUE(c.causal && c.bool_mask && c.cross_lengths && c.float32 && c.float64);
  EXPECT_FALSE(c.dropout);
  EXPECT_TRUE(contains(capabilities_str(c), "c-abi"));
}

TEST(CPlugin, HasNoMhaLevel) {
  Generator gen(1);
  const Variable x(randn({1, 2, 4}, DType::float64, gen));
  EXPECT_THROW((void)plugin("naive_c").mha_forward(x, MhaWeights{}, AttentionSpec{}), UnsupportedError);
}

TEST(CPlugin, WrongCAbiVersionIsSkipped) {
  PluginRegistry reg;
  EXPECT_FALSE(reg.load_file(kBrokenCPluginDir / "c_wrong_abi.so"));
  ASSERT_EQ(reg.rejections().size(), 1u);
  EXPECT_TRUE(contains(reg.rejections()[0].reason,
                       "C ABI version " + std::to_string(HEADGRAD_C_ABI_VERSION + 41) + ", expected " +
                           std::to_string(HEADGRAD_C_ABI_MIN_VERSION) + " to " +
                           std::to_string(HEADGRAD_C_ABI_VERSION)));
}

// ---------------------------------------------------------------- C ABI 1 and grouped KV heads

TEST(CPluginAbi1, DeclaresGroupedKvOnlyFromVersion2) {
  const LoadedPlugin& v2 = registry().get("naive_c");  // the current build: C ABI 3
  EXPECT_EQ(v2.abi_version, HEADGRAD_C_ABI_VERSION);
  EXPECT_TRUE(v2.info.capabilities.grouped_kv);
  EXPECT_TRUE(contains(capabilities_str(v2.info.capabilities), "grouped_kv"));
  // C ABI 3: the window, the cap and the sinks, which a version-1 build cannot declare
  EXPECT_TRUE(v2.info.capabilities.window && v2.info.capabilities.softcap && v2.info.capabilities.sinks);
  const LoadedPlugin& v1 = registry().get("naive_c_v1");
  EXPECT_EQ(v1.abi_version, 1);
  EXPECT_FALSE(v1.info.capabilities.grouped_kv);
  EXPECT_FALSE(contains(capabilities_str(v1.info.capabilities), "grouped_kv"));
  EXPECT_FALSE(v1.info.capabilities.window || v1.info.capabilities.softcap || v1.info.capabilities.sinks);
  EXPECT_TRUE(v1.info.capabilities.core && v1.info.capabilities.causal && v1.info.capabilities.bool_mask);
}

// The version-1 entry point still runs: the same numbers as the version-2 build.
TEST(CPluginAbi1, StillRunsAndAgreesWithTheCurrentBuild) {
  for (const CoreCase& c : {CoreCase{"plain", 2, 3, 5, 5, 4, 4}, CoreCase{"mask", 2, 2, 5, 7, 4, 4, true, true}}) {
    SCOPED_TRACE(c.name);
    const Inputs in = make_inputs(c, DType::float64, 31);
    expect_core_close(run_core(plugin("naive_c_v1"), in.q, in.k, in.v, in.spec, 1009),
                      run_core(plugin("naive_c"), in.q, in.k, in.v, in.spec, 1009), 1e-14, 1e-12);
  }
}

TEST(CPluginAbi1, IsRefusedGroupedKvHeadsNamingTheCapability) {
  const Inputs in = make_inputs({"gqa", 2, 12, 5, 7, 4, 4, true, false, false, false, CausalAlignment::top_left, 3},
                                DType::float64, 32);
  try {
    (void)plugin("naive_c_v1").core_forward(Variable(in.q), Variable(in.k), Variable(in.v), in.spec);
    FAIL() << "naive_c_v1 was handed grouped KV heads";
  } catch (const UnsupportedError& e) {
    for (const char* part : {"plugin 'naive_c_v1' (C ABI)", "HG_CAP_GROUPED_KV", "Hkv = 3", "H = 12"})
      EXPECT_TRUE(contains(e.what(), part));
  }
}

// One kv head was plain broadcasting before C ABI 2 (stride 0 over the heads):
// a version-1 plugin still gets it so, and it equals the grouped path of version 2.
TEST(CPluginAbi1, OneKvHeadIsStillBroadcastForIt) {
  const Inputs in = make_inputs({"mqa", 2, 4, 6, 6, 4, 4, true, false, false, false, CausalAlignment::top_left, 1},
                                DType::float64, 33);
  const CoreResult old = run_core(plugin("naive_c_v1"), in.q, in.k, in.v, in.spec, 1010);
  EXPECT_EQ(old.dk.shape(), in.k.shape());
  expect_core_close(old, run_core(plugin("naive_c"), in.q, in.k, in.v, in.spec, 1010), 1e-14, 1e-12);
}

// H not a multiple of Hkv is bad input, named as such, for either build.
TEST(CPluginGroupedKv, HNotAMultipleOfHkvIsInvalid) {
  Generator gen(34);
  const Variable q(randn({1, 6, 3, 4}, DType::float64, gen)), k(randn({1, 4, 3, 4}, DType::float64, gen));
  for (const char* name : {"naive_c", "naive_c_v1"})
    headgrad::test::expect_invalid([&] { (void)plugin(name).core_forward(q, k, k, AttentionSpec{}); },
                                   {"plugin '" + std::string(name) + "'", "H = 6", "Hkv = 4", "multiple"});
}

// A kv head's gradient is the sum over its group: with every query head of a
// group given the same q, dk of the kv head is G times one member's dk in plain
// multi-head (each member with its own copy of the kv head).
TEST(CPluginGroupedKv, KvGradientIsTheSumOverTheGroup) {
  Generator gen(35);
  const std::int64_t B = 2, Hkv = 2, G = 3, T = 5, d = 4;
  const Tensor q1 = randn({B, Hkv, 1, T, d}, DType::float64, gen);
  const Tensor q = q1.expand({B, Hkv, G, T, d}).contiguous().reshape({B, Hkv * G, T, d});
  const Tensor k = randn({B, Hkv, T, d}, DType::float64, gen), v = randn({B, Hkv, T, d}, DType::float64, gen);
  AttentionSpec spec;
  spec.causal = true;
  Variable vq(q, true), vk(k, true), vv(v, true);
  Variable out = plugin("naive_c").core_forward(vq, vk, vv, spec);
  sum(out).backward();  // loss = sum(out): every member of a group sends the same gradient
  Variable mq(q1.reshape({B, Hkv, T, d}), true), mk(k, true), mv(v, true);
  sum(plugin("naive_c").core_forward(mq, mk, mv, spec)).backward();
  const std::vector<double> dk = vk.grad().to_vector(), dk1 = mk.grad().to_vector();
  const std::vector<double> dv = vv.grad().to_vector(), dv1 = mv.grad().to_vector();
  ASSERT_EQ(dk.size(), dk1.size());
  for (std::size_t i = 0; i < dk.size(); ++i) {
    EXPECT_NEAR(dk[i], G * dk1[i], 1e-12 * (1 + std::abs(dk[i])));
    EXPECT_NEAR(dv[i], G * dv1[i], 1e-12 * (1 + std::abs(dv[i])));
  }
}

TEST(CPlugin, DescriptorWithoutForwardIsSkipped) {
  PluginRegistry reg;
  EXPECT_FALSE(reg.load_file(kBrokenCPluginDir / "c_no_forward.so"));
  ASSERT_EQ(reg.rejections().size(), 1u);
  EXPECT_TRUE(contains(reg.rejections()[0].reason, "bad C plugin descriptor"));
  EXPECT_TRUE(contains(reg.rejections()[0].reason, "'c_no_forward': core_forward is NULL"));
}

// ---------------------------------------------------------------- errors

TEST(CPlugin, AnErrorFromCIsRaisedWithItsMessageNamingThePlugin) {
  Generator gen(2);
  const Variable q(randn({1, 1, 3, 4}, DType::float64, gen)), k(randn({1, 1, 5, 4}, DType::float64, gen));
  try {
    (void)plugin("failing_c").core_forward(q, k, k, AttentionSpec{});
    FAIL() << "failing_c's core_forward did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(contains(e.what(), "plugin 'failing_c'"));
    EXPECT_TRUE(contains(e.what(), "core_forward failed with code 7"));
    EXPECT_TRUE(contains(e.what(), "simulated device failure: out of memory (3 x 5)"));
  }
}

TEST(CPlugin, SettingsBeyondTheCapabilitiesAreUnsupported) {
  Generator gen(3);
  const Variable q(randn({1, 1, 3, 4}, DType::float64, gen));
  const Variable q32(randn({1, 1, 3, 4}, DType::float32, gen));
  AttentionSpec causal;
  causal.causal = true;
  EXPECT_THROW((void)plugin("failing_c").core_forward(q, q, q, causal), UnsupportedError);  // float64 only
  EXPECT_THROW((void)plugin("failing_c").core_forward(q32, q32, q32, {}), UnsupportedError);
  AttentionSpec dropout;
  dropout.dropout_p = 0.1;
  EXPECT_THROW((void)plugin("naive_c").core_forward(q, q, q, dropout), UnsupportedError);
}

TEST(CPlugin, FullyMaskedRowGivesZerosAndFiniteGradients) {
  Generator gen(4);
  const Tensor q = randn({1, 2, 3, 4}, DType::float64, gen), k = randn({1, 2, 3, 4}, DType::float64, gen);
  AttentionSpec spec;
  spec.mask = random_mask(3, 3, 9, /*masked_row=*/0);
  const CoreResult c = run_core(plugin("naive_c"), q, k, k, spec, 1005);
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(c.out.at({0, h, 0, j}), 0.0);
      EXPECT_EQ(c.dq.at({0, h, 0, j}), 0.0);
    }
  for (const Tensor* t : {&c.out, &c.dq, &c.dk, &c.dv})
    for (double x : t->to_vector()) EXPECT_TRUE(std::isfinite(x));
}

// The graph holds the C library: its backward runs after the registry is gone.
TEST(CPlugin, GraphOutlivesItsRegistry) {
  Generator gen(5);
  Variable q(randn({2, 3, 4}, DType::float64, gen), true);
  Variable out;
  {
    PluginRegistry reg;
    ASSERT_TRUE(reg.load_file(kCPluginDir / "naive_c.so"));
    out = reg.get("naive_c").attention->core_forward(q, q, q, AttentionSpec{});
  }
  sum(out).backward();
  ASSERT_TRUE(q.grad().defined());
  EXPECT_EQ(q.grad().shape(), (Shape{2, 3, 4}));
}

// ---------------------------------------------------------------- the program

// Runs a command through the shell; returns its exit code and its output.
std::pair<int, std::string> run(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(CPluginProgram, ListsTheCPlugin) {
  const auto [code, out] = run(kHeadgrad.string() + " plugins --plugin-path " + kCPluginDir.string());
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(contains(out, "naive_c"));
  EXPECT_TRUE(contains(out, "c-abi"));
}

TEST(CPluginProgram, SuiteAgainstFusedSdpaPasses) {
  const auto [code, out] =
      run(kHeadgrad.string() + " run " + kSuite.string() + " --plugin-path " + kCPluginDir.string());
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(contains(out, "naive_c"));
  EXPECT_TRUE(contains(out, "Hkv=3")) << out;  // the grouped-kv cases ran
}

TEST(CPluginProgram, AVersion1PluginInAGroupedKvCaseExits2NamingTheCapability) {
  const auto [code, out] =
      run(kHeadgrad.string() + " run " + kV1GqaSuite.string() + " --plugin-path " + kCPluginV1Dir.string());
  EXPECT_EQ(code, 2) << out;
  EXPECT_TRUE(contains(out, "plugin 'naive_c_v1' lacks the capability 'grouped_kv'")) << out;
}

}  // namespace

}  // namespace test_c_plugin
