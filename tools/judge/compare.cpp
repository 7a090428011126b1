#include "judge/compare.hpp"

#include <cmath>
#include <limits>

#include <headgrad/ops.hpp>
#include <headgrad/parallel.hpp>

namespace headgrad::runner {

TensorComparison compare_tensor(const std::string& name, const Tensor& lhs, const Tensor& rhs,
                                Tolerance tol, Level level, std::int64_t heads) {
  TensorComparison cmp;
  cmp.name = name;
  cmp.tolerance = tol;
  cmp.shape = rhs.defined() ? rhs.shape() : lhs.shape();
  if (!lhs.defined() || !rhs.defined()) {
    cmp.allclose = false;
    cmp.problem = "missing";
    return cmp;
  }
  if (lhs.shape() != rhs.shape()) {
    cmp.allclose = false;
    cmp.problem = "shape " + shape_str(lhs.shape()) + " vs " + shape_str(rhs.shape());
    return cmp;
  }
  const std::vector<double> a = lhs.to_vector(), b = rhs.to_vector();
  cmp.numel = static_cast<std::int64_t>(a.size());
  const double inf = std::numeric_limits<double>::infinity();
  double worst_ratio = -1;
  std::int64_t worst_at = -1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs(a[i] - b[i]);
    const double bound = tol.atol + tol.rtol * std::fabs(b[i]);
    const bool nan = std::isnan(diff);
    // inf == inf counts as equal (numpy's allclose does too)
    const bool same_inf = std::isinf(a[i]) && a[i] == b[i];
    const bool ok = same_inf || (!nan && !std::isinf(diff) && diff <= bound);
    if (!ok) ++cmp.mismatched;
    if (nan) {
      cmp.max_abs = cmp.max_rel = std::numeric_limits<double>::quiet_NaN();
    } else if (!same_inf && !std::isnan(cmp.max_abs)) {
      cmp.max_abs = std::max(cmp.max_abs, diff);
      const double rel = b[i] != 0 ? diff / std::fabs(b[i]) : (diff == 0 ? 0 : inf);
      cmp.max_rel = std::max(cmp.max_rel, rel);
    }
    const double ratio = same_inf ? 0 : nan ? inf : bound > 0 ? diff / bound : (diff > 0 ? inf : 0);
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst_at = static_cast<std::int64_t>(i);
    }
  }
  cmp.allclose = cmp.mismatched == 0;
  if (worst_at >= 0) {
    ElementRef e;
    e.index = unravel_index(worst_at, cmp.shape);
    e.where = describe_index(level, name, cmp.shape, e.index, heads);
    e.lhs = a[static_cast<std::size_t>(worst_at)];
    e.rhs = b[static_cast<std::size_t>(worst_at)];
    cmp.worst = e;
  }
  return cmp;
}

std::vector<TensorComparison> compare_sets(const TensorSet& lhs, const TensorSet& rhs, const CaseSpec& c,
                                           const std::string& lhs_label, const std::string& rhs_label) {
  // one tensor per worker (each is a pass over its own elements): the
  // comparisons of a large case are seconds with no GEMM in them
  std::vector<TensorComparison> out(c.check.size());
  parallel_items(static_cast<std::int64_t>(c.check.size()), [&](std::int64_t i, int) {
    const std::string& name = c.check[static_cast<std::size_t>(i)];
    const Tensor* a = find_tensor(lhs, name);
    const Tensor* b = find_tensor(rhs, name);
    TensorComparison cmp = compare_tensor(name, a ? *a : Tensor(), b ? *b : Tensor(), c.tolerance_for(name),
                                          c.level, head_blocks(c, name));
    if (cmp.problem == "missing") {
      const bool left = !a || !a->defined();
      const bool right = !b || !b->defined();
      cmp.problem = std::string(left && right ? lhs_label + " and " + rhs_label + " give" : left ? lhs_label + " gives" : rhs_label + " gives") +
                    " no " + name + (name == "out" ? "" : " (the graph does not reach that input)");
    }
    out[static_cast<std::size_t>(i)] = std::move(cmp);
  });
  return out;
}

double rounding_floor(const Tensor& golden, DType dtype) {
  const Tensor g = golden.to(dtype);
  const Variable point3(Tensor::full(g.shape(), 0.3, dtype));
  // the sum rounds to dtype, the difference rounds again: what is left of g is its noise
  const std::vector<double> back = sub(add(Variable(g), point3), point3).data().to_vector();
  const std::vector<double> gv = g.to_vector();
  double m = 0;
  for (std::size_t i = 0; i < gv.size(); ++i) m = std::max(m, std::fabs(back[i] - gv[i]));
  return 2 * m;
}

