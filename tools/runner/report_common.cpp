// Formatting shared by every report.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <algorithm>

#include "runner/report.hpp"

namespace headgrad::runner {

std::string format_figure(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", x);
  return buf;
}

std::string format_value(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

std::string format_duration(double s) {
  char buf[32];
  if (s < 1.0) std::snprintf(buf, sizeof buf, "%.0f ms", s * 1000);
  else std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

std::string status_label(CaseStatus s) {
  switch (s) {
    case CaseStatus::pass: return "OK";
    case CaseStatus::fail: return "FAIL";
    case CaseStatus::error: return "ERROR";
    case CaseStatus::xfail: return "XFAIL";
    case CaseStatus::xpass: return "XPASS";
  }
  return "?";
}

std::string pair_label(const CaseResult& r) { return r.lhs_label + " vs " + r.rhs_label; }

std::string tensor_details(const TensorComparison& t, const CaseResult& r, std::size_t indent) {
  const std::string pad(indent, ' ');
  if (!t.problem.empty()) return pad + t.name + "  " + t.problem + "\n";
  std::string s = pad + t.name + "  max|Δ| " + format_figure(t.max_abs) + "  max rel " + format_figure(t.max_rel) +
                  "  allclose " + (t.allclose ? "ok" : "FAIL") + ": " + std::to_string(t.mismatched) + " of " +
                  std::to_string(t.numel) + " outside atol " + format_figure(t.tolerance.atol) + " + rtol " +
                  format_figure(t.tolerance.rtol) + " * |b|\n";
  if (t.worst) {
    s += pad + std::string(t.name.size() + 2, ' ') + (t.allclose ? "closest to the limit " : "worst ") +
         shape_str(t.worst->index) + " (" + t.worst->where + "): " + r.lhs_label + " " + format_value(t.worst->lhs) +
         " vs " + r.rhs_label + " " + format_value(t.worst->rhs) + "\n";
  }
  return s;
}

std::string case_details(const CaseResult& r, bool all, std::size_t indent) {
  std::string s;
  for (const auto& t : r.tensors)
    if (all || !t.allclose) s += tensor_details(t, r, indent);
  return s;
}

std::string analysis_details(const CaseResult& r, std::size_t indent) {
  const std::string pad(indent, ' ');
  std::string s;
  if (r.diagnosis) s += pad + "diagnosis: " + r.diagnosis->sentence + "\n";
  if (!r.localization) return s;
  const Localization& loc = *r.localization;
  if (!loc.where.empty()) s += pad + "where: " + loc.where + "\n";
  if (!loc.rows.empty()) {
    std::size_t w0 = 0, w1 = 0;
    for (const auto& row : loc.rows) {
      w0 = std::max(w0, row.change.size());
      w1 = std::max(w1, row.shape.size());
    }
    s += pad + "localization (the same pair, the same seed, one dim changed):\n";
    for (const auto& row : loc.rows) {
      const bool ok = row.status == CaseStatus::pass;
      std::string verdict = ok ? "passes" : row.status == CaseStatus::error ? "error " : "fails ";
      s += pad + "  " + row.change + std::string(w0 - row.change.size(), ' ') + "  " + row.shape +
           std::string(w1 - row.shape.size(), ' ') + "  " + verdict + "  max|Δ| " + format_figure(row.max_abs) +
           (row.status == CaseStatus::error ? "  " + row.cause : "") + "\n";
    }
  }
  if (!loc.sentence.empty()) s += pad + loc.sentence + "\n";
  return s;
}

namespace {

// Length of the valid UTF-8 sequence starting at text[i], or 0 if invalid.
std::size_t utf8_length(std::string_view text, std::size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(text[i + k]) >> 6) != 0x2) return 0;
  return n;
}

}  // namespace

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x80) {  // keep valid UTF-8, replace anything else with U+FFFD
      const std::size_t n = utf8_length(text, i);
      if (n == 0) {
        out += "\xEF\xBF\xBD";
      } else {
        out.append(text.substr(i, n));
        i += n - 1;
      }
      continue;
    }
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      case '\n': out += "&#10;"; break;
      case '\r': out += "&#13;"; break;
      case '\t': out += "&#9;"; break;
      default:
        if (c < 0x20 || c == 0x7f) out += "\xEF\xBF\xBD";  // not allowed in XML 1.0: U+FFFD
        else out += ch;
    }
  }
  return out;
}

void write_report(const std::filesystem::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (out) out << text;
  if (!out || !out.flush())
    throw std::runtime_error("cannot write " + file.string() + ": " + std::strerror(errno));
}

}  // namespace headgrad::runner
