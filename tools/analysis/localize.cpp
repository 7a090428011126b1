#include "analysis/analyze.hpp"
#include "analysis/internal.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include <headgrad/log.hpp>

#include "analysis/catalog.hpp"
#include "analysis/hypotheses.hpp"
#include "case/axes.hpp"
#include "case/inputs.hpp"
#include "exec/execute.hpp"

namespace headgrad::analysis {

using namespace runner;
using diagnosis::Bug;
using diagnosis::bug_catalog;
using diagnosis::bug_info;

std::string fmt_g(double v) {
  std::ostringstream o;
  o.precision(2);
  o << v;
  return o.str();
}

// Localization: the failing pair re-run at variants of the case.

// Max |a - b| per slot of one dim of a [.., n, ..] tensor (dim < 0: from the end),
// or per block of `block` columns along the last dim when block > 0.
std::vector<double> slot_max(const Tensor& a, const Tensor& b, std::int64_t dim, std::int64_t block) {
  const Tensor da = a.contiguous(), db = b.contiguous();
  const Shape& shape = da.shape();
  const std::int64_t nd = da.dim();
  const std::int64_t axis = normalize_dim(dim, nd, shape, "slot_max");
  const std::int64_t n = block > 0 ? shape[axis] / block : shape[axis];
  std::vector<double> out(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)), 0.0);
  const auto va = da.to_vector(), vb = db.to_vector();
  std::int64_t inner = 1;
  for (std::int64_t i = axis + 1; i < nd; ++i) inner *= shape[i];
  for (std::size_t i = 0; i < va.size(); ++i) {
    const std::int64_t slot = (static_cast<std::int64_t>(i) / inner) % shape[axis];
    const double e = std::abs(va[i] - vb[i]);
    auto& m = out[static_cast<std::size_t>(block > 0 ? slot / block : slot)];
    if (std::isnan(e) || e > m) m = std::isnan(e) ? INFINITY : e;
  }
  return out;
}

namespace {

// Every localization variant: its name in reports, its words, what a failure
// that vanishes there needs (empty: "<words> above 1").
constexpr ProbeInfo kProbes[] = {
    {Probe::B, "B", "the batch size", ""},
    {Probe::T, "T", "the sequence length", ""},
    {Probe::H, "H", "the head count", ""},
    {Probe::H_at_D, "H@D", "the head count at a kept model width", "", false},
    {Probe::Tq_ne_Tk, "Tq!=Tk", "whether Tq = Tk", "Tq != Tk"},
    {Probe::Tq, "Tq", "the query count", "more than one query (Tq > 1)"},
    {Probe::Tq_gt_Tk, "Tq>Tk", "whether Tq > Tk", "", false},
    {Probe::T_both, "T", "the sequence length", ""},
    {Probe::d, "d", "the head width", "a head width above 1"},
    {Probe::mask, "mask", "the mask file", "the mask (it shows only with the mask)"},
    {Probe::causal, "causal", "the causal mask", "the causal mask (it shows only when causal)"},
    {Probe::G, "G", "the query heads per kv head (G = H / Hkv)", ""},
    {Probe::Hkv, "Hkv", "the kv head count", ""},
    {Probe::rope, "rope", "the rotation (RoPE)", "the rotation (it shows only with RoPE on)"},
    {Probe::r, "r", "the rotary width", "more than one rotating pair (rotary_dim > 2)"},
    {Probe::positions, "positions", "the token positions", "tokens at different positions"},
    {Probe::bias, "bias", "the biases", "the biases (it shows only with biases on)"},
    {Probe::qk_norm, "qk_norm", "QK-norm", "QK-norm (it shows only with the norm on)"},
    {Probe::window, "window", "the sliding window", "the sliding window (it shows only with the window on)"},
    {Probe::softcap, "softcap", "the soft-cap", "the soft-cap (it shows only with the cap on)"},
    {Probe::sinks, "sinks", "the attention sinks", "the sinks (it shows only with sinks on)"},
    {Probe::key_tile, "key tile", "whether Tk exceeds one key tile of a fused kernel (128 keys)",
     "more keys than one key tile of a fused kernel (Tk > 128)"},
};

}  // namespace

