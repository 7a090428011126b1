// The shared inputs of a case: made ONCE, from the seed or from a reference
// directory, and handed with the same values to both sides.
//
//   CaseInputs in = make_inputs(c);   // ConfigError for a bad mask or reference file
//   in.x                              // [B, T, D], a strided view if input_layout asks
//
// Recipe from the seed (headgrad::Generator, the same stream on every machine),
// drawn in this order: mha level x ~ N(0, 1); wq, wk, wv, wo ~ N(0, 1/D) so
// the softmax is not saturated; r ~ N(0, 1). Core level q, k, v, r ~ N(0, 1).
//
// A reference directory holds plain .npy files (docs/design.md):
//   mha level:  x [B, T, D], wq wk wv wo [D, D], optional r [B, T, D] (ones if
//               absent); expected any of out, dx [B, T, D], dwq dwk dwv dwo [D, D]
//   core level: q [B, H, Tq, d], k [B, H, Tk, d], v [B, H, Tk, dv], optional
//               mask (bool, broadcastable to [B, H, Tq, Tk], True = attend),
//               optional r [B, H, Tq, dv]; expected any of out, dq, dk, dv
// Shapes and dtype come from the files; the case gives H (mha level) and causal.
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H;
// Tq/Tk query/key lengths, dv value width.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <headgrad/attention.hpp>
#include <headgrad/tensor.hpp>

#include "runner/suite.hpp"

namespace headgrad::runner {

struct NamedTensor {
  std::string name;  // "out", "dx", "dwq", ... (a reference file's stem)
  Tensor tensor;     // undefined when a side produced none (e.g. no gradient)
};
using TensorSet = std::vector<NamedTensor>;
const Tensor* find_tensor(const TensorSet& set, std::string_view name);  // nullptr if absent

struct CaseInputs {
  Level level = Level::mha;
  // mha level
  Tensor x;               // [B, T, D] as handed to the plugins (layout applied)
  Tensor wq, wk, wv, wo;  // [D, D], PyTorch's [out, in]: y = x W^T
  // core level
  Tensor q;               // [B, H, Tq, d] (layout applied, like x)
  Tensor k;               // [B, H, Tk, d]
  Tensor v;               // [B, H, Tk, dv]
  Tensor mask;            // bool, broadcastable to [B, H, Tq, Tk]; undefined: none
  // both
  Tensor r;               // out's shape: loss = sum(out * r)
  TensorSet expected;     // a reference case: the expected tensors `check` names
};

CaseInputs make_inputs(const CaseSpec& c);

// Reads the files a case names (mask file, reference directory) and checks
// them: ConfigError naming the missing file or the shape that does not fit.
// A reference case gets its dims and dtype from the files, its mask file from
// mask.npy if present, and its `check` narrowed to the expected files present.
void check_case_files(CaseSpec& c);

// The settings handed to the plugins: heads, causal, scale, mask; dropout 0.
AttentionSpec attention_spec(const CaseSpec& c, const CaseInputs& in);

// The inputs as a reference directory names them, contiguous:
// x, wq, wk, wv, wo, r (mha) or q, k, v, [mask,] r (core).
TensorSet input_tensors(const CaseInputs& in);

// The same values in another memory layout: transposed keeps the last two dims
// swapped in memory and hands back a transposed view; sliced places the values
// inside a wider NaN-filled tensor and hands back a narrowed view (a plugin
// that reads outside its view gets NaN).
Tensor with_layout(const Tensor& t, InputLayout layout);

}  // namespace headgrad::runner
