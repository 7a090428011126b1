#include "analysis/analyze.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <sstream>

#include <headgrad/log.hpp>

#include "analysis/catalog.hpp"
#include "analysis/hypotheses.hpp"
#include "runner/execute.hpp"
#include "runner/inputs.hpp"
#include "runner/report.hpp"

namespace headgrad::analysis {

using namespace runner;

namespace {

using diagnosis::Bug;
using diagnosis::bug_catalog;
using diagnosis::bug_info;

std::string fmt_g(double v) {
  std::ostringstream o;
  o.precision(2);
  o << v;
  return o.str();
}

// ---------------------------------------------------------------- localization

struct Variant {
  std::string dim;       // what the variant probes: "B", "T", "H", "H@D", "Tq", "Tq!=Tk", "Tq>Tk", "d", "mask", "causal", "bias"
  std::string change;    // "B = 1"
  bool removes = false;  // takes away something a bug may need (a dim at 1, Tq = Tk, the mask): passing there is dependence
  CaseSpec spec;
};

std::vector<Variant> variants_of(const CaseSpec& c) {
  std::vector<Variant> out;
  auto add = [&](std::string dim, std::string change, auto edit) {
    CaseSpec v = c;
    edit(v);
    v.name = c.name + " {" + change + "}";
    v.expect_fail = false;
    v.expect_diagnosis.clear();
    const bool removes = change.find("= 1") != std::string::npos || dim == "Tq!=Tk" || dim == "mask" ||
                         dim == "causal" || dim == "rope" || dim == "r" || dim == "positions" || dim == "bias";
    out.push_back({std::move(dim), std::move(change), removes, std::move(v)});
  };
  const Dims& d0 = c.dims;
  // One head has one kv head: the H variants drop Hkv (and an explicit d where D is kept).
  if (c.level == Level::mha) {
    const std::int64_t d = d0.H > 0 ? d0.head_dim() : d0.D;
    if (d0.B > 1) add("B", "B = 1", [](CaseSpec& v) { v.dims.B = 1; });
    else add("B", "B = 2", [](CaseSpec& v) { v.dims.B = 2; });
    if (d0.T > 1) add("T", "T = 1", [](CaseSpec& v) { v.dims.T = 1; });
    else add("T", "T = 4", [](CaseSpec& v) { v.dims.T = 4; });
    if (d0.H > 1) {
      add("H", "H = 1 (d kept, D = " + std::to_string(d) + ")",
          [d](CaseSpec& v) { v.dims.H = 1; v.dims.D = d; v.dims.Hkv = 0; });
      add("H@D", "H = 1 (D kept, d = " + std::to_string(d0.D) + ")",
          [](CaseSpec& v) { v.dims.H = 1; v.dims.Hkv = 0; v.dims.d = 0; });
    } else {
      add("H", "H = 2 (d kept, D = " + std::to_string(2 * d) + ")", [d](CaseSpec& v) { v.dims.H = 2; v.dims.D = 2 * d; });
      if (d0.D % 2 == 0)
        add("H@D", "H = 2 (D kept, d = " + std::to_string(d0.D / 2) + ")", [](CaseSpec& v) { v.dims.H = 2; });
    }
  } else if (c.level == Level::rope) {  // x [B, (H,) T, d]: the rotation alone
    if (d0.B > 1) add("B", "B = 1", [](CaseSpec& v) { v.dims.B = 1; });
    if (d0.T > 1) add("T", "T = 1", [](CaseSpec& v) { v.dims.T = 1; });
  } else {
    if (d0.B > 1) add("B", "B = 1", [](CaseSpec& v) { v.dims.B = 1; });
    else add("B", "B = 2", [](CaseSpec& v) { v.dims.B = 2; });
    // Tq and Tk apart: the same lengths, one query, more queries than keys; then both at 1.
    if (d0.Tq != d0.Tk)
      add("Tq!=Tk", "Tq = Tk = " + std::to_string(d0.Tk), [](CaseSpec& v) { v.dims.Tq = v.dims.Tk; });
    if (d0.Tq > 1) add("Tq", "Tq = 1", [](CaseSpec& v) { v.dims.Tq = 1; });
    if (d0.Tq <= d0.Tk)
      add("Tq>Tk", "Tq = " + std::to_string(d0.Tk + 1) + " > Tk", [](CaseSpec& v) { v.dims.Tq = v.dims.Tk + 1; });
    if (d0.Tq > 1 || d0.Tk > 1) add("T", "Tq = Tk = 1", [](CaseSpec& v) { v.dims.Tq = v.dims.Tk = 1; });
    else add("T", "Tq = Tk = 4", [](CaseSpec& v) { v.dims.Tq = v.dims.Tk = 4; });
    if (d0.H > 1) add("H", "H = 1", [](CaseSpec& v) { v.dims.H = 1; v.dims.Hkv = 0; });
    else add("H", "H = 2", [](CaseSpec& v) { v.dims.H = 2; });
    if (d0.d > 1) add("d", "d = 1", [](CaseSpec& v) { v.dims.d = 1; });
    if (!c.mask_file.empty()) add("mask", "mask off", [](CaseSpec& v) { v.mask_file.clear(); v.files.reset(); });
  }
  if (c.causal) add("causal", "causal off", [](CaseSpec& v) { v.causal = false; });
  // Biases off (and their gradients out of the checks): a failure that needs them lives in them.
  if (c.bias)
    add("bias", "bias off", [](CaseSpec& v) {
      v.bias = false;
      const auto& b = bias_tensor_names();
      v.check.erase(std::remove_if(v.check.begin(), v.check.end(),
                                   [&](const std::string& t) { return std::find(b.begin(), b.end(), t) != b.end(); }),
                    v.check.end());
    });
  // Grouped kv heads: plain multi-head (G = 1) and one shared kv head (MQA).
  if (d0.Hkv > 1 && d0.Hkv < d0.H) {
    add("G", "Hkv = H (G = 1)", [](CaseSpec& v) { v.dims.Hkv = 0; });
    add("Hkv", "Hkv = 1", [](CaseSpec& v) { v.dims.Hkv = 1; });
  }
  // RoPE: the rotation off (taps go with it), one pair (r = 2: both pairings and
  // every base agree), every token at one position (scores then see none).
  if (c.rope && c.level != Level::rope) {
    add("rope", "rope off", [](CaseSpec& v) {
      v.rope.reset();
      v.check.erase(std::remove_if(v.check.begin(), v.check.end(),
                                   [&](const std::string& t) { return std::find(v.taps.begin(), v.taps.end(), t) != v.taps.end(); }),
                    v.check.end());
      v.taps.clear();
    });
  }
  if (c.rope) {
    const std::int64_t r = c.rope->rotary_dim > 0 ? c.rope->rotary_dim : d0.head_dim();
    if (r > 2) add("r", "rotary_dim = 2", [](CaseSpec& v) { v.rope->rotary_dim = 2; });
    const std::int64_t t = c.level == Level::core ? d0.Tk : d0.T;
    // (explicit positions need Tq = Tk at the core level)
    if (t > 1 && (c.level != Level::core || d0.Tq == d0.Tk))
      add("positions", "positions constant (all 5)", [t](CaseSpec& v) {
        v.rope->rows = {std::vector<std::int64_t>(static_cast<std::size_t>(t), 5)};
        v.rope->per_row = false;
        v.rope->generator.clear();
        v.rope->offset = 0;
      });
  }
  return out;
}

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

ErrorSpread spread_of(const std::string& name, const Tensor& a, const Tensor& b, const CaseSpec& c) {
  ErrorSpread s;
  s.tensor = name;
  double bmax = 0;
  for (double v : b.to_vector()) bmax = std::max(bmax, std::abs(v));
  const Tolerance tol = c.tolerance_for(name);
  s.tolerance = tol.atol + tol.rtol * bmax;
  if (c.level == Level::mha && name != "q_rot" && name != "k_rot") {  // taps are [B, H, T, d]
    const std::int64_t heads = std::max<std::int64_t>(c.dims.H, 1);
    const std::int64_t d = a.size(-1) / heads;
    if (name == "out" || name == "dx") {  // [B, T, D]
      s.per_batch = slot_max(a, b, 0, 0);
      s.per_position = slot_max(a, b, 1, 0);
      s.per_head = slot_max(a, b, 2, d);
    } else if (name == "dwo") {  // [D, D]: head h owns columns [h*d, (h+1)*d)
      s.per_head = slot_max(a, b, 1, d);
    } else if (name == "dwq" || name == "dbq") {  // [H*d, D], [H*d]: head h owns rows [h*d, (h+1)*d)
      s.per_head = slot_max(a, b, 0, a.size(0) / heads);
    } else if (name == "dbo") {  // [D]: no head owns an output feature
    } else {  // dwk, dwv [Hkv*d, D], dbk, dbv [Hkv*d]: kv head j owns rows [j*d, (j+1)*d)
      s.per_head = slot_max(a, b, 0, a.size(0) / std::max<std::int64_t>(c.dims.kv_heads(), 1));
    }
  } else if (a.dim() == 4) {  // [B, H, T, d]
    s.per_batch = slot_max(a, b, 0, 0);
    s.per_head = slot_max(a, b, 1, 0);
    s.per_position = slot_max(a, b, 2, 0);
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
std::string and_list(const std::vector<std::string>& items) {
  if (items.size() <= 1) return join(items);
  return join(std::vector<std::string>(items.begin(), items.end() - 1)) + " and " + items.back();
}

// What a dim is, for "it does not depend on ..."
std::string dim_words(const std::string& dim) {
  if (dim == "B") return "the batch size";
  if (dim == "T") return "the sequence length";
  if (dim == "Tq") return "the query count";
  if (dim == "Tq!=Tk") return "whether Tq = Tk";
  if (dim == "Tq>Tk") return "whether Tq > Tk";
  if (dim == "d") return "the head width";
  if (dim == "mask") return "the mask file";
  if (dim == "causal") return "the causal mask";
  if (dim == "G") return "the query heads per kv head (G = H / Hkv)";
  if (dim == "Hkv") return "the kv head count";
  if (dim == "rope") return "the rotation (RoPE)";
  if (dim == "r") return "the rotary width";
  if (dim == "positions") return "the token positions";
  if (dim == "bias") return "the biases";
  return "the head count";
}

// What the failure needs when the variant that takes it away passes.
std::string need_words(const std::string& dim) {
  if (dim == "Tq!=Tk") return "Tq != Tk";
  if (dim == "Tq") return "more than one query (Tq > 1)";
  if (dim == "d") return "a head width above 1";
  if (dim == "mask") return "the mask (it shows only with the mask)";
  if (dim == "causal") return "the causal mask (it shows only when causal)";
  if (dim == "rope") return "the rotation (it shows only with RoPE on)";
  if (dim == "r") return "more than one rotating pair (rotary_dim > 2)";
  if (dim == "positions") return "tokens at different positions";
  if (dim == "bias") return "the biases (it shows only with biases on)";
  return dim_words(dim) + " above 1";
}

// One variant as run: its result (tensors kept) and the inputs its sides got.
struct VariantRun {
  Variant variant;
  CaseResult result;
  CaseInputs inputs;
  std::string error;  // the variant could not run: why
};

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

Localization localize_from(const CaseResult& failed, const std::vector<VariantRun>& runs);

}  // namespace

Localization localize(const CaseResult& failed, const PluginRegistry& registry,
                      const RunOptions& options) {
  if (failed.spec.is_reference()) return localize_from(failed, {});
  return localize_from(failed, run_variants(failed.spec, registry, options));
}

namespace {

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
    loc.sentence = "A reference case has one shape (its files): it cannot be re-run at others.";
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
    if (v.dim == "H@D" || v.dim == "Tq>Tk" || r.status == CaseStatus::error) continue;
    const bool passes = r.status == CaseStatus::pass;
    if (v.removes && passes) depends.push_back(v.dim);
    else if (!passes) independent.push_back(v.dim);
  }
  loc.depends_on = depends;
  loc.independent_of = independent;

  std::vector<std::string> gone, needs, keep;
  for (const auto& run : runs)
    if (std::find(depends.begin(), depends.end(), run.variant.dim) != depends.end()) gone.push_back(run.variant.change);
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

}  // namespace

// ---------------------------------------------------------------- diagnosis

namespace {

Tensor grad_or_zeros(const Variable& v) {
  return v.grad().defined() ? v.grad() : Tensor::zeros(v.shape(), v.dtype());
}

// The tensors a side would produce if it had exactly `bug` (none: correct).
TensorSet hypothesis_tensors(const CaseSpec& c, const CaseInputs& in, std::optional<Bug> bug) {
  AttentionSpec spec = attention_spec(c, in);
  if (!c.taps.empty()) spec.rope_taps = std::make_shared<RopeTaps>();  // q_rot, k_rot as the hypothesis rotates
  TensorSet out;
  if (c.level == Level::rope) {
    Variable x(in.x, true);
    Variable y = diagnosis::hypothesis_rope(x, spec.rope, bug);
    sum(mul(y, Variable(in.r))).backward();
    return {{"out", y.data()}, {"dx", grad_or_zeros(x)}};
  }
  if (c.level == Level::mha) {
    Variable x(in.x, true);
    const MhaWeights w = leaf_weights(in);
    Variable y = diagnosis::hypothesis_mha(x, w, spec, bug);
    sum(mul(y, Variable(in.r))).backward();
    out = {{"out", y.data()},          {"dx", grad_or_zeros(x)},    {"dwq", grad_or_zeros(w.wq)},
           {"dwk", grad_or_zeros(w.wk)}, {"dwv", grad_or_zeros(w.wv)}, {"dwo", grad_or_zeros(w.wo)}};
    if (w.has_bias())
      out.insert(out.end(), {{"dbq", grad_or_zeros(w.bq)}, {"dbk", grad_or_zeros(w.bk)},
                             {"dbv", grad_or_zeros(w.bv)}, {"dbo", grad_or_zeros(w.bo)}});
  } else {
    Variable q(in.q, true), k(in.k, true), v(in.v, true);
    Variable y = diagnosis::hypothesis_core(q, k, v, spec, bug);
    sum(mul(y, Variable(in.r))).backward();
    out = {{"out", y.data()}, {"dq", grad_or_zeros(q)}, {"dk", grad_or_zeros(k)}, {"dv", grad_or_zeros(v)}};
  }
  for (const auto& tap : c.taps)
    out.push_back({tap, assemble_tap(tap == "q_rot" ? spec.rope_taps->q_rot : spec.rope_taps->k_rot)});
  return out;
}

// max over the checked tensors of |a - b| / (atol + rtol |b|), b the hypothesis;
// infinity when a tensor is missing or shaped differently.
std::pair<double, double> fit_ratio(const TensorSet& side, const TensorSet& hyp, const CaseSpec& c) {
  double worst = 0, max_abs = 0;
  for (const auto& name : c.check) {
    const Tensor* a = find_tensor(side, name);
    const Tensor* b = find_tensor(hyp, name);
    if (!b || !b->defined()) continue;
    // A gradient the side never produced (its input unused) is a zero gradient.
    const Tensor av = a && a->defined() ? *a : Tensor::zeros(b->shape(), b->dtype());
    if (av.shape() != b->shape()) return {INFINITY, INFINITY};
    const Tolerance tol = c.tolerance_for(name);
    const auto va = av.to_vector(), vb = b->to_vector();
    for (std::size_t i = 0; i < va.size(); ++i) {
      // A NaN or inf the hypothesis predicts where the side has it too is reproduced.
      if (!std::isfinite(va[i]) || !std::isfinite(vb[i])) {
        if ((std::isnan(va[i]) && std::isnan(vb[i])) || va[i] == vb[i]) continue;
        return {INFINITY, INFINITY};
      }
      const double e = std::abs(va[i] - vb[i]);
      max_abs = std::max(max_abs, e);
      worst = std::max(worst, e / (tol.atol + tol.rtol * std::abs(vb[i])));
    }
  }
  return {worst, max_abs};
}

// A near miss is named only within this factor of the tolerance.
constexpr double kNearFactor = 10;

// dx.sentence from its fits (best first), ruled_out and near.
void write_verdict(Diagnosis& dx) {
  if (dx.fits.empty()) {
    dx.sentence = "No known bug reproduces this failure";
    if (!dx.ruled_out.empty()) dx.sentence += "; ruled out: " + join(dx.ruled_out, "; ");
    if (!dx.near.empty())
      dx.sentence += std::string(dx.ruled_out.empty() ? "" : ";") + " (closest: " + dx.near.front().bug + " on " +
                     dx.near.front().side + ", " + fmt_g(dx.near.front().worst_ratio) + "x outside the tolerance)";
    dx.sentence += "; see where the error lives and the localization.";
    if (!dx.evidence.empty()) dx.sentence += " Evidence: " + join(dx.evidence, "; ") + ".";
    return;
  }
  const HypothesisFit& best = dx.fits.front();
  dx.judged_side = best.side;
  const auto& info = bug_info(*diagnosis::bug_from_name(best.bug));
  dx.sentence = best.side + " reproduces " + best.bug + " (every checked tensor within tolerance, max |Δ| " +
                fmt_g(best.max_abs) + "): " + std::string(info.explanation) + ". Fix: " +
                std::string(info.fix) + ".";
  if (!dx.correct_side.empty()) dx.sentence += " " + dx.correct_side + " matches the correct attention.";
  if (dx.fits.size() > 1) {
    std::vector<std::string> others;
    for (std::size_t i = 1; i < dx.fits.size(); ++i) others.push_back(dx.fits[i].bug);
    dx.sentence += " Also consistent at this shape: " + join(others, ", ") + ".";
  }
  if (!dx.ruled_out.empty()) dx.sentence += " Ruled out: " + join(dx.ruled_out, "; ") + ".";
  if (!dx.evidence.empty()) dx.sentence += " Evidence: " + join(dx.evidence, "; ") + ".";
}

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
  if (!c.is_reference() && !failed.rhs.empty()) sides.push_back({failed.rhs_label, &failed.rhs});
  if (sides.empty()) {
    dx.sentence = "No tensors to diagnose: " + (failed.cause.empty() ? "no side produced a result" : failed.cause);
    return dx;
  }

