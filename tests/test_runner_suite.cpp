// Suites: parsing, defaults, sweeps, and every validation error with its
// FILE:LINE:COL and what was expected. No plugin is loaded here.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "case/budget.hpp"
#include "analysis/catalog.hpp"
#include "case/suite.hpp"

namespace test_runner_suite {  // this file's names: test files share unity builds (tests/meson.build)

namespace {

using namespace headgrad;
using namespace headgrad::runner;

Suite parse(const std::string& yaml) { return parse_suite(yaml, "t.yaml"); }

// The ConfigError's message, or a note that there was none.
std::string error_of(const std::string& yaml) {
  try {
    parse(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

CaseSpec only_case(const Suite& s) {  // a copy: callers pass temporaries
  EXPECT_EQ(s.cases.size(), 1u);
  return s.cases.at(0);
}

constexpr const char* kPair = "compare: [per_head, batched]";

TEST(Suite, ReadsEveryKey) {
  const Suite s = parse(R"(
suite: all-keys
description: every key once
cases:
  - name: everything
    description: a case
    compare: [per_head, batched]
    level: mha
    shape: {B: 2, T: 3, D: 8, H: 2}
    dtype: float32
    causal: true
    scale: 0.25
    dropout_p: 0.0
    input_layout: sliced
    seed: 42
    atol: 1.0e-4
    rtol: 1.0e-3
    tolerance: {dwq: {atol: 0.5}}
    check: [dwo, out]
    expect: {fail: true, diagnosis: no_scale}
    timeout: 5
)");
  EXPECT_EQ(s.name, "all-keys");
  const CaseSpec& c = only_case(s);
  EXPECT_EQ(c.name, "everything");
  EXPECT_EQ(c.compare, (std::vector<std::string>{"per_head", "batched"}));
  EXPECT_EQ(c.level, Level::mha);
  EXPECT_EQ(c.dims.B, 2);
  EXPECT_EQ(c.dims.T, 3);
  EXPECT_EQ(c.dims.D, 8);
  EXPECT_EQ(c.dims.H, 2);
  EXPECT_EQ(c.dims.head_dim(), 4);
  EXPECT_EQ(c.dtype, DType::float32);
  EXPECT_TRUE(c.causal);
  EXPECT_DOUBLE_EQ(*c.scale, 0.25);
  EXPECT_EQ(c.layout, InputLayout::sliced);
  EXPECT_EQ(c.seed, 42u);
  EXPECT_DOUBLE_EQ(c.tolerance.atol, 1e-4);
  EXPECT_DOUBLE_EQ(c.tolerance.rtol, 1e-3);
  EXPECT_DOUBLE_EQ(c.tolerance_for("dwq").atol, 0.5);
  EXPECT_DOUBLE_EQ(c.tolerance_for("dwq").rtol, 1e-3);  // falls back to the case's
  EXPECT_DOUBLE_EQ(c.tolerance_for("dx").atol, 1e-4);
  EXPECT_EQ(c.check, (std::vector<std::string>{"out", "dwo"}));  // report order
  EXPECT_TRUE(c.check_strict);
  EXPECT_TRUE(c.expect_fail);
  EXPECT_EQ(c.expect_diagnosis, "no_scale");
  EXPECT_DOUBLE_EQ(c.timeout_s, 5);
  EXPECT_EQ(c.source.str(), "t.yaml:5:5");
  EXPECT_EQ(describe_case(c), "MHA(B=2,T=3,D=8,H=2,causal,scale=0.25,sliced,float32)");
}

TEST(Suite, BuiltInDefaults) {
  const CaseSpec& c = only_case(parse(std::string("cases:\n  - name: a\n    ") + kPair +
                                      "\n    shape: {B: 1, T: 2, D: 4, H: 1}\n"));
  EXPECT_EQ(c.dtype, DType::float64);
  EXPECT_FALSE(c.causal);
  EXPECT_DOUBLE_EQ(c.tolerance.atol, 1e-8);
  EXPECT_DOUBLE_EQ(c.tolerance.rtol, 1e-6);
  EXPECT_DOUBLE_EQ(c.timeout_s, 60);
  EXPECT_EQ(c.seed, 0u);
  EXPECT_EQ(c.check, tensor_names(Level::mha));
  EXPECT_FALSE(c.check_strict);
  EXPECT_EQ(c.layout, InputLayout::contiguous);
}

TEST(Suite, Float32HasItsOwnDefaultTolerance) {
  const CaseSpec& c = only_case(parse(std::string("cases:\n  - name: a\n    ") + kPair +
                                      "\n    dtype: float32\n    shape: {B: 1, T: 2, D: 4, H: 1}\n"));
  EXPECT_DOUBLE_EQ(c.tolerance.atol, 1e-5);
  EXPECT_DOUBLE_EQ(c.tolerance.rtol, 1e-4);
}

TEST(Suite, DefaultsApplyAndCasesOverrideThem) {
  const Suite s = parse(R"(
defaults:
  causal: true
  seed: 3
  shape: {D: 8, H: 2}
  tolerance: {dwq: {atol: 0.1}}
cases:
  - name: inherits
    compare: [per_head, batched]
    shape: {B: 1, T: 2}
  - name: overrides
    compare: [per_head, batched]
    causal: false
    seed: 4
    shape: {B: 1, T: 2, H: 4}
    tolerance: {dwk: {rtol: 0.2}}
  - name: inherits-again
    compare: [per_head, batched]
    shape: {B: 1, T: 2}
)");
  ASSERT_EQ(s.cases.size(), 3u);
  const CaseSpec &a = s.cases[0], &b = s.cases[1], &c = s.cases[2];
  EXPECT_TRUE(a.causal);
  EXPECT_EQ(a.seed, 3u);
  EXPECT_EQ(a.dims.D, 8);  // shape merges dim by dim
  EXPECT_EQ(a.dims.H, 2);
  EXPECT_DOUBLE_EQ(a.tolerance_for("dwq").atol, 0.1);
  EXPECT_FALSE(b.causal);
  EXPECT_EQ(b.seed, 4u);
  EXPECT_EQ(b.dims.H, 4);
  EXPECT_EQ(b.dims.D, 8);
  EXPECT_DOUBLE_EQ(b.tolerance_for("dwq").atol, 0.1);  // tolerance merges tensor by tensor
  EXPECT_DOUBLE_EQ(b.tolerance_for("dwk").rtol, 0.2);
  // A case that overrides a default must not change what later cases inherit
  // (yaml-cpp's nodes are shared handles: a regression of that once did).
  EXPECT_TRUE(c.causal);
  EXPECT_EQ(c.seed, 3u);
  EXPECT_EQ(c.dims.H, 2);
  EXPECT_EQ(c.key_source.at("causal").str(), "t.yaml:3:11");  // from the defaults
  EXPECT_EQ(b.key_source.at("causal").str(), "t.yaml:13:13");
}

TEST(Suite, SweepExpandsAsACartesianProduct) {
  const Suite s = parse(R"(
cases:
  - name: layouts
    compare: [batched, per_head]
    shape: {B: 9, D: 24}
    sweep: {B: [1, 2], T: [1, 5, 17], H: [1, 2, 4], D: [24]}
)");
  ASSERT_EQ(s.cases.size(), 18u);
  EXPECT_EQ(s.cases[0].name, "layouts[B=1,T=1,H=1]");  // D has one value: not in the name
  EXPECT_EQ(s.cases[1].name, "layouts[B=1,T=1,H=2]");  // the last dim varies fastest
  EXPECT_EQ(s.cases[17].name, "layouts[B=2,T=17,H=4]");
  EXPECT_EQ(s.cases[17].dims.B, 2);  // the sweep wins over the shape
  EXPECT_EQ(s.cases[17].dims.T, 17);
  EXPECT_EQ(s.cases[17].dims.H, 4);
  EXPECT_EQ(s.cases[17].dims.D, 24);
  EXPECT_EQ(s.cases[17].base_name, "layouts");
  ASSERT_EQ(s.cases[5].sweep_point.size(), 4u);
  EXPECT_EQ(s.cases[5].sweep_point[1], (std::pair<std::string, std::int64_t>{"T", 5}));
}

TEST(Suite, CoreLevelCase) {
  const CaseSpec& c = only_case(parse(R"(
defaults:
  check: [out, dx, dwq, dwk, dwv, dwo]
cases:
  - name: core
    level: core
    compare: [per_head, batched]
    mask: causal
    shape: {B: 2, H: 3, Tq: 5, Tk: 7, d: 4}
)"));
  EXPECT_EQ(c.level, Level::core);
  EXPECT_TRUE(c.causal);
  EXPECT_TRUE(c.mask_file.empty());
  EXPECT_EQ(c.dims.Tq, 5);
  EXPECT_EQ(c.dims.Tk, 7);
  EXPECT_EQ(c.dims.d, 4);
  // a defaults list written for the mha level does not narrow the core checks
  EXPECT_EQ(c.check, tensor_names(Level::core));
  EXPECT_EQ(describe_case(c), "CORE(B=2,H=3,Tq=5,Tk=7,d=4,causal)");
}

TEST(Suite, CausalTakesEitherAlignment) {
  auto with = [](const std::string& causal) {
    return only_case(parse(std::string("cases:\n  - name: a\n    level: core\n    ") + kPair +
                           "\n    shape: {B: 1, H: 1, Tq: 1, Tk: 7, d: 4}\n    causal: " + causal + "\n"));
  };
  const CaseSpec yes = with("true"), top = with("top_left"), bottom = with("bottom_right"), no = with("false");
  EXPECT_TRUE(yes.causal);
  EXPECT_EQ(yes.causal_alignment, CausalAlignment::top_left);  // PyTorch's is_causal
  EXPECT_TRUE(top.causal);
  EXPECT_EQ(top.causal_alignment, CausalAlignment::top_left);
  EXPECT_TRUE(bottom.causal);
  EXPECT_EQ(bottom.causal_alignment, CausalAlignment::bottom_right);
  EXPECT_FALSE(no.causal);
  EXPECT_EQ(describe_case(yes), "CORE(B=1,H=1,Tq=1,Tk=7,d=4,causal)");
  EXPECT_EQ(describe_case(top), "CORE(B=1,H=1,Tq=1,Tk=7,d=4,causal)");
  EXPECT_EQ(describe_case(bottom), "CORE(B=1,H=1,Tq=1,Tk=7,d=4,causal=bottom_right)");
  EXPECT_EQ(describe_case(no), "CORE(B=1,H=1,Tq=1,Tk=7,d=4)");
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    causal: bottom-right\n"),
            "t.yaml:4:13: case 'a': 'causal' must be true, false, top_left or bottom_right (true is "
            "top_left, as PyTorch's is_causal), got 'bottom-right'");
}

// The name is checked where the catalog lives (the analysis), at its YAML location.
std::string diagnosis_error_of(const std::string& yaml) {
  try {
    headgrad::diagnosis::check_expected_diagnoses(parse(yaml));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Suite, ExpectedDiagnosisIsACatalogNameOrNone) {
  const std::string head = std::string("cases:\n  - name: a\n    ") + kPair +
                           "\n    shape: {B: 1, T: 2, D: 4, H: 1}\n    expect: {fail: true, diagnosis: ";
  EXPECT_EQ(only_case(parse(head + "none}\n")).expect_diagnosis, "none");
  EXPECT_EQ(only_case(parse(head + "causal_alignment}\n")).expect_diagnosis, "causal_alignment");
  EXPECT_EQ(diagnosis_error_of(head + "none}\n"), "(no error)");
  EXPECT_EQ(diagnosis_error_of(head + "kv_swaped}\n"),
            "t.yaml:5:37: case 'a': 'diagnosis' must be a known bug's name or none, got 'kv_swaped'; "
            "did you mean 'kv_swapped'?");
  const std::string far = diagnosis_error_of(head + "something_else_entirely}\n");
  EXPECT_NE(far.find("got 'something_else_entirely'; the names: split_without_transpose, "), std::string::npos) << far;
}

TEST(Suite, PathsResolveAgainstTheSuitesFolder) {
  const Suite s = parse_suite(R"(
cases:
  - name: ref
    compare: [per_head]
    reference: refs/case1
    shape: {H: 2}
  - name: masked
    level: core
    compare: [per_head, batched]
    mask: masks/m.npy
    shape: {B: 1, H: 1, Tq: 2, Tk: 2, d: 2}
)",
                              "configs/sub/s.yaml");
  EXPECT_EQ(s.cases[0].reference, std::filesystem::path("configs/sub/refs/case1"));
  EXPECT_EQ(s.cases[0].reference_text, "refs/case1");
  EXPECT_TRUE(s.cases[0].is_reference());
  EXPECT_EQ(s.cases[1].mask_file, std::filesystem::path("configs/sub/masks/m.npy"));
}

// ---- errors: each names FILE:LINE:COL and what was expected ----

TEST(SuiteErrors, MalformedYaml) {
  const std::string e = error_of("cases:\n  - name: a\n    compare: [per_head, batched\n    shape: {B: 1}\n");
  EXPECT_EQ(e.rfind("t.yaml:4:10: malformed YAML", 0), 0u) << e;
}

TEST(SuiteErrors, EmptyFileAndNoCases) {
  EXPECT_EQ(error_of(""), "t.yaml:1:1: the suite is empty; it needs at least 'cases:'");
  EXPECT_EQ(error_of("suite: x\n"), "t.yaml:1:1: the suite has no 'cases:' list");
  EXPECT_EQ(error_of("cases: []\n").rfind("t.yaml:1:8: 'cases' must be a non-empty list", 0), 0u);
}

TEST(SuiteErrors, UnknownKeysSuggestTheClosest) {
  EXPECT_EQ(error_of("cases:\n  - name: a\n    compare: [per_head, batched]\n    dtyp: float64\n"),
            "t.yaml:4:5: case 'a': unknown key 'dtyp' in the case (did you mean 'dtype'?)");
  EXPECT_EQ(error_of("case:\n  - name: a\n"), "t.yaml:1:1: unknown key 'case' in the suite (did you mean 'cases'?)");
  EXPECT_EQ(error_of("defaults:\n  tolerence: {}\ncases: []\n"),
            "t.yaml:2:3: unknown key 'tolerence' in 'defaults' (did you mean 'tolerance'?)");
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    expect: {fial: true}\n"),
            "t.yaml:4:14: case 'a': unknown key 'fial' in 'expect' (did you mean 'fail'?)");
  // nothing close: the valid keys are listed
  const std::string e = error_of("cases:\n  - name: a\n    zzzzzz: 1\n");
  EXPECT_NE(e.find("unknown key 'zzzzzz'"), std::string::npos) << e;
  EXPECT_NE(e.find("valid keys: name, description, compare"), std::string::npos) << e;
}

TEST(SuiteErrors, UnknownOrMisplacedDims) {
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    shape: {B: 1, Tt: 2, D: 4, H: 1}\n"),
            "t.yaml:4:19: case 'a': unknown dim 'Tt' in 'shape' (did you mean 'T'?)");
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    shape: {B: 1, Tq: 2}\n"),
            "t.yaml:4:19: case 'a': 'Tq' at the mha level is for 'cross: true' (queries from x [B, Tq, D], keys and "
            "values from x_kv [B, Tk, D]); self-attention gives T");
  // a rope-level case still names another level's dim as such
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair +
                     "\n    level: rope\n    rope: {theta: 10000}\n    shape: {B: 1, Tq: 2}\n"),
            "t.yaml:6:19: case 'a': 'Tq' is a core-level dim; this case is level rope, whose dims are B, H, T, d");
}

