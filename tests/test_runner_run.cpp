// The runner in this process: suites that pass, suites that must fail,
// reference directories (made here, then broken on purpose), isolation from
// plugins that throw, crash, abort, hang or return NaN, and capabilities.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include <headgrad/npy.hpp>

#include "analysis/analyze.hpp"
#include "job/run_suite.hpp"
#include "judge/golden.hpp"
#include "judge/run_case.hpp"
#include "runner_plugins.hpp"

namespace test_runner_run {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;

namespace {

using namespace headgrad;
using namespace headgrad::runner;
using headgrad::runner::run_suite;

const fs::path kFixtures = RUNNER_FIXTURES;

class RunnerTest : public headgrad::test::RunnerPluginsTest {
 protected:
  void SetUp() override {
    for (const char* name : {"per_head", "batched", "throws", "segfaults", "returns_nan", "limited"})
      ASSERT_NE(registry_->find(name), nullptr) << name << " is not loaded";
    dir_ = fs::temp_directory_path() / ("headgrad_runner_run_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Suite suite_from(const std::string& yaml) {
    const fs::path file = dir_ / "suite.yaml";
    std::ofstream(file) << yaml;
    return load_suite(file);
  }
  // The ConfigError loading `yaml` gives, or "(no error)".
  std::string load_error(const std::string& yaml) {
    try {
      suite_from(yaml);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  }

  // A reference directory holding per_head's tensors for `c` (as export does).
  void write_reference(const CaseSpec& c, const fs::path& out) {
    fs::create_directories(out);
    const CaseInputs in = make_inputs(c);
    for (const auto& [name, t] : input_tensors(in)) write_npy(out / (name + ".npy"), t);
    for (const auto& [name, t] : compute_side(c, in, *registry_->get("per_head").attention))
      write_npy(out / (name + ".npy"), t);
  }

  fs::path dir_;
};

TEST_F(RunnerTest, PassingSuitePasses) {
  const Suite suite = load_suite(kFixtures / "pass.yaml");
  const SuiteResult r = run_suite(suite, *registry_, {});
  ASSERT_EQ(r.cases.size(), 7u);
  for (const auto& c : r.cases) {
    EXPECT_EQ(c.status, CaseStatus::pass) << c.spec.name << ": " << c.cause;
    EXPECT_EQ(c.tensors.size(), c.spec.level == Level::mha ? 6u : 4u) << c.spec.name;
    EXPECT_EQ(c.sides.size(), 2u);
    EXPECT_TRUE(c.lhs.empty());  // passing cases do not keep their tensors
  }
  EXPECT_EQ(r.passed(), 7u);
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_EQ(r.cases[1].spec.name, "layouts[B=1,H=1]");
}

TEST_F(RunnerTest, ImpossiblyTightToleranceFailsAndExpectedFailuresCount) {
  const Suite suite = load_suite(kFixtures / "tight.yaml");
  // run_case hands back the inputs both sides were copied from (for the analysis)
  CaseInputs in;
  const CaseResult one = run_case(suite.cases[0], *registry_, {}, &in);
  EXPECT_EQ(in.x.shape(), (Shape{2, 4, 8}));
  EXPECT_EQ(one.status, CaseStatus::fail);
  EXPECT_FALSE(one.lhs.empty());  // until keep_report_data

  const SuiteResult r = run_suite(suite, *registry_, {});
  ASSERT_EQ(r.cases.size(), 2u);
  const CaseResult& tight = r.cases[0];
  EXPECT_EQ(tight.status, CaseStatus::fail);
  EXPECT_GT(tight.differing_tensors(), 0u);
  EXPECT_NE(tight.cause.find("tensors differ"), std::string::npos) << tight.cause;
  // A failing case keeps what the reports need, not both sides' tensors.
  EXPECT_TRUE(tight.lhs.empty());
  EXPECT_TRUE(tight.rhs.empty());
  ASSERT_EQ(tight.error_maps.size(), tight.tensors.size());
  for (const auto& t : tight.tensors)
    if (!t.allclose) {
      ASSERT_TRUE(t.worst);
      EXPECT_NE(t.worst->lhs, t.worst->rhs);
    }
  // The error maps hold |lhs - rhs|: out [B=2, T=4, D=8] is one 4 x 8 map per
  // batch item, and its largest cell is the largest difference.
  const TensorErrorMaps& out = tight.error_maps[0];
  EXPECT_EQ(out.tensor, "out");
  ASSERT_EQ(out.maps.size(), 2u);
  EXPECT_EQ(out.maps[0].cell_rows, 4);
  EXPECT_EQ(out.maps[0].cell_cols, 8);
  double biggest = 0;
  for (const auto& m : out.maps)
    for (double v : m.cells) biggest = std::max(biggest, v);
  EXPECT_DOUBLE_EQ(biggest, tight.tensors[0].max_abs);
  EXPECT_DOUBLE_EQ(out.vmax, tight.tensors[0].max_abs);
  EXPECT_EQ(r.cases[1].status, CaseStatus::xfail);
  EXPECT_EQ(r.passed(), 1u);
  EXPECT_EQ(r.exit_code(), 1);
}

TEST_F(RunnerTest, ExpectedFailureThatPassesIsAFailure) {
  const SuiteResult r = run_suite(suite_from(R"(
cases:
  - {name: fine, compare: [per_head, batched], expect: {fail: true}, shape: {B: 1, T: 2, D: 4, H: 2}}
)"),
                                  *registry_, {});
  EXPECT_EQ(r.cases[0].status, CaseStatus::xpass);
  EXPECT_NE(r.cases[0].cause.find("expected to fail"), std::string::npos);
  EXPECT_EQ(r.exit_code(), 1);
}

TEST_F(RunnerTest, LayoutsGiveTheSameTensors) {
  RunOptions keep;
  keep.keep_tensors = true;
  std::vector<TensorSet> outs;
  for (const char* layout : {"contiguous", "transposed", "sliced"}) {
    const Suite s = suite_from(std::string("cases:\n  - {name: c, compare: [per_head, batched], input_layout: ") +
                               layout + ", causal: true, shape: {B: 2, T: 3, D: 8, H: 2}}\n");
    const CaseResult r = run_case(s.cases[0], *registry_, keep);
    ASSERT_EQ(r.status, CaseStatus::pass) << layout << ": " << r.cause;
    outs.push_back(r.lhs);
  }
  for (std::size_t i = 0; i < outs[0].size(); ++i)
    for (std::size_t k = 1; k < outs.size(); ++k) {
      EXPECT_EQ(outs[k][i].name, outs[0][i].name);
      const auto a = outs[0][i].tensor.to_vector(), b = outs[k][i].tensor.to_vector();
      ASSERT_EQ(a.size(), b.size());
      for (std::size_t e = 0; e < a.size(); ++e) EXPECT_NEAR(a[e], b[e], 1e-12) << outs[0][i].name;
    }
}

// ---- reference directories ----

// bfloat16 references: float32 files of bfloat16 values, the case says dtype:
// bfloat16. Read exactly (and checked in bfloat16), or refused naming the file,
// the index and the value when a value is not a bfloat16.
TEST_F(RunnerTest, Bfloat16ReferenceIsReadExactlyOrRefused) {
  Suite gen = suite_from("cases:\n  - {name: g, compare: [per_head, batched], dtype: bfloat16, seed: 4, "
                         "shape: {B: 2, T: 3, D: 8, H: 2}}\n");
  write_reference(gen.cases[0], dir_ / "ref");
  EXPECT_EQ(read_npy(dir_ / "ref" / "x.npy").dtype(), DType::float32);  // .npy has no bfloat16
  const std::string yaml = "cases:\n  - {name: vs-ref, compare: [batched], reference: ref, dtype: bfloat16, "
                           "shape: {H: 2}}\n";
  Suite s = suite_from(yaml);
  EXPECT_EQ(s.cases[0].dtype, DType::bfloat16);
  CaseResult ok = run_case(s.cases[0], *registry_, {});
  EXPECT_EQ(ok.status, CaseStatus::pass) << ok.cause;

  Tensor x = read_npy(dir_ / "ref" / "x.npy");
  x.set({0, 1, 2}, 1.0 + 0x1p-10);  // 10 mantissa bits: not a bfloat16
  write_npy(dir_ / "ref" / "x.npy", x);
  const std::string err = load_error(yaml);
  for (const char* part : {"ref/x.npy", "[0, 1, 2]", "1.0009765625", "not exactly representable in bfloat16"})
    EXPECT_NE(err.find(part), std::string::npos) << part << " not in: " << err;
}

TEST_F(RunnerTest, ReferenceDirectoryRoundTripAndAMutatedFile) {
  Suite gen = suite_from("cases:\n  - {name: g, compare: [per_head, batched], causal: true, seed: 3, "
                         "shape: {B: 2, T: 3, D: 8, H: 2}}\n");
  write_reference(gen.cases[0], dir_ / "ref");
  const std::string yaml = "cases:\n  - {name: vs-ref, compare: [batched], reference: ref, causal: true, shape: {H: 2}}\n";
  Suite s = suite_from(yaml);
  EXPECT_EQ(s.cases[0].dims.B, 2);  // from the files
  EXPECT_EQ(s.cases[0].dims.T, 3);
  EXPECT_EQ(s.cases[0].dims.D, 8);
  CaseResult ok = run_case(s.cases[0], *registry_, {});
  EXPECT_EQ(ok.status, CaseStatus::pass) << ok.cause;
  EXPECT_EQ(ok.rhs_label, "ref");
  EXPECT_EQ(ok.sides.size(), 1u);

  // one element of out.npy off by 1e-3: the case fails and names the element
  Tensor out = read_npy(dir_ / "ref" / "out.npy");
  out.set({1, 2, 5}, out.at({1, 2, 5}) + 1e-3);
  write_npy(dir_ / "ref" / "out.npy", out);
  s = suite_from(yaml);  // the files are read when the suite loads, once
  CaseResult bad = run_case(s.cases[0], *registry_, {});
  EXPECT_EQ(bad.status, CaseStatus::fail);
  ASSERT_EQ(bad.tensors[0].name, "out");
  EXPECT_FALSE(bad.tensors[0].allclose);
  EXPECT_EQ(bad.tensors[0].mismatched, 1);
  EXPECT_EQ(bad.tensors[0].worst->where, "b=1, t=2, head=1, ch=1");
  EXPECT_NEAR(bad.tensors[0].max_abs, 1e-3, 1e-12);
  for (std::size_t i = 1; i < bad.tensors.size(); ++i) EXPECT_TRUE(bad.tensors[i].allclose) << bad.tensors[i].name;
  EXPECT_EQ(bad.cause, "1 of 6 tensors differ: out");
}

TEST_F(RunnerTest, ReferenceWithOnlySomeExpectedFilesChecksThose) {
  Suite gen = suite_from("cases:\n  - {name: g, compare: [per_head, batched], shape: {B: 1, T: 2, D: 4, H: 2}}\n");
  write_reference(gen.cases[0], dir_ / "ref");
  for (const char* f : {"dx", "dwq", "dwk", "dwv", "r"}) fs::remove(dir_ / "ref" / (std::string(f) + ".npy"));
  Suite s = suite_from("cases:\n  - {name: partial, compare: [per_head], reference: ref, shape: {H: 2}}\n");
  EXPECT_EQ(s.cases[0].check, (std::vector<std::string>{"out", "dwo"}));
  // without r.npy the loss weights are ones; per_head's dwo was made with the
  // seeded r, so it differs now while out does not
  const CaseResult r = run_case(s.cases[0], *registry_, {});
  EXPECT_TRUE(r.tensors[0].allclose);
  EXPECT_FALSE(r.tensors[1].allclose);
  // a case-level check that names a missing file is an error
  try {
    suite_from("cases:\n  - {name: strict, compare: [per_head], reference: ref, check: [out, dx], shape: {H: 2}}\n");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'check' lists dx but ref has no dx.npy"), std::string::npos) << e.what();
  }
}

TEST_F(RunnerTest, ReferenceDirectoryErrorsNameTheFileAndShape) {
  Suite gen = suite_from("cases:\n  - {name: g, compare: [per_head, batched], shape: {B: 1, T: 2, D: 4, H: 2}}\n");
  write_reference(gen.cases[0], dir_ / "ref");
  const std::string yaml = "cases:\n  - name: r\n    compare: [per_head]\n    reference: ref\n    shape: {H: 2}\n";
  const std::string where = (dir_ / "suite.yaml").string() + ":4:16: case 'r': ";
  fs::remove(dir_ / "ref" / "wk.npy");
  EXPECT_EQ(load_error(yaml), where + "reference directory ref has no wk.npy (an mha-level reference needs x, wq, wk, wv, wo)");
  write_npy(dir_ / "ref" / "wk.npy", Tensor::zeros({4, 3}, DType::float64));
  EXPECT_EQ(load_error(yaml), where + "ref/wk.npy has shape [4, 3], expected [Hkv*d, D] with d=2 (wq.npy [4, 4] over H=2), "
                              "D=4 from x.npy [1, 2, 4] and Hkv dividing H");
  write_npy(dir_ / "ref" / "wk.npy", Tensor::zeros({4, 4}, DType::float32));
  EXPECT_EQ(load_error(yaml), where + "ref/wk.npy is float32 but x.npy is float64; every file of a reference must share one dtype");
  write_npy(dir_ / "ref" / "wk.npy", Tensor::zeros({4, 4}, DType::float64));
  EXPECT_EQ(load_error("cases:\n  - name: r\n    compare: [per_head]\n    reference: ref\n    shape: {H: 3}\n"),
            where + "ref/wq.npy has shape [4, 4], expected [H*d, D] with H=3 and D=4 from x.npy [1, 2, 4]");
  EXPECT_EQ(load_error("cases:\n  - name: r\n    compare: [per_head]\n    reference: ref\n    shape: {H: 2, T: 5}\n"),
            where + "shape gives T=5 but x.npy has T=2");
  write_npy(dir_ / "ref" / "dx.npy", Tensor::zeros({1, 3, 4}, DType::float64));
  EXPECT_EQ(load_error(yaml), where + "ref/dx.npy has shape [1, 3, 4], expected [1, 2, 4] (x.npy is [1, 2, 4])");
  std::ofstream(dir_ / "ref" / "dx.npy") << "not an npy file";
  EXPECT_NE(load_error(yaml).find(where + "reference file "), std::string::npos);
  fs::remove_all(dir_ / "ref");
  EXPECT_EQ(load_error(yaml), where + "reference directory " + (dir_ / "ref").string() + " does not exist");
}

TEST_F(RunnerTest, CoreReferenceWithMask) {
  fs::copy_file(kFixtures / "mask_B2_Tq5_Tk7.npy", dir_ / "mask.npy", fs::copy_options::overwrite_existing);
  Suite gen = suite_from("cases:\n  - {name: g, level: core, compare: [per_head, batched], mask: mask.npy, "
                         "shape: {B: 2, H: 3, Tq: 5, Tk: 7, d: 4}}\n");
  write_reference(gen.cases[0], dir_ / "ref");
  ASSERT_TRUE(fs::exists(dir_ / "ref" / "mask.npy"));
  Suite s = suite_from("cases:\n  - {name: c, level: core, compare: [batched], reference: ref}\n");
  EXPECT_EQ(s.cases[0].mask_file, dir_ / "ref" / "mask.npy");
  EXPECT_EQ(s.cases[0].dims.Tk, 7);
  const CaseResult r = run_case(s.cases[0], *registry_, {});
  EXPECT_EQ(r.status, CaseStatus::pass) << r.cause;
  EXPECT_EQ(r.tensors.size(), 4u);
  // without the mask the expected tensors do not match
  fs::remove(dir_ / "ref" / "mask.npy");
  Suite unmasked = suite_from("cases:\n  - {name: c, level: core, compare: [batched], reference: ref}\n");
  EXPECT_EQ(run_case(unmasked.cases[0], *registry_, {}).status, CaseStatus::fail);
}

// ---- a case's files: read once, and checked ----

// Each reference is read once per case: when the suite loads. Running the
// cases (a failing one analyzed, its localization and diagnosis included)
// reads none of them again.
TEST_F(RunnerTest, EachReferenceIsReadOncePerCase) {
  const fs::path ref = fs::path(HEADGRAD_SOURCE_ROOT) / "configs" / "refs" / "mha_B2_T5_D12_H3_causal_float64";
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(ref)) files += e.path().extension() == ".npy" ? 1 : 0;
  ASSERT_EQ(files, 12u);
  fs::copy_file(kFixtures / "mask_B2_Tq5_Tk7.npy", dir_ / "mask.npy");
  const std::size_t before = case_files_read();
  const Suite s = suite_from("cases:\n"
                             "  - {name: ok, compare: [batched], reference: " + ref.string() + ", shape: {H: 3}, causal: true}\n"
                             "  - {name: bug, compare: [mutant_kv_swapped], reference: " + ref.string() +
                             ", shape: {H: 3}, causal: true, expect: {fail: true, diagnosis: kv_swapped}}\n"
                             "  - {name: masked, level: core, compare: [per_head, mutant_no_scale], mask: mask.npy, "
                             "shape: {B: 2, H: 3, Tq: 5, Tk: 7, d: 4}, expect: {fail: true, diagnosis: no_scale}}\n");
  EXPECT_EQ(case_files_read() - before, 2 * files + 1);  // two references, one mask file
  const SuiteResult r = run_suite(s, *registry_, {});
  EXPECT_EQ(case_files_read() - before, 2 * files + 1);  // no file read again
  ASSERT_EQ(r.cases.size(), 3u);
  EXPECT_EQ(r.cases[0].status, CaseStatus::pass) << r.cases[0].cause;
  EXPECT_EQ(r.cases[1].status, CaseStatus::xfail) << r.cases[1].cause;
  EXPECT_EQ(r.cases[2].status, CaseStatus::xfail) << r.cases[2].cause;
  ASSERT_TRUE(r.cases[2].localization);
  EXPECT_FALSE(r.cases[2].localization->rows.empty());  // re-run at other shapes, from the mask already read
}

// A reference given as one .npz file holding the same members as a directory
// (tests/runner/mha_B2_T3_D8_H2_causal.npz: configs/refs/mha_B2_T3_D8_H2_causal_float64's
// .npy files zipped, stored, as numpy.savez writes them).
TEST_F(RunnerTest, NpzReferenceChecksLikeItsDirectory) {
  fs::copy_file(kFixtures / "mha_B2_T3_D8_H2_causal.npz", dir_ / "case.npz");
  const std::string dir = (fs::path(HEADGRAD_SOURCE_ROOT) / "configs" / "refs" / "mha_B2_T3_D8_H2_causal_float64").string();
  const std::size_t before = case_files_read();
  const Suite s = suite_from("cases:\n"
                             "  - {name: npz, compare: [batched], reference: case.npz, shape: {H: 2}, causal: true}\n"
                             "  - {name: dir, compare: [batched], reference: " + dir + ", shape: {H: 2}, causal: true}\n"
                             "  - {name: bug, compare: [mutant_no_scale], reference: case.npz, shape: {H: 2}, causal: true}\n");
  EXPECT_EQ(case_files_read() - before, 1 + 12 + 1);  // an archive is one read
  EXPECT_EQ(s.cases[0].dims.B, 2);
  EXPECT_EQ(s.cases[0].dims.T, 3);
  EXPECT_EQ(s.cases[0].dims.D, 8);
  EXPECT_EQ(s.cases[0].check, s.cases[1].check);
  RunOptions keep;
  keep.keep_tensors = true;
  const CaseResult npz = run_case(s.cases[0], *registry_, keep), from_dir = run_case(s.cases[1], *registry_, keep);
  ASSERT_EQ(npz.status, CaseStatus::pass) << npz.cause;
  ASSERT_EQ(npz.tensors.size(), 6u);
  for (std::size_t i = 0; i < npz.tensors.size(); ++i) {
    EXPECT_EQ(npz.tensors[i].max_abs, from_dir.tensors[i].max_abs) << npz.tensors[i].name;
    EXPECT_EQ(npz.rhs[i].tensor.to_vector(), from_dir.rhs[i].tensor.to_vector()) << npz.tensors[i].name;
  }
  const CaseResult bad = run_case(s.cases[2], *registry_, {});
  EXPECT_EQ(bad.status, CaseStatus::fail);
  EXPECT_EQ(bad.rhs_label, "case.npz");
}

TEST_F(RunnerTest, NpzReferenceErrorsNameTheMember) {
  fs::copy_file(kFixtures / "mha_B2_T3_D8_H2_causal.npz", dir_ / "case.npz");
  EXPECT_EQ(load_error("cases:\n  - {name: r, compare: [per_head], reference: case.npz, shape: {H: 3}}\n"),
            (dir_ / "suite.yaml").string() + ":2:47: case 'r': case.npz member wq has shape [8, 8], expected [H*d, D] with H=3 "
                                                "and D=8 from member x [2, 3, 8]");
  EXPECT_EQ(load_error("cases:\n  - {name: r, level: core, compare: [per_head], reference: case.npz}\n"),
            (dir_ / "suite.yaml").string() + ":2:60: case 'r': reference file case.npz has no q member (a "
                                             "core-level reference needs q, k, v)");
  std::ofstream(dir_ / "broken.npz") << "not a zip archive";
  EXPECT_NE(load_error("cases:\n  - {name: r, compare: [per_head], reference: broken.npz, shape: {H: 2}}\n")
                .find("case 'r': reference file " + (dir_ / "broken.npz").string()),
            std::string::npos);
  EXPECT_NE(load_error("cases:\n  - {name: r, compare: [per_head], reference: none.npz, shape: {H: 2}}\n")
                .find("case 'r': reference file " + (dir_ / "none.npz").string() + " does not exist"),
            std::string::npos);
}

// Reference inputs a plugin could not be checked on: exit code 2 (a
// ConfigError), naming the file, never a plugin failure or a comparison.
TEST_F(RunnerTest, BadReferenceInputsNameTheFile) {
  Suite gen = suite_from("cases:\n  - {name: g, compare: [per_head, batched], shape: {B: 1, T: 2, D: 4, H: 2}}\n");
  write_reference(gen.cases[0], dir_ / "ref");
  const Tensor x = read_npy(dir_ / "ref" / "x.npy"), wq = read_npy(dir_ / "ref" / "wq.npy");
  const std::string yaml = "cases:\n  - name: r\n    compare: [per_head]\n    reference: ref\n    shape: {H: 2}\n";
  const std::string where = (dir_ / "suite.yaml").string() + ":4:16: case 'r': ";
  ASSERT_EQ(load_error(yaml), "(no error)");

  Tensor nan_x = x.clone();
  nan_x.set({0, 1, 2}, std::nan(""));
  write_npy(dir_ / "ref" / "x.npy", nan_x);
  EXPECT_EQ(load_error(yaml), where + "ref/x.npy holds NaN at [0, 1, 2]: reference inputs must be finite");
  write_npy(dir_ / "ref" / "x.npy", x);

  Tensor inf_wq = wq.clone();
  inf_wq.set({3, 0}, -INFINITY);
  write_npy(dir_ / "ref" / "wq.npy", inf_wq);
  EXPECT_EQ(load_error(yaml), where + "ref/wq.npy holds Inf at [3, 0]: reference inputs must be finite");
  write_npy(dir_ / "ref" / "wq.npy", wq);

  write_npy(dir_ / "ref" / "x.npy", Tensor::zeros({1, 0, 4}, DType::float64));
  EXPECT_EQ(load_error(yaml), where + "ref/x.npy has shape [1, 0, 4], a zero-size dim: an input needs elements");
  write_npy(dir_ / "ref" / "x.npy", x);
  ASSERT_EQ(load_error(yaml), "(no error)");

  // core level: a mask that is not bool
  fs::copy_file(kFixtures / "mask_B2_Tq5_Tk7.npy", dir_ / "mask.npy");
  Suite core = suite_from("cases:\n  - {name: g, level: core, compare: [per_head, batched], mask: mask.npy, "
                          "shape: {B: 2, H: 3, Tq: 5, Tk: 7, d: 4}}\n");
  write_reference(core.cases[0], dir_ / "core");
  const Tensor mask = read_npy(dir_ / "core" / "mask.npy");
  Tensor float_mask = Tensor::zeros(mask.shape(), DType::float64);
  float_mask.copy_(mask);
  write_npy(dir_ / "core" / "mask.npy", float_mask);
  try {
    suite_from("cases:\n  - {name: c, level: core, compare: [batched], reference: core}\n");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("case 'c': core/mask.npy must hold bools (True = attend), got float64"),
              std::string::npos)
        << e.what();
  }
}

// ---- each side gets its own copy of the inputs ----

// Writes into every input it is handed, then computes a correct attention on
// what it wrote: a plugin that corrupts its inputs in place.
class WritesIntoItsInputs final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "writes_into_its_inputs";
    i.capabilities.mha = true;
    return i;
  }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    for (const Variable* v : {&x, &w.wq, &w.wk, &w.wv, &w.wo}) {
      Tensor data = v->data();  // shares the storage
      data.fill_(0.5);
    }
    return batched_mha(x, w, spec, attention_core);
  }
};

