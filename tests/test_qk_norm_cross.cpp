// QK-norm (`qk_norm: {axis, eps, gain}`) and cross-attention (`cross: true`),
// the two MHA-level features of current models. Checked here: the rms_norm op
// against values worked out by hand and finite differences; each plugin's
// gradients with QK-norm (both axes, both gain conventions, with RoPE and GQA)
// and with cross-attention (GQA, biases, causal) against finite differences;
// the three plugins against each other (per_head writes RMSNorm from
// elementary ops, batched and fused_sdpa use the rms_norm op); identities
// worked out by hand (x_kv = x is self-attention with dx = dx_q + dx_kv; one
// head makes the two axes one; the norm forgets the scale of wq); and the
// combinations and shapes refused, each named.
//
// Shape legend: B batch, Tq/Tk query/key lengths, D model width, H query
// heads, Hkv kv heads, d head width.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <string>
#include <vector>

#include "analysis/analyze.hpp"
#include "case/axes.hpp"
#include "case/inputs.hpp"
#include "checks.hpp"
#include "exec/execute.hpp"
#include "headgrad_cli.hpp"
#include "headgrad/gradcheck.hpp"
#include "headgrad/kernels.hpp"
#include "headgrad/loader.hpp"
#include "headgrad/npy.hpp"
#include "headgrad/ops.hpp"
#include "headgrad/plugin.hpp"
#include "real_plugins.hpp"

namespace test_qk_norm_cross {  // this file's names: test files share unity builds (tests/meson.build)

using namespace headgrad;
using namespace headgrad::runner;
using headgrad::test::contains;

namespace fs = std::filesystem;

namespace {

// The catalog's QK-norm and cross-attention bugs (one mutant each).
const char* const kBugs[] = {"qk_norm_ignored",    "qk_norm_missing_on_k",    "qk_norm_axis_swapped",
                             "qk_norm_after_rope", "qk_norm_gain_convention", "qk_norm_eps",
                             "cross_causal",       "cross_kv_from_queries"};

class QkNormCross : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new PluginRegistry();
    problems_ = test::load_real_plugins(*registry_);
    for (const char* bug : kBugs)
      problems_ += test::load_plugin_file(
          *registry_, fs::path(HEADGRAD_BUILD_PLUGIN_DIR) / "mutants" / ("mutant_" + std::string(bug) + ".so"), bug);
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(problems_.empty()) << problems_; }
  static const Attention& plugin(const std::string& name) { return *registry_->get(name).attention; }

  static inline PluginRegistry* registry_ = nullptr;
  static inline std::string problems_;
};

const char* const kPlugins[] = {"per_head", "batched", "fused_sdpa"};

// H 4, Hkv 2, d 3 (not D / H), D 8.
AttentionSpec gqa_spec() {
  AttentionSpec s;
  s.d_model = 8;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_width = 3;
  return s;
}

QkNormSpec norm(QkNormAxis axis, QkNormGain gain, double eps = 1e-6) {
  QkNormSpec n;
  n.enabled = true;
  n.axis = axis;
  n.gain = gain;
  n.eps = eps;
  return n;
}

