// Biases (`bias: true`): bq [H*d], bk and bv [Hkv*d], bo [D] on the projections,
// y = x W^T + b, and their gradients dbq, dbk, dbv, dbo compared like every other
// tensor. Checked here: each plugin's bias gradients against finite differences
// and against identities worked out by hand, the shapes refused, the suite keys,
// the seed's draw order, the capability, a plugin that ignores its biases, the
// diagnosis of catalog bugs with biases on, reference directories with biases
// (and a wrong-shape bias file: exit 2 naming it) and `headgrad export`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "analysis/analyze.hpp"
#include "checks.hpp"
#include "headgrad/gradcheck.hpp"
#include "headgrad/npy.hpp"
#include "headgrad_cli.hpp"
#include "real_plugins.hpp"
#include "job/run_suite.hpp"
#include "judge/run_case.hpp"

namespace test_bias {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;
using namespace headgrad;
using namespace headgrad::runner;
using headgrad::test::contains;

namespace {

const std::string kBiasRef = HEADGRAD_SOURCE_ROOT "/configs/refs/mha_B2_T7_D8_H6_Hkv3_d4_causal_bias_float64";

class Bias : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new PluginRegistry();
    problems_ = test::load_real_plugins(*registry_);
    for (const std::string name : {"bias_ignored", "uncatalogued_heads_reversed"})
      problems_ += test::load_plugin_file(*registry_, fs::path(RUNNER_TEST_PLUGIN_DIR) / (name + ".so"), name);
    for (const char* bug : {"merge_without_transpose", "kv_map_tile", "weights_not_transposed",
                            "missing_output_projection", "scale_one_over_d"})
      problems_ += test::load_plugin_file(
          *registry_, fs::path(HEADGRAD_BUILD_PLUGIN_DIR) / "mutants" / ("mutant_" + std::string(bug) + ".so"), bug);
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(problems_.empty()) << problems_; }
  static const Attention& plugin(const std::string& name) { return *registry_->get(name).attention; }

  static CaseResult run(const std::string& yaml) {
    const Suite s = parse_suite("suite: t\ncases:\n" + yaml, "bias.yaml");
    return analysis::check_case(s.cases.at(0), *registry_, {});
  }
  static const TensorComparison* tensor(const CaseResult& r, const std::string& name) {
    for (const auto& t : r.tensors)
      if (t.name == name) return &t;
    return nullptr;
  }

  static inline PluginRegistry* registry_ = nullptr;
  static inline std::string problems_;
};

AttentionSpec gqa_spec(bool causal) {
  AttentionSpec s;
  s.d_model = 8;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_width = 3;  // d apart from D / H
  s.causal = causal;
  return s;
}

// Finite differences on x, every weight and every bias, GQA, d != D / H, per plugin.
TEST_F(Bias, GradcheckOfEveryBiasPerPlugin) {
  Generator gen(31);
  const Tensor x = randn({2, 3, 8}, DType::float64, gen);
  const Tensor wq = randn({12, 8}, DType::float64, gen, 0.4), wk = randn({6, 8}, DType::float64, gen, 0.4);
  const Tensor wv = randn({6, 8}, DType::float64, gen, 0.4), wo = randn({8, 12}, DType::float64, gen, 0.4);
  const Tensor bq = randn({12}, DType::float64, gen), bk = randn({6}, DType::float64, gen);
  const Tensor bv = randn({6}, DType::float64, gen), bo = randn({8}, DType::float64, gen);
  for (const char* name : {"per_head", "batched", "fused_sdpa"})
    for (const bool causal : {true, false}) {
      const Attention& p = plugin(name);
      const AttentionSpec spec = gqa_spec(causal);
      const GradcheckResult r = gradcheck(
          [&](const std::vector<Variable>& v) {
            return p.mha_forward(v[0], MhaWeights{v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]}, spec);
          },
          {x, wq, wk, wv, wo, bq, bk, bv, bo});
      EXPECT_TRUE(r.ok) << name << " causal=" << causal << ": " << r.message;
      EXPECT_EQ(r.elements_checked, 48 + 96 + 48 + 48 + 96 + 12 + 6 + 6 + 8) << name;
    }
}

