#include "runner/compare.hpp"

#include <cmath>
#include <limits>

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
    const bool kv = c.level == Level::mha && (name == "dwk" || name == "dwv");
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
