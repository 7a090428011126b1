// The HTML report: one self-contained file (inline CSS, no script, no
// network) with the summary and a table per case. The diagnosis stage adds a
// section per failing case (heatmaps, localization) through html_case_section.
#include <cmath>

#include "runner/report.hpp"

namespace headgrad::runner {

namespace {

std::string esc(std::string_view s) { return xml_escape(s); }

const char* status_class(CaseStatus s) { return is_success(s) ? "ok" : "bad"; }

std::string html_case_section(const CaseResult& r, std::size_t index) {
  std::string h = "<section id=\"case-" + std::to_string(index) + "\">\n<h2><span class=\"" +
                  status_class(r.status) + "\">" + status_label(r.status) + "</span> " + esc(r.spec.name) +
                  "</h2>\n<p><code>" + esc(describe_case(r.spec)) + "</code> &middot; " + esc(pair_label(r)) +
                  " &middot; " + esc(format_duration(r.seconds)) + " &middot; " + esc(r.spec.source.str()) + "</p>\n";
  if (!r.cause.empty()) h += "<p class=\"cause\">" + esc(r.cause) + "</p>\n";
  if (!r.tensors.empty()) {
    h += "<table>\n<tr><th>tensor</th><th>shape</th><th>allclose</th><th>max |&Delta;|</th><th>max rel</th>"
         "<th>outside tolerance</th><th>atol</th><th>rtol</th><th>worst element</th><th>" +
         esc(r.lhs_label) + "</th><th>" + esc(r.rhs_label) + "</th></tr>\n";
    for (const auto& t : r.tensors) {
      h += "<tr class=\"" + std::string(t.allclose ? "ok" : "bad") + "\"><td>" + esc(t.name) + "</td><td>" +
           esc(shape_str(t.shape)) + "</td>";
      if (!t.problem.empty()) {
        h += "<td colspan=\"9\">" + esc(t.problem) + "</td></tr>\n";
        continue;
      }
      h += "<td>" + std::string(t.allclose ? "ok" : "FAIL") + "</td><td>" + format_figure(t.max_abs) + "</td><td>" +
           format_figure(t.max_rel) + "</td><td>" + std::to_string(t.mismatched) + " / " + std::to_string(t.numel) +
           "</td><td>" + format_figure(t.tolerance.atol) + "</td><td>" + format_figure(t.tolerance.rtol) + "</td>";
      if (t.worst)
        h += "<td>" + esc(index_str(t.worst->index)) + " " + esc(t.worst->where) + "</td><td>" +
             format_value(t.worst->lhs) + "</td><td>" + format_value(t.worst->rhs) + "</td>";
      else
        h += "<td></td><td></td><td></td>";
      h += "</tr>\n";
    }
    h += "</table>\n";
  }
  return h + "</section>\n";
}

}  // namespace

std::string html_report(const SuiteResult& result) {
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>headgrad: " + esc(result.name) +
      "</title>\n<style>\n"
      "body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}\n"
      "code,td{font-family:ui-monospace,monospace}\n"
      "table{border-collapse:collapse;margin:.5em 0 1.5em}\n"
      "th,td{border:1px solid #ccc;padding:2px 8px;text-align:left}\n"
      "th{background:#f3f3f3}\n"
      ".ok{color:#17752b}.bad{color:#b00020;font-weight:bold}\n"
      "tr.bad td{background:#fff0f0}\n"
      ".cause{color:#b00020}\n"
      "</style>\n</head>\n<body>\n";
  h += "<h1>headgrad &middot; suite " + esc(result.name) + "</h1>\n";
  h += "<p><b>" + std::to_string(result.passed()) + " passed, " + std::to_string(result.failed()) + " failed</b> &middot; " +
       std::to_string(result.cases.size()) + " cases in " + esc(format_duration(result.seconds)) + " &middot; " +
       esc(result.file.string()) + " &middot; exit code " + std::to_string(result.exit_code()) + "</p>\n";
  h += "<table>\n<tr><th>status</th><th>case</th><th>shape</th><th>compared</th><th>max |&Delta;|</th>"
       "<th>time</th></tr>\n";
  for (std::size_t i = 0; i < result.cases.size(); ++i) {
    const CaseResult& r = result.cases[i];
    h += "<tr><td class=\"" + std::string(status_class(r.status)) + "\">" + status_label(r.status) +
         "</td><td><a href=\"#case-" + std::to_string(i) + "\">" + esc(r.spec.name) + "</a></td><td>" +
         esc(describe_case(r.spec)) + "</td><td>" + esc(pair_label(r)) + "</td><td>" +
         (r.tensors.empty() ? "" : format_figure(r.max_abs())) + "</td><td>" + esc(format_duration(r.seconds)) +
         "</td></tr>\n";
  }
  h += "</table>\n";
  for (std::size_t i = 0; i < result.cases.size(); ++i) h += html_case_section(result.cases[i], i);
  return h + "</body>\n</html>\n";
}

}  // namespace headgrad::runner