// Per-dim gains around 1 (1 + 0.5 N(0, 1)), or around 0 for one_plus_w, so
// that neither g is uniform.
Tensor gains(std::int64_t n, QkNormGain gain, Generator& gen) {
  std::vector<double> v = randn({n}, DType::float64, gen, 0.5).to_vector();
  if (gain == QkNormGain::w)
    for (double& x : v) x += 1.0;
  return Tensor::from_values(v, {n}, DType::float64);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// ---------------------------------------------------------------- the op

// x = [3, 4]: mean(x^2) = 12.5; with eps 0.5, rms = sqrt(13) and y = x / sqrt(13) * g.
TEST(RmsNorm, HandWorkedValuesForBothGainConventions) {
  const Variable x(Tensor::from_values(std::vector<double>{3, 4}, {1, 2}, DType::float64));
  const Variable w(Tensor::from_values(std::vector<double>{2, -1}, {2}, DType::float64));
  const double r = std::sqrt(13.0);
  const std::vector<double> y = rms_norm(x, w, 0.5).data().to_vector();
  EXPECT_NEAR(y[0], 3 / r * 2, 1e-15);
  EXPECT_NEAR(y[1], 4 / r * -1, 1e-15);
  const std::vector<double> y1 = rms_norm(x, w, 0.5, true).data().to_vector();  // g = 1 + w = [3, 0]
  EXPECT_NEAR(y1[0], 3 / r * 3, 1e-15);
  EXPECT_NEAR(y1[1], 0.0, 1e-15);
}

// dx = (gy - x^ mean(gy x^)) / rms and dw = sum dy x^, against finite differences,
// on a transposed view (its own strides), eps 0 and 1e-2, both conventions.
TEST(RmsNorm, GradcheckOfXAndGain) {
  Generator gen(5);
  for (const bool one_plus_w : {false, true})
    for (const double eps : {0.0, 1e-2}) {
      const Tensor x = randn({5, 3, 4}, DType::float64, gen).transpose(0, 2);  // [4, 3, 5]
      const Tensor w = randn({5}, DType::float64, gen);
      const GradcheckResult r = gradcheck(
          [&](const std::vector<Variable>& v) { return rms_norm(v[0], v[1], eps, one_plus_w); }, {x, w});
      EXPECT_TRUE(r.ok) << "one_plus_w=" << one_plus_w << " eps=" << eps << ": " << r.message;
      EXPECT_EQ(r.elements_checked, 60 + 5);
    }
}

// One rounding: a float32 input gives the float64 result rounded once.
TEST(RmsNorm, Float32IsTheFloat64ResultRoundedOnce) {
  Generator gen(8);
  const Tensor x = randn({3, 7}, DType::float64, gen).to(DType::float32);
  const Tensor w = randn({7}, DType::float64, gen).to(DType::float32);
  const Tensor want = rms_norm(Variable(x.to(DType::float64)), Variable(w.to(DType::float64)), 1e-6).data();
  const Tensor got = rms_norm(Variable(x), Variable(w), 1e-6).data();
  EXPECT_EQ(got.dtype(), DType::float32);
  const std::vector<double> a = got.to_vector(), b = want.to(DType::float32).to_vector();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << i;
}

TEST(RmsNorm, WrongGainShapeIsRefusedWithBothShapes) {
  const Variable x(Tensor::zeros({2, 4}, DType::float64)), w(Tensor::ones({3}, DType::float64));
  try {
    rms_norm(x, w, 1e-6);
    FAIL() << "a [3] gain for rows of 4 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "x [2, 4] and gain [3]")) << e.what();
  }
}

// ---------------------------------------------------------------- QK-norm in the plugins

// Finite differences on x, every weight and both gains: axis head and model,
// w and 1 + w, with RoPE (half pairs), GQA and d != D / H, causal, per plugin.
TEST_F(QkNormCross, GradcheckOfQkNormBothAxesBothGainsWithRopePerPlugin) {
  for (const QkNormAxis axis : {QkNormAxis::head, QkNormAxis::model})
    for (const QkNormGain gain : {QkNormGain::w, QkNormGain::one_plus_w}) {
      Generator gen(11);
      const Tensor x = randn({2, 3, 8}, DType::float64, gen);
      AttentionSpec spec = gqa_spec();
      spec.head_width = 4;  // RoPE pairs need an even width: H*d 16, Hkv*d 8
      spec.causal = true;
      spec.qk_norm = norm(axis, gain);
      spec.rope.enabled = true;
      spec.rope.style = RopeStyle::half;
      const bool model = axis == QkNormAxis::model;
      const Tensor wq4 = randn({16, 8}, DType::float64, gen, 0.5), wk4 = randn({8, 8}, DType::float64, gen, 0.5);
      const Tensor wv4 = randn({8, 8}, DType::float64, gen, 0.5), wo4 = randn({8, 16}, DType::float64, gen, 0.5);
      const Tensor gq4 = gains(model ? 16 : 4, gain, gen), gk4 = gains(model ? 8 : 4, gain, gen);
      for (const char* name : kPlugins) {
        const Attention& p = plugin(name);
        const GradcheckResult r = gradcheck(
            [&](const std::vector<Variable>& v) {
              MhaWeights w{v[1], v[2], v[3], v[4]};
              w.q_norm = v[5];
              w.k_norm = v[6];
              return p.mha_forward(v[0], w, spec);
            },
            {x, wq4, wk4, wv4, wo4, gq4, gk4});
        EXPECT_TRUE(r.ok) << name << " axis=" << qk_norm_axis_name(axis) << " gain=" << qk_norm_gain_name(gain)
                          << ": " << r.message;
        EXPECT_EQ(r.elements_checked, 48 + 128 + 64 + 64 + 128 + (model ? 16 + 8 : 4 + 4)) << name;
      }
    }
}

// ---------------------------------------------------------------- cross-attention in the plugins

// Finite differences on x [2, 3, 8], x_kv [2, 5, 8] (Tq != Tk), every weight
// and bias, GQA, causal (top-left) and not, per plugin; with QK-norm on both
// sides too (Mllama's cross layers).
TEST_F(QkNormCross, GradcheckOfCrossAttentionWithGqaAndBiasesPerPlugin) {
  Generator gen(17);
  const Tensor x = randn({2, 3, 8}, DType::float64, gen), x_kv = randn({2, 5, 8}, DType::float64, gen);
  const Tensor wq = randn({12, 8}, DType::float64, gen, 0.5), wk = randn({6, 8}, DType::float64, gen, 0.5);
  const Tensor wv = randn({6, 8}, DType::float64, gen, 0.5), wo = randn({8, 12}, DType::float64, gen, 0.5);
  const Tensor bq = randn({12}, DType::float64, gen), bk = randn({6}, DType::float64, gen);
  const Tensor bv = randn({6}, DType::float64, gen), bo = randn({8}, DType::float64, gen);
  const Tensor gq = gains(3, QkNormGain::w, gen), gk = gains(3, QkNormGain::w, gen);
  for (const char* name : kPlugins)
    for (const bool causal : {false, true})
      for (const bool with_norm : {false, true}) {
        const Attention& p = plugin(name);
        const GradcheckResult r = gradcheck(
            [&](const std::vector<Variable>& v) {
              AttentionSpec spec = gqa_spec();
              spec.causal = causal;
              spec.x_kv = v[1];
              MhaWeights w{v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9]};
              if (with_norm) {
                spec.qk_norm = norm(QkNormAxis::head, QkNormGain::w);
                w.q_norm = v[10];
                w.k_norm = v[11];
              }
              return p.mha_forward(v[0], w, spec);
            },
            {x, x_kv, wq, wk, wv, wo, bq, bk, bv, bo, gq, gk});
        EXPECT_TRUE(r.ok) << name << " causal=" << causal << " qk_norm=" << with_norm << ": " << r.message;
        // the gains count only when they are used (an unused input has no gradient to check)
        EXPECT_GE(r.elements_checked, 48 + 80 + 96 + 48 + 48 + 96 + 12 + 6 + 6 + 8) << name;
      }
}

