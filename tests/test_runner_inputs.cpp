// What a run reads, attacked as a hostile user would (docs/design.md, Reference directories):
// a golden/ that disagrees with its reference, outputs that would overwrite
// an input, reference files that are not files, .npz members inflated for
// nothing, settings that escaped validation, new-plugin's names and folders.
// Each test failed before the fix it covers.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <tuple>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <headgrad/npy.hpp>

#include "checks.hpp"
#include "headgrad_cli.hpp"
#include "job/run_suite.hpp"
#include "real_plugins.hpp"
#include "case/inputs.hpp"
#include "judge/golden.hpp"

namespace test_runner_inputs {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;

// A run's peak memory bound in the member tests: 64 MiB (a run holds about
// 10); ASan's shadow memory and quarantine add over 100 MiB, so there 512 MiB,
// still half the 1 GiB member that an eager read would inflate.
constexpr long kChildBoundKib = headgrad::test::under_asan ? 512 * 1024 : 64 * 1024;

namespace {

using namespace headgrad;
using namespace headgrad::runner;
using headgrad::test::headgrad;
using headgrad::test::Outcome;
using headgrad::test::slurp;

const fs::path kRefs = fs::path(HEADGRAD_SOURCE_ROOT) / "configs" / "refs";
const fs::path kFixtures = RUNNER_FIXTURES;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class Inputs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("headgrad_inputs_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // configs/refs/NAME copied to dir_/TO
  fs::path copy_ref(const std::string& name, const std::string& to = "ref") {
    fs::copy(kRefs / name, dir_ / to, fs::copy_options::recursive);
    return dir_ / to;
  }
  fs::path suite(const std::string& yaml, const std::string& file = "s.yaml") {
    std::ofstream(dir_ / file) << yaml;
    return dir_ / file;
  }
  Outcome run(const std::vector<std::string>& extra = {}, const std::string& file = "s.yaml") {
    std::vector<std::string> args = {"run", (dir_ / file).string(), "-q"};
    args.insert(args.end(), extra.begin(), extra.end());
    return headgrad(args, dir_);
  }
  // ref/: per_head's tensors for pass.yaml's case NAME, written by export.
  void export_case(const std::string& name, const fs::path& out) {
    const Outcome ex = headgrad({"export", (kFixtures / "pass.yaml").string(), "--case", name, "--out", out.string()});
    ASSERT_EQ(ex.code, 0) << ex.out << ex.err;
  }
  fs::path dir_;
};

// The file's values mapped by f, written back in its own dtype.
void rewrite(const fs::path& file, const std::function<double(double, std::size_t)>& f) {
  const Tensor t = read_npy(file);
  std::vector<double> v = t.to_vector();
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = f(v[i], i);
  write_npy(file, Tensor::from_values(v, t.shape(), t.dtype()));
}

// ---------------------------------------------------------------- item 1: golden/

const char* kFloat16Case =
    "cases:\n  - {name: h, compare: [per_head], reference: ref, shape: {H: 4}, causal: true, dtype: float16}\n";

TEST_F(Inputs, GoldenFolderMustAgreeWithItsOwnReference) {
  const fs::path ref = copy_ref("mha_B2_T8_D16_H4_causal_float16");
  suite(kFloat16Case);
  Outcome r = run();
  ASSERT_EQ(r.code, 0) << r.out << r.err;  // the committed golden/ is the same function in float64

  const fs::path golden = ref / "golden" / "out.npy", saved = dir_ / "golden_out.npy";
  fs::copy_file(golden, saved);
  const std::vector<std::pair<std::string, std::function<double(double, std::size_t)>>> attacks = {
      {"zeroed", [](double, std::size_t) { return 0.0; }},
      {"scaled by 10", [](double v, std::size_t) { return 10 * v; }},
      {"negated", [](double v, std::size_t) { return -v; }},
  };
  for (const auto& [what, f] : attacks) {
    rewrite(golden, f);
    r = run();
    EXPECT_EQ(r.code, 2) << what << ": " << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "s.yaml:2:47: case 'h': ref/golden/out.npy disagrees with ref/out.npy")) << what << r.err;
    fs::copy_file(saved, golden, fs::copy_options::overwrite_existing);
  }
  // golden/out.npy holding dx's golden: same shape, another tensor
  fs::copy_file(ref / "golden" / "dx.npy", golden, fs::copy_options::overwrite_existing);
  r = run();
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "ref/golden/out.npy disagrees with ref/out.npy")) << r.err;
  fs::copy_file(saved, golden, fs::copy_options::overwrite_existing);

  // one +Inf in an expected file of the dtype
  rewrite(ref / "dwq.npy", [](double v, std::size_t i) { return i == 5 ? std::numeric_limits<double>::infinity() : v; });
  r = run();
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "ref/dwq.npy holds Inf at [0, 5]: expected tensors must be finite")) << r.err;
}

