#include "judge/compare.hpp"

#include <cmath>
#include <limits>

#include <headgrad/ops.hpp>

namespace headgrad::runner {

namespace {

std::string kv(const char* key, std::int64_t value) { return std::string(key) + "=" + std::to_string(value); }

}  // namespace

std::string describe_index(Level level, std::string_view tensor, const Shape& shape,
                           std::span<const std::int64_t> index, std::int64_t heads) {
  const std::size_t n = index.size();
  if (n != shape.size() || n == 0) return shape_str(index);
  if (level == Level::mha) {
    // dwq, dwk, dwv [heads*d, D] are cut by rows; out, dx [B, T, D] and dwo [D, H*d] by columns
    const bool by_rows = (tensor == "dwq" || tensor == "dwk" || tensor == "dwv") && n == 2;
    const std::int64_t dm = by_rows ? shape[0] : shape.back();
    const std::int64_t d = heads > 0 && dm % heads == 0 ? dm / heads : dm;
    if ((tensor == "out" || tensor == "dx") && n == 3)
      return kv("b", index[0]) + ", " + kv("t", index[1]) + ", " + kv("head", index[2] / d) + ", " +
             kv("ch", index[2] % d);
    if ((tensor == "dwq" || tensor == "dwk" || tensor == "dwv") && n == 2)
      return kv("head", index[0] / d) + ", " + kv("row", index[0] % d) + ", " + kv("in", index[1]);
    if (tensor == "dwo" && n == 2)
      return kv("out", index[0]) + ", " + kv("head", index[1] / d) + ", " + kv("col", index[1] % d);
    // biases: bq, bk, bv [heads*d] by head as their weights' rows; bo [D] by output feature
    if ((tensor == "dbq" || tensor == "dbk" || tensor == "dbv") && n == 1) {
      const std::int64_t hd = heads > 0 && shape[0] % heads == 0 ? shape[0] / heads : shape[0];
      return kv("head", index[0] / hd) + ", " + kv("row", index[0] % hd);
    }
    if (tensor == "dbo" && n == 1) return kv("out", index[0]);
    return shape_str(index);
  }
  // core: [..., T, d] with [B, H] leading when 4-D
  if (n < 2) return shape_str(index);
  std::string s;
  if (n == 4) {
    s = kv("b", index[0]) + ", " + kv("h", index[1]) + ", ";
  } else {
    for (std::size_t i = 0; i + 2 < n; ++i) {  // leading dims by position: "i0=.., i1=.."
      std::string key = "i";
      key += std::to_string(i);
      s += kv(key.c_str(), index[i]) + ", ";
    }
  }
  const char* pos = tensor == "dk" || tensor == "dv" ? "k" : "q";
  return s + kv(pos, index[n - 2]) + ", " + kv("ch", index[n - 1]);
}

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
  std::vector<TensorComparison> out;
  const std::int64_t heads = c.dims.H;
  for (const auto& name : c.check) {
    const Tensor* a = find_tensor(lhs, name);
    const Tensor* b = find_tensor(rhs, name);
    // dwk and dwv have one row block per kv head
    const bool kv = c.level == Level::mha && (name == "dwk" || name == "dwv" || name == "dbk" || name == "dbv");
    TensorComparison cmp = compare_tensor(name, a ? *a : Tensor(), b ? *b : Tensor(), c.tolerance_for(name),
                                          c.level, kv ? c.dims.kv_heads() : heads);
    if (cmp.problem == "missing") {
      const bool left = !a || !a->defined();
      const bool right = !b || !b->defined();
      cmp.problem = std::string(left && right ? lhs_label + " and " + rhs_label + " give" : left ? lhs_label + " gives" : rhs_label + " gives") +
                    " no " + name + (name == "out" ? "" : " (the graph does not reach that input)");
    }
    out.push_back(std::move(cmp));
  }
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

// The sequence axis of a tensor (and its head axis, -1 if none), by level and
// name: mha out, dx [B, T, D] (D mixes heads after Wo: none); core and rope
// tensors and the taps [B, H, T, d] or [B, T, d]; weight gradients: no axis.
struct ProfileAxes {
  std::int64_t axis = -1, head_axis = -1;
  const char* name = "";
};
ProfileAxes profile_axes(Level level, std::string_view name, std::int64_t ndim) {
  const bool tap = name == "q_rot" || name == "k_rot";
  if (level == Level::mha && !tap) {
    if ((name == "out" || name == "dx") && ndim == 3) return {1, -1, "t"};
    return {};
  }
  if (ndim < 2) return {};
  const bool keys = name == "dk" || name == "dv" || name == "k_rot";
  const char* axis_name = level != Level::core ? "t" : keys ? "k" : "q";
  return {ndim - 2, ndim == 4 ? 1 : -1, axis_name};
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
  const ProfileAxes axes = profile_axes(level, cmp.name, static_cast<std::int64_t>(cmp.shape.size()));
  if (axes.axis >= 0 && !shown.empty()) {
    b.position_axis = axes.name;
    fill_profiles(shown, g, cmp.shape, axes.axis, axes.head_axis, b.err_by_position, &b.err_by_head_position);
    fill_profiles(base, g, cmp.shape, axes.axis, -1, b.baseline_by_position, nullptr);
  }
  cmp.baseline = std::move(b);
}

std::optional<ElementRef> first_non_finite(const Tensor& t, Level level, std::string_view name,
                                           std::int64_t heads) {
  if (!t.defined() || t.dtype() == DType::boolean) return std::nullopt;
  const std::vector<double> v = t.to_vector();
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (std::isfinite(v[i])) continue;
    ElementRef e;
    e.index = unravel_index(static_cast<std::int64_t>(i), t.shape());
    e.where = describe_index(level, name, t.shape(), e.index, heads);
    e.lhs = v[i];
    return e;
  }
  return std::nullopt;
}

}  // namespace headgrad::runner