TEST(SuiteErrors, WrongTypedValues) {
  const std::string head = std::string("cases:\n  - name: a\n    ") + kPair + "\n    ";
  EXPECT_EQ(error_of(head + "shape: {B: two, T: 3, D: 8, H: 2}\n"),
            "t.yaml:4:16: case 'a': 'B' must be an integer, got 'two'");
  EXPECT_EQ(error_of(head + "shape: {B: 0, T: 3, D: 8, H: 2}\n"),
            "t.yaml:4:16: case 'a': 'B' must be a positive integer, got 0");
  EXPECT_EQ(error_of(head + "causal: maybe\n"), "t.yaml:4:13: case 'a': 'causal' must be true, false, top_left or bottom_right (true is top_left, "
            "as PyTorch's is_causal), got 'maybe'");
  EXPECT_EQ(error_of(head + "atol: small\n"), "t.yaml:4:11: case 'a': 'atol' must be a finite number, got 'small'");
  EXPECT_EQ(error_of(head + "rtol: -1\n"), "t.yaml:4:11: case 'a': 'rtol' must be >= 0");
  EXPECT_EQ(error_of(head + "seed: [1]\n"), "t.yaml:4:11: case 'a': 'seed' must be an integer, got a list");
  EXPECT_EQ(error_of(head + "dtype:\n"), "t.yaml:4:5: case 'a': 'dtype' has no value");
  EXPECT_EQ(error_of(head + "dtype: float63\n"),
            "t.yaml:4:12: case 'a': 'dtype' must be float64 | float32 | bfloat16 | float16, got 'float63' (did you mean 'float64'?)");
  EXPECT_EQ(error_of(head + "input_layout: transposd\n"),
            "t.yaml:4:19: case 'a': 'input_layout' must be contiguous | transposed | sliced, got 'transposd' "
            "(did you mean 'transposed'?)");
  const std::string bounds = "must be a number of seconds > 0 and at most 86400 (one day), got ";
  EXPECT_EQ(error_of(head + "timeout: 0\n"), "t.yaml:4:14: case 'a': 'timeout' " + bounds + "0");
  EXPECT_EQ(error_of(head + "timeout: -1\n"), "t.yaml:4:14: case 'a': 'timeout' " + bounds + "-1");
  // 1e16 s: a deadline of now + 1e16 s overflows steady_clock's int64 nanoseconds
  EXPECT_EQ(error_of(head + "timeout: 1e16\n"), "t.yaml:4:14: case 'a': 'timeout' " + bounds + "1e+16");
  EXPECT_EQ(error_of(head + "timeout: .nan\n"), "t.yaml:4:14: case 'a': 'timeout' must be a finite number, got '.nan'");
  EXPECT_DOUBLE_EQ(only_case(parse(head + "timeout: 86400\n    shape: {B: 1, T: 1, D: 2, H: 1}\n")).timeout_s, 86400);
  EXPECT_EQ(error_of("cases:\n  - name: a\n    compare: per_head\n"),
            "t.yaml:3:14: case 'a': 'compare' must be a list like [a, b], got 'per_head'");
}