TEST_F(RunnerTest, ASideThatWritesIntoItsInputsDoesNotReachTheOtherSide) {
  const Suite s = suite_from("cases:\n  - {name: c, compare: [per_head, batched], input_layout: sliced, causal: true, "
                             "shape: {B: 2, T: 3, D: 8, H: 2}}\n");
  const CaseSpec& c = s.cases[0];
  const CaseInputs in = make_inputs(c);
  const TensorSet before = input_tensors(in);  // copies of the values
  LoadedPlugin writer;
  writer.attention = std::make_shared<WritesIntoItsInputs>();
  writer.info = writer.attention->info();
  const LoadedPlugin& per_head = registry_->get("per_head");
  const TensorSet fresh = compute_side(c, make_inputs(c), *per_head.attention);
  for (const bool isolate : {false, true}) {
    ExecOptions exec;
    exec.isolate = isolate;
    const SideResult w = run_side(c, in, writer, exec);
    ASSERT_EQ(w.status, SideStatus::ok) << w.cause;
    // the shared inputs hold what they held ...
    for (const auto& [name, t] : input_tensors(in))
      EXPECT_EQ(t.to_vector(), find_tensor(before, name)->to_vector()) << name << (isolate ? " isolated" : "");
    // ... so the other side computes what it computes on fresh inputs
    const SideResult other = run_side(c, in, per_head, exec);
    ASSERT_EQ(other.status, SideStatus::ok) << other.cause;
    for (const auto& [name, t] : other.tensors)
      EXPECT_EQ(t.to_vector(), find_tensor(fresh, name)->to_vector()) << name << (isolate ? " isolated" : "");
  }
  // the writer's own result is attention on its 0.5-filled inputs, not on the case's
  const TensorSet written = compute_side(c, in, *writer.attention);
  EXPECT_NE(find_tensor(written, "out")->to_vector(), find_tensor(fresh, "out")->to_vector());
}

