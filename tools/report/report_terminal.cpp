// The terminal report: one line per case, readable at a glance (as ggml's
// test-backend-ops prints OP(param=value, ...) with OK/FAIL), failures
// expanded below their line, and a summary.
#include <algorithm>
#include <cmath>

#include "report/report.hpp"

namespace headgrad::runner {

namespace {

constexpr std::size_t kMaxName = 40, kMaxShape = 48, kMaxPair = 60;
constexpr std::size_t kDetailIndent = 9;  // under the case's name

const char* color_of(CaseStatus s) {
  switch (s) {
    case CaseStatus::pass: return "\033[32m";
    case CaseStatus::xfail: return "\033[33m";
    case CaseStatus::error: return "\033[1;31m";
    default: return "\033[31m";
  }
}

std::string padded(const std::string& s, std::size_t width) {
  // Δ and other multi-byte characters: pad by code points, not bytes
  std::size_t points = 0;
  for (const char ch : s) points += (static_cast<unsigned char>(ch) & 0xC0) != 0x80 ? 1 : 0;
  return points >= width ? s : s + std::string(width - points, ' ');
}

std::string figures(const CaseResult& r) {
  const std::size_t n = r.tensors.size();
  const std::string time = format_duration(r.seconds);
  switch (r.status) {
    case CaseStatus::pass:
      return "max|Δ| " + format_figure(r.max_abs()) + "  (" + std::to_string(n) + (n == 1 ? " tensor, " : " tensors, ") +
             time + ")";
    case CaseStatus::xpass:
      return "max|Δ| " + format_figure(r.max_abs()) + "  " + r.cause + "  (" + time + ")";
    case CaseStatus::fail:
    case CaseStatus::xfail: {
      std::string s = r.status == CaseStatus::xfail ? "expected failure: " : "";
      if (!r.tensors.empty() && r.differing_tensors() > 0 && r.cause.rfind("plugin", 0) != 0)
        return s + "max|Δ| " + format_figure(r.max_abs()) + "  (" + std::to_string(r.differing_tensors()) + " of " +
               std::to_string(n) + " tensors differ, " + time + ")";
      return s + r.cause + "  (" + time + ")";
    }
    case CaseStatus::error: return r.cause + "  (" + time + ")";
  }
  return "";
}

}  // namespace

TerminalStyle terminal_style(const std::vector<const CaseSpec*>& cases, bool color, bool quiet, bool verbose) {
  TerminalStyle style;
  style.color = color;
  style.quiet = quiet;
  style.verbose = verbose;
  for (const CaseSpec* c : cases) {
    style.name_width = std::max(style.name_width, std::min(kMaxName, terminal_safe(c->name).size()));
    style.shape_width = std::max(style.shape_width, std::min(kMaxShape, describe_case(*c).size()));
    const std::string rhs = c->is_reference() ? c->reference_text : c->compare.at(1);
    style.pair_width =
        std::max(style.pair_width, std::min(kMaxPair, terminal_safe(c->compare.at(0) + " vs " + rhs).size()));
  }
  return style;
}

void print_header(std::ostream& os, const Suite& suite, std::size_t selected, const PluginRegistry& registry,
                  const TerminalStyle& style) {
  if (style.quiet) return;
  os << "suite " << terminal_safe(suite.name) << " (" << terminal_safe(suite.file.string()) << "): " << selected
     << " of " << suite.cases.size() << " cases\n";
  os << "plugins:";
  std::size_t shown = 0;
  for (const auto& p : registry.plugins()) {
    if (p.info.mutant) continue;
    os << (shown++ ? ", " : " ") << terminal_safe(p.info.name) << " " << terminal_safe(p.info.version);
  }
  os << (shown ? "" : " none") << "\n\n";
}

void print_case(std::ostream& os, const CaseResult& r, const TerminalStyle& style) {
  if (style.quiet && is_success(r.status)) return;
  const std::string label = padded(status_label(r.status), 5);
  os << "  " << (style.color ? color_of(r.status) + label + "\033[0m" : label) << "  "
     << padded(terminal_safe(r.spec.name), style.name_width) << "  "
     << padded(describe_case(r.spec), style.shape_width) << "  " << padded(terminal_safe(pair_label(r)), style.pair_width)
     << "  " << terminal_safe(figures(r)) << "\n";
  if (r.status == CaseStatus::xfail && r.diagnosis && !r.diagnosis->fits.empty()) {
    os << std::string(kDetailIndent, ' ') << "named: " << terminal_safe(r.diagnosis->best()) << " ("
       << terminal_safe(r.diagnosis->judged_side) << ")\n";
  }
  // An expectation that was not met says why here, not only in the JSON.
  if (r.status == CaseStatus::fail && (r.spec.expect_fail || !r.spec.expect_diagnosis.empty()) && !r.cause.empty())
    os << std::string(kDetailIndent, ' ') << "not as expected: " << terminal_safe(r.cause) << "\n";
  const bool expand = style.verbose || r.status == CaseStatus::fail || r.status == CaseStatus::xpass;
  if (!expand) return;
  // lines we built, holding names and messages from the input
  os << terminal_safe(case_details(r, style.verbose, kDetailIndent), /*keep_newlines=*/true);
  os << terminal_safe(analysis_details(r, kDetailIndent), /*keep_newlines=*/true);
}

void print_summary(std::ostream& os, const SuiteResult& result, const TerminalStyle& style) {
  os << "\n" << result.passed() << " passed, " << result.failed() << " failed\n";
  std::vector<std::string> notes;
  const auto note = [&](CaseStatus s, const char* one, const char* many) {
    const std::size_t n = result.count(s);
    if (n) notes.push_back(std::to_string(n) + " " + (n == 1 ? one : many));
  };
  note(CaseStatus::fail, "comparison failed", "comparisons failed");
  note(CaseStatus::error, "plugin error (not loaded, threw, crashed or timed out)",
       "plugin errors (not loaded, threw, crashed or timed out)");
  note(CaseStatus::xpass, "unexpected pass", "unexpected passes");
  note(CaseStatus::xfail, "expected failure", "expected failures");
  std::string line = "suite " + terminal_safe(result.name) + ": " + std::to_string(result.cases.size()) +
                     (result.cases.size() == 1 ? " case in " : " cases in ") +
                     format_duration(result.seconds);
  for (const auto& n : notes) line += "; " + n;
  os << line << "\n";
  if (const MutationScore m = result.mutation_score(); m.mutants > 0) {
    auto pct = [&](std::size_t n) { return std::to_string(100 * n / m.mutants) + "%"; };
    os << "mutation score: " << m.caught << "/" << m.mutants << " mutants caught (" << pct(m.caught) << "), "
       << m.named << "/" << m.mutants << " named correctly (" << pct(m.named) << ")\n";
  }
  for (const auto& w : result.warnings)
    os << (style.color ? "\033[33mwarning:\033[0m " : "warning: ") << terminal_safe(w.message) << "\n";
  if (result.failed() > 0) {
    std::string names;
    for (const auto& c : result.cases)
      if (!is_success(c.status)) names += (names.empty() ? "" : ", ") + terminal_safe(c.spec.name);
    os << (style.color ? "\033[31mnot as expected:\033[0m " : "not as expected: ") << names << "\n";
  }
}

}  // namespace headgrad::runner
