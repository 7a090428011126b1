#include "analysis/analyze.hpp"
#include "analysis/internal.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include <headgrad/log.hpp>

#include "analysis/catalog.hpp"
#include "analysis/hypotheses.hpp"
#include "case/inputs.hpp"
#include "exec/execute.hpp"

namespace headgrad::analysis {

using namespace runner;
using diagnosis::Bug;
using diagnosis::bug_catalog;
using diagnosis::bug_info;

// Weak-suite warnings: the bug classes a selection of cases cannot expose.

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

// ---- QK-norm and cross-attention ----

// The gains g (w, or 1 + w) of a case are equal within each pair RoPE rotates
// (or all equal: the ones-init, w = 0 under one_plus_w). Seeded gains never
// are (1 + 0.5 N(0, 1) per dim); a reference's are read from its files.
bool gains_pairwise_equal(const CaseSpec& c) {
  if (!c.files) return false;
  const std::int64_t d = c.dims.head_dim();
  for (const char* name : {"q_norm", "k_norm"}) {
    const Tensor* t = find_tensor(c.files->inputs, name);
    if (!t || !t->defined() || d <= 0) return false;
    const std::vector<double> g = t->to_vector();
    const bool uniform = std::all_of(g.begin(), g.end(), [&](double v) { return v == g.front(); });
    if (uniform) continue;
    if (!c.rope) return false;
    const std::int64_t r = c.rope->rotary_dim > 0 ? c.rope->rotary_dim : d;
    for (std::size_t start = 0; start + static_cast<std::size_t>(d) <= g.size(); start += static_cast<std::size_t>(d))
      for (std::int64_t k = 0; k < r / 2; ++k) {
        const std::int64_t a = c.rope->style == RopeStyle::half ? k : 2 * k, b = c.rope->style == RopeStyle::half ? k + r / 2 : 2 * k + 1;
        if (g[start + static_cast<std::size_t>(a)] != g[start + static_cast<std::size_t>(b)]) return false;
      }
  }
  return true;
}

// The blind spots of the cases with QK-norm, and of those with cross-attention
// (none of either: no warning of theirs).
// Every case of a feature's group (some case of it at all) satisfies pred: its
// blind spot holds for the whole suite. An empty group warns of nothing.
template <class Pred>
bool all_of(const std::vector<const CaseSpec*>& group, Pred pred) {
  return !group.empty() && std::all_of(group.begin(), group.end(), [&](const CaseSpec* c) { return pred(*c); });
}

template <class Add>
void add_qk_norm_cross_warnings(const std::vector<const CaseSpec*>& cases, Add& add) {
  std::vector<const CaseSpec*> norm, cross;
  for (const CaseSpec* c : cases) {
    if (c->level == Level::mha && c->qk_norm.enabled) norm.push_back(c);
    if (c->level == Level::mha && c->cross) cross.push_back(c);
  }
  auto bugs_where = [](auto pred) {
    std::vector<std::string> names;
    for (const auto& b : bug_catalog())
      if (pred(b.visibility)) names.emplace_back(b.name);
    return names;
  };
  if (all_of(norm, [](const CaseSpec& c) { return !c.rope || gains_pairwise_equal(c); }))
    add("no QK-norm case has RoPE with per-dim gains (with uniform gains, or gains equal within each rotated "
        "pair, the order of norm and RoPE changes only dq_norm and dk_norm)",
        bugs_where([](const auto& v) { return v.needs_per_dim_gains; }));
  if (all_of(norm, [](const CaseSpec& c) { return c.dims.H <= 1 || c.dims.kv_heads() <= 1; }))
    add("every QK-norm case has H = 1 or Hkv = 1 (one head's statistics are the whole projection's)",
        {std::string(bug_info(Bug::qk_norm_axis_swapped).name)});
  if (all_of(norm, [](const CaseSpec& c) { return c.dtype != DType::float64; }))
    add("no QK-norm case is float64 (an eps off by 1e-5 moves out by about 4.5e-6 / mean(q^2), under 16-bit and "
        "float32 tolerances at unit activations)",
        bugs_where([](const auto& v) { return v.needs_small_activations; }));
  if (all_of(cross, [](const CaseSpec& c) { return c.dims.Tq == c.dims.Tk; }))
    add("every cross-attention case has Tq = Tk (keys projected from x then have the right shape)",
        {std::string(bug_info(Bug::cross_kv_from_queries).name)});
  if (all_of(cross, [](const CaseSpec& c) { return c.causal || c.dims.Tk <= 1; }))
    add("every cross-attention case is causal (or has Tk = 1)", bugs_where([](const auto& v) { return v.needs_non_causal; }));
}

// ---- sliding windows, soft-capping, sinks (MODERN attention's blind spots)

// Keys the window hides from some row beyond what causal hides: the most over
// the rows, on each side. A window case that hides at most one key shows a
// window of W + 1 keys, or none, only in one row, or nowhere.
std::int64_t window_hidden_keys(const CaseSpec& c) {
  const std::int64_t tq = c.level == Level::core ? c.dims.Tq : c.dims.T;
  const std::int64_t tk = c.level == Level::core ? c.dims.Tk : c.dims.T;
  if (tq <= 0 || tk <= 0) return 0;
  const std::int64_t o = c.causal && c.causal_alignment == CausalAlignment::bottom_right ? tk - tq : 0;
  std::int64_t hidden = 0;
  if (c.window.left)  // the last row's window starts at tq - 1 + o - left
    hidden = std::max(hidden, std::min(tk, tq - 1 + o - *c.window.left));
  if (c.window.right && !(c.causal && *c.window.right == 0))  // row 0's ends at o + right
    hidden = std::max(hidden, std::min(tk, tk - 1 - (o + *c.window.right)));
  return hidden;
}

// The largest |score| a seeded case reaches, about: q, k unit normal (and so
// the MHA projections), scores scale * sqrt(d) * N(0, 1), the largest some 3 sigma.
// A reference's scores are unknown (nullopt).
std::optional<double> largest_score(const CaseSpec& c) {
  if (c.is_reference()) return std::nullopt;
  const double d = static_cast<double>(std::max<std::int64_t>(c.dims.head_dim(), 1));
  return 3 * (c.scale ? *c.scale : 1 / std::sqrt(d)) * std::sqrt(d);
}

// The sink logits of a case are all far below its scores: P_sink ~ exp(sigma - max s)
// is under 1e-3 everywhere. Seeded sinks are U(-1, 3), never; a reference's are read.
bool sinks_near_zero(const CaseSpec& c) {
  if (!c.is_reference() || !c.files) return false;
  const Tensor* s = find_tensor(c.files->inputs, "sinks");
  if (!s || !s->defined()) return false;
  const auto v = s->to_vector();
  return !v.empty() && *std::max_element(v.begin(), v.end()) < -7;
}

// The catalog bugs of one feature that `pred` says the blind spot hides.
template <class Pred>
std::vector<std::string> feature_bugs(Pred pred) {
  std::vector<std::string> names;
  for (const auto& b : bug_catalog())
    if (pred(b)) names.emplace_back(b.name);
  return names;
}

template <class Add>
void add_window_softcap_sink_warnings(const std::vector<const CaseSpec*>& cases, Add& add) {
  std::vector<const CaseSpec*> windowed, capped, sinks;
  for (const CaseSpec* c : cases) {
    if (c->window.enabled()) windowed.push_back(c);
    if (c->softcap > 0) capped.push_back(c);
    if (c->sinks) sinks.push_back(c);
  }
  if (all_of(windowed, [](const CaseSpec& c) { return window_hidden_keys(c) <= 1; }))
    add("every window case has T <= W + 1 (the window hides at most one key of one row)",
        feature_bugs([](const auto& b) {
          return b.bug == Bug::window_off_by_one || b.bug == Bug::window_ignored || b.bug == Bug::window_ignored_in_backward;
        }));
  if (all_of(windowed, [](const CaseSpec& c) {  // positions agree with indices: arange + c, queries on the diagonal
        const bool core = c.level == Level::core;
        const std::int64_t diagonal =
            core && c.causal && c.causal_alignment == CausalAlignment::bottom_right ? c.dims.Tk - c.dims.Tq : 0;
        return !c.rope || (positions_are_arange(case_positions(c), core ? c.dims.Tk : c.dims.T) &&
                           c.rope->q_offset == diagonal);
      }))
    add("no window case has RoPE at positions other than arange + c (a window on positions agrees)",
        feature_bugs([](const auto& b) { return b.visibility.needs_window && b.visibility.needs_gapped_positions; }));
  if (all_of(windowed, [](const CaseSpec& c) { return c.causal; }))
    add("every window case is causal", feature_bugs([](const auto& b) { return b.bug == Bug::window_both_sides; }));
  if (all_of(windowed, [](const CaseSpec& c) {
        return !(c.causal && c.causal_alignment == CausalAlignment::bottom_right &&
                 (c.level == Level::core ? c.dims.Tq != c.dims.Tk : false));
      }))
    add("no window case is a bottom-right causal case with Tq != Tk (a decode step)",
        feature_bugs([](const auto& b) { return b.visibility.needs_window && b.visibility.needs_tq_ne_tk; }));
  if (all_of(capped, [](const CaseSpec& c) {
        const auto s = largest_score(c);
        return s && *s < c.softcap;
      }))
    add("every softcap case has scores far below the cap (the cap moves a score by about s^3 / (3 C^2); "
        "scale q or use a small C so that |s| reaches 3-5 C)",
        feature_bugs([](const auto& b) { return b.visibility.needs_softcap; }));
  if (!capped.empty() && std::none_of(capped.begin(), capped.end(), [](const CaseSpec* c) {
        return !c->mask_file.empty() || (c->files && c->files->mask.defined()) || c->window.enabled() ||
               c->causal;
      }))
    add("no softcap case masks a key", feature_bugs([](const auto& b) { return b.visibility.needs_masked_key; }));
  if (all_of(sinks, [](const CaseSpec& c) { return sinks_near_zero(c); }))
    add("every sinks case has sinks far below its scores (P_sink under 1e-3)",
        feature_bugs([](const auto& b) {  // a NaN on an empty row shows at any sink size
          return b.visibility.needs_sinks && b.bug != Bug::sink_grad_missing && !b.visibility.needs_empty_row;
        }));
  if (!sinks.empty() && std::none_of(sinks.begin(), sinks.end(), [](const CaseSpec* c) { return has_fully_masked_row(*c); }))
    add("no sinks case has a query row whose keys are all masked (all mass on the sink)",
        feature_bugs([](const auto& b) { return b.visibility.needs_sinks && b.visibility.needs_empty_row; }));
  if (all_of(sinks, [](const CaseSpec& c) { return (c.level == Level::core || c.cross ? c.dims.Tk : c.dims.T) <= diagnosis::kKeyTile; }))
    add("every sinks case has Tk <= " + std::to_string(diagnosis::kKeyTile) + " (one key tile of a fused kernel)",
        feature_bugs([](const auto& b) { return b.visibility.needs_sinks && b.visibility.needs_long_keys; }));
  if (all_of(sinks, [](const CaseSpec& c) { return c.dims.Hkv == 0 || c.dims.Hkv == c.dims.H; }))
    add("every sinks case has G = 1 (Hkv = H)",
        feature_bugs([](const auto& b) { return b.visibility.needs_sinks && b.visibility.needs_group; }));
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
  add_qk_norm_cross_warnings(cases, add);
  add_window_softcap_sink_warnings(cases, add);
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

}  // namespace headgrad::analysis