// ---------------------------------------------------------------- agreement and identities

struct Grads {
  Tensor out;
  std::vector<Tensor> grads;  // of every input, in order
};

// out and the gradients of loss = sum(out * r) for inputs[0] = x,
// [1] = x_kv (undefined: self-attention), then wq, wk, wv, wo, q_norm, k_norm.
Grads run(const Attention& p, const std::vector<Tensor>& inputs, AttentionSpec spec, const Tensor& r) {
  std::vector<Variable> v;
  for (const Tensor& t : inputs) v.emplace_back(t.defined() ? Variable(t, true) : Variable());
  spec.x_kv = v[1];
  MhaWeights w{v[2], v[3], v[4], v[5]};
  w.q_norm = v[6];
  w.k_norm = v[7];
  const Variable out = p.mha_forward(v[0], w, spec);
  sum(mul(out, Variable(r))).backward();
  Grads g{out.data(), {}};
  for (const Variable& x : v) g.grads.push_back(x.defined() ? x.grad() : Tensor());
  return g;
}

struct Case {
  std::vector<Tensor> inputs;
  Tensor r;
};

// H 6, Hkv 2 (no power-of-two pattern), d 4, per-dim gains; cross at Tq 5, Tk 9.
Case make_case(QkNormAxis axis, QkNormGain gain, bool cross, std::uint64_t seed) {
  Generator gen(seed);
  const bool model = axis == QkNormAxis::model;
  Case c;
  c.inputs = {randn({2, 5, 12}, DType::float64, gen), cross ? randn({2, 9, 12}, DType::float64, gen) : Tensor(),
              randn({24, 12}, DType::float64, gen, 0.4), randn({8, 12}, DType::float64, gen, 0.4),
              randn({8, 12}, DType::float64, gen, 0.4), randn({12, 24}, DType::float64, gen, 0.4),
              gains(model ? 24 : 4, gain, gen), gains(model ? 8 : 4, gain, gen)};
  c.r = randn({2, 5, 12}, DType::float64, gen);
  return c;
}

AttentionSpec spec_6_2(QkNormAxis axis, QkNormGain gain, bool rope) {
  AttentionSpec s;
  s.d_model = 12;
  s.num_heads = 6;
  s.num_kv_heads = 2;
  s.head_width = 4;
  s.qk_norm = norm(axis, gain);
  s.rope.enabled = rope;
  s.rope.theta = 100.0;
  return s;
}

// per_head's RMSNorm from elementary ops against the rms_norm op of batched and
// fused_sdpa: out and every gradient, both axes and conventions, RoPE on.
TEST_F(QkNormCross, ThreePluginsAgreeOnQkNormWithRopeAndGqa) {
  for (const QkNormAxis axis : {QkNormAxis::head, QkNormAxis::model})
    for (const QkNormGain gain : {QkNormGain::w, QkNormGain::one_plus_w}) {
      const Case c = make_case(axis, gain, false, 23);
      AttentionSpec spec = spec_6_2(axis, gain, true);
      spec.causal = true;
      const Grads want = run(plugin("per_head"), c.inputs, spec, c.r);
      for (const char* name : {"batched", "fused_sdpa"}) {
        const Grads got = run(plugin(name), c.inputs, spec, c.r);
        EXPECT_LT(max_abs_diff(got.out, want.out), 1e-12) << name;
        for (std::size_t i = 0; i < want.grads.size(); ++i)
          if (want.grads[i].defined()) {
            EXPECT_LT(max_abs_diff(got.grads[i], want.grads[i]), 1e-11) << name << " input " << i;
          }
      }
      // the gains matter: dq_norm is not zero
      double norm_q = 0;
      for (double g : want.grads[6].to_vector()) norm_q += std::abs(g);
      EXPECT_GT(norm_q, 1e-3);
    }
}

TEST_F(QkNormCross, ThreePluginsAgreeOnCrossAttentionAtTq5Tk9) {
  for (const bool causal : {false, true}) {
    const Case c = make_case(QkNormAxis::head, QkNormGain::w, true, 29);
    AttentionSpec spec = spec_6_2(QkNormAxis::head, QkNormGain::w, false);
    spec.qk_norm.enabled = false;
    spec.causal = causal;
    const Grads want = run(plugin("per_head"), c.inputs, spec, c.r);
    EXPECT_EQ(want.grads[1].shape(), (Shape{2, 9, 12}));  // dx_kv
    for (const char* name : {"batched", "fused_sdpa"}) {
      const Grads got = run(plugin(name), c.inputs, spec, c.r);
      EXPECT_LT(max_abs_diff(got.out, want.out), 1e-12) << name;
      for (std::size_t i = 0; i < 6; ++i) EXPECT_LT(max_abs_diff(got.grads[i], want.grads[i]), 1e-11) << name << " input " << i;
    }
  }
}

// x_kv = x (a copy, its own leaf) is self-attention: the same out, and the
// self-attention dx splits into the query side's dx and the key/value side's dx_kv.
TEST_F(QkNormCross, CrossWithXkvEqualToXIsSelfAttentionAndDxSplits) {
  const Case c = make_case(QkNormAxis::head, QkNormGain::w, false, 31);
  for (const char* name : kPlugins) {
    AttentionSpec spec = spec_6_2(QkNormAxis::head, QkNormGain::w, false);
    spec.causal = true;
    const Grads self = run(plugin(name), c.inputs, spec, c.r);
    std::vector<Tensor> cross_in = c.inputs;
    cross_in[1] = c.inputs[0].clone();
    const Grads cross = run(plugin(name), cross_in, spec, c.r);
    EXPECT_LT(max_abs_diff(cross.out, self.out), 1e-13) << name;
    const std::vector<double> dx = self.grads[0].to_vector(), dq = cross.grads[0].to_vector(),
                              dkv = cross.grads[1].to_vector();
    ASSERT_EQ(dq.size(), dx.size());
    for (std::size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dq[i] + dkv[i], dx[i], 1e-12) << name << " " << i;
    for (std::size_t i = 2; i < 8; ++i) EXPECT_LT(max_abs_diff(cross.grads[i], self.grads[i]), 1e-12) << name << " " << i;
  }
}

