// headgrad bench, the runs: the yardstick GEMM, each plugin x shape x dtype x
// thread count timed, the environment (bench.hpp).
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>

#include <headgrad/blas.hpp>
#include <headgrad/half_convert.hpp>
#include <headgrad/loader.hpp>
#include <headgrad/parallel.hpp>

#include "bench.hpp"
#include "case/inputs.hpp"

namespace headgrad::bench {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// CPU time of the whole process (every thread), ms: on a shared machine the
// wall clock also counts the time other jobs held the cores; this does not.
double process_cpu_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

// Wall and process CPU time of one call, ms. The CPU clock is read inside
// the wall clock's reads, so with one thread the CPU time cannot exceed the
// wall time by the reads' own cost (which ASan's clock_gettime interceptor
// makes larger).
struct Timed {
  double wall = 0, cpu = 0;
};
template <class F>
Timed timed(F&& f) {
  const auto t0 = Clock::now();
  const double c0 = process_cpu_ms();
  f();
  const double cpu = process_cpu_ms() - c0;
  return {ms_since(t0), cpu};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---------------------------------------------------------------- inputs

// Leaves and the loss weights of one case: the runner's seeded recipe
// (case/inputs.hpp), made once.
struct BenchInputs {
  std::vector<Variable> leaves;  // mha: x, wq, wk, wv, wo; core: q, k, v; then sinks [H] with --sinks
  Tensor r;                      // out's shape
};

BenchInputs bench_inputs(const BenchShape& s, DType dtype, const std::string& level, std::uint64_t seed,
                         bool sinks) {
  runner::Dims d;
  d.B = s.B;
  d.H = s.H;
  d.Hkv = s.Hkv;
  const bool mha = level == "mha";
  if (mha) {
    d.T = s.T;
    d.D = s.D;
  } else {
    d.Tq = d.Tk = s.T;
    d.d = s.D / s.H;
  }
  const runner::CaseInputs in =
      runner::seeded_inputs(mha ? runner::Level::mha : runner::Level::core, d, dtype, seed, false, {}, 0, sinks);
  BenchInputs out;
  for (const Tensor& t : mha ? std::vector<Tensor>{in.x, in.wq, in.wk, in.wv, in.wo} : std::vector<Tensor>{in.q, in.k, in.v})
    out.leaves.emplace_back(t, true);
  if (sinks) out.leaves.emplace_back(in.sinks, true);
  out.r = in.r;
  return out;
}

Variable run_forward(const Attention& a, const BenchInputs& in, const AttentionSpec& spec_in,
                     const std::string& level) {
  const auto& l = in.leaves;
  AttentionSpec spec = spec_in;
  const std::size_t own = level == "mha" ? 5 : 3;
  if (l.size() > own) spec.sinks = l[own];  // --sinks: the last leaf
  if (level == "mha") return a.mha_forward(l[0], MhaWeights{l[1], l[2], l[3], l[4]}, spec);
  return a.core_forward(l[0], l[1], l[2], spec);
}

}  // namespace

// ---------------------------------------------------------------- GEMM

// Median GFLOP/s of C = A B, all [n, n], on the BLAS the engine is built with
// (library_gemm: the BLAS's own rate, not headgrad's packed kernel, which
// gemm sends large float32 products to). 16-bit runs compute in float32, so
// their yardstick is sgemm.
json time_gemm(DType storage, std::int64_t n, int threads) {
  const DType dtype = compute_dtype(storage);
  const Shape shape{n, n};
  Tensor a = Tensor::empty(shape, dtype), b = Tensor::empty(shape, dtype), c = Tensor::empty(shape, dtype);
  std::vector<double> ms, cpu_ms;
  dispatch_float(dtype, "gemm", [&]<class T>() {
    T* pa = a.mutable_data<T>();
    T* pb = b.mutable_data<T>();
    for (std::int64_t i = 0; i < n * n; ++i) {
      pa[i] = static_cast<T>((i % 7) * 0.125 - 0.375);
      pb[i] = static_cast<T>((i % 5) * 0.25 - 0.5);
    }
    auto once = [&] { blas::library_gemm(false, false, n, n, n, T{1}, pa, n, pb, n, T{0}, c.mutable_data<T>(), n); };
    once();  // warm-up: pages touched, BLAS buffers made
    for (int rep = 0; rep < 3; ++rep) {
      const Timed t = timed(once);
      ms.push_back(t.wall);
      cpu_ms.push_back(t.cpu);
    }
  });
  const double med = median(ms), cpu_med = median(cpu_ms);
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  return json{{"dtype", std::string(dtype_name(dtype))},
              {"threads", threads},
              {"size", n},
              {"routine", dtype == DType::float32 ? "sgemm" : "dgemm"},
              {"ms", med},
              {"gflops", flops / (med * 1e6)},
              {"cpu_ms", cpu_med},  // process CPU time: with one thread, the rate an idle core gives
              {"gflops_cpu", flops / (cpu_med * 1e6)}};
}

namespace {

// ---------------------------------------------------------------- one case

// {"B", "T", "D", "H"}, and "Hkv" when the kv heads are grouped
// {"left": L, "right": R}, a bound null when unbounded
json window_json(const WindowSpec& w) {
  return {{"left", w.left ? json(*w.left) : json(nullptr)}, {"right", w.right ? json(*w.right) : json(nullptr)}};
}

json shape_json(const BenchShape& s) {
  json j{{"B", s.B}, {"T", s.T}, {"D", s.D}, {"H", s.H}};
  if (s.Hkv > 0 && s.Hkv != s.H) j["Hkv"] = s.Hkv;
  return j;
}

std::string capability_gap(const Capabilities& caps, DType dtype, const std::string& level,
                           bool causal, std::int64_t heads, std::int64_t kv_heads) {
  if (level == "mha" && !caps.mha) return "no mha level";
  if (level == "core" && !caps.core) return "no core level";
  if (dtype == DType::float32 && !caps.float32) return "no float32";
  if (dtype == DType::float64 && !caps.float64) return "no float64";
  if (is_16bit(dtype) && std::find(caps.extra.begin(), caps.extra.end(), dtype_name(dtype)) == caps.extra.end())
    return "no " + std::string(dtype_name(dtype));
  if (causal && !caps.causal) return "no causal mask";
  if (kv_heads < heads && !caps.grouped_kv) return "no grouped kv heads";
  return "";
}

// What a plugin lacks for --window, --softcap, --sinks ("" when nothing).
std::string feature_gap(const Capabilities& caps, const BenchConfig& c, const WindowSpec& window) {
  if (window.enabled() && !caps.window) return "no sliding window";
  if (c.softcap > 0 && !caps.softcap) return "no soft-capping";
  if (c.sinks && !caps.sinks) return "no sinks";
  return "";
}

// One plugin at one shape, dtype and thread count, timed under each window of
// the run: one row each. The windows take turns run by run (warm-up, then the
// forward repeats, then the forward + backward repeats, each round going
// through every window), so that a change of the machine's load falls on all
// of them alike and their ratios stay meaningful on a shared machine.
std::vector<json> time_cases(const LoadedPlugin& plugin, const BenchShape& s, DType dtype, int threads,
                             const BenchConfig& c, double gemm_gflops) {
  struct Timing {  // one window: its spec, its row and its samples
    AttentionSpec spec;
    std::size_t row = 0;
    std::vector<double> fwd, fwdbwd, fwd_cpu, fwdbwd_cpu;
  };
  std::vector<json> rows;
  std::vector<Timing> timings;
  for (const WindowSpec& window : c.windows) {
    json row{{"plugin", plugin.info.name},
             {"level", c.level},
             {"shape", shape_json(s)},
             {"dtype", std::string(dtype_name(dtype))},
             {"threads", threads},
             {"causal", c.causal},
             {"repeats", c.repeats},
             {"warmup", c.warmup}};
    if (window.enabled()) row["window"] = window_json(window);
    if (c.softcap > 0) row["softcap"] = c.softcap;
    if (c.sinks) row["sinks"] = true;
    std::string gap = capability_gap(plugin.info.capabilities, dtype, c.level, c.causal, s.H, s.kv_heads());
    if (gap.empty()) gap = feature_gap(plugin.info.capabilities, c, window);
    if (!gap.empty()) row["skipped"] = gap;
    rows.push_back(row);
    if (!gap.empty()) continue;
    Timing t;
    t.spec.d_model = s.D;
    t.spec.num_heads = s.H;
    t.spec.num_kv_heads = s.kv_heads();
    t.spec.causal = c.causal;
    t.spec.window = window;
    t.spec.softcap = c.softcap;
    t.row = rows.size() - 1;
    timings.push_back(t);
  }
  if (timings.empty()) return rows;

  BenchInputs in = bench_inputs(s, dtype, c.level, c.seed, c.sinks);  // the same for every window
  const Attention& a = *plugin.attention;
  const Variable r(in.r);
  auto fwd_once = [&](const AttentionSpec& spec) {
    Variable out;  // the graph is freed after the clock stops
    return timed([&] { out = run_forward(a, in, spec, c.level); });
  };
  auto fwdbwd_once = [&](const AttentionSpec& spec) {
    for (auto& leaf : in.leaves) leaf.zero_grad();
    return timed([&] {  // includes freeing the graph: part of every training step
      Variable loss = sum(mul(run_forward(a, in, spec, c.level), r));
      loss.backward();
    });
  };

  for (int i = 0; i < c.warmup; ++i)
    for (Timing& t : timings) fwdbwd_once(t.spec);
  for (int i = 0; i < c.repeats; ++i)
    for (Timing& t : timings) {
      const Timed once = fwd_once(t.spec);
      t.fwd.push_back(once.wall);
      t.fwd_cpu.push_back(once.cpu);
    }
  for (int i = 0; i < c.repeats; ++i)
    for (Timing& t : timings) {
      const Timed once = fwdbwd_once(t.spec);
      t.fwdbwd.push_back(once.wall);
      t.fwdbwd_cpu.push_back(once.cpu);
    }

  const Flops f = count_flops(s, c.level);
  for (const Timing& t : timings) {
    // Peak extra memory of one forward + backward: live tensor bytes above what
    // the inputs already hold (gradients of the leaves included).
    for (auto& leaf : in.leaves) leaf.zero_grad();
    const MemoryStats before = memory_stats();
    reset_peak_memory();
    fwdbwd_once(t.spec);
    const MemoryStats after = memory_stats();
    for (auto& leaf : in.leaves) leaf.zero_grad();

    json& row = rows[t.row];
    const double fwd_ms = median(t.fwd), fwdbwd_ms = median(t.fwdbwd);
    const double gf_fwd = f.fwd_dense / (fwd_ms * 1e6);
    const double gf_fb = 3 * f.fwd_dense / (fwdbwd_ms * 1e6);
    const double gf_fb_causal = 3 * f.fwd_causal / (fwdbwd_ms * 1e6);
    row["fwd_ms"] = fwd_ms;
    row["fwd_min_ms"] = *std::min_element(t.fwd.begin(), t.fwd.end());
    row["fwdbwd_ms"] = fwdbwd_ms;
    row["fwdbwd_min_ms"] = *std::min_element(t.fwdbwd.begin(), t.fwdbwd.end());
    // Process CPU time (every thread's): with one thread, the wall time less
    // what other jobs on a loaded machine took from it.
    row["fwd_cpu_ms"] = median(t.fwd_cpu);
    row["fwdbwd_cpu_ms"] = median(t.fwdbwd_cpu);
    row["fwd_samples_ms"] = t.fwd;
    row["fwdbwd_samples_ms"] = t.fwdbwd;
    row["flops"] = {{"fwd_dense", f.fwd_dense},
                    {"fwd_causal", f.fwd_causal},
                    {"fwdbwd_dense", 3 * f.fwd_dense},
                    {"fwdbwd_causal", 3 * f.fwd_causal}};
    row["gflops_fwd"] = gf_fwd;
    row["gflops_fwdbwd"] = gf_fb;
    row["gflops_fwdbwd_causal"] = gf_fb_causal;
    row["gemm_gflops"] = gemm_gflops;
    row["gemm_fraction_fwd"] = gf_fwd / gemm_gflops;
    row["gemm_fraction_fwdbwd"] = gf_fb / gemm_gflops;
    row["gemm_fraction_fwdbwd_causal"] = gf_fb_causal / gemm_gflops;
    row["peak_bytes"] = after.peak_bytes - before.current_bytes;
    row["peak_reserved_bytes"] = after.peak_reserved_bytes > before.reserved_bytes
                                     ? after.peak_reserved_bytes - before.reserved_bytes
                                     : 0;
  }
  return rows;
}

}  // namespace

// ---------------------------------------------------------------- environment

namespace {
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown";
}

}  // namespace

