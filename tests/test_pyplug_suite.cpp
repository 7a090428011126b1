// Python functions as plugins, the parts that need no Python: capability
// names, a suite's `plugins:` block, and the suite `headgrad check` writes
// (read back with load_suite, case by case). The worker itself is tested
// end to end by tests/python/test_pyplug.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "case/inputs.hpp"
#include "case/suite.hpp"
#include "pyplug/check_suite.hpp"
#include "pyplug/python_plugin.hpp"

namespace test_pyplug_suite {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;
using namespace headgrad;
using namespace headgrad::runner;

namespace {

std::string error_of(const std::string& yaml, const fs::path& file = "t.yaml") {
  try {
    parse_suite(yaml, file);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("pyplug_test_" + std::to_string(::getpid()) + "_" +
                                               std::to_string(reinterpret_cast<std::uintptr_t>(this)));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

const CaseSpec* find_case(const Suite& s, const std::string& name) {
  for (const auto& c : s.cases)
    if (c.name == name) return &c;
  return nullptr;
}

bool has_prefix(const Suite& s, const std::string& prefix) {
  return std::any_of(s.cases.begin(), s.cases.end(), [&](const CaseSpec& c) { return c.name.rfind(prefix, 0) == 0; });
}

}  // namespace

TEST(PythonCapabilities, NamesAsPluginsPrintsThem) {
  const Capabilities c = pyplug::parse_capabilities({"mha", "causal", "gqa", "rope", "Tq!=Tk", "mask", "bfloat16"});
  EXPECT_TRUE(c.mha && c.causal && c.grouped_kv && c.rope && c.cross_lengths && c.bool_mask);
  EXPECT_FALSE(c.core || c.rope_level || c.dropout);
  EXPECT_TRUE(c.float32 && c.float64);  // neither named: both
  EXPECT_EQ(c.extra, std::vector<std::string>{"bfloat16"});
  const Capabilities f = pyplug::parse_capabilities({"core", "float32"});
  EXPECT_TRUE(f.float32);
  EXPECT_FALSE(f.float64);  // named one: only that one
  EXPECT_FALSE(f.causal);   // not named: a non-causal-only function
  // the field names `headgrad plugins` prints, and every one of them is accepted
  const Capabilities fields = pyplug::parse_capabilities({"core", "grouped_kv", "bool_mask", "cross_lengths", "rope_level"});
  EXPECT_TRUE(fields.grouped_kv && fields.bool_mask && fields.cross_lengths && fields.rope_level);
  for (const auto& c : kCapabilityNames) {
    const Capabilities one = pyplug::parse_capabilities({"mha", std::string(c.name)});
    EXPECT_TRUE(one.*c.flag) << c.name;
  }
  // the window, cap and sinks at either level; QK-norm and x_kv are MHA-level inputs
  const Capabilities core = pyplug::parse_capabilities({"core", "window", "softcap", "sinks"});
  EXPECT_TRUE(core.window && core.softcap && core.sinks);
  for (const char* mha_only : {"qk_norm", "cross_attention"}) {
    try {
      pyplug::parse_capabilities({"core", mha_only});
      ADD_FAILURE() << mha_only << " accepted without mha";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("capability '") + mha_only + "' is an MHA-level one"),
                std::string::npos) << e.what();
    }
  }
  // biases are an MHA-level input: a core-only function cannot declare them
  EXPECT_THROW(pyplug::parse_capabilities({"core", "bias"}), std::invalid_argument);
}

TEST(PythonCapabilities, UnknownOrNoLevelIsRefused) {
  try {
    pyplug::parse_capabilities({"mha", "gqaa"});
    FAIL() << "gqaa accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown capability 'gqaa' (did you mean 'gqa'?)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pyplug::parse_capabilities({"causal", "gqa"}), std::invalid_argument);
}

TEST(SuitePlugins, PathRelativeToTheSuiteAndServedNames) {
  TempDir tmp;
  fs::create_directories(tmp.path / "glue");
  std::ofstream(tmp.path / "glue" / "mine.py") << "def fn(x, wq, wk, wv, wo): return x\n";
  const Suite s = parse_suite(
      "plugins:\n"
      "  mine: {python: glue/mine.py:fn, capabilities: [mha, causal, gqa], rope: {theta: 500000, rotary_dim: 4}}\n"
      "  served: {python: '@closure', capabilities: [core]}\n"
      "  module: {python: 'my.pkg:attention', capabilities: [mha]}\n"
      "cases:\n  - {name: a, compare: [mine, per_head], shape: {B: 1, T: 2, D: 4, H: 2}}\n",
      tmp.path / "s.yaml");
  ASSERT_EQ(s.python_plugins.size(), 3u);
  const auto& mine = s.python_plugins[0];
  EXPECT_EQ(mine.name, "mine");
  EXPECT_EQ(mine.function, (fs::absolute(tmp.path) / "glue" / "mine.py").lexically_normal().string() + ":fn");
  EXPECT_TRUE(mine.capabilities.mha && mine.capabilities.causal && mine.capabilities.grouped_kv);
  EXPECT_EQ(mine.rope.theta, 500000.0);
  EXPECT_EQ(mine.rope.rotary_dim, 4);
  EXPECT_FALSE(mine.rope.style.has_value());
  EXPECT_EQ(mine.origin, (tmp.path / "s.yaml").string() + ":2:3");
  EXPECT_EQ(s.python_plugins[1].function, "@closure");
  EXPECT_EQ(s.python_plugins[2].function, "my.pkg:attention");
  // the plugin runs as a registered plugin of that name
  const LoadedPlugin p = pyplug::make_python_plugin(mine);
  EXPECT_EQ(p.info.name, "mine");
  EXPECT_TRUE(pyplug::is_python_plugin(*p.attention));
}

TEST(SuitePlugins, MistakesNameTheLine) {
  const std::string cases = "cases:\n  - {name: a, compare: [m, per_head]}\n";
  EXPECT_EQ(error_of("plugins:\n  m: {python: nowhere.py:fn, capabilities: [mha]}\n" + cases),
            "t.yaml:2:15: plugin 'm': no file nowhere.py");
  EXPECT_EQ(error_of("plugins:\n  m: {python: fn_without_module, capabilities: [mha]}\n" + cases),
            "t.yaml:2:15: 'python' must be FILE.py:FUNCTION or MODULE:FUNCTION, got 'fn_without_module'");
  EXPECT_EQ(error_of("plugins:\n  m: {python: 'a:b'}\n" + cases).rfind("t.yaml:2:6: plugin 'm' has no 'capabilities' list", 0), 0u)
      << error_of("plugins:\n  m: {python: 'a:b'}\n" + cases);
  EXPECT_EQ(error_of("plugins:\n  m: {python: 'a:b', capabilities: [mha, causel]}\n" + cases).rfind(
                "t.yaml:2:36: plugin 'm': unknown capability 'causel' (did you mean 'causal'?)", 0),
            0u)
      << error_of("plugins:\n  m: {python: 'a:b', capabilities: [mha, causel]}\n" + cases);
  EXPECT_EQ(error_of("plugins:\n  m: {pyhton: 'a:b', capabilities: [mha]}\n" + cases),
            "t.yaml:2:7: unknown key 'pyhton' in plugin 'm' (did you mean 'python'?)");
  EXPECT_EQ(error_of("plugin:\n  m: {}\n" + cases), "t.yaml:1:1: unknown key 'plugin' in the suite (did you mean 'plugins'?)");
}

TEST(CheckSuite, MhaAdaptedToTheSignature) {
  TempDir tmp;
  pyplug::CheckOptions o;
  o.function = "@attention";
  pyplug::FunctionInfo takes_causal{{"num_heads", "causal"}, false, "", {}};
  const Suite both = load_suite(pyplug::write_check_suite(o, takes_causal, tmp.path / "a"));
  ASSERT_EQ(both.python_plugins.size(), 1u);
  EXPECT_EQ(both.python_plugins[0].name, "attention");
  EXPECT_TRUE(both.python_plugins[0].capabilities.causal);
  EXPECT_TRUE(has_prefix(both, "not causal"));
  const CaseSpec* transposed = find_case(both, "non-contiguous input[T=5,H=2]");
  ASSERT_NE(transposed, nullptr);
  EXPECT_EQ(transposed->layout, InputLayout::transposed);
  EXPECT_EQ(find_case(both, "sliced input")->layout, InputLayout::sliced);
  EXPECT_EQ(find_case(both, "float32")->dtype, DType::float32);
  EXPECT_EQ(transposed->compare, (std::vector<std::string>{"attention", "per_head"}));
  EXPECT_FALSE(has_prefix(both, "head width below"));  // it takes no head_dim
  EXPECT_FALSE(has_prefix(both, "grouped kv"));

  // no `causal` argument, declared causal: only causal cases
  pyplug::FunctionInfo fixed{{"num_heads", "head_dim"}, false, "", {}};
  o.causal = true;
  const Suite causal_only = load_suite(pyplug::write_check_suite(o, fixed, tmp.path / "b"));
  EXPECT_FALSE(has_prefix(causal_only, "not causal"));
  for (const auto& c : causal_only.cases) EXPECT_TRUE(c.causal) << c.name;
  const CaseSpec* d = find_case(causal_only, "head width below D / H");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->dims.head_dim() * d->dims.H, 18);
  EXPECT_NE(d->dims.D, 18);

  // --no-causal: none causal, the capability off
  o.causal = false;
  const Suite non_causal = load_suite(pyplug::write_check_suite(o, fixed, tmp.path / "c"));
  for (const auto& c : non_causal.cases) EXPECT_FALSE(c.causal) << c.name;
  EXPECT_FALSE(non_causal.python_plugins[0].capabilities.causal);
}

TEST(CheckSuite, GroupedKvRopeAndDtype) {
  TempDir tmp;
  pyplug::CheckOptions o;
  o.function = "@llama";
  o.kv_heads = 2;
  o.rope = "theta=500000,style=half";
  o.dtype = "bfloat16";
  pyplug::FunctionInfo f{{"num_heads", "num_kv_heads", "causal", "positions"}, false, "", {}};
  const Suite s = load_suite(pyplug::write_check_suite(o, f, tmp.path));
  const auto& decl = s.python_plugins.at(0);
  EXPECT_TRUE(decl.capabilities.grouped_kv && decl.capabilities.rope);
  EXPECT_EQ(decl.capabilities.extra, std::vector<std::string>{"bfloat16"});
  EXPECT_EQ(decl.rope.theta, 500000.0);
  EXPECT_EQ(decl.rope.style, "half");
  int grouped = 0;
  for (const auto& c : s.cases) {
    ASSERT_TRUE(c.rope.has_value()) << c.name;
    EXPECT_EQ(c.rope->style, RopeStyle::half);
    EXPECT_EQ(c.rope->theta, 500000.0);
    if (c.name.rfind("grouped kv", 0) == 0) {
      ++grouped;
      EXPECT_EQ(c.dims.kv_heads(), 2) << c.name;
      EXPECT_GT(c.dims.H, 2) << c.name;
      EXPECT_EQ(c.dims.D % c.dims.H, 0) << c.name;
      EXPECT_NE(c.dims.B, c.dims.H) << c.name;
      EXPECT_NE(c.dims.B, c.dims.kv_heads()) << c.name;
    }
  }
  EXPECT_EQ(grouped, 3);
  EXPECT_EQ(find_case(s, "bfloat16")->dtype, DType::bfloat16);
  // the function takes positions: the sweep puts tokens at gapped per-row positions
  EXPECT_EQ(find_case(s, "sliced input")->rope->generator, "gapped");
  EXPECT_THROW(pyplug::write_check_suite([&] { auto b = o; b.rope = "theta"; return b; }(), f, tmp.path / "x"),
               std::invalid_argument);
  EXPECT_THROW(pyplug::write_check_suite([&] { auto b = o; b.rope = "style=sideways"; return b; }(), f, tmp.path / "y"),
               std::invalid_argument);
}

TEST(CheckSuite, CoreWithMaskAndScale) {
  TempDir tmp;
  pyplug::CheckOptions o;
  o.function = "@sdpa";
  o.level = "core";
  pyplug::FunctionInfo f{{"causal", "mask", "scale"}, false, "", {}};
  const Suite s = load_suite(pyplug::write_check_suite(o, f, tmp.path));
  const auto& caps = s.python_plugins.at(0).capabilities;
  EXPECT_TRUE(caps.core && caps.bool_mask && caps.cross_lengths && caps.causal);
  const CaseSpec* m = find_case(s, "boolean mask, padding and holes");
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(fs::is_regular_file(m->mask_file)) << m->mask_file;
  EXPECT_EQ(m->level, Level::core);
  ASSERT_NE(find_case(s, "large logits"), nullptr);
  EXPECT_EQ(*find_case(s, "large logits")->scale, 2000.0);
  ASSERT_NE(find_case(s, "decode step, Tq = 1"), nullptr);
  EXPECT_EQ(find_case(s, "decode step, Tq = 1")->dims.Tq, 1);
  // without mask and scale: neither case
  pyplug::FunctionInfo plain{{"causal"}, false, "", {}};
  const Suite p = load_suite(pyplug::write_check_suite(o, plain, tmp.path / "p"));
  EXPECT_EQ(find_case(p, "boolean mask, padding and holes"), nullptr);
  EXPECT_EQ(find_case(p, "large logits"), nullptr);
  EXPECT_FALSE(p.python_plugins.at(0).capabilities.bool_mask);
}

TEST(CheckSuite, BiasesWhenTheSignatureNamesThem) {
  TempDir tmp;
  pyplug::CheckOptions o;
  o.function = "@attention";
  pyplug::FunctionInfo named{{"num_heads", "causal", "bq", "bk", "bv", "bo"}, false, "", {"num_heads", "causal", "bq", "bk", "bv", "bo"}};
  const Suite with = load_suite(pyplug::write_check_suite(o, named, tmp.path / "a"));
  EXPECT_TRUE(with.python_plugins.at(0).capabilities.bias);
  for (const auto& c : with.cases) EXPECT_TRUE(c.bias) << c.name;  // every case: the function as it is
  // **kwargs takes them too, but does not name them: no biases unless --bias
  pyplug::FunctionInfo kwargs{{"num_heads", "causal", "bq", "bk", "bv", "bo"}, true, "", {"num_heads"}};
  const Suite without = load_suite(pyplug::write_check_suite(o, kwargs, tmp.path / "b"));
  EXPECT_FALSE(without.python_plugins.at(0).capabilities.bias);
  for (const auto& c : without.cases) EXPECT_FALSE(c.bias) << c.name;
  o.bias = true;
  const Suite asked = load_suite(pyplug::write_check_suite(o, kwargs, tmp.path / "c"));
  for (const auto& c : asked.cases) EXPECT_TRUE(c.bias) << c.name;
  o.bias = false;  // --no-bias
  const Suite off = load_suite(pyplug::write_check_suite(o, named, tmp.path / "d"));
  for (const auto& c : off.cases) EXPECT_FALSE(c.bias) << c.name;
  // --bias for a function that takes none, or at the core level: refused
  o.bias = true;
  pyplug::FunctionInfo none{{"num_heads", "causal"}, false, "f.py:3", {"num_heads", "causal"}};
  EXPECT_THROW(pyplug::write_check_suite(o, none, tmp.path / "e"), std::invalid_argument);
  o.level = "core";
  EXPECT_THROW(pyplug::write_check_suite(o, named, tmp.path / "f"), std::invalid_argument);
}

TEST(CheckSuite, FeaturesWhoseArgumentsTheSignatureNames) {
  TempDir tmp;
  pyplug::CheckOptions o;
  o.function = "@modern";
  o.kv_heads = 2;
  const std::vector<std::string> all = {"num_heads", "num_kv_heads", "causal", "window", "softcap", "sinks",
                                        "q_norm",    "k_norm",       "qk_norm", "x_kv"};
  const Suite s = load_suite(pyplug::write_check_suite(o, {all, false, "", all}, tmp.path / "a"));
  const auto& caps = s.python_plugins.at(0).capabilities;
  EXPECT_TRUE(caps.window && caps.softcap && caps.sinks && caps.qk_norm && caps.cross_attention);
  // at the shapes where the known bugs show
  const CaseSpec* w = find_case(s, "window, W = 4 keys");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(*w->window.left, 3);
  EXPECT_GT(w->dims.T, *w->window.left + 2);  // T > W + 1: an off-by-one shows
  EXPECT_TRUE(w->causal);
  const CaseSpec* two = find_case(s, "window, two-sided, not causal");
  ASSERT_NE(two, nullptr);
  EXPECT_FALSE(two->causal);  // a causal case hides window_both_sides
  EXPECT_EQ(*two->window.right, 1);
  const CaseSpec* cap = find_case(s, "softcap, scores at 3-5 C");
  ASSERT_NE(cap, nullptr);
  EXPECT_EQ(cap->softcap, 0.75);
  const CaseSpec* sinks = find_case(s, "sinks, grouped kv heads");
  ASSERT_NE(sinks, nullptr);
  EXPECT_TRUE(sinks->sinks);
  EXPECT_EQ(sinks->dims.H, 6);  // not Hkv^2: a wrong per-head stride shows
  EXPECT_EQ(sinks->dims.Hkv, 2);
  const CaseSpec* model = find_case(s, "qk_norm, whole projection, gain 1 + w");
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->qk_norm.axis, QkNormAxis::model);
  EXPECT_EQ(model->qk_norm.gain, QkNormGain::one_plus_w);
  const CaseSpec* cross = find_case(s, "cross, Tq != Tk");
  ASSERT_NE(cross, nullptr);
  EXPECT_TRUE(cross->cross);
  EXPECT_FALSE(cross->causal);  // causal cross-attention hides cross_causal
  EXPECT_NE(cross->dims.Tq, cross->dims.Tk);
  // one named: its cases only; without qk_norm the QK-norm defaults only; **kwargs alone names none
  const std::vector<std::string> window_only = {"num_heads", "causal", "window"};
  const Suite one = load_suite(pyplug::write_check_suite(o, {window_only, false, "", window_only}, tmp.path / "b"));
  EXPECT_TRUE(has_prefix(one, "window"));
  EXPECT_FALSE(has_prefix(one, "softcap") || has_prefix(one, "sinks") || has_prefix(one, "qk_norm") || has_prefix(one, "cross"));
  const std::vector<std::string> gains = {"num_heads", "causal", "q_norm", "k_norm"};
  const Suite norm = load_suite(pyplug::write_check_suite(o, {gains, false, "", gains}, tmp.path / "c"));
  EXPECT_NE(find_case(norm, "qk_norm, per head"), nullptr);
  EXPECT_EQ(find_case(norm, "qk_norm, whole projection, gain 1 + w"), nullptr);
  const Suite kwargs = load_suite(pyplug::write_check_suite(o, {all, true, "", {"num_heads"}}, tmp.path / "d"));
  EXPECT_FALSE(has_prefix(kwargs, "window") || has_prefix(kwargs, "sinks"));
  o.features = false;  // --no-features
  const Suite off = load_suite(pyplug::write_check_suite(o, {all, false, "", all}, tmp.path / "e"));
  EXPECT_FALSE(has_prefix(off, "window") || has_prefix(off, "sinks") || has_prefix(off, "cross"));
  // the core level: the fully masked row (with `mask`) and the decode step (with `causal` too)
  o.features = true;
  o.level = "core";
  o.kv_heads = 0;
  const std::vector<std::string> core = {"causal", "mask", "window", "softcap", "sinks"};
  const Suite c = load_suite(pyplug::write_check_suite(o, {core, false, "", core}, tmp.path / "f"));
  const CaseSpec* empty = find_case(c, "sinks, a fully masked row");
  ASSERT_NE(empty, nullptr);
  EXPECT_TRUE(fs::is_regular_file(empty->mask_file)) << empty->mask_file;
  ASSERT_NE(find_case(c, "softcap, a fully masked row"), nullptr);
  const CaseSpec* decode = find_case(c, "window, decode step");
  ASSERT_NE(decode, nullptr);
  EXPECT_EQ(decode->causal_alignment, CausalAlignment::bottom_right);
  EXPECT_FALSE(has_prefix(c, "qk_norm") || has_prefix(c, "cross"));  // MHA-level features
}

TEST(CheckSuite, PluginNameFromTheFunction) {
  EXPECT_EQ(pyplug::check_plugin_name("/a/b/glue.py:my_attention"), "my_attention");
  EXPECT_EQ(pyplug::check_plugin_name("@closure"), "closure");
  EXPECT_EQ(pyplug::check_plugin_name("pkg.mod:Class.method"), "Class_method");
}

}  // namespace test_pyplug_suite
