// Formatting shared by every report.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "report/report.hpp"

namespace fs = std::filesystem;

namespace headgrad::runner {

std::string format_figure(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", x);
  return buf;
}

std::string format_ratio(double x) {
  if (!std::isfinite(x) || x < 1e-2 || x >= 1e4) return format_figure(x);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", x);
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

std::string baseline_verdict(const BaselineCheck& b) {
  if (std::isnan(b.err)) return "NaN against the golden";
  if (b.ratio <= kAsAccurateRatio) return "as accurate as the oracle in this dtype";
  return format_ratio(b.ratio) + "x the oracle's own error in this dtype";
}

std::string baseline_details(const TensorComparison& t, const CaseResult& r, std::size_t indent) {
  const std::string pad(indent, ' ');
  const BaselineCheck& b = *t.baseline;
  const std::string under(t.name.size() + 2, ' ');
  std::string s = pad + t.name + "  " + b.side + " vs golden " + format_figure(b.err) + "  baseline " +
                  format_figure(b.baseline_err) + "  ratio " + format_ratio(b.ratio) + "  " +
                  (t.allclose ? "ok" : "FAIL") + ": " + std::to_string(t.mismatched) + " of " + std::to_string(t.numel) +
                  " outside " + format_figure(b.k) + " * baseline + floor " + format_figure(b.floor) + " = " +
                  format_figure(b.bound) + "\n";
  s += pad + under + "normwise ||Δ||/||golden|| " + format_figure(b.normwise) + " (baseline " +
       format_figure(b.baseline_normwise) + "): " + baseline_verdict(b) + "; golden " + r.golden_label +
       ", baseline " + r.baseline_label + "\n";
  s += pad + under + r.lhs_label + " vs " + r.rhs_label + " max|Δ| " + format_figure(t.max_abs) + "  max rel " +
       format_figure(t.max_rel) + "\n";
  return s;
}

std::string tensor_details(const TensorComparison& t, const CaseResult& r, std::size_t indent) {
  const std::string pad(indent, ' ');
  if (!t.problem.empty()) return pad + t.name + "  " + t.problem + "\n";
  if (t.baseline) return baseline_details(t, r, indent);
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
// Strict, as XML parsers are: no overlong forms, no surrogates (U+D800..DFFF),
// nothing past U+10FFFF.
std::size_t utf8_length(std::string_view text, std::size_t i, char32_t* code_point = nullptr) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char c = byte(0);
  std::size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  char32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
  for (std::size_t k = 1; k < n; ++k) {
    if ((byte(k) >> 6) != 0x2) return 0;
    cp = (cp << 6) | (byte(k) & 0x3F);
  }
  const bool overlong = (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
  if (overlong || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 0;
  if (code_point) *code_point = cp;
  return n;
}

thread_local std::size_t replacements = 0;  // by xml_escape on this thread (utf8_replacements)

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

std::string valid_utf8(std::string_view text, std::size_t* replaced) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_length(text, i);
    if (n == 0) {
      out += kReplacement;
      if (replaced) ++*replaced;
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string terminal_safe(std::string_view text, bool keep_newlines) {
  std::string out;
  out.reserve(text.size());
  char buf[16];
  for (std::size_t i = 0; i < text.size();) {
    char32_t cp = 0;
    const std::size_t n = utf8_length(text, i, &cp);
    if (n == 0) {  // an invalid byte, shown as its value
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(text[i]));
      out += buf;
      ++i;
      continue;
    }
    // Controls that could move the cursor, end a line, recolor or reorder the
    // text: C0 and DEL, C1, the Unicode line separators and bidi overrides.
    const bool control = cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 ||
                         (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
    if (!control || (keep_newlines && cp == '\n')) out.append(text.substr(i, n));
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else {
      std::snprintf(buf, sizeof buf, cp < 0x100 ? "\\x%02x" : "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    }
    i += n;
  }
  return out;
}

std::size_t utf8_replacements() { return replacements; }

std::string text_replaced_note(std::size_t count) {
  return std::to_string(count) + (count == 1 ? " input byte or character (in a name or message) was"
                                               : " input bytes or characters (in names or messages) were") +
         " replaced by U+FFFD: not valid UTF-8, or not allowed in XML";
}

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x80) {  // keep valid UTF-8, replace anything else with U+FFFD
      char32_t cp = 0;
      const std::size_t n = utf8_length(text, i, &cp);
      if (n == 0 || cp == 0xFFFE || cp == 0xFFFF) {  // the last two: not XML characters
        out += kReplacement;
        ++replacements;
        if (n > 0) i += n - 1;
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
        if (c < 0x20 || c == 0x7f) {  // not allowed in XML 1.0: U+FFFD
          out += kReplacement;
          ++replacements;
        } else {
          out += ch;
        }
    }
  }
  return out;
}

namespace {

// A temporary name in the same folder as `file` (so rename is atomic), created
// exclusively so two runs never share one; the umask applies as to the file.
fs::path create_temporary(const fs::path& file) {
  static std::atomic<unsigned> counter{0};
  const fs::path folder = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  for (int attempt = 0;; ++attempt) {
    fs::path tmp = folder / ("." + file.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                             std::to_string(counter++));
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      ::close(fd);
      return tmp;
    }
    if (errno != EEXIST || attempt > 100)
      throw std::runtime_error("cannot write " + file.string() + ": " + std::strerror(errno));
  }
}

void write_text(const fs::path& tmp, const fs::path& file, const std::string& text) {
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (out) out << text;
  if (!out || !out.flush()) throw std::runtime_error("cannot write " + file.string() + ": " + std::strerror(errno));
}

}  // namespace

void write_file_atomically(const fs::path& file, const std::function<void(const fs::path&)>& write) {
  const fs::path tmp = create_temporary(file);
  try {
    write(tmp);
    std::error_code ec;
    fs::rename(tmp, file, ec);
    if (ec) throw std::runtime_error("cannot write " + file.string() + ": " + ec.message());
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

void write_reports_all_or_none(const std::vector<std::pair<fs::path, std::string>>& files) {
  std::vector<fs::path> staged;
  auto drop_staged = [&] {
    std::error_code ignored;
    for (const auto& tmp : staged) fs::remove(tmp, ignored);
  };
  try {
    for (const auto& [file, text] : files) {
      staged.push_back(create_temporary(file));
      write_text(staged.back(), file, text);
    }
  } catch (...) {
    drop_staged();
    throw;
  }
  // Every file staged: the renames, each atomic, are all that is left.
  for (std::size_t i = 0; i < files.size(); ++i) {
    std::error_code ec;
    fs::rename(staged[i], files[i].first, ec);
    if (ec) {
      staged.erase(staged.begin(), staged.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      drop_staged();
      throw std::runtime_error("cannot write " + files[i].first.string() + ": " + ec.message());
    }
  }
}

void write_report(const fs::path& file, const std::string& text) {
  write_file_atomically(file, [&](const fs::path& tmp) { write_text(tmp, file, text); });
}

}  // namespace headgrad::runner