TEST(SuiteErrors, MissingValues) {
  EXPECT_EQ(error_of("cases:\n  - name: a\n    shape: {B: 1, T: 2, D: 4, H: 1}\n"),
            "t.yaml:2:5: case 'a': no 'compare' list (one plugin with 'reference', or two plugins)");
  EXPECT_EQ(error_of(std::string("cases:\n  - ") + kPair + "\n"), "t.yaml:2:5: case #1 has no 'name'");
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    shape: {B: 1, D: 4}\n"),
            "t.yaml:4:16: case 'a': missing shape dims T, H (mha level needs B, T, D, H in 'shape' or 'sweep')");
  EXPECT_EQ(error_of("cases:\n  - name: a\n    compare: [per_head]\n    reference: r\n"),
            "t.yaml:2:5: case 'a': a reference case at mha level needs the head count: shape: {H: ..} (B, T and D "
            "come from the files)");
}

TEST(SuiteErrors, DNotDivisibleByH) {
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    shape: {B: 1, T: 2, D: 10, H: 4}\n"),
            "t.yaml:4:16: case 'a': D=10 is not divisible by H=4 (each head takes d = D / H channels; give the head width d in 'shape' for Wq [H*d, D])");
  // in a sweep, the point is named
  EXPECT_EQ(error_of(std::string("cases:\n  - name: s\n    ") + kPair +
                     "\n    shape: {B: 1, T: 2, D: 12}\n    sweep: {H: [3, 5]}\n"),
            "t.yaml:5:16: case 's[H=5]': D=12 is not divisible by H=5 (each head takes d = D / H channels; give the head width d in 'shape' for Wq [H*d, D])");
}

