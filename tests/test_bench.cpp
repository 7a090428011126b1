// `headgrad bench` on a tiny configuration: the command line, the JSON it
// writes (fields, units, consistency), and its exit codes. Timings are only
// checked for being positive: their size depends on the machine.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>
#include <headgrad/tile_gemm.hpp>
#include <nlohmann/json.hpp>

#include "bench.hpp"
#include "case/suite.hpp"

namespace test_bench {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path scratch(const std::string& name) {
  return fs::temp_directory_path() / ("headgrad_test_bench_" + std::to_string(::getpid()) + "_" + name);
}

// Runs `bench ARGS...` through add_bench_command, as the headgrad program does.
int run_bench_cli(std::vector<std::string> args) {
  CLI::App app{"test"};
  int exit_code = -1;
  headgrad::bench::add_bench_command(app, exit_code);
  args.insert(args.begin(), {"headgrad", "bench"});
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}

json read_json(const fs::path& file) {
  std::ifstream in(file);
  return json::parse(in);
}

class BenchTiny : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    out_ = scratch("tiny.json");
    code_ = run_bench_cli({"--plugin", "batched", "--plugin", "per_head", "--plugin", "fused_sdpa",
                           "--shape", "2,3,8,2", "--shape", "1,5,12,3", "--dtype", "float64",
                           "--threads", "1", "--repeats", "1", "--warmup", "1", "--gemm-size", "64",
                           "--json", out_.string()});
    if (fs::exists(out_)) result_ = read_json(out_);
  }
  static void TearDownTestSuite() { fs::remove(out_); }
  static inline fs::path out_;
  static inline int code_ = -1;
  static inline json result_;
};

TEST_F(BenchTiny, ExitsZeroAndWritesJson) {
  EXPECT_EQ(code_, 0);
  ASSERT_TRUE(result_.is_object());
}

TEST_F(BenchTiny, RunCarriesGemmFigure) {
  ASSERT_TRUE(result_.contains("gemm_gflops"));
  EXPECT_GT(result_["gemm_gflops"].get<double>(), 0.0);
  ASSERT_EQ(result_["gemm"].size(), 1u);
  EXPECT_EQ(result_["gemm"][0]["routine"], "dgemm");
  EXPECT_EQ(result_["gemm"][0]["size"], 64);
  EXPECT_TRUE(result_["environment"].contains("blas_library"));
  EXPECT_TRUE(result_["environment"].contains("blas_kernel"));
  EXPECT_TRUE(result_["environment"].contains("allocator"));
  EXPECT_NE(result_["environment"]["half_convert"].get<std::string>().find("float32->bfloat16 "), std::string::npos);
  // where float32 products ran: the packed kernel exactly where the CPU has AVX-512F
  EXPECT_EQ(result_["environment"]["float32_products"].get<std::string>().rfind(
                headgrad::tile::available() ? "the packed AVX-512 kernel" : "the BLAS", 0),
            0u);
}

TEST_F(BenchTiny, OneRowPerPluginAndShapeWithEveryField) {
  ASSERT_EQ(result_["rows"].size(), 6u);  // 3 plugins x 2 shapes
  std::vector<std::string> plugins;
  for (const auto& r : result_["rows"]) {
    SCOPED_TRACE(r.dump());
    ASSERT_FALSE(r.contains("error"));
    ASSERT_FALSE(r.contains("skipped"));
    for (const char* key : {"plugin", "shape", "dtype", "threads", "fwd_ms", "fwdbwd_ms",
                            "fwd_min_ms", "fwdbwd_min_ms", "gflops_fwdbwd", "peak_bytes", "flops",
                            "gemm_gflops", "gemm_fraction_fwdbwd", "gemm_gflops_adjacent"})
      EXPECT_TRUE(r.contains(key)) << key;
    for (const char* dim : {"B", "T", "D", "H"}) EXPECT_TRUE(r["shape"].contains(dim)) << dim;
    EXPECT_EQ(r["dtype"], "float64");
    EXPECT_EQ(r["threads"], 1);
    plugins.push_back(r["plugin"].get<std::string>());
  }
  EXPECT_EQ(plugins, (std::vector<std::string>{"batched", "per_head", "fused_sdpa", "batched",
                                               "per_head", "fused_sdpa"}));
  EXPECT_EQ(result_["rows"][0]["shape"]["B"], 2);
  EXPECT_EQ(result_["rows"][0]["shape"]["T"], 3);
  EXPECT_EQ(result_["rows"][0]["shape"]["D"], 8);
  EXPECT_EQ(result_["rows"][0]["shape"]["H"], 2);
}

