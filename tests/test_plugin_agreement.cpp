// The attention plugins against finite differences, against each other, and
// against a hand-written oracle.
//
// Every plugin is loaded once per test suite from the build's plugin folder.
// Each comparison hands the SAME input, weight and R tensors to both sides; each
// side wraps them in its own fresh leaf Variables, builds its own graph and runs
// its own backward of loss = sum(out * R).
//
// The plugins are the files the build lists (real_plugins.hpp): one that is
// missing or rejected fails every test that needs it, and the suite's first
// test names it.
//
// Shape legend: B batch, [...] leading dims, T sequence, Tq/Tk query/key lengths,
// D model width, H query heads, Hkv key/value heads, d = D / H head width,
// dv value width.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "headgrad/attention.hpp"
#include "headgrad/gradcheck.hpp"
#include "headgrad/loader.hpp"
#include "headgrad/ops.hpp"
#include "headgrad/plugin.hpp"
#include "attention_run.hpp"
#include "checks.hpp"
#include "real_plugins.hpp"

namespace test_plugin_agreement {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using headgrad::test::all_close;
using headgrad::test::expect_core_close;
using headgrad::test::all_finite;
using headgrad::test::CoreResult;
using headgrad::test::MhaResult;

// Tolerances: all_close's defaults, the float64 checking ones of docs/design.md (1e-8, 1e-6).

// ---------------------------------------------------------------- helpers

// A bool mask of `shape` [..., Tq, Tk], True = attend, random, in which every
// row keeps at least one key j <= i (so it keeps one under causal too).
Tensor random_mask(const Shape& shape, Generator& gen) {
  Tensor m = Tensor::empty(shape, DType::boolean);
  const std::int64_t tq = shape[shape.size() - 2], tk = shape.back();
  for (std::int64_t e = 0; e < m.numel(); ++e) m.set_flat(e, gen.uniform() < 0.6 ? 1.0 : 0.0);
  for (std::int64_t row = 0; row < m.numel() / tk; ++row) {
    const std::int64_t i = row % tq, allowed = std::min(i, tk - 1) + 1;
    const auto j = static_cast<std::int64_t>(gen.uniform() * static_cast<double>(allowed));
    m.set_flat(row * tk + j, 1.0);
  }
  return m;
}

// How an input reaches the plugin: its own contiguous tensor, a transposed view
// of a tensor stored the other way round, or a narrowed slice of a wider one.
enum class Layout { contiguous, transposed, narrowed };

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::transposed: return "transposed";
    case Layout::narrowed: return "narrowed";
  }
  return "?";
}

// A random [..., R, C] tensor laid out as `layout` asks (the values differ per
// layout; only the strides matter here).
Tensor make_input(const Shape& shape, Layout layout, Generator& gen) {
  const std::int64_t n = static_cast<std::int64_t>(shape.size());
  switch (layout) {
    case Layout::contiguous: return randn(shape, DType::float64, gen);
    case Layout::transposed: {  // stored [..., C, R]
      Shape stored = shape;
      std::swap(stored[static_cast<std::size_t>(n - 1)], stored[static_cast<std::size_t>(n - 2)]);
      return randn(stored, DType::float64, gen).transpose(n - 2, n - 1);
    }
    case Layout::narrowed: {  // columns [1, C + 1) of [..., R, C + 3]
      Shape stored = shape;
      stored.back() += 3;
      return randn(stored, DType::float64, gen).narrow(n - 1, 1, shape.back());
    }
  }
  return {};
}

AttentionSpec mha_spec(std::int64_t d_model, std::int64_t heads, bool causal,
                       std::int64_t kv_heads = 0) {
  AttentionSpec spec;
  spec.d_model = d_model;
  spec.num_heads = heads;
  spec.num_kv_heads = kv_heads;
  spec.causal = causal;
  return spec;
}

// ---- the MHA level: shared inputs, one run per plugin ----

struct MhaInputs {
  Tensor x;                // [..., T, D]
  Tensor wq, wk, wv, wo;   // [D, D], [Hkv*d, D], [Hkv*d, D], [D, D]
  Tensor r;                // [..., T, D]
};

MhaInputs make_mha_inputs(const Shape& x_shape, std::int64_t heads, std::int64_t kv_heads,
                          Layout layout, std::uint64_t seed) {
  Generator gen(seed);
  const std::int64_t dm = x_shape.back(), d = dm / heads;
  MhaInputs in;
  in.x = make_input(x_shape, layout, gen);
  in.wq = randn({dm, dm}, DType::float64, gen, 0.5);
  in.wk = randn({kv_heads * d, dm}, DType::float64, gen, 0.5);
  in.wv = randn({kv_heads * d, dm}, DType::float64, gen, 0.5);
  in.wo = randn({dm, dm}, DType::float64, gen, 0.5);
  in.r = randn(x_shape, DType::float64, gen);
  return in;
}

MhaResult run_mha(const Attention& plugin, const MhaInputs& in, const AttentionSpec& spec) {
  return test::run_mha(plugin, in.x, in.wq, in.wk, in.wv, in.wo, spec, in.r);
}

void expect_mha_agree(const MhaResult& a, const MhaResult& b) {
  EXPECT_TRUE(all_close("out", a.out, b.out));
  EXPECT_TRUE(all_close("dX", a.dx, b.dx));
  EXPECT_TRUE(all_close("dWq", a.dwq, b.dwq));
  EXPECT_TRUE(all_close("dWk", a.dwk, b.dwk));
  EXPECT_TRUE(all_close("dWv", a.dwv, b.dwv));
  EXPECT_TRUE(all_close("dWo", a.dwo, b.dwo));
}

// ---- the core level ----

struct CoreInputs {
  Tensor q, k, v;  // [B, H, Tq, d], [B, H, Tk, d], [B, H, Tk, dv]
  Tensor r;        // [B, H, Tq, dv]
};

CoreResult run_core(const Attention& plugin, const CoreInputs& in, const AttentionSpec& spec) {
  return test::run_core(plugin, in.q, in.k, in.v, spec, in.r);
}

// The composed core (attention_core, autodiff's backward) under spec.
CoreResult run_composed_core(const CoreInputs& in, const AttentionSpec& spec) {
  return test::run_core([&](const Variable& q, const Variable& k, const Variable& v) {
    return attention_core(q, k, v, spec);
  }, in.q, in.k, in.v, in.r);
}

// ---------------------------------------------------------------- the fixture

// Loads the built plugins once per test suite and keeps the registry (and so
// every plugin library) alive until the suite ends: Variables a plugin makes
// carry backward code from its library.
class PluginTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = std::make_unique<PluginRegistry>();
    load_problems_ = test::load_real_plugins(*registry_);
  }
  static void TearDownTestSuite() { registry_.reset(); }

  static const Attention& plugin(const std::string& name) {
    return *registry_->get(name).attention;
  }

  // Fails the test when a plugin it needs did not load, with the loader's reason.
  static void require_plugins(const std::vector<std::string>& names) {
    for (const auto& name : names)
      if (!registry_->find(name)) FAIL() << "plugin '" << name << "' is not loaded:\n" << load_problems_;
  }

  static inline std::unique_ptr<PluginRegistry> registry_;
  static inline std::string load_problems_;
};

const std::vector<std::string> kPlugins = {"per_head", "batched", "fused_sdpa"};

using PluginPair = std::pair<std::string, std::string>;
const std::vector<PluginPair> kPairs = {
    {"per_head", "batched"}, {"per_head", "fused_sdpa"}, {"batched", "fused_sdpa"}};

std::string pair_name(const PluginPair& p) { return p.first + "_vs_" + p.second; }

TEST_F(PluginTest, TheRealVariantsLoad) {
  EXPECT_EQ(load_problems_, "");
  ASSERT_EQ(test::real_plugin_files().size(), kPlugins.size());
  for (const std::string& name : kPlugins) {
    const LoadedPlugin* p = registry_->find(name);
    ASSERT_NE(p, nullptr) << name << " not loaded:\n" << load_problems_;
    EXPECT_EQ(p->abi_version, plugin_abi_version);
    const Capabilities& c = p->info.capabilities;
    EXPECT_TRUE(c.mha && c.core && c.causal && c.bool_mask && c.cross_lengths && c.grouped_kv)
        << name << ": " << capabilities_str(c);
  }
}

// ---------------------------------------------------------------- 1. gradcheck

struct GradcheckCase {
  std::string plugin;
  bool causal;
  Layout layout;
};

void PrintTo(const GradcheckCase& c, std::ostream* os) {
  *os << c.plugin << (c.causal ? " causal " : " full ") << layout_name(c.layout);
}

