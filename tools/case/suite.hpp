// Suites: the YAML file a user writes, parsed and validated into cases. This
// file reads no file: load_suite (inputs.hpp) reads the suite and the files
// its cases name.
//
//   Suite s = parse_suite(text, "configs/default.yaml");  // throws ConfigError (exit 2)
//   check_capabilities(cases, registry);                   // once plugins are loaded
//   for (const CaseSpec& c : s.cases) ...                  // defaults applied, sweeps expanded
//
// Every ConfigError message starts with FILE:LINE:COL: (1-based, from
// yaml-cpp's marks) and says what was expected. The keys are the contract of
// docs/design.md; `timeout` (seconds per plugin run) and `description` are extras.
//
// Shape legend: B batch, T sequence, D model width, H (query) heads, Hkv
// key/value heads (default H; 1 = MQA; query head h reads kv head h / (H / Hkv)),
// d head width (default D / H at mha level); at core level Tq/Tk query/key
// lengths and d the head width.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <headgrad/attention.hpp>
#include <headgrad/loader.hpp>
#include <headgrad/tensor.hpp>

#include "pyplug/python_plugin.hpp"

namespace headgrad::runner {

struct SourceLoc {
  std::string file;
  int line = 0;  // 1-based; 0 = unknown
  int column = 0;
  std::string str() const;  // "suite.yaml:3:5" (or "suite.yaml" when unknown)
};

// Bad suite, bad input file, bad capability: the user's to fix (exit 2).
class ConfigError : public std::invalid_argument {
 public:
  ConfigError(const SourceLoc& where, const std::string& problem)
      : std::invalid_argument(where.str() + ": " + problem) {}
};

// rope: the RoPE rotation alone, x [..., T, d] with positions -> out, dx.
enum class Level { mha, core, rope };
enum class InputLayout { contiguous, transposed, sliced };

std::string_view level_name(Level level);           // "mha", "core", "rope"
std::string_view layout_name(InputLayout layout);   // "contiguous", ...

// allclose: |a - b| <= atol + rtol * |b|, b being the reference side.
struct Tolerance {
  double atol = 1e-8;
  double rtol = 1e-6;
};

// How a case's tensors are judged (docs/design.md, "Tolerance"):
//   allclose              |a - b| <= atol + rtol * |b|, element by element
//   relative_to_baseline  below float64, per tensor, every side against the golden
//                         (the oracle in float64): max|side - golden| <= k * max|baseline - golden| + floor,
//                         the baseline being the oracle in the case's dtype and the floor the
//                         golden's own rounding noise in that dtype
// automatic: relative_to_baseline below float64 unless atol or rtol is set on the
// case itself; allclose in float64.
enum class ToleranceRule { automatic, allclose, relative_to_baseline };

// The factors k of relative_to_baseline: `out` for forward tensors (out and the
// taps), `grads` for gradients, a tensor's own entry before either.
struct BaselineFactors {
  double out = 2;
  double grads = 3;
  std::map<std::string, double> tensor;
  double k_for(const std::string& name) const;
};

// The sizes of one case. mha: B, T, D, H, optional Hkv and d (Wq [H*d, D],
// Wk and Wv [Hkv*d, D], Wo [D, H*d]). core: B, H, optional Hkv, Tq, Tk, d.
// rope: B, T, d and optionally H (x [B, H, T, d], else [B, T, d]).
// 0 = not given: a reference case takes it from its files; Hkv 0 means H and
// an mha-level d 0 means D / H.
struct Dims {
  std::int64_t B = 0, T = 0, D = 0, H = 0, Tq = 0, Tk = 0, d = 0, Hkv = 0;

