// headgrad bench --check: one case of a suite run as `headgrad run` runs it,
// timed pass by pass, each pass beside its GEMM-bound time (bench.hpp).
//
// Shape legend: B batch, T sequence (Tq queries, Tk keys at the core level),
// D model width, H query heads, Hkv kv heads, d head width.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <headgrad/loader.hpp>
#include <headgrad/parallel.hpp>

#include "analysis/analyze.hpp"
#include "case/budget.hpp"
#include "judge/golden.hpp"
#include "bench.hpp"
#include "case/inputs.hpp"
#include "case/select.hpp"
#include "judge/run_case.hpp"
#include "pyplug/python_plugin.hpp"
#include "report/report.hpp"

namespace headgrad::bench {

using nlohmann::json;
using runner::CaseSpec;
using runner::Level;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::uint64_t own_peak_rss_bytes() {
  rusage ru{};
  return ::getrusage(RUSAGE_SELF, &ru) == 0 ? static_cast<std::uint64_t>(ru.ru_maxrss) * 1024 : 0;  // KiB
}

// Attended (query, key) pairs of one (batch, head) slice: every pair, or the
// causal ones (top-left: key j <= query i; bottom-right: j <= i + Tk - Tq).
double attended_pairs(const CaseSpec& c, double Tq, double Tk) {
  if (!c.causal || !c.mask_file.empty()) return Tq * Tk;
  const double shift = c.causal_alignment == CausalAlignment::bottom_right ? Tk - Tq : 0;
  double pairs = 0;
  for (double i = 0; i < Tq; ++i) pairs += std::clamp(i + shift + 1, 0.0, Tk);
  return pairs;
}

}  // namespace

CheckFlops count_check_flops(const CaseSpec& c) {
  const runner::Dims& dm = c.dims;
  CheckFlops f;
  if (c.level == Level::rope) return f;  // a rotation: no matrix product
  const double B = double(dm.B), H = double(dm.H), Hkv = double(dm.kv_heads()), d = double(dm.head_dim());
  const bool mha = c.level == Level::mha;
  const double Tq = mha ? double(dm.T) : double(dm.Tq), Tk = mha ? double(dm.T) : double(dm.Tk);
  if (mha) {
    const double D = double(dm.D);
    // x Wq^T [B*T, D] x [D, H*d], x Wk^T and x Wv^T [D, Hkv*d], merged heads Wo^T [H*d, D]
    f.projections = 2 * B * Tq * D * (H * d) + 2 * 2 * B * Tq * D * (Hkv * d) + 2 * B * Tq * (H * d) * D;
  }
  f.pairs = B * H * attended_pairs(c, Tq, Tk);
  f.dense_pairs = B * H * Tq * Tk;
  f.core = f.pairs * (2 * d + 2 * d);  // q . k and p v per attended pair
  f.fwd = f.projections + f.core;
  f.fwdbwd = 3 * f.fwd;
  f.causal_useful = c.causal && c.mask_file.empty();
  return f;
}

namespace {

// One pass's row.
json pass_row(const std::string& pass, const std::string& runs, double seconds) {
  return json{{"pass", pass}, {"runs", runs}, {"seconds", seconds}};
}

void add_side_figures(json& row, const runner::SideResult& s, double flops, DType dtype, double sgemm, double dgemm) {
  row["compute_seconds"] = s.compute_seconds;
  row["status"] = std::string(runner::side_status_name(s.status));
  if (!s.cause.empty()) row["cause"] = s.cause;
  row["peak_rss_bytes"] = s.peak_rss_bytes;
  row["peak_tensor_bytes"] = s.peak_tensor_bytes;
  row["flops"] = flops;
  const bool f64 = compute_dtype(dtype) == DType::float64;
  row["gemm_routine"] = f64 ? "dgemm" : "sgemm";
  const double rate = f64 ? dgemm : sgemm;
  row["gemm_gflops"] = rate;
  const double bound = flops / (rate * 1e9);
  row["gemm_bound_seconds"] = bound;
  if (bound > 0) {
    row["ratio"] = row["seconds"].get<double>() / bound;
    row["compute_ratio"] = s.compute_seconds / bound;
  }
}

json gemm_pair(std::int64_t n, int threads) {
  return json::array({time_gemm(DType::float32, n, threads), time_gemm(DType::float64, n, threads)});
}

}  // namespace