std::string gradcheck_name(const ::testing::TestParamInfo<GradcheckCase>& info) {
  return info.param.plugin + (info.param.causal ? "_causal_" : "_full_") +
         layout_name(info.param.layout);
}

std::vector<GradcheckCase> gradcheck_cases() {
  std::vector<GradcheckCase> cases;
  for (const auto& p : kPlugins)
    for (bool causal : {false, true})
      for (Layout l : {Layout::contiguous, Layout::transposed, Layout::narrowed})
        cases.push_back({p, causal, l});
  return cases;
}

class Gradcheck : public PluginTest, public ::testing::WithParamInterface<GradcheckCase> {
 protected:
  void SetUp() override { require_plugins({GetParam().plugin}); }
};

// x [B=2, T=3, D=4], H=2 (d=2): inputs x (laid out as the case says), wq, wk, wv, wo.
TEST_P(Gradcheck, MhaLevel) {
  const auto& c = GetParam();
  const Attention& p = plugin(c.plugin);
  const MhaInputs in = make_mha_inputs({2, 3, 4}, 2, 2, c.layout, 11);
  EXPECT_EQ(in.x.is_contiguous(), c.layout == Layout::contiguous);
  const AttentionSpec spec = mha_spec(4, 2, c.causal);
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Variable>& v) {
        return p.mha_forward(v[0], MhaWeights{v[1], v[2], v[3], v[4]}, spec);
      },
      {in.x, in.wq, in.wk, in.wv, in.wo});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.elements_checked, 24 + 4 * 16);
}

// q [B=1, H=2, Tq=3, d=2], k [1, 2, Tk=4, 2], v [1, 2, 4, 2], each laid out as the case says.
TEST_P(Gradcheck, CoreLevel) {
  const auto& c = GetParam();
  const Attention& p = plugin(c.plugin);
  Generator gen(12);
  const Tensor q = make_input({1, 2, 3, 2}, c.layout, gen);
  const Tensor k = make_input({1, 2, 4, 2}, c.layout, gen);
  const Tensor v = make_input({1, 2, 4, 2}, c.layout, gen);
  AttentionSpec spec;
  spec.causal = c.causal;
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Variable>& in) { return p.core_forward(in[0], in[1], in[2], spec); },
      {q, k, v});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.elements_checked, 12 + 16 + 16);
}

INSTANTIATE_TEST_SUITE_P(Plugins, Gradcheck, ::testing::ValuesIn(gradcheck_cases()),
                         gradcheck_name);

// ---------------------------------------------------------------- 2. MHA agreement

struct MhaShape {
  std::string name;
  Shape x_shape;  // [..., T, D]
  std::int64_t heads;
  Layout layout = Layout::contiguous;
};

const std::vector<MhaShape> kMhaShapes = {
    {"closed_book_B2_T3_D8_H2", {2, 3, 8}, 2},
    {"B2_T5_D12_H3", {2, 5, 12}, 3},
    {"B2_T5_D12_H1", {2, 5, 12}, 1},
    {"B2_T4_D8_H4", {2, 4, 8}, 4},
    {"lead2x2_T4_D8_H2", {2, 2, 4, 8}, 2},
    {"B2_T5_D12_H3_x_transposed", {2, 5, 12}, 3, Layout::transposed},
    {"B2_T5_D12_H3_x_narrowed", {2, 5, 12}, 3, Layout::narrowed},
    // long enough for batched's block-causal core: 128-row blocks and a partial one
    {"B1_T300_D8_H2_row_blocks", {1, 300, 8}, 2},
};

void PrintTo(const MhaShape& s, std::ostream* os) { *os << s.name; }

using MhaAgreementCase = std::tuple<PluginPair, MhaShape, bool>;

class MhaAgreement : public PluginTest, public ::testing::WithParamInterface<MhaAgreementCase> {
 protected:
  void SetUp() override {
    const auto& pair = std::get<0>(GetParam());
    require_plugins({pair.first, pair.second});
  }
};

TEST_P(MhaAgreement, OutAndAllGradients) {
  const auto& [pair, shape, causal] = GetParam();
  const MhaInputs in = make_mha_inputs(shape.x_shape, shape.heads, shape.heads, shape.layout, 7);
  const std::vector<double> x_before = in.x.to_vector();
  const AttentionSpec spec = mha_spec(shape.x_shape.back(), shape.heads, causal);
  const MhaResult a = run_mha(plugin(pair.first), in, spec);
  const MhaResult b = run_mha(plugin(pair.second), in, spec);
  EXPECT_EQ(a.out.shape(), shape.x_shape);
  expect_mha_agree(a, b);
  EXPECT_EQ(in.x.to_vector(), x_before) << "a plugin wrote into its input";
}

INSTANTIATE_TEST_SUITE_P(
    Plugins, MhaAgreement,
    ::testing::Combine(::testing::ValuesIn(kPairs), ::testing::ValuesIn(kMhaShapes),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<MhaAgreementCase>& info) {
      return pair_name(std::get<0>(info.param)) + "__" + std::get<1>(info.param).name + "__" +
             (std::get<2>(info.param) ? "causal" : "full");
    });

// ---------------------------------------------------------------- 3. core agreement

struct CoreShape {
  std::string name;
  std::int64_t b, h, tq, tk, d, dv;
};

const std::vector<CoreShape> kCoreShapes = {
    {"B2_H3_Tq5_Tk7_d4", 2, 3, 5, 7, 4, 4},
    {"B1_H2_Tq7_Tk5_d4_dv3", 1, 2, 7, 5, 4, 3},
};

void PrintTo(const CoreShape& s, std::ostream* os) { *os << s.name; }

// Which bool mask (True = attend) the spec carries besides `causal`.
enum class MaskKind { none, full, broadcast };  // -, [B, H, Tq, Tk], [Tq, Tk]

const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::none: return "nomask";
    case MaskKind::full: return "mask_BHTqTk";
    case MaskKind::broadcast: return "mask_TqTk";
  }
  return "?";
}

void PrintTo(MaskKind m, std::ostream* os) { *os << mask_name(m); }

using CoreAgreementCase = std::tuple<PluginPair, CoreShape, bool, MaskKind>;

class CoreAgreement : public PluginTest,
                      public ::testing::WithParamInterface<CoreAgreementCase> {
 protected:
  void SetUp() override {
    const auto& pair = std::get<0>(GetParam());
    require_plugins({pair.first, pair.second});
  }
};

TEST_P(CoreAgreement, OutAndGradients) {
  const auto& [pair, s, causal, mask] = GetParam();
  Generator gen(21);
  CoreInputs in;
  in.q = randn({s.b, s.h, s.tq, s.d}, DType::float64, gen);
  in.k = randn({s.b, s.h, s.tk, s.d}, DType::float64, gen);
  in.v = randn({s.b, s.h, s.tk, s.dv}, DType::float64, gen);
  in.r = randn({s.b, s.h, s.tq, s.dv}, DType::float64, gen);
  AttentionSpec spec;
  spec.causal = causal;
  if (mask == MaskKind::full) spec.mask = random_mask({s.b, s.h, s.tq, s.tk}, gen);
  if (mask == MaskKind::broadcast) spec.mask = random_mask({s.tq, s.tk}, gen);
  const CoreResult a = run_core(plugin(pair.first), in, spec);
  const CoreResult b = run_core(plugin(pair.second), in, spec);
  EXPECT_EQ(a.out.shape(), (Shape{s.b, s.h, s.tq, s.dv}));
  expect_core_close(a, b);
}

INSTANTIATE_TEST_SUITE_P(
    Plugins, CoreAgreement,
    ::testing::Combine(::testing::ValuesIn(kPairs), ::testing::ValuesIn(kCoreShapes),
                       ::testing::Bool(),
                       ::testing::Values(MaskKind::none, MaskKind::full, MaskKind::broadcast)),
    [](const ::testing::TestParamInfo<CoreAgreementCase>& info) {
      return pair_name(std::get<0>(info.param)) + "__" + std::get<1>(info.param).name + "__" +
             (std::get<2>(info.param) ? "causal" : "full") + "__" +
             mask_name(std::get<3>(info.param));
    });

// ---------------------------------------------------------------- 4. the oracle

