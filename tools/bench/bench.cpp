// headgrad bench: see bench.hpp.
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H.
#include "bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>

#include <CLI/CLI.hpp>
#include <headgrad/blas.hpp>
#include <headgrad/loader.hpp>
#include <headgrad/parallel.hpp>
#include <runner/budget.hpp>
#include <yaml-cpp/yaml.h>

namespace headgrad::bench {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<std::string> default_plugins() { return {"batched", "per_head", "fused_sdpa"}; }

DType parse_dtype(const std::string& name) {
  if (name == "float32") return DType::float32;
  if (name == "float64") return DType::float64;
  throw BenchConfigError("dtype '" + name + "' is not float32 or float64");
}

void validate(const BenchConfig& c) {
  if (c.level != "mha" && c.level != "core")
    throw BenchConfigError("level '" + c.level + "' is not mha or core");
  if (c.plugins.empty()) throw BenchConfigError("no plugin to run");
  if (c.shapes.empty()) throw BenchConfigError("no shape to run (give a SUITE.yaml or --shape B,T,D,H)");
  if (c.dtypes.empty()) throw BenchConfigError("no dtype to run");
  if (c.threads.empty()) throw BenchConfigError("no thread count to run");
  for (int t : c.threads)
    if (t < 1) throw BenchConfigError("threads must be >= 1, got " + std::to_string(t));
  if (c.repeats < 1) throw BenchConfigError("repeats must be >= 1, got " + std::to_string(c.repeats));
  if (c.warmup < 0) throw BenchConfigError("warmup must be >= 0, got " + std::to_string(c.warmup));
  if (c.gemm_size < 1)
    throw BenchConfigError("gemm_size must be >= 1, got " + std::to_string(c.gemm_size));
  for (const auto& s : c.shapes) {
    if (s.B < 1 || s.T < 1 || s.D < 1 || s.H < 1)
      throw BenchConfigError("shape " + s.str() + ": every size must be >= 1");
    if (s.D % s.H != 0)
      throw BenchConfigError("shape " + s.str() + ": D must be divisible by H");
    // Refused before anything is allocated; without score buffers, so a shape
    // only a fused plugin can hold still runs (the others then report an error row).
    const runner::AttentionDims dims{c.level == "mha", double(s.B), double(s.H), double(s.T),
                                     double(s.T),      double(s.D / s.H), double(s.D), false};
    const runner::MemoryBudget budget = runner::memory_budget(std::nullopt);
    for (DType dtype : c.dtypes)
      if (const double need = runner::attention_bytes(dims, double(dtype_size(dtype))); need > budget.bytes)
        throw BenchConfigError("shape " + s.str() + " in " + std::string(dtype_name(dtype)) + " needs about " +
                               runner::format_bytes(need) + " for its inputs, outputs and gradients alone, more "
                               "than the " + runner::format_bytes(budget.bytes) + " of " + budget.source);
  }
}

// ---------------------------------------------------------------- inputs

// Leaves and the loss weights of one case, made once from the seed.
struct CaseInputs {
  std::vector<Variable> leaves;  // mha: x, wq, wk, wv, wo; core: q, k, v
  Tensor r;                      // out's shape
};

CaseInputs make_case_inputs(const BenchShape& s, DType dtype, const std::string& level,
                            std::uint64_t seed) {
  Generator gen(seed);
  CaseInputs in;
  const std::int64_t d = s.D / s.H;
  if (level == "mha") {
    in.leaves.emplace_back(randn({s.B, s.T, s.D}, dtype, gen), true);
    const double w_std = 1.0 / std::sqrt(static_cast<double>(s.D));
    for (int i = 0; i < 4; ++i) in.leaves.emplace_back(randn({s.D, s.D}, dtype, gen, w_std), true);
    in.r = randn({s.B, s.T, s.D}, dtype, gen);
  } else {
    for (int i = 0; i < 3; ++i) in.leaves.emplace_back(randn({s.B, s.H, s.T, d}, dtype, gen), true);
    in.r = randn({s.B, s.H, s.T, d}, dtype, gen);
  }
  return in;
}

Variable run_forward(const Attention& a, const CaseInputs& in, const AttentionSpec& spec,
                     const std::string& level) {
  const auto& l = in.leaves;
  if (level == "mha") return a.mha_forward(l[0], MhaWeights{l[1], l[2], l[3], l[4]}, spec);
  return a.core_forward(l[0], l[1], l[2], spec);
}

// ---------------------------------------------------------------- GEMM

// Median GFLOP/s of C = A B, all [n, n], through the same BLAS the engine uses.
json time_gemm(DType dtype, std::int64_t n, int threads) {
  const Shape shape{n, n};
  Tensor a = Tensor::empty(shape, dtype), b = Tensor::empty(shape, dtype), c = Tensor::empty(shape, dtype);
  std::vector<double> ms;
  dispatch_float(dtype, "gemm", [&]<class T>() {
    T* pa = a.mutable_data<T>();
    T* pb = b.mutable_data<T>();
    for (std::int64_t i = 0; i < n * n; ++i) {
      pa[i] = static_cast<T>((i % 7) * 0.125 - 0.375);
      pb[i] = static_cast<T>((i % 5) * 0.25 - 0.5);
    }
    auto once = [&] { blas::gemm(false, false, n, n, n, T{1}, pa, n, pb, n, T{0}, c.mutable_data<T>(), n); };
    once();  // warm-up: pages touched, BLAS buffers made
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = Clock::now();
      once();
      ms.push_back(ms_since(t0));
    }
  });
  const double med = median(ms);
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  return json{{"dtype", std::string(dtype_name(dtype))},
              {"threads", threads},
              {"size", n},
              {"routine", dtype == DType::float32 ? "sgemm" : "dgemm"},
              {"ms", med},
              {"gflops", flops / (med * 1e6)}};
}