json run_check_bench(const CheckConfig& cfg, std::ostream* log) {
  if (cfg.gemm_size < 1) throw BenchConfigError("--gemm-size must be >= 1, got " + std::to_string(cfg.gemm_size));
  if (cfg.threads && *cfg.threads < 1)
    throw BenchConfigError("--threads must be >= 1, got " + std::to_string(*cfg.threads));
  if (cfg.timeout_s)
    if (const std::string p = runner::timeout_problem(*cfg.timeout_s); !p.empty())
      throw BenchConfigError("--timeout " + p);
  runner::Suite suite;
  try {
    suite = runner::load_suite(cfg.suite);
  } catch (const std::invalid_argument& e) {
    throw BenchConfigError(std::string("--check: ") + e.what());
  }
  std::string problem;
  const CaseSpec* found = runner::find_case(suite, cfg.case_name, cfg.suite.string(), &problem);
  if (!found) throw BenchConfigError("--case: " + problem);
  const CaseSpec& c = *found;
  {
    const runner::MemoryBudget budget = runner::memory_budget(cfg.max_memory);
    try {
      runner::check_memory({found}, budget.bytes, budget.source);
    } catch (const std::invalid_argument& e) {
      throw BenchConfigError(e.what());
    }
  }

  PluginRegistry registry;
  registry.load_directories(plugin_search_path(cfg.plugin_paths));
  for (const auto& d : suite.python_plugins) registry.add(pyplug::make_python_plugin(d));
  for (const auto& name : c.compare)
    if (!registry.find(name)) throw PluginMissing(runner::not_loaded_cause(name, registry));
  try {
    runner::check_capabilities({found}, registry);
    runner::check_goldens({found}, registry);
  } catch (const std::invalid_argument& e) {
    throw BenchConfigError(e.what());
  }

  // Threads: the sides' children read HEADGRAD_NUM_THREADS (set_num_threads(0)).
  if (cfg.threads) ::setenv("HEADGRAD_NUM_THREADS", std::to_string(*cfg.threads).c_str(), 1);
  const int threads_before = num_threads();
  set_num_threads(0);
  const int threads = num_threads();

  json result{{"tool", "headgrad bench --check"},
              {"environment", environment()},
              {"suite", cfg.suite.string()},
              {"case", c.name},
              {"describe", runner::describe_case(c)},
              {"compare", c.compare},
              {"dtype", std::string(dtype_name(c.dtype))},
              {"threads", threads},
              {"isolated", cfg.isolate},
              {"gemm_size", cfg.gemm_size}};
  if (c.is_reference()) result["reference"] = c.reference_text;

  if (log) *log << "gemm " << cfg.gemm_size << "^3 (sgemm, dgemm), " << threads << " thread(s) ..." << std::flush;
  const json before = gemm_pair(cfg.gemm_size, threads);
  if (log)
    *log << " " << printf_figure("%.1f", before[0]["gflops"].get<double>()) << ", "
         << printf_figure("%.1f", before[1]["gflops"].get<double>()) << " GFLOP/s\n"
         << "check " << c.name << " ..." << std::flush;

  runner::RunOptions options;
  options.isolate = cfg.isolate;
  options.timeout_s = cfg.timeout_s;
  runner::CasePasses passes;
  options.passes = &passes;
  const auto t0 = Clock::now();
  runner::CaseResult r = analysis::check_case(c, registry, options);
  const double check_s = seconds_since(t0);

  // The reports `run --json --junit --html` writes, made in memory (terminal included).
  const auto t_reports = Clock::now();
  std::size_t report_bytes = 0;
  {
    runner::SuiteResult sr;
    sr.name = suite.name;
    sr.file = suite.file;
    sr.identity = runner::suite_identity(suite, {found});
    sr.case_indices = {static_cast<std::size_t>(found - suite.cases.data())};
    sr.cases.push_back(r);
    sr.seconds = check_s;
    std::ostringstream term;
    const runner::TerminalStyle style = runner::terminal_style({found}, false, false, false);
    runner::print_case(term, r, style);
    runner::print_summary(term, sr, style);
    report_bytes = term.str().size() + runner::json_report(sr).dump(2).size() + runner::junit_report(sr).size() +
                   runner::html_report(sr).size();
  }
  const double reports_s = seconds_since(t_reports);
  const double total_s = seconds_since(t0);
  if (log) *log << " " << printf_figure("%.2f", total_s) << " s, " << runner::case_status_name(r.status) << "\n";

  if (log) *log << "gemm again ..." << std::flush;
  const json after = gemm_pair(cfg.gemm_size, threads);
  if (log) *log << " done\n";
  const double sgemm = 0.5 * (before[0]["gflops"].get<double>() + after[0]["gflops"].get<double>());
  const double dgemm = 0.5 * (before[1]["gflops"].get<double>() + after[1]["gflops"].get<double>());
  result["gemm"] = {{"sgemm_gflops", sgemm}, {"dgemm_gflops", dgemm}, {"before", before}, {"after", after}};

  const CheckFlops f = count_check_flops(c);
  result["flops"] = {{"projections_fwd", f.projections}, {"core_fwd", f.core},        {"fwd", f.fwd},
                     {"fwdbwd", f.fwdbwd},               {"attended_pairs", f.pairs}, {"dense_pairs", f.dense_pairs},
                     {"count", f.causal_useful ? "causal-useful" : "dense"}};
  result["status"] = std::string(runner::case_status_name(r.status));
  if (!r.cause.empty()) result["cause"] = r.cause;

  json rows = json::array();
  double accounted = 0, bound_total = 0;
  auto push = [&](json row) {
    accounted += row["seconds"].get<double>();
    if (row.contains("gemm_bound_seconds")) bound_total += row["gemm_bound_seconds"].get<double>();
    rows.push_back(std::move(row));
  };
  {
    json row = pass_row("inputs", (c.is_reference() ? "read from " + c.reference_text : std::string("seeded")) +
                                      ", " + std::string(dtype_name(c.dtype)), passes.inputs_s);
    push(row);
  }
  for (std::size_t i = 0; i < passes.sides.size(); ++i) {
    const auto& s = passes.sides[i];
    json row = pass_row("side " + std::to_string(i + 1), s.plugin + " in " + std::string(dtype_name(c.dtype)), s.seconds);
    add_side_figures(row, s, f.fwdbwd, c.dtype, sgemm, dgemm);
    push(row);
  }
  const char* oracle_pass[] = {"golden", "baseline"};
  double oracle_runs_s = 0;
  for (std::size_t i = 0; i < passes.oracle.size() && i < 2; ++i) {
    const auto& s = passes.oracle[i];
    const DType dt = i == 0 ? DType::float64 : c.dtype;
    json row = pass_row(oracle_pass[i], s.plugin + " in " + std::string(dtype_name(dt)), s.seconds);
    add_side_figures(row, s, f.fwdbwd, dt, sgemm, dgemm);
    oracle_runs_s += s.seconds;
    push(row);
  }
  if (!passes.oracle.empty())
    push(pass_row("oracle inputs", "the inputs converted to float64 and " + std::string(dtype_name(c.dtype)),
                  std::max(0.0, passes.oracle_s - oracle_runs_s)));
  {
    json row = pass_row("comparison", std::to_string(r.tensors.size()) + " tensors" +
                                          (r.spec.relative_rule() ? ", against golden and baseline" : ""),
                        passes.comparison_s);
    row["peak_rss_bytes"] = own_peak_rss_bytes();
    push(row);
  }
  push(pass_row("analysis", r.status == runner::CaseStatus::pass ? "none (passed)" : "diagnosis, localization, error maps",
                std::max(0.0, check_s - passes.run_case_s)));
  {
    json row = pass_row("reports", "terminal, JSON, JUnit, HTML in memory (" +
                                       printf_figure("%.1f", double(report_bytes) / 1024) + " KiB)",
                        reports_s);
    push(row);
  }
  push(pass_row("other", "plugin lookup, bookkeeping", std::max(0.0, total_s - accounted)));
  result["passes"] = rows;
  json total{{"seconds", total_s}, {"gemm_bound_seconds", bound_total}};
  if (bound_total > 0) total["ratio"] = total_s / bound_total;
  result["total"] = total;
  std::uint64_t peak = own_peak_rss_bytes();
  for (const auto& s : passes.sides) peak = std::max(peak, s.peak_rss_bytes);
  for (const auto& s : passes.oracle) peak = std::max(peak, s.peak_rss_bytes);
  result["peak_rss_bytes"] = peak;               // the largest process of the check
  result["parent_peak_rss_bytes"] = own_peak_rss_bytes();
  set_num_threads(threads_before);
  return result;
}