// Three identities, each plugin: out = merged Wo^T + bo gives dbo = sum over b, t of r;
// q . (k + bk) shifts every score of a query row alike, so dbk = 0; softmax rows
// sum to 1, so bv passes to the output unchanged: dbv of kv head j = the sum of
// (r Wo) over b, t and over the query heads of its group.
TEST_F(Bias, BiasGradientsMatchIdentitiesWorkedOutByHand) {
  const Suite s = parse_suite("suite: t\ncases:\n  - {name: c, bias: true, causal: true, compare: [per_head, batched], "
                              "shape: {B: 2, T: 5, D: 8, H: 4, Hkv: 2, d: 3}}\n", "bias.yaml");
  const CaseSpec& c = s.cases.at(0);
  const CaseInputs in = make_inputs(c);
  ASSERT_TRUE(in.bq.defined() && in.bo.defined());
  const std::vector<double> r = in.r.to_vector(), wo = in.wo.to_vector();  // r [2, 5, 8], wo [8, 12]
  std::vector<double> want_dbo(8, 0.0), want_dbv(6, 0.0);
  for (std::size_t i = 0; i < r.size(); ++i) want_dbo[i % 8] += r[i];
  for (std::int64_t h = 0; h < 4; ++h)
    for (std::int64_t e = 0; e < 3; ++e)
      for (std::int64_t o = 0; o < 8; ++o)  // (sum_bt r)[o] * wo[o, h*d + e] lands in kv head h / 2
        want_dbv[static_cast<std::size_t>((h / 2) * 3 + e)] += want_dbo[static_cast<std::size_t>(o)] *
                                                                wo[static_cast<std::size_t>(o * 12 + h * 3 + e)];
  for (const char* name : {"per_head", "batched", "fused_sdpa"}) {
    const TensorSet t = compute_side(c, in, plugin(name));
    const std::vector<double> dbo = find_tensor(t, "dbo")->to_vector(), dbv = find_tensor(t, "dbv")->to_vector();
    const std::vector<double> dbk = find_tensor(t, "dbk")->to_vector();
    ASSERT_EQ(dbo.size(), 8u);
    for (std::size_t i = 0; i < 8; ++i) EXPECT_NEAR(dbo[i], want_dbo[i], 1e-12) << name;
    for (std::size_t i = 0; i < 6; ++i) EXPECT_NEAR(dbv[i], want_dbv[i], 1e-12) << name;
    for (double g : dbk) EXPECT_NEAR(g, 0.0, 1e-12) << name;
    EXPECT_EQ(find_tensor(t, "dbq")->shape(), (Shape{12}));
  }
}

TEST_F(Bias, WrongBiasShapesAreRefusedNamingTheBias) {
  Generator gen(1);
  const Variable x(randn({1, 2, 8}, DType::float64, gen));
  const AttentionSpec spec = gqa_spec(true);
  MhaWeights w{Variable(randn({12, 8}, DType::float64, gen)), Variable(randn({6, 8}, DType::float64, gen)),
               Variable(randn({6, 8}, DType::float64, gen)), Variable(randn({8, 12}, DType::float64, gen)),
               Variable(randn({12}, DType::float64, gen)), Variable(randn({12}, DType::float64, gen)),  // bk wrong
               Variable(randn({6}, DType::float64, gen)), Variable(randn({8}, DType::float64, gen))};
  try {
    mha_dims(x, w, spec, "t");
    FAIL() << "a [12] bk for Hkv*d = 6 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "bk is [12], expected [6]")) << e.what();
  }
  w.bk = Variable(randn({6}, DType::float64, gen));
  w.bo = Variable();  // three of four
  try {
    mha_dims(x, w, spec, "t");
    FAIL() << "biases without bo were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "bo is undefined")) << e.what();
  }
  EXPECT_THROW(plugin("per_head").mha_forward(x, w, spec), std::invalid_argument);
}

