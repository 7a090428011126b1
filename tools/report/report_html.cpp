// The HTML report: one self-contained file (inline CSS, inline SVG made here,
// no script, no font or image from anywhere else) with
//   - the suite's summary: counts per status, the mutation score, the
//     weak-suite warnings, and a row per case;
//   - a section per case: its figures, tensor by tensor (under
//     relative_to_baseline also each tensor's error against the golden, the
//     baseline's, their ratio, and a line chart of the error by position and
//     head, log scale), and for a case that
//     did not pass (FAIL, XFAIL, XPASS with both sides' tensors kept) the
//     diagnosis, the localization table and heatmaps of |lhs - rhs|:
//       mha out, dx [B, T, D]: per batch item, positions x (heads x channels)
//       dwq, dwk, dwv [D, D]: output features (head h owns rows h*d..) x inputs
//       dwo [D, D]: outputs x input features (head h owns columns h*d..)
//       core [B, H, T, d]: per batch item, positions x (heads x channels)
//     white = 0, dark red = the max of that tensor; head blocks separated by
//     blue lines and labelled; big tensors are downsampled (max over blocks).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "report/report.hpp"

namespace headgrad::runner {

namespace {

std::string esc(std::string_view s) { return xml_escape(s); }

const char* status_class(CaseStatus s) { return is_success(s) ? "ok" : "bad"; }

std::string fmt(double x, const char* f = "%.1f") {
  char buf[48];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// ---- heatmaps (data: error_maps.hpp) ----

constexpr double kLeft = 34, kTop = 18;  // room for the labels
constexpr std::int64_t kMaxDrawnHeads = 1024;

// White -> red -> dark red.
std::string color(double t) {
  if (std::isnan(t)) return "#2f5fd0";  // not finite on a side
  t = std::clamp(t, 0.0, 1.0);
  double r, g, b;
  if (t < 0.5) {
    const double u = t / 0.5;
    r = 255 + (239 - 255) * u, g = 255 + (59 - 255) * u, b = 255 + (44 - 255) * u;
  } else {
    const double u = (t - 0.5) / 0.5;
    r = 239 + (103 - 239) * u, g = 59 + (0 - 59) * u, b = 44 + (13 - 44) * u;
  }
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", static_cast<int>(std::lround(r)), static_cast<int>(std::lround(g)),
                static_cast<int>(std::lround(b)));
  return buf;
}

// Labels every `step`-th block so that they do not overlap.
std::int64_t label_step(double block_px, double min_px) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(min_px / std::max(block_px, 1e-9))));
}

