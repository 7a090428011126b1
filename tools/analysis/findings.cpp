#include "analysis/findings.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <sstream>

#include "analysis/catalog.hpp"
#include "analysis/evaluate.hpp"
#include "analysis/hypotheses.hpp"
#include "exec/execute.hpp"

namespace headgrad::analysis {

using namespace runner;
using diagnosis::Bug;
using diagnosis::BugSet;
using diagnosis::bug_catalog;
using diagnosis::bug_info;

namespace {

std::string fmt(double v) {
  std::ostringstream o;
  o.precision(4);
  o << v;
  return o.str();
}

// "a", "a and b", "a, b and c"
bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// ---------------------------------------------------------------- measures

// |a - b| / (atol + rtol |b|) at its worst over one tensor (b the expected).
double tensor_ratio(const Tensor& a, const Tensor& b, Tolerance tol) {
  if (!a.defined() || !b.defined() || a.shape() != b.shape()) return INFINITY;
  const auto va = a.contiguous().to_vector(), vb = b.contiguous().to_vector();
  double worst = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double e = std::abs(va[i] - vb[i]);
    if (std::isnan(e)) return INFINITY;
    worst = std::max(worst, e / (tol.atol + tol.rtol * std::abs(vb[i])));
  }
  return worst;
}

// Least squares c in a ~ c b.
std::optional<double> lsq_factor(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    bb += b[i] * b[i];
  }
  if (!(bb > 0) || !std::isfinite(ab)) return std::nullopt;
  return ab / bb;
}

// The expressions a factor is matched to, valued at a case's dims.
std::vector<std::pair<std::string, double>> shape_expressions(const CaseSpec& c) {
  const Dims& m = c.dims;
  const double d = static_cast<double>(std::max<std::int64_t>(m.head_dim(), 1));
  const double heads = static_cast<double>(std::max<std::int64_t>(m.H, 1));
  const double group = heads / static_cast<double>(std::max<std::int64_t>(m.kv_heads(), 1));
  const double b = static_cast<double>(std::max<std::int64_t>(m.B, 1));
  std::vector<std::pair<std::string, double>> e = {
      {"2", 2}, {"1/2", 0.5}, {"-1", -1}, {"0", 0}, {"sqrt(d)", std::sqrt(d)}, {"1/sqrt(d)", 1 / std::sqrt(d)},
      {"d", d}, {"1/d", 1 / d}, {"H", heads}, {"1/H", 1 / heads}, {"G", group}, {"1/G", 1 / group}, {"B", b},
      {"1/B", 1 / b}};
  if (c.level == Level::mha) {
    const double dm = static_cast<double>(std::max<std::int64_t>(m.D, 1)), t = static_cast<double>(std::max<std::int64_t>(m.T, 1));
    for (auto x : std::vector<std::pair<std::string, double>>{{"sqrt(D)", std::sqrt(dm)}, {"1/sqrt(D)", 1 / std::sqrt(dm)},
                                                              {"T", t}, {"1/T", 1 / t}, {"B*T", b * t}, {"1/(B*T)", 1 / (b * t)}})
      e.push_back(x);
  } else if (c.level == Level::core) {
    const double tq = static_cast<double>(std::max<std::int64_t>(m.Tq, 1)), tk = static_cast<double>(std::max<std::int64_t>(m.Tk, 1));
    for (auto x : std::vector<std::pair<std::string, double>>{{"Tq", tq}, {"1/Tq", 1 / tq}, {"Tk", tk}, {"1/Tk", 1 / tk}})
      e.push_back(x);
  }
  return e;
}

std::optional<double> expression_value(const CaseSpec& c, const std::string& name) {
  for (const auto& [n, v] : shape_expressions(c))
    if (n == name) return v;
  return std::nullopt;
}

// ---------------------------------------------------------------- re-runs

// block i of the result is block order[i] of t along dim (blocks of `block`)
Tensor reorder(const Tensor& t, std::int64_t dim, std::int64_t block, const std::vector<std::int64_t>& order) {
  return diagnosis::reorder_blocks(t, dim < 0 ? dim + t.dim() : dim, block, order);
}

std::vector<std::int64_t> inverse(const std::vector<std::int64_t>& p) {
  std::vector<std::int64_t> inv(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) inv[static_cast<std::size_t>(p[i])] = static_cast<std::int64_t>(i);
  return inv;
}

Tensor* find_mut(TensorSet& set, const std::string& name) {
  for (auto& [n, t] : set)
    if (n == name) return &t;
  return nullptr;
}

// The correct attention (with `bugs`) instrumented: the gradient that reaches
// q, k, v and the heads' outputs scaled, and dx summed from the three
// projections' input gradients with their own factors. No RoPE (the rotation
// lives inside the hypotheses' per-head loop).
struct Scaling {
  double q = 1, k = 1, v = 1, merged = 1;   // gradients reaching them
  double xq = 1, xk = 1, xv = 1;            // each projection's share of dx
};

// The value of x with `f` times its gradient.
Variable grad_times(const Variable& x, double f) {
  if (f == 1) return x;
  return add(scale(x, f), scale(Variable(x.data()), 1.0 - f));
}

