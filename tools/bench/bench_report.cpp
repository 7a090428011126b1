// headgrad bench, the report: the aligned table of a run (bench.hpp).
#include <algorithm>
#include <cstdio>

#include "bench.hpp"

namespace headgrad::bench {

using nlohmann::json;

std::string printf_figure(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

void print_aligned(std::ostream& out, const std::vector<std::string>& head,
                   const std::vector<std::vector<std::string>>& rows, std::size_t left_columns,
                   std::size_t padded_in_short_rows) {
  std::vector<std::size_t> width(head.size());
  for (std::size_t i = 0; i < head.size(); ++i) width[i] = head[i].size();
  for (const auto& line : rows)
    if (line.size() == head.size())
      for (std::size_t i = 0; i < line.size(); ++i) width[i] = std::max(width[i], line[i].size());
  auto emit = [&](const std::vector<std::string>& line) {
    std::string text;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const std::size_t w = line.size() == head.size() || i < padded_in_short_rows ? width[i] : 0;
      std::string cell = line[i];
      if (cell.size() < w) cell = i < left_columns ? cell + std::string(w - cell.size(), ' ')
                                                   : std::string(w - cell.size(), ' ') + cell;
      text += (i ? "  " : "") + cell;
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out << text << "\n";
  };
  emit(head);
  for (const auto& line : rows) emit(line);
}

std::string products_line(const json& env) {
  return "BLAS " + env["blas_library"].get<std::string>() + " " + env["blas_version"].get<std::string>() +
         " (kernels " + env["blas_kernel"].get<std::string>() + "), float32 products on " +
         env["float32_products"].get<std::string>() + ", bfloat16 products " + env["bf16_products"].get<std::string>();
}

void print_table(std::ostream& out, const json& result) {
  const std::vector<std::string> head{"plugin", "shape (B,T,D,H[,Hkv])", "dtype", "thr", "window",
                                      "fwd ms med", "fwd ms min", "fwd+bwd ms med",
                                      "fwd+bwd ms min", "GFLOP/s f+b", "of gemm",
                                      "GFLOP/s f+b causal", "of gemm", "of adj. gemm",
                                      "peak MiB"};
  std::vector<std::vector<std::string>> cells;
  for (const auto& r : result["rows"]) {
    const auto& s = r["shape"];
    const BenchShape shape{s["B"].get<std::int64_t>(), s["T"].get<std::int64_t>(), s["D"].get<std::int64_t>(),
                           s["H"].get<std::int64_t>(), s.contains("Hkv") ? s["Hkv"].get<std::int64_t>() : 0};
    std::vector<std::string> line{r["plugin"].get<std::string>(), shape.str(), r["dtype"].get<std::string>(),
                                  std::to_string(r["threads"].get<int>()), window_str(row_window(r))};
    if (r.contains("error") || r.contains("skipped")) {
      line.push_back(r.contains("error") ? "error: " + r["error"].get<std::string>()
                                         : "skipped: " + r["skipped"].get<std::string>());
    } else {
      line.push_back(printf_figure("%.3f", r["fwd_ms"].get<double>()));
      line.push_back(printf_figure("%.3f", r["fwd_min_ms"].get<double>()));
      line.push_back(printf_figure("%.3f", r["fwdbwd_ms"].get<double>()));
      line.push_back(printf_figure("%.3f", r["fwdbwd_min_ms"].get<double>()));
      line.push_back(printf_figure("%.2f", r["gflops_fwdbwd"].get<double>()));
      line.push_back(printf_figure("%.2f", r["gemm_fraction_fwdbwd"].get<double>()));
      line.push_back(printf_figure("%.2f", r["gflops_fwdbwd_causal"].get<double>()));
      line.push_back(printf_figure("%.2f", r["gemm_fraction_fwdbwd_causal"].get<double>()));
      line.push_back(printf_figure("%.2f", r["gemm_fraction_fwdbwd_adjacent"].get<double>()));
      line.push_back(printf_figure("%.1f", static_cast<double>(r["peak_bytes"].get<std::size_t>()) / (1 << 20)));
    }
    cells.push_back(line);
  }
  print_aligned(out, head, cells, 3, 5);
  out << "\n";
  for (const auto& r : result["rows"])
    if (r.contains("speedup_vs_no_window")) {
      const auto& x = r["speedup_vs_no_window"];
      out << r["plugin"].get<std::string>() << " " << r["dtype"].get<std::string>() << " x"
          << r["threads"].get<int>() << " window " << window_str(row_window(r))
          << " against none: fwd+bwd " << printf_figure("%.2f", x["fwdbwd_ms"].get<double>()) << "x (median wall), "
          << printf_figure("%.2f", x["fwdbwd_cpu_ms"].get<double>()) << "x (median process CPU); fwd "
          << printf_figure("%.2f", x["fwd_ms"].get<double>()) << "x, "
          << printf_figure("%.2f", x["fwd_cpu_ms"].get<double>()) << "x\n";
    }
  for (const auto& g : result["gemm"])
    out << g["routine"].get<std::string>() << " " << g["size"].get<std::int64_t>() << "^3, "
        << g["threads"].get<int>() << " thread(s): " << printf_figure("%.2f", g["gflops"].get<double>())
        << " GFLOP/s (" << printf_figure("%.1f", g["ms"].get<double>()) << " ms)\n";
  const auto& env = result["environment"];
  out << products_line(env) << ", allocator " << env["allocator"].get<std::string>() << "\n";
  out << "FLOPs: projections (2 + 2 Hkv/H) x 2BTD^2, core 2 x 2BT^2D dense (causal: T(T+1)/2 of T^2);"
         " backward = 2 x forward. 'of gemm' = GFLOP/s / the run's GEMM GFLOP/s\n"
         "(above); 'of adj. gemm' = the f+b GFLOP/s / the mean of GEMMs timed right before and after the row.\n";
}

}  // namespace headgrad::bench