TEST_F(Inputs, Float32GoldenIsCheckedToo) {
  const fs::path ref = copy_ref("mha_B2_T6_D16_H4_causal_float32");
  suite("cases:\n  - {name: f, compare: [per_head], reference: ref, shape: {H: 4}, causal: true}\n");
  ASSERT_EQ(run().code, 0);
  // 1 + 1e-4: far inside float16's rounding, far outside float32's
  rewrite(ref / "golden" / "dwk.npy", [](double v, std::size_t) { return v * (1 + 1e-4); });
  const Outcome r = run();
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "ref/golden/dwk.npy disagrees with ref/dwk.npy")) << r.err;
  EXPECT_TRUE(contains(r.err, "float32's epsilon")) << r.err;
}

// ---------------------------------------------------------------- no golden without per_head

class GoldenWithoutPerHead : public Inputs {
 protected:
  static void SetUpTestSuite() {
    registry_ = new PluginRegistry();
    for (const auto& file : headgrad::test::real_plugin_files())
      if (!contains(file.filename().string(), "per_head")) registry_->load_file(file);
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }
  static inline PluginRegistry* registry_ = nullptr;
};

TEST_F(GoldenWithoutPerHead, IsRefusedNamingWhatIsMissing) {
  ASSERT_TRUE(registry_->find("batched") && registry_->find("fused_sdpa") && !registry_->find("per_head"));
  suite("cases:\n  - {name: f32, compare: [batched, fused_sdpa], dtype: float32, shape: {B: 2, T: 5, D: 8, H: 2}}\n");
  const Suite s = load_suite(dir_ / "s.yaml");
  std::vector<const CaseSpec*> cases = {&s.cases[0]};
  try {
    check_goldens(cases, *registry_);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_TRUE(contains(e.what(), "s.yaml:2:5: case 'f32' (float32, judged relative_to_baseline) has no golden: "
                                   "the oracle per_head is not loaded"))
        << e.what();
  }
  // run without the check: the case is an error, not judged by batched's own float64 run
  const SuiteResult r = run_suite(s, *registry_, {});
  ASSERT_EQ(r.cases.size(), 1u);
  EXPECT_EQ(r.cases[0].status, CaseStatus::error) << r.cases[0].cause;
  EXPECT_TRUE(contains(r.cases[0].cause, "per_head is not loaded")) << r.cases[0].cause;

  // a reference with its own golden/ needs no oracle
  fs::copy(kRefs / "mha_B2_T6_D16_H4_causal_float32", dir_ / "ref", fs::copy_options::recursive);
  suite("cases:\n  - {name: g, compare: [batched], reference: ref, shape: {H: 4}, causal: true}\n", "g.yaml");
  const Suite g = load_suite(dir_ / "g.yaml");
  cases = {&g.cases[0]};
  EXPECT_NO_THROW(check_goldens(cases, *registry_));
  const SuiteResult rg = run_suite(g, *registry_, {});
  EXPECT_EQ(rg.cases[0].status, CaseStatus::pass) << rg.cases[0].cause;
  // without golden/, the reference alone is no golden either
  fs::remove_all(dir_ / "ref" / "golden");
  const Suite n = load_suite(dir_ / "g.yaml");
  cases = {&n.cases[0]};
  EXPECT_THROW(check_goldens(cases, *registry_), ConfigError);
  // allclose needs no golden
  suite("cases:\n  - {name: a, compare: [batched, fused_sdpa], dtype: float32, tolerance: {rule: allclose}, "
        "shape: {B: 2, T: 5, D: 8, H: 2}}\n", "a.yaml");
  const Suite a = load_suite(dir_ / "a.yaml");
  cases = {&a.cases[0]};
  EXPECT_NO_THROW(check_goldens(cases, *registry_));
}

// ---------------------------------------------------------------- item 3: outputs

