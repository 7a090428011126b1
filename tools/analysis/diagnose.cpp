#include "analysis/analyze.hpp"
#include "analysis/internal.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include <headgrad/log.hpp>

#include "analysis/catalog.hpp"
#include "analysis/evaluate.hpp"
#include "analysis/hypotheses.hpp"
#include "case/inputs.hpp"
#include "exec/execute.hpp"

namespace headgrad::analysis {

using namespace runner;
using diagnosis::Bug;
using diagnosis::bug_catalog;
using diagnosis::bug_info;

// Diagnosis: which catalog bug reproduces a failing side.

namespace {

// A near miss is named only within this factor of the tolerance.
constexpr double kNearFactor = 10;

}  // namespace

// A bug's explanation, with the setting that matches a window convention in
// the case's own numbers (a side that counts W + 1 keys follows {left: L + 1}).
std::string convention_note(const diagnosis::BugInfo& info, const CaseSpec& c) {
  std::string s(info.explanation);
  if (info.bug == Bug::window_off_by_one && c.window.left)
    s += " (here: it counts " + std::to_string(*c.window.left + 2) + " keys where the case's {left: " +
         std::to_string(*c.window.left) + "} holds " + std::to_string(*c.window.left + 1) + ", the query included: set left: " +
         std::to_string(*c.window.left + 1) + " to match)";
  return s;
}

// The side's name in a sentence: a reference is called one.
std::string side_words(const Diagnosis& dx, const std::string& side) {
  return side == dx.reference_side && !side.empty() ? "the reference " + side : side;
}

void write_verdict(Diagnosis& dx) {
  if (dx.fits.empty()) {
    const bool pair = std::any_of(dx.findings.begin(), dx.findings.end(), [](const Finding& f) { return f.kind == "pair"; });
    dx.sentence = pair ? "No single known bug reproduces this failure" : "No known bug reproduces this failure";
    if (!dx.findings.empty()) {
      std::vector<std::string> said;
      for (const auto& f : dx.findings) said.push_back(f.sentence);
      dx.sentence += ". " + join(said, " ");
      if (!dx.correct_side.empty()) dx.sentence += " " + side_words(dx, dx.correct_side) + " matches the correct attention.";
      if (!dx.ruled_out.empty()) dx.sentence += " Ruled out: " + join(dx.ruled_out, "; ") + ".";
      if (!dx.evidence.empty()) dx.sentence += " Evidence: " + join(dx.evidence, "; ") + ".";
      return;
    }
    if (!dx.ruled_out.empty()) dx.sentence += "; ruled out: " + join(dx.ruled_out, "; ");
    if (!dx.near.empty())
      dx.sentence += std::string(dx.ruled_out.empty() ? "" : ";") + " (closest: " + dx.near.front().bug + " on " +
                     side_words(dx, dx.near.front().side) + ", " + fmt_g(dx.near.front().worst_ratio) + "x outside the tolerance)";
    dx.sentence += "; see where the error lives and the localization.";
    if (!dx.evidence.empty()) dx.sentence += " Evidence: " + join(dx.evidence, "; ") + ".";
    return;
  }
  const HypothesisFit& best = dx.fits.front();
  dx.judged_side = best.side;
  const auto& info = bug_info(*diagnosis::bug_from_name(best.bug));
  dx.sentence = side_words(dx, best.side) + " reproduces " + best.bug + " (every checked tensor within tolerance, max |Δ| " +
                fmt_g(best.max_abs) + "): " + (best.explanation.empty() ? std::string(info.explanation) : best.explanation) +
                ". Fix: " +
                std::string(info.fix) + ".";
  if (!dx.correct_side.empty())
    dx.sentence += " " + side_words(dx, dx.correct_side) + " matches the correct attention" +
                   (dx.correct_side == dx.reference_side || best.side == dx.reference_side ? ": it is the correct side." : ".");
  if (dx.fits.size() > 1) {
    std::vector<std::string> others;
    for (std::size_t i = 1; i < dx.fits.size(); ++i) others.push_back(dx.fits[i].bug);
    dx.sentence += " Also consistent at this shape: " + join(others, ", ") + ".";
  }
  if (!dx.ruled_out.empty()) dx.sentence += " Ruled out: " + join(dx.ruled_out, "; ") + ".";
  if (!dx.evidence.empty()) dx.sentence += " Evidence: " + join(dx.evidence, "; ") + ".";
}

namespace {

}  // namespace

std::string precision_sentence(const CaseResult& r) {
  std::vector<std::string> near, above, far;
  for (const auto& t : r.tensors) {
    if (!t.baseline) continue;
    const BaselineCheck& b = *t.baseline;
    if (std::isnan(b.err)) far.push_back(t.name + " (NaN on " + b.side + ")");
    else if (b.ratio <= kAsAccurateRatio) near.push_back(t.name + " (ratio " + fmt_g(b.ratio) + ")");
    else
      (t.allclose ? above : far)
          .push_back(t.name + " " + fmt_g(b.ratio) + "x (max |Δ| " + fmt_g(b.err) + " on " + b.side +
                     " against the oracle's " + fmt_g(b.baseline_err) + ")");
  }
  if (near.empty() && above.empty() && far.empty()) return "";
  const std::string dtype(dtype_name(r.spec.dtype));
  std::vector<std::string> parts;
  if (!far.empty()) parts.push_back(join(far, ", ") + ": far above the rounding level of " + dtype);
  if (!above.empty()) parts.push_back(join(above, ", ") + ": above the oracle's own error, within the bound");
  if (!near.empty()) parts.push_back(join(near, ", ") + ": as accurate as the oracle in this dtype");
  return "In " + dtype + " against the golden (" + r.golden_label + "): " + join(parts, "; ") + ".";
}

Diagnosis diagnose(const CaseResult& failed, const CaseInputs& in) {
  Diagnosis dx;
  const CaseSpec& c = failed.spec;
  struct Side {
    std::string label;
    const TensorSet* tensors;
  };
  std::vector<Side> sides;
  if (!failed.lhs.empty()) sides.push_back({failed.lhs_label, &failed.lhs});
  // A reference's own tensors are diagnosed too: a buggy function may have written it.
  if (!failed.rhs.empty()) sides.push_back({failed.rhs_label, &failed.rhs});
  if (c.is_reference()) dx.reference_side = failed.rhs_label;
  if (sides.empty()) {
    dx.sentence = "No tensors to diagnose: " + (failed.cause.empty() ? "no side produced a result" : failed.cause);
    return dx;
  }

  const TensorSet correct = hypothesis_tensors(c, in, diagnosis::BugSet{});
  for (const auto& s : sides)
    if (fit_ratio(*s.tensors, correct, c).first <= 1.0) dx.correct_side = s.label;

  // The near miss is the failing side's: the side left when the other is the
  // correct one (else none is shown), and only a hypothesis that differs from
  // the correct attention here (one that does not is no evidence at all).
  std::string failing;
  if (!dx.correct_side.empty())
    for (const auto& s : sides)
      if (s.label != dx.correct_side) failing = s.label;
  std::optional<HypothesisFit> closest;
  for (const auto& info : bug_catalog()) {
    if (c.level == Level::core && info.visibility.mha_only) continue;
    if (c.level == Level::rope && !diagnosis::has_rope_level_form(info)) continue;
    TensorSet hyp;
    try {
      hyp = hypothesis_tensors(c, in, info.bug);
    } catch (const std::exception& e) {
      logging::runner()->debug("hypothesis {} did not run: {}", info.name, e.what());
      continue;
    }
    const bool visible = fit_ratio(hyp, correct, c).first > 1.0;
    for (const auto& s : sides) {
      if (s.label == dx.correct_side) continue;
      const auto [ratio, max_abs] = fit_ratio(*s.tensors, hyp, c);
      HypothesisFit fit{std::string(info.name), convention_note(info, c), std::string(info.fix), s.label,
                        ratio, max_abs};
      if (ratio <= 1.0) dx.fits.push_back(fit);
      else if (visible && s.label == failing && (!closest || ratio < closest->worst_ratio)) closest = fit;
    }
  }
  std::stable_sort(dx.fits.begin(), dx.fits.end(),
                   [](const auto& a, const auto& b) { return a.worst_ratio < b.worst_ratio; });
  // A near miss is worth naming only when it is close to the tolerance.
  if (closest && closest->worst_ratio <= kNearFactor) dx.near.push_back(*closest);
  write_verdict(dx);
  return dx;
}

// A hypothesis that fits at the failing shape is kept only where it agrees
// with every localization variant that ran: it must reproduce the side it
// blames there too, so it shows exactly where the failure shows and is
// invisible where the failure vanishes.
void confirm_with_variants(Diagnosis& dx, const std::vector<VariantRun>& runs) {
  std::vector<HypothesisFit> kept;
  for (const auto& fit : dx.fits) {
    const Bug bug = *diagnosis::bug_from_name(fit.bug);
    std::string why;
    for (const auto& run : runs) {
      const CaseResult& r = run.result;
      if (!run.error.empty() || (r.status != CaseStatus::pass && r.status != CaseStatus::fail)) continue;
      const TensorSet* side = fit.side == r.lhs_label ? &r.lhs : fit.side == r.rhs_label ? &r.rhs : nullptr;
      if (!side || side->empty()) continue;
      const CaseSpec& vc = run.variant.spec;
      if (vc.level == Level::core && bug_info(bug).visibility.mha_only) continue;
      if (vc.level == Level::rope && !diagnosis::has_rope_level_form(bug_info(bug))) continue;
      TensorSet hyp;
      try {
        hyp = hypothesis_tensors(vc, run.inputs, bug);
      } catch (const std::exception& e) {
        logging::runner()->debug("hypothesis {} did not run at {}: {}", fit.bug, run.variant.change, e.what());
        continue;
      }
      if (fit_ratio(*side, hyp, vc).first <= 1.0) continue;
      why = r.status == CaseStatus::pass
                ? "the failure vanishes at " + run.variant.change + ", where " + fit.bug + " would still show"
                : "at " + run.variant.change + " the failure shows but " + fit.bug + " does not reproduce it";
      break;
    }
    if (why.empty()) kept.push_back(fit);
    else dx.ruled_out.push_back(fit.bug + " (fits at the failing shape, but " + why + ")");
  }
  if (kept.size() == dx.fits.size()) return;
  dx.fits = std::move(kept);
  dx.judged_side = dx.fits.empty() ? std::string() : dx.fits.front().side;
  write_verdict(dx);
}

// Grouped kv heads, mha level, 1 < Hkv < H: each failing plugin side is re-run
// with its query heads in tile order (Wq row blocks, Wo column blocks;
// tile_to_repeat_heads). A plugin that maps query head h to kv head h mod Hkv
// then computes the correct attention (its dWq and dWo in the same order), and
// no other plugin does: the match confirms kv_map_tile, a mismatch rules it out.
void rerun_under_tile_permutation(Diagnosis& dx, const CaseResult& failed, const CaseInputs& in,
                                  const PluginRegistry& registry, const RunOptions& options) {
  const CaseSpec& c = failed.spec;
  const std::int64_t heads = c.dims.H, kv_heads = c.dims.kv_heads();
  if (c.level != Level::mha || kv_heads <= 1 || kv_heads >= heads || heads % kv_heads != 0) return;
  const std::vector<std::int64_t> order = diagnosis::tile_to_repeat_heads(heads, kv_heads);
  const std::int64_t d = in.wq.size(0) / heads;
  CaseInputs tiled = in;
  tiled.wq = diagnosis::reorder_blocks(in.wq, 0, d, order);  // [H*d, D]: head h' gets head order[h']'s rows
  tiled.wo = diagnosis::reorder_blocks(in.wo, 1, d, order);  // [D, H*d]: and its columns
  if (in.bq.defined()) tiled.bq = diagnosis::reorder_blocks(in.bq, 0, d, order);  // [H*d]: and its entries
  // a QK-norm gain per query head (axis model, [H*d]) moves with its head; a shared [d] one does not
  const bool q_norm_per_head = in.q_norm.defined() && in.q_norm.numel() == in.wq.size(0) && heads > 1;
  if (q_norm_per_head) tiled.q_norm = diagnosis::reorder_blocks(in.q_norm, 0, d, order);
  TensorSet correct = hypothesis_tensors(c, in, diagnosis::BugSet{});
  for (auto& [name, t] : correct) {
    if (name == "dwq" || name == "dbq" || (name == "dq_norm" && q_norm_per_head))
      t = diagnosis::reorder_blocks(t, 0, d, order);
    if (name == "dwo") t = diagnosis::reorder_blocks(t, 1, d, order);
  }
  ExecOptions exec;
  exec.isolate = options.isolate;
  exec.timeout_s = options.timeout_s.value_or(c.timeout_s);
  exec.on_wait = options.on_wait;
  const std::string tile_name(bug_info(Bug::kv_map_tile).name);
  bool changed = false;
  for (std::size_t i = 0; i < c.compare.size(); ++i) {
    const std::string& plugin = c.compare[i];
    const std::string& label = i == 0 ? failed.lhs_label : failed.rhs_label;
    if (label != plugin || label == dx.correct_side || !registry.find(plugin)) continue;
    const std::string rerun = "re-run of " + plugin + " with its query heads in tile order (head g*Hkv + j given "
                              "the Wq rows and Wo columns of head j*G + g)";
    const SideResult side = run_side(c, tiled, registry.get(plugin), exec);
    if (side.status != SideStatus::ok) {
      dx.evidence.push_back(rerun + " did not complete: " + side.cause);
      changed = true;
      continue;
    }
    const auto [ratio, max_abs] = fit_ratio(side.tensors, correct, c);
    const auto fit = std::find_if(dx.fits.begin(), dx.fits.end(),
                                  [&](const HypothesisFit& f) { return f.bug == tile_name && f.side == plugin; });
    if (ratio <= 1.0) {
      dx.evidence.push_back(rerun + " matches the correct attention (max |Δ| " + fmt_g(max_abs) +
                            "): it reads kv head h mod Hkv for query head h (" + tile_name + ")");
      if (fit != dx.fits.end()) std::rotate(dx.fits.begin(), fit, fit + 1);  // the confirmed one first
    } else {
      dx.evidence.push_back(rerun + " does not match the correct attention (" + fmt_g(ratio) +
                            "x the tolerance): not a tiled kv mapping alone");
      if (fit != dx.fits.end()) {
        dx.ruled_out.push_back(tile_name + " (fits at the failing shape, but the re-run under the tile permutation "
                               "does not match)");
        dx.fits.erase(fit);
      }
    }
    changed = true;
  }
  if (!changed) return;
  dx.judged_side = dx.fits.empty() ? std::string() : dx.fits.front().side;
  write_verdict(dx);
}

}  // namespace headgrad::analysis