std::optional<TensorSet> instrumented(const CaseSpec& c, const CaseInputs& in, const Scaling& s) {
  if (c.rope || !c.taps.empty() || c.level == Level::rope) return std::nullopt;
  if (c.qk_norm.enabled || c.cross) return std::nullopt;  // the instrumented layer has neither
  const AttentionSpec spec = attention_spec(c, in);
  if (c.level == Level::core) {
    Variable q(in.q, true), k(in.k, true), v(in.v, true);
    const Variable y = diagnosis::hypothesis_core(grad_times(q, s.q), grad_times(k, s.k), grad_times(v, s.v), spec, {});
    sum(mul(y, Variable(in.r))).backward();
    return TensorSet{{"out", y.data()}, {"dq", q.grad()}, {"dk", k.grad()}, {"dv", v.grad()}};
  }
  // mha: split [B, T, n*d] -> [B, n, T, d] and merge back, as docs/design.md defines them
  const std::int64_t b = in.x.size(0), t = in.x.size(1), heads = spec.num_heads, kv = spec.kv_heads();
  const std::int64_t d = in.wq.size(0) / heads;
  auto split = [&](const Variable& p, std::int64_t n) { return transpose(reshape(p, {b, t, n, d}), 1, 2); };
  Variable xq(in.x, true), xk(in.x, true), xv(in.x, true);
  const MhaWeights w = leaf_weights(in);  // with the biases when the case has them
  const Variable q = split(linear_bias(xq, w.wq, w.bq), heads), k = split(linear_bias(xk, w.wk, w.bk), kv),
                 v = split(linear_bias(xv, w.wv, w.bv), kv);
  const Variable o = diagnosis::hypothesis_core(grad_times(q, s.q), grad_times(k, s.k), grad_times(v, s.v), spec, {});
  const Variable merged = grad_times(reshape(transpose(o, 1, 2), {b, t, heads * d}), s.merged);
  const Variable y = linear_bias(merged, w.wo, w.bo);
  sum(mul(y, Variable(in.r))).backward();
  auto part = [](const Variable& x, double f) {
    return x.grad().defined() ? scale(Variable(x.grad()), f).data() : Tensor::zeros(x.shape(), x.dtype());
  };
  const Tensor dx = add(add(Variable(part(xq, s.xq)), Variable(part(xk, s.xk))), Variable(part(xv, s.xv))).data();
  TensorSet out{{"out", y.data()},    {"dx", dx},          {"dwq", w.wq.grad()},
                {"dwk", w.wk.grad()}, {"dwv", w.wv.grad()}, {"dwo", w.wo.grad()}};
  if (w.has_bias())
    out.insert(out.end(), {{"dbq", w.bq.grad()}, {"dbk", w.bk.grad()}, {"dbv", w.bv.grad()}, {"dbo", w.bo.grad()}});
  return out;
}

// A candidate explanation of a side: its prediction at any case (nullopt
// where it does not apply), with `bugs` from the catalog on top.
struct Model {
  std::string relation;  // stable id
  std::string figure;
  std::vector<std::string> tensors;
  std::string what;      // the sentence's body, after the side's name
  bool composable = false;  // an input transform: pairs with a catalog bug
  std::function<std::optional<TensorSet>(const CaseSpec&, const CaseInputs&, const BugSet&)> predict;
};

// ---- input transforms (re-runs of the correct attention on changed inputs)

using InputEdit = std::function<bool(const CaseSpec&, CaseInputs&)>;        // false: does not apply
using OutputEdit = std::function<void(const CaseSpec&, TensorSet&)>;         // gradients mapped back

Model transform_model(std::string relation, std::string figure, std::vector<std::string> tensors, std::string what,
                      InputEdit edit, OutputEdit back) {
  Model m{std::move(relation), std::move(figure), std::move(tensors), std::move(what), true, {}};
  m.predict = [edit, back](const CaseSpec& c, const CaseInputs& in, const BugSet& bugs) -> std::optional<TensorSet> {
    CaseInputs changed = in;
    if (!edit(c, changed)) return std::nullopt;
    TensorSet out = hypothesis_tensors(c, changed, bugs);
    back(c, out);
    return out;
  };
  return m;
}

Tensor CaseInputs::*input_field(const std::string& name) {
  if (name == "wq") return &CaseInputs::wq;
  if (name == "wk") return &CaseInputs::wk;
  if (name == "wv") return &CaseInputs::wv;
  if (name == "wo") return &CaseInputs::wo;
  if (name == "q") return &CaseInputs::q;
  if (name == "k") return &CaseInputs::k;
  return &CaseInputs::v;
}

std::string grad_name(const std::string& input) { return "d" + input; }

std::string projection_words(const std::string& w) {
  if (w == "wq") return "Wq";
  if (w == "wk") return "Wk";
  if (w == "wv") return "Wv";
  return "Wo";
}

Model exchange_model(const std::string& a, const std::string& b) {
  const bool mha = a[0] == 'w';
  const std::string na = mha ? projection_words(a) : a, nb = mha ? projection_words(b) : b;
  return transform_model(
      "inputs_exchanged", na + " <-> " + nb, {grad_name(a), grad_name(b)},
      "computes the correct attention with " + na + " and " + nb + " exchanged (" +
          (mha ? "the " + a.substr(1) + " projection uses " + nb + " and the " + b.substr(1) + " projection " + na
               : a + " is read where " + b + " belongs and the other way round") +
          ")",
      [a, b](const CaseSpec&, CaseInputs& in) {
        Tensor& ta = in.*input_field(a);
        Tensor& tb = in.*input_field(b);
        if (!ta.defined() || !tb.defined() || ta.shape() != tb.shape()) return false;
        std::swap(ta, tb);
        return true;
      },
      [a, b](const CaseSpec&, TensorSet& out) {
        Tensor* ga = find_mut(out, grad_name(a));
        Tensor* gb = find_mut(out, grad_name(b));
        if (ga && gb) std::swap(*ga, *gb);
      });
}

Model transpose_model(const std::string& w) {
  return transform_model(
      "weight_transposed", projection_words(w) + " transposed", {grad_name(w)},
      "computes the correct attention with " + projection_words(w) + " transposed (x " + projection_words(w) +
          " where x " + projection_words(w) + "^T belongs)",
      [w](const CaseSpec&, CaseInputs& in) {
        Tensor& t = in.*input_field(w);
        if (!t.defined() || t.dim() != 2 || t.size(0) != t.size(1)) return false;
        t = t.transpose(0, 1).contiguous();
        return true;
      },
      [w](const CaseSpec&, TensorSet& out) {
        if (Tensor* g = find_mut(out, grad_name(w)); g && g->defined()) *g = g->transpose(0, 1).contiguous();
      });
}

// A permutation of n heads from a pattern: "reverse", or "rotate:r" (slot g
// takes head (g - r) mod n: head h lands in slot h + r).
std::vector<std::int64_t> head_pattern(const std::string& pattern, std::int64_t n) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  if (pattern == "reverse") {
    for (std::int64_t g = 0; g < n; ++g) p[static_cast<std::size_t>(g)] = n - 1 - g;
  } else {
    const std::int64_t r = std::stoll(pattern.substr(7));
    for (std::int64_t g = 0; g < n; ++g) p[static_cast<std::size_t>(g)] = (((g - r) % n) + n) % n;
  }
  return p;
}

std::string pattern_words(const std::string& pattern) {
  if (pattern == "reverse") return "in reverse order";
  const std::string r = pattern.substr(7);
  return "rotated by " + r + (r == "1" ? " (head h lands in slot (h + 1) mod H)" : " (head h lands in slot (h + " + r + ") mod H)");
}