// Multi-head attention by hand, with nothing from headgrad's ops: plain loops
// over row-major std::vector<double>. x [B, T, D], wq/wo [D, D], wk/wv
// [Hkv*d, D] -> out [B, T, D]. Query head h reads key/value head h / (H / Hkv).
std::vector<double> oracle_mha(const std::vector<double>& x, const std::vector<double>& wq,
                               const std::vector<double>& wk, const std::vector<double>& wv,
                               const std::vector<double>& wo, std::size_t batch, std::size_t t,
                               std::size_t dm, std::size_t heads, std::size_t kv_heads,
                               bool causal) {
  const std::size_t d = dm / heads, dkv = kv_heads * d, group = heads / kv_heads;
  // y [T, rows] = x_b [T, D] W^T, W [rows, D]
  auto project = [&](std::size_t b, const std::vector<double>& w, std::size_t rows) {
    std::vector<double> y(t * rows, 0.0);
    for (std::size_t i = 0; i < t; ++i)
      for (std::size_t o = 0; o < rows; ++o)
        for (std::size_t c = 0; c < dm; ++c) y[i * rows + o] += x[(b * t + i) * dm + c] * w[o * dm + c];
    return y;
  };
  std::vector<double> out(batch * t * dm, 0.0);
  for (std::size_t b = 0; b < batch; ++b) {
    const std::vector<double> q = project(b, wq, dm), k = project(b, wk, dkv),
                              v = project(b, wv, dkv);
    std::vector<double> concat(t * dm, 0.0);  // head h in columns [h*d, (h+1)*d)
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t g = h / group;
      for (std::size_t i = 0; i < t; ++i) {
        const std::size_t keys = causal ? i + 1 : t;  // causal: keys j <= i
        std::vector<double> p(keys);
        for (std::size_t j = 0; j < keys; ++j) {
          double s = 0.0;
          for (std::size_t c = 0; c < d; ++c) s += q[i * dm + h * d + c] * k[j * dkv + g * d + c];
          p[j] = s / std::sqrt(static_cast<double>(d));
        }
        const double mx = *std::max_element(p.begin(), p.end());
        double total = 0.0;
        for (double& e : p) total += (e = std::exp(e - mx));
        for (double& e : p) e /= total;
        for (std::size_t c = 0; c < d; ++c)
          for (std::size_t j = 0; j < keys; ++j)
            concat[i * dm + h * d + c] += p[j] * v[j * dkv + g * d + c];
      }
    }
    for (std::size_t i = 0; i < t; ++i)
      for (std::size_t o = 0; o < dm; ++o)
        for (std::size_t c = 0; c < dm; ++c)
          out[(b * t + i) * dm + o] += concat[i * dm + c] * wo[o * dm + c];
  }
  return out;
}

struct OracleCase {
  std::string name;
  std::int64_t b, t, dm, h, hkv;
  bool causal;
};

const std::vector<OracleCase> kOracleCases = {
    {"B1_T2_D2_H1_full", 1, 2, 2, 1, 1, false},
    {"B1_T2_D2_H1_causal", 1, 2, 2, 1, 1, true},
    {"B1_T3_D4_H2_full", 1, 3, 4, 2, 2, false},
    {"B1_T3_D4_H2_causal", 1, 3, 4, 2, 2, true},
    {"B2_T3_D8_H4_Hkv2_causal", 2, 3, 8, 4, 2, true},
};

void PrintTo(const OracleCase& c, std::ostream* os) { *os << c.name; }

class Oracle : public PluginTest,
               public ::testing::WithParamInterface<std::tuple<std::string, OracleCase>> {
 protected:
  void SetUp() override { require_plugins({std::get<0>(GetParam())}); }
};

TEST_P(Oracle, OutputMatchesHandWrittenLoops) {
  const auto& [name, c] = GetParam();
  const MhaInputs in = make_mha_inputs({c.b, c.t, c.dm}, c.h, c.hkv, Layout::contiguous, 31);
  const AttentionSpec spec = mha_spec(c.dm, c.h, c.causal, c.hkv);
  Tensor out;
  {
    NoGradGuard no_grad;
    out = plugin(name).mha_forward(Variable(in.x), MhaWeights{Variable(in.wq), Variable(in.wk),
                                                             Variable(in.wv), Variable(in.wo)},
                                   spec).data();
  }
  auto u = [](std::int64_t n) { return static_cast<std::size_t>(n); };
  const std::vector<double> want =
      oracle_mha(in.x.to_vector(), in.wq.to_vector(), in.wk.to_vector(), in.wv.to_vector(),
                 in.wo.to_vector(), u(c.b), u(c.t), u(c.dm), u(c.h), u(c.hkv), c.causal);
  EXPECT_TRUE(all_close("out vs oracle", out, Tensor::from_values(want, {c.b, c.t, c.dm},
                                                                  DType::float64),
                        1e-12, 1e-12));
}

INSTANTIATE_TEST_SUITE_P(
    Plugins, Oracle,
    ::testing::Combine(::testing::ValuesIn(kPlugins), ::testing::ValuesIn(kOracleCases)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, OracleCase>>& info) {
      return std::get<0>(info.param) + "__" + std::get<1>(info.param).name;
    });

// ---------------------------------------------------------------- 5. grouped KV heads

using GqaCase = std::tuple<std::int64_t, bool>;  // Hkv, causal

class GroupedKv : public PluginTest, public ::testing::WithParamInterface<GqaCase> {
 protected:
  void SetUp() override { require_plugins({"per_head", "batched"}); }
};

// H=4 query heads over Hkv key/value heads: wk, wv are [Hkv*d, D].
TEST_P(GroupedKv, PerHeadAndBatchedAgree) {
  const auto& [kv_heads, causal] = GetParam();
  const std::int64_t heads = 4, dm = 8, d = dm / heads;
  const MhaInputs in = make_mha_inputs({2, 5, dm}, heads, kv_heads, Layout::contiguous, 41);
  ASSERT_EQ(in.wk.shape(), (Shape{kv_heads * d, dm}));
  const AttentionSpec spec = mha_spec(dm, heads, causal, kv_heads);
  const MhaResult a = run_mha(plugin("per_head"), in, spec);
  const MhaResult b = run_mha(plugin("batched"), in, spec);
  expect_mha_agree(a, b);
}

INSTANTIATE_TEST_SUITE_P(Plugins, GroupedKv,
                         ::testing::Combine(::testing::Values<std::int64_t>(1, 2),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<GqaCase>& info) {
                           return "H4_Hkv" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_causal" : "_full");
                         });

// ---------------------------------------------------------------- 6. fully masked rows

// The rule: a query row whose keys are ALL masked (bool mask row all False)
// produces zeros, not NaN (PyTorch's softmax of an all -inf row gives NaN).
// Such a row then depends on nothing, so its dq row is zero and every gradient
// stays finite.
class MaskedRow : public PluginTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override { require_plugins({GetParam()}); }
};

// A [Tq, Tk] mask that attends everything except row `dead`, which attends nothing.
Tensor mask_with_dead_row(std::int64_t tq, std::int64_t tk, std::int64_t dead) {
  Tensor m = Tensor::full({tq, tk}, 1.0, DType::boolean);
  for (std::int64_t j = 0; j < tk; ++j) m.set({dead, j}, 0.0);
  return m;
}

TEST_P(MaskedRow, CoreGivesZerosAndFiniteGradients) {
  Generator gen(51);
  CoreInputs in;  // B=1, H=2, Tq=3, Tk=4, d=2; query row 1 sees no key
  in.q = randn({1, 2, 3, 2}, DType::float64, gen);
  in.k = randn({1, 2, 4, 2}, DType::float64, gen);
  in.v = randn({1, 2, 4, 2}, DType::float64, gen);
  in.r = randn({1, 2, 3, 2}, DType::float64, gen);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    AttentionSpec spec;
    spec.causal = causal;
    spec.mask = mask_with_dead_row(3, 4, 1);
    const CoreResult res = run_core(plugin(GetParam()), in, spec);
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t c = 0; c < 2; ++c) {
        EXPECT_EQ(res.out.at({0, h, 1, c}), 0.0) << "out head " << h << " dim " << c;
        EXPECT_EQ(res.dq.at({0, h, 1, c}), 0.0) << "dq head " << h << " dim " << c;
      }
    EXPECT_TRUE(all_finite("out", res.out));
    EXPECT_TRUE(all_finite("dq", res.dq));
    EXPECT_TRUE(all_finite("dk", res.dk));
    EXPECT_TRUE(all_finite("dv", res.dv));
  }
}

TEST_P(MaskedRow, MhaGivesZerosAndFiniteGradients) {
  const MhaInputs in = make_mha_inputs({2, 3, 4}, 2, 2, Layout::contiguous, 52);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    AttentionSpec spec = mha_spec(4, 2, causal);
    spec.mask = mask_with_dead_row(3, 3, 2);  // token 2 sees no token
    const MhaResult res = run_mha(plugin(GetParam()), in, spec);
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t c = 0; c < 4; ++c) EXPECT_EQ(res.out.at({b, 2, c}), 0.0);
    EXPECT_TRUE(all_finite("out", res.out));
    EXPECT_TRUE(all_finite("dX", res.dx));
    EXPECT_TRUE(all_finite("dWq", res.dwq));
    EXPECT_TRUE(all_finite("dWk", res.dwk));
    EXPECT_TRUE(all_finite("dWv", res.dwv));
    EXPECT_TRUE(all_finite("dWo", res.dwo));
  }
}