// ---- several runs in one child (run_sides: the oracle's golden and baseline) ----

// Crashes (a null store) on float64 inputs, sleeps past any limit on float16
// ones, throws on bfloat16 ones, and is a correct attention on float32.
class MisbehavesByDtype final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "misbehaves_by_dtype";
    i.capabilities.mha = true;
    return i;
  }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    if (x.dtype() == DType::float64) {
      volatile int* volatile p = nullptr;
      *p = 1;
    }
    if (x.dtype() == DType::float16) ::sleep(100);
    if (x.dtype() == DType::bfloat16) throw std::runtime_error("no bfloat16 here");
    return batched_mha(x, w, spec, attention_core);
  }
};

// out: every element the process id it ran in (exact in float32 and float64).
class SaysItsProcess final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "says_its_process";
    i.capabilities.mha = true;
    return i;
  }
  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const Variable out = batched_mha(x, w, spec, attention_core);
    return add(mul(out, Variable(Tensor::zeros(out.shape(), out.dtype()))),
               Variable(Tensor::full(out.shape(), static_cast<double>(::getpid()), out.dtype())));
  }
};

TEST_F(RunnerTest, RunsInOneChildGiveWhatEachGivesInItsOwn) {
  const Suite s = suite_from("cases:\n  - {name: c, compare: [per_head, batched], causal: true, dtype: float32, "
                             "shape: {B: 2, T: 5, D: 8, H: 2}}\n");
  CaseSpec c64 = s.cases[0], c32 = s.cases[0];
  c64.dtype = DType::float64;
  const CaseInputs in32 = make_inputs(c32), in64 = inputs_in_dtype(in32, DType::float64);
  const LoadedPlugin& per_head = registry_->get("per_head");
  const std::vector<SideResult> both = run_sides({{&c64, &in64}, {&c32, &in32}, {&c64, &in64}}, per_head, {});
  ASSERT_EQ(both.size(), 3u);
  const SideResult alone64 = run_side(c64, in64, per_head, {}), alone32 = run_side(c32, in32, per_head, {});
  // one child for the three runs, and not this process
  LoadedPlugin pid;
  pid.attention = std::make_shared<SaysItsProcess>();
  pid.info = pid.attention->info();
  const std::vector<SideResult> where = run_sides({{&c64, &in64}, {&c32, &in32}, {&c64, &in64}}, pid, {});
  ASSERT_EQ(where.size(), 3u);
  const double child = find_tensor(where[0].tensors, "out")->flat(0);
  EXPECT_NE(child, static_cast<double>(::getpid()));
  for (const SideResult& w : where) EXPECT_EQ(find_tensor(w.tensors, "out")->to_vector(), std::vector<double>(2 * 5 * 8, child)) << w.cause;
  for (std::size_t k = 0; k < 3; ++k) {
    ASSERT_EQ(both[k].status, SideStatus::ok) << both[k].cause;
    EXPECT_EQ(both[k].plugin, "per_head");
    EXPECT_GT(both[k].seconds, 0);
    EXPECT_GT(both[k].peak_rss_bytes, 0u);
    const SideResult& alone = k == 1 ? alone32 : alone64;
    ASSERT_EQ(both[k].tensors.size(), alone.tensors.size());
    for (std::size_t i = 0; i < alone.tensors.size(); ++i) {
      EXPECT_EQ(both[k].tensors[i].name, alone.tensors[i].name);
      EXPECT_EQ(both[k].tensors[i].tensor.dtype(), k == 1 ? DType::float32 : DType::float64);
      EXPECT_EQ(both[k].tensors[i].tensor.to_vector(), alone.tensors[i].tensor.to_vector()) << k << " " << alone.tensors[i].name;
    }
  }
}

