#include "judge/compare.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <headgrad/ops.hpp>
#include <headgrad/parallel.hpp>

namespace headgrad::runner {

namespace {

// The judge reads its tensors a chunk at a time as float64: a pass over a
// model-sized gradient holds a few chunks, not a float64 copy of each of the
// side, the other side, the golden and the baseline.
constexpr std::int64_t kChunk = std::int64_t{1} << 15;  // 256 KiB of doubles

// Calls f(begin, n, chunks) over every chunk of the tensors (one element
// count), chunks[i] the chunk of tensors[i] as float64 (Tensor::to_vector of
// that stretch of the flattened tensor).
template <class F>
void for_each_chunk(const std::vector<const Tensor*>& tensors, F&& f) {
  std::vector<Tensor> flat;
  for (const Tensor* t : tensors) flat.push_back(t->contiguous().reshape({t->numel()}));
  const std::int64_t total = flat.empty() ? 0 : flat[0].numel();
  std::vector<std::vector<double>> read(flat.size());
  std::vector<const double*> chunks(flat.size());
  for (std::int64_t begin = 0; begin < total; begin += kChunk) {
    const std::int64_t n = std::min(kChunk, total - begin);
    for (std::size_t i = 0; i < flat.size(); ++i) {
      read[i] = flat[i].narrow(0, begin, n).to_vector();
      chunks[i] = read[i].data();
    }
    f(begin, n, chunks);
  }
}

// Partial results a loop keeps side by side so that it does not wait on one
// running max or sum (and vectorizes).
constexpr int kLanes = 8;

// max |a[i] - b[i]| over i < n; NaN if any difference is NaN.
double max_abs_diff(const double* a, const double* b, std::int64_t n) {
  double mx[kLanes] = {};
  bool nan = false;
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const double e = std::fabs(a[i + l] - b[i + l]);
      nan |= e != e;
      mx[l] = e > mx[l] ? e : mx[l];
    }
  for (; i < n; ++i) {
    const double e = std::fabs(a[i] - b[i]);
    nan |= e != e;
    mx[0] = e > mx[0] ? e : mx[0];
  }
  if (nan) return std::numeric_limits<double>::quiet_NaN();
  return *std::max_element(mx, mx + kLanes);
}

}  // namespace

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
  cmp.numel = lhs.numel();
  const double inf = std::numeric_limits<double>::infinity();
  double worst_ratio = -1;
  std::int64_t worst_at = -1;
  double worst_a = 0, worst_b = 0;
  for_each_chunk({&lhs, &rhs}, [&](std::int64_t begin, std::int64_t n, const std::vector<const double*>& ch) {
    const double *a = ch[0], *b = ch[1];
    for (std::int64_t i = 0; i < n; ++i) {
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
        worst_at = begin + i;
        worst_a = a[i];
        worst_b = b[i];
      }
    }
  });
  cmp.allclose = cmp.mismatched == 0;
  if (worst_at >= 0) {
    ElementRef e;
    e.index = unravel_index(worst_at, cmp.shape);
    e.where = describe_index(level, name, cmp.shape, e.index, heads);
    e.lhs = worst_a;
    e.rhs = worst_b;
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

namespace {

// max |(g + 0.3 - 0.3) - g| over elements [begin, begin + n) of the golden,
// g rounded to dtype: the engine's own ops on that stretch (elementwise, so
// each element is what the whole tensor's ops give it).
double noise_of_chunk(const Tensor& golden_flat, std::int64_t begin, std::int64_t n, DType dtype) {
  const Tensor g = golden_flat.narrow(0, begin, n).to(dtype);
  const Variable point3(Tensor::full(g.shape(), 0.3, dtype));
  // the sum rounds to dtype, the difference rounds again: what is left of g is its noise
  const Tensor back = sub(add(Variable(g), point3), point3).data();
  double m = 0;
  for_each_chunk({&back, &g}, [&](std::int64_t, std::int64_t count, const std::vector<const double*>& ch) {
    m = std::max(m, max_abs_diff(ch[0], ch[1], count));
  });
  return m;
}

}  // namespace

double rounding_floor(const Tensor& golden, DType dtype) {
  const Tensor flat = golden.contiguous().reshape({golden.numel()});
  double m = 0;
  for (std::int64_t begin = 0; begin < flat.numel(); begin += kChunk)
    m = std::max(m, noise_of_chunk(flat, begin, std::min(kChunk, flat.numel() - begin), dtype));
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

// max |a - g| per index of `axis` (and per (head, position) when head_axis >= 0),
// fed a chunk at a time.
class Profiles {
 public:
  Profiles(const Shape& shape, std::int64_t axis, std::int64_t head_axis, std::vector<double>& by_position,
           std::vector<std::vector<double>>* by_head_position)
      : by_position_(by_position), by_head_position_(by_head_position) {
    n_pos_ = shape[static_cast<std::size_t>(axis)];
    inner_ = inner_of(shape, axis);
    by_position.assign(static_cast<std::size_t>(n_pos_), 0.0);
    if (by_head_position && head_axis >= 0) {
      n_heads_ = shape[static_cast<std::size_t>(head_axis)];
      head_inner_ = inner_of(shape, head_axis);
      by_head_position->assign(static_cast<std::size_t>(n_heads_),
                               std::vector<double>(static_cast<std::size_t>(n_pos_), 0.0));
    }
  }

  // elements [begin, begin + n) of a and g, a run at a time: a run is the
  // stretch over which the position (and the head) stays the same, so there
  // is one division per run, not two per element.
  void add(std::int64_t begin, std::int64_t n, const double* a, const double* g) {
    std::int64_t j = 0;
    while (j < n) {
      const std::int64_t i = begin + j;
      std::int64_t run = std::min(n - j, inner_ - i % inner_);
      if (n_heads_ > 0) run = std::min(run, head_inner_ - i % head_inner_);
      const double m = max_abs_diff(a + j, g + j, run);
      const auto pos = static_cast<std::size_t>((i / inner_) % n_pos_);
      raise(by_position_[pos], m);
      if (n_heads_ > 0) raise((*by_head_position_)[static_cast<std::size_t>((i / head_inner_) % n_heads_)][pos], m);
      j += run;
    }
  }

 private:
  static void raise(double& m, double e) { m = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(m, e); }
  static std::int64_t inner_of(const Shape& shape, std::int64_t ax) {
    std::int64_t n = 1;
    for (std::size_t i = static_cast<std::size_t>(ax) + 1; i < shape.size(); ++i) n *= shape[i];
    return n;
  }
  std::vector<double>& by_position_;
  std::vector<std::vector<double>>* by_head_position_;
  std::int64_t n_pos_ = 0, inner_ = 1, n_heads_ = 0, head_inner_ = 1;
};

// max |a - g| (NaN if any difference is NaN) and ||a - g|| / ||g||, fed a
// chunk at a time; each sum in kLanes partial sums (a loop of one running sum
// waits on every add).
struct ErrorFigures {
  double max = 0, diff2 = 0, g2 = 0;
  void add(std::int64_t n, const double* a, const double* g) {
    double mx[kLanes] = {}, d2[kLanes] = {}, gg[kLanes] = {};
    std::int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const double e = std::fabs(a[i + l] - g[i + l]);
        mx[l] = e > mx[l] ? e : mx[l];  // a NaN e leaves mx: the NaN shows in d2
        d2[l] += e * e;
        gg[l] += g[i + l] * g[i + l];
      }
    for (; i < n; ++i) {
      const double e = std::fabs(a[i] - g[i]);
      mx[0] = e > mx[0] ? e : mx[0];
      d2[0] += e * e;
      gg[0] += g[i] * g[i];
    }
    double chunk_d2 = 0;
    for (int l = 0; l < kLanes; ++l) {
      if (!std::isnan(max)) max = std::max(max, mx[l]);
      chunk_d2 += d2[l];
      g2 += gg[l];
    }
    if (std::isnan(chunk_d2)) max = std::numeric_limits<double>::quiet_NaN();  // e*e is NaN only for a NaN e
    diff2 += chunk_d2;
  }
  double normwise() const {
    return g2 > 0 ? std::sqrt(diff2 / g2) : (diff2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  }
};

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
  std::vector<const JudgedSide*> judged;  // compare_tensor has said why any other side is not here
  for (const auto& s : sides)
    if (s.tensor && s.tensor->defined() && s.tensor->shape() == cmp.shape) judged.push_back(&s);
  BaselineCheck b;
  b.k = k;
  b.floor = rounding_floor(golden, dtype);
  // first pass: the baseline's and each side's error against the golden
  ErrorFigures base_figures;
  std::vector<ErrorFigures> side_figures(judged.size());
  std::vector<const Tensor*> read{&golden, &baseline};
  for (const JudgedSide* s : judged) read.push_back(s->tensor);
  for_each_chunk(read, [&](std::int64_t, std::int64_t n, const std::vector<const double*>& ch) {
    base_figures.add(n, ch[1], ch[0]);
    for (std::size_t j = 0; j < judged.size(); ++j) side_figures[j].add(n, ch[2 + j], ch[0]);
  });
  b.baseline_err = base_figures.max;
  b.baseline_normwise = base_figures.normwise();
  b.bound = k * b.baseline_err + b.floor;
  const Tensor* shown = nullptr;
  for (std::size_t j = 0; j < judged.size(); ++j) {
    const ErrorFigures& f = side_figures[j];
    // NaN is the worst error of all
    const bool worse = j == 0 || std::isnan(f.max) || (!std::isnan(b.err) && f.max > b.err);
    if (worse) {
      b.side = judged[j]->label;
      b.err = f.max;
      b.normwise = f.normwise();
      shown = judged[j]->tensor;
    }
  }
  b.ratio = b.baseline_err > 0 ? b.err / b.baseline_err
            : b.err == 0       ? 1.0
                               : std::numeric_limits<double>::infinity();
  if (shown && shown->numel() == 0) shown = nullptr;  // nothing to show
  // second pass: the shown side's elements outside the bound, and the error profiles
  std::int64_t mismatched = 0;
  const ProfileAxes axes = profile_axes(level, cmp.name, cmp.shape);
  if (shown) {
    std::optional<Profiles> side_profile, base_profile;
    if (axes.axis >= 0) {
      b.position_axis = axes.name;
      side_profile.emplace(cmp.shape, axes.axis, axes.head_axis, b.err_by_position, &b.err_by_head_position);
      base_profile.emplace(cmp.shape, axes.axis, -1, b.baseline_by_position, nullptr);
    }
    const auto judge_chunk = [&](std::int64_t begin, std::int64_t n, const std::vector<const double*>& ch) {
      const double *g = ch[0], *v = ch[1], *base = ch[2];
      for (std::int64_t i = 0; i < n; ++i) mismatched += !(std::fabs(v[i] - g[i]) <= b.bound);  // NaN: past
      if (side_profile) {
        side_profile->add(begin, n, v, g);
        base_profile->add(begin, n, base, g);
      }
    };
    for_each_chunk({&golden, shown, &baseline}, judge_chunk);
  }
  cmp.mismatched = mismatched;
  cmp.allclose = shown && mismatched == 0;
  cmp.baseline = std::move(b);
}

}  // namespace headgrad::runner