// heads permuted where weight w (or, at the core level, q, k, v together) is read.
// wq/wk/wv: the side's head h uses the rows of head pi(h); wo: the merge's
// slot g holds head pi(g) (so head h meets the Wo columns of slot pi^-1(h)).
Model head_permutation_model(const std::string& w, const std::string& pattern) {
  const bool core = w == "qkv";
  std::string what;
  if (core) what = "gives the heads of the correct attention " + pattern_words(pattern) + " (head h of its out is head pi(h))";
  else if (w == "wo") what = "merges the heads " + pattern_words(pattern) + " before the output projection";
  else what = "reads the " + projection_words(w) + " rows of the heads " + pattern_words(pattern);
  std::vector<std::string> tensors = core ? std::vector<std::string>{"out", "dq", "dk", "dv"}
                                          : std::vector<std::string>{"out", grad_name(w)};
  return transform_model(
      "heads_permuted", pattern == "reverse" ? "heads reversed" : "heads rotated by " + pattern.substr(7), tensors,
      what,
      [w, pattern, core](const CaseSpec& c, CaseInputs& in) {
        if (core) {
          if (c.dims.kv_heads() != c.dims.H || c.dims.H < 2) return false;
          const auto p = head_pattern(pattern, c.dims.H);
          for (Tensor CaseInputs::*f : {&CaseInputs::q, &CaseInputs::k, &CaseInputs::v}) in.*f = reorder(in.*f, -3, 1, p);
          if (in.mask.defined() && in.mask.dim() >= 3 && in.mask.size(-3) == c.dims.H) in.mask = reorder(in.mask, -3, 1, p);
          return true;
        }
        const std::int64_t n = w == "wk" || w == "wv" ? c.dims.kv_heads() : c.dims.H;
        if (n < 2 || c.rope) return false;  // a per-head rotation would travel with the rows
        Tensor& t = in.*input_field(w);
        const auto p = head_pattern(pattern, n);
        const std::int64_t dim = w == "wo" ? 1 : 0, block = t.size(dim) / n;
        t = reorder(t, dim, block, w == "wo" ? inverse(p) : p);
        return true;
      },
      [w, pattern, core](const CaseSpec& c, TensorSet& out) {
        if (core) {
          const auto inv = inverse(head_pattern(pattern, c.dims.H));
          for (const char* g : {"dq", "dk", "dv"})
            if (Tensor* t = find_mut(out, g); t && t->defined()) *t = reorder(*t, -3, 1, inv);
          return;
        }
        const std::int64_t n = w == "wk" || w == "wv" ? c.dims.kv_heads() : c.dims.H;
        const auto p = head_pattern(pattern, n);
        if (Tensor* t = find_mut(out, grad_name(w)); t && t->defined()) {
          const std::int64_t dim = w == "wo" ? 1 : 0, block = t->size(dim) / n;
          *t = reorder(*t, dim, block, w == "wo" ? p : inverse(p));
        }
      });
}

// A permutation of T positions: "shift:s" (slot j reads position (j + s) mod T), "reverse".
std::vector<std::int64_t> time_pattern(const std::string& pattern, std::int64_t t) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(t));
  const std::int64_t s = pattern == "reverse" ? 0 : std::stoll(pattern.substr(6));
  for (std::int64_t j = 0; j < t; ++j)
    p[static_cast<std::size_t>(j)] = pattern == "reverse" ? t - 1 - j : (((j + s) % t) + t) % t;
  return p;
}

// Core level: q, k or v (or k and v together) read along T shifted or reversed.
Model time_model(const std::string& which, const std::string& pattern) {
  const std::vector<std::string> inputs = which == "kv" ? std::vector<std::string>{"k", "v"} : std::vector<std::string>{which};
  const std::string names = which == "kv" ? "k and v" : which;
  const std::string s = pattern == "reverse" ? "" : pattern.substr(6);
  const std::string what = pattern == "reverse"
                               ? "reads " + names + " in reverse order along T (slot j holds token T-1-j)"
                               : "reads " + names + " shifted along T by " + s + " (slot j holds token (j " +
                                     (s[0] == '-' ? "- " + s.substr(1) : "+ " + s) + ") mod T)";
  std::vector<std::string> tensors{"out"};
  for (const auto& i : inputs) tensors.push_back(grad_name(i));
  return transform_model(
      pattern == "reverse" ? "reversal_along_T" : "shift_along_T",
      names + (pattern == "reverse" ? " reversed along T" : " shifted by " + s + " along T"), tensors, what,
      [inputs, pattern](const CaseSpec& c, CaseInputs& in) {
        if (c.level != Level::core || c.rope) return false;
        for (const auto& i : inputs) {
          Tensor& t = in.*input_field(i);
          if (t.size(-2) < 2) return false;
          t = reorder(t, -2, 1, time_pattern(pattern, t.size(-2)));
        }
        return true;
      },
      [inputs, pattern](const CaseSpec&, TensorSet& out) {
        for (const auto& i : inputs)
          if (Tensor* g = find_mut(out, grad_name(i)); g && g->defined())
            *g = reorder(*g, -2, 1, inverse(time_pattern(pattern, g->size(-2))));
      });
}

std::vector<Model> transform_models(const CaseSpec& c) {
  std::vector<Model> out;
  if (c.level == Level::mha) {
    // (Wk <-> Wv is the catalog's kv_swapped)
    out.push_back(exchange_model("wq", "wk"));
    out.push_back(exchange_model("wq", "wv"));
    for (const char* w : {"wq", "wk", "wv", "wo"}) out.push_back(transpose_model(w));
    for (const char* w : {"wo", "wq", "wk", "wv"}) {
      const std::int64_t n = std::string(w) == "wk" || std::string(w) == "wv" ? c.dims.kv_heads() : c.dims.H;
      if (n > 2) out.push_back(head_permutation_model(w, "reverse"));
      for (std::int64_t r = 1; r < n; ++r) out.push_back(head_permutation_model(w, "rotate:" + std::to_string(r)));
    }
  } else if (c.level == Level::core) {
    out.push_back(exchange_model("q", "k"));
    out.push_back(exchange_model("q", "v"));
    const std::int64_t n = c.dims.H;
    if (n > 2) out.push_back(head_permutation_model("qkv", "reverse"));
    for (std::int64_t r = 1; r < n; ++r) out.push_back(head_permutation_model("qkv", "rotate:" + std::to_string(r)));
    for (const char* which : {"q", "k", "v", "kv"})
      for (const char* pattern : {"shift:1", "shift:-1", "reverse"}) out.push_back(time_model(which, pattern));
  }
  return out;
}