// ---------------------------------------------------------------- one case

std::string capability_gap(const Capabilities& caps, DType dtype, const std::string& level,
                           bool causal) {
  if (level == "mha" && !caps.mha) return "no mha level";
  if (level == "core" && !caps.core) return "no core level";
  if (dtype == DType::float32 && !caps.float32) return "no float32";
  if (dtype == DType::float64 && !caps.float64) return "no float64";
  if (causal && !caps.causal) return "no causal mask";
  return "";
}

json run_case(const LoadedPlugin& plugin, const BenchShape& s, DType dtype, int threads,
              const BenchConfig& c, double gemm_gflops) {
  json row{{"plugin", plugin.info.name},
           {"level", c.level},
           {"shape", {{"B", s.B}, {"T", s.T}, {"D", s.D}, {"H", s.H}}},
           {"dtype", std::string(dtype_name(dtype))},
           {"threads", threads},
           {"causal", c.causal},
           {"repeats", c.repeats},
           {"warmup", c.warmup}};
  if (const std::string gap = capability_gap(plugin.info.capabilities, dtype, c.level, c.causal);
      !gap.empty()) {
    row["skipped"] = gap;
    return row;
  }
  AttentionSpec spec;
  spec.d_model = s.D;
  spec.num_heads = s.H;
  spec.causal = c.causal;
  CaseInputs in = make_case_inputs(s, dtype, c.level, c.seed);
  const Attention& a = *plugin.attention;
  const Variable r(in.r);

  auto fwd_once = [&] {
    const auto t0 = Clock::now();
    Variable out = run_forward(a, in, spec, c.level);
    const double ms = ms_since(t0);
    return ms;  // the graph is freed after the clock stops
  };
  auto fwdbwd_once = [&] {
    for (auto& leaf : in.leaves) leaf.zero_grad();
    const auto t0 = Clock::now();
    {
      Variable loss = sum(mul(run_forward(a, in, spec, c.level), r));
      loss.backward();
    }
    return ms_since(t0);  // includes freeing the graph: part of every training step
  };

  for (int i = 0; i < c.warmup; ++i) fwdbwd_once();
  std::vector<double> fwd, fwdbwd;
  for (int i = 0; i < c.repeats; ++i) fwd.push_back(fwd_once());
  for (int i = 0; i < c.repeats; ++i) fwdbwd.push_back(fwdbwd_once());

  // Peak extra memory of one forward + backward: live tensor bytes above what
  // the inputs already hold (gradients of the leaves included).
  for (auto& leaf : in.leaves) leaf.zero_grad();
  const MemoryStats before = memory_stats();
  reset_peak_memory();
  fwdbwd_once();
  const MemoryStats after = memory_stats();
  for (auto& leaf : in.leaves) leaf.zero_grad();

  const Flops f = count_flops(s, c.level);
  const double fwd_ms = median(fwd), fwdbwd_ms = median(fwdbwd);
  const double gf_fwd = f.fwd_dense / (fwd_ms * 1e6);
  const double gf_fb = 3 * f.fwd_dense / (fwdbwd_ms * 1e6);
  const double gf_fb_causal = 3 * f.fwd_causal / (fwdbwd_ms * 1e6);
  row["fwd_ms"] = fwd_ms;
  row["fwd_min_ms"] = *std::min_element(fwd.begin(), fwd.end());
  row["fwdbwd_ms"] = fwdbwd_ms;
  row["fwdbwd_min_ms"] = *std::min_element(fwdbwd.begin(), fwdbwd.end());
  row["fwd_samples_ms"] = fwd;
  row["fwdbwd_samples_ms"] = fwdbwd;
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
  return row;
}