TEST_F(BenchTiny, FiguresArePositiveAndConsistent) {
  for (const auto& r : result_["rows"]) {
    SCOPED_TRACE(r.dump());
    const double fwd = r["fwd_ms"], fwdbwd = r["fwdbwd_ms"];
    EXPECT_GT(fwd, 0.0);
    EXPECT_GT(fwdbwd, 0.0);
    EXPECT_LE(r["fwd_min_ms"].get<double>(), fwd);
    EXPECT_LE(r["fwdbwd_min_ms"].get<double>(), fwdbwd);
    EXPECT_GT(r["peak_bytes"].get<double>(), 0.0);
    // GFLOP/s = 3 x forward FLOPs / fwd+bwd time, and its fraction of the GEMM figure.
    const double flops = r["flops"]["fwdbwd_dense"];
    EXPECT_DOUBLE_EQ(flops, 3 * r["flops"]["fwd_dense"].get<double>());
    EXPECT_NEAR(r["gflops_fwdbwd"].get<double>(), flops / (fwdbwd * 1e6), 1e-9 * flops);
    EXPECT_NEAR(r["gemm_fraction_fwdbwd"].get<double>(),
                r["gflops_fwdbwd"].get<double>() / result_["gemm_gflops"].get<double>(), 1e-12);
    EXPECT_LE(r["flops"]["fwd_causal"].get<double>(), r["flops"]["fwd_dense"].get<double>());
    EXPECT_GT(r["gemm_gflops_adjacent"].get<double>(), 0.0);
    // Process CPU time: positive, and with one thread no more than the wall
    // time it lies within (plus the clock reads around it).
    for (const char* run : {"fwd", "fwdbwd"}) {
      const double cpu = r[std::string(run) + "_cpu_ms"], wall = r[std::string(run) + "_ms"];
      EXPECT_GT(cpu, 0.0) << run;
      EXPECT_LE(cpu, 1.05 * wall + 0.01) << run;
    }
    EXPECT_GT(r["gemm_gflops_cpu_adjacent"].get<double>(), 0.0);
  }
  for (const auto& g : result_["gemm"]) {
    EXPECT_LE(g["cpu_ms"].get<double>(), 1.05 * g["ms"].get<double>() + 0.01);
    EXPECT_NEAR(g["gflops_cpu"].get<double>() * g["cpu_ms"].get<double>(),
                g["gflops"].get<double>() * g["ms"].get<double>(), 1e-9 * g["gflops"].get<double>() * g["ms"].get<double>());
  }
}

TEST(BenchFlops, StatedCounts) {
  // (B,T,D,H) = (2,3,8,2): projections 4 x 2*2*3*64 = 3072; core 2 x 2*2*9*8 = 576 dense,
  // causal-useful 2 x 2*2*8*(3*4/2) = 384.
  const auto f = headgrad::bench::count_flops({2, 3, 8, 2}, "mha");
  EXPECT_DOUBLE_EQ(f.fwd_dense, 3072 + 576);
  EXPECT_DOUBLE_EQ(f.fwd_causal, 3072 + 384);
  const auto c = headgrad::bench::count_flops({2, 3, 8, 2}, "core");
  EXPECT_DOUBLE_EQ(c.fwd_dense, 576);
}