// ---- a factor on one gradient (expression-valued, so it carries to the variants)

struct FactorPoint {
  std::string id;          // "q", "k", "v", "merged", "xq", "xk", "xv", "w:dwo", "out"
  std::string estimate_on; // the tensor the factor is read from
  std::string words;       // what the factor multiplies
};

std::vector<FactorPoint> factor_points(const CaseSpec& c) {
  if (c.level == Level::core)
    return {{"q", "dq", "dQ (the gradient that reaches q)"}, {"k", "dk", "dK (the gradient that reaches k)"},
            {"v", "dv", "dV (the gradient that reaches v)"}, {"out", "out", "the output (and so every gradient)"}};
  return {{"q", "dwq", "dQ, the gradient that reaches Q (dwq and dx follow)"},
          {"k", "dwk", "dK, the gradient that reaches K (dwk and dx follow)"},
          {"v", "dwv", "dV, the gradient that reaches V (dwv and dx follow)"},
          {"merged", "dwv", "the gradient that reaches the heads' outputs (d merged = dout Wo; dwq, dwk, dwv and dx follow)"},
          {"xq", "dx", "the query projection's share of dx"},
          {"xk", "dx", "the key projection's share of dx"},
          {"xv", "dx", "the value projection's share of dx"},
          {"w:dwq", "dwq", "dwq alone"},
          {"w:dwk", "dwk", "dwk alone"},
          {"w:dwv", "dwv", "dwv alone"},
          {"w:dwo", "dwo", "dwo alone (the output projection's weight gradient)"},
          {"out", "out", "the output (and so every gradient)"}};
}

std::optional<TensorSet> predict_factor(const CaseSpec& c, const CaseInputs& in, const std::string& point, double f) {
  if (point.rfind("w:", 0) == 0 || point == "out") {
    TensorSet out = hypothesis_tensors(c, in, {});
    for (auto& [n, t] : out)
      if (t.defined() && (point == "out" || n == point.substr(2))) t = scale(Variable(t), f).data();
    return out;
  }
  Scaling s;
  if (point == "q") s.q = f;
  else if (point == "k") s.k = f;
  else if (point == "v") s.v = f;
  else if (point == "merged") s.merged = f;
  else if (point == "xq") s.xq = f;
  else if (point == "xk") s.xk = f;
  else s.xv = f;
  return instrumented(c, in, s);
}

// The factor a side's tensor carries at `point`, read by least squares.
std::optional<double> estimate_factor(const CaseSpec& c, const CaseInputs& in, const TensorSet& side,
                                      const TensorSet& correct, const FactorPoint& p) {
  const Tensor* a = find_tensor(side, p.estimate_on);
  const Tensor* e = find_tensor(correct, p.estimate_on);
  if (!a || !e || !a->defined() || !e->defined() || a->shape() != e->shape()) return std::nullopt;
  const auto va = a->contiguous().to_vector(), ve = e->contiguous().to_vector();
  if (p.id == "xq" || p.id == "xk" || p.id == "xv") {  // dx = dx + (f - 1) dx_path
    Scaling only;
    only.xq = p.id == "xq" ? 1 : 0;
    only.xk = p.id == "xk" ? 1 : 0;
    only.xv = p.id == "xv" ? 1 : 0;
    const auto part = instrumented(c, in, only);
    if (!part) return std::nullopt;
    const auto vp = find_tensor(*part, "dx")->contiguous().to_vector();
    std::vector<double> diff(va.size());
    for (std::size_t i = 0; i < va.size(); ++i) diff[i] = va[i] - ve[i];
    const auto g = lsq_factor(diff, vp);
    return g ? std::optional<double>(*g + 1) : std::nullopt;
  }
  return lsq_factor(va, ve);
}

// "sqrt(d) = 2", "2" (an expression that is its own figure is not repeated)
std::string factor_figure(double f, const std::vector<std::string>& exprs) {
  if (exprs.empty()) return fmt(f);
  // a numeral among them already says the figure
  if (std::find(exprs.begin(), exprs.end(), fmt(f)) != exprs.end()) return join(exprs, " = ");
  return join(exprs, " = ") + " = " + fmt(f);
}

std::string factor_sentence(const FactorPoint& p, double f, const std::vector<std::string>& exprs) {
  const std::string figure = factor_figure(f, exprs);
  if (exprs.size() == 1 && exprs[0] == "0") {
    if (p.id == "xq" || p.id == "xk" || p.id == "xv")
      return "dx lacks " + p.words.substr(0, p.words.size() - 6) +
             " (the share that flows back through that projection), while every weight gradient matches";
    return p.words + " is zero where it should not be";
  }
  return p.words + " is " + figure + " times the correct one" +
         (exprs.empty() ? " (an exact factor that matches no shape expression)" : "");
}

// ---------------------------------------------------------------- the sides

struct SideEvidence {
  std::string label;
  const TensorSet* tensors;
  bool reference = false;
};

// "dwk and dx"
std::string tensors_words(const std::vector<std::string>& v) { return and_list(v); }