// With one head (H = Hkv = 1) the head and the whole projection are the same
// row: axis head and axis model give the same numbers.
TEST_F(QkNormCross, OneHeadMakesTheTwoAxesOne) {
  Generator gen(37);
  const std::vector<Tensor> in = {randn({2, 4, 6}, DType::float64, gen), Tensor(),
                                  randn({6, 6}, DType::float64, gen, 0.4), randn({6, 6}, DType::float64, gen, 0.4),
                                  randn({6, 6}, DType::float64, gen, 0.4), randn({6, 6}, DType::float64, gen, 0.4),
                                  gains(6, QkNormGain::w, gen), gains(6, QkNormGain::w, gen)};
  const Tensor r = randn({2, 4, 6}, DType::float64, gen);
  AttentionSpec s;
  s.d_model = 6;
  s.num_heads = 1;
  s.qk_norm = norm(QkNormAxis::head, QkNormGain::w);
  for (const char* name : kPlugins) {
    const Grads head = run(plugin(name), in, s, r);
    AttentionSpec m = s;
    m.qk_norm.axis = QkNormAxis::model;
    const Grads model = run(plugin(name), in, m, r);
    EXPECT_LT(max_abs_diff(head.out, model.out), 1e-13) << name;
    for (std::size_t i : {0u, 2u, 6u, 7u}) EXPECT_LT(max_abs_diff(head.grads[i], model.grads[i]), 1e-12) << name;
  }
}

// With eps 0 the norm forgets any positive scale of wq and wk: out is the
// same for 3 wq and wk / 2 (and without the norm it is not).
TEST_F(QkNormCross, TheNormForgetsTheScaleOfTheProjections) {
  for (const char* name : kPlugins)
    for (const QkNormAxis axis : {QkNormAxis::head, QkNormAxis::model}) {
      const Case cc = make_case(axis, QkNormGain::w, false, 41);
      std::vector<Tensor> s2 = cc.inputs;
      s2[2] = kernels::scale(cc.inputs[2], 3.0);
      s2[3] = kernels::scale(cc.inputs[3], 0.5);
      AttentionSpec spec = spec_6_2(axis, QkNormGain::w, true);
      spec.qk_norm.eps = 0.0;
      EXPECT_LT(max_abs_diff(run(plugin(name), cc.inputs, spec, cc.r).out, run(plugin(name), s2, spec, cc.r).out), 1e-12)
          << name;
      spec.qk_norm.enabled = false;
      std::vector<Tensor> plain = cc.inputs, plain2 = s2;
      plain[6] = plain[7] = plain2[6] = plain2[7] = Tensor();
      EXPECT_GT(max_abs_diff(run(plugin(name), plain, spec, cc.r).out, run(plugin(name), plain2, spec, cc.r).out), 1e-3)
          << name;
    }
}

// ---------------------------------------------------------------- refused