json environment() {
  auto env_or_null = [](const char* name) -> json {
    const char* v = std::getenv(name);
    return v ? json(v) : json(nullptr);
  };
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return json{{"cpu", cpu_model()},
              {"cores", static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN))},
              {"host", host},
              {"date", date},
              {"blas_library", blas::info().library},
              {"blas_version", blas::info().version},
              {"blas_kernel", blas::info().kernel},
              {"float32_products", blas::float32_products_info()},  // the packed kernel or the BLAS
              {"bf16_products", blas::bf16_products_info()},  // bfloat16 matmuls: oneDNN or float32 upcasts
              {"HEADGRAD_BF16_GEMM", env_or_null("HEADGRAD_BF16_GEMM")},
              {"OPENBLAS_CORETYPE", env_or_null("OPENBLAS_CORETYPE")},
              {"allocator", std::string(allocator_name())},
              {"HEADGRAD_ALLOCATOR", env_or_null("HEADGRAD_ALLOCATOR")},
              {"MALLOC_MMAP_THRESHOLD_", env_or_null("MALLOC_MMAP_THRESHOLD_")},
              {"MALLOC_TRIM_THRESHOLD_", env_or_null("MALLOC_TRIM_THRESHOLD_")},
              {"MALLOC_TOP_PAD_", env_or_null("MALLOC_TOP_PAD_")},
              {"half_convert", half_convert_paths()},  // the 16-bit conversion loops in use
              {"HEADGRAD_HALF_CONVERT", env_or_null("HEADGRAD_HALF_CONVERT")}};
}