// Kind 1: which part of attention is wrong, from which tensors differ.
std::string computation_sentence(const CaseSpec& c, const std::vector<std::string>& differ,
                                 const std::vector<std::string>& match) {
  auto d = [&](const char* n) { return contains(differ, n); };
  auto m = [&](const char* n) { return contains(match, n); };
  const std::string same = match.empty() ? "" : "; " + tensors_words(match) + " match";
  if (c.level == Level::rope) {
    if (d("out")) return "The rotation's output differs (the forward of RoPE)";
    return "The rotation's output matches and dx differs: the backward of RoPE is wrong";
  }
  if (d("out")) {
    std::string s = "The forward differs, so every gradient does; the error is in the forward";
    if (m("q_rot") && m("k_rot")) s += " after q and k are projected and rotated (q_rot and k_rot match): in the scores, the softmax, V or the output projection";
    else if (d("q_rot") || d("k_rot")) s += ", already in q or k after the rotation (" + tensors_words([&] {
                                              std::vector<std::string> t;
                                              for (const char* n : {"q_rot", "k_rot"}) if (d(n)) t.push_back(n);
                                              return t;
                                            }()) + " differ)";
    return s;
  }
  std::vector<std::string> grads;
  for (const auto& n : differ) grads.push_back(n);
  std::string where;
  if (c.level == Level::core) {
    const bool q = d("dq"), k = d("dk"), v = d("dv");
    if (q && k && v) where = "every input gradient differs with the forward exact: the backward of the core from dO";
    else if (q && k) where = "the gradient of the scores (dS, the softmax backward, shared by dQ and dK) is wrong";
    else if (k) where = "the gradient that reaches K is wrong (the backward of the scores with respect to K)";
    else if (q) where = "the gradient that reaches Q is wrong (the backward of the scores with respect to Q)";
    else if (v) where = "the gradient that reaches V is wrong (the backward of P V with respect to V)";
  } else {
    const bool x = d("dx"), q = d("dwq"), k = d("dwk"), v = d("dwv"), o = d("dwo");
    if (o && !q && !k && !v && !x) where = "only the output projection's gradient differs";
    else if (x && !q && !k && !v && !o) where = "only dx differs: the gradient into x (the sum of the three projections' input gradients) is wrong, every weight gradient is right";
    else if (!o && q && k && v) where = "the gradient that reaches the heads' outputs is wrong (d merged = dout Wo, or the merge's backward)";
    else if (!o && q && k) where = std::string("the gradient of the scores (dS, shared by dQ and dK) is wrong") + (c.rope ? ", or the rotation's backward" : "");
    else if (!o && k && !q && !v) where = x ? "the gradient that reaches K is wrong (the backward of the scores with respect to K)" : "dwk alone differs (dx matches): Wk's own weight gradient";
    else if (!o && q && !k && !v) where = x ? "the gradient that reaches Q is wrong (the backward of the scores with respect to Q)" : "dwq alone differs (dx matches): Wq's own weight gradient";
    else if (!o && v && !q && !k) where = x ? "the gradient that reaches V is wrong (the backward of P V with respect to V)" : "dwv alone differs (dx matches): Wv's own weight gradient";
  }
  if (where.empty()) return "The forward matches; " + tensors_words(grads) + " differ" + same;
  return "The forward matches and " + tensors_words(grads) + (grads.size() == 1 ? " differs" : " differ") + same + ": " + where;
}

// The per-head blocks of a tensor (MHA weight gradients: rows of dwq/dwk/dwv,
// columns of dwo; core tensors: dim -3), each block's ratio to its tolerance.
std::vector<double> head_block_ratios(const CaseSpec& c, const std::string& name, const Tensor& a, const Tensor& e) {
  std::int64_t dim = 0, n = 0;
  if (c.level == Level::core) {
    dim = a.dim() - 3;
    n = a.size(dim);
  } else if (name == "dwq" || name == "dwk" || name == "dwv" || name == "dwo") {
    dim = name == "dwo" ? 1 : 0;
    n = name == "dwk" || name == "dwv" ? c.dims.kv_heads() : c.dims.H;
  } else {
    return {};
  }
  std::vector<double> out;
  if (n < 1 || a.size(dim) % n != 0) return out;
  const std::int64_t block = a.size(dim) / n;
  for (std::int64_t h = 0; h < n; ++h)
    out.push_back(tensor_ratio(a.narrow(dim, h * block, block).contiguous(), e.narrow(dim, h * block, block).contiguous(),
                               c.tolerance_for(name)));
  return out;
}

// The one head that differs in every differing head-sliced tensor, or -1.
std::int64_t single_wrong_head(const CaseSpec& c, const TensorSet& side, const TensorSet& correct,
                               const std::vector<std::string>& differ, std::vector<std::string>& used) {
  if (c.dims.H < 2 || c.dims.kv_heads() != c.dims.H) return -1;
  std::int64_t head = -1;
  for (const auto& name : differ) {
    const Tensor* a = find_tensor(side, name);
    const Tensor* e = find_tensor(correct, name);
    if (!a || !e || !a->defined() || !e->defined()) return -1;
    const auto r = head_block_ratios(c, name, *a, *e);
    if (r.empty()) continue;  // out, dx at the mha level mix the heads
    std::vector<std::int64_t> bad;
    for (std::size_t h = 0; h < r.size(); ++h)
      if (!(r[h] <= 1)) bad.push_back(static_cast<std::int64_t>(h));
    if (bad.size() != 1 || (head >= 0 && bad[0] != head)) return -1;
    head = bad[0];
    used.push_back(name);
  }
  return used.empty() ? -1 : head;
}

// Core level: every output row equals the correct row times the row's softmax
// denominator sum_j exp(s_ij - max_j s_ij): the division by the sum is missing.
bool rows_unnormalized(const CaseSpec& c, const CaseInputs& in, const TensorSet& side, const TensorSet& correct) {
  if (c.level != Level::core || c.rope) return false;
  const Tensor* a = find_tensor(side, "out");
  const Tensor* e = find_tensor(correct, "out");
  if (!a || !e || !a->defined() || !e->defined() || a->shape() != e->shape()) return false;
  const AttentionSpec spec = attention_spec(c, in);
  const std::int64_t tq = in.q.size(-2), tk = in.k.size(-2), d = in.q.size(-1);
  const std::int64_t group = in.q.size(-3) / in.k.size(-3);
  std::vector<Variable> widened;  // query head h reads kv head h / G
  for (std::int64_t h = 0; h < in.q.size(-3); ++h) widened.push_back(Variable(in.k.narrow(-3, h / group, 1)));
  const Tensor kx = cat(widened, -3).data();
  Variable s = scale(matmul(Variable(in.q), transpose(Variable(kx), -2, -1)), spec.scale_for(d));
  const Tensor mask = diagnosis::hypothesis_mask(spec, tq, tk, {});
  Tensor scores = s.data();
  if (mask.defined()) scores = masked_fill(Variable(scores), logical_not(mask), -INFINITY).data();
  const auto sv = scores.contiguous().to_vector();
  const auto va = a->contiguous().to_vector(), ve = e->contiguous().to_vector();
  const std::int64_t dv = a->size(-1), rows = a->numel() / dv;
  if (static_cast<std::int64_t>(sv.size()) != rows * tk) return false;
  const Tolerance tol = c.tolerance_for("out");
  bool any_scaled = false;
  for (std::int64_t i = 0; i < rows; ++i) {
    double m = -INFINITY;
    for (std::int64_t j = 0; j < tk; ++j) m = std::max(m, sv[static_cast<std::size_t>(i * tk + j)]);
    double z = 0;
    if (std::isfinite(m))
      for (std::int64_t j = 0; j < tk; ++j) z += std::exp(sv[static_cast<std::size_t>(i * tk + j)] - m);
    if (!std::isfinite(m)) z = 0;  // a fully masked row gives zeros either way
    if (std::abs(z - 1) > 1e-9) any_scaled = true;
    for (std::int64_t x = 0; x < dv; ++x) {
      const std::size_t at = static_cast<std::size_t>(i * dv + x);
      const double want = z * ve[at];
      if (!(std::abs(va[at] - want) <= tol.atol + tol.rtol * std::abs(want))) return false;
    }
  }
  return any_scaled;
}