INSTANTIATE_TEST_SUITE_P(Plugins, MaskedRow, ::testing::ValuesIn(kPlugins),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// ---------------------------------------------------------------- 7. GQA and head width apart from D

// H query heads over Hkv kv heads of width d, D independent of H * d:
// wq [H*d, D], wk and wv [Hkv*d, D], wo [D, H*d].
struct GqaShape {
  std::string name;
  Shape x_shape;  // [..., T, D]
  std::int64_t h, hkv, d;
};

void PrintTo(const GqaShape& s, std::ostream* os) { *os << s.name; }

MhaInputs make_gqa_inputs(const GqaShape& s, std::uint64_t seed) {
  Generator gen(seed);
  const std::int64_t dm = s.x_shape.back();
  MhaInputs in;
  in.x = randn(s.x_shape, DType::float64, gen);
  in.wq = randn({s.h * s.d, dm}, DType::float64, gen, 0.5);
  in.wk = randn({s.hkv * s.d, dm}, DType::float64, gen, 0.5);
  in.wv = randn({s.hkv * s.d, dm}, DType::float64, gen, 0.5);
  in.wo = randn({dm, s.h * s.d}, DType::float64, gen, 0.5);
  in.r = randn(s.x_shape, DType::float64, gen);
  return in;
}

AttentionSpec gqa_spec(const GqaShape& s, bool causal) {
  AttentionSpec spec = mha_spec(s.x_shape.back(), s.h, causal, s.hkv);
  spec.head_width = s.d;
  return spec;
}

// By hand, row by row: wk [Hkv*d, D] -> [H*d, D], kv head j's rows copied for
// each of its G query heads (the MHA weights that GQA stands for).
Tensor repeat_kv_rows(const Tensor& w, std::int64_t heads, std::int64_t d) {
  const std::int64_t group = heads / (w.size(0) / d), cols = w.size(1);
  Tensor out = Tensor::empty({heads * d, cols}, w.dtype());
  for (std::int64_t h = 0; h < heads; ++h)
    for (std::int64_t r = 0; r < d; ++r)
      for (std::int64_t c = 0; c < cols; ++c) out.set({h * d + r, c}, w.at({(h / group) * d + r, c}));
  return out;
}

// By hand: dw [H*d, D] -> [Hkv*d, D], the G query heads' rows of each kv head summed.
Tensor sum_kv_rows(const Tensor& dw, std::int64_t kv_heads, std::int64_t d) {
  const std::int64_t group = dw.size(0) / d / kv_heads, cols = dw.size(1);
  Tensor out = Tensor::zeros({kv_heads * d, cols}, dw.dtype());
  for (std::int64_t h = 0; h < kv_heads * group; ++h)
    for (std::int64_t r = 0; r < d; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        const std::int64_t row = (h / group) * d + r;
        out.set({row, c}, out.at({row, c}) + dw.at({h * d + r, c}));
      }
  return out;
}

// 1 < Hkv < H with H != Hkv^2 (hides neither a tile mapping nor a wrong
// divisor), MQA, d != D / H, G = 1 with an explicit d, and leading dims.
const std::vector<GqaShape> kGqaShapes = {
    {"B2_T7_D32_H12_Hkv3_d10", {2, 7, 32}, 12, 3, 10},
    {"B2_T7_D32_H12_Hkv1_d10_mqa", {2, 7, 32}, 12, 1, 10},
    {"B2_T5_D24_H4_Hkv2_d5", {2, 5, 24}, 4, 2, 5},
    {"B2_T5_D12_H3_Hkv3_d8", {2, 5, 12}, 3, 3, 8},
    {"lead2x2_T4_D16_H6_Hkv2_d4", {2, 2, 4, 16}, 6, 2, 4},
};

using GqaShapeCase = std::tuple<GqaShape, bool>;

std::string gqa_case_name(const ::testing::TestParamInfo<GqaShapeCase>& info) {
  return std::get<0>(info.param).name + (std::get<1>(info.param) ? "__causal" : "__full");
}

class GqaOracle : public PluginTest, public ::testing::WithParamInterface<GqaShapeCase> {
 protected:
  void SetUp() override { require_plugins({"per_head"}); }
};

// GQA through per_head is MHA through per_head with wk, wv rows repeated per
// kv head; the shared heads' gradients are the group sums of the MHA ones.
TEST_P(GqaOracle, EqualsMhaWithRepeatedKvRows) {
  const auto& [s, causal] = GetParam();
  const MhaInputs gqa = make_gqa_inputs(s, 61);
  MhaInputs mha = gqa;
  mha.wk = repeat_kv_rows(gqa.wk, s.h, s.d);
  mha.wv = repeat_kv_rows(gqa.wv, s.h, s.d);
  AttentionSpec mha_s = gqa_spec(s, causal);
  mha_s.num_kv_heads = s.h;
  const MhaResult a = run_mha(plugin("per_head"), gqa, gqa_spec(s, causal));
  const MhaResult b = run_mha(plugin("per_head"), mha, mha_s);
  EXPECT_EQ(a.out.shape(), s.x_shape);
  EXPECT_EQ(a.dwk.shape(), (Shape{s.hkv * s.d, s.x_shape.back()}));
  EXPECT_TRUE(all_close("out", a.out, b.out, 1e-12, 1e-12));
  EXPECT_TRUE(all_close("dX", a.dx, b.dx, 1e-12, 1e-12));
  EXPECT_TRUE(all_close("dWq", a.dwq, b.dwq, 1e-12, 1e-12));
  EXPECT_TRUE(all_close("dWk = group sums", a.dwk, sum_kv_rows(b.dwk, s.hkv, s.d), 1e-12, 1e-12));
  EXPECT_TRUE(all_close("dWv = group sums", a.dwv, sum_kv_rows(b.dwv, s.hkv, s.d), 1e-12, 1e-12));
  EXPECT_TRUE(all_close("dWo", a.dwo, b.dwo, 1e-12, 1e-12));
}

INSTANTIATE_TEST_SUITE_P(Plugins, GqaOracle,
                         ::testing::Combine(::testing::ValuesIn(kGqaShapes), ::testing::Bool()),
                         gqa_case_name);

using GqaPairCase = std::tuple<PluginPair, GqaShape, bool>;

class GqaAgreement : public PluginTest, public ::testing::WithParamInterface<GqaPairCase> {
 protected:
  void SetUp() override {
    const auto& pair = std::get<0>(GetParam());
    require_plugins({pair.first, pair.second});
  }
};

TEST_P(GqaAgreement, OutAndAllGradients) {
  const auto& [pair, s, causal] = GetParam();
  const MhaInputs in = make_gqa_inputs(s, 62);
  const AttentionSpec spec = gqa_spec(s, causal);
  expect_mha_agree(run_mha(plugin(pair.first), in, spec), run_mha(plugin(pair.second), in, spec));
}

INSTANTIATE_TEST_SUITE_P(
    Plugins, GqaAgreement,
    ::testing::Combine(::testing::ValuesIn(kPairs), ::testing::ValuesIn(kGqaShapes),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<GqaPairCase>& info) {
      return pair_name(std::get<0>(info.param)) + "__" + std::get<1>(info.param).name +
             (std::get<2>(info.param) ? "__causal" : "__full");
    });

// The core level: q [B, H, Tq, d] with k, v [B, Hkv, Tk, d] (PyTorch's
// enable_gqa) equals the core on k, v expanded by hand, with dk, dv the group sums.
class CoreGqa : public PluginTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override { require_plugins({GetParam()}); }
};