std::string refusal(const Attention& p, const Variable& x, const MhaWeights& w, const AttentionSpec& s) {
  try {
    p.mha_forward(x, w, s);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST_F(QkNormCross, RopeWithCrossAndWrongShapesAreRefusedNamingWhat) {
  const Case c = make_case(QkNormAxis::model, QkNormGain::w, true, 43);
  const Variable x(c.inputs[0]);
  MhaWeights w{Variable(c.inputs[2]), Variable(c.inputs[3]), Variable(c.inputs[4]), Variable(c.inputs[5])};
  for (const char* name : kPlugins) {
    AttentionSpec s = spec_6_2(QkNormAxis::model, QkNormGain::w, true);
    s.qk_norm.enabled = false;
    s.x_kv = Variable(c.inputs[1]);
    EXPECT_TRUE(contains(refusal(plugin(name), x, w, s), "RoPE with cross-attention (x_kv) is not defined"))
        << name << ": " << refusal(plugin(name), x, w, s);
    s.rope.enabled = false;
    s.x_kv = Variable(Tensor::zeros({2, 9, 10}, DType::float64));
    EXPECT_TRUE(contains(refusal(plugin(name), x, w, s), "x_kv is [2, 9, 10], expected [..., Tk, 12]")) << name;
    s.x_kv = Variable();
    s.qk_norm = norm(QkNormAxis::model, QkNormGain::w);
    w.q_norm = Variable(c.inputs[6]);
    w.k_norm = Variable(Tensor::ones({4}, DType::float64));  // [d] where axis model wants [Hkv*d]
    EXPECT_TRUE(contains(refusal(plugin(name), x, w, s), "k_norm is [4], expected [8] (qk_norm axis model"))
        << name << ": " << refusal(plugin(name), x, w, s);
    w.q_norm = Variable();
    EXPECT_TRUE(contains(refusal(plugin(name), x, w, s), "q_norm is undefined, expected [24]")) << name;
    w.k_norm = Variable();
  }
}

TEST_F(QkNormCross, ThePluginsDeclareBothCapabilities) {
  for (const char* name : kPlugins) {
    const Capabilities& c = registry_->get(name).info.capabilities;
    EXPECT_TRUE(c.qk_norm) << name;
    EXPECT_TRUE(c.cross_attention) << name;
  }
}

// ---------------------------------------------------------------- suites

CaseResult run_case(const std::string& yaml, const PluginRegistry& registry) {
  const Suite s = parse_suite("suite: t\ncases:\n" + yaml, "qk.yaml");
  return analysis::check_case(s.cases.at(0), registry, {});
}

const TensorComparison* tensor(const CaseResult& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string parse_error(const std::string& yaml) {
  try {
    parse_suite("suite: t\ncases:\n" + yaml, "qk.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST_F(QkNormCross, SuiteKeysTensorNamesAndDefaults) {
  const Suite s = parse_suite(
      "suite: t\ndefaults: {qk_norm: {axis: model, eps: 1.0e-5, gain: one_plus_w}, check: [out, dx, dwq, dwk]}\ncases:\n"
      "  - {name: m, compare: [per_head, batched], shape: {B: 2, T: 3, D: 12, H: 6, Hkv: 2}}\n"
      "  - {name: x, cross: true, qk_norm: false, compare: [per_head, batched], shape: {B: 2, Tq: 5, Tk: 9, D: 12, H: 6}}\n"
      "  - {name: c, level: core, compare: [per_head, batched], shape: {B: 1, H: 2, Tq: 3, Tk: 3, d: 4}}\n",
      "qk.yaml");
  const CaseSpec& m = s.cases[0];
  EXPECT_TRUE(m.qk_norm.enabled);
  EXPECT_EQ(m.qk_norm.axis, QkNormAxis::model);
  EXPECT_EQ(m.qk_norm.gain, QkNormGain::one_plus_w);
  EXPECT_EQ(m.qk_norm.eps, 1e-5);
  // the defaults' list brings the gains' gradients with dwq and dwk
  EXPECT_EQ(m.check, (std::vector<std::string>{"out", "dx", "dwq", "dwk", "dq_norm", "dk_norm"}));
  EXPECT_TRUE(contains(describe_case(m), "qk_norm=model/one_plus_w/eps=1e-05")) << describe_case(m);
  const CaseSpec& x = s.cases[1];
  EXPECT_FALSE(x.qk_norm.enabled);  // qk_norm: false turns the default off
  EXPECT_TRUE(x.cross);
  EXPECT_EQ(x.dims.T, 5);  // x's length is Tq
  EXPECT_EQ(x.kv_length(), 9);
  EXPECT_EQ(x.check, (std::vector<std::string>{"out", "dx", "dwq", "dwk", "dx_kv"}));
  EXPECT_EQ(tensor_names(x), (std::vector<std::string>{"out", "dx", "dwq", "dwk", "dwv", "dwo", "dx_kv"}));
  EXPECT_TRUE(contains(describe_case(x), "Tq=5,Tk=9")) << describe_case(x);
  EXPECT_FALSE(s.cases[2].qk_norm.enabled);  // one default serves both levels
}

TEST_F(QkNormCross, BadKeysAreTypedErrorsNamingTheKeyAndWhere) {
  const std::string shape = "shape: {B: 2, T: 3, D: 12, H: 6}";
  std::string e = parse_error("  - {name: c, compare: [per_head, batched], " + shape + ", qk_norm: {axis: heads}}\n");
  EXPECT_TRUE(contains(e, "qk.yaml:3:")) << e;
  EXPECT_TRUE(contains(e, "'qk_norm: axis' must be head | model, got 'heads' (did you mean 'head'?)")) << e;
  e = parse_error("  - {name: c, compare: [per_head, batched], " + shape + ", qk_norm: {gain: 1w}}\n");
  EXPECT_TRUE(contains(e, "'qk_norm: gain' must be w | one_plus_w")) << e;
  e = parse_error("  - {name: c, compare: [per_head, batched], " + shape + ", qk_norm: {eps: -1}}\n");
  EXPECT_TRUE(contains(e, "'qk_norm: eps' must be in (0, 1]")) << e;
  e = parse_error("  - {name: c, compare: [per_head, batched], " + shape + ", qk_norm: {axes: head}}\n");
  EXPECT_TRUE(contains(e, "unknown key 'axes' in 'qk_norm' (did you mean 'axis'?)")) << e;
  e = parse_error("  - {name: c, compare: [per_head, batched], " + shape + ", qk_norm: true}\n");
  EXPECT_TRUE(contains(e, "'qk_norm' must be a map {axis: head|model")) << e;
  e = parse_error("  - {name: c, level: core, compare: [per_head, batched], shape: {B: 1, H: 2, Tq: 3, Tk: 3, d: 4}, "
                  "qk_norm: {axis: head}}\n");
  EXPECT_TRUE(contains(e, "'qk_norm' belongs to the mha level")) << e;
  e = parse_error("  - {name: c, level: core, cross: true, compare: [per_head, batched], shape: {B: 1, H: 2, Tq: 3, Tk: 3, d: 4}}\n");
  EXPECT_TRUE(contains(e, "'cross: true' belongs to the mha level")) << e;
  e = parse_error("  - {name: c, cross: true, compare: [per_head, batched], shape: {B: 2, Tq: 3, Tk: 4, D: 12, H: 6}, "
                  "rope: {theta: 100}}\n");
  EXPECT_TRUE(contains(e, "RoPE is not defined for cross-attention")) << e;
  e = parse_error("  - {name: c, cross: true, compare: [per_head, batched], " + shape + "}\n");
  EXPECT_TRUE(contains(e, "'cross: true' needs the query and key lengths: shape: {Tq: .., Tk: ..}")) << e;
  e = parse_error("  - {name: c, compare: [per_head, batched], shape: {B: 2, T: 3, Tk: 5, D: 12, H: 6}}\n");
  EXPECT_TRUE(contains(e, "'Tk' at the mha level is for 'cross: true'")) << e;
  e = parse_error("  - {name: c, cross: yes please, compare: [per_head, batched], " + shape + "}\n");
  EXPECT_TRUE(contains(e, "'cross' must be true or false")) << e;
  e = parse_error("  - {name: c, compare: [per_head, batched], check: [out, dq_norm], " + shape + "}\n");
  EXPECT_TRUE(contains(e, "'dq_norm' is not a mha-level tensor")) << e;
}

// Every earlier input keeps its value; the gains (per dim, around 1 for gain w,
// around 0 for one_plus_w) come after the biases, x_kv after them.
TEST_F(QkNormCross, GainsAndXkvAreDrawnAfterEverythingElse) {
  Dims d;
  d.B = 2, d.T = 3, d.D = 8, d.H = 4, d.Hkv = 2, d.d = 3;
  const QkNormSpec n = norm(QkNormAxis::model, QkNormGain::w);
  const CaseInputs plain = seeded_inputs(Level::mha, d, DType::float64, 7, true);
  const CaseInputs both = seeded_inputs(Level::mha, d, DType::float64, 7, true, n, 5);
  for (const auto& [a, b] : {std::pair{&plain.x, &both.x}, {&plain.wq, &both.wq}, {&plain.wk, &both.wk},
                             {&plain.wv, &both.wv}, {&plain.wo, &both.wo}, {&plain.r, &both.r}, {&plain.bq, &both.bq},
                             {&plain.bo, &both.bo}})
    EXPECT_EQ(a->to_vector(), b->to_vector());
  EXPECT_FALSE(plain.q_norm.defined() || plain.x_kv.defined());
  Generator gen(7);
  for (const Shape& s : {Shape{2, 3, 8}, Shape{12, 8}, Shape{6, 8}, Shape{6, 8}, Shape{8, 12}, Shape{2, 3, 8},
                         Shape{12}, Shape{6}, Shape{6}, Shape{8}})
    (void)randn(s, DType::float64, gen);
  std::vector<double> gq = randn({12}, DType::float64, gen, 0.5).to_vector(), gk = randn({6}, DType::float64, gen, 0.5).to_vector();
  for (double& v : gq) v += 1;
  for (double& v : gk) v += 1;
  EXPECT_EQ(both.q_norm.to_vector(), gq);
  EXPECT_EQ(both.k_norm.to_vector(), gk);
  EXPECT_EQ(both.x_kv.to_vector(), randn({2, 5, 8}, DType::float64, gen).to_vector());
  // not uniform
  const std::vector<double> g = both.q_norm.to_vector();
  EXPECT_GT(*std::max_element(g.begin(), g.end()) - *std::min_element(g.begin(), g.end()), 0.3);
}

TEST_F(QkNormCross, PluginWithoutTheCapabilitiesIsRefusedNamingThem) {
  const Suite s = parse_suite("suite: t\ncases:\n  - {name: c, cross: true, qk_norm: {axis: head}, compare: [per_head, batched], "
                              "shape: {B: 2, Tq: 3, Tk: 4, D: 8, H: 2}}\n", "qk.yaml");
  Capabilities caps;
  caps.mha = caps.float64 = true;
  const auto missing = missing_capabilities(s.cases[0], caps);
  ASSERT_EQ(missing.size(), 2u);
  EXPECT_EQ(missing[0].first, "qk_norm");
  EXPECT_TRUE(contains(missing[0].second, "the case has 'qk_norm'"));
  EXPECT_EQ(missing[1].first, "cross_attention");
  EXPECT_TRUE(contains(missing[1].second, "the case has 'cross: true'"));
  caps.qk_norm = caps.cross_attention = true;
  EXPECT_TRUE(missing_capabilities(s.cases[0], caps).empty());
}

// The three plugin pairs in every dtype, a transposed and a sliced layout (x_kv
// too), GQA, RoPE with QK-norm, both causal alignments with cross.
TEST_F(QkNormCross, CasesPassForEveryPairDtypeAndLayout) {
  const std::string gqa = "B: 2, D: 24, H: 6, Hkv: 2";
  for (const char* other : {"batched", "fused_sdpa"})
    for (const char* dtype : {"float64", "float32", "bfloat16", "float16"})
      for (const std::string& extra : {std::string("qk_norm: {axis: head, gain: one_plus_w}, rope: {theta: 100, style: half}, "
                                                  "causal: true, shape: {T: 7, ") + gqa + "}",
                                      std::string("qk_norm: {axis: model}, input_layout: transposed, shape: {T: 7, ") + gqa + "}",
                                      std::string("cross: true, input_layout: sliced, shape: {Tq: 5, Tk: 9, ") + gqa + "}",
                                      std::string("cross: true, causal: bottom_right, shape: {Tq: 9, Tk: 5, ") + gqa + "}"}) {
        const CaseResult r = run_case(std::string("  - {name: c, compare: [per_head, ") + other + "], dtype: " + dtype +
                                          ", " + extra + "}\n",
                                      *registry_);
        EXPECT_EQ(r.status, CaseStatus::pass) << other << " " << dtype << " " << extra << ": " << r.cause;
        const bool cross = contains(extra, "cross");
        for (const char* t : {"dq_norm", "dk_norm", "dx_kv"}) {
          const bool want = cross == (std::string(t) == "dx_kv");
          EXPECT_EQ(tensor(r, t) != nullptr, want) << t << " in " << extra;
        }
      }
}

// Each catalog bug of the two features: caught and named at a shape where it shows.
TEST_F(QkNormCross, EachCatalogBugIsCaughtAndNamed) {
  const std::string norm_case = "shape: {B: 2, T: 7, D: 24, H: 6, Hkv: 2}, causal: true, qk_norm: {axis: head}";
  const std::pair<const char*, std::string> cases[] = {
      {"qk_norm_ignored", norm_case},
      {"qk_norm_missing_on_k", norm_case},
      {"qk_norm_axis_swapped", "shape: {B: 2, T: 7, D: 24, H: 6, Hkv: 2}, qk_norm: {axis: model}"},
      {"qk_norm_after_rope", norm_case + ", rope: {theta: 10000, style: half}"},
      {"qk_norm_gain_convention", "shape: {B: 2, T: 7, D: 24, H: 6, Hkv: 3}, qk_norm: {axis: head, gain: one_plus_w}"},
      {"qk_norm_eps", norm_case},
      {"cross_causal", "shape: {B: 2, Tq: 5, Tk: 9, D: 24, H: 6, Hkv: 2}, cross: true"},
      {"cross_kv_from_queries", "shape: {B: 2, Tq: 5, Tk: 9, D: 24, H: 6, Hkv: 2}, cross: true"},
  };
  for (const auto& [bug, extra] : cases) {
    const CaseResult r = run_case("  - {name: c, compare: [mutant_" + std::string(bug) + ", per_head], " + extra + "}\n",
                                  *registry_);
    ASSERT_EQ(r.status, CaseStatus::fail) << bug << ": " << r.cause;
    ASSERT_TRUE(r.diagnosis) << bug;
    EXPECT_EQ(r.diagnosis->best(), bug) << r.diagnosis->sentence;
  }
}

TEST_F(QkNormCross, LocalizationTurnsTheNormOffAndBringsTqToTk) {
  CaseResult r = run_case("  - {name: c, compare: [mutant_qk_norm_gain_convention, per_head], "
                          "shape: {B: 2, T: 5, D: 24, H: 6, Hkv: 2}, qk_norm: {axis: head}}\n",
                          *registry_);
  ASSERT_TRUE(r.localization);
  // (at T = 1 too: one key makes the softmax constant, whatever q and k are)
  EXPECT_TRUE(contains(r.localization->sentence, "and qk_norm off")) << r.localization->sentence;
  EXPECT_TRUE(contains(r.localization->sentence, "QK-norm (it shows only with the norm on)")) << r.localization->sentence;
  r = run_case("  - {name: c, compare: [mutant_cross_kv_from_queries, per_head], "
               "shape: {B: 2, Tq: 5, Tk: 9, D: 24, H: 6, Hkv: 2}, cross: true}\n",
               *registry_);
  ASSERT_TRUE(r.localization);
  bool tq_tk = false;
  for (const auto& row : r.localization->rows) tq_tk = tq_tk || row.change == "Tq = Tk = 9";
  EXPECT_TRUE(tq_tk);
  // the error map of dx_kv has x_kv's tokens as rows (a causal mask on cross-attention)
  const CaseResult causal = run_case("  - {name: c, compare: [mutant_cross_causal, per_head], "
                                     "shape: {B: 2, Tq: 5, Tk: 9, D: 24, H: 6, Hkv: 2}, cross: true}\n",
                                     *registry_);
  bool kv_map = false;
  for (const auto& m : causal.error_maps)
    if (m.tensor == "dx_kv") kv_map = contains(m.axes, "rows: x_kv's tokens (keys)") && m.maps.size() == 2;
  EXPECT_TRUE(kv_map);
  // the missing gradient is named
  ASSERT_TRUE(tensor(r, "dx_kv"));
  EXPECT_TRUE(contains(tensor(r, "dx_kv")->problem, "gives no dx_kv")) << tensor(r, "dx_kv")->problem;
}

// export writes the gains, x_kv and their gradients and a suite with the
// case's qk_norm and cross; that suite passes against them, and a reference
// whose gain file the case does not explain is refused naming the file.
TEST_F(QkNormCross, ExportWritesGainsAndXkvAndItsSuitePasses) {
  const fs::path dir = fs::temp_directory_path() / ("headgrad_qk_export_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "gen.yaml") << "suite: t\ncases:\n  - {name: c, cross: true, qk_norm: {axis: model, gain: one_plus_w}, "
                                     "compare: [batched, per_head], shape: {B: 2, Tq: 3, Tk: 5, D: 12, H: 6, Hkv: 2}}\n";
  const fs::path out = dir / "exported";
  const test::Outcome e = test::headgrad({"export", (dir / "gen.yaml").string(), "--case", "c", "--out", out.string()});
  ASSERT_EQ(e.code, 0) << e.out << e.err;
  for (const char* stem : {"q_norm", "k_norm", "x_kv", "dq_norm", "dk_norm", "dx_kv"})
    EXPECT_TRUE(fs::is_regular_file(out / (std::string(stem) + ".npy"))) << stem;
  const std::string suite = test::slurp(out / "suite.yaml");
  // eps at 17 digits, so that it reads back exactly
  EXPECT_TRUE(contains(suite, "qk_norm: {axis: model, eps: 9.9999999999999995e-07, gain: one_plus_w}")) << suite;
  EXPECT_TRUE(contains(suite, "cross: true")) << suite;
  const test::Outcome r = test::headgrad({"run", (out / "suite.yaml").string()});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "Tq=3,Tk=5")) << r.out;
  // the same files without the case's keys: the gain and x_kv files are refused by name
  std::ofstream(dir / "bare.yaml") << "suite: t\ncases:\n  - {name: c, compare: [per_head], reference: exported, "
                                      "shape: {H: 6}}\n";
  const test::Outcome b = test::headgrad({"run", (dir / "bare.yaml").string()});
  EXPECT_EQ(b.code, 2) << b.out << b.err;
  EXPECT_TRUE(contains(b.err, "q_norm.npy is a QK-norm gain, but the case has no 'qk_norm'")) << b.err;
  fs::remove_all(dir);
}

// Where-lines name the new tensors' own axes: x_kv's tokens are keys; a shared
// [d] gain has channels only; an [H*d] gain has heads of d.
TEST_F(QkNormCross, WhereLinesUseTheNewTensorsAxes) {
  const Suite s = parse_suite("suite: t\ncases:\n"
                              "  - {name: h, cross: true, qk_norm: {axis: head}, compare: [per_head, batched], "
                              "shape: {B: 2, Tq: 5, Tk: 9, D: 24, H: 6, Hkv: 2}}\n"
                              "  - {name: m, qk_norm: {axis: model}, compare: [per_head, batched], "
                              "shape: {B: 2, T: 5, D: 24, H: 6, Hkv: 2}}\n",
                              "qk.yaml");
  const CaseSpec& h = s.cases[0];
  const CaseSpec& m = s.cases[1];
  const std::int64_t at_kv[] = {1, 7, 13}, at_gain[] = {3}, at_kgain[] = {6};
  EXPECT_EQ(describe_index(Level::mha, "dx_kv", {2, 9, 24}, at_kv, head_blocks(h, "dx_kv")), "b=1, k=7, head=3, ch=1");
  EXPECT_EQ(describe_index(Level::mha, "dq_norm", {4}, at_gain, head_blocks(h, "dq_norm")), "ch=3");
  EXPECT_EQ(describe_index(Level::mha, "dk_norm", {8}, at_kgain, head_blocks(m, "dk_norm")), "head=1, ch=2");
  EXPECT_EQ(head_blocks(m, "dq_norm"), 6);
  EXPECT_EQ(head_blocks(m, "dk_norm"), 2);
}

TEST_F(QkNormCross, WeakSuiteWarningsForCrossOnlyCausalOrSquareAndNormWithoutRope) {
  const Suite s = parse_suite(
      "suite: t\ncases:\n"
      "  - {name: a, cross: true, causal: true, compare: [per_head, batched], shape: {B: 2, Tq: 4, Tk: 4, D: 8, H: 2}}\n"
      "  - {name: b, qk_norm: {axis: head}, dtype: float32, compare: [per_head, batched], shape: {B: 2, T: 4, D: 8, H: 2, Hkv: 1}}\n",
      "qk.yaml");
  std::vector<const CaseSpec*> cases = {&s.cases[0], &s.cases[1]};
  std::string all;
  for (const auto& w : analysis::weak_suite_warnings(cases)) all += w.message + "\n";
  EXPECT_TRUE(contains(all, "every cross-attention case is causal")) << all;
  EXPECT_TRUE(contains(all, "so it cannot catch cross_causal")) << all;
  EXPECT_TRUE(contains(all, "every cross-attention case has Tq = Tk")) << all;
  EXPECT_TRUE(contains(all, "no QK-norm case has RoPE with per-dim gains")) << all;
  EXPECT_TRUE(contains(all, "every QK-norm case has H = 1 or Hkv = 1")) << all;
  EXPECT_TRUE(contains(all, "no QK-norm case is float64")) << all;
  // a reference with RoPE whose gains are uniform (the ones-init) is a blind spot; its
  // committed per-dim gains are not
  const fs::path dir = fs::temp_directory_path() / ("headgrad_qk_uniform_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path ref = HEADGRAD_SOURCE_ROOT "/configs/refs/mha_B2_T7_D24_H6_Hkv2_causal_qknorm_head_rope_float64";
  fs::copy(ref, dir / "ref", fs::copy_options::recursive);
  const std::string rope_case = "compare: [per_head], shape: {H: 6}, causal: true, qk_norm: {axis: head}, "
                                "rope: {theta: 10000.0, style: half, rotary_dim: 4}";
  std::ofstream(dir / "s.yaml") << "suite: t\ncases:\n  - {name: a, reference: ref, " << rope_case << "}\n";
  auto warnings_of = [&](const fs::path& suite) {
    const Suite loaded = load_suite(suite);
    std::string text;
    for (const auto& w : analysis::weak_suite_warnings({&loaded.cases[0]})) text += w.message + "\n";
    return text;
  };
  EXPECT_FALSE(contains(warnings_of(dir / "s.yaml"), "no QK-norm case has RoPE with per-dim gains"));
  write_npy(dir / "ref" / "q_norm.npy", Tensor::ones({4}, DType::float64));
  write_npy(dir / "ref" / "k_norm.npy", Tensor::ones({4}, DType::float64));
  EXPECT_TRUE(contains(warnings_of(dir / "s.yaml"), "no QK-norm case has RoPE with per-dim gains"));
  fs::remove_all(dir);
  // a suite without either feature has none of these warnings
  const Suite plain = parse_suite("suite: t\ncases:\n  - {name: a, compare: [per_head, batched], shape: {B: 2, T: 4, D: 8, H: 2}}\n",
                                  "qk.yaml");
  all.clear();
  for (const auto& w : analysis::weak_suite_warnings({&plain.cases[0]})) all += w.message + "\n";
  EXPECT_FALSE(contains(all, "QK-norm") || contains(all, "cross-attention")) << all;
}

}  // namespace

}  // namespace test_qk_norm_cross