TEST(SuiteErrors, DropoutIsRejectedWithTheReason) {
  const std::string e = error_of("defaults:\n  dropout_p: 0.1\ncases:\n  - name: a\n    compare: [per_head, batched]\n");
  EXPECT_EQ(e.rfind("t.yaml:2:14: case 'a': dropout_p must be 0 in a comparison, got 0.1", 0), 0u) << e;
  EXPECT_NE(e.find("the two sides draw different masks"), std::string::npos) << e;
  EXPECT_NE(e.find("eval() does not turn it off in a functional call"), std::string::npos) << e;
}

TEST(SuiteErrors, ComparePluginsOrAReference) {
  EXPECT_EQ(error_of("cases:\n  - name: a\n    compare: [per_head]\n    shape: {B: 1, T: 2, D: 4, H: 1}\n"),
            "t.yaml:3:14: case 'a': 'compare' needs two plugins, or one plugin and a 'reference' directory; got 1 name");
  EXPECT_EQ(error_of("cases:\n  - name: a\n    compare: [per_head, batched]\n    reference: r\n"),
            "t.yaml:3:14: case 'a': a case with 'reference' compares exactly one plugin against it, got 2 names");
  EXPECT_EQ(error_of("cases:\n  - name: a\n    compare: [a, b, c]\n"),
            "t.yaml:3:14: case 'a': 'compare' needs two plugins, or one plugin and a 'reference' directory; got 3 names");
  EXPECT_EQ(error_of("cases:\n  - name: a\n    compare: [per_head]\n    reference: r\n    shape: {H: 1}\n"
                     "    sweep: {H: [1, 2]}\n"),
            "t.yaml:6:12: case 'a': a reference case cannot sweep: its shapes come from the reference files");
}

TEST(SuiteErrors, DuplicatesAndMasks) {
  EXPECT_EQ(error_of("cases:\n  - name: a\n    name: b\n"),
            "t.yaml:3:5: duplicate key 'name' (first at line 2); each key may appear once in a map");
  // in any map, at any depth: a dim, a tolerance, the top level
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    shape: {B: 1, T: 2, D: 4, H: 1, B: 3}\n"),
            "t.yaml:4:37: duplicate key 'B' (first at line 4); each key may appear once in a map");
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair +
                     "\n    tolerance: {out: {atol: 1, atol: 2}}\n"),
            "t.yaml:4:32: duplicate key 'atol' (first at line 4); each key may appear once in a map");
  EXPECT_EQ(error_of("suite: x\nsuite: y\ncases: []\n"),
            "t.yaml:2:1: duplicate key 'suite' (first at line 1); each key may appear once in a map");
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    shape: {B: 1, T: 2, D: 4, H: 1}\n" +
                     "  - name: a\n    " + kPair + "\n    shape: {B: 1, T: 2, D: 4, H: 1}\n"),
            "t.yaml:5:5: two cases are named 'a'; names must be unique");
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    mask: m.npy\n"),
            "t.yaml:4:11: case 'a': a mask file needs 'level: core' (at mha level the only masks are none and "
            "causal; use causal: true)");
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    causal: false\n    mask: causal\n"),
            "t.yaml:5:11: case 'a': 'mask: causal' contradicts 'causal: false'");
}

