// The diagnosis outside the catalog: when no catalog bug reproduces a failing
// side, what the evidence still shows (runner::Finding):
//
//   - which computation is wrong, from which tensors differ and which match
//     (out, dx, dwq, dwk, dwv, dwo follow the MHA block's data flow: dwq rests
//     on dQ, dwk on dK, dwv on dV, dwo on the merged heads);
//   - by what exact relation: the correct attention re-run with one thing
//     changed reproduces the side (a gradient scaled by a factor matched to the
//     shape's expressions, heads permuted, a weight transposed, two inputs
//     exchanged, a shift or reversal along T), or a measured fact (only one
//     head differs, every output row is the right one times its softmax
//     denominator, one tensor is an exact multiple of the right one);
//   - two bugs at once (catalog x catalog, catalog x relation), named only
//     when the pair reproduces the side and neither member alone does;
//   - a gradient the side did not return at all.
//
// A relation or pair is kept only when it reproduces the side within the
// case's tolerance at the failing shape and at every localization variant
// where it applies (the same rule as a catalog hypothesis).
//
// Shape legend: B batch, T sequence, D model width, H heads, Hkv kv heads,
// G = H / Hkv, d head width; Tq/Tk query/key lengths.
#pragma once

#include <string>
#include <vector>

#include "case/findings.hpp"
#include "case/inputs.hpp"
#include "judge/run_case.hpp"

namespace headgrad::analysis {

// One localization variant as run (its sides' tensors and inputs kept).
struct VariantEvidence {
  std::string change;  // "B = 1"
  const runner::CaseSpec* spec = nullptr;
  const runner::CaseResult* result = nullptr;
  const runner::CaseInputs* inputs = nullptr;
};

// Fills dx.findings for the sides that the correct attention does not
// reproduce (dx.fits is empty: no catalog bug did). Relations and pairs that
// fit the failing shape but not a variant go to dx.ruled_out.
void find_outside_catalog(runner::Diagnosis& dx, const runner::CaseResult& failed, const runner::CaseInputs& in,
                          const std::vector<VariantEvidence>& variants);

}  // namespace headgrad::analysis