  std::int64_t* find(std::string_view name);  // nullptr for an unknown name
  std::int64_t get(std::string_view name) const;
  std::int64_t head_dim() const { return d > 0 ? d : (H > 0 ? D / H : 0); }
  std::int64_t kv_heads() const { return Hkv > 0 ? Hkv : H; }
};
// The dims a level's `shape:` needs, in display order.
const std::vector<std::string>& dim_names(Level level);
// The dims a level's `shape:` may add: mha Hkv and d, core Hkv.
const std::vector<std::string>& optional_dim_names(Level level);

struct CaseFiles;  // what a case's files hold (inputs.hpp)

// A case's `rope:` block: q and k rotated per head (docs/design.md). Token
// positions are one of: an offset (p_t = offset + t, the default 0), an
// explicit list (one row [T] shared by the batch, or B rows [B, T]), or a
// generator over [B, T] where row b begins at b * start:
//   gapped    steps 1, 2, 3, 1, 2, 3, ... (b*start, +1, +3, +6, +7, ...)
//   reversed  b*start + T-1, ..., b*start + 1, b*start
// At core level queries sit at q_offset + p_t, keys at p_t.
struct RopeCase {
  double theta = 10000.0;
  RopeStyle style = RopeStyle::interleaved;
  std::int64_t rotary_dim = 0;                  // r; 0 = the head width
  std::int64_t offset = 0;
  std::vector<std::vector<std::int64_t>> rows;  // explicit positions; empty: none
  bool per_row = false;                         // rows were written [[...], ...]: one per batch row
  std::string generator;                        // "gapped" | "reversed"; empty: none
  std::int64_t start = 1000;                    // a generator's per-row step
  std::int64_t q_offset = 0;
  SourceLoc positions_at, rotary_dim_at, q_offset_at;  // for errors found once dims are known
  // "rope=half/r6" ("/r" only when r is given; then ",gapped", ",q_offset=3")
  std::string describe() const;
};
// The positions a case's rope block gives at dims (b, t), with their shape
// ([T] or [B, T]); empty values for offset positions (p_t = offset + t).
std::vector<std::int64_t> rope_positions(const RopeCase& r, std::int64_t b, std::int64_t t, Shape& shape);
// Every position the block gives at these dims (queries at q_offset + p
// included) must be exact in float64: empty when they are, else the problem,
// naming the largest. Dims not known yet (0) are skipped.
std::string rope_position_problem(const RopeCase& r, Level level, const Dims& d);
// The largest exact position: 2^53.
inline constexpr std::int64_t kMaxRopePosition = std::int64_t{1} << 53;

struct CaseSpec {
  std::string name;       // "layouts[B=2,T=5,H=4]" for a point of a sweep
  std::string base_name;  // "layouts"
  std::vector<std::pair<std::string, std::int64_t>> sweep_point;  // empty outside sweeps
  SourceLoc source;                             // the case's entry under `cases:`
  std::map<std::string, SourceLoc> key_source;  // where each key's value was written

  std::vector<std::string> compare;    // one plugin (with `reference`) or two
  std::filesystem::path reference;     // resolved against the suite's folder; empty: none
  std::string reference_text;          // as written in the suite, for reports
  Level level = Level::mha;
  Dims dims;
  DType dtype = DType::float64;
  bool dtype_on_case = false;          // `dtype` written on the case itself (a reference's files must agree)
  bool causal = false;
  CausalAlignment causal_alignment = CausalAlignment::top_left;  // `causal: bottom_right`; read only when causal
  std::optional<double> scale;         // default 1/sqrt(d)
  std::filesystem::path mask_file;     // core level bool mask (.npy); empty: none
  std::optional<RopeCase> rope;        // the `rope:` block; none: no rotation
  bool bias = false;                   // mha level: bq, bk, bv, bo too, and their gradients (`bias: true`)
  // ---- QK-norm and cross-attention (mha level) ----
  // `qk_norm: {axis: head|model, eps, gain: w|one_plus_w}`: inputs q_norm, k_norm,
  // gradients dq_norm, dk_norm. `cross: true`: shape Tq and Tk (dims.T is set to
  // Tq, x's length), input x_kv [B, Tk, D], gradient dx_kv.
  QkNormSpec qk_norm;
  bool cross = false;
  std::int64_t kv_length() const { return cross ? dims.Tk : dims.T; }  // mha level: x_kv's (or x's) T
  std::vector<std::string> taps;       // q_rot, k_rot: compared too (also listed in `check`)
  // Sliding windows, soft-capping, sinks (mha and core levels; AttentionSpec's).
  WindowSpec window;                   // `window: {left, right}`; neither: every key
  double softcap = 0;                  // `softcap: C` (C > 0); 0: off
  bool sinks = false;                  // `sinks: true`: input sinks [H], gradient dsinks
  InputLayout layout = InputLayout::contiguous;
  std::uint64_t seed = 0;
  Tolerance tolerance;
  std::map<std::string, Tolerance> tensor_tolerance;  // per tensor overrides
  ToleranceRule tolerance_rule = ToleranceRule::automatic;  // `tolerance: {rule: ...}` or atol/rtol on the case
  BaselineFactors baseline_k;                               // `tolerance: {k: {out: 2, grads: 3, dwq: 4}}`
  SourceLoc baseline_k_at;  // where the case itself wrote `k` (line 0: it did not); checked once a reference's dtype is known
  std::vector<std::string> check;      // tensors compared, in tensor_names() order
  bool check_strict = false;           // set on the case itself: a reference dir must hold each
  bool expect_fail = false;
  std::string expect_diagnosis;        // a bug's name or "none"; checked against the catalog by
  SourceLoc expect_diagnosis_at;       // analysis::check_expected_diagnoses, where it is written
  double timeout_s = 60;               // per plugin run
  std::shared_ptr<const CaseFiles> files;  // read once by load_case_files; null: none read

