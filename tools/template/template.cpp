#include "template/template.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <system_error>

#include <boost/dll/runtime_symbol_info.hpp>

#include <headgrad/child_process.hpp>
#include <headgrad/npy.hpp>
#include <headgrad/tensor.hpp>

namespace fs = std::filesystem;

namespace headgrad::templates {

namespace {

constexpr int kExitOk = 0, kExitUsage = 2;

// ---------------------------------------------------------------- the files
// Placeholders: @NAME@ the plugin's name, @CLASS@ its class name.

constexpr std::string_view kMesonBuild = R"tmpl(# @NAME@: a headgrad attention plugin, built against an installed headgrad.
#   meson setup build && ninja -C build
# If Meson cannot find headgrad, point pkg-config at the installation:
#   PKG_CONFIG_PATH=<prefix>/lib/<triplet>/pkgconfig meson setup build
# or at a headgrad build tree (not installed): <build>/tools/template.
project('@NAME@', 'cpp',
  version : '0.1.0',
  default_options : ['cpp_std=c++20', 'buildtype=release', 'warning_level=2'])

headgrad_dep = dependency('headgrad')  # headgrad.pc: the plugin SDK headers and libheadgrad
boost_dep = dependency('boost')        # Boost.DLL's headers (header-only), used by HEADGRAD_PLUGIN

shared_module('@NAME@', '@NAME@.cpp',
  dependencies : [headgrad_dep, boost_dep],
  gnu_symbol_visibility : 'hidden',  # only the two symbols HEADGRAD_PLUGIN exports are public
  name_prefix : '',                  # @NAME@.so, not lib@NAME@.so
  # `meson install` puts it beside headgrad's own plugins, where headgrad
  # finds it without --plugin-path.
  install : true,
  install_dir : headgrad_dep.get_variable(pkgconfig : 'plugindir'))
)tmpl";

constexpr std::string_view kSource = R"tmpl(// @NAME@: multi-head attention as a headgrad plugin, built from headgrad's
// ops: project, split heads, attention core, merge heads, project. Every op
// records its own backward, so the gradients of x, Wq, Wk, Wv and Wo come for
// free (a fused kernel would use custom_op() with a hand-written backward).
//
// It starts correct: the same computation as headgrad's `batched` plugin.
// Change it where it says CHANGE HERE, then rebuild and run the suite:
//   ninja -C build && headgrad run suite.yaml --plugin-path build
//
// Shape legend: B batch, T sequence (Tq/Tk query/key lengths at the core
// level), D model width, H heads, d = D / H head width.
// Conventions (PyTorch's): W is [out, in] and y = x W^T; head h owns rows
// [h*d, (h+1)*d) of Wq, Wk, Wv and columns [h*d, (h+1)*d) of Wo.
#include <cmath>

#include <headgrad/plugin.hpp>

namespace {

using namespace headgrad;

class @CLASS@ final : public Attention {
 public:
  PluginInfo info() const override {
    PluginInfo i;
    i.name = "@NAME@";  // what suites write in `compare:`; unique among loaded plugins
    i.version = "0.1.0";
    i.description = "my attention, started from headgrad new-plugin";
    // Declare only what you implement: the runner checks a case's needs
    // against these before calling you, and names what is missing.
    Capabilities& c = i.capabilities;
    c.mha = true;            // mha_forward below
    c.core = true;           // core_forward below
    c.causal = true;         // spec.causal
    c.bool_mask = true;      // spec.mask (core level)
    c.cross_lengths = true;  // Tq != Tk (core level)
    c.float32 = c.float64 = true;
    // The features of current models, each checked by its section of
    // features.yaml once you implement it here and set it: c.window
    // (spec.window; attention_mask below already applies it), c.softcap
    // (spec.softcap), c.sinks (spec.sinks), c.qk_norm (spec.qk_norm, w.q_norm,
    // w.k_norm), c.cross_attention (spec.x_kv).
    return i;
  }