TEST_P(CoreGqa, EqualsExpandedKv) {
  const std::int64_t b = 2, h = 12, hkv = 3, tq = 5, tk = 7, d = 4, group = h / hkv;
  Generator gen(63);
  CoreInputs gqa;
  gqa.q = randn({b, h, tq, d}, DType::float64, gen);
  gqa.k = randn({b, hkv, tk, d}, DType::float64, gen);
  gqa.v = randn({b, hkv, tk, d}, DType::float64, gen);
  gqa.r = randn({b, h, tq, d}, DType::float64, gen);
  // [B, Hkv, Tk, d] -> [B, H, Tk, d], head n a copy of kv head n / G; and back, summed
  auto expand = [&](const Tensor& kv) {
    Tensor out = Tensor::empty({b, h, tk, d}, DType::float64);
    for (std::int64_t n = 0; n < h; ++n) out.narrow(1, n, 1).copy_(kv.narrow(1, n / group, 1));
    return out;
  };
  auto group_sum = [&](const Tensor& g) {
    Tensor out = Tensor::zeros({b, hkv, tk, d}, DType::float64);
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      const Shape at = unravel_index(i, out.shape());
      double acc = 0.0;
      for (std::int64_t m = 0; m < group; ++m) acc += g.at({at[0], at[1] * group + m, at[2], at[3]});
      out.set_flat(i, acc);
    }
    return out;
  };
  CoreInputs mha = gqa;
  mha.k = expand(gqa.k);
  mha.v = expand(gqa.v);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    AttentionSpec spec;
    spec.causal = causal;
    const CoreResult a = run_core(plugin(GetParam()), gqa, spec);
    const CoreResult e = run_core(plugin(GetParam()), mha, spec);
    EXPECT_TRUE(all_close("out", a.out, e.out, 1e-12, 1e-12));
    EXPECT_TRUE(all_close("dq", a.dq, e.dq, 1e-12, 1e-12));
    EXPECT_TRUE(all_close("dk = group sums", a.dk, group_sum(e.dk), 1e-12, 1e-12));
    EXPECT_TRUE(all_close("dv = group sums", a.dv, group_sum(e.dv), 1e-12, 1e-12));
  }
}

INSTANTIATE_TEST_SUITE_P(Plugins, CoreGqa, ::testing::Values("per_head", "batched"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// Bad head layouts are refused with the shapes named, not a size error deep in an op.
class GqaErrors : public PluginTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override { require_plugins({GetParam()}); }
};

TEST_P(GqaErrors, ClearInvalidArgument) {
  const Attention& p = plugin(GetParam());
  const GqaShape s{"", {2, 7, 32}, 12, 3, 10};
  const MhaInputs in = make_gqa_inputs(s, 64);
  AttentionSpec spec = gqa_spec(s, false);
  spec.num_kv_heads = 5;  // does not divide 12
  using headgrad::test::expect_invalid;
  expect_invalid([&] { run_mha(p, in, spec); }, {"num_kv_heads 5", "num_heads 12"});
  spec.num_kv_heads = 3;
  Generator gen(65);
  MhaInputs wrong = in;
  wrong.wk = randn({12 * 10, 32}, DType::float64, gen);  // [H*d, D], as if Hkv = H
  expect_invalid([&] { run_mha(p, wrong, spec); }, {"wk is [120, 32]", "expected [30, 32]"});
  wrong = in;
  wrong.wo = randn({32, 32}, DType::float64, gen);  // [D, D]
  expect_invalid([&] { run_mha(p, wrong, spec); }, {"wo is [32, 32]", "expected [32, 120]"});
  spec.head_width = 0;  // D = 32 is not a multiple of H = 12
  expect_invalid([&] { run_mha(p, in, spec); }, {"D = 32", "H = 12"});
  CoreInputs core;
  core.q = randn({2, 12, 5, 4}, DType::float64, gen);
  core.k = randn({2, 5, 5, 4}, DType::float64, gen);
  core.v = randn({2, 5, 5, 4}, DType::float64, gen);
  core.r = randn({2, 12, 5, 4}, DType::float64, gen);
  expect_invalid([&] { run_core(p, core, AttentionSpec{}); }, {"k [2, 5, 5, 4]", "H = 12"});
}

INSTANTIATE_TEST_SUITE_P(Plugins, GqaErrors, ::testing::Values("per_head", "batched"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// Leading dims of size 1 broadcast at the core level (k, v over q's batch, q
// over k's heads), in every plugin alike: the result equals the core on the
// inputs copied out to the full shape by hand, each gradient summed back by hand.
struct CoreBroadcastCase {
  const char* name;
  Shape q, kv, q_full, kv_full;  // given and copied-out shapes, [B, H, T, d]
};

void PrintTo(const CoreBroadcastCase& c, std::ostream* os) { *os << c.name; }

const CoreBroadcastCase kCoreBroadcast[] = {
    {"kv_batch_1", {2, 3, 5, 4}, {1, 3, 7, 4}, {2, 3, 5, 4}, {2, 3, 7, 4}},
    {"kv_batch_1_gqa", {2, 12, 5, 4}, {1, 3, 7, 4}, {2, 12, 5, 4}, {2, 3, 7, 4}},
    {"q_heads_1", {2, 1, 5, 4}, {2, 3, 7, 4}, {2, 3, 5, 4}, {2, 3, 7, 4}},
};

// [.., 1, ..] -> `full`, element by element (index 0 along a size-1 dim).
Tensor copy_out(const Tensor& t, const Shape& full) {
  Tensor out = Tensor::empty(full, DType::float64);
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    Shape at = unravel_index(i, full);
    for (std::size_t a = 0; a < at.size(); ++a)
      if (t.size(static_cast<std::int64_t>(a)) == 1) at[a] = 0;
    out.set_flat(i, t.at(at));
  }
  return out;
}

// The reverse: `g` of shape full summed into `shape` over its size-1 dims.
Tensor sum_back(const Tensor& g, const Shape& shape) {
  Tensor out = Tensor::zeros(shape, DType::float64);
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    Shape at = unravel_index(i, g.shape());
    const double value = g.at(at);
    for (std::size_t a = 0; a < at.size(); ++a)
      if (shape[a] == 1) at[a] = 0;
    out.set(at, out.at(at) + value);
  }
  return out;
}

class CoreBroadcast : public PluginTest,
                      public ::testing::WithParamInterface<std::tuple<std::string, CoreBroadcastCase>> {
 protected:
  void SetUp() override { require_plugins({std::get<0>(GetParam())}); }
};

TEST_P(CoreBroadcast, EqualsInputsCopiedOut) {
  const Attention& p = plugin(std::get<0>(GetParam()));
  const CoreBroadcastCase c = std::get<1>(GetParam());
  Generator gen(66);
  CoreInputs given;
  given.q = randn(c.q, DType::float64, gen);
  given.k = randn(c.kv, DType::float64, gen);
  given.v = randn(c.kv, DType::float64, gen);
  given.r = randn(c.q_full, DType::float64, gen);
  CoreInputs full = given;
  full.q = copy_out(given.q, c.q_full);
  full.k = copy_out(given.k, c.kv_full);
  full.v = copy_out(given.v, c.kv_full);
  for (const char* variant : {"full", "causal", "causal+rope"}) {
    SCOPED_TRACE(variant);
    AttentionSpec spec;
    spec.causal = std::string(variant) != "full";
    if (std::string(variant) == "causal+rope") {  // positions 5 + t: the same in every batch row
      spec.rope.enabled = true;
      spec.rope.offset = 5;
    }
    const CoreResult a = run_core(p, given, spec);
    const CoreResult e = run_core(p, full, spec);
    EXPECT_EQ(a.out.shape(), c.q_full);
    EXPECT_TRUE(all_close("out", a.out, e.out, 1e-12, 1e-12));
    EXPECT_TRUE(all_close("dq", a.dq, sum_back(e.dq, c.q), 1e-12, 1e-12));
    EXPECT_TRUE(all_close("dk", a.dk, sum_back(e.dk, c.kv), 1e-12, 1e-12));
    EXPECT_TRUE(all_close("dv", a.dv, sum_back(e.dv, c.kv), 1e-12, 1e-12));
  }
}

INSTANTIATE_TEST_SUITE_P(Plugins, CoreBroadcast,
                         ::testing::Combine(::testing::ValuesIn(kPlugins), ::testing::ValuesIn(kCoreBroadcast)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, CoreBroadcastCase>>& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param).name;
                         });

// The oracle names the tensor that does not fit and the shape it should have.
TEST_F(PluginTest, PerHeadCoreNamesALeadingDimThatDoesNotBroadcast) {
  require_plugins({"per_head"});
  const Attention& p = plugin("per_head");
  using headgrad::test::expect_invalid;
  Generator gen(67);
  CoreInputs in;
  in.q = randn({2, 3, 5, 4}, DType::float64, gen);
  in.k = randn({3, 3, 7, 4}, DType::float64, gen);  // batch 3 where q has 2
  in.v = randn({2, 3, 7, 4}, DType::float64, gen);
  in.r = randn({2, 3, 5, 4}, DType::float64, gen);
  expect_invalid([&] { run_core(p, in, AttentionSpec{}); },
                 {"per_head: k [3, 3, 7, 4] does not fit q [2, 3, 5, 4]", "expected [2, 3, 7, 4]"});
  in.k = randn({2, 3, 7, 4}, DType::float64, gen);
  in.v = randn({2, 3, 7, 6}, DType::float64, gen);
  AttentionSpec spec;
  spec.mask = Tensor::full({4, 5, 7}, 1.0, DType::boolean);  // 4 heads where q has 3
  expect_invalid([&] { run_core(p, in, spec); }, {"per_head: mask [4, 5, 7]", "expected [2, 3, 5, 7]"});
}