  bool is_reference() const { return !reference.empty(); }
  SourceLoc where(const std::string& key) const;  // that key's location, else the case's
  Tolerance tolerance_for(const std::string& tensor) const;
  // relative_to_baseline in effect: the rule asked for, or automatic below float64
  // (a reference case's dtype is known once its files are read).
  bool relative_rule() const;
};

struct Suite {
  std::string name;
  std::filesystem::path file;
  std::string description;
  std::vector<CaseSpec> cases;
  // The top-level `plugins:` block: Python functions as plugins
  // (`mine: {python: glue/mine.py:fn, capabilities: [mha, causal], rope: {...}}`),
  // the path resolved against the suite's folder.
  std::vector<pyplug::PythonPluginDecl> python_plugins;
};

// The tensors a level produces, in report order:
// mha: out, dx, dwq, dwk, dwv, dwo; core: out, dq, dk, dv; rope: out, dx.
const std::vector<std::string>& tensor_names(Level level);
// The biases' gradients, after dwo in a case with `bias: true`: dbq, dbk, dbv, dbo.
const std::vector<std::string>& bias_tensor_names();
// A case's tensors: its level's, then the biases' gradients when c.bias, then
// dq_norm, dk_norm with QK-norm, then dx_kv with cross.
const std::vector<std::string>& tensor_names(const CaseSpec& c);
// dsinks, after every other gradient of a case with `sinks: true`.
const std::vector<std::string>& sink_tensor_names();
// A check list from the defaults, on a case with biases: each weight gradient
// brings its bias's (dwq -> dbq, ...), so one defaults list serves both kinds.
std::vector<std::string> with_bias_gradients(const std::vector<std::string>& check);
// The gradients of the QK-norm gains and of x_kv, after the biases' in a case
// with `qk_norm` (dq_norm, dk_norm) or `cross: true` (dx_kv).
const std::vector<std::string>& qk_norm_tensor_names();
const std::vector<std::string>& cross_tensor_names();
// A check list from the defaults, on a case with QK-norm or cross: dwq brings
// dq_norm, dwk dk_norm, dx dx_kv (as with_bias_gradients does for the biases).
std::vector<std::string> with_qk_norm_cross_gradients(const std::vector<std::string>& check, const CaseSpec& c);
// Every tensor name a suite may write in `check` or `tolerance` (both levels, biases too).
std::vector<std::string> all_tensor_names();

// A window bound is at most this (2^40 keys): far past any sequence, far below overflow.
inline constexpr std::int64_t kMaxWindowBound = std::int64_t{1} << 40;

// Timeouts are seconds in (0, kMaxTimeoutSeconds]: a day, far below where a
// deadline computed from them could overflow.
inline constexpr double kMaxTimeoutSeconds = 86400;
// Empty for a valid timeout; else what is wrong with it ("must be > 0 ...").
std::string timeout_problem(double seconds);

// A suite expands to at most this many cases (sweeps included); a sweep that
// would go past it is refused at its line.
inline constexpr std::size_t kMaxSuiteCases = 10000;
// A suite file is a regular file of at most this many bytes.
inline constexpr std::uintmax_t kMaxSuiteFileBytes = 16u << 20;

// The YAML alone: no file is read (`file` names the suite in messages and
// anchors the relative paths it holds).
Suite parse_suite(std::string_view yaml_text, const std::filesystem::path& file);
// ConfigError naming the path unless it is a regular file of at most
// kMaxSuiteFileBytes (a device, a fifo, a directory are refused without
// being opened, so nothing blocks or fills memory). load_suite calls it first.
void check_suite_file(const std::filesystem::path& file);

// Peak bytes the case needs (budget.hpp's estimate at its dims and dtype).
double case_memory_bytes(const CaseSpec& c);
// Throws ConfigError at the first case whose estimate exceeds `budget_bytes`,
// saying how much it would need and what the budget is (`budget_source`).
void check_memory(const std::vector<const CaseSpec*>& cases, double budget_bytes,
                  const std::string& budget_source);

// What `plugin` lacks for `c`: {capability, why the case needs it}.
std::vector<std::pair<std::string, std::string>> missing_capabilities(const CaseSpec& c,
                                                                      const Capabilities& caps);
// Throws ConfigError for the first loaded plugin that lacks a capability one of
// `cases` needs (plugins that are not loaded are the runner's business).
void check_capabilities(const std::vector<const CaseSpec*>& cases, const PluginRegistry& registry);

// "MHA(B=2,T=3,D=8,H=2,causal)", "CORE(B=2,H=3,Tq=5,Tk=7,d=4,mask,float32)",
// "MHA(B=2,T=7,D=120,H=12,Hkv=3,d=10)": Hkv and d shown when not the defaults.
std::string describe_case(const CaseSpec& c);

// The candidate nearest to `word` by edit distance when it is close enough to
// be a likely typo; empty otherwise.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// "a, b, c"
std::string join(const std::vector<std::string>& items, std::string_view sep = ", ");
// "a, b and c"
std::string and_list(const std::vector<std::string>& items);

}  // namespace headgrad::runner