  // x [..., T, D] -> [..., T, D]
  Variable mha_forward(const Variable& x, const MhaWeights& w,
                       const AttentionSpec& spec) const override {
    if (spec.kv_heads() != spec.num_heads)
      throw UnsupportedError("@NAME@ does not implement grouped KV heads");
    const std::int64_t t = x.size(-2), dm = x.size(-1);
    const std::int64_t h = spec.num_heads, d = dm / h;
    const Variable x3 = reshape(x, {-1, t, dm});  // [B, T, D]; x may be a strided view
    const std::int64_t b = x3.size(0);

    // Projections, y = x W^T.  CHANGE HERE (e.g. one fused [3D, D] projection).
    const Variable q = linear(x3, w.wq);  // [B, T, D]
    const Variable k = linear(x3, w.wk);
    const Variable v = linear(x3, w.wv);

    // Split: [B, T, D] -> view [B, T, H, d] -> transpose -> [B, H, T, d].
    // !! Viewing [B, T, D] straight as [B, H, T, d] keeps every size and mixes
    // tokens with heads. !!
    const Variable qh = transpose(view(q, {b, t, h, d}), 1, 2);
    const Variable kh = transpose(view(k, {b, t, h, d}), 1, 2);
    const Variable vh = transpose(view(v, {b, t, h, d}), 1, 2);

    const Variable o = core_forward(qh, kh, vh, spec);  // [B, H, T, d]

    // Merge, the exact reverse of the split: transpose back to [B, T, H, d]
    // first, then reshape to [B, T, D] (reshape copies: the transpose is not
    // contiguous). CHANGE HERE with care.
    // !! reshape(o, {b, t, dm}) alone keeps every size and silently mixes tokens
    // with heads: the suite catches it. !!
    const Variable merged = reshape(transpose(o, 1, 2), {b, t, dm});

    // Output projection, then x's own leading dims.
    return reshape(linear(merged, w.wo), x.shape());
  }

  // q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] -> [..., Tq, dv]
  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    // Scores, scaled by 1/sqrt(d) unless the spec gives a scale.  CHANGE HERE
    // (your kernel: wrap it in custom_op() with its own backward).
    const Variable scores = scale(matmul(q, transpose(k, -2, -1)), spec.scale_for(q.size(-1)));  // [..., Tq, Tk]
    // The mask the spec asks for (True = attend): causal (query i sees keys
    // j <= i, top-left aligned when Tq != Tk), spec.mask, or both.
    Variable masked = scores;
    if (const Tensor attend = attention_mask(spec, q.size(-2), k.size(-2)); attend.defined())
      masked = masked_fill(scores, logical_not(attend), -INFINITY);
    // Softmax over the keys (the last dim); a row with every key masked gives
    // zeros, not NaN.
    return matmul(softmax(masked, -1), v);  // [..., Tq, dv]
  }
};

}  // namespace

// Exports the description of this build (a plain C function the loader
// checks before any C++ call: same compiler ABI, standard library, C++
// standard and SDK layout as headgrad) and the factory (a Boost.DLL alias).
HEADGRAD_PLUGIN(@CLASS@)
)tmpl";

constexpr std::string_view kSuite = R"tmpl(# @NAME@ against per_head, headgrad's slow and obvious oracle (a loop over
# heads with sliced weights), on identical weights: the output and the
# gradients of x, Wq, Wk, Wv, Wo. The shapes are where attention bugs cannot
# hide: H > 1, T > 1, B > 1, head width != model width, non-contiguous x.
#   headgrad run suite.yaml --plugin-path build
suite: @NAME@-vs-per_head
defaults:
  compare: [@NAME@, per_head]
  dtype: float64
  causal: true
  dropout_p: 0.0
  atol: 1.0e-8
  rtol: 1.0e-6
  seed: 0