// A run that throws leaves the child going on to the next run; one that
// crashes or hangs ends it, and the runs after it get a child of their own:
// each run's result is what it would be alone, each hang timed on its own.
TEST_F(RunnerTest, ARunAfterOneThatCrashedOrHungGetsAChildOfItsOwn) {
  const Suite s = suite_from("cases:\n  - {name: c, compare: [per_head, batched], causal: true, dtype: float32, "
                             "shape: {B: 1, T: 4, D: 8, H: 2}}\n");
  const CaseSpec& c = s.cases[0];
  const CaseInputs in32 = make_inputs(c);
  std::map<DType, CaseInputs> in;
  for (DType dt : {DType::float64, DType::float16, DType::bfloat16}) in[dt] = inputs_in_dtype(in32, dt);
  LoadedPlugin odd;
  odd.attention = std::make_shared<MisbehavesByDtype>();
  odd.info = odd.attention->info();
  const TensorSet correct = compute_side(c, in32, *odd.attention);
  ExecOptions exec;
  exec.timeout_s = 1;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<SideResult> r = run_sides({{&c, &in[DType::float64]}, {&c, &in32}, {&c, &in[DType::bfloat16]},
                                               {&c, &in32}, {&c, &in[DType::float16]}, {&c, &in32}},
                                              odd, exec);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.size(), 6u);
  EXPECT_EQ(r[0].status, SideStatus::crashed);
  EXPECT_EQ(r[0].cause, "plugin misbehaves_by_dtype crashed with SIGSEGV (segmentation fault)");
  EXPECT_EQ(r[2].status, SideStatus::threw);
  EXPECT_EQ(r[2].cause, "plugin misbehaves_by_dtype threw std::runtime_error: no bfloat16 here");
  EXPECT_EQ(r[4].status, SideStatus::timed_out);
  EXPECT_EQ(r[4].cause, "plugin misbehaves_by_dtype did not finish within 1 s; killed");
  EXPECT_GE(r[4].seconds, 1.0);
  EXPECT_LT(r[4].seconds, 3.0);
  EXPECT_LT(seconds, 6.0);  // one limit's wait, not one per run after the hang
  for (std::size_t k : {1u, 3u, 5u}) {
    ASSERT_EQ(r[k].status, SideStatus::ok) << k << ": " << r[k].cause;
    for (const auto& [name, t] : correct) EXPECT_EQ(find_tensor(r[k].tensors, name)->to_vector(), t.to_vector()) << k << " " << name;
  }
}