// ---------------------------------------------------------------- environment

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown";
}

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
              {"OPENBLAS_CORETYPE", env_or_null("OPENBLAS_CORETYPE")},
              {"allocator", std::string(allocator_name())},
              {"HEADGRAD_ALLOCATOR", env_or_null("HEADGRAD_ALLOCATOR")},
              {"MALLOC_MMAP_THRESHOLD_", env_or_null("MALLOC_MMAP_THRESHOLD_")},
              {"MALLOC_TRIM_THRESHOLD_", env_or_null("MALLOC_TRIM_THRESHOLD_")},
              {"MALLOC_TOP_PAD_", env_or_null("MALLOC_TOP_PAD_")}};
}

// ---------------------------------------------------------------- the table

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

std::string BenchShape::str() const {
  return "(" + std::to_string(B) + "," + std::to_string(T) + "," + std::to_string(D) + "," +
         std::to_string(H) + ")";
}

BenchShape parse_shape(const std::string& text) {
  std::string t;
  for (char ch : text)
    if (ch != '(' && ch != ')' && ch != ' ') t += ch;
  BenchShape s;
  std::int64_t* dst[] = {&s.B, &s.T, &s.D, &s.H};
  std::stringstream ss(t);
  std::string part;
  int i = 0;
  while (std::getline(ss, part, ',')) {
    if (i >= 4) break;
    try {
      std::size_t used = 0;
      *dst[i] = std::stoll(part, &used);
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      throw BenchConfigError("shape '" + text + "': '" + part + "' is not an integer");
    }
    ++i;
  }
  if (i != 4 || std::getline(ss, part, ','))
    throw BenchConfigError("shape '" + text + "' is not B,T,D,H (four integers)");
  return s;
}

Flops count_flops(const BenchShape& s, const std::string& level) {
  const double B = static_cast<double>(s.B), T = static_cast<double>(s.T),
               D = static_cast<double>(s.D);
  const double proj = level == "mha" ? 4 * 2 * B * T * D * D : 0.0;
  Flops f;
  f.fwd_dense = proj + 2 * 2 * B * T * T * D;
  f.fwd_causal = proj + 2 * 2 * B * D * T * (T + 1) / 2;
  return f;
}

