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

#include "runner/inputs.hpp"
#include "runner/suite.hpp"

namespace headgrad::runner {

struct ElementRef {
  Shape index;        // row-major index into the tensor
  std::string where;  // the index in the tensor's terms
  double lhs = 0, rhs = 0;
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
};

// `heads` is H (mha level; used to name head blocks; Hkv for dwk and dwv), ignored at core level.
std::string describe_index(Level level, std::string_view tensor, const Shape& shape,
                           std::span<const std::int64_t> index, std::int64_t heads);

TensorComparison compare_tensor(const std::string& name, const Tensor& lhs, const Tensor& rhs,
                                Tolerance tol, Level level, std::int64_t heads);

// Each tensor of c.check, lhs against rhs; the labels name the sides in problems.
std::vector<TensorComparison> compare_sets(const TensorSet& lhs, const TensorSet& rhs, const CaseSpec& c,
                                           const std::string& lhs_label, const std::string& rhs_label);

// The first NaN or Inf of `t` in row-major order, if any (lhs holds its value).
std::optional<ElementRef> first_non_finite(const Tensor& t, Level level, std::string_view name,
                                           std::int64_t heads);

}  // namespace headgrad::runner