TEST_F(Bias, SuiteKeys) {
  const Suite s = parse_suite(
      "suite: t\ndefaults: {bias: true, check: [out, dx, dwq, dwo]}\ncases:\n"
      "  - {name: m, compare: [per_head, batched], shape: {B: 2, T: 3, D: 8, H: 2}}\n"
      "  - {name: c, level: core, compare: [per_head, batched], shape: {B: 1, H: 2, Tq: 3, Tk: 3, d: 4}}\n"
      "  - {name: own, compare: [per_head, batched], shape: {B: 2, T: 3, D: 8, H: 2}, check: [dbv], "
      "tolerance: {dbo: {atol: 0.5}}}\n"
      // a baseline factor is read under relative_to_baseline (float32 here), never with atol/rtol
      "  - {name: own_k, compare: [per_head, batched], shape: {B: 2, T: 3, D: 8, H: 2}, dtype: float32, "
      "tolerance: {k: {dbq: 4}}}\n",
      "bias.yaml");
  // the defaults' list brings the gradients of the biases of the weights it names
  EXPECT_EQ(s.cases[0].check, (std::vector<std::string>{"out", "dx", "dwq", "dwo", "dbq", "dbo"}));
  EXPECT_TRUE(s.cases[0].bias);
  EXPECT_TRUE(contains(describe_case(s.cases[0]), ",bias")) << describe_case(s.cases[0]);
  EXPECT_FALSE(s.cases[1].bias);  // one default serves both levels
  EXPECT_EQ(s.cases[2].check, (std::vector<std::string>{"dbv"}));
  EXPECT_EQ(s.cases[2].tolerance_for("dbo").atol, 0.5);
  EXPECT_EQ(s.cases[3].baseline_k.k_for("dbq"), 4);
  EXPECT_EQ(tensor_names(s.cases[0]),
            (std::vector<std::string>{"out", "dx", "dwq", "dwk", "dwv", "dwo", "dbq", "dbk", "dbv", "dbo"}));

  try {
    parse_suite("suite: t\ncases:\n  - {name: c, level: core, bias: true, compare: [per_head, batched], "
                "shape: {B: 1, H: 2, Tq: 3, Tk: 3, d: 4}}\n", "bias.yaml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "bias.yaml:3:")) << e.what();
    EXPECT_TRUE(contains(e.what(), "'bias: true' belongs to the mha level")) << e.what();
  }
  try {
    parse_suite("suite: t\ncases:\n  - {name: c, compare: [per_head, batched], check: [out, dbq], "
                "shape: {B: 1, T: 3, D: 4, H: 2}}\n", "bias.yaml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "'dbq' is not a mha-level tensor of a case without 'bias: true'")) << e.what();
  }
}

// x, wq, wk, wv, wo, r keep their values with biases on; the biases come after r.
TEST_F(Bias, BiasesAreDrawnAfterEverythingElse) {
  Dims d;
  d.B = 2, d.T = 3, d.D = 8, d.H = 4, d.Hkv = 2, d.d = 3;
  const CaseInputs plain = seeded_inputs(Level::mha, d, DType::float64, 7);
  const CaseInputs biased = seeded_inputs(Level::mha, d, DType::float64, 7, true);
  EXPECT_FALSE(plain.bq.defined());
  for (const auto& [a, b] : {std::pair{&plain.x, &biased.x}, {&plain.wq, &biased.wq}, {&plain.wk, &biased.wk},
                             {&plain.wv, &biased.wv}, {&plain.wo, &biased.wo}, {&plain.r, &biased.r}})
    EXPECT_EQ(a->to_vector(), b->to_vector());
  Generator gen(7);
  for (const Shape& s : {Shape{2, 3, 8}, Shape{12, 8}, Shape{6, 8}, Shape{6, 8}, Shape{8, 12}, Shape{2, 3, 8}})
    (void)randn(s, DType::float64, gen);
  const double w = 1.0 / std::sqrt(8.0);
  EXPECT_EQ(biased.bq.to_vector(), randn({12}, DType::float64, gen, w).to_vector());
  EXPECT_EQ(biased.bk.to_vector(), randn({6}, DType::float64, gen, w).to_vector());
  EXPECT_EQ(biased.bv.to_vector(), randn({6}, DType::float64, gen, w).to_vector());
  EXPECT_EQ(biased.bo.to_vector(), randn({8}, DType::float64, gen, 1.0 / std::sqrt(12.0)).to_vector());
}

TEST_F(Bias, PluginWithoutTheCapabilityIsRefusedNamingIt) {
  EXPECT_TRUE(contains(capabilities_str(registry_->get("per_head").info.capabilities), "bias"));
  const Suite s = parse_suite("suite: t\ncases:\n  - {name: c, bias: true, compare: [uncatalogued_heads_reversed, "
                              "per_head], shape: {B: 2, T: 3, D: 8, H: 2}}\n", "bias.yaml");
  std::vector<const CaseSpec*> cases = {&s.cases[0]};
  try {
    check_capabilities(cases, *registry_);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "plugin 'uncatalogued_heads_reversed' lacks the capability 'bias'")) << e.what();
  }
  // a core-only C plugin: refused for the level, and told it lacks bias too
  Capabilities c_caps;
  c_caps.core = true;
  const auto missing = missing_capabilities(s.cases[0], c_caps);
  ASSERT_EQ(missing.size(), 2u);
  EXPECT_EQ(missing[0].first, "mha");
  EXPECT_EQ(missing[1].first, "bias");
}