std::string svg_map(const ErrorMap& m, double vmax) {
  const std::int64_t fr = m.row_step, fc = m.col_step;
  const std::int64_t gr = m.cell_rows, gc = m.cell_cols;
  const double cell = (gr <= 24 && gc <= 24) ? 14 : 11;
  const double W = kLeft + gc * cell + 4, Hh = kTop + gr * cell + 4;
  const bool tips = gr * gc <= 1024;
  if (gr < 1 || gc < 1 || m.cells.size() != static_cast<std::size_t>(gr * gc)) return "";  // as the reader checks
  std::string s = "<svg width=\"" + fmt(W, "%.0f") + "\" height=\"" +
                  fmt(Hh, "%.0f") + "\" viewBox=\"0 0 " + fmt(W, "%.0f") + " " + fmt(Hh, "%.0f") +
                  "\" font-family=\"monospace\" font-size=\"10\">\n";
  for (std::int64_t i = 0; i < gr; ++i)
    for (std::int64_t j = 0; j < gc; ++j) {
      const double x = m.cells[static_cast<std::size_t>(i * gc + j)];
      const bool any_nan = std::isnan(x);
      const double t = any_nan ? NAN : (vmax > 0 ? x / vmax : 0);
      s += "<rect x=\"" + fmt(kLeft + j * cell, "%.0f") + "\" y=\"" + fmt(kTop + i * cell, "%.0f") + "\" width=\"" +
           fmt(cell, "%.0f") + "\" height=\"" + fmt(cell, "%.0f") + "\" fill=\"" + color(t) + "\"";
      if (tips)
        s += "><title>" + std::string(m.position_rows ? "t" : "row ") + std::to_string(i * fr) + ", col " +
             std::to_string(j * fc) + ": " + (any_nan ? "not finite" : format_figure(x)) + "</title></rect>\n";
      else
        s += "/>\n";
    }
  // Frame, head separators and labels.
  const double gw = gc * cell, gh = gr * cell;
  s += "<rect x=\"" + fmt(kLeft) + "\" y=\"" + fmt(kTop) + "\" width=\"" + fmt(gw) + "\" height=\"" + fmt(gh) +
       "\" fill=\"none\" stroke=\"#999\" stroke-width=\"1\"/>\n";
  // Head separators and labels only for a count a page can show (a report
  // read back may claim any block size: the output must not grow with it).
  if (m.col_block > 0 && m.col_block < m.cols && m.cols / m.col_block <= kMaxDrawnHeads) {
    const std::int64_t heads = m.cols / m.col_block;
    const double bpx = static_cast<double>(m.col_block) * cell / fc;
    for (std::int64_t h = 1; h < heads; ++h) {
      const double x = kLeft + h * bpx;
      s += "<line class=\"sep\" x1=\"" + fmt(x) + "\" y1=\"" + fmt(kTop - 4) + "\" x2=\"" + fmt(x) + "\" y2=\"" +
           fmt(kTop + gh) + "\"/>\n";
    }
    const std::int64_t step = label_step(bpx, 22);
    for (std::int64_t h = 0; h < heads; h += step)
      s += "<text x=\"" + fmt(kLeft + (h + 0.5) * bpx) + "\" y=\"" + fmt(kTop - 5) +
           "\" text-anchor=\"middle\" fill=\"#1f3f8f\">h" + std::to_string(h) + "</text>\n";
  }
  if (m.row_block > 0 && m.row_block < m.rows && m.rows / m.row_block <= kMaxDrawnHeads) {
    const std::int64_t heads = m.rows / m.row_block;
    const double bpx = static_cast<double>(m.row_block) * cell / fr;
    for (std::int64_t h = 1; h < heads; ++h) {
      const double y = kTop + h * bpx;
      s += "<line class=\"sep\" x1=\"" + fmt(kLeft - 4) + "\" y1=\"" + fmt(y) + "\" x2=\"" + fmt(kLeft + gw) +
           "\" y2=\"" + fmt(y) + "\"/>\n";
    }
    const std::int64_t step = label_step(bpx, 12);
    for (std::int64_t h = 0; h < heads; h += step)
      s += "<text x=\"" + fmt(kLeft - 6) + "\" y=\"" + fmt(kTop + (h + 0.5) * bpx + 3.5) +
           "\" text-anchor=\"end\" fill=\"#1f3f8f\">h" + std::to_string(h) + "</text>\n";
  } else if (m.position_rows) {
    const std::int64_t step = label_step(cell, 12);
    for (std::int64_t i = 0; i < gr; i += step)
      s += "<text x=\"" + fmt(kLeft - 4) + "\" y=\"" + fmt(kTop + (i + 0.5) * cell + 3.5) +
           "\" text-anchor=\"end\" fill=\"#555\">t" + std::to_string(i * fr) + "</text>\n";
  }
  s += "</svg>";
  return s;
}