BenchConfig load_bench_config(const std::filesystem::path& file) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(file.string());
  } catch (const YAML::Exception& e) {
    throw BenchConfigError(file.string() + ": " + e.what());
  }
  if (!root.IsMap()) throw BenchConfigError(file.string() + ": expected a mapping of bench keys");
  const std::set<std::string> known{"bench", "description", "level", "causal", "plugins",
                                    "shapes", "dtypes", "threads", "repeats", "warmup",
                                    "gemm_size", "seed"};
  BenchConfig c;
  auto where = [&](const YAML::Node& n) {
    return file.string() + ":" + std::to_string(n.Mark().line + 1) + ":" +
           std::to_string(n.Mark().column + 1) + ": ";
  };
  try {
    for (const auto& kv : root) {
      const std::string key = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      if (!known.count(key))
        throw BenchConfigError(where(kv.first) + "unknown key '" + key + "'");
      auto list = [&](auto fn) {
        if (!v.IsSequence()) throw BenchConfigError(where(v) + "'" + key + "' must be a list");
        for (const auto& item : v) fn(item);
      };
      if (key == "level") c.level = v.as<std::string>();
      else if (key == "causal") c.causal = v.as<bool>();
      else if (key == "repeats") c.repeats = v.as<int>();
      else if (key == "warmup") c.warmup = v.as<int>();
      else if (key == "gemm_size") c.gemm_size = v.as<std::int64_t>();
      else if (key == "seed") c.seed = v.as<std::uint64_t>();
      else if (key == "plugins") {
        c.plugins.clear();
        list([&](const YAML::Node& n) { c.plugins.push_back(n.as<std::string>()); });
      } else if (key == "dtypes") {
        c.dtypes.clear();
        list([&](const YAML::Node& n) {
          try {
            c.dtypes.push_back(parse_dtype(n.as<std::string>()));
          } catch (const BenchConfigError& e) {
            throw BenchConfigError(where(n) + e.what());
          }
        });
      } else if (key == "threads") {
        c.threads.clear();
        list([&](const YAML::Node& n) { c.threads.push_back(n.as<int>()); });
      } else if (key == "shapes") {
        list([&](const YAML::Node& n) {
          if (!n.IsMap()) throw BenchConfigError(where(n) + "a shape is {B: .., T: .., D: .., H: ..}");
          BenchShape s;
          for (const auto& dim : n) {
            const std::string k = dim.first.as<std::string>();
            const auto value = dim.second.as<std::int64_t>();
            if (k == "B") s.B = value;
            else if (k == "T") s.T = value;
            else if (k == "D") s.D = value;
            else if (k == "H") s.H = value;
            else throw BenchConfigError(where(dim.first) + "unknown shape key '" + k + "' (B, T, D, H)");
          }
          if (s.B < 1 || s.T < 1 || s.D < 1 || s.H < 1 || s.D % s.H != 0)
            throw BenchConfigError(where(n) + "shape " + s.str() +
                                   " needs B, T, D, H >= 1 with D divisible by H");
          c.shapes.push_back(s);
        });
      }
    }
  } catch (const YAML::Exception& e) {
    throw BenchConfigError(file.string() + ": " + e.what());
  }
  if (c.plugins.empty()) c.plugins = default_plugins();
  return c;
}

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
  for (DType dt : c.dtypes) cfg["dtypes"].push_back(std::string(dtype_name(dt)));
  for (const auto& s : c.shapes) cfg["shapes"].push_back({{"B", s.B}, {"T", s.T}, {"D", s.D}, {"H", s.H}});
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
             << threads << " thread(s): " << fmt("%.1f", gemm["gflops"].get<double>())
             << " GFLOP/s\n";
      const double gemm_gflops = gemm["gflops"].get<double>();
      if (result["gemm"].empty()) result["gemm_gflops"] = gemm_gflops;
      result["gemm"].push_back(gemm);
      for (const auto& shape : c.shapes) {
        for (const LoadedPlugin* p : plugins) {
          if (log)
            *log << "  " << p->info.name << " " << shape.str() << " " << dtype_name(dtype) << " x"
                 << threads << " ..." << std::flush;
          json row;
          try {
            // The machine's load may change during a run: each row is also
            // compared with a GEMM timed right before and right after it.
            const double before = time_gemm(dtype, c.gemm_size, threads)["gflops"].get<double>();
            row = run_case(*p, shape, dtype, threads, c, gemm_gflops);
            if (!row.contains("skipped")) {
              const double after = time_gemm(dtype, c.gemm_size, threads)["gflops"].get<double>();
              const double near = 0.5 * (before + after);
              row["gemm_gflops_adjacent"] = near;
              row["gemm_fraction_fwdbwd_adjacent"] = row["gflops_fwdbwd"].get<double>() / near;
            }
          } catch (const std::exception& e) {
            row = json{{"plugin", p->info.name},
                       {"level", c.level},
                       {"shape", {{"B", shape.B}, {"T", shape.T}, {"D", shape.D}, {"H", shape.H}}},
                       {"dtype", std::string(dtype_name(dtype))},
                       {"threads", threads},
                       {"error", e.what()}};
          }
          empty_cache();  // the next case starts from the same (empty) cache
          if (log) {
            if (row.contains("error")) *log << " error: " << row["error"].get<std::string>() << "\n";
            else if (row.contains("skipped")) *log << " skipped: " << row["skipped"].get<std::string>() << "\n";
            else
              *log << " fwd " << fmt("%.3f", row["fwd_ms"].get<double>()) << " ms, fwd+bwd "
                   << fmt("%.3f", row["fwdbwd_ms"].get<double>()) << " ms\n";
          }
          result["rows"].push_back(row);
        }
      }
    }
  }
  set_num_threads(threads_before);
  return result;
}