TEST_F(Bias, PluginThatIgnoresItsBiasesFailsOnOutAndEveryBiasGradient) {
  const CaseResult r = run("  - {name: c, bias: true, causal: true, compare: [bias_ignored, per_head], "
                           "shape: {B: 2, T: 3, D: 8, H: 2}}\n");
  ASSERT_EQ(r.status, CaseStatus::fail) << r.cause;
  for (const char* name : {"out", "dbq", "dbk", "dbv", "dbo"}) {
    const TensorComparison* t = tensor(r, name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_FALSE(t->allclose) << name;
  }
  EXPECT_TRUE(contains(tensor(r, "dbo")->problem, "bias_ignored gives no dbo")) << tensor(r, "dbo")->problem;
  // localization: every variant keeps the biases but one, where the failure disappears
  ASSERT_TRUE(r.localization);
  EXPECT_TRUE(contains(r.localization->sentence, "disappears at bias off")) << r.localization->sentence;
  for (const auto& row : r.localization->rows)
    EXPECT_EQ(contains(row.shape, ",bias"), row.change != "bias off") << row.change << ": " << row.shape;
  // the same plugin passes where there are no biases
  EXPECT_EQ(run("  - {name: c, causal: true, compare: [bias_ignored, per_head], shape: {B: 2, T: 3, D: 8, H: 2}}\n")
                .status,
            CaseStatus::pass);
}

TEST_F(Bias, CatalogBugsAreNamedWithBiasesOn) {
  for (const char* bug : {"merge_without_transpose", "weights_not_transposed", "missing_output_projection",
                          "scale_one_over_d"}) {
    const CaseResult r = run("  - {name: c, bias: true, causal: true, compare: [mutant_" + std::string(bug) +
                             ", per_head], shape: {B: 2, T: 3, D: 8, H: 2}}\n");
    ASSERT_EQ(r.status, CaseStatus::fail) << bug;
    ASSERT_TRUE(r.diagnosis) << bug;
    EXPECT_EQ(r.diagnosis->best(), bug) << r.diagnosis->sentence;
    EXPECT_TRUE(tensor(r, "dbq")) << bug;
  }
  // the tile re-run permutes bq with Wq's rows
  const CaseResult r = run("  - {name: c, bias: true, causal: true, compare: [mutant_kv_map_tile, per_head], "
                           "shape: {B: 2, T: 7, D: 24, H: 12, Hkv: 3, d: 10}}\n");
  ASSERT_TRUE(r.diagnosis);
  EXPECT_EQ(r.diagnosis->best(), "kv_map_tile") << r.diagnosis->sentence;
  bool confirmed = false;
  for (const auto& e : r.diagnosis->evidence) confirmed = confirmed || contains(e, "matches the correct attention");
  EXPECT_TRUE(confirmed) << (r.diagnosis->evidence.empty() ? "no evidence" : r.diagnosis->evidence.front());
}

// A reference directory with biases: the files give them, the checks grow by their gradients.
TEST_F(Bias, ReferenceWithBiasesIsReadAndChecked) {
  const CaseResult r = run("  - {name: c, compare: [per_head], reference: " + kBiasRef + ", shape: {H: 6}, causal: true}\n");
  EXPECT_EQ(r.status, CaseStatus::pass) << r.cause;
  EXPECT_TRUE(r.spec.bias);
  for (const char* name : {"dbq", "dbk", "dbv", "dbo"}) EXPECT_TRUE(tensor(r, name)) << name;
  // a reference without biases and a case that says it has them
  try {
    Suite s = parse_suite("suite: t\ncases:\n  - {name: c, compare: [per_head], bias: true, reference: " HEADGRAD_SOURCE_ROOT
                          "/configs/refs/mha_B2_T3_D8_H2_causal_float64, shape: {H: 2}}\n", "bias.yaml");
    load_case_files(s.cases[0]);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "says 'bias: true' but reference directory")) << e.what();
    EXPECT_TRUE(contains(e.what(), "has no bq, bk, bv, bo")) << e.what();
  }
}