const ProbeInfo& probe_info(Probe p) {
  for (const ProbeInfo& info : kProbes)
    if (info.probe == p) return info;
  throw std::logic_error("localization: a probe without a table entry");
}

namespace {

// ---- QK-norm and cross-attention ----
// The norm off (the gains and their gradients out of the checks); a cross
// case at Tq = Tk (x_kv as long as x); and in a cross case the T variants
// move Tq with T (x's length is Tq there).
template <class Add>
void add_qk_norm_cross_variants(const CaseSpec& c, std::vector<Variant>& out, Add& add) {
  if (c.level != Level::mha) return;
  if (c.cross)
    for (Variant& v : out)
      if (v.spec.dims.T != c.dims.T) v.spec.dims.Tq = v.spec.dims.T;
  if (c.qk_norm.enabled)
    add(Probe::qk_norm, "qk_norm off", true, [](CaseSpec& v) {
      v.qk_norm.enabled = false;
      const auto& g = qk_norm_tensor_names();
      v.check.erase(std::remove_if(v.check.begin(), v.check.end(),
                                   [&](const std::string& t) { return std::find(g.begin(), g.end(), t) != g.end(); }),
                    v.check.end());
    });
  if (c.cross && c.dims.Tq != c.dims.Tk)
    add(Probe::Tq_ne_Tk, "Tq = Tk = " + std::to_string(c.dims.Tk), true,
        [](CaseSpec& v) { v.dims.Tq = v.dims.T = v.dims.Tk; });
}

std::vector<Variant> variants_of(const CaseSpec& c) {
  std::vector<Variant> out;
  // removes: the variant takes something away (a dim lowered to 1, Tq = Tk, the
  // mask, causal, the rotation, ...) rather than adding it (B = 2 where B is 1)
  auto add = [&](Probe probe, std::string change, bool removes, auto edit) {
    CaseSpec v = c;
    edit(v);
    v.name = c.name + " {" + change + "}";
    v.expect_fail = false;
    v.expect_diagnosis.clear();
    out.push_back({probe, std::move(change), removes, std::move(v)});
  };
  const Dims& d0 = c.dims;
  // One head has one kv head: the H variants drop Hkv (and an explicit d where D is kept).
  if (c.level == Level::mha) {
    const std::int64_t d = d0.H > 0 ? d0.head_dim() : d0.D;
    if (d0.B > 1) add(Probe::B, "B = 1", true, [](CaseSpec& v) { v.dims.B = 1; });
    else add(Probe::B, "B = 2", false, [](CaseSpec& v) { v.dims.B = 2; });
    if (d0.T > 1) add(Probe::T, "T = 1", true, [](CaseSpec& v) { v.dims.T = 1; });
    else add(Probe::T, "T = 4", false, [](CaseSpec& v) { v.dims.T = 4; });
    if (d0.H > 1) {
      add(Probe::H, "H = 1 (d kept, D = " + std::to_string(d) + ")", true,
          [d](CaseSpec& v) { v.dims.H = 1; v.dims.D = d; v.dims.Hkv = 0; });
      add(Probe::H_at_D, "H = 1 (D kept, d = " + std::to_string(d0.D) + ")", true,
          [](CaseSpec& v) { v.dims.H = 1; v.dims.Hkv = 0; v.dims.d = 0; });
    } else {
      add(Probe::H, "H = 2 (d kept, D = " + std::to_string(2 * d) + ")", false, [d](CaseSpec& v) { v.dims.H = 2; v.dims.D = 2 * d; });
      if (d0.D % 2 == 0)
        add(Probe::H_at_D, "H = 2 (D kept, d = " + std::to_string(d0.D / 2) + ")", false, [](CaseSpec& v) { v.dims.H = 2; });
    }
  } else if (c.level == Level::rope) {  // x [B, (H,) T, d]: the rotation alone
    if (d0.B > 1) add(Probe::B, "B = 1", true, [](CaseSpec& v) { v.dims.B = 1; });
    if (d0.T > 1) add(Probe::T, "T = 1", true, [](CaseSpec& v) { v.dims.T = 1; });
  } else {
    if (d0.B > 1) add(Probe::B, "B = 1", true, [](CaseSpec& v) { v.dims.B = 1; });
    else add(Probe::B, "B = 2", false, [](CaseSpec& v) { v.dims.B = 2; });
    // Tq and Tk apart: the same lengths, one query, more queries than keys; then both at 1.
    if (d0.Tq != d0.Tk)
      add(Probe::Tq_ne_Tk, "Tq = Tk = " + std::to_string(d0.Tk), true, [](CaseSpec& v) { v.dims.Tq = v.dims.Tk; });
    if (d0.Tq > 1) add(Probe::Tq, "Tq = 1", true, [](CaseSpec& v) { v.dims.Tq = 1; });
    if (d0.Tq <= d0.Tk)
      add(Probe::Tq_gt_Tk, "Tq = " + std::to_string(d0.Tk + 1) + " > Tk", false, [](CaseSpec& v) { v.dims.Tq = v.dims.Tk + 1; });
    if (d0.Tq > 1 || d0.Tk > 1) add(Probe::T_both, "Tq = Tk = 1", true, [](CaseSpec& v) { v.dims.Tq = v.dims.Tk = 1; });
    else add(Probe::T_both, "Tq = Tk = 4", false, [](CaseSpec& v) { v.dims.Tq = v.dims.Tk = 4; });
    if (d0.H > 1) add(Probe::H, "H = 1", true, [](CaseSpec& v) { v.dims.H = 1; v.dims.Hkv = 0; });
    else add(Probe::H, "H = 2", false, [](CaseSpec& v) { v.dims.H = 2; });
    if (d0.d > 1) add(Probe::d, "d = 1", true, [](CaseSpec& v) { v.dims.d = 1; });
    if (!c.mask_file.empty()) add(Probe::mask, "mask off", true, [](CaseSpec& v) { v.mask_file.clear(); v.files.reset(); });
  }
  if (c.causal) add(Probe::causal, "causal off", true, [](CaseSpec& v) { v.causal = false; });
  // Biases off (and their gradients out of the checks): a failure that needs them lives in them.
  if (c.bias)
    add(Probe::bias, "bias off", true, [](CaseSpec& v) {
      v.bias = false;
      const auto& b = bias_tensor_names();
      v.check.erase(std::remove_if(v.check.begin(), v.check.end(),
                                   [&](const std::string& t) { return std::find(b.begin(), b.end(), t) != b.end(); }),
                    v.check.end());
    });
  // Sliding windows, soft-capping, sinks: each turned off alone (dsinks out of the checks).
  if (c.window.enabled()) add(Probe::window, "window off", true, [](CaseSpec& v) { v.window = {}; });
  if (c.softcap > 0) add(Probe::softcap, "softcap off", true, [](CaseSpec& v) { v.softcap = 0; });
  if (c.sinks && !c.is_reference())
    add(Probe::sinks, "sinks off", true, [](CaseSpec& v) {
      v.sinks = false;
      v.check.erase(std::remove(v.check.begin(), v.check.end(), std::string("dsinks")), v.check.end());
    });
  // Sinks past one key tile: the keys cut to one tile (a sink added per tile then shows no more).
  constexpr std::int64_t tile = diagnosis::kKeyTile;  // a constant: the lambda below needs no capture of it
  const bool kv_length = c.level == Level::core || c.cross;  // else T is both lengths
  if (c.sinks && !c.is_reference() && c.mask_file.empty() && (kv_length ? d0.Tk : d0.T) > tile)
    add(Probe::key_tile, "Tk = " + std::to_string(tile) + " (one key tile)", true, [kv_length](CaseSpec& v) {
      if (!kv_length) v.dims.T = tile;
      else if (v.dims.Tq == v.dims.Tk) v.dims.Tq = v.dims.Tk = tile;
      else v.dims.Tk = tile;
    });
  // Grouped kv heads: plain multi-head (G = 1) and one shared kv head (MQA).
  if (d0.Hkv > 1 && d0.Hkv < d0.H) {
    add(Probe::G, "Hkv = H (G = 1)", true, [](CaseSpec& v) { v.dims.Hkv = 0; });
    add(Probe::Hkv, "Hkv = 1", true, [](CaseSpec& v) { v.dims.Hkv = 1; });
  }
  // RoPE: the rotation off (taps go with it), one pair (r = 2: both pairings and
  // every base agree), every token at one position (scores then see none).
  if (c.rope && c.level != Level::rope) {
    add(Probe::rope, "rope off", true, [](CaseSpec& v) {
      v.rope.reset();
      v.check.erase(std::remove_if(v.check.begin(), v.check.end(),
                                   [&](const std::string& t) { return std::find(v.taps.begin(), v.taps.end(), t) != v.taps.end(); }),
                    v.check.end());
      v.taps.clear();
    });
  }
  if (c.rope) {
    const std::int64_t r = c.rope->rotary_dim > 0 ? c.rope->rotary_dim : d0.head_dim();
    if (r > 2) add(Probe::r, "rotary_dim = 2", true, [](CaseSpec& v) { v.rope->rotary_dim = 2; });
    const std::int64_t t = c.level == Level::core ? d0.Tk : d0.T;
    // (explicit positions need Tq = Tk at the core level)
    if (t > 1 && (c.level != Level::core || d0.Tq == d0.Tk))
      add(Probe::positions, "positions constant (all 5)", true, [t](CaseSpec& v) {
        v.rope->rows = {std::vector<std::int64_t>(static_cast<std::size_t>(t), 5)};
        v.rope->per_row = false;
        v.rope->generator.clear();
        v.rope->offset = 0;
      });
  }
  add_qk_norm_cross_variants(c, out, add);
  return out;
}


ErrorSpread spread_of(const std::string& name, const Tensor& a, const Tensor& b, const CaseSpec& c) {
  ErrorSpread s;
  s.tensor = name;
  double bmax = 0;
  for (double v : b.to_vector()) bmax = std::max(bmax, std::abs(v));
  const Tolerance tol = c.tolerance_for(name);
  s.tolerance = tol.atol + tol.rtol * bmax;
  // per batch row, position and head, along the dims the axes table names
  const TensorAxes axes = axes_of(c.level, name, a.shape(), head_blocks(c, name));
  if (const auto batch = axes.find(AxisRole::batch)) s.per_batch = slot_max(a, b, static_cast<std::int64_t>(*batch), 0);
  if (const auto pos = axes.find(AxisRole::position)) s.per_position = slot_max(a, b, static_cast<std::int64_t>(*pos), 0);
  if (const auto head = axes.head_dim()) {
    const auto [dim, width] = *head;
    s.per_head = slot_max(a, b, static_cast<std::int64_t>(dim), axes.dims[dim].role == AxisRole::heads ? width : 0);
  }
  return s;
}

// "heads 0, 1 of 2" / "all 3 heads" / "no head"
std::string slots_str(const std::vector<double>& v, double tol, const std::string& noun) {
  std::vector<std::string> bad;
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!(v[i] <= tol)) bad.push_back(std::to_string(i));
  if (bad.empty()) return "no " + noun;
  if (bad.size() == v.size())
    return v.size() == 1 ? "its only " + noun : "all " + std::to_string(v.size()) + " " + noun + "s";
  return noun + (bad.size() > 1 ? "s " : " ") + join(bad, ", ") + " of " + std::to_string(v.size());
}