Flops count_flops(const BenchShape& s, const std::string& level) {
  const double B = static_cast<double>(s.B), T = static_cast<double>(s.T),
               D = static_cast<double>(s.D);
  // Wq and Wo [D, D]; Wk and Wv [Hkv*d, D] = Hkv / H of that
  const double kv_share = static_cast<double>(s.kv_heads()) / static_cast<double>(s.H);
  const double proj = level == "mha" ? (2 + 2 * kv_share) * 2 * B * T * D * D : 0.0;
  Flops f;
  f.fwd_dense = proj + 2 * 2 * B * T * T * D;
  f.fwd_causal = proj + 2 * 2 * B * D * T * (T + 1) / 2;
  return f;
}

namespace {

// rows: one plugin's rows at one shape, dtype and thread count, one per
// window. Each windowed row gets the no-window row's time over its own
// (median wall and process CPU, forward and forward + backward), when the run
// timed both.
void add_window_speedups(json& rows) {
  const auto timed = [](const json& r) { return r.contains("fwdbwd_ms"); };
  const json* none = nullptr;
  for (const json& r : rows)
    if (!r.contains("window") && timed(r)) none = &r;
  if (!none) return;
  for (json& r : rows) {
    if (!r.contains("window") || !timed(r)) continue;
    json speedup;
    for (const char* key : {"fwd_ms", "fwd_cpu_ms", "fwdbwd_ms", "fwdbwd_cpu_ms"})
      speedup[key] = (*none)[key].get<double>() / r[key].get<double>();
    r["speedup_vs_no_window"] = speedup;
  }
}

}  // namespace

