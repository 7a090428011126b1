// headgrad bench, the subcommand: flags over a bench YAML file, the run, the
// table and the JSON file (bench.hpp).
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <headgrad/child_process.hpp>

#include "bench.hpp"

namespace headgrad::bench {

using nlohmann::json;

namespace {

struct BenchArgs {
  std::string suite, json_file, level;
  std::vector<std::string> plugins, shapes, dtypes, plugin_paths;
  std::vector<int> threads;
  std::optional<int> repeats, warmup;
  std::optional<std::int64_t> gemm_size;
  std::optional<std::uint64_t> seed;
  bool no_causal = false;
  std::string window;                 // --window L[,R]
  std::optional<double> softcap;      // --softcap C
  bool sinks = false;                 // --sinks
};

int run_command(const BenchArgs& args) {
  constexpr int kOk = 0, kUsage = 2, kPlugin = 3;
  try {
    BenchConfig c;
    if (!args.suite.empty()) c = load_bench_config(args.suite);
    else c.plugins = default_plugins();
    if (!args.plugins.empty()) c.plugins = args.plugins;
    if (!args.shapes.empty()) {
      c.shapes.clear();
      for (const auto& s : args.shapes) c.shapes.push_back(parse_shape(s));
    }
    if (!args.dtypes.empty()) {
      c.dtypes.clear();
      for (const auto& d : args.dtypes) c.dtypes.push_back(parse_dtype(d));
    }
    if (!args.threads.empty()) c.threads = args.threads;
    if (!args.level.empty()) c.level = args.level;
    if (args.repeats) c.repeats = *args.repeats;
    if (args.warmup) c.warmup = *args.warmup;
    if (args.gemm_size) c.gemm_size = *args.gemm_size;
    if (args.seed) c.seed = *args.seed;
    if (args.no_causal) c.causal = false;
    if (!args.window.empty()) c.window = parse_window(args.window);
    if (args.softcap) {
      if (!(*args.softcap > 0) || !std::isfinite(*args.softcap))
        throw BenchConfigError("--softcap must be a number > 0, got " + std::to_string(*args.softcap));
      c.softcap = *args.softcap;
    }
    if (args.sinks) c.sinks = true;
    for (const auto& p : args.plugin_paths) c.plugin_paths.emplace_back(p);

    const json result = run_bench(c, &std::cerr);
    print_table(std::cout, result);
    if (!args.json_file.empty()) {
      std::ofstream f(args.json_file);
      if (!f) throw BenchConfigError("cannot write --json file " + args.json_file);
      f << result.dump(2) << "\n";
    }
    for (const auto& r : result["rows"])
      if (r.contains("error")) return kPlugin;
    return kOk;
  } catch (const BenchConfigError& e) {
    std::cerr << "headgrad bench: " << e.what() << "\n";
    return kUsage;
  } catch (const PluginMissing& e) {
    std::cerr << "headgrad bench: " << e.what() << "\n";
    return kPlugin;
  } catch (const InternalError&) {  // headgrad's own failures: main's exit code 4, as every subcommand's
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::logic_error& e) {
    if (dynamic_cast<const std::invalid_argument*>(&e) == nullptr) throw;
    std::cerr << "headgrad bench: " << e.what() << "\n";
    return kPlugin;
  } catch (const std::exception& e) {
    std::cerr << "headgrad bench: " << e.what() << "\n";
    return kPlugin;
  }
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Time attention plugins: forward and forward+backward (loss = sum(out * R)) after warm-up, "
      "median and minimum, GFLOP/s, peak extra memory, and a same-run 2048^3 sgemm/dgemm as the "
      "yardstick. Output: an aligned table on stdout (progress on stderr), JSON with --json.");
  cmd->add_option("suite", args->suite,
                  "a bench YAML file (configs/bench.yaml): plugins, shapes, dtypes, threads, "
                  "repeats, warmup, level, causal, gemm_size, seed. Flags below override it")
      ->type_name("SUITE.yaml");
  cmd->add_option("--plugin", args->plugins, "a plugin to time; repeatable (default: the suite's, "
                  "else batched, per_head, fused_sdpa)")
      ->type_name("NAME")->allow_extra_args(false);
  cmd->add_option("--shape", args->shapes, "B,T,D,H or B,T,D,H,Hkv (batch, sequence, model width, query heads, and kv heads for "
                  "grouped-query attention: query head h reads kv head h / (H / Hkv); default Hkv = H); repeatable")
      ->type_name("B,T,D,H")->allow_extra_args(false);
  cmd->add_option("--dtype", args->dtypes, "float32, float64, bfloat16 or float16; repeatable (default float32)")
      ->type_name("DTYPE")->allow_extra_args(false);
  cmd->add_option("--threads", args->threads,
                  "threads for the BLAS and headgrad's workers; repeatable (default 1)")
      ->type_name("N")->allow_extra_args(false);
  cmd->add_option("--level", args->level, "mha (projections + core, default) or core (q, k, v -> out)")
      ->type_name("mha|core");
  cmd->add_option("--json", args->json_file, "also write every figure as JSON to FILE")->type_name("FILE");
  cmd->add_option("--repeats", args->repeats, "timed runs of each measurement (default 5)")->type_name("N");
  cmd->add_option("--warmup", args->warmup, "untimed forward+backward runs first (default 2)")->type_name("N");
  cmd->add_option("--gemm-size", args->gemm_size, "n of the n^3 yardstick GEMM (default 2048)")->type_name("N");
  cmd->add_option("--seed", args->seed, "seed of the inputs (default 0)")->type_name("N");
  cmd->add_flag("--no-causal", args->no_causal, "attend every key (default: causal)");
  cmd->add_option("--window", args->window,
                  "a sliding window: query i sees keys i - L .. i + R (R default 0: with causal, L + 1 keys)")
      ->type_name("L[,R]");
  cmd->add_option("--softcap", args->softcap, "logit soft-capping: scores become C tanh(s / C)")->type_name("C");
  cmd->add_flag("--sinks", args->sinks, "attention sinks: one learned logit per query head (U(-1, 3))");
  cmd->add_option("--plugin-path", args->plugin_paths,
                  "a folder (searched recursively) or a plugin file; repeatable. Searched before "
                  "HEADGRAD_PLUGIN_PATH and the built or installed plugin folder")
      ->type_name("DIR")->allow_extra_args(false);
  cmd->footer(
      "\nFLOPs (stated in the output): projections (2 + 2 Hkv/H) x 2BTD^2; core 2 x 2BT^2D dense, or\n"
      "causal-useful with T(T+1)/2 key pairs instead of T^2; backward = 2 x forward.\n"
      "GFLOP/s use the dense count unless the column says causal.\n"
      "Environment: HEADGRAD_ALLOCATOR=system bypasses the caching allocator;\n"
      "HEADGRAD_NUM_THREADS sets the default thread count.\n"
      "Exit codes: 0 ok; 2 bad usage or config; 3 a plugin missing or failing.\n\n"
      "Example: headgrad bench configs/bench.yaml --threads 1 --json bench.json");
  cmd->callback([args, &exit_code] { exit_code = run_command(*args); });
}

}  // namespace headgrad::bench