std::string where_str(const std::vector<ErrorSpread>& spread) {
  std::vector<std::string> parts;
  for (const auto& s : spread) {
    std::vector<std::string> bits;
    if (!s.per_head.empty()) bits.push_back(slots_str(s.per_head, s.tolerance, "head"));
    if (!s.per_position.empty()) bits.push_back(slots_str(s.per_position, s.tolerance, "position"));
    if (!s.per_batch.empty()) bits.push_back(slots_str(s.per_batch, s.tolerance, "batch item"));
    parts.push_back(s.tensor + ": " + join(bits, ", "));
  }
  return join(parts, "; ");
}

// "a", "a and b", "a, b and c"
// What a dim is, for "it does not depend on ..."
std::string dim_words(std::string_view dim) {
  for (const ProbeInfo& p : kProbes)
    if (p.dim == dim) return std::string(p.words);
  return "the " + std::string(dim);
}

std::string need_words(std::string_view dim) {
  for (const ProbeInfo& p : kProbes)
    if (p.dim == dim) return p.needs.empty() ? std::string(p.words) + " above 1" : std::string(p.needs);
  return "the " + std::string(dim) + " above 1";
}

}  // namespace

std::vector<VariantRun> run_variants(const CaseSpec& c, const PluginRegistry& registry, const RunOptions& options) {
  RunOptions quiet = options;
  quiet.keep_tensors = true;      // the diagnosis re-checks its hypotheses on them
  quiet.on_case_start = nullptr;  // the callbacks are the caller's, for the cases it asked for
  quiet.on_case_done = nullptr;
  std::vector<VariantRun> runs;
  for (auto& v : variants_of(c)) {
    VariantRun run{std::move(v), {}, {}, {}};
    try {
      run.result = run_case(run.variant.spec, registry, quiet, &run.inputs);
    } catch (const std::exception& e) {
      run.error = e.what();
    }
    runs.push_back(std::move(run));
  }
  return runs;
}