json run_bench(const BenchConfig& c, std::ostream* log) {
  validate(c);
  PluginRegistry registry;
  registry.load_directories(plugin_search_path(c.plugin_paths));
  std::vector<const LoadedPlugin*> plugins;
  for (const auto& name : c.plugins) {
    const LoadedPlugin* p = registry.find(name);
    if (!p) {
      std::string known, rejected;
      for (const auto& q : registry.plugins()) known += (known.empty() ? "" : ", ") + q.info.name;
      for (const auto& r : registry.rejections())
        rejected += "\n  rejected " + r.file.string() + ": " + r.reason;
      throw PluginMissing("plugin '" + name + "' not found (known: " +
                          (known.empty() ? "none" : known) + ")" + rejected);
    }
    plugins.push_back(p);
  }

  json result{{"tool", "headgrad bench"}, {"environment", environment()}};
  json cfg{{"level", c.level}, {"causal", c.causal}, {"repeats", c.repeats},
           {"warmup", c.warmup}, {"gemm_size", c.gemm_size}, {"seed", c.seed},
           {"plugins", c.plugins}, {"threads", c.threads}};
  for (const WindowSpec& w : c.windows) cfg["windows"].push_back(w.enabled() ? window_json(w) : json(nullptr));
  if (c.windows.size() == 1 && c.windows[0].enabled()) cfg["window"] = window_json(c.windows[0]);
  if (c.softcap > 0) cfg["softcap"] = c.softcap;
  if (c.sinks) cfg["sinks"] = true;
  for (DType dt : c.dtypes) cfg["dtypes"].push_back(std::string(dtype_name(dt)));
  for (const auto& s : c.shapes) cfg["shapes"].push_back(shape_json(s));
  result["config"] = cfg;
  result["rows"] = json::array();
  result["gemm"] = json::array();

  const int threads_before = num_threads();
  for (DType dtype : c.dtypes) {
    for (int threads : c.threads) {
      set_num_threads(threads);
      json gemm = time_gemm(dtype, c.gemm_size, threads);
      if (log)
        *log << "gemm " << gemm["routine"].get<std::string>() << " " << c.gemm_size << "^3, "
             << threads << " thread(s): " << printf_figure("%.1f", gemm["gflops"].get<double>())
             << " GFLOP/s\n";
      const double gemm_gflops = gemm["gflops"].get<double>();
      if (result["gemm"].empty()) result["gemm_gflops"] = gemm_gflops;
      result["gemm"].push_back(gemm);
      for (const auto& shape : c.shapes) {
        for (const LoadedPlugin* p : plugins) {
          if (log)
            *log << "  " << p->info.name << " " << shape.str() << " " << dtype_name(dtype) << " x" << threads
                 << " ..." << std::flush;
          std::vector<json> rows;
          try {
            // The machine's load may change during a run: each row is also
            // compared with a GEMM timed right before and right after its
            // plugin's windows.
            const json before = time_gemm(dtype, c.gemm_size, threads);
            rows = time_cases(*p, shape, dtype, threads, c, gemm_gflops);
            const json after = time_gemm(dtype, c.gemm_size, threads);
            const double near = 0.5 * (before["gflops"].get<double>() + after["gflops"].get<double>());
            for (json& row : rows) {
              if (row.contains("skipped")) continue;
              row["gemm_gflops_adjacent"] = near;
              row["gemm_gflops_cpu_adjacent"] =
                  0.5 * (before["gflops_cpu"].get<double>() + after["gflops_cpu"].get<double>());
              row["gemm_fraction_fwdbwd_adjacent"] = row["gflops_fwdbwd"].get<double>() / near;
            }
          } catch (const std::exception& e) {
            rows.clear();
            for (const WindowSpec& window : c.windows) {
              json row{{"plugin", p->info.name},
                       {"level", c.level},
                       {"shape", shape_json(shape)},
                       {"dtype", std::string(dtype_name(dtype))},
                       {"threads", threads},
                       {"error", e.what()}};
              if (window.enabled()) row["window"] = window_json(window);
              rows.push_back(row);
            }
          }
          empty_cache();  // the next case starts from the same (empty) cache
          json group = rows;
          add_window_speedups(group);
          for (const json& row : group) {
            if (log) {
              *log << (c.windows.size() > 1 ? "\n    window " + window_str(row_window(row)) + ":" : "");
              if (row.contains("error")) *log << " error: " << row["error"].get<std::string>();
              else if (row.contains("skipped")) *log << " skipped: " << row["skipped"].get<std::string>();
              else
                *log << " fwd " << printf_figure("%.3f", row["fwd_ms"].get<double>()) << " ms, fwd+bwd "
                     << printf_figure("%.3f", row["fwdbwd_ms"].get<double>()) << " ms";
            }
            result["rows"].push_back(row);
          }
          if (log) *log << "\n";
        }
      }
    }
  }
  set_num_threads(threads_before);
  return result;
}

}  // namespace headgrad::bench
