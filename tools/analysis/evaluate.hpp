// What a side with known bugs would give, and how close a side comes to it:
// the two measures every part of the diagnosis shares (catalog fits, relations,
// pairs, reference sides).
#pragma once

#include <utility>

#include "analysis/hypotheses.hpp"
#include "case/inputs.hpp"
#include "case/suite.hpp"

namespace headgrad::analysis {

// The tensors of the case's check list (and its taps) that a side with exactly
// `bugs` would produce on these inputs (none: the correct attention). A
// gradient whose input the hypothesis's graph never reaches is left undefined,
// as a plugin's would be.
runner::TensorSet hypothesis_tensors(const runner::CaseSpec& c, const runner::CaseInputs& in,
                                     const diagnosis::BugSet& bugs);

// max over the checked tensors of |a - b| / (atol + rtol |b|), b the predicted
// side, and the largest |a - b|. Infinite when a tensor is shaped differently,
// or present on one and missing on the other (a structural difference that no
// hypothesis "fits"), except a predicted gradient that is missing where the
// side's is all zeros.
std::pair<double, double> fit_ratio(const runner::TensorSet& side, const runner::TensorSet& predicted,
                                    const runner::CaseSpec& c);

}  // namespace headgrad::analysis