TEST_F(Inputs, NoOutputMayOverwriteWhatTheRunReads) {
  ASSERT_NO_FATAL_FAILURE(export_case("closed-book", dir_ / "ref"));
  fs::create_directories(dir_ / "ref" / "golden");  // a float64 golden equal to the files: it agrees
  for (const char* t : {"out", "dx", "dwq", "dwk", "dwv", "dwo"})
    fs::copy_file(dir_ / "ref" / (std::string(t) + ".npy"), dir_ / "ref" / "golden" / (std::string(t) + ".npy"));
  suite("cases:\n  - {name: r, compare: [per_head], reference: ref, shape: {H: 2}, causal: true}\n");
  fs::copy_file(kFixtures / "mha_B2_T3_D8_H2_causal.npz", dir_ / "ref.npz");
  suite("cases:\n  - {name: z, compare: [per_head], reference: ref.npz, shape: {H: 2}, causal: true}\n", "z.yaml");
  fs::create_directory_symlink(dir_ / "ref", dir_ / "link");
  const std::string golden = slurp(dir_ / "ref" / "golden" / "out.npy"), npz = slurp(dir_ / "ref.npz");

  struct Attack {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Attack> attacks = {
      {{"run", "z.yaml", "--json", "ref.npz"}, "--json ref.npz: is the reference file of case 'z'"},
      {{"run", "s.yaml", "--html", "ref/golden/out.npy"}, "--html ref/golden/out.npy: lies inside the reference directory of case 'r'"},
      {{"run", "s.yaml", "--junit", "./ref/../ref/golden/../x.npy"}, "lies inside the reference directory of case 'r'"},
      {{"run", "s.yaml", "--json", "link/golden/out.npy"}, "lies inside the reference directory of case 'r'"},
      {{"run", "s.yaml", "--json", "ref/new.json"}, "lies inside the reference directory of case 'r'"},
      {{"export", "s.yaml", "--case", "r", "--out", "ref/golden"}, "--out ref/golden: lies inside the reference directory"},
      {{"export", "s.yaml", "--case", "r", "--out", "link"}, "--out link: is the reference directory of case 'r'"},
      {{"export", "s.yaml", "--case", "r", "--out", "ref/sub"}, "lies inside the reference directory"},
  };
  for (const auto& a : attacks) {
    const Outcome r = headgrad(a.args, dir_);
    EXPECT_EQ(r.code, 2) << a.args[3] << ": " << r.out << r.err;
    EXPECT_TRUE(contains(r.err, a.says)) << r.err;
  }
  EXPECT_EQ(slurp(dir_ / "ref" / "golden" / "out.npy"), golden);
  EXPECT_EQ(slurp(dir_ / "ref.npz"), npz);
  EXPECT_FALSE(fs::exists(dir_ / "ref" / "sub"));
  EXPECT_FALSE(fs::exists(dir_ / "ref" / "new.json"));
  // beside the reference is fine
  const Outcome ok = headgrad({"run", "s.yaml", "-q", "--json", "r.json"}, dir_);
  EXPECT_EQ(ok.code, 0) << ok.err;
}

// ---------------------------------------------------------------- item 6: reference files

TEST_F(Inputs, ReferenceFileThatIsNoFileIsAnErrorNamingIt) {
  ASSERT_NO_FATAL_FAILURE(export_case("closed-book", dir_ / "ref"));
  suite("cases:\n  - {name: r, compare: [per_head], reference: ref, shape: {H: 2}, causal: true}\n");
  ASSERT_EQ(run().code, 0);
  const fs::path r_npy = dir_ / "ref" / "r.npy";
  fs::rename(r_npy, dir_ / "r_saved.npy");

  fs::create_symlink(dir_ / "nowhere.npy", r_npy);
  Outcome r = run();
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "case 'r': ref/r.npy is a dangling symlink")) << r.err;
  fs::remove(r_npy);

  fs::create_directory(r_npy);
  r = run();
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "case 'r': ref/r.npy is a folder, not a file")) << r.err;
  fs::remove(r_npy);

  ASSERT_EQ(::mkfifo(r_npy.c_str(), 0644), 0);
  r = run();  // never opened: it would block
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "case 'r': ref/r.npy is not a regular file (a fifo, device or socket)")) << r.err;
  fs::remove(r_npy);
  fs::rename(dir_ / "r_saved.npy", r_npy);

  // golden/ itself as a dangling symlink
  fs::create_symlink(dir_ / "no_golden", dir_ / "ref" / "golden");
  r = run();
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "ref/golden is a dangling symlink")) << r.err;
  fs::remove(dir_ / "ref" / "golden");
  EXPECT_EQ(run().code, 0);
}