// ---- isolation: each misbehaving plugin fails its own case ----

TEST_F(RunnerTest, MisbehavingPluginsFailTheirCaseWithTheCauseNamed) {
  Suite s = load_suite(kFixtures / "misbehaving.yaml");
  RunOptions options;
  options.timeout_s = 0.5;
  const auto t0 = std::chrono::steady_clock::now();
  const SuiteResult r = run_suite(s, *registry_, options);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  std::map<std::string, const CaseResult*> by_name;
  for (const auto& c : r.cases) by_name[c.spec.name] = &c;
  ASSERT_EQ(by_name.size(), 8u);
  EXPECT_EQ(by_name["normal-first"]->status, CaseStatus::pass);
  EXPECT_EQ(by_name["normal-last"]->status, CaseStatus::pass);
  EXPECT_EQ(by_name["throws"]->status, CaseStatus::error);
  EXPECT_EQ(by_name["throws"]->cause, "plugin throws threw std::runtime_error: deliberate failure in mha_forward");
  EXPECT_EQ(by_name["throws-core"]->cause, "plugin throws threw std::runtime_error: deliberate failure in core_forward");
  EXPECT_EQ(by_name["segfaults"]->cause, "plugin segfaults crashed with SIGSEGV (segmentation fault)");
  EXPECT_EQ(by_name["aborts"]->cause, "plugin aborts crashed with SIGABRT (aborted)");
  EXPECT_EQ(by_name["hangs"]->status, CaseStatus::error);
  EXPECT_EQ(by_name["hangs"]->cause, "plugin hangs did not finish within 0.5 s; killed");
  EXPECT_EQ(by_name["returns-nan"]->status, CaseStatus::fail);  // a wrong result, not a crash
  EXPECT_EQ(by_name["returns-nan"]->cause, "plugin returns_nan returned NaN in out at [0, 1, 3] (b=0, t=1, head=0, ch=3)");
  EXPECT_EQ(by_name["segfaults"]->sides[0].status, SideStatus::crashed);
  EXPECT_EQ(by_name["segfaults"]->sides[1].status, SideStatus::ok);  // the other side still ran
  EXPECT_EQ(r.exit_code(), 3);
}