void print_table(std::ostream& out, const json& result) {
  const std::vector<std::string> head{"plugin", "shape (B,T,D,H)", "dtype", "thr",
                                      "fwd ms med", "fwd ms min", "fwd+bwd ms med",
                                      "fwd+bwd ms min", "GFLOP/s f+b", "of gemm",
                                      "GFLOP/s f+b causal", "of gemm", "of adj. gemm",
                                      "peak MiB"};
  std::vector<std::vector<std::string>> cells;
  for (const auto& r : result["rows"]) {
    const auto& s = r["shape"];
    std::vector<std::string> line{
        r["plugin"].get<std::string>(),
        "(" + std::to_string(s["B"].get<std::int64_t>()) + "," + std::to_string(s["T"].get<std::int64_t>()) +
            "," + std::to_string(s["D"].get<std::int64_t>()) + "," + std::to_string(s["H"].get<std::int64_t>()) + ")",
        r["dtype"].get<std::string>(), std::to_string(r["threads"].get<int>())};
    if (r.contains("error") || r.contains("skipped")) {
      line.push_back(r.contains("error") ? "error: " + r["error"].get<std::string>()
                                         : "skipped: " + r["skipped"].get<std::string>());
    } else {
      line.push_back(fmt("%.3f", r["fwd_ms"].get<double>()));
      line.push_back(fmt("%.3f", r["fwd_min_ms"].get<double>()));
      line.push_back(fmt("%.3f", r["fwdbwd_ms"].get<double>()));
      line.push_back(fmt("%.3f", r["fwdbwd_min_ms"].get<double>()));
      line.push_back(fmt("%.2f", r["gflops_fwdbwd"].get<double>()));
      line.push_back(fmt("%.2f", r["gemm_fraction_fwdbwd"].get<double>()));
      line.push_back(fmt("%.2f", r["gflops_fwdbwd_causal"].get<double>()));
      line.push_back(fmt("%.2f", r["gemm_fraction_fwdbwd_causal"].get<double>()));
      line.push_back(fmt("%.2f", r["gemm_fraction_fwdbwd_adjacent"].get<double>()));
      line.push_back(fmt("%.1f", static_cast<double>(r["peak_bytes"].get<std::size_t>()) / (1 << 20)));
    }
    cells.push_back(line);
  }
  std::vector<std::size_t> width(head.size());
  for (std::size_t i = 0; i < head.size(); ++i) width[i] = head[i].size();
  for (const auto& line : cells)
    for (std::size_t i = 0; i < line.size() && i < head.size(); ++i)
      if (line.size() == head.size()) width[i] = std::max(width[i], line[i].size());
  auto emit = [&](const std::vector<std::string>& line) {
    std::string text;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const bool left = i < 3;
      const std::size_t w = line.size() == head.size() || i < 4 ? width[i] : 0;
      std::string cell = line[i];
      if (cell.size() < w) cell = left ? cell + std::string(w - cell.size(), ' ')
                                       : std::string(w - cell.size(), ' ') + cell;
      text += (i ? "  " : "") + cell;
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out << text << "\n";
  };
  emit(head);
  for (const auto& line : cells) emit(line);
  out << "\n";
  for (const auto& g : result["gemm"])
    out << g["routine"].get<std::string>() << " " << g["size"].get<std::int64_t>() << "^3, "
        << g["threads"].get<int>() << " thread(s): " << fmt("%.2f", g["gflops"].get<double>())
        << " GFLOP/s (" << fmt("%.1f", g["ms"].get<double>()) << " ms)\n";
  const auto& env = result["environment"];
  out << "BLAS " << env["blas_library"].get<std::string>() << " "
      << env["blas_version"].get<std::string>() << " (kernels " << env["blas_kernel"].get<std::string>()
      << "), allocator "
      << env["allocator"].get<std::string>() << "\n";
  out << "FLOPs: projections 4 x 2BTD^2, core 2 x 2BT^2D dense (causal: T(T+1)/2 of T^2);"
         " backward = 2 x forward. 'of gemm' = GFLOP/s / the run's GEMM GFLOP/s\n"
         "(above); 'of adj. gemm' = the f+b GFLOP/s / the mean of GEMMs timed right before and after the row.\n";
}