cases:
  - name: closed-book
    shape: {B: 2, T: 3, D: 8, H: 2}
  - name: heads, lengths, batches
    sweep: {B: [1, 2], T: [1, 5, 17], H: [1, 2, 4], D: [24]}
  - name: not causal
    causal: false
    sweep: {B: [2], T: [4, 9], H: [1, 3], D: [12]}
  - name: non-contiguous input
    input_layout: transposed
    sweep: {B: [2], T: [5, 17], H: [2, 4], D: [24]}
  - name: sliced input
    input_layout: sliced
    shape: {B: 2, T: 7, D: 16, H: 4}
  - name: float32                   # judged relative to per_head's own float32 error
    dtype: float32
    shape: {B: 2, T: 9, D: 16, H: 4}
  - name: core level, Tq != Tk
    level: core
    causal: true
    shape: {B: 2, H: 3, Tq: 5, Tk: 7, d: 4}

  # Edge cases: realistic bugs that pass every case above show only here.
  - name: decode step, Tq = 1
    level: core
    shape: {B: 2, H: 2, Tq: 1, Tk: 7, d: 4}      # a bottom-right causal mask shows at Tq != Tk
  - name: more queries than keys
    level: core
    shape: {B: 2, H: 2, Tq: 6, Tk: 4, d: 4}
  # The boolean mask cases: keep them while info() declares c.bool_mask (a
  # plugin that ignores spec.mask passes everything else).
  - name: boolean mask, padding and holes
    level: core
    causal: false
    mask: masks/padding_B2_Tq5_Tk7.npy            # [B, 1, Tq, Tk] bool, True = attend
    shape: {B: 2, H: 3, Tq: 5, Tk: 7, d: 4}
  - name: a query row with every key masked
    level: core
    causal: false
    mask: masks/empty_row_B2_Tq4_Tk6.npy          # its output and gradients must be zeros
    shape: {B: 2, H: 2, Tq: 4, Tk: 6, d: 4}
  - name: large logits
    level: core
    scale: 2000                                   # scores past 709: exp overflows without the row max subtracted
    shape: {B: 2, H: 2, Tq: 4, Tk: 4, d: 4}
  - name: large logits, float32
    level: core
    dtype: float32
    atol: 1.0e-5
    rtol: 1.0e-4
    scale: 200                                    # past 88, float32's exp range
    shape: {B: 2, H: 2, Tq: 4, Tk: 4, d: 4}
)tmpl";

constexpr std::string_view kFeatures = R"tmpl(# @NAME@ against per_head on the features of current models, one section per
# capability: sliding windows (window), logit soft-capping (softcap), attention
# sinks (sinks), QK-norm (qk_norm) and cross-attention (cross_attention). Each
# section's cases need its capability in info() (and nothing the generated
# plugin lacks, except where a case says "also needs"); the runner refuses a
# run with a case a plugin cannot run, before running anything (exit 2, naming
# the case and the missing capability). So:
#   every feature declared:  headgrad run features.yaml --plugin-path build
#   some of them:            headgrad run features.yaml --plugin-path build --filter 'window*'
#                            (one --filter per run: the case names start with the section's key)
#   or delete the sections of the features you do not declare.
# The shapes are where each feature's bugs cannot hide: a window of W = 4 keys
# at T = 11 (T <= W + 1 hides an off-by-one), a decode step where the window's
# anchor shows, a cap of 0.75 so that scores reach 3-5 times the cap, sinks of
# U(-1, 3) with a fully masked row (all its mass on the sink) and with Tk past
# a fused kernel's key tile of 128, per-dim QK-norm
# gains at H > 1, cross-attention at Tq != Tk, not causal.
suite: @NAME@-features-vs-per_head
defaults:
  compare: [@NAME@, per_head]
  dtype: float64
  causal: true
  dropout_p: 0.0
  atol: 1.0e-8
  rtol: 1.0e-6
  seed: 0