TEST_F(RunnerTest, WithoutIsolationExceptionsAreStillCaught) {
  Suite s = load_suite(kFixtures / "misbehaving.yaml");
  RunOptions options;
  options.isolate = false;
  for (const auto& c : s.cases) {
    if (c.name != "throws" && c.name != "returns-nan" && c.name != "normal-first") continue;
    const CaseResult r = run_case(c, *registry_, options);
    if (c.name == "throws") {
      EXPECT_EQ(r.cause, "plugin throws threw std::runtime_error: deliberate failure in mha_forward");
    } else if (c.name == "returns-nan") {
      EXPECT_EQ(r.status, CaseStatus::fail);
    } else {
      EXPECT_EQ(r.status, CaseStatus::pass);
    }
  }
}

TEST_F(RunnerTest, AMissingPluginFailsOnlyItsCases) {
  const SuiteResult r = run_suite(load_suite(kFixtures / "missing_plugin.yaml"), *registry_, {});
  ASSERT_EQ(r.cases.size(), 3u);  // the library runs what it can; `headgrad run` stops first (runner_cli)
  EXPECT_EQ(r.cases[0].status, CaseStatus::pass);
  EXPECT_EQ(r.cases[1].status, CaseStatus::error);
  EXPECT_EQ(r.cases[2].status, CaseStatus::error);
  EXPECT_EQ(r.cases[1].cause.rfind("plugin ghost_plugin is not loaded; loaded: ", 0), 0u) << r.cases[1].cause;
  EXPECT_EQ(r.exit_code(), 3);
  Suite typo = suite_from("cases:\n  - {name: t, compare: [per_haed, batched], shape: {B: 1, T: 1, D: 2, H: 1}}\n");
  EXPECT_NE(run_case(typo.cases[0], *registry_, {}).cause.find("(did you mean 'per_head'?)"), std::string::npos);
}

TEST_F(RunnerTest, FilterSelectsByNameOrBaseName) {
  const Suite s = load_suite(kFixtures / "pass.yaml");
  EXPECT_EQ(select_cases(s, "").size(), 7u);
  EXPECT_EQ(select_cases(s, "layouts").size(), 4u);  // the sweep's base name
  EXPECT_EQ(select_cases(s, "layouts[B=2,H=1]").size(), 1u);  // an exact name, brackets and all
  EXPECT_EQ(select_cases(s, "*core*").size(), 1u);
  EXPECT_EQ(select_cases(s, "nothing").size(), 0u);
}

TEST_F(RunnerTest, CapabilitiesAreCheckedAgainstLoadedPlugins) {
  auto error = [&](const std::string& yaml) -> std::string {
    const Suite s = suite_from(yaml);
    std::vector<const CaseSpec*> cases;
    for (const auto& c : s.cases) cases.push_back(&c);
    try {
      check_capabilities(cases, *registry_);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  };
  const std::string file = (dir_ / "suite.yaml").string();
  EXPECT_EQ(error("cases:\n  - name: c\n    compare: [limited, per_head]\n    causal: true\n"
                  "    shape: {B: 1, T: 2, D: 4, H: 2}\n"),
            file + ":3:14: case 'c': plugin 'limited' lacks the capability 'causal' (the case is causal); it "
                   "declares: mha, float64");
  EXPECT_NE(error("cases:\n  - {name: c, level: core, compare: [per_head, limited], shape: {B: 1, H: 1, Tq: 2, "
                  "Tk: 2, d: 2}}\n")
                .find("plugin 'limited' lacks the capability 'core' (the case is at core level)"),
            std::string::npos);
  EXPECT_NE(error("cases:\n  - {name: c, dtype: float32, compare: [limited, per_head], shape: {B: 1, T: 2, D: 4, "
                  "H: 2}}\n")
                .find("lacks the capability 'float32' (dtype: float32)"),
            std::string::npos);
  EXPECT_EQ(error("cases:\n  - {name: c, compare: [limited, per_head], shape: {B: 1, T: 2, D: 4, H: 2}}\n"),
            "(no error)");
  EXPECT_EQ(error("cases:\n  - {name: c, compare: [not_loaded, per_head], causal: true, shape: {B: 1, T: 2, D: 4, "
                  "H: 2}}\n"),
            "(no error)");  // the runner reports plugins that are not loaded
}

// Grouped kv heads: the seeded recipe makes [Hkv*d, D] key/value weights, the
// spec says so, and a reference written from such a case reads back.
TEST_F(RunnerTest, GroupedKvSeededCaseAndItsReference) {
  Suite gen = suite_from("cases:\n  - {name: g, compare: [per_head, batched], causal: true, seed: 5, "
                         "shape: {B: 2, T: 7, D: 24, H: 12, Hkv: 3, d: 10}}\n");
  const CaseSpec& c = gen.cases[0];
  const CaseInputs in = make_inputs(c);
  EXPECT_EQ(in.x.shape(), (Shape{2, 7, 24}));
  EXPECT_EQ(in.wq.shape(), (Shape{120, 24}));  // [H*d, D]
  EXPECT_EQ(in.wk.shape(), (Shape{30, 24}));   // [Hkv*d, D]
  EXPECT_EQ(in.wv.shape(), (Shape{30, 24}));
  EXPECT_EQ(in.wo.shape(), (Shape{24, 120}));  // [D, H*d]
  const AttentionSpec spec = attention_spec(c, in);
  EXPECT_EQ(spec.num_heads, 12);
  EXPECT_EQ(spec.num_kv_heads, 3);
  EXPECT_EQ(spec.head_width, 10);
  const CaseResult r = run_case(c, *registry_, {});
  EXPECT_EQ(r.status, CaseStatus::pass) << r.cause;

  write_reference(c, dir_ / "ref");
  const std::string where = (dir_ / "suite.yaml").string() + ":2:";
  Suite s = suite_from("cases:\n  - {name: r, compare: [batched], reference: ref, causal: true, shape: {H: 12}}\n");
  EXPECT_EQ(s.cases[0].dims.Hkv, 3);  // from wk [30, 24] over d = 120 / 12
  EXPECT_EQ(s.cases[0].dims.d, 10);
  EXPECT_EQ(describe_case(s.cases[0]), "MHA(B=2,T=7,D=24,H=12,Hkv=3,d=10,causal)");
  const CaseResult back = run_case(s.cases[0], *registry_, {});
  EXPECT_EQ(back.status, CaseStatus::pass) << back.cause;
  // a case that says another Hkv than the files is refused, naming both
  EXPECT_NE(load_error("cases:\n  - {name: r, compare: [batched], reference: ref, shape: {H: 12, Hkv: 4}}\n")
                .find("shape gives Hkv=4 but wk.npy [30, 24] has Hkv=3"),
            std::string::npos);
  // wv with H heads where wk has Hkv: its shape is named against wk's
  write_npy(dir_ / "ref" / "wv.npy", Tensor::zeros({120, 24}, DType::float64));
  EXPECT_NE(load_error("cases:\n  - {name: r, compare: [batched], reference: ref, shape: {H: 12}}\n")
                .find("ref/wv.npy has shape [120, 24], expected [30, 24] (wk.npy is [30, 24])"),
            std::string::npos);
}

// The committed PyTorch references (computed apart from headgrad) at GQA, MQA and
// the CS336 core layout ([B, T, d], no head axis) pass through per_head.
TEST_F(RunnerTest, CommittedGroupedKvReferencesPass) {
  const fs::path refs = fs::path(HEADGRAD_SOURCE_ROOT) / "configs" / "refs";
  const std::string yaml =
      "cases:\n"
      "  - {name: gqa, compare: [per_head], reference: " + (refs / "mha_B2_T7_D8_H12_Hkv3_d4_causal_float64").string() +
      ", causal: true, shape: {H: 12}}\n"
      "  - {name: mqa, compare: [per_head], reference: " + (refs / "mha_B2_T5_D16_H4_Hkv1_causal_float32").string() +
      ", causal: true, shape: {H: 4}, atol: 1.0e-5, rtol: 1.0e-4}\n"
      "  - {name: core, level: core, compare: [per_head], reference: " +
      (refs / "core_B2_H12_Hkv3_Tq5_Tk7_d4_causal_float64").string() + "}\n"
      "  - {name: cs336, level: core, compare: [per_head], reference: " +
      (refs / "core_cs336_B2_T9_d16_causal_float64").string() + "}\n";
  Suite s = suite_from(yaml);
  ASSERT_EQ(s.cases.size(), 4u);
  EXPECT_EQ(describe_case(s.cases[0]), "MHA(B=2,T=7,D=8,H=12,Hkv=3,d=4,causal)");
  EXPECT_EQ(describe_case(s.cases[1]), "MHA(B=2,T=5,D=16,H=4,Hkv=1,causal,float32)");
  EXPECT_EQ(describe_case(s.cases[2]), "CORE(B=2,H=12,Hkv=3,Tq=5,Tk=7,d=4,mask)");
  EXPECT_EQ(describe_case(s.cases[3]), "CORE(B=2,H=1,Tq=9,Tk=9,d=16,mask)");
  const CaseInputs cs = make_inputs(s.cases[3]);
  EXPECT_EQ(cs.q.shape(), (Shape{2, 9, 16}));  // read as it is
  for (const CaseSpec& c : s.cases) {
    const CaseResult r = run_case(c, *registry_, {});
    EXPECT_EQ(r.status, CaseStatus::pass) << c.name << ": " << r.cause;
    EXPECT_EQ(r.tensors.size(), c.level == Level::mha ? 6u : 4u) << c.name;
  }
}

}  // namespace