TEST_F(Inputs, MaskAndPositionsThatAreNoFiles) {
  ASSERT_NO_FATAL_FAILURE(export_case("core-mask", dir_ / "ref"));
  ASSERT_TRUE(fs::exists(dir_ / "ref" / "mask.npy"));
  suite("cases:\n  - {name: c, level: core, compare: [per_head], reference: ref}\n");
  ASSERT_EQ(run().code, 0);
  fs::remove(dir_ / "ref" / "mask.npy");
  ASSERT_EQ(::mkfifo((dir_ / "ref" / "mask.npy").c_str(), 0644), 0);
  Outcome r = run();
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "ref/mask.npy is not a regular file")) << r.err;

  // a suite's own mask file: a folder there, or more elements than [B, H, Tq, Tk]
  fs::create_directory(dir_ / "m.npy");
  suite("cases:\n  - {name: m, level: core, compare: [per_head, batched], mask: m.npy, "
        "shape: {B: 2, H: 1, Tq: 3, Tk: 4, d: 4}}\n", "m.yaml");
  r = run({}, "m.yaml");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "m.npy is a folder, not a file; a mask is a regular .npy file of bools")) << r.err;
  fs::remove(dir_ / "m.npy");
  write_npy(dir_ / "m.npy", Tensor::full({1000, 4}, 1.0, DType::boolean));
  r = run({}, "m.yaml");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "m.npy: shape (1000, 4) of '|b1' is 4000 bytes of data, more than "
                              "the 24 it may hold here")) << r.err;

  copy_ref("rope_B2_T9_d16_half_float64", "rope");
  fs::remove(dir_ / "rope" / "positions.npy");
  fs::create_directory(dir_ / "rope" / "positions.npy");
  suite("cases:\n  - {name: p, level: rope, compare: [per_head], reference: rope, "
        "rope: {theta: 500000.0, style: half, rotary_dim: 16}}\n", "p.yaml");
  r = run({}, "p.yaml");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "rope/positions.npy is a folder")) << r.err;
}

TEST_F(Inputs, CaseDtypeThatDisagreesWithTheFilesIsRefused) {
  ASSERT_NO_FATAL_FAILURE(export_case("closed-book", dir_ / "ref"));  // float64 files
  suite("cases:\n  - {name: r, compare: [per_head], reference: ref, shape: {H: 2}, causal: true, dtype: float32}\n");
  Outcome r = run();
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "s.yaml:2:88: case 'r': 'dtype: float32' but the files of ref are float64")) << r.err;
  // bfloat16 travels as float32 files: that pairing stays allowed
  copy_ref("mha_B2_T8_D16_H4_causal_bfloat16", "bf");
  suite("cases:\n  - {name: b, compare: [per_head], reference: bf, shape: {H: 4}, causal: true, dtype: bfloat16}\n",
        "b.yaml");
  r = headgrad({"run", "b.yaml"}, dir_);  // not -q: the warning shows
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  // k on a reference whose files turn out float64: judged by allclose, so k does not apply
  suite("cases:\n  - {name: k, compare: [per_head], reference: ref, shape: {H: 2}, causal: true, "
        "tolerance: {k: {out: 4}}}\n", "k.yaml");
  r = run({}, "k.yaml");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "k.yaml:2:93: case 'k': 'tolerance: k' is the factor of relative_to_baseline, and this "
                              "reference's files are float64")) << r.err;
  // and so does a dtype from the defaults (one default for many cases)
  suite("defaults: {dtype: float32}\ncases:\n  - {name: d, compare: [per_head], reference: ref, shape: {H: 2}, "
        "causal: true}\n", "d.yaml");
  r = run({}, "d.yaml");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

TEST_F(Inputs, TapsWithTheWrongHeadCountAreABadReference) {
  const fs::path ref = copy_ref("mha_B2_T7_D8_H6_Hkv3_d4_causal_rope_half_float64");
  suite("cases:\n  - {name: t, compare: [per_head], reference: ref, shape: {H: 6, Hkv: 3, d: 4}, causal: true,\n"
        "     rope: {theta: 500000.0, style: half, rotary_dim: 4}, taps: [q_rot, k_rot]}\n");
  ASSERT_EQ(run().code, 0);
  // q_rot with the kv heads' count, k_rot with the query heads'
  fs::copy_file(ref / "k_rot.npy", ref / "q_rot.npy", fs::copy_options::overwrite_existing);
  Outcome r = run();
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "ref/q_rot.npy has shape [2, 3, 7, 4], expected [2, 6, 7, 4] ([B, H, T, d] with B=2, H=6"))
      << r.err;
}

// ---------------------------------------------------------------- item 4 and 6: .npz members

