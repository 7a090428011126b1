#include "case/budget.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace headgrad::runner {

double attention_bytes(const AttentionDims& s, double element_size) {
  const double hd = s.H * s.d;                      // width of q and of the merged heads
  const double kv_hd = (s.Hkv > 0 ? s.Hkv : s.H) * s.d;  // width of k and v (Hkv heads)
  const double q = s.B * s.Tq * hd, kv = s.B * s.Tk * kv_hd;
  const double scores = s.B * (s.one_head_at_a_time ? 1 : s.H) * s.Tq * s.Tk;  // [B, H, Tq, Tk] or [B, Tq, Tk]
  double inputs, results, working;
  if (s.mha) {
    const double x = s.B * s.Tq * s.D, weights = 2 * s.D * hd + 2 * s.D * kv_hd;
    inputs = 2 * x + weights;                       // x, r, wq wk wv wo (a sliced layout adds little)
    results = x + x + weights;                      // out, dx, dwq..dwo
    // leaf grads; q, k, v, merged heads and their grads; k and v widened to H heads by a plugin that repeats them
    working = results + 2 * (q + 2 * kv + q) + (kv_hd < hd ? 4 * s.B * s.Tk * hd : 0);
  } else {
    inputs = 2 * q + 2 * kv;                        // q, r, k, v (a mask file counts as read)
    results = 2 * q + 2 * kv;                       // out, dq, dk, dv
    working = results;                              // the leaves' gradients
  }
  if (s.score_buffers) working += 4 * scores;       // scores, probabilities and their gradients
  // both sides' results, and the message one of them arrives in
  return element_size * (inputs + working + 3 * results);
}

MemoryBudget memory_budget(const std::optional<double>& max_memory) {
  if (max_memory) return {*max_memory, "--max-memory " + format_bytes(*max_memory)};
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  MemoryBudget budget{INFINITY, "unknown physical memory"};
  if (pages > 0 && page > 0) budget = {static_cast<double>(pages) * static_cast<double>(page), "physical memory"};
  struct rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      static_cast<double>(limit.rlim_cur) < budget.bytes)
    budget = {static_cast<double>(limit.rlim_cur), "the address-space limit, ulimit -v"};
  return budget;
}

double parse_size(std::string_view text) {
  const auto bad = [&] {
    return std::invalid_argument("size '" + std::string(text) +
                                 "' is not a positive size like 4G, 512M or 1000000 (bytes)");
  };
  double x = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
  if (ec != std::errc() || !std::isfinite(x) || x <= 0) throw bad();
  std::string unit(end, text.data() + text.size());
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();   // "GB"
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();   // "GiB" -> "G"
  double scale = 1;
  if (unit == "K") scale = 1024.0;
  else if (unit == "M") scale = 1024.0 * 1024;
  else if (unit == "G") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") throw bad();
  x *= scale;
  if (!std::isfinite(x) || x < 1) throw bad();
  return x;
}

std::string format_bytes(double bytes) {
  static const char* const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  char buf[48];
  if (!std::isfinite(bytes)) return "unlimited";
  double v = bytes;
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  if (v >= 1024) std::snprintf(buf, sizeof buf, "%.2g bytes", bytes);
  else if (u == 0) std::snprintf(buf, sizeof buf, "%.0f bytes", v);
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace headgrad::runner
