// Bug hypotheses: a reference attention with exactly one known bug injected.
// Diagnosis runs each hypothesis on the failing case's inputs and keeps those
// that reproduce the failing plugin's output and gradients.
//
// Written per head (a loop over heads with sliced weights), independently of
// the mutant plugins, which are batched: a hypothesis matching a mutant is
// two implementations agreeing, not one file agreeing with itself.
//
// With spec.rope on, every hypothesis rotates q and k per head (after the
// split, with the engine's op) and fills spec.rope_taps when set; the RoPE
// bugs change that rotation (a swapped pairing is the correct attention re-run
// with Wq and Wk rows permuted between the pairings).
//
// Shape legend: B batch, T sequence, D model width, H (query) heads, Hkv kv
// heads, G = H / Hkv, d head width (D / H unless the spec gives it), r rotary width.
#pragma once

#include <bitset>
#include <cstdint>
#include <optional>
#include <vector>

#include <headgrad/attention.hpp>

#include "analysis/catalog.hpp"

namespace headgrad::diagnosis {

// The bugs a hypothesis injects at once: none (the correct computation), one
// catalog entry, or two (the diagnosis of two bugs at once tries pairs).
class BugSet {
 public:
  BugSet() = default;
  BugSet(std::optional<Bug> bug) { if (bug) add(*bug); }  // NOLINT: one bug or none reads as a set
  BugSet(Bug bug) { add(bug); }                           // NOLINT
  BugSet(std::nullopt_t) {}                               // NOLINT: no bug
  BugSet& add(Bug bug) {
    bits_.set(static_cast<std::size_t>(bug));
    return *this;
  }
  bool has(Bug bug) const { return bits_.test(static_cast<std::size_t>(bug)); }
  bool empty() const { return bits_.none(); }
  std::vector<Bug> bugs() const {
    std::vector<Bug> out;
    for (unsigned i = 0; i < static_cast<unsigned>(Bug::count_); ++i)
      if (has(static_cast<Bug>(i))) out.push_back(static_cast<Bug>(i));
    return out;
  }

 private:
  std::bitset<static_cast<std::size_t>(Bug::count_)> bits_;  // one bit per catalog bug, however many
};

// x [..., T, D] -> [..., T, D]; `bug` empty = the correct computation.
Variable hypothesis_mha(const Variable& x, const MhaWeights& w, const AttentionSpec& spec,
                        BugSet bug);

// q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] -> [..., Tq, dv]. Bugs that
// live in the projections or the head layout have no core-level form: for
// those this throws std::invalid_argument (check bug_info(bug).visibility.mha_only).
// The mask (causal and spec.mask) is built element by element from the
// definitions in docs/design.md, not with the engine's attention_mask.
Variable hypothesis_core(const Variable& q, const Variable& k, const Variable& v,
                         const AttentionSpec& spec, BugSet bug);

// The mask a hypothesis with `bug` applies to [.., Tq, Tk] scores (True =
// attend; undefined when nothing is masked), built element by element from
// docs/design.md's definitions of causal (top-left, bottom-right) and of a mask.
Tensor hypothesis_mask(const AttentionSpec& spec, std::int64_t tq, std::int64_t tk, BugSet bug);

// ---- re-runs under a permutation of heads ----

// The tile permutation of query heads: entry h' = g*Hkv + j is query head
// j*G + g. Given Wq's row blocks and Wo's column blocks in this order, a
// plugin that maps query head h' to kv head h' mod Hkv (kv_map_tile) reads kv
// head j for the weights of head j*G + g, which the correct mapping (h / G)
// gives it too: the tiled plugin then computes the correct attention, and any
// other plugin does not (unless G = 1 or Hkv = 1, where tile and repeat agree).
std::vector<std::int64_t> tile_to_repeat_heads(std::int64_t heads, std::int64_t kv_heads);

// w with its blocks of `block` rows (dim 0) or columns (dim 1) reordered:
// block i of the result is block order[i] of w.
Tensor reorder_blocks(const Tensor& w, std::int64_t dim, std::int64_t block,
                      const std::vector<std::int64_t>& order);
// x [..., T, d] -> [..., T, d]: the rotation alone (the rope level), rotated as
// `bug` rotates (spec.enabled is not read). Bugs without a rope-level form
// (has_rope_level_form: every bug outside RoPE, and those that live between q,
// k and v) throw std::invalid_argument.
Variable hypothesis_rope(const Variable& x, const RopeSpec& spec, BugSet bug);

}  // namespace headgrad::diagnosis