// ---------------------------------------------------------------- 8. RoPE in attention

// Which token positions a RoPE case uses, for x [..., B, T, D] (lead = the dims before T).
enum class RopePositions { offset, gapped_rows, reversed_large };

const char* rope_positions_name(RopePositions p) {
  switch (p) {
    case RopePositions::offset: return "offset5";
    case RopePositions::gapped_rows: return "gapped_rows";
    case RopePositions::reversed_large: return "reversed_ge1000";
  }
  return "?";
}

// Gapped per row ([lead..., T]: every row its own, none an arange + c), or one
// reversed row [T] with positions >= 1000, or an offset.
RopeSpec make_rope(RopeStyle style, std::int64_t r, RopePositions kind, const Shape& x_shape) {
  RopeSpec rope;
  rope.enabled = true;
  rope.style = style;
  rope.rotary_dim = r;
  const std::int64_t t = x_shape[x_shape.size() - 2];
  if (kind == RopePositions::offset) rope.offset = 5;
  if (kind == RopePositions::gapped_rows) {
    Shape shape(x_shape.begin(), x_shape.end() - 1);  // [lead..., T]
    std::vector<std::int64_t> p(static_cast<std::size_t>(shape_numel(shape)));
    for (std::size_t i = 0; i < p.size(); ++i) {
      const auto row = static_cast<std::int64_t>(i) / t, tok = static_cast<std::int64_t>(i) % t;
      p[i] = 17 * row + tok * tok + (tok % 3 == 2 ? 40 : 0);
    }
    rope.positions = positions_tensor(p, shape);
  }
  if (kind == RopePositions::reversed_large) {
    std::vector<std::int64_t> p;
    for (std::int64_t tok = 0; tok < t; ++tok) p.push_back(1000 + 3 * (t - 1 - tok));
    rope.positions = positions_tensor(p, {t});
  }
  return rope;
}

using RopeAttentionCase = std::tuple<GqaShape, RopeStyle, bool, RopePositions>;  // partial r?

// The partial rotary width for head width d: 6 of 10, 2 of 4.
std::int64_t partial_r(std::int64_t d) { return d >= 8 ? 6 : 2; }

std::string rope_case_name(const ::testing::TestParamInfo<RopeAttentionCase>& info) {
  const auto& [s, style, partial, kind] = info.param;
  return s.name + "__" + std::string(rope_style_name(style)) + (partial ? "_r" + std::to_string(partial_r(s.d)) : "_r_eq_d") +
         "__" + rope_positions_name(kind);
}

class RopeAttention : public PluginTest, public ::testing::WithParamInterface<RopeAttentionCase> {
 protected:
  void SetUp() override { require_plugins({"per_head", "batched", "fused_sdpa"}); }

  AttentionSpec spec() const {
    const auto& [s, style, partial, kind] = GetParam();
    AttentionSpec spec = gqa_spec(s, true);
    spec.rope = make_rope(style, partial ? partial_r(s.d) : 0, kind, s.x_shape);
    return spec;
  }
};

TEST_P(RopeAttention, EveryPluginAgreesWithPerHead) {
  const GqaShape& s = std::get<0>(GetParam());
  const MhaInputs in = make_gqa_inputs(s, 71);
  const MhaResult a = run_mha(plugin("per_head"), in, spec());
  for (const std::string name : {"batched", "fused_sdpa"}) {
    SCOPED_TRACE(name);
    expect_mha_agree(a, run_mha(plugin(name), in, spec()));
  }
  // and RoPE did something: without it the output differs
  AttentionSpec off = spec();
  off.rope.enabled = false;
  EXPECT_FALSE(all_close("out without rope", run_mha(plugin("per_head"), in, off).out, a.out));
}

// The oracle built by hand from ops: project, split, rotate q and k (k with
// its Hkv heads) with the rope op, widen k and v, plain attention, merge, project.
TEST_P(RopeAttention, MatchesRotateThenPlainAttention) {
  const GqaShape& s = std::get<0>(GetParam());
  const MhaInputs in = make_gqa_inputs(s, 72);
  const AttentionSpec sp = spec();
  const MhaResult want = test::run_mha([&](const Variable& x, const MhaWeights& w) {
    const std::int64_t t = s.x_shape[s.x_shape.size() - 2], dm = s.x_shape.back();
    const Variable x3 = reshape(x, {-1, t, dm});
    RopeSpec turn = sp.rope;
    if (turn.positions.defined() && turn.positions.dim() > 2)
      turn.positions = turn.positions.reshape({-1, t});  // [lead..., T] as x is folded
    const Variable q = rope(split_heads(linear(x3, w.wq), s.h), turn);
    const Variable k = rope(split_heads(linear(x3, w.wk), s.hkv), turn);
    const Variable v = split_heads(linear(x3, w.wv), s.hkv);
    const std::int64_t g = s.h / s.hkv;
    const Variable o = attention_core(q, repeat_interleave(k, g, 1), repeat_interleave(v, g, 1),
                                      without_rope(sp));
    return reshape(linear(merge_heads(o), w.wo), s.x_shape);
  }, in.x, in.wq, in.wk, in.wv, in.wo, in.r);
  for (const std::string name : {"per_head", "batched", "fused_sdpa"}) {
    SCOPED_TRACE(name);
    expect_mha_agree(run_mha(plugin(name), in, sp), want);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Plugins, RopeAttention,
    ::testing::Combine(::testing::Values(kGqaShapes[0], kGqaShapes[1], kGqaShapes[4]),
                       ::testing::Values(RopeStyle::interleaved, RopeStyle::half),
                       ::testing::Bool(),
                       ::testing::Values(RopePositions::offset, RopePositions::gapped_rows,
                                         RopePositions::reversed_large)),
    rope_case_name);

// The core level with GQA and decode-like positions: queries at q_offset + t,
// keys at 0 .. Tk-1; equals rotating q and k with the op, then the core without RoPE.
TEST_F(PluginTest, RopeCoreLevelWithQueryOffset) {
  require_plugins({"per_head", "batched", "fused_sdpa"});
  Generator gen(73);
  CoreInputs in;  // B=2, H=12, Hkv=3, Tq=3, Tk=8, d=10
  in.q = randn({2, 12, 3, 10}, DType::float64, gen);
  in.k = randn({2, 3, 8, 10}, DType::float64, gen);
  in.v = randn({2, 3, 8, 10}, DType::float64, gen);
  in.r = randn({2, 12, 3, 10}, DType::float64, gen);
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half}) {
    SCOPED_TRACE(rope_style_name(style));
    AttentionSpec spec;
    spec.causal = false;
    spec.rope.enabled = true;
    spec.rope.style = style;
    spec.rope.rotary_dim = 6;
    spec.rope.q_offset = 5;
    RopeSpec at_q = spec.rope, at_k = spec.rope;
    at_q.offset = 5;
    CoreInputs rotated = in;
    rotated.q = rope(Variable(in.q), at_q).data();
    rotated.k = rope(Variable(in.k), at_k).data();
    const CoreResult want = run_core(plugin("per_head"), rotated, without_rope(spec));
    for (const std::string name : {"per_head", "batched", "fused_sdpa"}) {
      SCOPED_TRACE(name);
      const CoreResult got = run_core(plugin(name), in, spec);
      EXPECT_TRUE(all_close("out", got.out, want.out, 1e-12, 1e-12));
      EXPECT_TRUE(all_close("dv", got.dv, want.dv, 1e-12, 1e-12));
      // dq, dk: the gradients of the rotated tensors, rotated back (R^T)
      Variable rq(in.q, true), rk(in.k, true);
      rope(rq, at_q).backward(want.dq);
      rope(rk, at_k).backward(want.dk);
      EXPECT_TRUE(all_close("dq", got.dq, rq.grad(), 1e-12, 1e-12));
      EXPECT_TRUE(all_close("dk", got.dk, rk.grad(), 1e-12, 1e-12));
    }
  }
}

// Scores depend on position differences only: the same shift on q and k
// leaves out and every gradient unchanged. This is why a uniform position
// shift is invisible end to end and only a RoPE-level check can see it.
TEST_F(PluginTest, RopeUniformShiftIsInvisibleEndToEnd) {
  require_plugins({"per_head"});
  const GqaShape& s = kGqaShapes[0];
  const MhaInputs in = make_gqa_inputs(s, 74);
  AttentionSpec spec = gqa_spec(s, true);
  spec.rope = make_rope(RopeStyle::half, 0, RopePositions::offset, s.x_shape);
  const MhaResult a = run_mha(plugin("per_head"), in, spec);
  spec.rope.offset += 37;
  expect_mha_agree(run_mha(plugin("per_head"), in, spec), a);
}