TEST(SuiteErrors, CheckNamesFitTheLevel) {
  EXPECT_EQ(error_of("cases:\n  - name: a\n    level: core\n    compare: [per_head, batched]\n    check: [out, dx]\n"),
            "t.yaml:5:12: case 'a': 'dx' is not a core-level tensor (out, dq, dk, dv); did you mean 'dq'?");
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    check: [out, dwz]\n"),
            "t.yaml:4:12: case 'a': 'dwz' is not a mha-level tensor (out, dx, dwq, dwk, dwv, dwo); did you mean 'dwq'?");
}

// ---- capabilities (a plugin's declared Capabilities against a case) ----

TEST(SuiteCapabilities, NamesWhatIsMissing) {
  const Suite s = parse(R"(
cases:
  - name: core-cross
    level: core
    compare: [a, b]
    causal: true
    dtype: float32
    shape: {B: 1, H: 1, Tq: 2, Tk: 3, d: 2}
)");
  Capabilities caps;  // mha only by default; causal, float32, float64 on
  caps.causal = false;
  caps.float32 = false;
  const auto missing = missing_capabilities(s.cases[0], caps);
  std::vector<std::string> names;
  for (const auto& [cap, why] : missing) names.push_back(cap);
  EXPECT_EQ(names, (std::vector<std::string>{"core", "causal", "cross_lengths", "float32"}));
  EXPECT_EQ(missing[2].second, "Tq=2, Tk=3");
  caps.core = caps.causal = caps.cross_lengths = caps.float32 = true;
  EXPECT_TRUE(missing_capabilities(s.cases[0], caps).empty());
}

TEST(SuiteErrors, OneDocumentPerFile) {
  const std::string one = std::string("cases:\n  - name: a\n    ") + kPair + "\n    shape: {B: 1, T: 2, D: 4, H: 1}\n";
  EXPECT_EQ(error_of(one + "---\ncases:\n  - name: b\n"),
            "t.yaml:6:1: a second YAML document (after '---'): a suite file holds one document; put every case "
            "under one 'cases:' list, or use two files");
  EXPECT_EQ(parse("---\n" + one + "...\n").cases.size(), 1u);  // explicit start and end markers are fine
  EXPECT_EQ(parse(one + "---\n").cases.size(), 1u);              // so is an empty trailing document
}

TEST(SuiteErrors, NestingTooDeepIsNamed) {
  const std::string e = error_of("cases: " + std::string(100000, '[') + std::string(100000, ']') + "\n");
  EXPECT_NE(e.find("malformed YAML: lists and maps nested too deep for the YAML parser"), std::string::npos) << e;
}

TEST(SuiteErrors, AliasesCannotExpandWithoutBound) {
  // 10 levels of 10 aliases each: 10^10 values from a few hundred bytes
  std::string yaml = "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n";
  for (int i = 1; i <= 10; ++i) {
    const std::string prev = "*a" + std::to_string(i - 1);
    yaml += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [" + prev;
    for (int k = 1; k < 10; ++k) yaml += ", " + prev;
    yaml += "]\n";
  }
  const std::string e = error_of(yaml + "cases: []\n");
  EXPECT_NE(e.find("the suite holds more than 1000000 values once its aliases (*name) are expanded"), std::string::npos)
      << e;
}

TEST(SuiteErrors, SweepsAreCountedBeforeTheyExpand) {
  // 100 x 100 x 100 points from three lines: refused at the sweep, nothing expanded
  std::string values;
  for (int i = 1; i <= 100; ++i) values += (i > 1 ? ", " : "") + std::to_string(i);
  const std::string yaml = std::string("cases:\n  - name: many\n    ") + kPair + "\n    shape: {D: 8}\n" +
                           "    sweep: {B: [" + values + "], T: [" + values + "], H: [1, 2, 4, 8]}\n";
  EXPECT_EQ(error_of(yaml).rfind("t.yaml:5:16: case 'many': the sweep expands to 40000 cases (100 x 100 x 4 values)", 0),
            0u) << error_of(yaml);
  // exactly at the cap is fine: 100 x 100
  const std::string at_cap = std::string("cases:\n  - name: many\n    ") + kPair +
                             "\n    shape: {D: 8, H: 2}\n    sweep: {B: [" + values + "], T: [" + values + "]}\n";
  EXPECT_EQ(parse(at_cap).cases.size(), kMaxSuiteCases);
  // the cap holds for plain cases too
  std::string plain = "cases:\n";
  for (std::size_t i = 0; i <= kMaxSuiteCases; ++i)
    plain += "  - {name: c" + std::to_string(i) + ", " + kPair + ", shape: {B: 1, T: 1, D: 2, H: 1}}\n";
  EXPECT_EQ(error_of(plain), "t.yaml:10002:5: case 'c10000': this case would be case 10001, and a suite may hold at "
                             "most 10000 cases: split the suite");
}

TEST(SuiteMemory, EstimateAndBudget) {
  CaseSpec c = only_case(parse(std::string("cases:\n  - name: m\n    ") + kPair +
                               "\n    shape: {B: 2, T: 3, D: 8, H: 2}\n"));
  // By hand, in elements (x, r, out, dx [2, 3, 8] = 48; four [8, 8] weights = 256;
  // q, k, v, merged heads [2, 3, 8] = 48 each; scores [2, 2, 3, 3] = 36):
  //   inputs x, r, weights           2*48 + 256       = 352
  //   results out, dx, dweights      48 + 48 + 256    = 352
  //   working: leaf grads 352, q k v merged and grads 2 * 192 = 384, 4 score buffers 144 = 880
  //   total 352 + 880 + 3 * 352 (two sides' results and the wire copy) = 2288 elements, 8 bytes each
  EXPECT_DOUBLE_EQ(case_memory_bytes(c), 2288.0 * 8);
  c.dtype = DType::float32;
  // Below float64 judged relative_to_baseline (the default), the oracle's
  // float64 golden runs too: its 8-byte working set is the estimate. Its
  // score buffers here are far below kOracleRecomputeAboveBytes, so per_head
  // keeps every head's: the float64 figure.
  EXPECT_TRUE(c.relative_rule());
  EXPECT_DOUBLE_EQ(case_memory_bytes(c), 2288.0 * 8);
  {
    // Past the bound (B 1, H 4, T 3000: every head's [T, T] in float64 is
    // 288 MB), per_head recomputes each head: of the 4 score buffers per head
    // the estimate counts one head's, 4 * 3 * 3000^2 elements fewer than the
    // float64 case (which any plugin may run keeping every head's).
    CaseSpec big = only_case(parse(std::string("cases:\n  - name: big\n    ") + kPair +
                                   "\n    shape: {B: 1, T: 3000, D: 8, H: 4}\n"));
    const double every_head = case_memory_bytes(big);
    big.dtype = DType::bfloat16;
    EXPECT_DOUBLE_EQ(case_memory_bytes(big), every_head - 4.0 * 3 * 3000 * 3000 * 8);
  }
  c.tolerance_rule = ToleranceRule::allclose;  // no golden: the case's own dtype
  EXPECT_DOUBLE_EQ(case_memory_bytes(c), 2288.0 * 4);
  EXPECT_NO_THROW(check_memory({&c}, 2288.0 * 4, "test"));
  try {
    check_memory({&c}, 2288.0 * 4 - 1, "a test budget");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("t.yaml:2:5: case 'm': MHA(B=2,T=3,D=8,H=2,float32) needs about 8.9 KiB", 0),
              0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("the budget of 8.9 KiB (a test budget)"), std::string::npos) << e.what();
  }
  // Dims whose product wraps int64 (2^32 * 2^32 = 0 mod 2^64) are a huge number here, not zero.
  c.dims = {};
  c.dims.B = c.dims.T = std::int64_t{1} << 32;
  c.dims.D = 8;
  c.dims.H = 2;
  EXPECT_GT(case_memory_bytes(c), 1e30);
}