namespace {

// An int64 .npy as numpy writes it ('<i8', version 1.0): write_npy has no integer dtype.
void write_int64_npy(const fs::path& file, const std::vector<std::int64_t>& values, const Shape& shape) {
  std::string dims;
  for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";
  std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream f(file, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const auto len = static_cast<std::uint16_t>(header.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f << header;
  f.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * 8));
}

}  // namespace

TEST_F(RunnerTest, RopeCaseRotatesQAndKOnBothSides) {
  const std::string shape = "shape: {B: 2, T: 5, D: 8, H: 2}, causal: true, seed: 4";
  Suite s = suite_from("cases:\n  - {name: r, compare: [per_head, batched], " + shape +
                       ", rope: {style: half, rotary_dim: 2, positions: {generator: gapped, start: 1000}}}\n"
                       "  - {name: plain, compare: [per_head, batched], " + shape + "}\n");
  const CaseInputs in = make_inputs(s.cases[0]);
  const AttentionSpec spec = attention_spec(s.cases[0], in);
  EXPECT_TRUE(spec.rope.enabled);
  EXPECT_EQ(spec.rope.style, RopeStyle::half);
  EXPECT_EQ(spec.rope.rotary_dim, 2);
  ASSERT_EQ(spec.rope.positions.shape(), (Shape{2, 5}));
  EXPECT_EQ(spec.rope.positions.to_vector(), (std::vector<double>{0, 1, 3, 6, 7, 1000, 1001, 1003, 1006, 1007}));
  EXPECT_FALSE(attention_spec(s.cases[1], make_inputs(s.cases[1])).rope.enabled);

  const CaseResult ok = run_case(s.cases[0], *registry_, {});
  EXPECT_EQ(ok.status, CaseStatus::pass) << ok.cause;
  // the rotation reached the plugin: same inputs without rope give another out
  const Tensor rotated = compute_side(s.cases[0], in, *registry_->get("per_head").attention)[0].tensor;
  const Tensor plain = compute_side(s.cases[1], make_inputs(s.cases[1]), *registry_->get("per_head").attention)[0].tensor;
  const std::vector<double> a = rotated.to_vector(), b = plain.to_vector();
  double biggest = 0;
  for (std::size_t i = 0; i < a.size(); ++i) biggest = std::max(biggest, std::abs(a[i] - b[i]));
  EXPECT_GT(biggest, 1e-3);
}

TEST_F(RunnerTest, RopeReferenceReadsInt64Positions) {
  const std::string rope = "rope: {theta: 500000, style: half, rotary_dim: 4, positions: [[0, 2, 5, 9], [1000, 1001, 1007, 1012]]}";
  Suite gen = suite_from("cases:\n  - {name: g, compare: [per_head, batched], causal: true, seed: 2, "
                         "shape: {B: 2, T: 4, D: 12, H: 2}, " + rope + "}\n");
  write_reference(gen.cases[0], dir_ / "ref");
  const std::vector<std::int64_t> positions = {0, 2, 5, 9, 1000, 1001, 1007, 1012};
  write_int64_npy(dir_ / "ref" / "positions.npy", positions, {2, 4});
  const std::string yaml = "cases:\n  - {name: vs-ref, compare: [batched], reference: ref, causal: true, shape: {H: 2}, "
                           "rope: {theta: 500000, style: half, rotary_dim: 4}}\n";
  Suite s = suite_from(yaml);
  ASSERT_TRUE(s.cases[0].files->positions.defined());
  EXPECT_EQ(s.cases[0].files->positions.to_vector(), (std::vector<double>{0, 2, 5, 9, 1000, 1001, 1007, 1012}));
  const CaseResult ok = run_case(s.cases[0], *registry_, {});
  EXPECT_EQ(ok.status, CaseStatus::pass) << ok.cause;

  // the other pairing does not match the reference
  Suite other = suite_from("cases:\n  - {name: vs-ref, compare: [batched], reference: ref, causal: true, shape: {H: 2}, "
                           "rope: {theta: 500000, style: interleaved, rotary_dim: 4}}\n");
  EXPECT_EQ(run_case(other.cases[0], *registry_, {}).status, CaseStatus::fail);

  // positions of the wrong length name the file and both shapes
  write_int64_npy(dir_ / "ref" / "positions.npy", {0, 1, 2}, {3});
  const std::string e = load_error(yaml);
  EXPECT_NE(e.find("positions.npy has shape [3], expected [T] = [4] or [B, T] = [2, 4]"), std::string::npos) << e;
}