// An .npz of `dir`'s .npy files (deflated), plus `extra` members {name, bytes, method}.
void zip_up(const fs::path& dir, const fs::path& npz,
            const std::vector<std::tuple<std::string, std::string, int>>& extra = {}) {
  int err = 0;
  zip_t* z = zip_open(npz.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  ASSERT_NE(z, nullptr);
  auto add = [&](const std::string& name, zip_source_t* src, int method) {
    ASSERT_NE(src, nullptr);
    const zip_int64_t i = zip_file_add(z, name.c_str(), src, 0);
    ASSERT_GE(i, 0) << zip_strerror(z);
    ASSERT_EQ(zip_set_file_compression(z, static_cast<zip_uint64_t>(i), method, 1), 0) << zip_strerror(z);
  };
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".npy")
      add(entry.path().filename().string(), zip_source_file(z, entry.path().c_str(), 0, -1), ZIP_CM_DEFLATE);
  std::vector<std::string> keep;  // libzip reads the buffers at zip_close
  keep.reserve(extra.size());
  for (const auto& [name, bytes, method] : extra) {
    keep.push_back(bytes);
    add(name, zip_source_buffer(z, keep.back().data(), keep.back().size(), 0), method);
  }
  ASSERT_EQ(zip_close(z), 0);
}

// An .npy image of `n` float64 zeros.
std::string zeros_npy(std::int64_t n) {
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (" + std::to_string(n) + ",), }";
  header.resize(118, ' ');
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + std::string(static_cast<std::size_t>(n) * 8, '\0');
}

long peak_child_kib() {
  rusage u{};
  ::getrusage(RUSAGE_CHILDREN, &u);
  return u.ru_maxrss;
}

TEST_F(Inputs, NpzMembersAreReadOnlyWhenTheCaseUsesThem) {
  const fs::path ref = copy_ref("rope_B2_T9_d16_half_float64");  // positions.npy is int64
  const std::string rope_case = "level: rope, compare: [per_head], rope: {theta: 500000.0, style: half, rotary_dim: 16}";
  // int64 positions as a member: read where integers are expected
  zip_up(ref, dir_ / "p.npz");
  suite("cases:\n  - {name: p, reference: p.npz, " + rope_case + "}\n", "p.yaml");
  Outcome r = run({}, "p.yaml");
  EXPECT_EQ(r.code, 0) << r.out << r.err;

  // 128 MiB of zeros deflate to an eighth of a MiB: an unused member is never inflated
  const std::int64_t n = 16 << 20;
  zip_up(ref, dir_ / "big.npz", {{"junk.npy", zeros_npy(n), ZIP_CM_DEFLATE}});
  ASSERT_LT(fs::file_size(dir_ / "big.npz"), 2u << 20);
  suite("cases:\n  - {name: b, reference: big.npz, " + rope_case + "}\n", "b.yaml");
  r = headgrad({"run", "b.yaml"}, dir_);  // not -q: the warning shows
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "member junk is not a reference file name at rope level; ignored")) << r.err;
  EXPECT_LT(peak_child_kib(), kChildBoundKib) << "a child held more than the bound";  // a run holds about 10 MiB

  // a used member whose header claims another shape is refused before its data is inflated
  fs::remove(ref / "r.npy");
  zip_up(ref, dir_ / "wrong.npz", {{"r.npy", zeros_npy(n), ZIP_CM_DEFLATE}});
  suite("cases:\n  - {name: w, reference: wrong.npz, " + rope_case + "}\n", "w.yaml");
  r = run({}, "w.yaml");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "wrong.npz member r has shape [16777216], expected [2, 9, 16]")) << r.err;

  // an unused member that is broken is not read either
  fs::copy_file(kRefs / "rope_B2_T9_d16_half_float64" / "r.npy", ref / "r.npy");
  zip_up(ref, dir_ / "broken.npz", {{"junk.npy", "\x93NUMPY garbage", ZIP_CM_STORE}});
  suite("cases:\n  - {name: k, reference: broken.npz, " + rope_case + "}\n", "k.yaml");
  r = run({}, "k.yaml");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