std::string heatmaps(const CaseResult& r) {
  std::string h;
  for (const TensorErrorMaps& t : r.error_maps) {
    if (t.maps.empty()) continue;  // never written so; the report reader refuses it too
    const std::int64_t fr = t.maps[0].row_step, fc = t.maps[0].col_step;
    h += "<figure class=\"tensor\"><figcaption><b>" + esc(t.tensor) + "</b> " + esc(shape_str(t.shape)) +
         " &middot; |" + esc(r.lhs_label) + " &minus; " + esc(r.rhs_label) + "| &middot; <span class=\"scale\">" +
         "0 <span class=\"bar\"></span> " + format_figure(t.vmax) + "</span> max |&Delta;| = <b>" +
         format_figure(t.vmax) + "</b>" + (t.allclose ? " (within tolerance)" : "") +
         (t.non_finite ? " &middot; <span style=\"color:#2f5fd0\">blue: not finite</span>" : "") + "<br><small>" +
         esc(t.axes);
    if (fr > 1 || fc > 1)
      h += "; downsampled: each cell is the max over " + std::to_string(fr) + "&times;" + std::to_string(fc) +
           " elements";
    if (t.batches > kMaxMapBatch)
      h += "; the first " + std::to_string(kMaxMapBatch) + " of " + std::to_string(t.batches) + " batch items";
    h += "</small></figcaption>\n<div class=\"maps\">";
    for (const ErrorMap& m : t.maps) {
      h += "<div class=\"map\">";
      if (!m.title.empty()) h += "<div class=\"mt\">" + esc(m.title) + "</div>";
      h += svg_map(m, t.vmax) + "</div>\n";
    }
    h += "</div></figure>\n";
  }
  return h.empty() ? h : "<h3>Heatmaps of the absolute error</h3>\n<div class=\"heat\">\n" + h + "</div>\n";
}

// ---- analysis ----

std::string analysis_html(const CaseResult& r) {
  std::string h;
  if (!r.spec.expect_diagnosis.empty())
    h += "<p>expected diagnosis: <code>" + esc(r.spec.expect_diagnosis) + "</code></p>\n";
  if (r.diagnosis) {
    const Diagnosis& d = *r.diagnosis;
    h += "<h3>Diagnosis</h3>\n";
    if (!d.fits.empty()) h += "<p>best fit: <b class=\"diag-best\">" + esc(d.best()) + "</b></p>\n";
    h += "<p class=\"diagnosis\">" + esc(d.sentence) + "</p>\n";
    if (!d.fits.empty()) {
      h += "<table>\n<tr><th>bug</th><th>reproduces</th><th>worst |&Delta;| / tolerance</th><th>max |&Delta;|</th>"
           "<th>what it is</th><th>fix</th></tr>\n";
      for (const auto& f : d.fits) {
        h += "<tr><td class=\"bug\">" + esc(f.bug) + "</td><td>" + esc(f.side) + "</td><td>" +
             format_figure(f.worst_ratio) + "</td><td>" + format_figure(f.max_abs) + "</td><td class=\"txt\">" +
             esc(f.explanation) + "</td><td class=\"txt\">" + esc(f.fix) + "</td></tr>\n";
      }
      h += "</table>\n";
    }
  }
  if (r.localization) {
    const Localization& loc = *r.localization;
    h += "<h3>Localization</h3>\n";
    if (!loc.rows.empty()) {
      h += "<table>\n<tr><th>change</th><th>shape</th><th>result</th><th>max |&Delta;|</th></tr>\n";
      for (const auto& row : loc.rows) {
        const bool pass = row.status == CaseStatus::pass, err = row.status == CaseStatus::error;
        h += "<tr class=\"" + std::string(pass ? "ok" : "bad") + "\"><td>" + esc(row.change) + "</td><td>" +
             esc(row.shape) + "</td><td>" + (pass ? "passes" : err ? "error" : "fails") + "</td><td>" +
             format_figure(row.max_abs) + (err && !row.cause.empty() ? " " + esc(row.cause) : "") + "</td></tr>\n";
      }
      h += "</table>\n";
    }
    if (!loc.sentence.empty()) h += "<p class=\"loc\">" + esc(loc.sentence) + "</p>\n";
    if (!loc.where.empty()) h += "<p class=\"where\">where: " + esc(loc.where) + "</p>\n";
  }
  return h;
}

// ---- relative_to_baseline: figures and the error-by-position plot ----

