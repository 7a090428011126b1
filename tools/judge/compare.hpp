// Tensor-by-tensor comparison of two sides, and where an element lives.
//
//   auto cmp = compare_sets(lhs, rhs, c, "per_head", "batched");
//   cmp[2].allclose, cmp[2].max_abs, cmp[2].worst->where   // "head=1, row=2, in=5"
//
// allclose as numpy/PyTorch: |a - b| <= atol + rtol * |b|, b being the
// reference side (the second plugin or the reference file). NaN never matches.
// The worst element is the one furthest outside its tolerance (largest
// |a - b| / (atol + rtol * |b|)); when all match, the one closest to failing.
//
// Elements are named in the tensor's own terms (d = D / H):
//   out, dx  [B, T, D]: "b=1, t=2, head=1, ch=3"  (ch: channel within the head)
//   dwq, dwk, dwv [D, D]: "head=1, row=2, in=5"   (row within the head's block)
//   dwo [D, D]: "out=3, head=1, col=2"            (col within the head's block)
//   core out, dq [B, H, Tq, d]: "b=0, h=2, q=4, ch=1"; dk, dv: "..., k=4, ..."
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "case/axes.hpp"
#include "case/inputs.hpp"
#include "case/suite.hpp"

namespace headgrad::runner {

// Under relative_to_baseline, a ratio (error / the oracle's own error in the
// dtype) up to this reads "as accurate as the oracle in this dtype": correct
// float32 implementations measure 1.00 .. 1.76 in configs/default.yaml (an
// online softmax rounds differently), the mutants 1.8e6 and more.
inline constexpr double kAsAccurateRatio = 2;


// One tensor judged by relative_to_baseline (suite.hpp): each side against
// the golden (the oracle in float64), bounded by the oracle's own error in
// the case's dtype. The profiles are max |side - golden| over every other dim,
// per position along the sequence axis (and per head where the tensor has
// heads); weight gradients have none.
struct BaselineCheck {
  double k = 0;
  double floor = 0;         // 2 * max|(g + 0.3 - 0.3) - g|, computed in the case's dtype
  double baseline_err = 0;  // max |baseline - golden|
  double bound = 0;         // k * baseline_err + floor
  std::string side;         // the side shown: the one with the larger error
  double err = 0;           // max |side - golden| (NaN if the side holds NaN)
  double ratio = 0;         // err / baseline_err (1 when both are 0, inf when only err is > 0)
  double normwise = 0;      // ||side - golden|| / ||golden|| (Frobenius)
  double baseline_normwise = 0;
  std::string position_axis;  // "t", "q" or "k"; empty: no position axis
  std::vector<double> err_by_position, baseline_by_position;  // [T]
  std::vector<std::vector<double>> err_by_head_position;      // [heads][T]; empty: no heads
};

struct TensorComparison {
  std::string name;
  Shape shape;
  Tolerance tolerance;
  double max_abs = 0;   // max |a - b| (NaN if any element is NaN on one side)
  double max_rel = 0;   // max |a - b| / |b| (inf where b = 0 and a != b)
  std::int64_t numel = 0;
  std::int64_t mismatched = 0;  // elements outside the tolerance
  bool allclose = true;
  std::optional<ElementRef> worst;
  std::string problem;  // set when the tensors cannot be compared (missing, shape, dtype)
  // Set under relative_to_baseline: then `allclose` and `mismatched` are its
  // verdict (elements of the shown side outside the bound), while max_abs,
  // max_rel and worst still compare the two sides with each other.
  std::optional<BaselineCheck> baseline;
};

TensorComparison compare_tensor(const std::string& name, const Tensor& lhs, const Tensor& rhs,
                                Tolerance tol, Level level, std::int64_t heads);

// Each tensor of c.check, lhs against rhs; the labels name the sides in problems.
std::vector<TensorComparison> compare_sets(const TensorSet& lhs, const TensorSet& rhs, const CaseSpec& c,
                                           const std::string& lhs_label, const std::string& rhs_label);

// The golden's own rounding noise in `dtype`: 2 * max|(g + 0.3 - 0.3) - g| with
// g rounded to dtype and the sum and difference computed in dtype (FlashAttention
// 3's floor; at float32 about 6e-8 for |g| < 0.2).
double rounding_floor(const Tensor& golden, DType dtype);

// A side of a relative_to_baseline judgement: its label and its tensor.
struct JudgedSide {
  std::string label;
  const Tensor* tensor = nullptr;
};
// Judges one tensor: cmp.baseline filled, cmp.allclose and cmp.mismatched set to
// the rule's verdict (every side within k * baseline_err + floor of the golden).
// A missing or misshapen golden, baseline or side leaves cmp failed with a problem.
void judge_by_baseline(TensorComparison& cmp, const std::vector<JudgedSide>& sides, const Tensor& golden,
                       const Tensor& baseline, double k, DType dtype, Level level);


}  // namespace headgrad::runner
