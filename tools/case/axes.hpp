// What each dim of a compared tensor means: the one table that the worst-index
// text, first_non_finite, the error maps, the golden's profiles and the
// analysis's where-lines read (instead of each comparing tensor names).
//
// Shape legend: B batch, T tokens (Tq queries, Tk keys), D model width,
// H query heads, Hkv kv heads, d head width.
//   mha   out, dx [B, T, D]       b, t, D packing H heads of d (head, ch)
//         dwq [H*d, D], dwk, dwv [Hkv*d, D]   rows packing heads (head, row), in
//         dwo [D, H*d]            out, columns packing heads (head, col)
//         dbq [H*d], dbk, dbv [Hkv*d]   packing heads as their weights' rows (head, row)
//         dbo [D]                 out (output features: no head owns one)
//         dx_kv [B, Tk, D]        b, k (x_kv's tokens), D packing H heads of d (head, ch)
//         dq_norm, dk_norm        [d] under qk_norm axis head: ch (one gain for every head);
//                                 [H*d], [Hkv*d] under axis model: packing heads (head, ch)
//         q_rot [B, H, T, d], k_rot [B, Hkv, T, d]   b, h, t, ch
//   both  dsinks [H]              head (one sink logit per query head)
//   core  out, dq [B, H, Tq, d]   b, h, q, ch;  dk, dv, k_rot [B, Hkv, Tk, d]: b, h, k, ch
//         (3-D and other ranks: leading dims i0, i1, .. then the position and ch)
//   rope  out, dx [.., T, d]      b, h (4-D), t, ch
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <headgrad/tensor.hpp>

#include "case/suite.hpp"

namespace headgrad::runner {

enum class AxisRole {
  batch,     // b
  head,      // h: one head per index
  position,  // t, q or k: a token axis
  channel,   // ch: within a head (or the last dim of anything else)
  heads,     // a dim that packs head blocks of `block` entries: head = i / block
  features,  // a weight's input or output features: in, out
  leading,   // any other leading dim: i0, i1, ..
};

struct Axis {
  AxisRole role;
  std::string key;          // how an index names it: "b", "t", "ch", "in"; for `heads`, the name within a block
  std::int64_t block = 0;   // `heads` only: the head width d
};

struct TensorAxes {
  std::vector<Axis> dims;   // one per dim of the tensor; empty when the shape is not the level's
  // The first dim with that role, if any (`heads` counts for head).
  std::optional<std::size_t> find(AxisRole role) const;
  // The dim that holds heads and the width of one head along it (1 for a head dim).
  std::optional<std::pair<std::size_t, std::int64_t>> head_dim() const;
};

// `heads` is the number of head blocks this tensor holds (H; Hkv for dwk, dwv,
// dbk, dbv and k_rot: head_blocks gives it from a case); unused at the core and rope levels.
TensorAxes axes_of(Level level, std::string_view tensor, const Shape& shape, std::int64_t heads);
// H, or Hkv for the tensors with one block per kv head (dk_norm under axis
// model too); 0 for dq_norm, dk_norm under axis head (one [d] gain, no head).
std::int64_t head_blocks(const CaseSpec& c, std::string_view tensor);

// An index in the tensor's terms: "b=1, t=2, head=1, ch=2"; the plain index
// ("[1, 2]") where the shape is not the level's.
std::string describe_index(Level level, std::string_view tensor, const Shape& shape,
                           std::span<const std::int64_t> index, std::int64_t heads);

struct ElementRef {
  Shape index;        // row-major index into the tensor
  std::string where;  // the index in the tensor's terms
  double lhs = 0, rhs = 0;
};

// The first NaN or Inf of `t` in row-major order, if any (lhs holds its value).
std::optional<ElementRef> first_non_finite(const Tensor& t, Level level, std::string_view name,
                                           std::int64_t heads);

}  // namespace headgrad::runner