// Per-head factors c_h on the heads' outputs, when they are not all equal
// and the re-run with them reproduces the side exactly; else nullopt.
std::optional<std::vector<double>> per_head_factors(const CaseSpec& c, const CaseInputs& in, const TensorSet& side,
                                                    const TensorSet& correct) {
  if (c.rope || c.dims.H < 2 || c.level == Level::rope) return std::nullopt;
  const std::string on = c.level == Level::core ? "out" : "dwo";
  const Tensor* a = find_tensor(side, on);
  const Tensor* e = find_tensor(correct, on);
  if (!a || !e || !a->defined() || !e->defined() || a->shape() != e->shape()) return std::nullopt;
  const std::int64_t dim = c.level == Level::core ? a->dim() - 3 : 1, n = c.dims.H, block = a->size(dim) / n;
  if (c.level == Level::core && c.dims.kv_heads() != n) return std::nullopt;
  std::vector<double> f;
  for (std::int64_t h = 0; h < n; ++h) {
    const auto x = lsq_factor(a->narrow(dim, h * block, block).contiguous().to_vector(),
                              e->narrow(dim, h * block, block).contiguous().to_vector());
    if (!x) return std::nullopt;
    f.push_back(*x);
  }
  if (std::all_of(f.begin(), f.end(), [&](double x) { return std::abs(x - f[0]) <= 1e-9 * std::max(1.0, std::abs(x)); }))
    return std::nullopt;  // one factor for all: a plain factor, not per head
  auto scaled = [&](const Tensor& t, std::int64_t d, std::int64_t b) {
    std::vector<Variable> parts;
    for (std::int64_t h = 0; h < n; ++h) parts.push_back(scale(Variable(t.narrow(d, h * b, b)), f[static_cast<std::size_t>(h)]));
    return cat(parts, d).data();
  };
  TensorSet predicted;
  if (c.level == Level::core) {
    predicted = hypothesis_tensors(c, in, {});
    for (auto& [name, t] : predicted)
      if (t.defined()) t = scaled(t, t.dim() - 3, 1);
  } else {
    CaseInputs changed = in;
    const std::int64_t d = in.wo.size(1) / n;
    changed.wo = scaled(in.wo, 1, d);
    predicted = hypothesis_tensors(c, changed, {});
    if (Tensor* g = find_mut(predicted, "dwo"); g && g->defined()) *g = scaled(*g, 1, d);
  }
  if (fit_ratio(side, predicted, c).first > 1.0) return std::nullopt;
  return f;
}

// ---------------------------------------------------------------- confirmation

struct Checked {
  bool ok = true;
  std::vector<std::string> confirmed_at;
  std::string refuted_at;  // the variant that refutes it
  bool vanished = false;   // refuted where the failure vanishes
};

// A model predicts the side at every variant where it applies.
Checked confirm(const std::string& label, const std::vector<VariantEvidence>& variants,
                const std::function<std::optional<TensorSet>(const CaseSpec&, const CaseInputs&)>& predict) {
  Checked out;
  for (const auto& v : variants) {
    const CaseResult& r = *v.result;
    if (r.status != CaseStatus::pass && r.status != CaseStatus::fail) continue;
    const TensorSet* side = label == r.lhs_label ? &r.lhs : label == r.rhs_label ? &r.rhs : nullptr;
    if (!side || side->empty()) continue;
    std::optional<TensorSet> p;
    try {
      p = predict(*v.spec, *v.inputs);
    } catch (const std::exception&) {
      continue;  // the model has no form at this variant's shape
    }
    if (!p) continue;
    if (fit_ratio(*side, *p, *v.spec).first <= 1.0) {
      out.confirmed_at.push_back(v.change);
      continue;
    }
    out.ok = false;
    out.refuted_at = v.change;
    out.vanished = r.status == CaseStatus::pass;
    return out;
  }
  return out;
}

std::string refuted_words(const std::string& what, const Checked& k) {
  return what + " (fits at the failing shape, but " +
         (k.vanished ? "the failure vanishes at " + k.refuted_at + ", where it would still show"
                     : "at " + k.refuted_at + " it does not reproduce the side") + ")";
}

std::string confirmed_words(const Checked& k) {
  if (k.confirmed_at.empty()) return "at the failing shape";
  return "at the failing shape and at " + std::to_string(k.confirmed_at.size()) + " localization variant" +
         (k.confirmed_at.size() == 1 ? "" : "s");
}

// Catalog bugs that can show in this case: their hypothesis differs from the correct attention here.
std::vector<Bug> visible_bugs(const CaseSpec& c, const CaseInputs& in, const TensorSet& correct) {
  std::vector<Bug> out;
  for (const auto& info : bug_catalog()) {
    if (c.level == Level::core && info.visibility.mha_only) continue;
    if (c.level == Level::rope && !diagnosis::has_rope_level_form(info)) continue;
    try {
      const TensorSet h = hypothesis_tensors(c, in, info.bug);
      if (fit_ratio(h, correct, c).first > 1.0) out.push_back(info.bug);
    } catch (const std::exception&) {
    }
  }
  return out;
}

