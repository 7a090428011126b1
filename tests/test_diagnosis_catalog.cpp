// The bug catalog against the mutant plugins: each hypothesis (written per
// head) must reproduce its mutant (written batched) exactly, on the output and
// every gradient, and must differ from the correct attention at a shape where
// the bug can show.
#include <gtest/gtest.h>

#include <cstdio>

#include <cmath>
#include <functional>

#include <headgrad/loader.hpp>

#include "attention_run.hpp"

#include "analysis/catalog.hpp"
#include "analysis/hypotheses.hpp"

namespace test_diagnosis_catalog {  // this file's names: test files share unity builds (tests/meson.build)

using namespace headgrad;
using namespace headgrad::diagnosis;

namespace {

using headgrad::test::run_core;
using headgrad::test::run_mha;

struct Grads {
  std::vector<Tensor> tensors;  // out, then the gradient of each input
};

// A bug of a sliding window, the soft-cap or the sinks: it needs the feature on
// (FeatureCatalogTest); with every feature off it is the correct attention.
bool feature_bug(const Visibility& v) { return v.needs_window || v.needs_softcap || v.needs_sinks; }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector(), vb = b.to_vector();
  double m = 0.0;
  for (std::size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

class CatalogTest : public ::testing::TestWithParam<BugInfo> {
 protected:
  static void SetUpTestSuite() {
    registry_ = new PluginRegistry();
    registry_->load_directories({HEADGRAD_BUILD_PLUGIN_DIR});
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }
  static PluginRegistry* registry_;

  // B=2, T=3, D=8, H=2 causal: every bug outside grouped kv heads can show here
  // (and 1/sqrt(D) != 1/d, so the scale bugs stay apart).
  struct Shape5 {
    std::int64_t B, T, D, H, Hkv, d;
  };
  static constexpr Shape5 kPlain{2, 3, 8, 2, 2, 4};
  // The grouped-kv bugs need 1 < Hkv < H and H != Hkv^2; G = 2 < Hkv keeps the
  // wrong divisor h / Hkv inside the kv heads, and d = 5 != D / H.
  static constexpr Shape5 kGrouped{2, 4, 8, 12, 6, 5};
  static Shape5 shape_for(const BugInfo& b) {
    const Visibility& v = b.visibility;
    return v.needs_group || v.needs_kv_heads || v.needs_non_square ? kGrouped : kPlain;
  }
  Shape5 s_ = kPlain;
  DType dtype_ = DType::float64;  // the inputs' dtype (drawn in float64, then rounded)

  std::vector<Tensor> inputs() const {
    const auto [B, T, D, H, Hkv, d] = s_;
    Generator gen(7);
    std::vector<Tensor> in = {
        randn({B, T, D}, DType::float64, gen), randn({H * d, D}, DType::float64, gen, 0.35),
        randn({Hkv * d, D}, DType::float64, gen, 0.35), randn({Hkv * d, D}, DType::float64, gen, 0.35),
        randn({D, H * d}, DType::float64, gen, 0.35), randn({B, T, D}, DType::float64, gen)};
    for (auto& t : in) t = t.to(dtype_);
    return in;
  }

  template <class F>
  Grads run_mha(F&& forward) const {
    const auto [B, T, D, H, Hkv, d] = s_;
    const auto in = inputs();
    AttentionSpec spec = test::causal_mha_spec(D, H, Hkv, d);
    return {test::run_mha([&](Variable& x, MhaWeights& w) { return forward(x, w, spec); },
                          in[0], in[1], in[2], in[3], in[4], in[5]).all()};
  }
};
PluginRegistry* CatalogTest::registry_ = nullptr;

TEST_P(CatalogTest, HypothesisReproducesMutantAndDiffersFromCorrect) {
  const BugInfo& info = GetParam();
  const std::string name = "mutant_" + std::string(info.name);
  const LoadedPlugin* mutant = registry_->find(name);
  ASSERT_NE(mutant, nullptr) << name << " is not built";
  EXPECT_TRUE(mutant->info.mutant);
  s_ = shape_for(info);

  const Grads from_plugin = run_mha([&](auto& x, auto& w, auto& s) {
    return mutant->attention->mha_forward(x, w, s);
  });
  const Grads hypothesis =
      run_mha([&](auto& x, auto& w, auto& s) { return hypothesis_mha(x, w, s, info.bug); });
  const Grads correct =
      run_mha([&](auto& x, auto& w, auto& s) { return hypothesis_mha(x, w, s, std::nullopt); });

  const char* names[] = {"out", "dx", "dwq", "dwk", "dwv", "dwo"};
  double distance_from_correct = 0.0;
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_LT(max_abs_diff(from_plugin.tensors[i], hypothesis.tensors[i]), 1e-12)
        << names[i] << " of " << name;
    distance_from_correct =
        std::max(distance_from_correct, max_abs_diff(hypothesis.tensors[i], correct.tensors[i]));
  }
  const auto& vis = info.visibility;
  const std::string at = "B=" + std::to_string(s_.B) + ", T=" + std::to_string(s_.T) + ", D=" + std::to_string(s_.D) +
                         ", H=" + std::to_string(s_.H) + ", Hkv=" + std::to_string(s_.Hkv) + ", d=" + std::to_string(s_.d);
  // Tq = Tk = T, no boolean mask (so no fully masked row), small logits, float64
  // here: such bugs cannot show (CrossLengthCatalogTest, EdgeCatalogTest and
  // LowPrecisionCatalogTest show them).
  // Nor without QK-norm, cross-attention, a window, a cap or sinks
  // (QkNormCrossCatalogTest and FeatureCatalogTest show those).
  if (vis.needs_tq_ne_tk || vis.needs_empty_row || vis.needs_large_logits || vis.needs_mask || vis.needs_16bit ||
      vis.needs_qk_norm || vis.needs_cross || feature_bug(vis))
    EXPECT_LT(distance_from_correct, 1e-12) << info.name << " shows at " << at;
  else
    EXPECT_GT(distance_from_correct, 1e-3) << info.name << " is invisible at " << at;
}

// The precision-only bugs in float16 at a shape with long sums (d = 64, T = 32):
// the hypothesis still reproduces the mutant bit for bit, and now both differ
// from the correct attention by far more than float16's own rounding does.
// The QK-norm and cross-attention bugs where they show: H 6, Hkv 2, per-dim
// gains, RoPE (half pairs) for the norm's order, Tq 5 and Tk 9 for cross. The
// hypothesis reproduces the mutant on out and every gradient (dx_kv, dq_norm,
// dk_norm included) and differs from the correct attention (qk_norm_eps by
// about 4.5e-6 / mean(q^2) relative, so above 1e-7 here, not 1e-3).
TEST_F(CatalogTest, QkNormCrossCatalogTestShowsThem) {
  for (const auto& info : bug_catalog()) {
    const auto& vis = info.visibility;
    if (!vis.needs_qk_norm && !vis.needs_cross) continue;
    const LoadedPlugin* mutant = registry_->find("mutant_" + std::string(info.name));
    ASSERT_NE(mutant, nullptr) << info.name;
    Generator gen(11);
    const std::int64_t B = 2, Tq = 5, Tk = vis.needs_cross ? 9 : 5, D = 24, H = 6, Hkv = 2, d = 4;
    const bool model = info.bug == Bug::qk_norm_axis_swapped;
    std::vector<double> gq = randn({model ? H * d : d}, DType::float64, gen, 0.5).to_vector();
    std::vector<double> gk = randn({model ? Hkv * d : d}, DType::float64, gen, 0.5).to_vector();
    for (double& g : gq) g += 1;
    for (double& g : gk) g += 1;
    const std::vector<Tensor> in = {
        randn({B, Tq, D}, DType::float64, gen), randn({H * d, D}, DType::float64, gen, 0.35),
        randn({Hkv * d, D}, DType::float64, gen, 0.35), randn({Hkv * d, D}, DType::float64, gen, 0.35),
        randn({D, H * d}, DType::float64, gen, 0.35), Tensor::from_values(gq, {static_cast<std::int64_t>(gq.size())}, DType::float64),
        Tensor::from_values(gk, {static_cast<std::int64_t>(gk.size())}, DType::float64),
        randn({B, Tk, D}, DType::float64, gen)};
    const Tensor r = randn({B, Tq, D}, DType::float64, gen);
    AttentionSpec spec = test::causal_mha_spec(D, H, Hkv, d);
    spec.causal = vis.needs_qk_norm;  // cross cases are not causal
    if (vis.needs_qk_norm) {
      spec.qk_norm.enabled = true;
      spec.qk_norm.axis = model ? QkNormAxis::model : QkNormAxis::head;
      spec.qk_norm.gain = QkNormGain::w;
      spec.rope.enabled = info.bug == Bug::qk_norm_after_rope;
      spec.rope.style = RopeStyle::half;
    }
    auto run = [&](auto&& forward) {
      std::vector<Variable> v;
      for (const Tensor& t : in) v.emplace_back(t, true);
      AttentionSpec s = spec;
      MhaWeights w{v[1], v[2], v[3], v[4]};
      if (vis.needs_qk_norm) w.q_norm = v[5], w.k_norm = v[6];
      if (vis.needs_cross) s.x_kv = v[7];
      const Variable out = forward(v[0], w, s);
      sum(mul(out, Variable(r))).backward();
      std::vector<Tensor> got = {out.data()};
      for (const Variable& x : v) got.push_back(x.grad().defined() ? x.grad() : Tensor::zeros(x.shape(), x.dtype()));
      return got;
    };
    const auto plugin = run([&](auto& x, auto& w, auto& s) { return mutant->attention->mha_forward(x, w, s); });
    const auto hypothesis = run([&](auto& x, auto& w, auto& s) { return hypothesis_mha(x, w, s, info.bug); });
    const auto correct = run([&](auto& x, auto& w, auto& s) { return hypothesis_mha(x, w, s, std::nullopt); });
    double distance = 0;
    for (std::size_t i = 0; i < plugin.size(); ++i) {
      EXPECT_LT(max_abs_diff(plugin[i], hypothesis[i]), 1e-12) << info.name << " tensor " << i;
      distance = std::max(distance, max_abs_diff(hypothesis[i], correct[i]));
    }
    EXPECT_GT(distance, info.bug == Bug::qk_norm_eps ? 1e-7 : 1e-3) << info.name;
  }
}

TEST_F(CatalogTest, LowPrecisionCatalogTestShowsThe16BitBugs) {
  for (const auto& info : bug_catalog()) {
    if (!info.visibility.needs_16bit) continue;
    const std::string name = "mutant_" + std::string(info.name);
    const LoadedPlugin* mutant = registry_->find(name);
    ASSERT_NE(mutant, nullptr) << name << " is not built";
    s_ = {2, 32, 128, 2, 2, 64};
    dtype_ = DType::float16;
    const Grads from_plugin = run_mha([&](auto& x, auto& w, auto& s) { return mutant->attention->mha_forward(x, w, s); });
    const Grads hypothesis = run_mha([&](auto& x, auto& w, auto& s) { return hypothesis_mha(x, w, s, info.bug); });
    const Grads correct = run_mha([&](auto& x, auto& w, auto& s) { return hypothesis_mha(x, w, s, std::nullopt); });
    dtype_ = DType::float32;  // the same bug in float32: as accurate as the correct attention
    const Grads mutant32 = run_mha([&](auto& x, auto& w, auto& s) { return mutant->attention->mha_forward(x, w, s); });
    const Grads correct32 = run_mha([&](auto& x, auto& w, auto& s) { return hypothesis_mha(x, w, s, std::nullopt); });
    // errors relative to each tensor's largest value (weight gradients sum B*T terms)
    auto rel = [](const Tensor& a, const Tensor& b) {
      const Tensor z = Tensor::zeros(b.shape(), b.dtype());
      return max_abs_diff(a, b) / max_abs_diff(b, z);
    };
    double far = 0.0, near32 = 0.0;
    for (std::size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(max_abs_diff(from_plugin.tensors[i], hypothesis.tensors[i]), 0.0) << i << " of " << name;
      far = std::max(far, rel(hypothesis.tensors[i], correct.tensors[i]));
      near32 = std::max(near32, rel(mutant32.tensors[i], correct32.tensors[i]));
    }
    // float16's epsilon is 2^-10, float32's 2^-23: far above the one, near the other
    EXPECT_GT(far, 8 * 0x1p-10) << info.name << " hides in float16";
    EXPECT_LT(near32, 64 * 0x1p-23) << info.name << " shows in float32";
    std::printf("%s: relative error %.3g in float16, %.3g in float32\n", name.c_str(), far, near32);
  }
}

// Only bugs that have a core-level form (not the projections or the head layout).
// The RoPE bugs need a rope block: tests/test_rope_diagnosis.cpp checks them.
std::vector<BugInfo> core_level_bugs() {
  std::vector<BugInfo> out;
  for (const auto& b : bug_catalog())
    if (!b.visibility.mha_only && !b.visibility.needs_rope) out.push_back(b);
  return out;
}

// Every bug that shows without a rope block.
std::vector<BugInfo> non_rope_bugs() {
  std::vector<BugInfo> out;
  for (const auto& b : bug_catalog())
    if (!b.visibility.needs_rope) out.push_back(b);
  return out;
}

class CoreCatalogTest : public CatalogTest {};

TEST_P(CoreCatalogTest, HypothesisReproducesMutant) {
  const BugInfo& info = GetParam();
  const LoadedPlugin* mutant = registry_->find("mutant_" + std::string(info.name));
  ASSERT_NE(mutant, nullptr);
  Generator gen(3);
  const Tensor q = randn({2, 2, 4, 3}, DType::float64, gen);
  const Tensor k = randn({2, 2, 4, 3}, DType::float64, gen);
  const Tensor v = randn({2, 2, 4, 3}, DType::float64, gen);
  const Tensor r = randn({2, 2, 4, 3}, DType::float64, gen);
  AttentionSpec spec;
  spec.causal = true;
  auto run = [&](auto&& forward) { return run_core(forward, q, k, v, r).all(); };
  const auto a = run([&](auto& x, auto& y, auto& z) {
    return mutant->attention->core_forward(x, y, z, spec);
  });
  const auto b = run([&](auto& x, auto& y, auto& z) { return hypothesis_core(x, y, z, spec, info.bug); });
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_LT(max_abs_diff(a[i], b[i]), 1e-12) << i;
}

// Bugs visible only at Tq != Tk, at a decode step (Tq = 1, Tk = 7) and at Tq > Tk
// (Tq = 6, Tk = 4): the hypothesis reproduces the mutant and differs from the
// correct attention, and at Tq = Tk = 4 the three agree.
std::vector<BugInfo> cross_length_bugs() {
  std::vector<BugInfo> out;
  for (const auto& b : bug_catalog())
    if (b.visibility.needs_tq_ne_tk && !feature_bug(b.visibility)) out.push_back(b);
  return out;
}

class CrossLengthCatalogTest : public CatalogTest {};

TEST_P(CrossLengthCatalogTest, HypothesisReproducesMutantOnlyWhereTqDiffersFromTk) {
  const BugInfo& info = GetParam();
  const LoadedPlugin* mutant = registry_->find("mutant_" + std::string(info.name));
  ASSERT_NE(mutant, nullptr);
  for (const auto& [tq, tk] : {std::pair<std::int64_t, std::int64_t>{1, 7}, {6, 4}, {4, 4}}) {
    Generator gen(5);
    const Tensor q = randn({2, 2, tq, 3}, DType::float64, gen);
    const Tensor k = randn({2, 2, tk, 3}, DType::float64, gen);
    const Tensor v = randn({2, 2, tk, 3}, DType::float64, gen);
    const Tensor r = randn({2, 2, tq, 3}, DType::float64, gen);
    AttentionSpec spec;
    spec.causal = true;
    auto run = [&](auto&& forward) { return run_core(forward, q, k, v, r).all(); };
    const auto m = run([&](auto& x, auto& y, auto& z) { return mutant->attention->core_forward(x, y, z, spec); });
    const auto h = run([&](auto& x, auto& y, auto& z) { return hypothesis_core(x, y, z, spec, info.bug); });
    const auto c = run([&](auto& x, auto& y, auto& z) { return hypothesis_core(x, y, z, spec, std::nullopt); });
    double from_correct = 0;
    for (std::size_t i = 0; i < m.size(); ++i) {
      EXPECT_LT(max_abs_diff(m[i], h[i]), 1e-12) << "tensor " << i << " at Tq=" << tq << " Tk=" << tk;
      from_correct = std::max(from_correct, max_abs_diff(h[i], c[i]));
    }
    if (tq == tk) EXPECT_LT(from_correct, 1e-12) << "Tq = Tk = " << tq;
    else EXPECT_GT(from_correct, 1e-3) << "Tq=" << tq << " Tk=" << tk;
  }
}

// Bugs that need a boolean mask, a query row with every key masked or logits
// past exp's range: reproduced at a core shape that has one, and different
// from the correct attention there (the correct one gives a fully masked row
// zeros and stays finite at any logit).
std::vector<BugInfo> edge_bugs() {
  std::vector<BugInfo> out;
  for (const auto& b : bug_catalog())
    if ((b.visibility.needs_empty_row || b.visibility.needs_large_logits || b.visibility.needs_mask) &&
        !feature_bug(b.visibility))  // a sinks bug's empty row: FeatureCatalogTest
      out.push_back(b);
  return out;
}

class EdgeCatalogTest : public CatalogTest {};

TEST_P(EdgeCatalogTest, HypothesisReproducesMutantWhereTheEdgeIs) {
  const BugInfo& info = GetParam();
  const LoadedPlugin* mutant = registry_->find("mutant_" + std::string(info.name));
  ASSERT_NE(mutant, nullptr);
  Generator gen(9);
  const Tensor q = randn({2, 2, 4, 3}, DType::float64, gen);
  const Tensor k = randn({2, 2, 5, 3}, DType::float64, gen);
  const Tensor v = randn({2, 2, 5, 3}, DType::float64, gen);
  const Tensor r = randn({2, 2, 4, 3}, DType::float64, gen);
  AttentionSpec spec;
  if (info.visibility.needs_empty_row || info.visibility.needs_mask) {  // [Tq, Tk]: query 2 sees no key, the others all but key 4
    Tensor m = Tensor::empty({4, 5}, DType::boolean);
    for (std::int64_t i = 0; i < 4; ++i)
      for (std::int64_t j = 0; j < 5; ++j) m.set({i, j}, i != 2 && j != 4);
    spec.mask = m;
  }
  if (info.visibility.needs_large_logits) spec.scale = 2000.0;  // |q.k| * 2000 passes 709
  auto run = [&](auto&& forward) { return run_core(forward, q, k, v, r).all(); };
  // equal, NaN where the other has NaN included
  auto same = [](const Tensor& a, const Tensor& b) {
    const auto va = a.to_vector(), vb = b.to_vector();
    for (std::size_t i = 0; i < va.size(); ++i)
      if (!(std::isnan(va[i]) && std::isnan(vb[i])) && !(std::abs(va[i] - vb[i]) < 1e-12)) return false;
    return true;
  };
  const auto m = run([&](auto& x, auto& y, auto& z) { return mutant->attention->core_forward(x, y, z, spec); });
  const auto h = run([&](auto& x, auto& y, auto& z) { return hypothesis_core(x, y, z, spec, info.bug); });
  const auto c = run([&](auto& x, auto& y, auto& z) { return hypothesis_core(x, y, z, spec, std::nullopt); });
  bool differs = false;
  for (std::size_t i = 0; i < m.size(); ++i) {
    EXPECT_TRUE(same(m[i], h[i])) << "tensor " << i;
    differs = differs || !same(h[i], c[i]);
    for (double x : c[i].to_vector()) ASSERT_TRUE(std::isfinite(x)) << "the correct attention went non-finite";
  }
  EXPECT_TRUE(differs) << info.name << " is invisible at its edge";
}

// The grouped-kv bugs at the core level (q [B, H, T, d], k and v [B, Hkv, T, d])
// at H 12, Hkv 3 (1 < Hkv < H, H != Hkv^2, G = 4 > Hkv: the wrong divisor runs
// past the kv heads and clamps), square and cross lengths: the hypothesis
// reproduces the mutant, differs from the correct attention where the bug
// lives (out and dq for a mapping, dk and dv only for a group gradient), and
// from the other kv hypotheses.
std::vector<BugInfo> core_grouping_bugs() {
  std::vector<BugInfo> out;
  for (const auto& b : bug_catalog())
    if (b.visibility.needs_group && !b.visibility.mha_only && !feature_bug(b.visibility)) out.push_back(b);
  return out;
}

class GroupedCoreCatalogTest : public CatalogTest {};

TEST_P(GroupedCoreCatalogTest, HypothesisReproducesMutantAndNoOtherKvBug) {
  const BugInfo& info = GetParam();
  const LoadedPlugin* mutant = registry_->find("mutant_" + std::string(info.name));
  ASSERT_NE(mutant, nullptr);
  const bool gradient_bug = info.bug == Bug::kv_grad_not_accumulated || info.bug == Bug::kv_grad_averaged;
  for (const auto& [tq, tk] : {std::pair<std::int64_t, std::int64_t>{5, 5}, {4, 6}}) {
    SCOPED_TRACE("Tq=" + std::to_string(tq) + " Tk=" + std::to_string(tk));
    Generator gen(21);
    const Tensor q = randn({2, 12, tq, 10}, DType::float64, gen);
    const Tensor k = randn({2, 3, tk, 10}, DType::float64, gen);
    const Tensor v = randn({2, 3, tk, 10}, DType::float64, gen);
    const Tensor r = randn({2, 12, tq, 10}, DType::float64, gen);
    AttentionSpec spec;
    spec.causal = true;
    auto run = [&](auto&& forward) { return run_core(forward, q, k, v, r).all(); };
    const auto m = run([&](auto& x, auto& y, auto& z) { return mutant->attention->core_forward(x, y, z, spec); });
    const auto h = run([&](auto& x, auto& y, auto& z) { return hypothesis_core(x, y, z, spec, info.bug); });
    const auto c = run([&](auto& x, auto& y, auto& z) { return hypothesis_core(x, y, z, spec, std::nullopt); });
    for (std::size_t i = 0; i < m.size(); ++i) {
      EXPECT_LT(max_abs_diff(m[i], h[i]), 1e-12) << "tensor " << i;
      const double from_correct = max_abs_diff(h[i], c[i]);
      // out, dq: wrong for a mapping, exact for a gradient bug; dk, dv: wrong for both
      if (i < 2 && gradient_bug) EXPECT_LT(from_correct, 1e-12) << "tensor " << i;
      else EXPECT_GT(from_correct, 1e-3) << "tensor " << i;
    }
    for (const BugInfo& other : core_grouping_bugs()) {
      if (other.bug == info.bug) continue;
      const auto o = run([&](auto& x, auto& y, auto& z) { return hypothesis_core(x, y, z, spec, other.bug); });
      double apart = 0;
      for (std::size_t i = 0; i < m.size(); ++i) apart = std::max(apart, max_abs_diff(m[i], o[i]));
      EXPECT_GT(apart, 1e-3) << "mutant_" << info.name << " also fits " << other.name;
    }
  }
}

// The bugs of windows, soft-capping and sinks, each with its feature on at a
// shape where it shows (B 2, H 6, Hkv 2: G = 3; T 11 > W + 1 with W 4 keys; a
// cap the scores reach; sinks U(-1, 3); without causal for the right bound; a
// decode step, Tq 3 of Tk 11 bottom-right, at the core level; RoPE at gapped
// positions for a window on positions; a query row with every key masked for
// the sink's running max; T 130 past one key tile of 128 for the sink per
// tile): the hypothesis reproduces the mutant (out, every gradient, dsinks; a
// NaN where the other has one), differs from the correct attention, and with
// the feature off all three agree.
std::vector<BugInfo> feature_bugs() {
  std::vector<BugInfo> out;
  for (const auto& b : bug_catalog())
    if (feature_bug(b.visibility)) out.push_back(b);
  return out;
}

class FeatureCatalogTest : public CatalogTest {
 protected:
  // The spec that shows `b` (features on), or the same with them off.
  static AttentionSpec spec_for(const BugInfo& b, AttentionSpec spec, bool on, std::int64_t t) {
    spec.causal = b.bug != Bug::window_both_sides;  // the right bound shows without causal only
    if (b.visibility.needs_gapped_positions) {  // rotated at gapped positions 0 1 3 6 7 9 12 ...
      spec.rope.enabled = true;
      std::vector<std::int64_t> p = {0};
      for (std::int64_t i = 1; i < t; ++i) p.push_back(p.back() + 1 + (i - 1) % 3);
      spec.rope.positions = positions_tensor(p, {t});
    }
    if (b.visibility.needs_empty_row) {  // query 4 sees no key, the others every key causal allows
      Tensor m = Tensor::empty({t, t}, DType::boolean);
      for (std::int64_t i = 0; i < t; ++i)
        for (std::int64_t j = 0; j < t; ++j) m.set({i, j}, i != 4);
      spec.mask = m;
    }
    if (!on) return spec;
    if (b.visibility.needs_window) {
      spec.window.left = 3;
      spec.window.right = 0;
    }
    if (b.visibility.needs_softcap) spec.softcap = 0.75;
    return spec;
  }
  static Tensor sinks_of(std::int64_t heads) {
    Generator gen(13);
    return rand_uniform({heads}, DType::float64, gen, -1.0, 3.0);
  }
  // out, every gradient of q, k, v (or x and the weights), then dsinks when on
  static std::vector<Tensor> with_sinks(const std::function<Variable(const AttentionSpec&)>& forward,
                                        const std::vector<Variable>& leaves, AttentionSpec spec, const Tensor& sinks,
                                        const Tensor& r) {
    if (sinks.defined()) spec.sinks = Variable(sinks, true);
    const Variable out = forward(spec);
    sum(mul(out, Variable(r))).backward();
    std::vector<Tensor> all = {out.data()};
    for (const Variable& l : leaves) all.push_back(l.grad().defined() ? l.grad() : Tensor::zeros(l.shape(), l.dtype()));
    if (sinks.defined())
      all.push_back(spec.sinks.grad().defined() ? spec.sinks.grad() : Tensor::zeros(sinks.shape(), sinks.dtype()));
    return all;
  }
  // At the shape s_ (MHA): the mutant's, the hypothesis's and the correct
  // attention's out, gradients and dsinks (when `sinks` is given).
  std::vector<std::vector<Tensor>> mha_runs(const LoadedPlugin& mutant, Bug bug, const AttentionSpec& spec,
                                            const Tensor& sinks) const {
    const auto in = inputs();
    std::vector<std::vector<Tensor>> runs;
    for (int which = 0; which < 3; ++which) {
      const Variable x(in[0], true);
      const MhaWeights w{Variable(in[1], true), Variable(in[2], true), Variable(in[3], true), Variable(in[4], true)};
      runs.push_back(with_sinks(
          [&](const AttentionSpec& s) {
            return which == 0 ? mutant.attention->mha_forward(x, w, s)
                              : hypothesis_mha(x, w, s, which == 1 ? BugSet(bug) : BugSet());
          },
          {x, w.wq, w.wk, w.wv, w.wo}, spec, sinks, in[5]));
    }
    return runs;
  }
};

TEST_P(FeatureCatalogTest, HypothesisReproducesMutantWithTheFeatureOn) {
  const BugInfo& info = GetParam();
  const LoadedPlugin* mutant = registry_->find("mutant_" + std::string(info.name));
  ASSERT_NE(mutant, nullptr);
  const bool core_only = info.visibility.needs_tq_ne_tk;
  for (const bool on : {true, false}) {
    SCOPED_TRACE(on ? "feature on" : "feature off");
    const Tensor sinks = info.visibility.needs_sinks && on ? sinks_of(6) : Tensor();
    std::vector<std::vector<Tensor>> runs;  // mutant, hypothesis, correct
    Generator gen(17);
    if (core_only) {  // a decode step: Tq 3 of Tk 11, bottom-right
      const Tensor q = randn({2, 6, 3, 4}, DType::float64, gen), k = randn({2, 2, 11, 4}, DType::float64, gen),
                   v = randn({2, 2, 11, 4}, DType::float64, gen), r = randn({2, 6, 3, 4}, DType::float64, gen);
      AttentionSpec base;
      base.causal_alignment = CausalAlignment::bottom_right;
      const AttentionSpec spec = spec_for(info, base, on, 11);
      for (int which = 0; which < 3; ++which) {
        const Variable vq(q, true), vk(k, true), vv(v, true);
        runs.push_back(with_sinks(
            [&](const AttentionSpec& s) {
              return which == 0 ? mutant->attention->core_forward(vq, vk, vv, s)
                                : hypothesis_core(vq, vk, vv, s, which == 1 ? BugSet(info.bug) : BugSet());
            },
            {vq, vk, vv}, spec, sinks, r));
      }
    } else {
      const std::int64_t t = info.visibility.needs_long_keys ? 130 : 11;
      s_ = {2, t, 24, 6, 2, 4};
      const AttentionSpec spec = spec_for(info, test::causal_mha_spec(24, 6, 2, 4), on, t);
      runs = mha_runs(*mutant, info.bug, spec, sinks);
    }
    // NaN against NaN agrees, NaN against a number is as far as can be
    const auto apart = [](const Tensor& a, const Tensor& b) {
      const auto va = a.to_vector(), vb = b.to_vector();
      double m = 0.0;
      for (std::size_t i = 0; i < va.size(); ++i)
        m = std::isnan(va[i]) || std::isnan(vb[i]) ? (std::isnan(va[i]) && std::isnan(vb[i]) ? m : INFINITY)
                                                   : std::max(m, std::abs(va[i] - vb[i]));
      return m;
    };
    double from_correct = 0;
    for (std::size_t i = 0; i < runs[0].size(); ++i) {
      const double scale = std::max(1.0, max_abs_diff(runs[2][i], Tensor::zeros(runs[2][i].shape(), DType::float64)));
      EXPECT_LT(apart(runs[0][i], runs[1][i]), 1e-12 * scale) << "tensor " << i;
      from_correct = std::max(from_correct, apart(runs[1][i], runs[2][i]));
    }
    if (on) EXPECT_GT(from_correct, 1e-3) << info.name << " is invisible with its feature on";
    else EXPECT_LT(from_correct, 1e-12) << info.name << " shows with its feature off";
  }
}

// Where the three bugs of positions and fused kernels hide (MHA, B 2, T 11,
// H 6, Hkv 2, causal, sinks U(-1, 3), W 4 keys): a window on RoPE positions
// at positions 0 .. T-1, a running max without the sink with no fully masked
// row, a sink per key tile at Tk 11 within one tile of 128. There the mutant
// and the hypothesis both equal the correct attention, dsinks included.
TEST_F(FeatureCatalogTest, PositionAndTileBugsHideWithoutTheirInput) {
  for (const Bug bug : {Bug::window_by_position, Bug::sink_not_in_max, Bug::sink_per_tile}) {
    const BugInfo& info = bug_info(bug);
    SCOPED_TRACE(std::string(info.name));
    const LoadedPlugin* mutant = registry_->find("mutant_" + std::string(info.name));
    ASSERT_NE(mutant, nullptr);
    s_ = {2, 11, 24, 6, 2, 4};
    AttentionSpec spec = test::causal_mha_spec(24, 6, 2, 4);
    spec.window.left = 3;
    spec.window.right = 0;
    spec.rope.enabled = true;  // at positions 0 .. T-1: the indices
    const std::vector<std::vector<Tensor>> runs = mha_runs(*mutant, bug, spec, sinks_of(6));  // mutant, hypothesis, correct
    ASSERT_EQ(runs[2].size(), 7u);  // out, dx, dwq, dwk, dwv, dwo, dsinks
    for (std::size_t i = 0; i < runs[2].size(); ++i) {
      EXPECT_LT(max_abs_diff(runs[0][i], runs[2][i]), 1e-12) << "mutant, tensor " << i;
      EXPECT_LT(max_abs_diff(runs[1][i], runs[2][i]), 1e-12) << "hypothesis, tensor " << i;
    }
  }
}

auto bug_name = [](const auto& p) { return std::string(p.param.name); };
INSTANTIATE_TEST_SUITE_P(Bugs, FeatureCatalogTest, ::testing::ValuesIn(feature_bugs()), bug_name);
INSTANTIATE_TEST_SUITE_P(Bugs, CatalogTest, ::testing::ValuesIn(non_rope_bugs()), bug_name);
INSTANTIATE_TEST_SUITE_P(Bugs, CoreCatalogTest, ::testing::ValuesIn(core_level_bugs()), bug_name);
INSTANTIATE_TEST_SUITE_P(Bugs, EdgeCatalogTest, ::testing::ValuesIn(edge_bugs()), bug_name);
INSTANTIATE_TEST_SUITE_P(Bugs, CrossLengthCatalogTest, ::testing::ValuesIn(cross_length_bugs()), bug_name);
INSTANTIATE_TEST_SUITE_P(Bugs, GroupedCoreCatalogTest, ::testing::ValuesIn(core_grouping_bugs()), bug_name);

TEST(Catalog, CorrectHypothesisMatchesPerHead) {
  PluginRegistry reg;
  reg.load_directories({HEADGRAD_BUILD_PLUGIN_DIR});
  const LoadedPlugin& per_head = reg.get("per_head");
  Generator gen(11);
  const Tensor x = randn({2, 5, 12}, DType::float64, gen);
  std::vector<Tensor> ws;
  for (int i = 0; i < 4; ++i) ws.push_back(randn({12, 12}, DType::float64, gen, 0.3));
  AttentionSpec spec;
  spec.d_model = 12;
  spec.num_heads = 3;
  spec.causal = true;
  const MhaWeights w{Variable(ws[0]), Variable(ws[1]), Variable(ws[2]), Variable(ws[3])};
  const Tensor a = per_head.attention->mha_forward(Variable(x), w, spec).data();
  const Tensor b = hypothesis_mha(Variable(x), w, spec, std::nullopt).data();
  EXPECT_LT(max_abs_diff(a, b), 1e-13);
}

TEST(Catalog, NamesAreUniqueAndResolve) {
  for (const auto& b : bug_catalog()) {
    ASSERT_TRUE(bug_from_name(b.name).has_value()) << b.name;
    EXPECT_EQ(*bug_from_name(b.name), b.bug);
    EXPECT_FALSE(b.explanation.empty());
    EXPECT_FALSE(b.fix.empty());
  }
  EXPECT_FALSE(bug_from_name("not_a_bug").has_value());
  EXPECT_EQ(bug_catalog().size(), static_cast<std::size_t>(Bug::count_));
}

// The tile permutation (worked by hand for H 12, Hkv 3, G 4: position g*3 + j
// holds head j*4 + g) turns the tiled mapping into the correct one: the tile
// hypothesis on the reordered Wq rows and Wo columns equals per_head on the
// original weights, its dWq rows and dWo columns in the same order, and the
// other mapping bugs stay wrong under it.
TEST(Catalog, TilePermutationTurnsTheTiledMappingIntoTheCorrectOne) {
  EXPECT_EQ(tile_to_repeat_heads(12, 3), (std::vector<std::int64_t>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(tile_to_repeat_heads(4, 4), (std::vector<std::int64_t>{0, 1, 2, 3}));  // G = 1: the identity
  EXPECT_EQ(tile_to_repeat_heads(4, 1), (std::vector<std::int64_t>{0, 1, 2, 3}));  // MQA: the identity
  EXPECT_THROW((void)tile_to_repeat_heads(6, 4), std::invalid_argument);
  PluginRegistry reg;
  reg.load_directories({HEADGRAD_BUILD_PLUGIN_DIR});
  const LoadedPlugin& per_head = reg.get("per_head");
  const std::int64_t B = 2, T = 5, D = 16, H = 12, Hkv = 3, d = 6;
  Generator gen(17);
  const Tensor x = randn({B, T, D}, DType::float64, gen), r = randn({B, T, D}, DType::float64, gen);
  const std::vector<Tensor> ws = {randn({H * d, D}, DType::float64, gen, 0.3), randn({Hkv * d, D}, DType::float64, gen, 0.3),
                                  randn({Hkv * d, D}, DType::float64, gen, 0.3), randn({D, H * d}, DType::float64, gen, 0.3)};
  const AttentionSpec spec = test::causal_mha_spec(D, H, Hkv, d);
  const std::vector<std::int64_t> order = tile_to_repeat_heads(H, Hkv);
  auto run = [&](const std::vector<Tensor>& w4, auto&& forward) {
    return run_mha(forward, x, w4[0], w4[1], w4[2], w4[3], r).all();
  };
  const auto ref = run(ws, [&](auto& vx, auto& w) { return per_head.attention->mha_forward(vx, w, spec); });
  const std::vector<Tensor> tiled_ws = {reorder_blocks(ws[0], 0, d, order), ws[1], ws[2], reorder_blocks(ws[3], 1, d, order)};
  // head h' of the reordered Wq is head order[h'] of the original: rows h'*d .. of one = rows order[h']*d .. of the other
  EXPECT_EQ(max_abs_diff(tiled_ws[0].narrow(0, 1 * d, d), ws[0].narrow(0, 4 * d, d)), 0.0);
  EXPECT_EQ(max_abs_diff(tiled_ws[3].narrow(1, 11 * d, d), ws[3].narrow(1, 11 * d, d)), 0.0);
  const auto tiled = run(tiled_ws, [&](auto& vx, auto& w) { return hypothesis_mha(vx, w, spec, Bug::kv_map_tile); });
  std::vector<Tensor> expect = ref;
  expect[2] = reorder_blocks(ref[2], 0, d, order);
  expect[5] = reorder_blocks(ref[5], 1, d, order);
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_LT(max_abs_diff(expect[i], tiled[i]), 1e-12) << i;
  for (Bug other : {Bug::kv_group_wrong_divisor, Bug::kv_interleaved_head_slices}) {
    const auto wrong = run(tiled_ws, [&](auto& vx, auto& w) { return hypothesis_mha(vx, w, spec, other); });
    EXPECT_GT(max_abs_diff(expect[0], wrong[0]), 1e-3) << bug_info(other).name;
  }
}

// Grouped kv heads (H 12, Hkv 3, d 10): the correct hypothesis equals per_head on
// the output and every gradient, and the averaged group gradient is exactly 1/G
// of the summed one on dWk and dWv, dx differs and out, dWq, dWo are untouched
// (the signature = X = X X =).
TEST(Catalog, GroupedHypothesesAgainstPerHead) {
  PluginRegistry reg;
  reg.load_directories({HEADGRAD_BUILD_PLUGIN_DIR});
  const LoadedPlugin& per_head = reg.get("per_head");
  const std::int64_t B = 2, T = 7, D = 24, H = 12, Hkv = 3, d = 10, G = H / Hkv;
  Generator gen(13);
  const Tensor x = randn({B, T, D}, DType::float64, gen);
  const std::vector<Tensor> ws = {randn({H * d, D}, DType::float64, gen, 0.2), randn({Hkv * d, D}, DType::float64, gen, 0.2),
                                  randn({Hkv * d, D}, DType::float64, gen, 0.2), randn({D, H * d}, DType::float64, gen, 0.2)};
  const Tensor r = randn({B, T, D}, DType::float64, gen);
  const AttentionSpec spec = test::causal_mha_spec(D, H, Hkv, d);
  auto run = [&](auto&& forward) { return run_mha(forward, x, ws[0], ws[1], ws[2], ws[3], r).all(); };
  const auto ref = run([&](auto& vx, auto& w) { return per_head.attention->mha_forward(vx, w, spec); });
  const auto ok = run([&](auto& vx, auto& w) { return hypothesis_mha(vx, w, spec, std::nullopt); });
  for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_LT(max_abs_diff(ref[i], ok[i]), 1e-12) << i;
  const auto mean = run([&](auto& vx, auto& w) { return hypothesis_mha(vx, w, spec, Bug::kv_grad_averaged); });
  for (std::size_t i : {0u, 2u, 5u}) EXPECT_LT(max_abs_diff(ref[i], mean[i]), 1e-12) << i;
  for (std::size_t i : {3u, 4u}) {  // dWk, dWv = truth / G
    EXPECT_LT(max_abs_diff(scale(Variable(ref[i]), 1.0 / static_cast<double>(G)).data(), mean[i]), 1e-13) << i;
    EXPECT_GT(max_abs_diff(ref[i], mean[i]), 1e-3) << i;
  }
  // The wrong divisor h / Hkv runs past the 3 kv heads at G = 4 > Hkv (heads 9..11
  // would read kv head 3) and is clamped to the last: query heads read kv heads
  // 0 0 0 1 1 1 2 2 2 2 2 2. Its oracle: per_head as plain multi-head with kv head
  // blocks laid out that way; dWk, dWv are the sums of the blocks of each kv head.
  const std::vector<std::int64_t> reads = {0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2};
  auto widen = [&](const Tensor& w) {
    std::vector<Variable> blocks;
    for (std::int64_t j : reads) blocks.push_back(narrow(Variable(w), 0, j * d, d));
    return cat(blocks, 0).data();
  };
  AttentionSpec mha = spec;
  mha.num_kv_heads = H;
  const test::MhaResult wide = run_mha(*per_head.attention, x, ws[0], widen(ws[1]), widen(ws[2]), ws[3], mha, r);
  const auto wrong = run([&](auto& vx, auto& w) { return hypothesis_mha(vx, w, spec, Bug::kv_group_wrong_divisor); });
  EXPECT_LT(max_abs_diff(wide.out, wrong[0]), 1e-12);
  EXPECT_LT(max_abs_diff(wide.dx, wrong[1]), 1e-12);
  EXPECT_GT(max_abs_diff(ref[0], wrong[0]), 1e-3);  // and it is not the correct attention
  for (const auto& [i, g] : {std::pair<std::size_t, Tensor>{3u, wide.dwk}, {4u, wide.dwv}}) {
    for (std::int64_t j = 0; j < Hkv; ++j) {
      Tensor block_sum = Tensor::zeros({d, D}, DType::float64);
      for (std::int64_t h = 0; h < H; ++h)
        if (reads[static_cast<std::size_t>(h)] == j) block_sum = add(Variable(block_sum), narrow(Variable(g), 0, h * d, d)).data();
      EXPECT_LT(max_abs_diff(block_sum, narrow(Variable(wrong[i]), 0, j * d, d).data()), 1e-12) << i << " kv head " << j;
    }
  }
}

}  // namespace

}  // namespace test_diagnosis_catalog