cases:
  # ---- window: {left, right} (c.window). Key j is attended when
  # p_i - left <= j <= p_i + right, p_i = i (+ Tk - Tq under bottom_right);
  # a Mistral-style window of W keys is {left: W - 1, right: 0} with causal.
  - name: window, W = 4 keys
    window: {left: 3, right: 0}
    shape: {B: 2, T: 11, D: 24, H: 6}
  - name: window, decode step
    level: core
    causal: bottom_right                          # the last query sees the last key: the window's anchor shows
    window: {left: 3, right: 0}
    shape: {B: 2, H: 6, Tq: 3, Tk: 11, d: 8}
  - name: window, two-sided, not causal
    level: core
    causal: false
    window: {left: 2, right: 1}
    shape: {B: 2, H: 6, Tq: 12, Tk: 12, d: 8}
  - name: window, right bound only
    level: core
    causal: false
    window: {right: 1}                            # no left bound
    shape: {B: 2, H: 6, Tq: 10, Tk: 12, d: 8}

  # ---- softcap: C (c.softcap). s <- C tanh(s / C), after the scale and before
  # every mask (a masked key stays -inf).
  - name: softcap, scores at 3-5 C
    softcap: 0.75
    shape: {B: 2, T: 11, D: 24, H: 6}
  - name: softcap, not causal
    level: core
    causal: false
    softcap: 0.75
    shape: {B: 2, H: 6, Tq: 12, Tk: 12, d: 8}
  - name: softcap, a fully masked row
    level: core
    causal: false
    softcap: 0.75
    mask: masks/empty_row_B2_Tq4_Tk6.npy          # a cap applied after the mask leaks into this row
    shape: {B: 2, H: 6, Tq: 4, Tk: 6, d: 8}

  # ---- sinks: true (c.sinks). One logit per query head (input sinks [H], not
  # scaled, not capped), one more softmax column with no value; dsinks compared.
  - name: sinks
    sinks: true
    shape: {B: 2, T: 11, D: 24, H: 6}
  - name: sinks, a fully masked row
    level: core
    causal: false
    sinks: true
    mask: masks/empty_row_B2_Tq4_Tk6.npy          # all of that row's mass on the sink: out 0
    shape: {B: 2, H: 6, Tq: 4, Tk: 6, d: 8}
  - name: sinks, grouped kv heads                 # also needs c.grouped_kv: a sink indexed by kv head shows here
    level: core
    sinks: true
    shape: {B: 3, H: 6, Hkv: 2, Tq: 9, Tk: 9, d: 8}  # B apart from H and Hkv
  - name: sinks, keys past one kernel tile
    level: core
    causal: false
    sinks: true
    shape: {B: 2, H: 6, Tq: 5, Tk: 140, d: 8}     # Tk > 128: a sink added once per key tile shows

  # ---- qk_norm: {axis, eps, gain} (c.qk_norm, MHA level). RMSNorm of q and k
  # over d per head (axis: head) or over a token's whole projection (axis:
  # model), gain w or 1 + w; the gains q_norm, k_norm are compared too.
  - name: qk_norm, per head
    qk_norm: {axis: head, eps: 1.0e-6, gain: w}
    shape: {B: 2, T: 7, D: 24, H: 6}
  - name: qk_norm, whole projection, gain 1 + w
    qk_norm: {axis: model, eps: 1.0e-6, gain: one_plus_w}
    input_layout: transposed
    shape: {B: 2, T: 6, D: 24, H: 6}
  - name: qk_norm, with RoPE                      # also needs c.rope: the norm goes before the rotation
    qk_norm: {axis: head, eps: 1.0e-6, gain: w}
    rope: {theta: 500000.0, style: half}
    shape: {B: 2, T: 7, D: 24, H: 6}

  # ---- cross: true (c.cross_attention, MHA level). k and v from x_kv
  # [B, Tk, D] (dx_kv compared); not causal unless the case says so.
  - name: cross, Tq != Tk
    cross: true
    shape: {B: 2, Tq: 5, Tk: 9, D: 24, H: 6}
  - name: cross, more queries than keys
    cross: true
    input_layout: sliced
    shape: {B: 2, Tq: 9, Tk: 5, D: 24, H: 6}
)tmpl";