TEST_F(Inputs, NpzBzip2MembersAreBoundedToo) {
  ASSERT_TRUE(zip_compression_method_supported(ZIP_CM_BZIP2, 1)) << "libzip without bzip2: Debian's libzip-dev has it";
  const fs::path ref = copy_ref("rope_B2_T9_d16_half_float64");
  const std::int64_t n = 8 << 20;  // three of these (192 MiB) were read whole before
  zip_up(ref, dir_ / "bz.npz",
         {{"a.npy", zeros_npy(n), ZIP_CM_BZIP2}, {"b.npy", zeros_npy(n), ZIP_CM_BZIP2}, {"c.npy", zeros_npy(n), ZIP_CM_BZIP2}});
  ASSERT_LT(fs::file_size(dir_ / "bz.npz"), 1u << 20);
  suite("cases:\n  - {name: z, reference: bz.npz, level: rope, compare: [per_head], "
        "rope: {theta: 500000.0, style: half, rotary_dim: 16}}\n");
  const Outcome r = run();
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_LT(peak_child_kib(), kChildBoundKib);
}

// A stored zip written by hand: libzip refuses to add two members of one name.
std::string stored_zip(const std::vector<std::pair<std::string, std::string>>& members) {
  auto crc32 = [](const std::string& data) {
    std::uint32_t c = 0xffffffffu;
    for (unsigned char b : data) {
      c ^= b;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
  };
  std::string out, directory;
  auto u16 = [](std::string& s, std::uint32_t v) { s += static_cast<char>(v & 0xff), s += static_cast<char>((v >> 8) & 0xff); };
  auto u32 = [&](std::string& s, std::uint32_t v) { u16(s, v & 0xffff), u16(s, v >> 16); };
  for (const auto& [name, data] : members) {
    const auto at = static_cast<std::uint32_t>(out.size()), size = static_cast<std::uint32_t>(data.size());
    const std::uint32_t crc = crc32(data);
    u32(out, 0x04034b50), u16(out, 20), u16(out, 0), u16(out, 0), u16(out, 0), u16(out, 0);
    u32(out, crc), u32(out, size), u32(out, size), u16(out, static_cast<std::uint32_t>(name.size())), u16(out, 0);
    out += name + data;
    u32(directory, 0x02014b50), u16(directory, 20), u16(directory, 20), u16(directory, 0), u16(directory, 0);
    u16(directory, 0), u16(directory, 0), u32(directory, crc), u32(directory, size), u32(directory, size);
    u16(directory, static_cast<std::uint32_t>(name.size())), u16(directory, 0), u16(directory, 0), u16(directory, 0);
    u16(directory, 0), u32(directory, 0), u32(directory, at);
    directory += name;
  }
  const auto directory_at = static_cast<std::uint32_t>(out.size());
  out += directory;
  u32(out, 0x06054b50), u16(out, 0), u16(out, 0), u16(out, static_cast<std::uint32_t>(members.size()));
  u16(out, static_cast<std::uint32_t>(members.size())), u32(out, static_cast<std::uint32_t>(directory.size()));
  u32(out, directory_at), u16(out, 0);
  return out;
}

TEST_F(Inputs, NpzWithTwoMembersOfOneNameIsRefused) {
  const fs::path file = dir_ / "dup.npz";
  std::ofstream(file, std::ios::binary) << stored_zip({{"x.npy", zeros_npy(2)}, {"x.npy", zeros_npy(3)}});
  try {
    NpzArchive archive(file);
    ADD_FAILURE() << "no error";
  } catch (const NpyError& e) {
    EXPECT_TRUE(contains(e.what(), "dup.npz (member 'x.npy'): the archive holds two members of this name")) << e.what();
  }
  EXPECT_THROW(read_npz(file), NpyError);
  // one of each reads
  std::ofstream(file, std::ios::binary) << stored_zip({{"x.npy", zeros_npy(2)}, {"y.npy", zeros_npy(3)}});
  NpzArchive archive(file);
  EXPECT_EQ(archive.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(archive.read("y").numel(), 3);
  EXPECT_EQ(archive.header("x").shape, (Shape{2}));
}

TEST(NpyIntegers, WrongDtypeWhereIntegersAreExpectedListsInt64) {
  const fs::path file = fs::temp_directory_path() / ("headgrad_i4_" + std::to_string(::getpid()) + ".npy");
  std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }";
  header.resize(117, ' ');
  header += '\n';
  std::ofstream(file, std::ios::binary) << std::string("\x93NUMPY\x01\x00", 8) << static_cast<char>(header.size())
                                        << '\0' << header << std::string(8, '\0');
  try {
    read_npy_integers(file);
    ADD_FAILURE() << "no error";
  } catch (const NpyError& e) {
    EXPECT_TRUE(contains(e.what(), "unsupported dtype '<i4' where integers are expected (supported: '<i8' (int64)"))
        << e.what();
    EXPECT_FALSE(contains(e.what(), "bool")) << e.what();
  }
  fs::remove(file);
}

TEST(NotRegularFile, NamesWhatIsThere) {
  const fs::path d = fs::temp_directory_path() / ("headgrad_nrf_" + std::to_string(::getpid()));
  fs::create_directories(d);
  std::ofstream(d / "file") << "x";
  fs::create_symlink(d / "file", d / "link");
  fs::create_symlink(d / "absent", d / "dangling");
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0644), 0);
  EXPECT_EQ(not_regular_file(d / "file"), "");
  EXPECT_EQ(not_regular_file(d / "link"), "");
  EXPECT_EQ(not_regular_file(d / "absent"), "cannot open: no such file");
  EXPECT_EQ(not_regular_file(d / "dangling"), "is a dangling symlink (its target does not exist)");
  EXPECT_EQ(not_regular_file(d), "is a folder, not a file");
  EXPECT_EQ(not_regular_file(d / "fifo"), "is not a regular file (a fifo, device or socket)");
  EXPECT_THROW(read_npy(d / "fifo"), NpyError);  // refused, not opened (that would block)
  fs::remove_all(d);
}