void diagnose_side(Diagnosis& dx, const CaseSpec& c, const CaseInputs& in, const SideEvidence& side,
                   const TensorSet& correct, const std::vector<VariantEvidence>& variants) {
  const TensorSet& ts = *side.tensors;
  const std::string who = side.reference ? "the reference " + side.label : side.label;
  auto add = [&](Finding f) {
    f.side = side.label;
    dx.findings.push_back(std::move(f));
  };

  // Which tensors differ, and gradients not returned at all.
  std::vector<std::string> differ, match, missing;
  for (const auto& name : c.check) {
    const Tensor* a = find_tensor(ts, name);
    const Tensor* e = find_tensor(correct, name);
    if (!e || !e->defined()) continue;
    if (!a || !a->defined()) {
      if (!side.reference) missing.push_back(name);
      differ.push_back(name);
      continue;
    }
    (tensor_ratio(*a, *e, c.tolerance_for(name)) <= 1 ? match : differ).push_back(name);
  }
  if (differ.empty()) return;
  for (const auto& name : missing) {
    double top = 0;
    for (double v : find_tensor(correct, name)->to_vector()) top = std::max(top, std::abs(v));
    const std::string input = name.substr(1);
    Finding f{"missing_gradient", "", "", {name}, top == 0 ? "expected zeros" : "expected max |" + name + "| " + fmt(top), {}, ""};
    f.sentence = who + " returned no gradient for " + input + " (its graph never reaches " + input + "); " +
                 (top == 0 ? "expected zeros" : "the correct " + name + " is not zero (max |" + name + "| " + fmt(top) + ")") +
                 ": a structural difference, which no hypothesis fits.";
    add(f);
  }
  std::vector<std::string> present_differ;
  for (const auto& n : differ)
    if (!contains(missing, n)) present_differ.push_back(n);
  {
    Finding f{"computation", "", "", differ, "", {}, ""};
    f.sentence = who + ": " + computation_sentence(c, present_differ.empty() ? differ : present_differ, match) + ".";
    if (!present_differ.empty() || missing.empty()) add(f);
  }
  if (!missing.empty()) return;  // a structural difference: no relation "fits" it

  auto fits_here = [&](const std::optional<TensorSet>& p) { return p && fit_ratio(ts, *p, c).first <= 1.0; };

  // Relations that re-run the correct attention: factors, then input transforms.
  std::vector<Finding> relations;
  for (const auto& p : factor_points(c)) {
    const auto f = estimate_factor(c, in, ts, correct, p);
    if (!f || std::abs(*f - 1) < 1e-12) continue;
    std::vector<std::pair<std::string, double>> matches;
    for (const auto& [name, value] : shape_expressions(c))
      if (std::abs(value - *f) <= 1e-6 * std::max(1.0, std::abs(value))) matches.push_back({name, value});
    std::optional<TensorSet> here;
    try {
      here = predict_factor(c, in, p.id, *f);
    } catch (const std::exception&) {
      continue;
    }
    if (!fits_here(here)) continue;
    // Each expression must carry the factor to every variant; the raw figure cannot.
    std::vector<std::string> kept;
    Checked all;
    std::string refuted;
    for (const auto& [name, value] : matches) {
      const Checked k = confirm(side.label, variants, [&, name = name](const CaseSpec& vc, const CaseInputs& vi) {
        const auto v = expression_value(vc, name);
        return v ? predict_factor(vc, vi, p.id, *v) : std::nullopt;
      });
      if (k.ok) {
        kept.push_back(name);
        all.confirmed_at = k.confirmed_at;
      } else if (refuted.empty()) {
        refuted = refuted_words(p.words + " times " + name, k);
      }
    }
    if (kept.empty() && !matches.empty()) {
      dx.ruled_out.push_back(refuted);
      continue;
    }
    Finding fd{"relation", "grad_factor", "", {p.estimate_on},
               factor_figure(*f, kept), all.confirmed_at, ""};
    if (p.id == "out") fd.relation = "output_factor";
    fd.sentence = who + ": " + factor_sentence(p, *f, kept) + " (reproduces every checked tensor " +
                  confirmed_words(all) + ").";
    relations.push_back(fd);
    break;  // the first point that explains the side is the narrowest
  }
  for (const auto& m : transform_models(c)) {
    if (!relations.empty()) break;
    std::optional<TensorSet> here;
    try {
      here = m.predict(c, in, {});
    } catch (const std::exception&) {
      continue;
    }
    if (!fits_here(here)) continue;
    const Checked k = confirm(side.label, variants, [&](const CaseSpec& vc, const CaseInputs& vi) { return m.predict(vc, vi, {}); });
    if (!k.ok) {
      dx.ruled_out.push_back(refuted_words(m.figure, k));
      continue;
    }
    Finding fd{"relation", m.relation, "", m.tensors, m.figure, k.confirmed_at, ""};
    fd.sentence = who + " " + m.what + ": the correct attention re-run that way reproduces every checked tensor " +
                  confirmed_words(k) + ".";
    relations.push_back(fd);
  }
  for (auto& f : relations) add(f);
  if (!relations.empty()) return;

  // Two bugs at once: catalog x catalog and catalog x input transform, each
  // member alone not reproducing the side (none did above).
  const std::vector<Bug> bugs = visible_bugs(c, in, correct);
  const std::vector<Model> models = transform_models(c);
  struct Pair {
    std::string first, second, what;
    std::function<std::optional<TensorSet>(const CaseSpec&, const CaseInputs&)> predict;
  };
  std::vector<Pair> pairs;
  for (std::size_t i = 0; i < bugs.size(); ++i) {
    const std::string a(bug_info(bugs[i]).name);
    for (std::size_t j = i + 1; j < bugs.size(); ++j) {
      const std::string b(bug_info(bugs[j]).name);
      BugSet both;
      both.add(bugs[i]).add(bugs[j]);
      pairs.push_back({a, b, a + " and " + b,
                       [both](const CaseSpec& vc, const CaseInputs& vi) -> std::optional<TensorSet> {
                         return hypothesis_tensors(vc, vi, both);
                       }});
    }
    for (const auto& m : models)
      pairs.push_back({a, m.figure, a + " and, besides, it " + m.what,
                       [m, bug = bugs[i]](const CaseSpec& vc, const CaseInputs& vi) { return m.predict(vc, vi, bug); }});
  }
  for (const auto& p : pairs) {
    std::optional<TensorSet> here;
    try {
      here = p.predict(c, in);
    } catch (const std::exception&) {
      continue;
    }
    if (!fits_here(here)) continue;
    const Checked k = confirm(side.label, variants, p.predict);
    if (!k.ok) {
      dx.ruled_out.push_back(refuted_words(p.first + " + " + p.second, k));
      continue;
    }
    Finding fd{"pair", "two_bugs", "", differ, p.first + " + " + p.second, k.confirmed_at, ""};
    fd.sentence = who + " reproduces two bugs at once: " + p.what + " (together within tolerance " + confirmed_words(k) +
                  "; neither alone reproduces it).";
    add(fd);
    return;  // the first pair that holds; the search is ordered by the catalog
  }

  // A factor per head on the heads' outputs (mha: the correct attention with
  // Wo's column block h times c_h, dwo's block h times c_h; core: out, dq, dk,
  // dv of head h times c_h), the factors read from dwo (core: out) per head.
  if (const auto per_head = per_head_factors(c, in, ts, correct)) {
    std::vector<std::string> figures;
    for (double f : *per_head) figures.push_back(fmt(f));
    Finding fd{"relation", "per_head_factor", "", {c.level == Level::core ? "out" : "dwo"}, "[" + join(figures, ", ") + "]", {}, ""};
    fd.sentence = who + " scales the output of each head by its own factor, heads 0.." + std::to_string(per_head->size() - 1) +
                  ": " + fd.figure + " (the correct attention re-run with those factors reproduces every checked tensor "
                  "at the failing shape).";
    add(fd);
    return;
  }

  // Measured facts: one head wrong, rows unnormalized, an exact factor on one tensor.
  std::vector<std::string> used;
  const std::int64_t head = single_wrong_head(c, ts, correct, present_differ, used);
  if (head >= 0) {
    const std::int64_t d = c.dims.head_dim();
    Finding fd{"relation", "one_head", "", used, "head " + std::to_string(head), {}, ""};
    // confirmed where the variant still has that head (counted from the end when it is the last)
    const bool last = head == c.dims.H - 1;
    for (const auto& v : variants) {
      const CaseResult& r = *v.result;
      if (r.status != CaseStatus::fail || v.spec->dims.H < 2 || v.spec->dims.kv_heads() != v.spec->dims.H) continue;
      const TensorSet* s = side.label == r.lhs_label ? &r.lhs : side.label == r.rhs_label ? &r.rhs : nullptr;
      if (!s) continue;
      const TensorSet vcorrect = hypothesis_tensors(*v.spec, *v.inputs, {});
      std::vector<std::string> vdiff, vused;
      for (const auto& n : v.spec->check) {
        const Tensor* a = find_tensor(*s, n);
        const Tensor* e = find_tensor(vcorrect, n);
        if (a && e && a->defined() && e->defined() && tensor_ratio(*a, *e, v.spec->tolerance_for(n)) > 1) vdiff.push_back(n);
      }
      const std::int64_t vh = single_wrong_head(*v.spec, *s, vcorrect, vdiff, vused);
      if (vh == (last ? v.spec->dims.H - 1 : head)) fd.confirmed_at.push_back(v.change);
    }
    const std::string lo = std::to_string(head * d), hi = std::to_string((head + 1) * d);
    fd.sentence = who + ": only head " + std::to_string(head) + (last ? " (the last)" : "") + " differs in " +
                  and_list(used) + ", every other head matches exactly" +
                  (c.level == Level::mha ? "; it owns rows [" + lo + ", " + hi + ") of Wq, Wk, Wv and columns [" + lo +
                                               ", " + hi + ") of Wo"
                                         : "") +
                  (fd.confirmed_at.empty() ? "" : " (so again at " + and_list(fd.confirmed_at) + ")") + ".";
    add(fd);
    return;
  }
  if (rows_unnormalized(c, in, ts, correct)) {
    Finding fd{"relation", "row_normalization", "", {"out"}, "out row i = sum_j exp(s_ij - max s_i) x correct row i", {}, ""};
    for (const auto& v : variants) {
      const CaseResult& r = *v.result;
      if (r.status != CaseStatus::fail) continue;
      const TensorSet* s = side.label == r.lhs_label ? &r.lhs : side.label == r.rhs_label ? &r.rhs : nullptr;
      if (s && rows_unnormalized(*v.spec, *v.inputs, *s, hypothesis_tensors(*v.spec, *v.inputs, {})))
        fd.confirmed_at.push_back(v.change);
    }
    fd.sentence = who + ": every output row is the correct row times its softmax denominator sum_j exp(s_ij - max_j s_ij): "
                        "the row normalization (the division by the row's sum) is missing" +
                  (fd.confirmed_at.empty() ? "" : " (so again at " + and_list(fd.confirmed_at) + ")") + ".";
    add(fd);
    return;
  }
  for (const auto& name : present_differ) {
    const Tensor* a = find_tensor(ts, name);
    const Tensor* e = find_tensor(correct, name);
    const auto f = lsq_factor(a->contiguous().to_vector(), e->contiguous().to_vector());
    if (!f || tensor_ratio(*a, scale(Variable(*e), *f).data(), c.tolerance_for(name)) > 1) continue;
    std::vector<std::string> exprs;
    for (const auto& [n, v] : shape_expressions(c))
      if (std::abs(v - *f) <= 1e-6 * std::max(1.0, std::abs(v))) exprs.push_back(n);
    Finding fd{"relation", "tensor_factor", "", {name}, factor_figure(*f, exprs), {}, ""};
    fd.sentence = who + ": " + name + " is exactly " + fd.figure + " times the correct one (the other differing tensors are not a multiple).";
    add(fd);
  }
}

}  // namespace

void find_outside_catalog(Diagnosis& dx, const CaseResult& failed, const CaseInputs& in,
                          const std::vector<VariantEvidence>& variants) {
  const CaseSpec& c = failed.spec;
  if (!dx.fits.empty()) return;
  std::vector<SideEvidence> sides;
  if (!failed.lhs.empty()) sides.push_back({failed.lhs_label, &failed.lhs, false});
  if (!failed.rhs.empty()) sides.push_back({failed.rhs_label, &failed.rhs, c.is_reference()});
  TensorSet correct;
  try {
    correct = hypothesis_tensors(c, in, {});
  } catch (const std::exception&) {
    return;
  }
  for (const auto& s : sides) {
    if (s.label == dx.correct_side) continue;
    // A side is diagnosed against the correct attention; with no side correct
    // both are (two wrong plugins, or a plugin and a wrong reference).
    if (fit_ratio(*s.tensors, correct, c).first <= 1.0) continue;
    try {
      diagnose_side(dx, c, in, s, correct, variants);
    } catch (const std::exception& e) {
      dx.evidence.push_back("the search for findings on " + s.label + " stopped: " + e.what());
    }
  }
}

}  // namespace headgrad::analysis
