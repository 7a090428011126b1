// A case's data: the one module that reads the files a suite names (the suite
// itself, mask files, reference directories or .npz files), and the shared
// inputs of a case, made from those files or from the seed.
//
//   Suite s = load_suite("configs/default.yaml");  // each case's files read ONCE, here
//   CaseInputs in = make_inputs(s.cases[0]);       // no file is read again
//   in.x                                           // [B, T, D], a strided view if input_layout asks
//
// Recipe from the seed (headgrad::Generator, the same stream on every machine),
// drawn in this order: mha level x ~ N(0, 1); wq, wk, wv, wo ~ N(0, 1/D) so
// the softmax is not saturated; r ~ N(0, 1); then, with `bias: true` only
// (so a case without biases keeps its values), bq, bk, bv ~ N(0, 1/D) and
// bo ~ N(0, 1/(H*d)); then, with `qk_norm` only, the gains q_norm and k_norm:
// g = 1 + 0.5 N(0, 1) per dim (w = g, or w = g - 1 under one_plus_w), never
// uniform, since uniform gains hide a norm applied after RoPE; then, with
// `cross: true` only, x_kv ~ N(0, 1). Core level q, k, v, r ~ N(0, 1). Then, with
// `sinks: true` only (after every other input, so old cases keep their
// values), sinks ~ U(-1, 3) [H]: against N(0, 1) scores P_sink is 0.01 .. 0.97.
//
// A reference is a directory of plain .npy files, or one .npz file holding the
// same members (numpy.savez(path, x=..., wq=...)):
//   rope level: x [..., T, d] (any leading dims), optional r; expected out, dx
//   mha level:  x [B, T, D], wq wk wv wo [D, D], optional r [B, T, D] (ones if
//               absent); expected any of out, dx [B, T, D], dwq dwk dwv dwo [D, D];
//               optional biases bq [H*d], bk bv [Hkv*d], bo [D] (all four, or none;
//               present, the case has biases) and expected dbq, dbk, dbv, dbo;
//               with `qk_norm`: q_norm, k_norm ([d], or [H*d] and [Hkv*d]) and
//               expected dq_norm, dk_norm; with `cross: true`: x_kv [B, Tk, D]
//               and expected dx_kv (x, r, out, dx are [B, Tq, D])
//   core level: q [B, H, Tq, d], k [B, H, Tk, d], v [B, H, Tk, dv], optional
//               mask (bool, broadcastable to [B, H, Tq, Tk], True = attend),
//               optional r [B, H, Tq, dv]; expected any of out, dq, dk, dv
//   mha, core:  optional sinks [H] (present: the case has sinks) and expected dsinks [H]
// Shapes and dtype come from the files; the case gives H (mha level) and causal.
// An input with a zero-size dim, NaN or Inf, an expected tensor that is not
// finite, a mask that is not bool, a name that is a folder, fifo or dangling
// symlink, or a golden/ that disagrees with the expected tensors beyond the
// dtype's rounding, is a ConfigError naming the file (exit code 2). Only what
// the case uses is read, each shape checked from its header first (an .npz
// member is inflated only then).
//
// Shape legend: B batch, T sequence, D model width, H heads, d = D / H;
// Tq/Tk query/key lengths, dv value width.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <headgrad/attention.hpp>
#include <headgrad/tensor.hpp>

#include "case/suite.hpp"