// ---------------------------------------------------------------- command line

namespace {

struct BenchArgs {
  std::string suite, json_file, level;
  std::vector<std::string> plugins, shapes, dtypes, plugin_paths;
  std::vector<int> threads;
  std::optional<int> repeats, warmup;
  std::optional<std::int64_t> gemm_size;
  std::optional<std::uint64_t> seed;
  bool no_causal = false;
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
  cmd->add_option("--shape", args->shapes, "B,T,D,H (batch, sequence, model width, heads); repeatable")
      ->type_name("B,T,D,H")->allow_extra_args(false);
  cmd->add_option("--dtype", args->dtypes, "float32 or float64; repeatable (default float32)")
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
  cmd->add_option("--plugin-path", args->plugin_paths,
                  "a folder (searched recursively) or a plugin file; repeatable. Searched before "
                  "HEADGRAD_PLUGIN_PATH and the built or installed plugin folder")
      ->type_name("DIR")->allow_extra_args(false);
  cmd->footer(
      "\nFLOPs (stated in the output): projections 4 x 2BTD^2; core 2 x 2BT^2D dense, or\n"
      "causal-useful with T(T+1)/2 key pairs instead of T^2; backward = 2 x forward.\n"
      "GFLOP/s use the dense count unless the column says causal.\n"
      "Environment: HEADGRAD_ALLOCATOR=system bypasses the caching allocator;\n"
      "HEADGRAD_NUM_THREADS sets the default thread count.\n"
      "Exit codes: 0 ok; 2 bad usage or config; 3 a plugin missing or failing.\n\n"
      "Example: headgrad bench configs/bench.yaml --threads 1 --json bench.json");
  cmd->callback([args, &exit_code] { exit_code = run_command(*args); });
}

}  // namespace headgrad::bench