class BiasFiles : public Bias {
 protected:
  void SetUp() override {
    Bias::SetUp();
    dir_ = fs::temp_directory_path() / ("headgrad_bias_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy(kBiasRef, dir_ / "ref", fs::copy_options::recursive);
    std::ofstream(dir_ / "suite.yaml") << "suite: t\ncases:\n  - {name: c, compare: [per_head], reference: ref, "
                                          "shape: {H: 6}, causal: true}\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(BiasFiles, WrongShapeBiasFileExitsTwoNamingItAndTheShape) {
  Generator gen(3);
  write_npy(dir_ / "ref" / "bk.npy", randn({24}, DType::float64, gen));  // bq's size, not Hkv*d = 12
  const test::Outcome o = test::headgrad({"run", (dir_ / "suite.yaml").string()});
  EXPECT_EQ(o.code, 2) << o.out << o.err;
  EXPECT_TRUE(contains(o.err, "ref/bk.npy has shape [24], expected [12] (bk is [Hkv*d] (H=6, Hkv=3, d=4, D=8"))
      << o.err;
}

TEST_F(BiasFiles, PartialBiasesAndWrongGradientShapesAreRefused) {
  fs::remove(dir_ / "ref" / "bo.npy");
  try {
    (void)load_suite(dir_ / "suite.yaml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "holds bq.npy, bk.npy, bv.npy but not bo.npy")) << e.what();
  }
  fs::copy_file(fs::path(kBiasRef) / "bo.npy", dir_ / "ref" / "bo.npy");
  Generator gen(4);
  write_npy(dir_ / "ref" / "dbo.npy", randn({2, 8}, DType::float64, gen));
  try {
    (void)load_suite(dir_ / "suite.yaml");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "ref/dbo.npy has shape [2, 8], expected [8] (the gradient of bo.npy [8])"))
        << e.what();
  }
}

// export writes the biases and their gradients, and its suite passes against them.
TEST_F(BiasFiles, ExportWritesBiasesAndItsSuitePasses) {
  std::ofstream(dir_ / "gen.yaml") << "suite: t\ncases:\n  - {name: c, bias: true, causal: true, compare: [batched, "
                                      "per_head], shape: {B: 2, T: 3, D: 8, H: 2}}\n";
  const fs::path out = dir_ / "exported";
  const test::Outcome e = test::headgrad({"export", (dir_ / "gen.yaml").string(), "--case", "c", "--out", out.string()});
  ASSERT_EQ(e.code, 0) << e.out << e.err;
  for (const char* stem : {"bq", "bk", "bv", "bo", "dbq", "dbk", "dbv", "dbo"})
    EXPECT_TRUE(fs::is_regular_file(out / (std::string(stem) + ".npy"))) << stem;
  EXPECT_TRUE(contains(test::slurp(out / "suite.yaml"), "bias: true"));
  const test::Outcome r = test::headgrad({"run", (out / "suite.yaml").string(), "--json", (dir_ / "r.json").string()});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(test::slurp(dir_ / "r.json"), "\"dbq\"")) << r.out;
}

}  // namespace