// ---------------------------------------------------------------- item 7: settings

// The ConfigError parsing `yaml` gives, or "(no error)".
std::string parse_error(const std::string& yaml) {
  try {
    parse_suite(yaml, "s.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Settings, EachIsValidatedWhereItIsParsed) {
  const std::string mha = "cases:\n  - name: c\n    compare: [per_head, batched]\n";
  // an odd head width with no rotary_dim
  EXPECT_TRUE(contains(parse_error(mha + "    shape: {B: 1, T: 4, D: 10, H: 2}\n    rope: {theta: 10000}\n"),
                       "s.yaml:5:11: case 'c': the head width d=5 is odd and the 'rope' block gives no rotary_dim"))
      << parse_error(mha + "    shape: {B: 1, T: 4, D: 10, H: 2}\n    rope: {theta: 10000}\n");
  EXPECT_EQ(parse_error(mha + "    shape: {B: 1, T: 4, D: 10, H: 2}\n    rope: {theta: 10000, rotary_dim: 4}\n"),
            "(no error)");
  // generated positions past 2^53: row 2 begins at 2 x 2^52
  const std::string gen = mha + "    shape: {B: 3, T: 4, D: 8, H: 2}\n    rope: {positions: {generator: gapped, start: 4503599627370496}}\n";
  EXPECT_TRUE(contains(parse_error(gen), "s.yaml:5:23: case 'c': positions reach 9007199254740998 (generator gapped"))
      << parse_error(gen);
  // an offset at 2^53 leaves no room for T tokens
  const std::string off = mha + "    shape: {B: 1, T: 4, D: 8, H: 2}\n    rope: {positions: {offset: 9007199254740992}}\n";
  EXPECT_TRUE(contains(parse_error(off), "s.yaml:5:23: case 'c': positions reach 9007199254740995 (offset"))
      << parse_error(off);
  EXPECT_EQ(parse_error(mha + "    shape: {B: 1, T: 4, D: 8, H: 2}\n    rope: {positions: {offset: 9007199254740989}}\n"),
            "(no error)");
  // q_offset past int64's half: refused as a value, never added
  const std::string core = "cases:\n  - name: c\n    level: core\n    compare: [per_head, batched]\n"
                           "    shape: {B: 1, H: 2, Tq: 1, Tk: 4, d: 4}\n";
  EXPECT_TRUE(contains(parse_error(core + "    rope: {q_offset: 9223372036854775807}\n"),
                       "s.yaml:6:22: case 'c': 'q_offset' must be in [0, 2^53]"));
  EXPECT_TRUE(contains(parse_error(core + "    rope: {q_offset: 9007199254740992, positions: {offset: 1}}\n"),
                       "s.yaml:6:22: case 'c': positions reach 9007199254740993"))
      << parse_error(core + "    rope: {q_offset: 9007199254740992, positions: {offset: 1}}\n");
  // tolerance keys that do not apply
  const std::string shape = "    shape: {B: 1, T: 4, D: 8, H: 2}\n";
  EXPECT_TRUE(contains(parse_error(mha + shape + "    tolerance: {dq: {atol: 1.0e-3}}\n"),
                       "s.yaml:5:17: case 'c': 'tolerance: dq' is not a tensor of this mha-level case"));
  EXPECT_TRUE(contains(parse_error(mha + shape + "    dtype: float32\n    tolerance: {rule: allclose, k: {out: 4}}\n"),
                       "s.yaml:6:33: case 'c': 'tolerance: k' is the factor of relative_to_baseline, and this case is "
                       "judged by allclose"));
  EXPECT_TRUE(contains(parse_error(mha + shape + "    tolerance: {k: {out: 4}}\n"), "judged by allclose (float64"));
  EXPECT_TRUE(contains(parse_error(mha + shape + "    dtype: float32\n    tolerance: {k: {dk: 4}}\n"),
                       "'tolerance: k: dk' is not a tensor of this mha-level case"));
  EXPECT_EQ(parse_error(mha + shape + "    dtype: float32\n    tolerance: {k: {dwq: 4, grads: 5}}\n"), "(no error)");
  // defaults may serve both levels
  EXPECT_EQ(parse_error("defaults: {tolerance: {dq: {atol: 1.0e-3}}}\n" + mha + shape), "(no error)");
  // a diagnosis expected of a case that is expected to pass
  EXPECT_TRUE(contains(parse_error(mha + shape + "    expect: {fail: false, diagnosis: no_scale}\n"),
                       "s.yaml:5:13: case 'c': 'expect: diagnosis' names the bug a failing case is caught by; it needs "
                       "'fail: true'"));
}

TEST_F(Inputs, PositionsFileBeyond2To53IsABadReference) {
  const fs::path ref = copy_ref("rope_B2_T9_d16_half_float64");
  suite("cases:\n  - {name: p, level: rope, compare: [per_head], reference: ref, "
        "rope: {theta: 500000.0, style: half, rotary_dim: 16}}\n");
  ASSERT_EQ(run().code, 0);
  for (const double big : {1e300, 1152921504606846976.0 /* 2^60 */}) {
    const Tensor p = read_npy(kRefs / "rope_B2_T9_d16_half_float64" / "positions.npy", {.integers = true});
    std::vector<double> v = p.to_vector();
    v[3] = big;
    write_npy(ref / "positions.npy", Tensor::from_values(v, p.shape(), DType::float64));
    const Outcome r = run();
    EXPECT_EQ(r.code, 2) << big << r.out << r.err;
    EXPECT_TRUE(contains(r.err, "case 'p': ref/positions.npy holds")) << r.err;
    EXPECT_TRUE(contains(r.err, "positions are integers in [0, 2^53]")) << r.err;
  }
}

TEST_F(Inputs, CommandLineSettingsGivenEmptyOrNaNAreRefused) {
  fs::copy_file(kFixtures / "pass.yaml", dir_ / "s.yaml");
  fs::copy_file(kFixtures / "mask_B2_Tq5_Tk7.npy", dir_ / "mask_B2_Tq5_Tk7.npy");
  Outcome r = run({"--shard", ""});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--shard: expected K/N")) << r.err;
  r = run({"--max-memory", ""});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--max-memory")) << r.err;
  r = run({"--probe-timeout", "nan"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "--probe-timeout")) << r.err;
  r = headgrad({"run", "s.yaml", "-q"}, dir_, {{"HEADGRAD_NUM_THREADS", "100000"}});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "HEADGRAD_NUM_THREADS=100000: expected a whole number of threads in [1, 1024]")) << r.err;
  r = headgrad({"run", "s.yaml", "-q"}, dir_, {{"HEADGRAD_NUM_THREADS", "2"}});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

// ---------------------------------------------------------------- item 8: new-plugin

TEST_F(Inputs, NewPluginRefusesReservedNamesAndIsAllOrNothing) {
  Outcome r = headgrad({"new-plugin", "mutant_no_scale", "p"}, dir_);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_TRUE(contains(r.err, "NAME 'mutant_no_scale' starts with mutant_, the prefix reserved")) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "p"));

  r = headgrad({"new-plugin", std::string(300, 'a'), "p"}, dir_);
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "p"));
  for (const auto& entry : fs::directory_iterator(dir_)) ADD_FAILURE() << "left behind: " << entry.path();
  r = headgrad({"new-plugin", "my_attn", "p"}, dir_);  // the retry finds nothing in its way
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(fs::is_regular_file(dir_ / "p" / "my_attn.cpp"));
  EXPECT_TRUE(fs::is_regular_file(dir_ / "p" / "masks" / "padding_B2_Tq5_Tk7.npy"));
  // an empty folder given as DIR is filled
  fs::create_directory(dir_ / "e");
  r = headgrad({"new-plugin", "my_attn", "e"}, dir_);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_TRUE(fs::is_regular_file(dir_ / "e" / "suite.yaml"));
}

}  // namespace

}  // namespace test_runner_inputs