  const TensorSet correct = hypothesis_tensors(c, in, std::nullopt);
  for (const auto& s : sides)
    if (fit_ratio(*s.tensors, correct, c).first <= 1.0) dx.correct_side = s.label;

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
    for (const auto& s : sides) {
      if (s.label == dx.correct_side) continue;
      const auto [ratio, max_abs] = fit_ratio(*s.tensors, hyp, c);
      HypothesisFit fit{std::string(info.name), std::string(info.explanation), std::string(info.fix), s.label,
                        ratio, max_abs};
      if (ratio <= 1.0) dx.fits.push_back(fit);
      else if (!closest || ratio < closest->worst_ratio) closest = fit;
    }
  }
  std::stable_sort(dx.fits.begin(), dx.fits.end(),
                   [](const auto& a, const auto& b) { return a.worst_ratio < b.worst_ratio; });
  // A near miss is worth naming only when it is close to the tolerance.
  if (closest && closest->worst_ratio <= kNearFactor) dx.near.push_back(*closest);
  write_verdict(dx);
  return dx;
}

namespace {

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
  TensorSet correct = hypothesis_tensors(c, in, std::nullopt);
  for (auto& [name, t] : correct) {
    if (name == "dwq" || name == "dbq") t = diagnosis::reorder_blocks(t, 0, d, order);
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

}  // namespace

// ---------------------------------------------------------------- RoPE clues

namespace {

// What tells RoPE bugs apart, read off the failing case itself (it holds also
// when no hypothesis fits, e.g. a user's own wrong kernel): which tensors stay
// exact, whether the error grows with the absolute position, and whether the
// pass-through dims of the taps are bitwise equal.
std::vector<std::string> rope_clues(const CaseResult& failed, const CaseInputs& in) {
  std::vector<std::string> out;
  const CaseSpec& c = failed.spec;
  if (!c.rope) return out;
  // exact: 1, differs: 0, not compared: -1
  auto state = [&](const std::string& name) {
    for (const auto& t : failed.tensors)
      if (t.name == name && t.problem.empty()) return t.allclose ? 1 : 0;
    return -1;
  };
  const bool mha = c.level == Level::mha, core = c.level == Level::core;
  struct Signature {
    std::vector<std::string> same, differ;
    std::string text;
  };
  const Signature sig = mha    ? Signature{{"out", "dwv", "dwo"}, {"dx", "dwq", "dwk"}, "= X X X = = over out, dx, dwq, dwk, dwv, dwo"}
                        : core ? Signature{{"out", "dv"}, {"dq", "dk"}, "= X X = over out, dq, dk, dv"}
                               : Signature{{"out"}, {"dx"}, "= X over out, dx"};
  if (std::all_of(sig.same.begin(), sig.same.end(), [&](const std::string& n) { return state(n) == 1; }) &&
      std::all_of(sig.differ.begin(), sig.differ.end(), [&](const std::string& n) { return state(n) == 0; }))
    out.push_back("Signature " + sig.text +
                  ": the forward is exact and only the gradients through the rotation differ, the mark of a RoPE "
                  "backward that is not R^T.");

  // The error per batch row against the row's positions: scores see position
  // differences only, so a row-to-row growth at the same tokens is absolute.
  const Tensor* a = find_tensor(failed.lhs, "out");
  const Tensor* b = find_tensor(failed.rhs, "out");
  const Tensor& pos = in.positions;
  const std::int64_t tokens = core ? c.dims.Tq : c.dims.T;
  if (state("out") == 0 && a && b && a->defined() && b->defined() && a->shape() == b->shape() && pos.defined() && pos.dim() == 2 &&
      pos.size(0) == a->size(0) && pos.size(0) > 1 && pos.size(1) == tokens && (!core || c.dims.Tq == c.dims.Tk)) {
    const std::vector<double> err = slot_max(*a, *b, 0, 0);  // per batch row
    const auto p = pos.contiguous().to_vector();
    std::vector<double> mean(err.size(), 0.0);
    for (std::size_t i = 0; i < p.size(); ++i) mean[i / static_cast<std::size_t>(tokens)] += p[i] / static_cast<double>(tokens);
    const std::size_t near = static_cast<std::size_t>(std::min_element(mean.begin(), mean.end()) - mean.begin());
    const std::size_t far = static_cast<std::size_t>(std::max_element(mean.begin(), mean.end()) - mean.begin());
    if (mean[far] - mean[near] >= 100 && err[far] > 10 * err[near])
      out.push_back("The error grows with the absolute position: batch row " + std::to_string(far) + " (positions about " +
                    fmt_g(mean[far]) + ") errs by " + fmt_g(err[far]) + ", row " + std::to_string(near) + " (about " +
                    fmt_g(mean[near]) + ") by " + fmt_g(err[near]) +
                    ", which no position difference explains: angle tables built below the compute precision "
                    "(float32 cos/sin).");
  }

  // Partial rotary: dims [r, d) of the taps (at the rope level: of out, against x)
  // must pass through bitwise.
  std::vector<std::pair<std::string, std::pair<const Tensor*, const Tensor*>>> pass;
  for (const auto& tap : c.taps) pass.push_back({tap, {find_tensor(failed.lhs, tap), find_tensor(failed.rhs, tap)}});
  if (c.level == Level::rope) {
    pass.push_back({failed.lhs_label + "'s out", {find_tensor(failed.lhs, "out"), &in.x}});
    if (!c.is_reference()) pass.push_back({failed.rhs_label + "'s out", {find_tensor(failed.rhs, "out"), &in.x}});
  }
  for (const auto& [tap, tensors] : pass) {
    const Tensor* ta = tensors.first;
    const Tensor* tb = tensors.second;
    if (!ta || !tb || !ta->defined() || !tb->defined() || ta->shape() != tb->shape() || ta->dim() < 1) continue;
    const std::int64_t d = ta->size(-1), r = c.rope->rotary_dim > 0 ? c.rope->rotary_dim : d;
    if (r >= d) continue;
    const auto va = ta->contiguous().to_vector(), vb = tb->contiguous().to_vector();
    std::int64_t differing = 0;
    for (std::size_t i = 0; i < va.size(); ++i)
      if (static_cast<std::int64_t>(i) % d >= r && va[i] != vb[i]) ++differing;
    if (differing > 0)
      out.push_back("The pass-through dims [" + std::to_string(r) + ", " + std::to_string(d) + ") of " + tap + " differ in " +
                    std::to_string(differing) + " elements (they must pass through unchanged, bitwise): partial rotary on "
                    "the wrong span.");
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- weak suites

namespace {

// A query row with no key to attend: bottom-right causal with Tq > Tk, or a
// mask (file or reference) with a row of False.
bool has_fully_masked_row(const CaseSpec& c) {
  if (c.level == Level::core && c.causal && c.causal_alignment == CausalAlignment::bottom_right &&
      c.dims.Tq > c.dims.Tk)
    return true;
  if (!c.files || !c.files->mask.defined() || c.files->mask.dim() < 1) return false;
  const std::int64_t tk = c.files->mask.size(-1);
  const auto v = c.files->mask.contiguous().to_vector();
  for (std::size_t row = 0; tk > 0 && row + static_cast<std::size_t>(tk) <= v.size(); row += static_cast<std::size_t>(tk))
    if (std::all_of(v.begin() + static_cast<std::ptrdiff_t>(row), v.begin() + static_cast<std::ptrdiff_t>(row) + tk,
                    [](double x) { return x == 0; }))
      return true;
  return false;
}

// Seeded q, k are unit normal, so |q.k| is about sqrt(d) and the largest score
// a few times scale * sqrt(d): past ln(max) of the dtype, exp overflows.
bool has_large_logits(const CaseSpec& c) {
  if (!c.scale || c.is_reference()) return false;
  // ln of the largest finite value: float16 65504, bfloat16 ~ float32 3.4e38
  const double limit = c.dtype == DType::float16                                   ? 11.09
                       : c.dtype == DType::float32 || c.dtype == DType::bfloat16 ? 88.7
                                                                                  : 709.8;
  return 3 * *c.scale * std::sqrt(static_cast<double>(std::max<std::int64_t>(c.dims.head_dim(), 1))) > limit;
}

// The token positions a RoPE case rotates at (keys; queries add q_offset),
// flattened: a reference's positions.npy, the block's list or generator, or offset + t.
std::vector<std::int64_t> case_positions(const CaseSpec& c) {
  const std::int64_t t = c.level == Level::core ? c.dims.Tk : c.dims.T;
  if (c.files && c.files->positions.defined()) {
    std::vector<std::int64_t> p;
    for (double v : c.files->positions.to_vector()) p.push_back(static_cast<std::int64_t>(v));
    return p;
  }
  Shape shape;
  std::vector<std::int64_t> p = rope_positions(*c.rope, c.dims.B, t, shape);
  if (p.empty())
    for (std::int64_t i = 0; i < t; ++i) p.push_back(c.rope->offset + i);
  return p;
}

// Every row of T positions is an arange + c: a plugin that ignores positions
// and rotates at 0..T-1 differs from it by a uniform shift only, which nothing
// end to end sees.
bool positions_are_arange(const std::vector<std::int64_t>& p, std::int64_t t) {
  if (t <= 0) return true;
  for (std::size_t i = 0; i < p.size(); ++i)
    if (i % static_cast<std::size_t>(t) != 0 && p[i] != p[i - 1] + 1) return false;
  return true;
}

// The RoPE blind spots of the cases that have a rope block (none: no warning).
template <class Add>
void add_rope_warnings(const std::vector<const CaseSpec*>& cases, Add& add) {
  std::vector<const CaseSpec*> rope;
  for (const CaseSpec* c : cases)
    if (c->rope) rope.push_back(c);
  if (rope.empty()) return;
  auto all = [&](auto pred) { return std::all_of(rope.begin(), rope.end(), [&](const CaseSpec* c) { return pred(*c); }); };
  // The bugs each blind spot hides, from the catalog's RoPE visibility.
  auto rope_bugs_where = [](auto pred) {
    std::vector<std::string> names;
    for (const auto& b : bug_catalog())
      if (b.visibility.needs_rope && pred(b.visibility)) names.emplace_back(b.name);
    return names;
  };
  auto tokens = [](const CaseSpec& c) { return c.level == Level::core ? std::min(c.dims.Tq, c.dims.Tk) : c.dims.T; };
  if (all([&](const CaseSpec& c) { return c.level == Level::rope || tokens(c) <= 1; }) &&
      !all([](const CaseSpec& c) { return c.level == Level::rope; }))
    add("every attention case with RoPE has T = 1 (one key: the softmax is constant, dWq = dWk = 0)",
        rope_bugs_where([](const auto& v) { return v.needs_seq; }));
  if (all([](const CaseSpec& c) {
        return (c.rope->rotary_dim > 0 ? c.rope->rotary_dim : c.dims.head_dim()) == 2;
      }))
    add("every RoPE case has rotary_dim 2 (one pair: both pairings are the same)",
        rope_bugs_where([](const auto& v) { return v.needs_rope_pairs; }));
  if (all([&](const CaseSpec& c) { return positions_are_arange(case_positions(c), c.level == Level::core ? c.dims.Tk : c.dims.T); }))
    add("every RoPE case has positions arange + c", rope_bugs_where([](const auto& v) { return v.needs_gapped_positions; }));
  if (all([](const CaseSpec& c) {
        const auto p = case_positions(c);
        return p.empty() || *std::max_element(p.begin(), p.end()) + c.rope->q_offset < 1000;
      }))
    add("no RoPE case has a position >= 1000 (float32 angle tables err by about 1e-6 there)",
        rope_bugs_where([](const auto& v) { return v.needs_far_positions; }));
  if (all([](const CaseSpec& c) { return c.level != Level::rope && c.taps.empty(); }))
    add("no case is at the rope level and none has taps (a uniform shift of every q and k position "
        "leaves out and every gradient unchanged)",
        rope_bugs_where([](const auto& v) { return v.needs_rope_taps; }));
  // Positions [B, T] rotate batch row b; broadcast onto the head axis instead
  // they fit by chance when B = H (or B = Hkv for k), and are one row for all with [T].
  auto per_row = [](const CaseSpec& c) {
    if (c.files && c.files->positions.defined()) return c.files->positions.dim() == 2;
    return !c.rope->generator.empty() || c.rope->per_row;
  };
  if (all([&](const CaseSpec& c) {
        return c.level == Level::rope || !per_row(c) || c.dims.B == c.dims.H || c.dims.B == c.dims.kv_heads();
      }))
    add("no RoPE attention case has per-row positions with B apart from H and Hkv",
        rope_bugs_where([](const auto& v) { return v.needs_position_rows; }));
  // From the catalog's RoPE visibility: a base it hard-codes, a span it gets wrong.
  if (all([](const CaseSpec& c) { return c.rope->theta == 10000.0; }))
    add("every RoPE case has theta 10000 (a base hard-coded at 10000 agrees)",
        rope_bugs_where([](const auto& v) { return v.needs_custom_theta; }));
  if (all([](const CaseSpec& c) { return c.rope->rotary_dim == 0 || c.rope->rotary_dim >= c.dims.head_dim(); }))
    add("no RoPE case has rotary_dim < d (partial rotary)",
        rope_bugs_where([](const auto& v) { return v.needs_partial_rotary; }));
}

}  // namespace

std::vector<WeakSuiteWarning> weak_suite_warnings(const std::vector<const CaseSpec*>& cases) {
  std::vector<WeakSuiteWarning> out;
  if (cases.empty()) return out;
  auto all = [&](auto pred) { return std::all_of(cases.begin(), cases.end(), [&](const CaseSpec* c) { return pred(*c); }); };
  auto bugs_where = [](auto pred) {
    std::vector<std::string> names;
    for (const auto& b : bug_catalog())
      if (pred(b.visibility)) names.emplace_back(b.name);
    return names;
  };
  auto add = [&](std::string condition, std::vector<std::string> bugs) {
    std::string msg = "weak suite: " + condition + ", so it cannot catch " + join(bugs, ", ");
    out.push_back({std::move(condition), std::move(bugs), std::move(msg)});
  };
  auto seq_len = [](const CaseSpec& c) { return c.level != Level::core ? c.dims.T : std::min(c.dims.Tq, c.dims.Tk); };

  if (all([](const CaseSpec& c) { return c.dims.H <= 1; }))
    add("every case has H = 1", bugs_where([](const auto& v) { return v.needs_heads; }));
  if (all([&](const CaseSpec& c) { return seq_len(c) <= 1; }))
    add("every case has T = 1", bugs_where([](const auto& v) { return v.needs_seq; }));
  if (all([](const CaseSpec& c) { return c.dims.B <= 1; }))
    add("every case has B = 1", bugs_where([](const auto& v) { return v.needs_batch; }));
  if (all([](const CaseSpec& c) { return !c.causal; }))
    add("no case is causal", bugs_where([](const auto& v) { return v.needs_causal; }));
  if (all([](const CaseSpec& c) { return c.level != Level::mha || c.dims.H <= 1; }) &&
      !all([](const CaseSpec& c) { return c.level != Level::mha; }))
    add("the head dim equals the model dim in every mha case", bugs_where([](const auto& v) { return v.needs_d_lt_D; }));
  if (all([](const CaseSpec& c) { return c.level == Level::core; }))
    add("every case is at the core level", bugs_where([](const auto& v) { return v.mha_only; }));
  if (all([](const CaseSpec& c) { return c.level != Level::core || c.dims.Tq == c.dims.Tk; }))
    add("no core case has Tq != Tk", bugs_where([](const auto& v) { return v.needs_tq_ne_tk; }));
  if (!std::any_of(cases.begin(), cases.end(), [](const CaseSpec* c) { return has_fully_masked_row(*c); }))
    add("no case has a query row whose keys are all masked", bugs_where([](const auto& v) { return v.needs_empty_row; }));
  if (!std::any_of(cases.begin(), cases.end(), [](const CaseSpec* c) { return has_large_logits(*c); }))
    add("no case has logits past exp's range (a large scale)",
        bugs_where([](const auto& v) { return v.needs_large_logits; }));
  if (all([](const CaseSpec& c) { return !is_16bit(c.dtype); }))
    add("no case is bfloat16 or float16", bugs_where([](const auto& v) { return v.needs_16bit; }));
  if (all([](const CaseSpec& c) { return c.layout == InputLayout::contiguous && !c.is_reference(); }))
    add("every input is contiguous",
        {"kernels that ignore strides (a view read as if it were contiguous)"});
  // Grouped kv heads: only the cases that give Hkv speak for the suite's GQA coverage.
  std::vector<const CaseSpec*> grouped;
  for (const CaseSpec* c : cases)
    if (c->dims.Hkv > 0 && c->dims.H > 0) grouped.push_back(c);
  auto all_grouped = [&](auto pred) {
    return !grouped.empty() && std::all_of(grouped.begin(), grouped.end(), [&](const CaseSpec* c) { return pred(*c); });
  };
  if (all_grouped([](const CaseSpec& c) { return c.dims.Hkv == c.dims.H; }))
    add("every grouped-kv case has Hkv = H (G = 1)", bugs_where([](const auto& v) { return v.needs_group; }));
  else if (all_grouped([](const CaseSpec& c) { return c.dims.Hkv == 1 || c.dims.Hkv == c.dims.H; }))
    add("every grouped-kv case has Hkv = 1 or Hkv = H",
        bugs_where([](const auto& v) { return v.needs_group && v.needs_kv_heads; }));
  if (all_grouped([](const CaseSpec& c) { return c.dims.H == c.dims.Hkv * c.dims.Hkv; }))
    add("every grouped-kv case has H = Hkv^2 (G = Hkv)", bugs_where([](const auto& v) { return v.needs_non_square; }));
  if (all_grouped([](const CaseSpec& c) { return c.dims.B == c.dims.H || c.dims.B == c.dims.kv_heads(); }))
    add("every grouped-kv case has B equal to H or Hkv",
        {"a tensor broadcast on the head axis instead of the batch axis (or the reverse), which then fits by chance"});
  if (all([](const CaseSpec& c) {
        return std::all_of(c.check.begin(), c.check.end(), [](const std::string& t) { return t == "out"; });
      }))
    add("no case checks a gradient",
        {"backward bugs (a wrong hand-written backward, a weight its gradient never reaches)"});
  add_rope_warnings(cases, add);
  return out;
}

std::vector<WeakSuiteWarning> capability_warnings(const std::vector<const CaseSpec*>& cases,
                                                  const PluginRegistry& registry) {
  std::vector<WeakSuiteWarning> out;
  const bool any_mask = std::any_of(cases.begin(), cases.end(), [](const CaseSpec* c) {
    return !c->mask_file.empty() || (c->files && c->files->mask.defined());
  });
  if (any_mask) return out;
  std::vector<std::string> declaring;  // the plugins that say they read spec.mask, in suite order
  for (const CaseSpec* c : cases)
    for (const std::string& name : c->compare) {
      const FoundPlugin* p = registry.find_found(name);
      if (!p) p = registry.find(name);
      if (p && !p->info.mutant && p->info.capabilities.bool_mask &&
          std::find(declaring.begin(), declaring.end(), name) == declaring.end())
        declaring.push_back(name);
    }
  if (declaring.empty()) return out;
  std::vector<std::string> bugs;
  for (const auto& b : bug_catalog())
    if (b.visibility.needs_mask) bugs.emplace_back(b.name);
  std::string condition = "no case has a boolean mask, though " + join(declaring, ", ") +
                          (declaring.size() == 1 ? " declares" : " declare") + " bool_mask";
  std::string msg = "weak suite: " + condition + ", so it cannot catch " + join(bugs, ", ");
  out.push_back({std::move(condition), std::move(bugs), std::move(msg)});
  return out;
}

// ---------------------------------------------------------------- the job

CaseResult check_case(const CaseSpec& spec, const PluginRegistry& registry, const RunOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  CaseInputs inputs;
  CaseResult res = run_case(spec, registry, options, &inputs);
  const bool failed = res.status == CaseStatus::fail || res.status == CaseStatus::xfail;
  if (failed && !res.tensors.empty()) {
    res.diagnosis = diagnose(res, inputs);
    const std::vector<VariantRun> runs =
        spec.is_reference() ? std::vector<VariantRun>{} : run_variants(spec, registry, options);
    res.localization = localize_from(res, runs);
    confirm_with_variants(*res.diagnosis, runs);
    rerun_under_tile_permutation(*res.diagnosis, res, inputs, registry, options);
    for (const auto& clue : rope_clues(res, inputs)) res.diagnosis->sentence += " " + clue;
    if (const std::string p = precision_sentence(res); !p.empty()) res.diagnosis->sentence += " " + p;
    const std::string named = res.diagnosis->best();
    const bool as_expected = spec.expect_diagnosis == "none" ? named.empty() : named == spec.expect_diagnosis;
    if (res.status == CaseStatus::xfail && !spec.expect_diagnosis.empty() && !as_expected) {
      res.status = CaseStatus::fail;
      res.cause += (res.cause.empty() ? "" : "; ") + std::string("expected the diagnosis ") +
                   spec.expect_diagnosis + ", got " + (named.empty() ? "none" : named);
    }
  }
  keep_report_data(res, options.keep_tensors);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

SuiteResult run_suite(const Suite& suite, const PluginRegistry& registry, const RunOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  SuiteResult result;
  result.name = suite.name;
  result.file = suite.file;
  const std::vector<const CaseSpec*> selected = select_cases(suite, options.filter);
  result.warnings = weak_suite_warnings(selected);  // the whole selection's, in every shard alike
  for (auto& w : capability_warnings(selected, registry)) result.warnings.push_back(std::move(w));
  result.identity = runner::suite_identity(suite, selected);
  result.shard = options.shard;
  const std::vector<const CaseSpec*> cases = runner::shard_cases(selected, options.shard);
  for (const CaseSpec* c : cases) result.case_indices.push_back(static_cast<std::size_t>(c - suite.cases.data()));
  result.cases = runner::run_cases(
      cases, [&](const CaseSpec& c, const RunOptions& o) { return check_case(c, registry, o); }, options);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace headgrad::analysis