TEST(BenchCli, ParsesShapes) {
  const auto s = headgrad::bench::parse_shape("(4, 512,512,8)");
  EXPECT_EQ(s.B, 4);
  EXPECT_EQ(s.T, 512);
  EXPECT_EQ(s.D, 512);
  EXPECT_EQ(s.H, 8);
  EXPECT_THROW(headgrad::bench::parse_shape("4,512,512"), headgrad::bench::BenchConfigError);
  EXPECT_THROW(headgrad::bench::parse_shape("4,x,512,8"), headgrad::bench::BenchConfigError);
}

// The 16-bit dtypes run fused_sdpa and batched (both declare them).
TEST(BenchCli, SixteenBitDtypesRun) {
  for (const char* dt : {"bfloat16", "float16"})
    EXPECT_EQ(run_bench_cli({"--shape", "2,3,8,2", "--dtype", dt, "--plugin", "fused_sdpa", "--plugin", "batched",
                             "--repeats", "1", "--warmup", "0", "--gemm-size", "64"}),
              0)
        << dt;
}

TEST(BenchCli, BadUsageIsExitTwo) {
  EXPECT_EQ(run_bench_cli({"--shape", "2,3,8"}), 2);
  EXPECT_EQ(run_bench_cli({"--shape", "2,3,7,2"}), 2);  // D not divisible by H
  EXPECT_EQ(run_bench_cli({"--shape", "2,3,8,2", "--dtype", "float8"}), 2);
  EXPECT_EQ(run_bench_cli({"--shape", "2,3,8,2", "--level", "layer"}), 2);
  EXPECT_EQ(run_bench_cli({"--no-such-flag"}), 2);
  EXPECT_EQ(run_bench_cli({}), 2);  // no suite and no shape
}

TEST(BenchCli, MissingPluginIsExitThree) {
  EXPECT_EQ(run_bench_cli({"--plugin", "no_such_plugin", "--shape", "2,3,8,2", "--repeats", "1",
                           "--gemm-size", "32"}),
            3);
}

// --window repeated, with none: a plugin's windows take turns run by run, the
// rows say their window, and each windowed row's speed-up is the no-window
// row's median over its own, from the figures the JSON itself holds.
TEST(BenchCli, WindowsInOneRunWithSpeedUps) {
  const fs::path out = scratch("windows.json");
  ASSERT_EQ(run_bench_cli({"--plugin", "fused_sdpa", "--plugin", "per_head", "--shape", "1,12,8,2", "--level", "core",
                           "--no-causal", "--window", "none", "--window", "3", "--window", "2,1", "--repeats", "2",
                           "--warmup", "0", "--gemm-size", "32", "--json", out.string()}),
            0);
  const json r = read_json(out);
  EXPECT_EQ(r["config"]["windows"], json::parse(R"([null, {"left": 3, "right": 0}, {"left": 2, "right": 1}])"));
  ASSERT_EQ(r["rows"].size(), 6u);
  for (std::size_t p = 0; p < 2; ++p) {
    const json& none = r["rows"][3 * p];
    EXPECT_EQ(none["plugin"], p == 0 ? "fused_sdpa" : "per_head");
    EXPECT_FALSE(none.contains("window"));
    EXPECT_FALSE(none.contains("speedup_vs_no_window"));
    for (std::size_t w = 1; w < 3; ++w) {
      const json& row = r["rows"][3 * p + w];
      EXPECT_EQ(row["plugin"], none["plugin"]);
      EXPECT_EQ(row["window"], r["config"]["windows"][w]);
      for (const char* key : {"fwd_ms", "fwd_cpu_ms", "fwdbwd_ms", "fwdbwd_cpu_ms"})
        EXPECT_DOUBLE_EQ(row["speedup_vs_no_window"][key].get<double>(),
                         none[key].get<double>() / row[key].get<double>())
            << key;
    }
  }
  EXPECT_EQ(run_bench_cli({"--shape", "1,12,8,2", "--window", "wide"}), 2);
  fs::remove(out);
}

