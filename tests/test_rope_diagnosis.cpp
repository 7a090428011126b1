// The RoPE bugs of the catalog against their mutant plugins: each hypothesis
// (per head, analysis/hypotheses.cpp) reproduces its mutant (batched,
// plugins/mutants) on out, every gradient and the taps, at the mha level, the
// core level and the rope level, and differs from the correct attention where
// the bug can show; the uniform position shift stays exact end to end and
// shows in the taps only. Then the suite: every RoPE mutant caught and named,
// and non-RoPE bugs under a rope block named as themselves.
//
// Shape legend: B batch, T sequence, D model width, H query heads, Hkv kv
// heads, d head width, r rotary width.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include <headgrad/loader.hpp>

#include "attention_run.hpp"

#include "analysis/analyze.hpp"
#include "job/run_suite.hpp"
#include "analysis/catalog.hpp"
#include "analysis/hypotheses.hpp"
#include "exec/execute.hpp"
#include "judge/run_case.hpp"

namespace test_rope_diagnosis {  // this file's names: test files share unity builds (tests/meson.build)

using namespace headgrad;
using namespace headgrad::diagnosis;

namespace {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto va = a.to_vector(), vb = b.to_vector();
  EXPECT_EQ(va.size(), vb.size());
  double m = 0.0;
  for (std::size_t i = 0; i < va.size() && i < vb.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

std::vector<BugInfo> rope_bugs(bool with_mha_only) {
  std::vector<BugInfo> out;
  for (const auto& b : bug_catalog())
    // a QK-norm bug that needs RoPE too (the norm after the rotation) needs a qk_norm
    // case: tests/test_qk_norm_cross.cpp and test_diagnosis_catalog.cpp show it
    // and a window bug that reads RoPE positions needs a window: FeatureCatalogTest shows it
    if (b.visibility.needs_rope && !b.visibility.needs_qk_norm && !b.visibility.needs_window &&
        (with_mha_only || !b.visibility.mha_only))
      out.push_back(b);
  return out;
}

// Gapped positions per batch row [2, 7]: row 0 from 0, row 1 from 4000 (past
// where float32 tables show), steps 1, 2, 3, ...
Tensor gapped_positions() {
  return positions_tensor({0, 1, 3, 6, 7, 9, 12, 4000, 4001, 4003, 4006, 4007, 4009, 4012}, {2, 7});
}

RopeSpec rope_for(const BugInfo& info, RopeStyle style) {
  RopeSpec r;
  r.enabled = true;
  r.theta = 500000.0;  // not 10000: a hard-coded base shows
  r.style = style;
  r.rotary_dim = info.visibility.needs_partial_rotary ? 6 : 0;  // d = 10
  r.positions = gapped_positions();
  return r;
}

// The built plugins (mutants included), loaded once for the whole program.
const PluginRegistry& plugins() {
  static const PluginRegistry registry = [] {
    PluginRegistry r;
    r.load_directories({HEADGRAD_BUILD_PLUGIN_DIR});
    return r;
  }();
  return registry;
}

class RopeBugs : public ::testing::TestWithParam<BugInfo> {
 protected:
  const LoadedPlugin& mutant() const {
    const LoadedPlugin* m = plugins().find("mutant_" + std::string(GetParam().name));
    if (!m) throw std::runtime_error("mutant_" + std::string(GetParam().name) + " is not built");
    return *m;
  }
};

// out, dx, dwq, dwk, dwv, dwo, q_rot, k_rot of one mha forward with a tap sink.
struct MhaRun {
  std::vector<Tensor> tensors;
};

// A causal mha spec with grouped kv heads and head width d, RoPE as given.
AttentionSpec grouped_spec(std::int64_t D, std::int64_t H, std::int64_t Hkv, std::int64_t d, const RopeSpec& rope) {
  AttentionSpec spec = test::causal_mha_spec(D, H, Hkv, d);
  spec.rope = rope;
  return spec;
}

// B 2, T 7, D 24, H 12, Hkv 3, d 10, causal: the mutants.yaml shape.
template <class F>
MhaRun run_mha(F&& forward, const RopeSpec& rope) {
  constexpr std::int64_t B = 2, T = 7, D = 24, H = 12, Hkv = 3, d = 10;
  Generator gen(17);
  const Tensor x = randn({B, T, D}, DType::float64, gen);
  const std::vector<Tensor> ws = {randn({H * d, D}, DType::float64, gen, 0.3), randn({Hkv * d, D}, DType::float64, gen, 0.3),
                                  randn({Hkv * d, D}, DType::float64, gen, 0.3), randn({D, H * d}, DType::float64, gen, 0.3)};
  const Tensor r = randn({B, T, D}, DType::float64, gen);
  AttentionSpec spec = grouped_spec(D, H, Hkv, d, rope);
  spec.rope_taps = std::make_shared<RopeTaps>();
  std::vector<Tensor> tensors =
      test::run_mha([&](Variable& vx, MhaWeights& w) { return forward(vx, w, spec); }, x, ws[0], ws[1], ws[2], ws[3], r).all();
  tensors.push_back(runner::assemble_tap(spec.rope_taps->q_rot));
  tensors.push_back(runner::assemble_tap(spec.rope_taps->k_rot));
  return {tensors};
}

const char* kMhaNames[] = {"out", "dx", "dwq", "dwk", "dwv", "dwo", "q_rot", "k_rot"};

TEST_P(RopeBugs, HypothesisReproducesMutantAtTheMhaLevel) {
  const BugInfo& info = GetParam();
  const LoadedPlugin& m = mutant();
  for (const RopeStyle style : {RopeStyle::interleaved, RopeStyle::half}) {
    const RopeSpec rope = rope_for(info, style);
    const MhaRun plugin = run_mha([&](auto& x, auto& w, auto& s) { return m.attention->mha_forward(x, w, s); }, rope);
    const MhaRun hyp = run_mha([&](auto& x, auto& w, auto& s) { return hypothesis_mha(x, w, s, info.bug); }, rope);
    const MhaRun correct = run_mha([&](auto& x, auto& w, auto& s) { return hypothesis_mha(x, w, s, std::nullopt); }, rope);
    double end_to_end = 0, in_taps = 0;
    for (std::size_t i = 0; i < 8; ++i) {
      // rotated before the split, there is no per-head q or k to tap
      if (i >= 6 && (!plugin.tensors[i].defined() || !hyp.tensors[i].defined())) continue;
      EXPECT_LT(max_abs_diff(plugin.tensors[i], hyp.tensors[i]), 1e-12)
          << kMhaNames[i] << " of " << info.name << " (" << rope_style_name(style) << ")";
      (i < 6 ? end_to_end : in_taps) = std::max(i < 6 ? end_to_end : in_taps, max_abs_diff(hyp.tensors[i], correct.tensors[i]));
    }
    if (info.visibility.needs_rope_taps) {  // scores see position differences only (to rounding at p ~ 4000)
      EXPECT_LT(end_to_end, 1e-10) << info.name << " shows end to end";
      EXPECT_GT(in_taps, 1e-3) << info.name << " does not show in the taps";
    } else {
      // float32 tables: ~1e-6 relative at p ~ 4000, far above float64 rounding
      EXPECT_GT(end_to_end, info.visibility.needs_far_positions ? 1e-7 : 1e-3) << info.name << " is invisible";
    }
  }
}

// The bugs with a core-level form (not rope_before_head_split, which lives in
// the projection's width).
class RopeCoreBugs : public RopeBugs {};

TEST_P(RopeCoreBugs, HypothesisReproducesMutantAtTheCoreLevel) {
  const BugInfo& info = GetParam();
  const LoadedPlugin& m = mutant();
  Generator gen(19);
  // q [2, 12, 7, 10], k and v [2, 3, 7, 10]: grouped kv heads, per-row positions [2, 7]
  const Tensor q = randn({2, 12, 7, 10}, DType::float64, gen), k = randn({2, 3, 7, 10}, DType::float64, gen);
  const Tensor v = randn({2, 3, 7, 10}, DType::float64, gen), r = randn({2, 12, 7, 10}, DType::float64, gen);
  AttentionSpec spec;
  spec.causal = true;
  spec.rope = rope_for(info, RopeStyle::interleaved);
  spec.rope.q_offset = 2;
  auto run = [&](auto&& forward) { return test::run_core(forward, q, k, v, r).all(); };
  const auto a = run([&](auto& x, auto& y, auto& z) { return m.attention->core_forward(x, y, z, spec); });
  const auto b = run([&](auto& x, auto& y, auto& z) { return hypothesis_core(x, y, z, spec, info.bug); });
  const auto c = run([&](auto& x, auto& y, auto& z) { return hypothesis_core(x, y, z, spec, std::nullopt); });
  double from_correct = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_LT(max_abs_diff(a[i], b[i]), 1e-12) << "tensor " << i << " of " << info.name;
    from_correct = std::max(from_correct, max_abs_diff(b[i], c[i]));
  }
  if (info.visibility.needs_rope_taps) EXPECT_LT(from_correct, 1e-10) << info.name;
  else EXPECT_GT(from_correct, info.visibility.needs_far_positions ? 1e-7 : 1e-3) << info.name;
}

// At the rope level (x alone, rotated as queries at offset 0) the bugs of the
// rotation itself show, the uniform shift included; those that need q and k
// together (or v, or the projection) leave the rotation exact.
TEST_P(RopeBugs, RopeLevelShowsTheRotationBugs) {
  const BugInfo& info = GetParam();
  const LoadedPlugin& m = mutant();
  ASSERT_TRUE(m.info.capabilities.rope_level);
  Generator gen(23);
  const Tensor x = randn({2, 3, 7, 10}, DType::float64, gen), r = randn({2, 3, 7, 10}, DType::float64, gen);
  const RopeSpec spec = rope_for(info, RopeStyle::half);
  auto run = [&](auto&& forward) {
    Variable vx(x, true);
    const Variable out = forward(vx);
    sum(mul(out, Variable(r))).backward();
    return std::vector<Tensor>{out.data(), vx.grad()};
  };
  const auto a = run([&](const Variable& v) { return m.attention->rope_forward(v, spec); });
  const auto ok = run([&](const Variable& v) { return rope(v, spec); });
  const double diff = std::max(max_abs_diff(a[0], ok[0]), max_abs_diff(a[1], ok[1]));
  const bool pairs_of_qk = info.bug == Bug::rope_on_v || info.bug == Bug::rope_missing_on_k ||
                           info.bug == Bug::rope_before_head_split || info.bug == Bug::rope_qk_offset_mismatch;
  if (pairs_of_qk) EXPECT_LT(diff, 1e-15) << info.name;
  else EXPECT_GT(diff, info.visibility.needs_far_positions ? 1e-7 : 1e-3) << info.name;
  if (info.bug == Bug::rope_backward_not_transposed) {
    EXPECT_LT(max_abs_diff(a[0], ok[0]), 1e-15);  // only dx
  }
  EXPECT_EQ(has_rope_level_form(info), !pairs_of_qk) << info.name;
  if (!has_rope_level_form(info)) {
    EXPECT_THROW(hypothesis_rope(Variable(x), spec, info.bug), std::invalid_argument);
    return;
  }
  const auto h = run([&](const Variable& v) { return hypothesis_rope(v, spec, info.bug); });
  EXPECT_LT(max_abs_diff(a[0], h[0]), 1e-12) << "out of " << info.name;
  EXPECT_LT(max_abs_diff(a[1], h[1]), 1e-12) << "dx of " << info.name;
}

auto bug_name = [](const auto& p) { return std::string(p.param.name); };
INSTANTIATE_TEST_SUITE_P(Rope, RopeBugs, ::testing::ValuesIn(rope_bugs(true)), bug_name);
INSTANTIATE_TEST_SUITE_P(Rope, RopeCoreBugs, ::testing::ValuesIn(rope_bugs(false)), bug_name);

// The HF permutation, written out row by row (independently of the
// hypotheses' reshape): half-pairing attention on (Wq, Wk) equals
// interleaved-pairing attention on rows permuted per head, new row
// h*d + 2p + s = old row h*d + s*d/2 + p, on out and dx.
TEST(RopePairing, HalfEqualsInterleavedWithPermutedRows) {
  const LoadedPlugin& per_head = plugins().get("per_head");
  constexpr std::int64_t B = 2, T = 5, D = 16, H = 4, Hkv = 2, d = 8;
  Generator gen(29);
  const Tensor x = randn({B, T, D}, DType::float64, gen);
  const Tensor wq = randn({H * d, D}, DType::float64, gen, 0.3), wk = randn({Hkv * d, D}, DType::float64, gen, 0.3);
  const Tensor wv = randn({Hkv * d, D}, DType::float64, gen, 0.3), wo = randn({D, H * d}, DType::float64, gen, 0.3);
  auto permuted = [&](const Tensor& w, std::int64_t heads) {
    Tensor p = Tensor::empty(w.shape(), w.dtype());
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t pr = 0; pr < d / 2; ++pr)
        for (std::int64_t s = 0; s < 2; ++s)
          for (std::int64_t c = 0; c < D; ++c) p.set({h * d + 2 * pr + s, c}, w.at({h * d + s * d / 2 + pr, c}));
    return p;
  };
  RopeSpec rope;
  rope.enabled = true;
  rope.positions = positions_tensor({3, 4, 8, 9, 20, 1000, 1001, 1005, 1006, 1100}, {2, 5});
  const AttentionSpec spec = grouped_spec(D, H, Hkv, d, rope);
  auto run = [&](const Tensor& q_w, const Tensor& k_w, RopeStyle style) {
    AttentionSpec s = spec;
    s.rope.style = style;
    Variable vx(x, true);
    const MhaWeights w{Variable(q_w), Variable(k_w), Variable(wv), Variable(wo)};
    const Variable out = per_head.attention->mha_forward(vx, w, s);
    sum(out).backward();
    return std::pair{out.data(), vx.grad()};
  };
  const auto half = run(wq, wk, RopeStyle::half);
  const auto inter = run(permuted(wq, H), permuted(wk, Hkv), RopeStyle::interleaved);
  const auto plain = run(wq, wk, RopeStyle::interleaved);
  EXPECT_LT(max_abs_diff(half.first, inter.first), 1e-12);
  EXPECT_LT(max_abs_diff(half.second, inter.second), 1e-12);
  EXPECT_GT(max_abs_diff(half.first, plain.first), 1e-3);  // the pairings do differ on the same rows
}

// Positions read by the head axis, checked slice by slice against rope() on
// one [T, d] slab at one row of positions: x [B 2, H 3, T 7, d 10] rotates
// slab (b, h) at row h mod 2, whatever b; [T] positions and x without a head
// axis ([B, T, d]) are rotated as they should be.
TEST(RopeWrongAxis, MutantRotatesHeadHAtRowHModB) {
  const LoadedPlugin* m = plugins().find("mutant_rope_positions_wrong_axis");
  ASSERT_NE(m, nullptr);
  Generator gen(31);
  const Tensor x = randn({2, 3, 7, 10}, DType::float64, gen);
  RopeSpec spec;
  spec.enabled = true;
  spec.theta = 500000.0;
  spec.positions = gapped_positions();
  const Tensor out = m->attention->rope_forward(Variable(x), spec).data();
  const Tensor ok = rope(Variable(x), spec).data();
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 3; ++h) {
      RopeSpec row = spec;
      row.positions = spec.positions.narrow(0, h % 2, 1).reshape({7});
      const Tensor slab = x.narrow(0, b, 1).narrow(1, h, 1).reshape({7, 10});
      const Tensor want = rope(Variable(slab), row).data();
      EXPECT_LT(max_abs_diff(out.narrow(0, b, 1).narrow(1, h, 1).reshape({7, 10}), want), 1e-14) << b << ", " << h;
    }
  // slab (1, 0) reads row 0 for batch row 1: far from the right row 1
  EXPECT_GT(max_abs_diff(out.narrow(0, 1, 1).narrow(1, 0, 1), ok.narrow(0, 1, 1).narrow(1, 0, 1)), 1e-1);
  RopeSpec shared = spec;
  shared.positions = spec.positions.narrow(0, 1, 1).reshape({7});
  EXPECT_LT(max_abs_diff(m->attention->rope_forward(Variable(x), shared).data(), rope(Variable(x), shared).data()), 1e-15);
  const Tensor x3 = randn({2, 7, 10}, DType::float64, gen);
  EXPECT_LT(max_abs_diff(m->attention->rope_forward(Variable(x3), spec).data(), rope(Variable(x3), spec).data()), 1e-15);
}