TEST(SuiteMemory, SizesParseAndPrint) {
  EXPECT_DOUBLE_EQ(parse_size("4G"), 4.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(parse_size("512M"), 512.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(parse_size("1.5GiB"), 1.5 * (1 << 30));
  EXPECT_DOUBLE_EQ(parse_size("2kb"), 2048);
  EXPECT_DOUBLE_EQ(parse_size("100000"), 100000);
  for (const char* bad : {"", "G", "4X", "-1G", "0", "nan", "inf", "1e400", "0.5"}) EXPECT_THROW(parse_size(bad), std::invalid_argument) << bad;
  EXPECT_EQ(format_bytes(512), "512 bytes");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(13.4 * (1ull << 30)), "13.4 GiB");
  EXPECT_EQ(format_bytes(2.7e21), "2.7e+21 bytes");
  EXPECT_GT(memory_budget(std::nullopt).bytes, 1 << 20);  // sysconf's physical memory
  EXPECT_EQ(memory_budget(1024.0).source, "--max-memory 1.0 KiB");
}

TEST(SuiteHelpers, ClosestMatch) {
  const std::vector<std::string> keys = {"dtype", "causal", "input_layout", "tolerance"};
  EXPECT_EQ(closest_match("dtyp", keys), "dtype");
  EXPECT_EQ(closest_match("Causal", keys), "causal");  // case-insensitive
  EXPECT_EQ(closest_match("input_layot", keys), "input_layout");
  EXPECT_EQ(closest_match("tolerence", keys), "tolerance");
  EXPECT_EQ(closest_match("banana", keys), "");
}

TEST(SuiteFiles, TheDefaultSuiteParses) {
  const Suite s = parse_suite(
      [] {
        std::ifstream in(std::string(HEADGRAD_SOURCE_ROOT) + "/configs/default.yaml");
        return std::string(std::istreambuf_iterator<char>(in), {});
      }(),
      "configs/default.yaml");
  EXPECT_EQ(s.name, "default");
  EXPECT_GT(s.cases.size(), 20u);
}

// Grouped kv heads: Hkv (default H) and an mha-level head width d.
TEST(SuiteGroupedKv, HkvAndHeadWidth) {
  const Suite s = parse(std::string("cases:\n  - name: g\n    ") + kPair +
                        "\n    shape: {B: 2, T: 7, D: 24, H: 12, Hkv: 3, d: 10}\n"
                        "  - name: plain\n    " + kPair + "\n    shape: {B: 2, T: 7, D: 24, H: 12}\n"
                        "  - name: same\n    " + kPair + "\n    shape: {B: 1, T: 2, D: 24, H: 12, Hkv: 12, d: 2}\n"
                        "  - name: c\n    level: core\n    " + kPair +
                        "\n    shape: {B: 2, H: 12, Hkv: 1, Tq: 5, Tk: 7, d: 4}\n");
  ASSERT_EQ(s.cases.size(), 4u);
  const Dims& g = s.cases[0].dims;
  EXPECT_EQ(g.Hkv, 3);
  EXPECT_EQ(g.kv_heads(), 3);
  EXPECT_EQ(g.head_dim(), 10);  // given, not D / H = 2
  EXPECT_EQ(describe_case(s.cases[0]), "MHA(B=2,T=7,D=24,H=12,Hkv=3,d=10)");
  EXPECT_EQ(s.cases[1].dims.kv_heads(), 12);  // default H
  EXPECT_EQ(s.cases[1].dims.head_dim(), 2);
  EXPECT_EQ(describe_case(s.cases[1]), "MHA(B=2,T=7,D=24,H=12)");
  // the defaults written out are not shown
  EXPECT_EQ(describe_case(s.cases[2]), "MHA(B=1,T=2,D=24,H=12)");
  EXPECT_EQ(s.cases[3].dims.kv_heads(), 1);
  EXPECT_EQ(describe_case(s.cases[3]), "CORE(B=2,H=12,Hkv=1,Tq=5,Tk=7,d=4)");
}

TEST(SuiteGroupedKv, HeadWidthLiftsTheDivisibilityRule) {
  // D = 25 is not divisible by H = 12; with d given, Wq is [H*d, D] and D is free
  const CaseSpec c = only_case(parse(std::string("cases:\n  - name: a\n    ") + kPair +
                                     "\n    shape: {B: 1, T: 2, D: 25, H: 12, Hkv: 4, d: 3}\n"));
  EXPECT_EQ(c.dims.head_dim(), 3);
  EXPECT_EQ(describe_case(c), "MHA(B=1,T=2,D=25,H=12,Hkv=4,d=3)");
}

TEST(SuiteGroupedKv, ErrorsNameTheKey) {
  const std::string rule = " (each kv head serves G = H / Hkv query heads: query head h reads kv head h / G)";
  // each error points at the Hkv value
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    shape: {B: 2, T: 7, D: 24, H: 12, Hkv: 5}\n"),
            "t.yaml:4:44: case 'a': 'Hkv': H=12 is not a multiple of Hkv=5" + rule);
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    shape: {B: 2, T: 7, D: 24, H: 4, Hkv: 8}\n"),
            "t.yaml:4:43: case 'a': 'Hkv' is Hkv=8 but there are only H=4 query heads; Hkv must be at most H "
            "(Hkv = H is plain multi-head, 1 is MQA)");
  EXPECT_EQ(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    shape: {B: 2, T: 7, D: 24, H: 4, Hkv: 0}\n"),
            "t.yaml:4:43: case 'a': 'Hkv' must be a positive integer, got 0");
  // a sweep over Hkv names the point and the sweep's line
  EXPECT_EQ(error_of(std::string("cases:\n  - name: s\n    ") + kPair +
                     "\n    shape: {B: 1, T: 2, D: 24, H: 12}\n    sweep: {Hkv: [1, 5]}\n"),
            "t.yaml:5:18: case 's[Hkv=5]': 'Hkv': H=12 is not a multiple of Hkv=5" + rule);
  // a sweep over H checks each point against the shape's Hkv, at the Hkv key
  EXPECT_EQ(error_of(std::string("cases:\n  - name: s\n    ") + kPair +
                     "\n    shape: {B: 1, T: 2, D: 24, Hkv: 3}\n    sweep: {H: [6, 4]}\n"),
            "t.yaml:4:37: case 's[H=4]': 'Hkv': H=4 is not a multiple of Hkv=3" + rule);
  EXPECT_NE(error_of(std::string("cases:\n  - name: a\n    ") + kPair + "\n    shape: {B: 1, T: 2, D: 24, H: 4, hkv: 2}\n")
                .find("did you mean 'Hkv'?"),
            std::string::npos);
}

