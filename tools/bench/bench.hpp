// headgrad bench: how fast each attention plugin runs, forward and
// forward + backward, beside a plain GEMM timed in the same run.
//
//   headgrad bench configs/bench.yaml --json bench.json
//   headgrad bench --plugin batched --plugin fused_sdpa --shape 1,4096,256,4 --threads 1
//
// For each plugin x shape x dtype x thread count (x window, the windows taking
// turns run by run): warm-up runs, then `repeats`
// timed runs of the forward alone and of forward + backward (loss =
// sum(out * R), R seeded), reported as median and minimum; GFLOP/s from the
// stated FLOP count; the engine's peak extra memory (memory_stats()); and each
// GFLOP/s figure as a fraction of a 2048^3 sgemm/dgemm timed with the same
// dtype and threads: once per dtype and thread count (the run's gemm_gflops),
// and again right before and after each row (gemm_gflops_adjacent), since the
// load of a shared machine may change during a run.
//
// FLOP counts (mha level, causal or not; a multiply-add is 2 FLOPs):
//   projections 4 x 2*B*T*D^2; core dense 2 x 2*B*T^2*D (scores and P V);
//   core causal-useful 2 x 2*B*D*T(T+1)/2 (only the keys j <= i);
//   backward = 2 x forward, forward + backward = 3 x forward.
// Core level counts the core alone. GFLOP/s figures use the dense count
// unless named *_causal.
//
// Files: bench_config.cpp (the YAML file, shapes, validation), bench_run.cpp
// (inputs, GEMM, timing, environment), bench_report.cpp (the table),
// bench_check.cpp (--check: one suite case timed pass by pass),
// bench_command.cpp (the subcommand's flags).
//
// --check SUITE.yaml --case NAME runs one case of a suite as `headgrad run`
// does (analysis::check_case: inputs, each side in its own child, the golden
// and baseline of relative_to_baseline, the comparison, the analysis of a
// failure) and then makes its reports (terminal, JSON, JUnit, HTML, in
// memory), timing each pass. Each run of the attention (a side, the golden,
// the baseline) is credited the FLOPs of one forward + backward of the case
// (count_check_flops: causal-useful for a causal case), and its GEMM-bound
// time is those FLOPs at the sgemm rate (float32, bfloat16, float16 compute in
// float32) or the dgemm rate (float64), each the mean of a gemm_size^3 GEMM
// timed at the run's thread count right before and right after the check.
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <headgrad/attention.hpp>
#include <headgrad/tensor.hpp>
#include <nlohmann/json.hpp>

namespace CLI {
class App;
}
namespace headgrad::runner {
struct CaseSpec;
}