// The suite: mutants.yaml catches and names each RoPE mutant (its own case),
// and a wrong backward shows as = X X X = = over out, dx, dwq, dwk, dwv, dwo.
TEST(RopeSuite, MutantsYamlCatchesAndNamesEveryRopeMutant) {
  const runner::Suite suite = runner::load_suite(HEADGRAD_SOURCE_ROOT "/configs/mutants.yaml");
  runner::RunOptions options;
  options.filter = "rope_*";
  const runner::SuiteResult result = runner::run_suite(suite, plugins(), options);
  std::set<std::string> named;
  for (const auto& c : result.cases) {
    EXPECT_EQ(c.status, runner::CaseStatus::xfail) << c.spec.name << ": " << c.cause;
    EXPECT_GT(c.differing_tensors(), 0u) << c.spec.name;
    ASSERT_TRUE(c.diagnosis.has_value()) << c.spec.name;
    EXPECT_EQ(c.diagnosis->best(), c.spec.expect_diagnosis) << c.spec.name << ": " << c.diagnosis->sentence;
    EXPECT_EQ(c.diagnosis->judged_side, c.mutant) << c.spec.name;
    EXPECT_EQ(c.diagnosis->correct_side, "per_head") << c.spec.name;
    named.insert(c.diagnosis->best());
    if (c.spec.expect_diagnosis == "rope_backward_not_transposed") {
      for (const auto& t : c.tensors)
        EXPECT_EQ(t.allclose, t.name == "out" || t.name == "dwv" || t.name == "dwo") << t.name;
    }
    if (c.spec.expect_diagnosis == "rope_position_shift" && c.spec.level == runner::Level::mha) {  // only the taps differ
      for (const auto& t : c.tensors) EXPECT_EQ(t.allclose, t.name != "q_rot" && t.name != "k_rot") << t.name;
    }
    // The clues that tell RoPE bugs apart, each where it belongs only.
    const std::string& text = c.diagnosis->sentence;
    EXPECT_EQ(text.find("Signature = X X X = =") != std::string::npos,
              c.spec.expect_diagnosis == "rope_backward_not_transposed") << text;
    EXPECT_EQ(text.find("grows with the absolute position") != std::string::npos,
              c.spec.expect_diagnosis == "rope_tables_float32") << text;
    EXPECT_EQ(text.find("pass-through dims [6, 10)") != std::string::npos,
              c.spec.expect_diagnosis == "rope_partial_wrong_span") << text;
    // Localization's RoPE variants: every RoPE bug vanishes with the rotation
    // off; one pair (r = 2) hides the pairing and the frequencies; one position
    // for every token hides what scores see through position differences, but
    // not a rotated v.
    ASSERT_TRUE(c.localization.has_value()) << c.spec.name;
    if (c.spec.level == runner::Level::rope) {  // x alone: the bug shows at every variant
      EXPECT_TRUE(c.localization->depends_on.empty()) << c.spec.name << ": " << c.localization->sentence;
      continue;
    }
    const auto& dep = c.localization->depends_on;
    auto depends = [&](const std::string& dim) { return std::find(dep.begin(), dep.end(), dim) != dep.end(); };
    EXPECT_TRUE(depends("rope")) << c.spec.name << ": " << c.localization->sentence;
    const std::string& bug = c.spec.expect_diagnosis;
    const bool pairs = bug == "rope_style_swapped" || bug == "rope_wrong_theta" || bug == "rope_freq_exponent";
    EXPECT_EQ(depends("r"), pairs) << c.spec.name << ": " << c.localization->sentence;
    if (pairs || bug == "rope_sign_flipped") {
      EXPECT_TRUE(depends("positions")) << c.spec.name;
    }
    if (bug == "rope_on_v" || bug == "rope_missing_on_k" || bug == "rope_positions_ignored") {
      EXPECT_FALSE(depends("positions")) << c.spec.name << ": " << c.localization->sentence;
    }
  }
  EXPECT_EQ(named.size(), rope_bugs(true).size());
}