Localization localize(const CaseResult& failed, const PluginRegistry& registry,
                      const RunOptions& options) {
  if (failed.spec.is_reference()) return localize_from(failed, {});
  return localize_from(failed, run_variants(failed.spec, registry, options));
}

Localization localize_from(const CaseResult& failed, const std::vector<VariantRun>& runs) {
  Localization loc;
  const CaseSpec& c = failed.spec;
  for (const auto& t : failed.tensors) {
    if (t.allclose || !t.problem.empty()) continue;
    const Tensor* a = find_tensor(failed.lhs, t.name);
    const Tensor* b = find_tensor(failed.rhs, t.name);
    if (a && b && a->defined() && b->defined() && a->shape() == b->shape())
      loc.spread.push_back(spread_of(t.name, *a, *b, c));
  }
  loc.where = where_str(loc.spread);

  if (c.is_reference()) {
    loc.sentence = "A reference cannot be re-run at other shapes (its files fix them), so nothing is localized; "
                   "to localize, run `headgrad check FILE.py:FUNCTION` on the function that wrote it.";
    return loc;
  }
  loc.rows.push_back({"as failed", describe_case(c), CaseStatus::fail, failed.max_abs(), ""});
  std::vector<std::string> depends, independent, not_run;
  for (const auto& run : runs) {
    const Variant& v = run.variant;
    if (!run.error.empty()) {
      loc.rows.push_back({v.change, describe_case(v.spec), CaseStatus::error, 0, run.error});
      not_run.push_back(v.change);
      continue;
    }
    const CaseResult& r = run.result;
    loc.rows.push_back({v.change, describe_case(v.spec), r.status, r.max_abs(), r.cause});
    if (r.status == CaseStatus::error) not_run.push_back(v.change);
    if (!probe_info(v.probe).counts || r.status == CaseStatus::error) continue;
    const bool passes = r.status == CaseStatus::pass;
    if (v.removes && passes) depends.emplace_back(v.dim());
    else if (!passes) independent.emplace_back(v.dim());
  }
  loc.depends_on = depends;
  loc.independent_of = independent;

  std::vector<std::string> gone, needs, keep;
  for (const auto& run : runs)
    if (std::find(depends.begin(), depends.end(), run.variant.dim()) != depends.end()) gone.push_back(run.variant.change);
  for (const auto& d : depends) needs.push_back(need_words(d));
  for (const auto& d : independent) keep.push_back(dim_words(d));
  if (!depends.empty()) {
    loc.sentence = "The failure disappears at " + and_list(gone) + ": it needs " + and_list(needs);
    loc.sentence += keep.empty() ? "." : "; it does not depend on " + join(keep, ", ") + ".";
  } else if (!keep.empty()) {
    loc.sentence = std::string(not_run.empty() ? "The failure shows at every shape tried"
                                               : "The failure shows at every variant that ran") +
                   ": it does not depend on " + join(keep, ", ") + ".";
  } else {
    loc.sentence = "No variant could be run";
    loc.sentence += c.mask_file.empty() ? "." : " (the mask file fixes B, Tq and Tk).";
  }
  if (!not_run.empty() && !(depends.empty() && keep.empty()))
    loc.sentence += " Could not run: " + join(not_run) +
                    (c.mask_file.empty() ? "" : " (the mask file fixes B, Tq and Tk)") + "; see the table.";
  return loc;
}

}  // namespace headgrad::analysis