namespace headgrad::bench {

// Bad YAML, bad flag value (exit 2).
class BenchConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct BenchShape {
  std::int64_t B = 0, T = 0, D = 0, H = 0;
  std::int64_t Hkv = 0;  // kv heads (GQA); 0 means H
  std::int64_t kv_heads() const { return Hkv > 0 ? Hkv : H; }
  std::string str() const;  // "(4,512,512,8)", "(1,2048,2048,32,8)" with Hkv
};

struct BenchConfig {
  std::vector<std::string> plugins;
  std::vector<BenchShape> shapes;
  std::vector<DType> dtypes{DType::float32};
  std::vector<int> threads{1};
  std::string level = "mha";  // mha | core
  bool causal = true;
  int repeats = 5;
  int warmup = 2;
  std::int64_t gemm_size = 2048;
  std::uint64_t seed = 0;
  std::vector<std::filesystem::path> plugin_paths;
  // Sliding windows, soft-cap, sinks (--window L[,R] or none, repeatable;
  // --softcap C, --sinks): FLOPs stay the dense (and causal) counts; a windowed
  // kernel shows as less time. A plugin's windows take turns run by run, and
  // a windowed row of a run that also has no window gets its speed-up over it.
  std::vector<WindowSpec> windows{WindowSpec{}};
  double softcap = 0;
  bool sinks = false;
};
// "L" or "L,R" (R omitted: 0, a causal window of L + 1 keys), or "none" (no
// window); throws BenchConfigError.
WindowSpec parse_window(const std::string& text);
// "L,R" as parse_window reads it ("-" for an unbounded side), "none" without a window.
std::string window_str(const WindowSpec& w);
// The window of a result row ({"window": {"left": L, "right": R}}; none without the key).
WindowSpec row_window(const nlohmann::json& row);

// Reads configs/bench.yaml-style files; throws BenchConfigError naming the key.
BenchConfig load_bench_config(const std::filesystem::path& file);
// "B,T,D,H" (also "(B,T,D,H)"); throws BenchConfigError.
BenchShape parse_shape(const std::string& text);
DType parse_dtype(const std::string& name);  // float32 | float64; throws BenchConfigError
std::vector<std::string> default_plugins();  // batched, per_head, fused_sdpa
// Throws BenchConfigError for the first setting out of range.
void validate(const BenchConfig& c);

struct Flops {
  double fwd_dense = 0, fwd_causal = 0;  // backward = 2x, forward + backward = 3x
};
Flops count_flops(const BenchShape& s, const std::string& level);

// Runs the whole configuration. Progress goes to `log` (stderr in the
// command); plugins that cannot be found make it throw PluginMissing.
class PluginMissing : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
nlohmann::json run_bench(const BenchConfig& config, std::ostream* log);

// The aligned table of a run_bench result.
void print_table(std::ostream& out, const nlohmann::json& result);
// "BLAS <library> <version> (kernels ...), float32 products on ..., bfloat16
// products ...": where a run's products ran, from its JSON's environment
// (both tables print it).
std::string products_line(const nlohmann::json& environment);
std::string printf_figure(const char* format, double v);  // printf_figure("%.3f", 1.5) == "1.500"
// head and rows as aligned columns, two spaces apart: the first left_columns
// left-aligned, the others right-aligned; widths from the full rows only, a
// shorter row (an error) padded in its first padded_in_short_rows cells.
void print_aligned(std::ostream& out, const std::vector<std::string>& head,
                   const std::vector<std::vector<std::string>>& rows, std::size_t left_columns,
                   std::size_t padded_in_short_rows = 0);


// ---- --check: one suite case, pass by pass (bench_check.cpp)

struct CheckConfig {
  std::filesystem::path suite;
  std::string case_name;
  std::optional<int> threads;        // HEADGRAD_NUM_THREADS for every run; default: as `run` (one case: all cores)
  std::int64_t gemm_size = 2048;
  std::optional<double> timeout_s;   // overrides the case's `timeout`
  bool isolate = true;
  std::optional<double> max_memory;  // bytes; default: physical memory (as `run --max-memory`)
  std::vector<std::filesystem::path> plugin_paths;
};

// FLOPs of one forward of a case (a multiply-add is 2 FLOPs), the way a
// perfect implementation would spend them; forward + backward = 3 x forward.
//   mha projections: 2*B*T*D*(H*d) (q) + 2 x 2*B*T*D*(Hkv*d) (k, v) + 2*B*T*(H*d)*D (out)
//   core: (2d + 2d) per attended (query, key) pair (q . k and p v), over B*H slices;
//   pairs per slice: Tq*Tk, or causal sum_i min(i + 1 + shift, Tk) (shift Tk - Tq
//   bottom-right, 0 top-left), T(T+1)/2 at Tq = Tk; a mask file counts dense.
//   rope level: 0 (no product).
struct CheckFlops {
  double projections = 0, core = 0, fwd = 0, fwdbwd = 0;
  double pairs = 0, dense_pairs = 0;  // attended and all (query, key) pairs over B*H slices
  bool causal_useful = false;
};
CheckFlops count_check_flops(const runner::CaseSpec& c);

// Throws BenchConfigError (no such case, bad value, a case the budget refuses)
// and PluginMissing.
nlohmann::json run_check_bench(const CheckConfig& config, std::ostream* log);
void print_check_table(std::ostream& out, const nlohmann::json& result);

// Shared with --check (bench_run.cpp): the n^3 GEMM yardstick of a dtype's
// compute type at `threads` (the caller has set them), and the machine.
nlohmann::json time_gemm(DType storage, std::int64_t n, int threads);
nlohmann::json environment();

// Registers `bench` on app; when it runs, exit_code is set (0 ok, 2 bad usage
// or config, 3 a plugin missing or failing).
void add_bench_command(CLI::App& app, int& exit_code);

}  // namespace headgrad::bench