// Bugs outside RoPE, under a rope block (the mutants rotate the one right way
// for them): named as themselves, never as a RoPE bug.
TEST(RopeSuite, NonRopeBugUnderRopeIsNotNamedAsRope) {
  for (const std::string bug : {"no_scale", "kv_swapped", "kv_map_tile", "merge_without_transpose", "batch_mixing"}) {
    const std::string yaml = "suite: t\ncases:\n  - name: c\n    compare: [mutant_" + bug +
                             ", per_head]\n    causal: true\n    shape: {B: 2, T: 7, D: 24, H: 12, Hkv: 3, d: 10}\n"
                             "    rope: {theta: 500000.0, style: half, positions: {generator: gapped, start: 1000}}\n";
    const runner::Suite s = runner::parse_suite(yaml, "rope.yaml");
    const runner::CaseResult r = analysis::check_case(s.cases.at(0), plugins(), {});
    ASSERT_EQ(r.status, runner::CaseStatus::fail) << bug;
    ASSERT_TRUE(r.diagnosis.has_value()) << bug;
    EXPECT_EQ(r.diagnosis->best(), bug) << r.diagnosis->sentence;
    for (const auto& f : r.diagnosis->fits) EXPECT_NE(f.bug.rfind("rope_", 0), 0u) << bug << " also fits " << f.bug;
  }
}

}  // namespace