void print_check_table(std::ostream& out, const json& r) {
  out << "case " << r["case"].get<std::string>() << ": " << r["describe"].get<std::string>() << ": "
      << r["status"].get<std::string>() << "\n";
  if (r.contains("cause")) out << "  " << r["cause"].get<std::string>() << "\n";
  out << runner::join(r["compare"].get<std::vector<std::string>>(), " vs ") << ", " << r["threads"].get<int>()
      << " thread(s), " << (r["isolated"].get<bool>() ? "each run in its own child" : "not isolated") << "\n\n";
  const std::vector<std::string> head{"pass", "runs", "wall s", "compute s", "GFLOP", "GEMM-bound s", "ratio",
                                      "peak RSS MiB", "tensors MiB"};
  auto mib = [](const json& v) { return printf_figure("%.0f", double(v.get<std::uint64_t>()) / (1 << 20)); };
  // Two decimals at a real model's size, two significant digits at a toy's.
  auto fig = [](double v) { return printf_figure(v >= 0.1 || v == 0 ? "%.2f" : "%.2g", v); };
  std::vector<std::vector<std::string>> cells;
  for (const auto& p : r["passes"]) {
    std::vector<std::string> line{p["pass"].get<std::string>(), p["runs"].get<std::string>(),
                                  fig(p["seconds"].get<double>())};
    line.push_back(p.contains("compute_seconds") ? fig(p["compute_seconds"].get<double>()) : "-");
    line.push_back(p.contains("flops") ? fig(p["flops"].get<double>() / 1e9) : "-");
    line.push_back(p.contains("gemm_bound_seconds")
                       ? fig(p["gemm_bound_seconds"].get<double>()) + " (" +
                             p["gemm_routine"].get<std::string>() + ")"
                       : "-");
    line.push_back(p.contains("ratio") ? printf_figure("%.2f", p["ratio"].get<double>()) : "-");
    line.push_back(p.contains("peak_rss_bytes") ? mib(p["peak_rss_bytes"]) : "-");
    line.push_back(p.contains("peak_tensor_bytes") ? mib(p["peak_tensor_bytes"]) : "-");
    cells.push_back(line);
  }
  const auto& t = r["total"];
  cells.push_back({"total", "", fig(t["seconds"].get<double>()), "", "",
                   fig(t["gemm_bound_seconds"].get<double>()),
                   t.contains("ratio") ? printf_figure("%.2f", t["ratio"].get<double>()) : "-",
                   mib(r["peak_rss_bytes"]), ""});
  print_aligned(out, head, cells, 2);
  out << "\n";
  const auto& g = r["gemm"];
  for (const char* routine : {"sgemm", "dgemm"}) {
    const int i = std::string(routine) == "sgemm" ? 0 : 1;
    out << routine << " " << r["gemm_size"].get<std::int64_t>() << "^3, " << r["threads"].get<int>()
        << " thread(s): " << printf_figure("%.1f", g[std::string(routine) + "_gflops"].get<double>())
        << " GFLOP/s (before the check " << printf_figure("%.1f", g["before"][i]["gflops"].get<double>())
        << ", after " << printf_figure("%.1f", g["after"][i]["gflops"].get<double>()) << ")\n";
  }
  const auto& f = r["flops"];
  out << "GFLOP per forward + backward (3 x forward), " << f["count"].get<std::string>()
      << ": projections " << fig(3 * f["projections_fwd"].get<double>() / 1e9) << ", core "
      << fig(3 * f["core_fwd"].get<double>() / 1e9) << " (" 
      << printf_figure("%.0f", f["attended_pairs"].get<double>()) << " attended (query, key) pairs of "
      << printf_figure("%.0f", f["dense_pairs"].get<double>()) << ")\n"
      << "GEMM-bound s = GFLOP / the GEMM rate of the pass's compute dtype (sgemm for float32, bfloat16, float16;\n"
         "dgemm for float64), the mean of the GEMMs timed before and after the check; ratio = wall s / GEMM-bound s.\n"
         "peak RSS: getrusage's of the child a run ran in, else of this process so far ("
      << mib(r["parent_peak_rss_bytes"]) << " MiB at the end); tensors: the most bytes live tensors held during the run.\n";
  out << products_line(r["environment"]) << "\n";
}

}  // namespace headgrad::bench