// One line chart, log scale: max |side - golden| per position (solid), per head
// (thin), the baseline's (dashed) and the bound (dotted), so an error that grows
// along the sequence, or lives in one head, shows at a glance.
std::string svg_error_plot(const std::string& tensor, const BaselineCheck& b) {
  const std::size_t n = b.err_by_position.size();
  constexpr double W = 420, H = 150, L = 56, R = 10, T = 20, B = 26;
  double lo = INFINITY, hi = 0;
  auto take = [&](double v) {
    if (std::isfinite(v) && v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
  };
  for (double v : b.err_by_position) take(v);
  for (double v : b.baseline_by_position) take(v);
  take(b.bound);
  if (!(hi > 0)) lo = 1e-17, hi = 1e-16;
  const double llo = std::floor(std::log10(lo)), lhi = std::max(llo + 1, std::ceil(std::log10(hi)));
  auto x_at = [&](std::size_t i) { return L + (n > 1 ? static_cast<double>(i) / static_cast<double>(n - 1) : 0.5) * (W - L - R); };
  auto y_at = [&](double v) {
    const double lv = std::isfinite(v) && v > 0 ? std::log10(v) : (std::isinf(v) ? lhi : llo);
    return T + (lhi - std::clamp(lv, llo, lhi)) / (lhi - llo) * (H - T - B);
  };
  auto line = [&](const std::vector<double>& ys, const std::string& style) {
    std::string pts;
    for (std::size_t i = 0; i < ys.size(); ++i) pts += fmt(x_at(i)) + "," + fmt(y_at(ys[i])) + " ";
    return "<polyline fill=\"none\" " + style + " points=\"" + pts + "\"/>";
  };
  std::string s = "<svg class=\"plot\" width=\"" + fmt(W, "%.0f") + "\" height=\"" + fmt(H, "%.0f") +
                  "\" viewBox=\"0 0 " + fmt(W, "%.0f") + " " + fmt(H, "%.0f") + "\" role=\"img\"><title>" + esc(tensor) +
                  ": max |error| per " + esc(b.position_axis) + " position</title>";
  s += "<text x=\"" + fmt(L) + "\" y=\"13\" font-size=\"11\">" + esc(tensor) + ": max |" + esc(b.side) +
       " - golden| per " + esc(b.position_axis) + " (log scale)</text>";
  for (double e = llo; e <= lhi; e += 1) {
    const double y = y_at(std::pow(10.0, e));
    s += "<line x1=\"" + fmt(L) + "\" x2=\"" + fmt(W - R) + "\" y1=\"" + fmt(y) + "\" y2=\"" + fmt(y) +
         "\" stroke=\"#eee\"/><text x=\"" + fmt(L - 4) + "\" y=\"" + fmt(y + 3) +
         "\" font-size=\"9\" text-anchor=\"end\">1e" + fmt(e, "%.0f") + "</text>";
  }
  s += "<text x=\"" + fmt(L) + "\" y=\"" + fmt(H - 14) + "\" font-size=\"9\">" + esc(b.position_axis) +
       "=0</text><text x=\"" + fmt(W - R) + "\" y=\"" + fmt(H - 14) + "\" font-size=\"9\" text-anchor=\"end\">" +
       esc(b.position_axis) + "=" + std::to_string(n > 0 ? n - 1 : 0) + "</text>";
  for (const auto& head : b.err_by_head_position) s += line(head, "stroke=\"#f4b6ae\" stroke-width=\"0.8\"");
  s += line(b.baseline_by_position, "stroke=\"#888\" stroke-dasharray=\"4 3\" stroke-width=\"1.2\"");
  s += line(b.err_by_position, "stroke=\"#c0392b\" stroke-width=\"1.6\"");
  const double yb = y_at(b.bound);
  s += "<line x1=\"" + fmt(L) + "\" x2=\"" + fmt(W - R) + "\" y1=\"" + fmt(yb) + "\" y2=\"" + fmt(yb) +
       "\" stroke=\"#2f5fd0\" stroke-dasharray=\"1 2\"/>";
  s += "<text x=\"" + fmt(L) + "\" y=\"" + fmt(H - 3) + "\" font-size=\"9\">" +
       "red: " + esc(b.side) + (b.err_by_head_position.empty() ? "" : " (thin: per head)") +
       ", dashed: baseline, dotted: bound</text>";
  return s + "</svg>";
}

std::string baseline_html(const CaseResult& r) {
  bool any = false;
  for (const auto& t : r.tensors) any = any || t.baseline.has_value();
  if (!any) return "";
  std::string h = "<p>relative to baseline: golden " + esc(r.golden_label) + ", baseline " + esc(r.baseline_label) +
                  "; pass when max |side - golden| &le; k &middot; max |baseline - golden| + floor</p>\n"
                  "<table>\n<tr><th>tensor</th><th>verdict</th><th>side shown</th><th>error</th><th>baseline error</th>"
                  "<th>ratio</th><th>k</th><th>floor</th><th>bound</th><th>normwise</th><th>baseline normwise</th>"
                  "<th>reading</th></tr>\n";
  std::string plots;
  for (const auto& t : r.tensors) {
    if (!t.baseline) continue;
    const BaselineCheck& b = *t.baseline;
    h += "<tr class=\"" + std::string(t.allclose ? "ok" : "bad") + "\"><td>" + esc(t.name) + "</td><td>" +
         (t.allclose ? "ok" : "FAIL") + "</td><td>" + esc(b.side) + "</td><td>" + format_figure(b.err) + "</td><td>" +
         format_figure(b.baseline_err) + "</td><td>" + format_ratio(b.ratio) + "</td><td>" + format_figure(b.k) +
         "</td><td>" + format_figure(b.floor) + "</td><td>" + format_figure(b.bound) + "</td><td>" +
         format_figure(b.normwise) + "</td><td>" + format_figure(b.baseline_normwise) + "</td><td class=\"txt\">" +
         esc(baseline_verdict(b)) + "</td></tr>\n";
    if (!b.err_by_position.empty()) plots += svg_error_plot(t.name, b) + "\n";
  }
  h += "</table>\n";
  if (!plots.empty()) h += "<div class=\"plots\">\n" + plots + "</div>\n";
  return h;
}

std::string html_case_section(const CaseResult& r, std::size_t index) {
  std::string h = "<section id=\"case-" + std::to_string(index) + "\">\n<h2><span class=\"" +
                  status_class(r.status) + "\">" + status_label(r.status) + "</span> " + esc(r.spec.name) +
                  "</h2>\n<p><code>" + esc(describe_case(r.spec)) + "</code> &middot; " + esc(pair_label(r)) +
                  " &middot; " + esc(format_duration(r.seconds)) + " &middot; " + esc(r.spec.source.str()) + "</p>\n";
  if (!r.mutant.empty())
    h += "<p class=\"mutant\">" + esc(r.mutant) + " is a deliberate mutant (wrong on purpose)</p>\n";
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
           "</td>" +
           (t.baseline ? std::string("<td colspan=\"2\">relative to baseline (below)</td>")
                       : "<td>" + format_figure(t.tolerance.atol) + "</td><td>" + format_figure(t.tolerance.rtol) + "</td>");
      if (t.worst)
        h += "<td>" + esc(shape_str(t.worst->index)) + " " + esc(t.worst->where) + "</td><td>" +
             format_value(t.worst->lhs) + "</td><td>" + format_value(t.worst->rhs) + "</td>";
      else
        h += "<td></td><td></td><td></td>";
      h += "</tr>\n";
    }
    h += "</table>\n";
    h += baseline_html(r);
  }
  if (r.status != CaseStatus::pass) {
    h += analysis_html(r);
    h += heatmaps(r);
  }
  return h + "</section>\n";
}