TEST(BenchCli, ReadsSuiteAndFlagsOverrideIt) {
  const fs::path suite = scratch("suite.yaml"), out = scratch("suite.json");
  {
    std::ofstream f(suite);
    f << "level: core\nplugins: [batched]\ndtypes: [float32]\nthreads: [1]\nrepeats: 1\n"
         "warmup: 0\ngemm_size: 32\nshapes:\n  - {B: 1, T: 4, D: 8, H: 2}\n";
  }
  ASSERT_EQ(run_bench_cli({suite.string(), "--plugin", "fused_sdpa", "--json", out.string()}), 0);
  const json r = read_json(out);
  ASSERT_EQ(r["rows"].size(), 1u);
  EXPECT_EQ(r["rows"][0]["plugin"], "fused_sdpa");
  EXPECT_EQ(r["rows"][0]["level"], "core");
  EXPECT_EQ(r["rows"][0]["dtype"], "float32");
  EXPECT_EQ(r["gemm"][0]["routine"], "sgemm");
  {
    std::ofstream f(suite);
    f << "plugins: [batched]\nshapez: []\n";
  }
  EXPECT_EQ(run_bench_cli({suite.string()}), 2);  // unknown key
  fs::remove(suite);
  fs::remove(out);
}

TEST(BenchGroupedKv, ShapeFlopsAndValidation) {
  const auto s = headgrad::bench::parse_shape("1,2048,2048,32,8");
  EXPECT_EQ(s.H, 32);
  EXPECT_EQ(s.Hkv, 8);
  EXPECT_EQ(s.str(), "(1,2048,2048,32,8)");
  EXPECT_EQ(headgrad::bench::parse_shape("1,2,8,2").kv_heads(), 2);  // default H
  EXPECT_THROW(headgrad::bench::parse_shape("1,2,8,2,1,1"), headgrad::bench::BenchConfigError);
  // (B,T,D,H,Hkv) = (2,3,8,2,1): Wq, Wo 2 x 2*2*3*64 = 1536; Wk, Wv 2 x 2*2*3*(4*8) = 768; core 576
  EXPECT_DOUBLE_EQ(headgrad::bench::count_flops({2, 3, 8, 2, 1}, "mha").fwd_dense, 1536 + 768 + 576);
  headgrad::bench::BenchConfig c;
  c.plugins = {"batched"};
  c.shapes = {{1, 2, 8, 4, 3}};
  try {
    headgrad::bench::validate(c);
    ADD_FAILURE() << "no error";
  } catch (const headgrad::bench::BenchConfigError& e) {
    EXPECT_STREQ(e.what(), "shape (1,2,8,4,3): Hkv must divide H (query head h reads kv head h / (H / Hkv))");
  }
}

// ---- --check: one suite case, pass by pass

headgrad::runner::CaseSpec parse_one_case(const std::string& yaml) {
  const auto suite = headgrad::runner::parse_suite(yaml, "inline.yaml");
  EXPECT_EQ(suite.cases.size(), 1u);
  return suite.cases.at(0);
}