constexpr std::string_view kReadme = R"tmpl(# @NAME@

An attention plugin for headgrad, started from `headgrad new-plugin`. It
begins as a correct batched multi-head attention built from headgrad's ops;
change `@NAME@.cpp` where it says CHANGE HERE.

## Build

    meson setup build        # finds headgrad through pkg-config (headgrad.pc)
    ninja -C build           # -> build/@NAME@.so

If headgrad is installed under a prefix pkg-config does not search, add
`PKG_CONFIG_PATH=<prefix>/lib/<triplet>/pkgconfig` in front of `meson setup`;
for a headgrad build tree that was never installed,
`PKG_CONFIG_PATH=<build>/tools/template` (and run `<build>/tools/headgrad`).
`headgrad new-plugin` printed the right line for the headgrad that ran it.
A plain compiler works too:

    c++ -std=c++20 -O2 -shared -fPIC -fvisibility=hidden @NAME@.cpp -o @NAME@.so \
        $(pkg-config --cflags --libs headgrad)

## Check

    headgrad run suite.yaml --plugin-path build

compares @NAME@ with `per_head` (the oracle) on the output and on the
gradients of x, Wq, Wk, Wv, Wo, over several heads, sequence lengths, batch
sizes and non-contiguous inputs, and on the edge cases where realistic bugs
hide: a decode step (Tq = 1), more queries than keys, a boolean mask
(masks/*.npy, True = attend), a query row with every key masked, and logits
large enough that a softmax without the row max subtracted overflows. Exit
code 0: every case agrees; 1: a comparison failed (the report says which
tensor, batch, head and position, and names the bug when it is a known one).
`headgrad plugins --plugin-path build` shows what headgrad sees of the plugin.

## The features of current models

`features.yaml` checks sliding windows (`window`), logit soft-capping
(`softcap`), attention sinks (`sinks`), QK-norm (`qk_norm`) and
cross-attention (`cross_attention`), one section per capability, at the
shapes where their bugs show. The plugin as generated declares none of them:
implement one, set it in `info()`, and run its section (the case names start
with the section's key):

    headgrad run features.yaml --plugin-path build --filter 'window*'

With every feature declared, run the whole file. A case that needs a
capability the plugin does not declare is refused before anything runs (exit
2, naming the case and the capability), so filter, or delete the sections
you do not implement.

## Good to know

- `mha_forward` gets x `[..., T, D]` and weights in PyTorch's layout (`[out, in]`,
  y = x W^T); `core_forward` gets q, k, v `[..., T, d]` already split.
- Declare in `info()` only the capabilities you implement.
- Build it with the toolchain headgrad was built with (compiler, standard
  library and its settings such as `_GLIBCXX_USE_CXX11_ABI`, `-std=c++20`):
  C++ objects cross the boundary. After upgrading headgrad, rebuild it. A
  mismatch is reported, naming what differs, and the plugin is skipped.
- `meson install -C build` copies it beside headgrad's own plugins, where
  headgrad finds it without `--plugin-path`.
)tmpl";

constexpr std::string_view kKeywords[] = {
    "alignas",   "alignof",      "and",          "and_eq",    "asm",          "auto",
    "bitand",    "bitor",        "bool",         "break",     "case",         "catch",
    "char",      "char8_t",      "char16_t",     "char32_t",  "class",        "compl",
    "concept",   "const",        "consteval",    "constexpr", "constinit",    "const_cast",
    "continue",  "co_await",     "co_return",    "co_yield",  "decltype",     "default",
    "delete",    "do",           "double",       "dynamic_cast", "else",      "enum",
    "explicit",  "export",       "extern",       "false",     "float",        "for",
    "friend",    "goto",         "if",           "inline",    "int",          "long",
    "mutable",   "namespace",    "new",          "noexcept",  "not",          "not_eq",
    "nullptr",   "operator",     "or",           "or_eq",     "private",      "protected",
    "public",    "register",     "reinterpret_cast", "requires", "restrict",  "return",
    "short",     "signed",       "sizeof",       "static",    "static_assert", "static_cast",
    "struct",    "switch",       "template",     "this",      "thread_local", "throw",
    "true",      "try",          "typedef",      "typeid",    "typename",     "union",
    "unsigned",  "using",        "virtual",      "void",      "volatile",     "wchar_t",
    "while",     "xor",          "xor_eq",       "_Bool",     "_Complex",
};

// The plugins headgrad ships: a project with one of these names would clash
// with it (the loader keeps the first and skips the other).
constexpr std::array<std::string_view, 3> kBuiltinPlugins = {"per_head", "batched", "fused_sdpa"};

std::string replace_all(std::string_view text, std::string_view from, const std::string& to) {
  std::string out;
  std::size_t pos = 0;
  for (std::size_t hit; (hit = text.find(from, pos)) != std::string_view::npos; pos = hit + from.size()) {
    out.append(text.substr(pos, hit - pos));
    out.append(to);
  }
  out.append(text.substr(pos));
  return out;
}

std::string fill(std::string_view text, const std::string& name) {
  return replace_all(replace_all(text, "@NAME@", name), "@CLASS@", class_name_for(name));
}

// The suite's mask files, [B, 1, Tq, Tk] bool (True = attend), the same
// values as configs/masks/make_masks.py writes for headgrad's own suites.
// Batch item b pads its last b + 1 keys away; each query also skips the keys
// j with (i + j) % 4 == 3, never its last valid key.
Tensor padding_mask(std::int64_t b_n, std::int64_t tq, std::int64_t tk) {
  std::vector<double> v;
  for (std::int64_t b = 0; b < b_n; ++b) {
    const std::int64_t valid = tk - (b + 1);
    for (std::int64_t i = 0; i < tq; ++i)
      for (std::int64_t j = 0; j < tk; ++j) v.push_back(j < valid && ((i + j) % 4 != 3 || j == valid - 1));
  }
  return Tensor::from_values(v, {b_n, 1, tq, tk}, DType::boolean);
}

// Batch item b's query row (2b + 1) % Tq has every key masked; the other rows
// skip the keys j with (i + j) % 3 == 2, never all of them.
Tensor empty_row_mask(std::int64_t b_n, std::int64_t tq, std::int64_t tk) {
  std::vector<double> v;
  for (std::int64_t b = 0; b < b_n; ++b) {
    const std::int64_t empty = (2 * b + 1) % tq;
    for (std::int64_t i = 0; i < tq; ++i)
      for (std::int64_t j = 0; j < tk; ++j) v.push_back(i != empty && ((i + j) % 3 != 2 || j == 0));
  }
  return Tensor::from_values(v, {b_n, 1, tq, tk}, DType::boolean);
}

}  // namespace

bool is_c_identifier(std::string_view name) {
  if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_')) return false;
  if (!std::all_of(name.begin(), name.end(),
                   [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }))
    return false;
  return std::find(std::begin(kKeywords), std::end(kKeywords), name) == std::end(kKeywords);
}

std::string class_name_for(std::string_view name) {
  std::string out;
  bool upper = true;
  for (char c : name) {
    if (c == '_') {
      upper = true;
      continue;
    }
    out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "Plugin" + out;
  return out + "Attention";
}

SdkLocation sdk_for_program(const fs::path& exe) {
  SdkLocation sdk;
  std::error_code ec;
  const fs::path folder = fs::weakly_canonical(exe, ec).parent_path();
  if (ec || exe.empty()) return sdk;
#if defined(HEADGRAD_BUILD_TOOLS_DIR) && defined(HEADGRAD_UNINSTALLED_PKGCONFIG)
  // the program built in this build tree: its own headgrad.pc, and itself by path
  if (folder == fs::weakly_canonical(HEADGRAD_BUILD_TOOLS_DIR, ec) && !ec &&
      fs::is_regular_file(fs::path(HEADGRAD_UNINSTALLED_PKGCONFIG) / "headgrad.pc", ec)) {
    sdk.pkgconfig_dir = HEADGRAD_UNINSTALLED_PKGCONFIG;
    sdk.headgrad = (folder / exe.filename()).string();
    sdk.uninstalled = true;
    return sdk;
  }
#endif
#ifdef HEADGRAD_BIN_TO_PKGCONFIG
  // an installation: bin/headgrad -> <libdir>/pkgconfig/headgrad.pc
  const fs::path dir = fs::weakly_canonical(folder / HEADGRAD_BIN_TO_PKGCONFIG, ec);
  if (!ec && fs::is_regular_file(dir / "headgrad.pc", ec)) sdk.pkgconfig_dir = dir;
#endif
  return sdk;
}

// The longest NAME: it names NAME.cpp and libNAME.so, and a file name holds 255 bytes.
constexpr std::size_t kMaxNameLength = 200;

namespace {

// Every file of the project, written under `root`; returns the paths as they
// will be under `dir` once root is renamed to it.
std::vector<fs::path> write_project_files(const std::string& name, const fs::path& root, const fs::path& dir) {
  const std::vector<std::pair<std::string, std::string_view>> files = {
      {"meson.build", kMesonBuild}, {name + ".cpp", kSource}, {"suite.yaml", kSuite}, {"features.yaml", kFeatures},
      {"README.md", kReadme}};
  std::vector<fs::path> written;
  for (const auto& [file, text] : files) {
    const fs::path path = root / file;
    std::ofstream os(path, std::ios::binary);
    os << fill(text, name);
    os.close();
    if (!os) throw std::runtime_error("cannot write " + (dir / file).string());
    written.push_back(dir / file);
  }
  std::error_code ec;
  fs::create_directories(root / "masks", ec);
  if (ec) throw std::runtime_error("cannot create " + (dir / "masks").string() + ": " + ec.message());
  for (const auto& [file, mask] : {std::pair{"padding_B2_Tq5_Tk7.npy", padding_mask(2, 5, 7)},
                                   std::pair{"empty_row_B2_Tq4_Tk6.npy", empty_row_mask(2, 4, 6)}}) {
    write_npy(root / "masks" / file, mask);  // throws naming the file
    written.push_back(dir / "masks" / file);
  }
  return written;
}

}  // namespace

std::vector<fs::path> write_plugin_project(const std::string& name, const fs::path& dir) {
  if (!is_c_identifier(name))
    throw std::invalid_argument("NAME '" + name +
                                "' is not a valid C identifier (letters, digits and _, not starting with a "
                                "digit, not a C or C++ keyword): it names the plugin, its library and its source");
  if (name.size() > kMaxNameLength)
    throw std::invalid_argument("NAME is " + std::to_string(name.size()) + " characters long; at most " +
                                std::to_string(kMaxNameLength) + " (it names the files " + "NAME.cpp and libNAME.so)");
  if (std::find(kBuiltinPlugins.begin(), kBuiltinPlugins.end(), name) != kBuiltinPlugins.end())
    throw std::invalid_argument("NAME '" + name + "' is the name of a plugin headgrad ships; choose another");
  // mutant_* are headgrad's known-bug plugins: reports treat a plugin of that
  // prefix as a deliberate bug, and the loader would clash with the shipped one
  if (name.rfind("mutant_", 0) == 0)
    throw std::invalid_argument("NAME '" + name +
                                "' starts with mutant_, the prefix reserved for headgrad's known-bug plugins; "
                                "choose another");
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec))
      throw std::invalid_argument("DIR " + dir.string() + " exists and is not a folder");
    if (!fs::is_empty(dir, ec))
      throw std::invalid_argument("DIR " + dir.string() +
                                  " is not empty; give a new or empty folder (nothing is overwritten)");
  }
  // All or nothing: the project is written in a fresh folder beside DIR and
  // renamed into place at the end, so a failure leaves DIR as it was.
  const fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  fs::create_directories(parent, ec);
  if (ec) throw std::runtime_error("cannot create " + parent.string() + ": " + ec.message());
  const fs::path root = parent / ("." + dir.filename().string() + ".new-plugin." + std::to_string(::getpid()));
  fs::remove_all(root, ec);
  if (!fs::create_directory(root, ec) || ec)
    throw std::runtime_error("cannot create " + root.string() + ": " + (ec ? ec.message() : "it exists"));
  try {
    std::vector<fs::path> written = write_project_files(name, root, dir);
    fs::rename(root, dir, ec);  // rename(2) replaces an empty folder
    if (ec) throw std::runtime_error("cannot create " + dir.string() + ": " + ec.message());
    return written;
  } catch (...) {
    fs::remove_all(root, ec);
    throw;
  }
}

int run_new_plugin(const std::string& name, const fs::path& dir, std::ostream& out, std::ostream& err) {
  std::vector<fs::path> written;
  try {
    written = write_plugin_project(name, dir);
  } catch (const InternalError&) {  // headgrad's own failures: main's exit code 4, as every subcommand's
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    err << "headgrad: error: " << e.what() << "\n";
    return kExitUsage;
  }
  out << "wrote " << dir.string() << ":";
  for (const auto& f : written) out << " " << f.lexically_relative(dir).string();
  out << "\n";
  boost::dll::fs::error_code bec;
  const fs::path exe = boost::dll::program_location(bec).string();
  const SdkLocation sdk = bec ? SdkLocation{} : sdk_for_program(exe);
  if (sdk.uninstalled)
    out << "this headgrad is an uninstalled build (" << sdk.headgrad
        << "): the steps below build the plugin against it, not against an installed headgrad\n";
  out << "next:\n  cd " << dir.string() << "\n";
  if (!sdk.pkgconfig_dir.empty())
    out << "  export PKG_CONFIG_PATH=" << sdk.pkgconfig_dir.string() << "${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}\n";
  out << "  meson setup build && ninja -C build\n"
      << "  " << sdk.headgrad << " run suite.yaml --plugin-path build\n"
      << "then change " << name << ".cpp where it says CHANGE HERE.\n"
      << "features.yaml checks window, softcap, sinks, qk_norm and cross_attention, one section each: once "
      << name << ".cpp implements and declares one, run its section, e.g.\n"
      << "  " << sdk.headgrad << " run features.yaml --plugin-path build --filter 'window*'\n";
  return kExitOk;
}

void add_new_plugin_command(CLI::App& app, int& exit_code) {
  struct Args {
    std::string name, dir;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "new-plugin",
      "Write a ready-to-build plugin project in DIR: meson.build (dependency('headgrad')), NAME.cpp (a correct "
      "batched attention from core ops, the places to change marked CHANGE HERE), suite.yaml (NAME against "
      "per_head, with the edge cases where bugs hide), features.yaml (one section per feature of current models: "
      "window, softcap, sinks, qk_norm, cross_attention), masks/ and README.md; then print the commands that build "
      "and run it (against this build of headgrad when it runs uninstalled, from a build tree).");
  cmd->add_option("name", args->name, "the plugin's name: a C identifier (also its library and source name)")
      ->required()
      ->type_name("NAME");
  cmd->add_option("dir", args->dir, "the project folder to create (new, or empty)")->required()->type_name("DIR");
  cmd->footer("Exit codes: 0 the project was written; 2 NAME is not a C identifier, or DIR is not empty or cannot "
              "be written.");
  cmd->callback([args, &exit_code] { exit_code = run_new_plugin(args->name, args->dir, std::cout, std::cerr); });
}

}  // namespace headgrad::templates