namespace {

// The default suite's RoPE cases are strong enough: each RoPE mutant, put in
// place of the first plugin of every RoPE case (against the other plugin or
// the PyTorch reference), fails at least one of them; the uniform shift only
// where taps or the rope level look at the rotation itself.
TEST(RopeSuite, DefaultSuiteCatchesEveryRopeMutant) {
  const runner::Suite suite = runner::load_suite(HEADGRAD_SOURCE_ROOT "/configs/default.yaml");
  runner::RunOptions options;
  options.isolate = false;  // the mutants are well-behaved: throw, never crash
  for (const auto& info : rope_bugs(true)) {
    const std::string mutant = "mutant_" + std::string(info.name);
    std::size_t rope_cases = 0, caught = 0;
    for (runner::CaseSpec c : suite.cases) {
      if (!c.rope) continue;
      ++rope_cases;
      const bool sees_rotation = c.level == runner::Level::rope || !c.taps.empty();
      c.compare[0] = mutant;
      const runner::CaseResult r = runner::run_case(c, plugins(), options);
      if (r.status != runner::CaseStatus::fail || r.differing_tensors() == 0) continue;
      ++caught;
      if (info.visibility.needs_rope_taps) {
        EXPECT_TRUE(sees_rotation) << info.name << " caught end to end by " << c.name;
      }
    }
    std::printf("%s: caught by %zu of %zu RoPE cases\n", mutant.c_str(), caught, rope_cases);
    EXPECT_GT(rope_cases, 20u);
    EXPECT_GT(caught, 0u) << info.name << " passes every RoPE case of the default suite";
  }
}

}  // namespace

}  // namespace test_rope_diagnosis