// FLOPs worked out by hand (a multiply-add is 2 FLOPs).
TEST(BenchCheckFlops, ByHand) {
  // MHA (B,T,D,H,Hkv) = (2,5,8,2,1), d 4, causal: q 2*2*5*8*8 = 1280, k and v
  // 2*2*5*8*4 = 640 each, out 1280: 3840; attended pairs 1+2+3+4+5 = 15 per
  // (batch, head), x 4 slices = 60 (of 100); (4 + 4) + (4 + 4) FLOPs per pair
  // (q . k, p v): 960. Forward 4800, forward + backward 14400.
  const auto mha = headgrad::bench::count_check_flops(parse_one_case(
      "suite: s\ncases:\n  - {name: a, compare: [fused_sdpa, batched], dtype: bfloat16, causal: true,"
      " shape: {B: 2, T: 5, D: 8, H: 2, Hkv: 1}}\n"));
  EXPECT_DOUBLE_EQ(mha.projections, 3840);
  EXPECT_DOUBLE_EQ(mha.pairs, 60);
  EXPECT_DOUBLE_EQ(mha.dense_pairs, 100);
  EXPECT_DOUBLE_EQ(mha.core, 960);
  EXPECT_DOUBLE_EQ(mha.fwd, 4800);
  EXPECT_DOUBLE_EQ(mha.fwdbwd, 14400);
  EXPECT_TRUE(mha.causal_useful);
  // Not causal: 100 pairs x 16 = 1600, forward 5440.
  const auto full = headgrad::bench::count_check_flops(parse_one_case(
      "suite: s\ncases:\n  - {name: a, compare: [fused_sdpa, batched], causal: false,"
      " shape: {B: 2, T: 5, D: 8, H: 2, Hkv: 1}}\n"));
  EXPECT_DOUBLE_EQ(full.fwd, 3840 + 1600);
  EXPECT_FALSE(full.causal_useful);
  // Core (B,H,Tq,Tk,d) = (1,3,3,5,2), no projections. Top-left causal: query i
  // sees keys 0..i: 1 + 2 + 3 = 6 pairs; bottom-right: i + 2 and below, 3 + 4 + 5
  // = 12. Per pair 2*2 + 2*2 = 8 FLOPs, 3 heads: 144 and 288.
  const auto tl = headgrad::bench::count_check_flops(parse_one_case(
      "suite: s\ncases:\n  - {name: a, level: core, compare: [fused_sdpa, batched], causal: true,"
      " shape: {B: 1, H: 3, Tq: 3, Tk: 5, d: 2}}\n"));
  EXPECT_DOUBLE_EQ(tl.projections, 0);
  EXPECT_DOUBLE_EQ(tl.fwd, 144);
  const auto br = headgrad::bench::count_check_flops(parse_one_case(
      "suite: s\ncases:\n  - {name: a, level: core, compare: [fused_sdpa, batched], causal: bottom_right,"
      " shape: {B: 1, H: 3, Tq: 3, Tk: 5, d: 2}}\n"));
  EXPECT_DOUBLE_EQ(br.fwd, 288);
}

class BenchCheckTiny : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    suite_ = scratch("check.yaml");
    out_ = scratch("check.json");
    {
      std::ofstream f(suite_);
      f << "suite: tiny-check\ncases:\n"
           "  - {name: other, compare: [per_head, batched], shape: {B: 1, T: 2, D: 4, H: 2}}\n"
           "  - name: tiny\n    compare: [fused_sdpa, batched]\n    dtype: bfloat16\n    causal: true\n"
           "    shape: {B: 2, T: 5, D: 8, H: 2, Hkv: 1}\n";
    }
    code_ = run_bench_cli({"--check", suite_.string(), "--case", "tiny", "--threads", "1", "--gemm-size", "64",
                           "--json", out_.string()});
    if (fs::exists(out_)) result_ = read_json(out_);
  }
  static void TearDownTestSuite() {
    fs::remove(out_);
    fs::remove(suite_);
  }
  static inline fs::path suite_, out_;
  static inline int code_ = -1;
  static inline json result_;
};

TEST_F(BenchCheckTiny, RunsTheCaseAndItsPasses) {
  ASSERT_EQ(code_, 0);
  EXPECT_EQ(result_["case"], "tiny");
  EXPECT_EQ(result_["status"], "pass");
  EXPECT_EQ(result_["dtype"], "bfloat16");
  EXPECT_EQ(result_["threads"], 1);
  std::vector<std::string> passes, runs;
  for (const auto& p : result_["passes"]) {
    passes.push_back(p["pass"]);
    runs.push_back(p["runs"]);
    EXPECT_GE(p["seconds"].get<double>(), 0.0) << p.dump();
  }
  EXPECT_EQ(passes, (std::vector<std::string>{"inputs", "side 1", "side 2", "golden", "baseline", "oracle inputs",
                                              "comparison", "analysis", "reports", "other"}));
  EXPECT_EQ(runs[1], "fused_sdpa in bfloat16");
  EXPECT_EQ(runs[2], "batched in bfloat16");
  EXPECT_EQ(runs[3], "per_head in float64");
  EXPECT_EQ(runs[4], "per_head in bfloat16");
}

