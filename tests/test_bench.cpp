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
#include <nlohmann/json.hpp>

#include "bench.hpp"

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

}  // namespace
