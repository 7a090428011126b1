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
#include "case/budget.hpp"

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
  std::string check, case_name;  // --check SUITE.yaml --case NAME
  std::optional<double> timeout;
  std::optional<std::string> max_memory;
  bool no_isolation = false;
  std::vector<std::string> windows;   // --window L[,R] | none, repeatable
  std::optional<double> softcap;      // --softcap C
  bool sinks = false;                 // --sinks
};

// --check: one case of a suite, pass by pass. Flags that choose what the
// plain bench times are refused by name (the case gives plugins, shape, dtype).
json check_mode(const BenchArgs& args) {
  if (args.case_name.empty()) throw BenchConfigError("--check needs --case NAME (the case of " + args.check + " to time)");
  std::vector<std::string> refused;
  if (!args.suite.empty()) refused.push_back("a bench SUITE.yaml (" + args.suite + ")");
  if (!args.plugins.empty()) refused.push_back("--plugin");
  if (!args.shapes.empty()) refused.push_back("--shape");
  if (!args.dtypes.empty()) refused.push_back("--dtype");
  if (!args.level.empty()) refused.push_back("--level");
  if (args.repeats) refused.push_back("--repeats");
  if (args.warmup) refused.push_back("--warmup");
  if (args.seed) refused.push_back("--seed");
  if (args.no_causal) refused.push_back("--no-causal");
  if (!refused.empty())
    throw BenchConfigError("--check takes the plugins, shape, dtype, seed and mask from the case; " +
                           refused.front() + " does not apply to it" +
                           (refused.size() > 1 ? " (nor " + std::to_string(refused.size() - 1) + " more)" : ""));
  if (args.threads.size() > 1) throw BenchConfigError("--check runs at one thread count: give --threads once");
  CheckConfig c;
  c.suite = args.check;
  c.case_name = args.case_name;
  if (!args.threads.empty()) c.threads = args.threads.front();
  if (args.gemm_size) c.gemm_size = *args.gemm_size;
  c.timeout_s = args.timeout;
  c.isolate = !args.no_isolation;
  if (args.max_memory) {
    try {
      c.max_memory = runner::parse_size(*args.max_memory);
    } catch (const std::invalid_argument& e) {
      throw BenchConfigError(std::string("--max-memory: ") + e.what());
    }
  }
  for (const auto& p : args.plugin_paths) c.plugin_paths.emplace_back(p);
  return run_check_bench(c, &std::cerr);
}

int run_command(const BenchArgs& args) {
  constexpr int kOk = 0, kUsage = 2, kPlugin = 3;
  try {
    if (!args.check.empty() || !args.case_name.empty() || args.timeout || args.no_isolation || args.max_memory) {
      if (args.check.empty())
        throw BenchConfigError(std::string(!args.case_name.empty() ? "--case"
                                           : args.timeout          ? "--timeout"
                                           : args.max_memory       ? "--max-memory"
                                                                   : "--no-isolation") +
                               " belongs to --check SUITE.yaml");
      const json result = check_mode(args);
      print_check_table(std::cout, result);
      if (!args.json_file.empty()) {
        std::ofstream f(args.json_file);
        if (!f) throw BenchConfigError("cannot write --json file " + args.json_file);
        f << result.dump(2) << "\n";
      }
      const std::string status = result["status"].get<std::string>();
      return status == "error" ? kPlugin : kOk;
    }
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
    if (!args.windows.empty()) {
      c.windows.clear();
      for (const auto& w : args.windows) c.windows.push_back(parse_window(w));
    }
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
  cmd->add_option("--check", args->check,
                  "time one case of a run SUITE (with --case) as `headgrad run` runs it, pass by pass: inputs, "
                  "each side, golden, baseline, comparison, analysis, reports; each run of the attention beside its "
                  "GEMM-bound time (its FLOPs at the sgemm/dgemm rate timed before and after) and the ratio")
      ->type_name("SUITE.yaml");
  cmd->add_option("--case", args->case_name, "the case of --check's suite (its full name, a sweep point's included)")
      ->type_name("NAME");
  cmd->add_option("--timeout", args->timeout, "with --check: seconds per run, instead of the case's timeout")
      ->type_name("SEC");
  cmd->add_flag("--no-isolation", args->no_isolation, "with --check: every run in this process, not in a child");
  cmd->add_option("--max-memory", args->max_memory,
                  "with --check: the memory budget the case's estimate must fit (4G, 512M; default: physical memory)")
      ->type_name("SIZE");
  cmd->add_option("--window", args->windows,
                  "a sliding window: query i sees keys i - L .. i + R (R default 0: with causal, L + 1 keys); "
                  "repeatable, `none` for no window: the windows take turns run by run, and each windowed row "
                  "gets its speed-up over the row without (--window none --window 255)")
      ->type_name("L[,R]|none")->allow_extra_args(false);
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
      "HEADGRAD_NUM_THREADS sets the default thread count; HEADGRAD_HALF_CONVERT=scalar keeps the\n"
      "16-bit conversions on their scalar loops (the JSON's environment.half_convert names the loops in use);\n"
      "HEADGRAD_BF16_GEMM=float32 multiplies bfloat16 on float32 upcasts instead of the CPU's bfloat16\n"
      "dot products (environment.bf16_products says which ran). Where the CPU has AVX-512F nearly every\n"
      "float32 product runs on headgrad's packed kernel (environment.float32_products); the sgemm/dgemm\n"
      "yardstick is always the BLAS's own.\n"
      "Exit codes: 0 ok; 2 bad usage or config; 3 a plugin missing or failing.\n\n"
      "--check SUITE.yaml --case NAME: the case's verdict and a table of its passes (wall s, compute s in the\n"
      "child, GFLOP of one forward + backward at the case's shape, counted causal-useful, GEMM-bound s, ratio,\n"
      "peak RSS and peak tensor MiB of the run); --threads N (once) and --gemm-size apply, the case gives the rest.\n"
      "Exit code with --check: 0 whatever the verdict (it is printed), 3 when a plugin could not run.\n\n"
      "Example: headgrad bench configs/bench.yaml --threads 1 --json bench.json\n"
      "         headgrad bench --check configs/llama3_8b.yaml --case llama3-8b-layer-T2048 --json check.json");
  cmd->callback([args, &exit_code] { exit_code = run_command(*args); });
}

}  // namespace headgrad::bench