namespace {

// The C ABI is core-level only: a bias case against a C plugin is a capability
// refusal (exit 2) that names both what it lacks, not a crash or a silent run.
TEST(BiasCPlugin, BiasCaseAgainstACPluginIsRefusedNamingTheCapability) {
  const fs::path dir = fs::temp_directory_path() / ("headgrad_bias_c_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "s.yaml") << "suite: t\ncases:\n  - {name: c, bias: true, compare: [naive_c, per_head], "
                                   "shape: {B: 2, T: 3, D: 8, H: 2}}\n";
  const test::Outcome o = test::headgrad({"run", (dir / "s.yaml").string(), "--plugin-path", C_PLUGIN_DIR});
  fs::remove_all(dir);
  EXPECT_EQ(o.code, 2) << o.out << o.err;
  EXPECT_TRUE(contains(o.err, "plugin 'naive_c' lacks the capability 'mha' (the case is at mha level); it also lacks "
                              "'bias' (the case has 'bias: true'"))
      << o.err;
}

}  // namespace

namespace {

// configs/mutants.yaml's MHA-level cases with `bias: true` added: every catalog
// bug there is still caught and named, by the same diagnosis, with biases on
// every projection (the mutants and the hypotheses add them as per_head does).
// The 16-bit cases are left out: their bugs are 16-bit arithmetic, and their
// shape (d 512) makes them the slowest by far.
TEST(BiasMutants, EveryMhaMutantIsNamedWithBiasesOn) {
  PluginRegistry registry;
  registry.load_directories(plugin_search_path({HEADGRAD_BUILD_PLUGIN_DIR}));
  Suite suite = load_suite(HEADGRAD_SOURCE_ROOT "/configs/mutants.yaml");
  std::vector<CaseSpec> kept;
  for (CaseSpec c : suite.cases) {
    if (c.level != Level::mha || c.dtype != DType::float64) continue;
    c.bias = true;
    c.check = with_bias_gradients(c.check);
    kept.push_back(c);
  }
  ASSERT_GE(kept.size(), 30u);
  suite.cases = kept;
  const SuiteResult result = run_suite(suite, registry, {});
  for (const auto& c : result.cases) {
    ASSERT_TRUE(c.diagnosis.has_value()) << c.spec.name << ": " << c.cause;
    EXPECT_EQ(c.diagnosis->best(), c.spec.expect_diagnosis) << c.spec.name << ": " << c.diagnosis->sentence;
    EXPECT_TRUE(contains(describe_case(c.spec), "bias")) << c.spec.name;
  }
  const MutationScore score = result.mutation_score();
  EXPECT_EQ(score.named, kept.size());
}

}  // namespace

}  // namespace test_bias