// level: rope against a reference directory of x [B, T, d] (CS336's run_rope
// layout) with int64 positions; the other pairing or a shifted position fails.
TEST_F(RunnerTest, RopeLevelChecksAReferenceWithAnyLeadingDims) {
  Suite gen = suite_from("cases:\n  - {name: g, level: rope, compare: [per_head, batched], seed: 5, shape: {B: 2, T: 4, d: 8}, "
                         "rope: {style: half, positions: [[0, 3, 4, 9], [1000, 1002, 1003, 1010]]}}\n");
  EXPECT_EQ(describe_case(gen.cases[0]), "ROPE(B=2,T=4,d=8,rope=half,positions[B,T])");
  const CaseResult pair = run_case(gen.cases[0], *registry_, {});
  EXPECT_EQ(pair.status, CaseStatus::pass) << pair.cause;
  ASSERT_EQ(pair.tensors.size(), 2u);
  EXPECT_EQ(pair.tensors[1].name, "dx");
  write_reference(gen.cases[0], dir_ / "ref");
  write_int64_npy(dir_ / "ref" / "positions.npy", {0, 3, 4, 9, 1000, 1002, 1003, 1010}, {2, 4});
  EXPECT_EQ(read_npy(dir_ / "ref" / "x.npy").shape(), (Shape{2, 4, 8}));

  auto vs_ref = [&](const std::string& rope) {
    return suite_from("cases:\n  - {name: vs-ref, level: rope, compare: [batched], reference: ref, rope: " + rope + "}\n");
  };
  Suite s = vs_ref("{style: half}");
  EXPECT_EQ(s.cases[0].dims.T, 4);
  EXPECT_EQ(s.cases[0].dims.d, 8);
  const CaseResult ok = run_case(s.cases[0], *registry_, {});
  EXPECT_EQ(ok.status, CaseStatus::pass) << ok.cause;
  EXPECT_EQ(run_case(vs_ref("{style: interleaved}").cases[0], *registry_, {}).status, CaseStatus::fail);
  // one position moved by one: out and dx of that token differ
  write_int64_npy(dir_ / "ref" / "positions.npy", {0, 3, 4, 9, 1000, 1002, 1004, 1010}, {2, 4});
  const CaseResult moved = run_case(vs_ref("{style: half}").cases[0], *registry_, {});
  EXPECT_EQ(moved.status, CaseStatus::fail);
  EXPECT_EQ(moved.cause, "2 of 2 tensors differ: out, dx");

  EXPECT_NE(load_error("cases:\n  - {name: r, level: rope, compare: [per_head, batched], shape: {B: 1, T: 2, d: 4}}\n")
                .find("'level: rope' needs a 'rope:' block"),
            std::string::npos);
  EXPECT_NE(load_error("cases:\n  - {name: r, level: rope, compare: [per_head, batched], shape: {B: 1, T: 2, d: 4}, "
                       "rope: {rotary_dim: 6}}\n")
                .find("'rotary_dim' 6 is wider than the head width d=4"),
            std::string::npos);
}

// taps: q and k after the rotation. A uniform shift of every position (here:
// the reference's positions.npy moved by +7 against the positions the
// reference was made with) leaves out and every gradient equal; only the
// taps differ.
TEST_F(RunnerTest, TapsSeeAUniformPositionShiftThatNothingElseSees) {
  const std::string rope = "rope: {style: half, rotary_dim: 4, positions: [[0, 2, 5, 9, 10], [1000, 1001, 1007, 1012, 1013]]}";
  Suite gen = suite_from("cases:\n  - {name: g, compare: [per_head, batched], causal: true, seed: 6, "
                         "shape: {B: 2, T: 5, D: 12, H: 2}, taps: [q_rot, k_rot], " + rope + "}\n");
  EXPECT_EQ(gen.cases[0].check, (std::vector<std::string>{"out", "dx", "dwq", "dwk", "dwv", "dwo", "q_rot", "k_rot"}));
  // per_head rotates one head at a time, batched all at once: the taps agree
  const CaseResult pair = run_case(gen.cases[0], *registry_, {});
  EXPECT_EQ(pair.status, CaseStatus::pass) << pair.cause;
  ASSERT_EQ(pair.tensors.size(), 8u);
  EXPECT_EQ(pair.tensors[6].name, "q_rot");
  // q_rot is the engine's rotation of x Wq^T split into heads
  const CaseInputs in = make_inputs(gen.cases[0]);
  const TensorSet side = compute_side(gen.cases[0], in, *registry_->get("per_head").attention);
  const Tensor* q_rot = find_tensor(side, "q_rot");
  ASSERT_TRUE(q_rot && q_rot->defined());
  EXPECT_EQ(q_rot->shape(), (Shape{2, 2, 5, 6}));
  const Tensor want = headgrad::rope(split_heads(linear(Variable(in.x), Variable(in.wq)), 2),
                           attention_spec(gen.cases[0], in).rope).data();
  const std::vector<double> a = q_rot->to_vector(), b = want.to_vector();
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-12) << i;

  write_reference(gen.cases[0], dir_ / "ref");
  ASSERT_TRUE(fs::exists(dir_ / "ref" / "k_rot.npy"));
  write_int64_npy(dir_ / "ref" / "positions.npy", {7, 9, 12, 16, 17, 1007, 1008, 1014, 1019, 1020}, {2, 5});
  Suite shifted = suite_from("cases:\n  - {name: s, compare: [batched], reference: ref, causal: true, shape: {H: 2}, "
                             "taps: [q_rot, k_rot], rope: {style: half, rotary_dim: 4}}\n");
  const CaseResult r = run_case(shifted.cases[0], *registry_, {});
  EXPECT_EQ(r.status, CaseStatus::fail);
  EXPECT_EQ(r.cause, "2 of 8 tensors differ: q_rot, k_rot");
  for (std::size_t i = 0; i < 6; ++i) EXPECT_TRUE(r.tensors[i].allclose) << r.tensors[i].name;

  EXPECT_NE(load_error("cases:\n  - {name: t, compare: [per_head, batched], shape: {B: 1, T: 2, D: 4, H: 2}, taps: [q_rot]}\n")
                .find("'taps' needs a 'rope:' block"),
            std::string::npos);
  EXPECT_NE(load_error("cases:\n  - {name: t, compare: [per_head, batched], shape: {B: 1, T: 2, D: 4, H: 2}, taps: [q_rto], "
                       "rope: {}}\n")
                .find("(did you mean 'q_rot'?)"),
            std::string::npos);
}

}  // namespace test_runner_run