namespace {

// The sequence axis of a tensor (and its head axis, -1 if none) from the axes
// table: out, dx [B, T, D] (D mixes heads after Wo: no head axis); core and
// rope tensors and the taps [B, H, T, d] or [B, T, d]; weight gradients: none.
struct ProfileAxes {
  std::int64_t axis = -1, head_axis = -1;
  std::string name;
};
ProfileAxes profile_axes(Level level, std::string_view name, const Shape& shape) {
  const TensorAxes axes = axes_of(level, name, shape, 0);
  const auto pos = axes.find(AxisRole::position);
  if (!pos) return {};
  const auto head = axes.find(AxisRole::head);
  const bool one_per_head = head && axes.dims[*head].role == AxisRole::head;
  return {static_cast<std::int64_t>(*pos), one_per_head ? static_cast<std::int64_t>(*head) : -1, axes.dims[*pos].key};
}

// max |a - g| per index of `axis` (and per (head, position) when head_axis >= 0).
void fill_profiles(const std::vector<double>& a, const std::vector<double>& g, const Shape& shape, std::int64_t axis,
                   std::int64_t head_axis, std::vector<double>& by_position,
                   std::vector<std::vector<double>>* by_head_position) {
  auto inner_of = [&](std::int64_t ax) {
    std::int64_t n = 1;
    for (std::size_t i = static_cast<std::size_t>(ax) + 1; i < shape.size(); ++i) n *= shape[i];
    return n;
  };
  const std::int64_t n_pos = shape[static_cast<std::size_t>(axis)], inner = inner_of(axis);
  by_position.assign(static_cast<std::size_t>(n_pos), 0.0);
  std::int64_t n_heads = 0, head_inner = 1;
  if (by_head_position && head_axis >= 0) {
    n_heads = shape[static_cast<std::size_t>(head_axis)];
    head_inner = inner_of(head_axis);
    by_head_position->assign(static_cast<std::size_t>(n_heads), std::vector<double>(static_cast<std::size_t>(n_pos), 0.0));
  }
  auto raise = [](double& m, double e) { m = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(m, e); };
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(a[i] - g[i]);
    const auto pos = static_cast<std::size_t>((static_cast<std::int64_t>(i) / inner) % n_pos);
    raise(by_position[pos], e);
    if (n_heads > 0) {
      const auto h = static_cast<std::size_t>((static_cast<std::int64_t>(i) / head_inner) % n_heads);
      raise((*by_head_position)[h][pos], e);
    }
  }
}

struct ErrorFigures {
  double max = 0, normwise = 0;
};

// max |a - g| (NaN if any difference is NaN) and ||a - g|| / ||g||.
ErrorFigures error_figures(const std::vector<double>& a, const std::vector<double>& g) {
  ErrorFigures f;
  double diff2 = 0, g2 = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(a[i] - g[i]);
    if (std::isnan(e) || std::isnan(f.max)) f.max = std::numeric_limits<double>::quiet_NaN();
    else f.max = std::max(f.max, e);
    diff2 += e * e;
    g2 += g[i] * g[i];
  }
  f.normwise = g2 > 0 ? std::sqrt(diff2 / g2) : (diff2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  return f;
}

}  // namespace

void judge_by_baseline(TensorComparison& cmp, const std::vector<JudgedSide>& sides, const Tensor& golden,
                       const Tensor& baseline, double k, DType dtype, Level level) {
  if (!cmp.problem.empty()) return;  // the sides themselves could not be compared: already failed
  auto refuse = [&](const std::string& problem) {
    cmp.allclose = false;
    cmp.problem = problem;
  };
  if (!golden.defined()) return refuse("no golden " + cmp.name + " (the oracle in float64 gave none)");
  if (!baseline.defined()) return refuse("no baseline " + cmp.name + " (the oracle in the case's dtype gave none)");
  if (golden.shape() != cmp.shape || baseline.shape() != cmp.shape)
    return refuse("golden " + shape_str(golden.shape()) + " or baseline " + shape_str(baseline.shape()) +
                  " shaped unlike " + shape_str(cmp.shape));
  const std::vector<double> g = golden.to_vector(), base = baseline.to_vector();
  BaselineCheck b;
  b.k = k;
  b.floor = rounding_floor(golden, dtype);
  const ErrorFigures bf = error_figures(base, g);
  b.baseline_err = bf.max;
  b.baseline_normwise = bf.normwise;
  b.bound = k * b.baseline_err + b.floor;
  std::vector<double> shown;
  bool first = true;
  for (const auto& s : sides) {
    if (!s.tensor || !s.tensor->defined() || s.tensor->shape() != cmp.shape) continue;  // compare_tensor said so
    std::vector<double> v = s.tensor->to_vector();
    const ErrorFigures f = error_figures(v, g);
    // NaN is the worst error of all
    const bool worse = first || std::isnan(f.max) || (!std::isnan(b.err) && f.max > b.err);
    if (worse) {
      b.side = s.label;
      b.err = f.max;
      b.normwise = f.normwise;
      shown = std::move(v);
    }
    first = false;
  }
  b.ratio = b.baseline_err > 0 ? b.err / b.baseline_err
            : b.err == 0       ? 1.0
                               : std::numeric_limits<double>::infinity();
  std::int64_t mismatched = 0;
  for (std::size_t i = 0; i < shown.size(); ++i) {
    const double e = std::fabs(shown[i] - g[i]);
    if (std::isnan(e) || e > b.bound) ++mismatched;
  }
  cmp.mismatched = mismatched;
  cmp.allclose = !shown.empty() && mismatched == 0;
  const ProfileAxes axes = profile_axes(level, cmp.name, cmp.shape);
  if (axes.axis >= 0 && !shown.empty()) {
    b.position_axis = axes.name;
    fill_profiles(shown, g, cmp.shape, axes.axis, axes.head_axis, b.err_by_position, &b.err_by_head_position);
    fill_profiles(base, g, cmp.shape, axes.axis, -1, b.baseline_by_position, nullptr);
  }
  cmp.baseline = std::move(b);
}


}  // namespace headgrad::runner
