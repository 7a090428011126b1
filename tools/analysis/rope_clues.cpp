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

// What tells RoPE bugs apart, read off the failing case itself (it holds also
// when no hypothesis fits, e.g. a user's own wrong kernel): which tensors stay
// exact, whether the error grows with the absolute position, and whether the
// pass-through dims of the taps are bitwise equal.
std::vector<std::string> rope_clues(const CaseResult& failed, const CaseInputs& in) {
  std::vector<std::string> out;
  const CaseSpec& c = failed.spec;
  if (!c.rope) return out;
  // exact: 1, differs: 0, not compared: -1
  auto state = [&](const std::string& name) {
    for (const auto& t : failed.tensors)
      if (t.name == name && t.problem.empty()) return t.allclose ? 1 : 0;
    return -1;
  };
  const bool mha = c.level == Level::mha, core = c.level == Level::core;
  struct Signature {
    std::vector<std::string> same, differ;
    std::string text;
  };
  const Signature sig = mha    ? Signature{{"out", "dwv", "dwo"}, {"dx", "dwq", "dwk"}, "= X X X = = over out, dx, dwq, dwk, dwv, dwo"}
                        : core ? Signature{{"out", "dv"}, {"dq", "dk"}, "= X X = over out, dq, dk, dv"}
                               : Signature{{"out"}, {"dx"}, "= X over out, dx"};
  if (std::all_of(sig.same.begin(), sig.same.end(), [&](const std::string& n) { return state(n) == 1; }) &&
      std::all_of(sig.differ.begin(), sig.differ.end(), [&](const std::string& n) { return state(n) == 0; }))
    out.push_back("Signature " + sig.text +
                  ": the forward is exact and only the gradients through the rotation differ, the mark of a RoPE "
                  "backward that is not R^T.");

  // The error per batch row against the row's positions: scores see position
  // differences only, so a row-to-row growth at the same tokens is absolute.
  const Tensor* a = find_tensor(failed.lhs, "out");
  const Tensor* b = find_tensor(failed.rhs, "out");
  const Tensor& pos = in.positions;
  const std::int64_t tokens = core ? c.dims.Tq : c.dims.T;
  if (state("out") == 0 && a && b && a->defined() && b->defined() && a->shape() == b->shape() && pos.defined() && pos.dim() == 2 &&
      pos.size(0) == a->size(0) && pos.size(0) > 1 && pos.size(1) == tokens && (!core || c.dims.Tq == c.dims.Tk)) {
    const std::vector<double> err = slot_max(*a, *b, 0, 0);  // per batch row
    const auto p = pos.contiguous().to_vector();
    std::vector<double> mean(err.size(), 0.0);
    for (std::size_t i = 0; i < p.size(); ++i) mean[i / static_cast<std::size_t>(tokens)] += p[i] / static_cast<double>(tokens);
    const std::size_t near = static_cast<std::size_t>(std::min_element(mean.begin(), mean.end()) - mean.begin());
    const std::size_t far = static_cast<std::size_t>(std::max_element(mean.begin(), mean.end()) - mean.begin());
    if (mean[far] - mean[near] >= 100 && err[far] > 10 * err[near])
      out.push_back("The error grows with the absolute position: batch row " + std::to_string(far) + " (positions about " +
                    fmt_g(mean[far]) + ") errs by " + fmt_g(err[far]) + ", row " + std::to_string(near) + " (about " +
                    fmt_g(mean[near]) + ") by " + fmt_g(err[near]) +
                    ", which no position difference explains: angle tables built below the compute precision "
                    "(float32 cos/sin).");
  }

  // Partial rotary: dims [r, d) of the taps (at the rope level: of out, against x)
  // must pass through bitwise.
  std::vector<std::pair<std::string, std::pair<const Tensor*, const Tensor*>>> pass;
  for (const auto& tap : c.taps) pass.push_back({tap, {find_tensor(failed.lhs, tap), find_tensor(failed.rhs, tap)}});
  if (c.level == Level::rope) {
    pass.push_back({failed.lhs_label + "'s out", {find_tensor(failed.lhs, "out"), &in.x}});
    if (!c.is_reference()) pass.push_back({failed.rhs_label + "'s out", {find_tensor(failed.rhs, "out"), &in.x}});
  }
  for (const auto& [tap, tensors] : pass) {
    const Tensor* ta = tensors.first;
    const Tensor* tb = tensors.second;
    if (!ta || !tb || !ta->defined() || !tb->defined() || ta->shape() != tb->shape() || ta->dim() < 1) continue;
    const std::int64_t d = ta->size(-1), r = c.rope->rotary_dim > 0 ? c.rope->rotary_dim : d;
    if (r >= d) continue;
    const auto va = ta->contiguous().to_vector(), vb = tb->contiguous().to_vector();
    std::int64_t differing = 0;
    for (std::size_t i = 0; i < va.size(); ++i)
      if (static_cast<std::int64_t>(i) % d >= r && va[i] != vb[i]) ++differing;
    if (differing > 0)
      out.push_back("The pass-through dims [" + std::to_string(r) + ", " + std::to_string(d) + ") of " + tap + " differ in " +
                    std::to_string(differing) + " elements (they must pass through unchanged, bitwise): partial rotary on "
                    "the wrong span.");
  }
  return out;
}

}  // namespace headgrad::analysis