TEST_F(PluginTest, RopePositionsOfTheWrongShapeAreRefused) {
  require_plugins({"per_head", "batched"});
  const GqaShape& s = kGqaShapes[0];  // B 2, T 7
  const MhaInputs in = make_gqa_inputs(s, 75);
  AttentionSpec spec = gqa_spec(s, false);
  spec.rope.enabled = true;
  spec.rope.positions = positions_tensor(std::vector<std::int64_t>(12 * 7, 0), {12, 7});  // [H, T]
  for (const std::string name : {"per_head", "batched"}) {
    SCOPED_TRACE(name);
    headgrad::test::expect_invalid([&] { run_mha(plugin(name), in, spec); },
                                   {"rope", "positions [12, 7]"});
  }
  spec.rope.positions = positions_tensor({0, 1, 2, 3, 4}, {5});  // T = 5, not 7
  headgrad::test::expect_invalid([&] { run_mha(plugin("per_head"), in, spec); },
                                 {"positions [5]", "T = 7"});
}

// ---------------------------------------------------------------- causal alignment

// [Tq, Tk] bool built by hand, True = attend: query i sees keys j <= i + shift
// (shift 0 top-left, Tk - Tq bottom-right).
Tensor hand_causal_mask(std::int64_t tq, std::int64_t tk, std::int64_t shift) {
  Tensor m = Tensor::empty({tq, tk}, DType::boolean);
  for (std::int64_t i = 0; i < tq; ++i)
    for (std::int64_t j = 0; j < tk; ++j) m.set({i, j}, j <= i + shift);
  return m;
}

CoreInputs alignment_inputs(std::int64_t tq, std::int64_t tk, std::uint64_t seed) {
  Generator gen(seed);
  // [B, H, Tq, d] = [2, 2, Tq, 3], v with dv = 4
  return {randn({2, 2, tq, 3}, DType::float64, gen), randn({2, 2, tk, 3}, DType::float64, gen),
          randn({2, 2, tk, 4}, DType::float64, gen), randn({2, 2, tq, 4}, DType::float64, gen)};
}

AttentionSpec aligned_spec(CausalAlignment alignment) {
  AttentionSpec spec;
  spec.causal = true;
  spec.causal_alignment = alignment;
  return spec;
}

double max_abs_gap(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

struct AlignmentShape {
  std::string name;
  std::int64_t tq, tk;
};
void PrintTo(const AlignmentShape& s, std::ostream* os) { *os << s.name; }

using AlignmentCase = std::tuple<AlignmentShape, CausalAlignment, bool>;  // shape, alignment, user mask

class CausalAlignmentAgreement : public PluginTest,
                                 public ::testing::WithParamInterface<AlignmentCase> {};

// Every plugin, given causal in one alignment, equals the composed core given
// the same mask as an explicit bool tensor built by hand (causal off), and so
// each other; with a user mask too, both combined.
TEST_P(CausalAlignmentAgreement, EqualsTheHandBuiltMaskOnTheComposedCore) {
  require_plugins(kPlugins);
  const auto& [shape, alignment, with_mask] = GetParam();
  const std::int64_t tq = shape.tq, tk = shape.tk;
  const CoreInputs in = alignment_inputs(tq, tk, 41);
  AttentionSpec spec = aligned_spec(alignment);
  Tensor mask = hand_causal_mask(tq, tk, alignment == CausalAlignment::bottom_right ? tk - tq : 0);
  if (with_mask) {
    Generator gen(43);
    const Tensor user = random_mask({2, 1, tq, tk}, gen);
    spec.mask = user;
    Tensor both = Tensor::empty({2, 1, tq, tk}, DType::boolean);
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t i = 0; i < tq; ++i)
        for (std::int64_t j = 0; j < tk; ++j)
          both.set({b, 0, i, j}, user.at({b, 0, i, j}) != 0 && mask.at({i, j}) != 0);
    mask = both;
  }
  AttentionSpec explicit_mask;
  explicit_mask.mask = mask;
  const CoreResult composed = run_composed_core(in, explicit_mask);
  for (const auto& name : kPlugins) {
    SCOPED_TRACE(name);
    const CoreResult got = run_core(plugin(name), in, spec);
    expect_core_close(got, composed, 1e-12, 1e-10);
    // bottom-right with Tq > Tk: the first Tq - Tk queries see no key
    if (alignment == CausalAlignment::bottom_right)
      for (std::int64_t i = 0; i < tq - tk; ++i)
        for (std::int64_t c = 0; c < 3; ++c) {
          EXPECT_EQ(got.out.at({1, 1, i, c}), 0.0);
          EXPECT_EQ(got.dq.at({1, 1, i, c}), 0.0);
        }
  }
  for (const auto& [a, b] : kPairs) {
    SCOPED_TRACE(a + " vs " + b);
    expect_core_close(run_core(plugin(a), in, spec), run_core(plugin(b), in, spec));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Plugins, CausalAlignmentAgreement,
    ::testing::Combine(::testing::Values(AlignmentShape{"decode_tq1_tk7", 1, 7},
                                         AlignmentShape{"tq2_tk5", 2, 5},
                                         AlignmentShape{"square_tq5_tk5", 5, 5},
                                         AlignmentShape{"tq6_tk4", 6, 4}),
                       ::testing::Values(CausalAlignment::top_left, CausalAlignment::bottom_right),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<AlignmentCase>& info) {
      return std::get<0>(info.param).name + "__" +
             std::string(causal_alignment_name(std::get<1>(info.param))) +
             (std::get<2>(info.param) ? "__mask" : "");
    });

// Tq = Tk: the two alignments are one mask, at the core level and (always
// Tq = Tk) at the MHA level, bit for bit in every plugin; Tq != Tk: they differ.
TEST_F(PluginTest, CausalAlignmentsAreIdenticalExactlyWhenSquare) {
  require_plugins(kPlugins);
  const AttentionSpec top = aligned_spec(CausalAlignment::top_left);
  const AttentionSpec bottom = aligned_spec(CausalAlignment::bottom_right);
  for (const auto& name : kPlugins) {
    SCOPED_TRACE(name);
    const CoreInputs square = alignment_inputs(5, 5, 47);
    const CoreResult a = run_core(plugin(name), square, top), b = run_core(plugin(name), square, bottom);
    EXPECT_EQ(a.out.to_vector(), b.out.to_vector());
    EXPECT_EQ(a.dq.to_vector(), b.dq.to_vector());
    EXPECT_EQ(a.dk.to_vector(), b.dk.to_vector());
    EXPECT_EQ(a.dv.to_vector(), b.dv.to_vector());
    for (const auto& [tq, tk] : {std::pair<std::int64_t, std::int64_t>{1, 7}, {6, 4}}) {
      const CoreInputs cross = alignment_inputs(tq, tk, 53);
      EXPECT_GT(max_abs_gap(run_core(plugin(name), cross, top).out,
                            run_core(plugin(name), cross, bottom).out), 1e-3)
          << "Tq " << tq << ", Tk " << tk;
    }
    const MhaInputs in = make_mha_inputs({2, 4, 8}, 2, 2, Layout::contiguous, 59);
    AttentionSpec mha_top = mha_spec(8, 2, true), mha_bottom = mha_top;
    mha_bottom.causal_alignment = CausalAlignment::bottom_right;
    const MhaResult x = run_mha(plugin(name), in, mha_top), y = run_mha(plugin(name), in, mha_bottom);
    EXPECT_EQ(x.out.to_vector(), y.out.to_vector());
    EXPECT_EQ(x.dwq.to_vector(), y.dwq.to_vector());
  }
}

// The mutant causal_alignment (bottom-right whatever it is asked) is the
// correct plugin at Tq = Tk and differs from it at Tq != Tk, where it equals
// the correct plugin asked for bottom-right.
TEST_F(PluginTest, MutantCausalAlignmentShowsOnlyWhenTqDiffersFromTk) {
  require_plugins({"per_head"});
  // The build puts plugins/<name>/<name>.so and plugins/mutants/mutant_<bug>.so side by side.
  const std::filesystem::path file =
      test::real_plugin_files().front().parent_path().parent_path() / "mutants" /
      "mutant_causal_alignment.so";
  PluginRegistry reg;
  ASSERT_TRUE(reg.load_file(file)) << file << ": " << reg.rejections().back().reason;
  const LoadedPlugin& mutant = reg.get("mutant_causal_alignment");
  EXPECT_TRUE(mutant.info.mutant);
  const AttentionSpec top = aligned_spec(CausalAlignment::top_left);
  const AttentionSpec bottom = aligned_spec(CausalAlignment::bottom_right);
  const CoreInputs square = alignment_inputs(5, 5, 61);
  expect_core_close(run_core(*mutant.attention, square, top), run_core(plugin("per_head"), square, top));
  const MhaInputs in = make_mha_inputs({2, 4, 8}, 2, 2, Layout::contiguous, 67);
  expect_mha_agree(run_mha(*mutant.attention, in, mha_spec(8, 2, true)),
                   run_mha(plugin("per_head"), in, mha_spec(8, 2, true)));
  for (const auto& [tq, tk] : {std::pair<std::int64_t, std::int64_t>{1, 7}, {6, 4}, {2, 5}}) {
    SCOPED_TRACE("Tq " + std::to_string(tq) + ", Tk " + std::to_string(tk));
    const CoreInputs cross = alignment_inputs(tq, tk, 71);
    const CoreResult wrong = run_core(*mutant.attention, cross, top);
    EXPECT_GT(max_abs_gap(wrong.out, run_core(plugin("per_head"), cross, top).out), 1e-3);
    expect_core_close(wrong, run_core(plugin("per_head"), cross, bottom));
  }
}

}  // namespace