TEST(SuiteGroupedKv, SweepOverHkv) {
  const Suite s = parse(std::string("cases:\n  - name: s\n    ") + kPair +
                        "\n    shape: {B: 2, T: 7, D: 24, H: 12, d: 10}\n    sweep: {Hkv: [1, 3, 12]}\n");
  ASSERT_EQ(s.cases.size(), 3u);
  EXPECT_EQ(s.cases[0].name, "s[Hkv=1]");
  EXPECT_EQ(s.cases[1].dims.Hkv, 3);
  EXPECT_EQ(s.cases[2].dims.kv_heads(), 12);
}

TEST(SuiteGroupedKv, CapabilityAndMemory) {
  const Suite s = parse(std::string("cases:\n  - name: g\n    ") + kPair +
                        "\n    shape: {B: 2, T: 7, D: 24, H: 12, Hkv: 3, d: 10}\n"
                        "  - name: m\n    " + kPair + "\n    shape: {B: 2, T: 7, D: 24, H: 12, Hkv: 12, d: 10}\n");
  Capabilities caps;  // causal, float32, float64; grouped_kv off
  caps.mha = true;
  const auto missing = missing_capabilities(s.cases[0], caps);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].first, "grouped_kv");
  EXPECT_EQ(missing[0].second, "H=12 query heads share Hkv=3 kv heads");
  EXPECT_TRUE(missing_capabilities(s.cases[1], caps).empty());  // Hkv = H is plain multi-head
  caps.grouped_kv = true;
  EXPECT_TRUE(missing_capabilities(s.cases[0], caps).empty());
  // the estimate counts [Hkv*d, D] key/value weights and [B, Hkv, T, d] keys and values
  const AttentionDims g{.mha = true, .B = 2, .H = 12, .Tq = 7, .Tk = 7, .d = 10, .D = 24, .Hkv = 3};
  EXPECT_EQ(case_memory_bytes(s.cases[0]), attention_bytes(g, 8));
  AttentionDims full = g;
  full.Hkv = 12;
  EXPECT_EQ(case_memory_bytes(s.cases[1]), attention_bytes(full, 8));
  // By hand, per kv head (Hkv 3 -> 6, both below H so the widened copy is the same):
  // wk, wv of D*d each count as input, leaf grad and 3 copies of the result (5x);
  // k, v of B*T*d each count twice in the working set (value and gradient).
  AttentionDims six = g;
  six.Hkv = 6;
  EXPECT_DOUBLE_EQ((attention_bytes(six, 1) - attention_bytes(g, 1)) / 3,
                   5.0 * 2 * 24 * 10 + 2.0 * 2 * (2 * 7 * 10));
}

}  // namespace

// ---- the rope: block