std::string percent(std::size_t a, std::size_t n) {
  return n == 0 ? std::string("-") : fmt(100.0 * static_cast<double>(a) / static_cast<double>(n), "%.0f") + "%";
}

}  // namespace

std::string html_report(const SuiteResult& result) {
  const std::size_t replaced_before = utf8_replacements();
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>headgrad: " + esc(result.name) +
      "</title>\n<style>\n"
      "body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}\n"
      "code,td{font-family:ui-monospace,monospace}\n"
      "table{border-collapse:collapse;margin:.5em 0 1.5em}\n"
      "th,td{border:1px solid #ccc;padding:2px 8px;text-align:left}\n"
      "td.txt{font-family:system-ui,sans-serif}\n"
      "th{background:#f3f3f3}\n"
      ".ok{color:#17752b}.bad{color:#b00020;font-weight:bold}\n"
      "tr.bad td{background:#fff0f0}\n"
      ".cause{color:#b00020}.mutant{color:#8a5a00}\n"
      ".warn li{color:#8a5a00}\n"
      "section{border-top:2px solid #ddd;margin-top:2em}\n"
      ".heat figure{margin:0 0 1.2em}\n"
      ".maps{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}\n"
      ".plots{display:flex;flex-wrap:wrap;gap:12px}.plots svg{border:1px solid #ddd;background:#fff}\n"
      ".mt{font:12px ui-monospace,monospace;color:#555}\n"
      ".bar{display:inline-block;width:80px;height:10px;vertical-align:middle;border:1px solid #999;"
      "background:linear-gradient(to right,#ffffff,#ef3b2c,#67000d)}\n"
      ".scale{font-size:12px;color:#555;margin-right:.6em}\n"
      "line.sep{stroke:#1f3f8f;stroke-width:1.5}\n"
      "</style>\n</head>\n<body>\n";
  h += "<h1>headgrad &middot; suite " + esc(result.name) + "</h1>\n";
  const std::size_t note_at = h.size();
  h += "<p><b>" + std::to_string(result.passed()) + " passed, " + std::to_string(result.failed()) + " failed</b> &middot; " +
       std::to_string(result.cases.size()) + " cases in " + esc(format_duration(result.seconds)) + " &middot; " +
       esc(result.file.string()) + " &middot; exit code " + std::to_string(result.exit_code()) + "</p>\n";
  h += "<p class=\"counts\">";
  bool first = true;
  for (CaseStatus s : {CaseStatus::pass, CaseStatus::fail, CaseStatus::error, CaseStatus::xfail, CaseStatus::xpass}) {
    if (!first) h += " &middot; ";
    first = false;
    h += std::string(case_status_name(s)) + ": " + std::to_string(result.count(s));
  }
  h += "</p>\n";
  const MutationScore ms = result.mutation_score();
  if (ms.mutants > 0)
    h += "<p class=\"score\"><b>mutation score</b>: " + std::to_string(ms.caught) + "/" + std::to_string(ms.mutants) +
         " mutants caught (" + percent(ms.caught, ms.mutants) + "), " + std::to_string(ms.named) + "/" +
         std::to_string(ms.mutants) + " named correctly (" + percent(ms.named, ms.mutants) + ")</p>\n";
  if (!result.warnings.empty()) {
    h += "<p><b>weak suite</b>: bug classes these cases cannot expose</p>\n<ul class=\"warn\">\n";
    for (const auto& w : result.warnings) h += "<li>" + esc(w.message) + "</li>\n";
    h += "</ul>\n";
  }
  h += "<table>\n<tr><th>status</th><th>case</th><th>shape</th><th>compared</th><th>max |&Delta;|</th>"
       "<th>diagnosis</th><th>time</th></tr>\n";
  for (std::size_t i = 0; i < result.cases.size(); ++i) {
    const CaseResult& r = result.cases[i];
    h += "<tr><td class=\"" + std::string(status_class(r.status)) + "\">" + status_label(r.status) +
         "</td><td><a href=\"#case-" + std::to_string(i) + "\">" + esc(r.spec.name) + "</a></td><td>" +
         esc(describe_case(r.spec)) + "</td><td>" + esc(pair_label(r)) + "</td><td>" +
         (r.tensors.empty() ? "" : format_figure(r.max_abs())) + "</td><td>" +
         (r.diagnosis ? esc(r.diagnosis->fits.empty() ? std::string("no known bug fits") : r.diagnosis->best())
                      : std::string()) +
         "</td><td>" + esc(format_duration(r.seconds)) + "</td></tr>\n";
  }
  h += "</table>\n";
  for (std::size_t i = 0; i < result.cases.size(); ++i) h += html_case_section(result.cases[i], i);
  if (const std::size_t replaced = utf8_replacements() - replaced_before)
    h.insert(note_at, "<p class=\"note\">note: " + esc(text_replaced_note(replaced)) + "</p>\n");
  return h + "</body>\n</html>\n";
}

}  // namespace headgrad::runner