// ---------------------------------------------------------------- 9. the rope level

// rope_forward against the rotation written out by hand: pair k of the first r
// dims, (2k, 2k+1) interleaved or (k, k + r/2) half, turns by p * theta^(-2k/r);
// the loss sum(out * r) has dx = R^T r, the turn by -phi; dims [r, d) pass through.
TEST_F(PluginTest, RopeLevelMatchesTheRotationByHand) {
  require_plugins({"per_head", "batched", "fused_sdpa"});
  const std::int64_t B = 2, H = 3, T = 5, d = 10, r = 6;
  Generator gen(91);
  const Tensor x = randn({B, H, T, d}, DType::float64, gen);
  const Tensor w = randn({B, H, T, d}, DType::float64, gen);
  const std::vector<std::int64_t> pos = {0, 2, 3, 9, 40, 1000, 1001, 1007, 1008, 1030};  // [B, T]
  for (RopeStyle style : {RopeStyle::interleaved, RopeStyle::half}) {
    SCOPED_TRACE(rope_style_name(style));
    RopeSpec spec;
    spec.style = style;
    spec.theta = 500000.0;
    spec.rotary_dim = r;
    spec.positions = positions_tensor(pos, {B, T});
    Tensor want_out = x.clone(), want_dx = w.clone();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t k = 0; k < r / 2; ++k) {
            const double phi = static_cast<double>(pos[b * T + t]) * std::pow(500000.0, -2.0 * k / r);
            const std::int64_t i = style == RopeStyle::interleaved ? 2 * k : k;
            const std::int64_t j = style == RopeStyle::interleaved ? 2 * k + 1 : k + r / 2;
            const double a = x.at({b, h, t, i}), c = x.at({b, h, t, j});
            want_out.set({b, h, t, i}, a * std::cos(phi) - c * std::sin(phi));
            want_out.set({b, h, t, j}, a * std::sin(phi) + c * std::cos(phi));
            const double ga = w.at({b, h, t, i}), gc = w.at({b, h, t, j});
            want_dx.set({b, h, t, i}, ga * std::cos(phi) + gc * std::sin(phi));
            want_dx.set({b, h, t, j}, -ga * std::sin(phi) + gc * std::cos(phi));
          }
    for (const std::string name : {"per_head", "batched", "fused_sdpa"}) {
      SCOPED_TRACE(name);
      EXPECT_TRUE(registry_->find(name)->info.capabilities.rope_level);
      Variable xv(x.clone(), true);
      const Variable out = plugin(name).rope_forward(xv, spec);
      sum(mul(out, Variable(w))).backward();
      EXPECT_TRUE(all_close("out", out.data(), want_out));
      EXPECT_TRUE(all_close("dx", xv.grad(), want_dx));
      // the pass-through dims are bitwise x's
      for (std::int64_t i = 0; i < x.numel(); ++i)
        if (i % d >= r) {
          ASSERT_EQ(out.data().contiguous().flat(i), x.flat(i)) << "flat " << i;
        }
    }
  }
}

// A plugin that does not implement the rope level says so, naming itself.
TEST_F(PluginTest, RopeLevelDefaultIsUnsupported) {
  struct CoreOnly final : Attention {
    PluginInfo info() const override {
      PluginInfo i;
      i.name = "core_only";
      return i;
    }
  };
  const CoreOnly p;
  try {
    p.rope_forward(Variable(Tensor::zeros({2, 4}, DType::float64)), RopeSpec{});
    FAIL() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_EQ(std::string(e.what()), "plugin 'core_only' does not implement the rope level");
  }
}

// ---------------------------------------------------------------- block-causal core

namespace {

using BlockCausalCase = std::tuple<AlignmentShape, CausalAlignment>;

class BlockCausalCore : public PluginTest, public ::testing::WithParamInterface<BlockCausalCase> {};

// batched runs causal cores of T >= 256 query rows by 128-row blocks, each
// against only the keys it can see: it must equal the dense composed core given
// the hand-built mask, out and every gradient, rows past a block's edge included.
TEST_P(BlockCausalCore, EqualsTheDenseComposedCore) {
  require_plugins({"batched"});
  const auto& [shape, alignment] = GetParam();
  const std::int64_t tq = shape.tq, tk = shape.tk;
  const CoreInputs in = alignment_inputs(tq, tk, 53);
  AttentionSpec explicit_mask;
  explicit_mask.mask = hand_causal_mask(tq, tk, alignment == CausalAlignment::bottom_right ? tk - tq : 0);
  const CoreResult composed = run_composed_core(in, explicit_mask);
  expect_core_close(run_core(plugin("batched"), in, aligned_spec(alignment)), composed, 1e-12, 1e-10);
}

INSTANTIATE_TEST_SUITE_P(
    Batched, BlockCausalCore,
    ::testing::Combine(::testing::Values(AlignmentShape{"square_tq300_tk300", 300, 300},
                                         AlignmentShape{"tq300_tk420", 300, 420},
                                         AlignmentShape{"tq420_tk300", 420, 300},
                                         AlignmentShape{"exact_blocks_tq256_tk256", 256, 256}),
                       ::testing::Values(CausalAlignment::top_left, CausalAlignment::bottom_right)),
    [](const ::testing::TestParamInfo<BlockCausalCase>& info) {
      return std::get<0>(info.param).name + "__" +
             std::string(causal_alignment_name(std::get<1>(info.param)));
    });

}  // namespace

// ---------------------------------------------------------------- per_head past its recompute bound

// Once every slice's [Tq, Tk] buffers together pass 256 MiB (here 9 slices of
// 2048 x 2048 float64: 288 MiB each kind), per_head runs each slice under
// checkpoint. Each slice's out and gradients must equal, bit for bit, that
// slice run alone (32 MiB: kept, no recompute), and the run's peak must stay
// under one [Tq, Tk] buffer per slice, which keeping them could not.
TEST_F(PluginTest, PerHeadRecomputesPastItsBoundBitForBit) {
  require_plugins({"per_head"});
  const Attention& p = plugin("per_head");
  const std::int64_t n = 9, t = 2048, d = 2;
  Generator gen(5);
  CoreInputs in;
  for (Tensor* x : {&in.q, &in.k, &in.v, &in.r}) *x = randn({1, n, t, d}, DType::float64, gen);
  AttentionSpec spec;
  spec.causal = true;
  const std::size_t base = memory_stats().current_bytes;
  reset_peak_memory();
  const CoreResult all = run_core(p, in, spec);
  const double peak = static_cast<double>(memory_stats().peak_bytes - base);
  const double one_buffer_per_slice = static_cast<double>(n * t * t * 8);
  EXPECT_LT(peak, one_buffer_per_slice) << "peak " << peak / (1 << 20) << " MiB";
  for (const std::int64_t s : {std::int64_t{0}, std::int64_t{4}, n - 1}) {
    auto slice = [&](const Tensor& x) { return x.narrow(1, s, 1).contiguous(); };
    CoreInputs one;
    for (auto [from, to] : {std::pair{&in.q, &one.q}, {&in.k, &one.k}, {&in.v, &one.v}, {&in.r, &one.r}})
      *to = slice(*from);
    const CoreResult alone = run_core(p, one, spec);
    const std::vector<Tensor> a = all.all(), b = alone.all();
    for (std::size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(slice(a[i]).to_vector(), b[i].to_vector()) << "slice " << s << ", tensor " << i;
  }
}

}  // namespace test_plugin_agreement