TEST(SuiteRope, ReadsTheBlockAndDescribesIt) {
  const CaseSpec c = only_case(parse(R"(
cases:
  - name: r
    compare: [a, b]
    shape: {B: 2, T: 3, D: 12, H: 2}
    rope: {theta: 500000, style: half, rotary_dim: 4, positions: [[0, 5, 9], [1000, 1003, 1010]]}
)"));
  ASSERT_TRUE(c.rope);
  EXPECT_EQ(c.rope->theta, 500000.0);
  EXPECT_EQ(c.rope->style, RopeStyle::half);
  EXPECT_EQ(c.rope->rotary_dim, 4);
  EXPECT_TRUE(c.rope->per_row);
  EXPECT_EQ(describe_case(c), "MHA(B=2,T=3,D=12,H=2,rope=half/r4,positions[B,T])");
  Shape shape;
  EXPECT_EQ(rope_positions(*c.rope, 2, 3, shape), (std::vector<std::int64_t>{0, 5, 9, 1000, 1003, 1010}));
  EXPECT_EQ(shape, (Shape{2, 3}));
  Capabilities caps;
  caps.mha = true;
  const auto missing = missing_capabilities(c, caps);
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].first, "rope");
  caps.rope = true;
  EXPECT_TRUE(missing_capabilities(c, caps).empty());
}

TEST(SuiteRope, PositionForms) {
  Shape shape;
  // one list [T] shared by the batch
  const CaseSpec one = only_case(parse(std::string("cases:\n  - name: r\n    ") + kPair +
                                       "\n    shape: {B: 2, T: 3, D: 8, H: 2}\n    rope: {positions: [4, 2, 7]}\n"));
  EXPECT_EQ(rope_positions(*one.rope, 2, 3, shape), (std::vector<std::int64_t>{4, 2, 7}));
  EXPECT_EQ(shape, (Shape{3}));
  EXPECT_EQ(one.rope->style, RopeStyle::interleaved);  // the default
  // an offset: no tensor, p_t = offset + t
  const CaseSpec off = only_case(parse(std::string("cases:\n  - name: r\n    ") + kPair +
                                       "\n    shape: {B: 2, T: 3, D: 8, H: 2}\n    rope: {positions: {offset: 5}}\n"));
  EXPECT_EQ(off.rope->offset, 5);
  EXPECT_TRUE(rope_positions(*off.rope, 2, 3, shape).empty());
  // generators, worked by hand: row b begins at b * start
  RopeCase g;
  g.generator = "gapped";
  g.start = 1000;
  EXPECT_EQ(rope_positions(g, 2, 5, shape),
            (std::vector<std::int64_t>{0, 1, 3, 6, 7, 1000, 1001, 1003, 1006, 1007}));
  EXPECT_EQ(shape, (Shape{2, 5}));
  g.generator = "reversed";
  g.start = 10;
  EXPECT_EQ(rope_positions(g, 2, 3, shape), (std::vector<std::int64_t>{2, 1, 0, 12, 11, 10}));
  // core level: q_offset
  const CaseSpec core = only_case(parse(R"(
cases:
  - name: r
    level: core
    compare: [a, b]
    shape: {B: 1, H: 2, Tq: 2, Tk: 5, d: 4}
    rope: {positions: {offset: 3}, q_offset: 3}
)"));
  EXPECT_EQ(core.rope->q_offset, 3);
  EXPECT_EQ(describe_case(core), "CORE(B=1,H=2,Tq=2,Tk=5,d=4,rope=interleaved,offset=3,q_offset=3)");
}

TEST(SuiteRope, ErrorsNameTheKey) {
  auto with_rope = [](const std::string& rope, const std::string& shape = "{B: 2, T: 3, D: 12, H: 2}") {
    return error_of(std::string("cases:\n  - name: r\n    ") + kPair + "\n    shape: " + shape +
                    "\n    rope: " + rope + "\n");
  };
  EXPECT_EQ(with_rope("{rotary_dim: 5}"),
            "t.yaml:5:24: case 'r': 'rotary_dim' must be an even integer >= 2 (dims rotate in pairs), got 5");
  EXPECT_EQ(with_rope("{rotary_dim: 8}"),
            "t.yaml:5:24: case 'r': 'rotary_dim' 8 is wider than the head width d=6 (r <= d: the first r dims rotate)");
  EXPECT_EQ(with_rope("{style: halff}"),
            "t.yaml:5:19: case 'r': 'style' must be interleaved | half, got 'halff' (did you mean 'half'?)");
  EXPECT_EQ(with_rope("{positions: [1, 2]}"),
            "t.yaml:5:23: case 'r': 'positions' has 2 per row, but the case has T=3 tokens");
  EXPECT_EQ(with_rope("{positions: [[1, 2, 3]]}"),
            "t.yaml:5:23: case 'r': 'positions' has 1 rows, but the case has B=2 (one row per batch row, or one "
            "list [T] for all)");
  EXPECT_NE(with_rope("{positions: [[1, 2, 3], [1, 2]]}").find("t.yaml:5:35: case 'r': positions rows differ"),
            std::string::npos);
  EXPECT_NE(with_rope("{positions: {generator: zigzag}}").find("'generator' must be gapped | reversed"),
            std::string::npos);
  EXPECT_NE(with_rope("{thta: 2}").find("unknown key 'thta' in 'rope' (did you mean 'theta'?)"), std::string::npos);
  EXPECT_NE(with_rope("{q_offset: 2}").find("t.yaml:5:12: case 'r': 'q_offset' is a core-level key"),
            std::string::npos);
  // a sweep point whose T no longer fits the list is refused at the list
  EXPECT_NE(error_of(std::string("cases:\n  - name: r\n    ") + kPair +
                     "\n    shape: {B: 2, D: 12, H: 2}\n    sweep: {T: [3, 4]}\n    rope: {positions: [0, 1, 2]}\n")
                .find("case 'r[T=4]': 'positions' has 3 per row, but the case has T=4"),
            std::string::npos);
}

}  // namespace test_runner_suite