TEST_F(BenchCheckTiny, ArithmeticOfEachRun) {
  ASSERT_EQ(code_, 0);
  EXPECT_DOUBLE_EQ(result_["flops"]["fwdbwd"].get<double>(), 14400);  // BenchCheckFlops.ByHand
  EXPECT_EQ(result_["flops"]["count"], "causal-useful");
  const double sgemm = result_["gemm"]["sgemm_gflops"], dgemm = result_["gemm"]["dgemm_gflops"];
  EXPECT_DOUBLE_EQ(sgemm, 0.5 * (result_["gemm"]["before"][0]["gflops"].get<double>() +
                                 result_["gemm"]["after"][0]["gflops"].get<double>()));
  EXPECT_EQ(result_["gemm"]["before"][1]["routine"], "dgemm");
  double bound_sum = 0, seconds_sum = 0;
  for (const auto& p : result_["passes"]) {
    SCOPED_TRACE(p.dump());
    seconds_sum += p["seconds"].get<double>();
    if (!p.contains("flops")) continue;
    EXPECT_DOUBLE_EQ(p["flops"].get<double>(), 14400);
    const bool golden = p["pass"] == "golden";
    EXPECT_EQ(p["gemm_routine"], golden ? "dgemm" : "sgemm");
    const double rate = golden ? dgemm : sgemm;
    EXPECT_NEAR(p["gemm_bound_seconds"].get<double>(), 14400 / (rate * 1e9), 1e-12 * 14400 / (rate * 1e9));
    EXPECT_NEAR(p["ratio"].get<double>(), p["seconds"].get<double>() / p["gemm_bound_seconds"].get<double>(),
                1e-9 * p["ratio"].get<double>());
    EXPECT_GT(p["peak_rss_bytes"].get<double>(), 0.0);
    EXPECT_GT(p["peak_tensor_bytes"].get<double>(), 0.0);
    EXPECT_LE(p["compute_seconds"].get<double>(), p["seconds"].get<double>());
    bound_sum += p["gemm_bound_seconds"].get<double>();
  }
  EXPECT_NEAR(result_["total"]["gemm_bound_seconds"].get<double>(), bound_sum, 1e-12 * bound_sum);
  EXPECT_NEAR(result_["total"]["seconds"].get<double>(), seconds_sum, 1e-9 * seconds_sum);
  EXPECT_NEAR(result_["total"]["ratio"].get<double>(), seconds_sum / bound_sum, 1e-6 * seconds_sum / bound_sum);
}

TEST(BenchCheckCli, UsageErrorsNameTheFlag) {
  const fs::path suite = scratch("check_usage.yaml");
  {
    std::ofstream f(suite);
    f << "suite: s\ncases:\n  - {name: tiny, compare: [per_head, batched], shape: {B: 1, T: 2, D: 4, H: 2}}\n";
  }
  EXPECT_EQ(run_bench_cli({"--check", suite.string()}), 2);                            // no --case
  EXPECT_EQ(run_bench_cli({"--check", suite.string(), "--case", "tinny"}), 2);         // no such case
  EXPECT_EQ(run_bench_cli({"--check", suite.string(), "--case", "tiny", "--shape", "1,2,4,2"}), 2);
  EXPECT_EQ(run_bench_cli({"--check", suite.string(), "--case", "tiny", "--threads", "1", "--threads", "2"}), 2);
  EXPECT_EQ(run_bench_cli({"--case", "tiny"}), 2);                                      // --case without --check
  EXPECT_EQ(run_bench_cli({"--max-memory", "1G"}), 2);                                  // likewise --max-memory
  EXPECT_EQ(run_bench_cli({"--check", suite.string(), "--case", "tiny", "--max-memory", "1K"}), 2);  // over budget
  EXPECT_EQ(run_bench_cli({"--check", suite.string(), "--case", "tiny", "--max-memory", "lots"}), 2);
  EXPECT_EQ(run_bench_cli({"--check", (suite.string() + ".missing"), "--case", "tiny"}), 2);
  fs::remove(suite);
}

}  // namespace

}  // namespace test_bench