namespace headgrad::runner {

struct NamedTensor {
  std::string name;  // "out", "dx", "dwq", ... (a reference file's stem)
  Tensor tensor;     // undefined when a side produced none (e.g. no gradient)
};
using TensorSet = std::vector<NamedTensor>;
const Tensor* find_tensor(const TensorSet& set, std::string_view name);  // nullptr if absent

// What a case's files hold, read once by load_case_files.
struct CaseFiles {
  TensorSet inputs;    // a reference's x, wq, wk, wv, wo | q, k, v; and r if present
  TensorSet expected;  // a reference's expected tensors that the case checks
  Tensor mask;         // bool, from `mask:` or the reference's mask; undefined: none
  Tensor positions;    // a reference's positions.npy (int64 read as float64), [T] or [B, T]
  // A reference directory's golden/ folder: float64 .npy of the expected
  // tensors' names, computed from the same inputs in float64 (the golden of
  // the relative_to_baseline rule); empty: none, the oracle computes it.
  TensorSet golden;
};

// Reads the suite, parses it (parse_suite), then each case's files (load_case_files).
Suite load_suite(const std::filesystem::path& file);

// Reads the files a case names (mask file, reference directory or .npz) once
// and keeps them in c.files. Checks them: ConfigError naming the missing file,
// the shape that does not fit, the bad value. A reference case gets its dims
// and dtype from the files, its mask from the reference's mask if present, and
// its `check` narrowed to the expected tensors present. Does nothing for a case
// that names no file, or whose files are already loaded.
void load_case_files(CaseSpec& c);
bool needs_files(const CaseSpec& c);

// .npy files (or .npz archives) this process has read for cases since it
// started: a statistic for tests (each file is read once per case).
std::size_t case_files_read();

struct CaseInputs {
  Level level = Level::mha;
  // mha level
  Tensor x;               // [B, T, D] as handed to the plugins (layout applied)
  Tensor wq, wk, wv, wo;  // [D, D], PyTorch's [out, in]: y = x W^T
  Tensor bq, bk, bv, bo;  // [H*d], [Hkv*d], [Hkv*d], [D]: y = x W^T + b; undefined: no bias
  Tensor q_norm, k_norm;  // QK-norm gains: [d] (axis head) or [H*d], [Hkv*d] (axis model); undefined: no QK-norm
  Tensor x_kv;            // cross-attention: [B, Tk, D], k and v projected from it (layout applied); undefined: self
  // core level
  Tensor q;               // [B, H, Tq, d] (layout applied, like x)
  Tensor k;               // [B, H, Tk, d]
  Tensor v;               // [B, H, Tk, dv]
  Tensor mask;            // bool, broadcastable to [B, H, Tq, Tk]; undefined: none
  // both
  Tensor r;               // out's shape: loss = sum(out * r)
  Tensor positions;       // RoPE token positions [T] or [B, T]; undefined: offset + t
  Tensor sinks;           // [H], one sink logit per query head (mha, core); undefined: none
  TensorSet expected;     // a reference case: the expected tensors `check` names
};

// Every input tensor of CaseInputs, once: what a copy, a cast or a listing of
// the inputs walks over (a new input is added here, and nowhere else).
enum class InputRole {
  activation,  // x, q, k, v: handed to plugins in the case's input_layout
  weight,      // wq, wk, wv, wo; the biases bq, bk, bv, bo
  loss,        // r
  mask,        // bool
  positions,   // int64 token positions
};
struct InputField {
  Tensor CaseInputs::*member;
  std::string_view name;  // the reference file's name (name.npy)
  InputRole role;
  Level level;            // the level whose plugins take it (r, positions: every level)
  bool every_level = false;
};
inline constexpr InputField kInputFields[] = {
    {&CaseInputs::x, "x", InputRole::activation, Level::mha, false},
    {&CaseInputs::wq, "wq", InputRole::weight, Level::mha},
    {&CaseInputs::wk, "wk", InputRole::weight, Level::mha},
    {&CaseInputs::wv, "wv", InputRole::weight, Level::mha},
    {&CaseInputs::wo, "wo", InputRole::weight, Level::mha},
    {&CaseInputs::bq, "bq", InputRole::weight, Level::mha},  // biases: defined only with `bias: true`
    {&CaseInputs::bk, "bk", InputRole::weight, Level::mha},
    {&CaseInputs::bv, "bv", InputRole::weight, Level::mha},
    {&CaseInputs::bo, "bo", InputRole::weight, Level::mha},
    {&CaseInputs::q_norm, "q_norm", InputRole::weight, Level::mha},  // with `qk_norm` only
    {&CaseInputs::k_norm, "k_norm", InputRole::weight, Level::mha},
    {&CaseInputs::x_kv, "x_kv", InputRole::activation, Level::mha},  // with `cross: true` only
    {&CaseInputs::q, "q", InputRole::activation, Level::core},
    {&CaseInputs::k, "k", InputRole::activation, Level::core},
    {&CaseInputs::v, "v", InputRole::activation, Level::core},
    {&CaseInputs::mask, "mask", InputRole::mask, Level::core},
    {&CaseInputs::r, "r", InputRole::loss, Level::mha, true},
    {&CaseInputs::positions, "positions", InputRole::positions, Level::mha, true},
    {&CaseInputs::sinks, "sinks", InputRole::weight, Level::mha, true},  // defined only with `sinks: true`
};

// A copy of `in` with each defined tensor replaced by f(field, tensor);
// `expected` is left out.
template <class F>
CaseInputs map_inputs(const CaseInputs& in, F&& f) {
  CaseInputs out;
  out.level = in.level;
  for (const InputField& field : kInputFields) {
    const Tensor& t = in.*field.member;
    out.*field.member = t.defined() ? f(field, t) : t;
  }
  return out;
}

// The seeded recipe above, contiguous, for dims d (mha: B, T, D; core: B, H,
// Tq, Tk, d). Also what `headgrad bench` times plugins on.
// qk_norm on: the gains q_norm, k_norm drawn after the biases; kv_length > 0
// (cross-attention): x_kv [B, kv_length, D] drawn after them; sinks [H] last.
CaseInputs seeded_inputs(Level level, const Dims& d, DType dtype, std::uint64_t seed, bool bias = false,
                         const QkNormSpec& qk_norm = {}, std::int64_t kv_length = 0, bool sinks = false);

// From c.files (loaded first if they are not) or from the seed; reads no file
// that load_case_files has read. ConfigError when a mask does not fit c.dims.
CaseInputs make_inputs(const CaseSpec& c);

// The same values in memory of this side's own: what one side does to its
// inputs cannot reach the other side (layout kept, `expected` left out).
CaseInputs private_copy(const CaseInputs& in, InputLayout layout);
// The same tensors, activations laid out as `layout` asks, nothing else
// copied: for a side whose memory is its own already (a forked child).
CaseInputs laid_out(const CaseInputs& in, InputLayout layout);

// The settings handed to the plugins: heads, causal, scale, mask, RoPE
// (c.rope with in.positions), window, softcap, sinks (in.sinks, as a constant:
// a side makes its own leaf to get dsinks); dropout 0.
AttentionSpec attention_spec(const CaseSpec& c, const CaseInputs& in);

// The inputs as a reference directory names them, contiguous:
// x, wq, wk, wv, wo, [bq, bk, bv, bo,] r (mha) or q, k, v, [mask,] r (core).
TensorSet input_tensors(const CaseInputs& in);

// The same values in another memory layout: transposed keeps the last two dims
// swapped in memory and hands back a transposed view; sliced places the values
// inside a wider NaN-filled tensor and hands back a narrowed view (a plugin
// that reads outside its view gets NaN).
Tensor with_layout(const Tensor& t, InputLayout layout);

}  // namespace headgrad::runner
