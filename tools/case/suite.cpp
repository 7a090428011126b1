#include "case/suite.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "case/budget.hpp"
#include "case/inputs.hpp"  // CaseFiles: whether a reference brings its own golden/

namespace fs = std::filesystem;

namespace headgrad::runner {

std::string SourceLoc::str() const {
  if (line <= 0) return file;
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

std::string timeout_problem(double seconds) {
  if (std::isfinite(seconds) && seconds > 0 && seconds <= kMaxTimeoutSeconds) return "";
  std::ostringstream os;
  os << "must be a number of seconds > 0 and at most " << kMaxTimeoutSeconds << " (one day), got " << seconds;
  return os.str();
}

std::string_view level_name(Level level) {
  switch (level) {
    case Level::mha: return "mha";
    case Level::core: return "core";
    case Level::rope: return "rope";
  }
  return "?";
}

std::string_view layout_name(InputLayout layout) {
  switch (layout) {
    case InputLayout::contiguous: return "contiguous";
    case InputLayout::transposed: return "transposed";
    case InputLayout::sliced: return "sliced";
  }
  return "?";
}

std::int64_t* Dims::find(std::string_view name) {
  if (name == "B") return &B;
  if (name == "T") return &T;
  if (name == "D") return &D;
  if (name == "H") return &H;
  if (name == "Tq") return &Tq;
  if (name == "Tk") return &Tk;
  if (name == "d") return &d;
  if (name == "Hkv") return &Hkv;
  return nullptr;
}

std::int64_t Dims::get(std::string_view name) const {
  Dims copy = *this;  // find() hands out a pointer for writing; reading goes through a copy
  const std::int64_t* p = copy.find(name);
  return p ? *p : 0;
}

const std::vector<std::string>& dim_names(Level level) {
  static const std::vector<std::string> mha = {"B", "T", "D", "H"};
  static const std::vector<std::string> core = {"B", "H", "Tq", "Tk", "d"};
  static const std::vector<std::string> rope = {"B", "H", "T", "d"};
  return level == Level::mha ? mha : level == Level::core ? core : rope;
}

const std::vector<std::string>& optional_dim_names(Level level) {
  static const std::vector<std::string> mha = {"Hkv", "d", "Tq", "Tk"};  // Tq, Tk: cross-attention only
  static const std::vector<std::string> core = {"Hkv"};
  static const std::vector<std::string> rope = {};  // H is among its dims (optional there)
  return level == Level::mha ? mha : level == Level::core ? core : rope;
}

const std::vector<std::string>& tensor_names(Level level) {
  static const std::vector<std::string> mha = {"out", "dx", "dwq", "dwk", "dwv", "dwo"};
  static const std::vector<std::string> core = {"out", "dq", "dk", "dv"};
  static const std::vector<std::string> rope = {"out", "dx"};
  return level == Level::mha ? mha : level == Level::core ? core : rope;
}

const std::vector<std::string>& bias_tensor_names() {
  static const std::vector<std::string> names = {"dbq", "dbk", "dbv", "dbo"};
  return names;
}

const std::vector<std::string>& qk_norm_tensor_names() {
  static const std::vector<std::string> names = {"dq_norm", "dk_norm"};
  return names;
}

const std::vector<std::string>& cross_tensor_names() {
  static const std::vector<std::string> names = {"dx_kv"};
  return names;
}
// ---- sinks: dsinks after the level's (and the biases') gradients

const std::vector<std::string>& sink_tensor_names() {
  static const std::vector<std::string> names = {"dsinks"};
  return names;
}

// `names` with dsinks appended: one list per base list, made once.
namespace {
const std::vector<std::string>& with_sink_tensor(const std::vector<std::string>& names) {
  static std::map<const std::vector<std::string>*, std::vector<std::string>> made;
  static std::mutex lock;
  const std::lock_guard<std::mutex> hold(lock);
  auto [it, fresh] = made.try_emplace(&names, names);
  if (fresh) it->second.insert(it->second.end(), sink_tensor_names().begin(), sink_tensor_names().end());
  return it->second;
}
}  // namespace

const std::vector<std::string>& tensor_names(const CaseSpec& c) {
  // one list per combination of biases, QK-norm and cross (bit 0, 1, 2)
  static const std::vector<std::vector<std::string>> mha = [] {
    std::vector<std::vector<std::string>> all;
    for (int bits = 0; bits < 8; ++bits) {
      std::vector<std::string> n = tensor_names(Level::mha);
      if (bits & 1) n.insert(n.end(), bias_tensor_names().begin(), bias_tensor_names().end());
      if (bits & 2) n.insert(n.end(), qk_norm_tensor_names().begin(), qk_norm_tensor_names().end());
      if (bits & 4) n.insert(n.end(), cross_tensor_names().begin(), cross_tensor_names().end());
      all.push_back(std::move(n));
    }
    return all;
  }();
  const std::vector<std::string>& base =
      c.level == Level::mha
          ? mha[static_cast<std::size_t>((c.bias ? 1 : 0) | (c.qk_norm.enabled ? 2 : 0) | (c.cross ? 4 : 0))]
          : tensor_names(c.level);
  return c.sinks && c.level != Level::rope ? with_sink_tensor(base) : base;
}

std::vector<std::string> with_qk_norm_cross_gradients(const std::vector<std::string>& check, const CaseSpec& c) {
  std::vector<std::string> out = check;
  auto gain = [&](const char* from, const char* to) {
    if (std::find(check.begin(), check.end(), from) != check.end() &&
        std::find(out.begin(), out.end(), to) == out.end())
      out.push_back(to);
  };
  if (c.qk_norm.enabled) {
    gain("dwq", "dq_norm");
    gain("dwk", "dk_norm");
  }
  if (c.cross) gain("dx", "dx_kv");
  return out;
}

// A check list from the defaults, on a case with biases: each weight gradient
// brings its bias's (dwq -> dbq, ...), so one defaults list serves both kinds.
std::vector<std::string> with_bias_gradients(const std::vector<std::string>& check) {
  std::vector<std::string> out = check;
  for (const auto& t : check)
    if (t.size() == 3 && t.rfind("dw", 0) == 0) {
      const std::string b = "db" + t.substr(2);
      if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
    }
  return out;
}

std::vector<std::string> all_tensor_names() {
  std::vector<std::string> names = tensor_names(Level::mha);
  names.insert(names.end(), bias_tensor_names().begin(), bias_tensor_names().end());
  names.insert(names.end(), qk_norm_tensor_names().begin(), qk_norm_tensor_names().end());
  names.insert(names.end(), cross_tensor_names().begin(), cross_tensor_names().end());
  names.insert(names.end(), sink_tensor_names().begin(), sink_tensor_names().end());
  for (const auto& n : tensor_names(Level::core))
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  return names;
}

SourceLoc CaseSpec::where(const std::string& key) const {
  auto it = key_source.find(key);
  return it != key_source.end() ? it->second : source;
}

Tolerance CaseSpec::tolerance_for(const std::string& tensor) const {
  auto it = tensor_tolerance.find(tensor);
  return it != tensor_tolerance.end() ? it->second : tolerance;
}

bool CaseSpec::relative_rule() const {
  // float64 is the checking precision: its golden would be the baseline itself
  if (dtype == DType::float64) return false;
  return tolerance_rule != ToleranceRule::allclose;
}

double BaselineFactors::k_for(const std::string& name) const {
  if (auto it = tensor.find(name); it != tensor.end()) return it->second;
  // out and the taps are forward values; every other tensor is a gradient
  return name == "out" || name == "q_rot" || name == "k_rot" ? out : grads;
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  auto lower = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  // Edit distance counting a swap of two neighbours as one edit (optimal
  // string alignment): "fial" is one edit from "fail".
  auto distance = [&](std::string_view a, std::string_view b) {
    std::vector<std::vector<std::size_t>> m(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
    for (std::size_t i = 0; i <= a.size(); ++i) m[i][0] = i;
    for (std::size_t j = 0; j <= b.size(); ++j) m[0][j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i)
      for (std::size_t j = 1; j <= b.size(); ++j) {
        const bool same = lower(a[i - 1]) == lower(b[j - 1]);
        m[i][j] = std::min({m[i - 1][j] + 1, m[i][j - 1] + 1, m[i - 1][j - 1] + (same ? 0 : 1)});
        if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1]))
          m[i][j] = std::min(m[i][j], m[i - 2][j - 2] + 1);
      }
    return m[a.size()][b.size()];
  };
  const std::size_t limit = word.size() >= 5 ? 2 : 1;
  std::string best;
  std::size_t best_distance = limit + 1;
  for (const auto& c : candidates) {
    const std::size_t dist = distance(word, c);
    if (dist < best_distance) {
      best = c;
      best_distance = dist;
    }
  }
  return best;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) s += sep;
    s += items[i];
  }
  return s;
}

std::string and_list(const std::vector<std::string>& items) {
  if (items.size() <= 1) return join(items);
  return join(std::vector<std::string>(items.begin(), items.end() - 1)) + " and " + items.back();
}

std::string RopeCase::describe() const {
  std::string s = "rope=" + std::string(rope_style_name(style));
  if (rotary_dim > 0) s += "/r" + std::to_string(rotary_dim);
  if (!generator.empty()) s += "," + generator;
  else if (!rows.empty()) s += per_row ? ",positions[B,T]" : ",positions[T]";
  else if (offset != 0) s += ",offset=" + std::to_string(offset);
  if (q_offset != 0) s += ",q_offset=" + std::to_string(q_offset);
  return s;
}

std::vector<std::int64_t> rope_positions(const RopeCase& r, std::int64_t b, std::int64_t t, Shape& shape) {
  std::vector<std::int64_t> v;
  if (!r.rows.empty()) {
    shape = r.per_row ? Shape{static_cast<std::int64_t>(r.rows.size()), t} : Shape{t};
    for (const auto& row : r.rows) v.insert(v.end(), row.begin(), row.end());
    return v;
  }
  if (r.generator.empty()) {
    shape = {t};
    return v;
  }
  shape = {b, t};
  for (std::int64_t row = 0; row < b; ++row) {
    std::int64_t p = row * r.start;
    for (std::int64_t i = 0; i < t; ++i) {
      if (r.generator == "reversed") {
        v.push_back(row * r.start + t - 1 - i);
      } else {  // gapped: steps 1, 2, 3, 1, 2, 3, ...
        if (i > 0) p += 1 + (i - 1) % 3;
        v.push_back(p);
      }
    }
  }
  return v;
}

std::string rope_position_problem(const RopeCase& r, Level level, const Dims& d) {
  const bool core = level == Level::core;
  const std::int64_t b = d.B, tk = core ? d.Tk : d.T, tq = core ? d.Tq : d.T;
  using Wide = __int128;  // offsets and starts up to 2^53 times B: no overflow here
  Wide keys = -1, queries = -1;
  std::string how;
  if (!r.rows.empty()) {
    for (const auto& row : r.rows)
      for (std::int64_t p : row) keys = std::max<Wide>(keys, p);
    queries = keys;
    how = "the 'positions' list";
  } else if (!r.generator.empty()) {
    if (b <= 0 || tk <= 0) return "";
    const Wide steps = tk - 1;  // gapped steps 1, 2, 3, 1, ...
    const Wide last = r.generator == "reversed" ? steps : 6 * (steps / 3) + (steps % 3 == 2 ? 3 : steps % 3);
    keys = queries = Wide(b - 1) * r.start + last;
    how = "generator " + r.generator + "; row " + std::to_string(b - 1) + " begins at " + std::to_string(b - 1) +
          " x start " + std::to_string(r.start);
  } else {
    if (tk <= 0 || tq <= 0) return "";
    keys = Wide(r.offset) + tk - 1;
    queries = Wide(r.offset) + tq - 1;
    how = "offset " + std::to_string(r.offset) + " + t";
  }
  queries += r.q_offset;
  const Wide most = std::max(keys, queries);
  if (most <= kMaxRopePosition) return "";
  auto text = [](Wide v) {
    std::string digits;
    for (; v > 0; v /= 10) digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    return digits.empty() ? std::string("0") : digits;
  };
  return "positions reach " + text(most) + " (" + how + (r.q_offset ? ", queries + q_offset " + std::to_string(r.q_offset) : "") +
         "), past 2^53 = " + std::to_string(kMaxRopePosition) + ", the largest position float64 holds exactly";
}

std::string describe_case(const CaseSpec& c) {
  std::string s = c.level == Level::mha ? "MHA(" : c.level == Level::core ? "CORE(" : "ROPE(";
  bool first = true;
  auto add = [&](const std::string& part) {
    s += (first ? "" : ",") + part;
    first = false;
  };
  for (const auto& dim : dim_names(c.level)) {
    const std::int64_t v = c.dims.get(dim);
    if (c.cross && dim == "T") {  // cross-attention: the query and key lengths
      if (c.dims.Tq > 0) add("Tq=" + std::to_string(c.dims.Tq));
      if (c.dims.Tk > 0) add("Tk=" + std::to_string(c.dims.Tk));
      continue;
    }
    if (v > 0) add(dim + "=" + std::to_string(v));
    // grouped kv heads right after H, an mha head width apart from D / H after D's dims
    if (dim == "H" && c.dims.Hkv > 0 && c.dims.Hkv != c.dims.H) add("Hkv=" + std::to_string(c.dims.Hkv));
  }
  if (c.level == Level::mha && c.dims.d > 0 && !(c.dims.H > 0 && c.dims.D == c.dims.H * c.dims.d))
    add("d=" + std::to_string(c.dims.d));
  if (c.causal)
    add(c.causal_alignment == CausalAlignment::bottom_right ? "causal=bottom_right" : "causal");
  if (!c.mask_file.empty()) add("mask");
  if (c.scale) {
    std::ostringstream os;
    os << "scale=" << *c.scale;
    add(os.str());
  }
  if (c.bias) add("bias");
  if (c.qk_norm.enabled) {  // "qk_norm=head/w", the eps only when it is not 1e-6
    std::ostringstream eps;
    if (c.qk_norm.eps != QkNormSpec{}.eps) eps << "/eps=" << c.qk_norm.eps;
    add("qk_norm=" + std::string(qk_norm_axis_name(c.qk_norm.axis)) + "/" + std::string(qk_norm_gain_name(c.qk_norm.gain)) +
        eps.str());
  }
  if (c.cross) add("cross");
  if (c.layout != InputLayout::contiguous) add(std::string(layout_name(c.layout)));
  if (c.dtype != DType::float64) add(std::string(dtype_name(c.dtype)));
  if (c.rope) add(c.rope->describe());
  // sliding windows, soft-capping, sinks: "window=l3/r0", "softcap=4", "sinks"
  if (c.window.enabled())
    add("window=" + (c.window.left ? "l" + std::to_string(*c.window.left) : std::string()) +
        (c.window.left && c.window.right ? "/" : "") + (c.window.right ? "r" + std::to_string(*c.window.right) : ""));
  if (c.softcap > 0) {
    std::ostringstream os;
    os << "softcap=" << c.softcap;
    add(os.str());
  }
  if (c.sinks) add("sinks");
  return s + ")";
}

// ------------------------------------------------------------------ parsing

namespace {

// The allclose defaults of a bfloat16 / float16 case that opts out of the
// relative rule (`tolerance: {rule: allclose}`): atol = rtol = kUlps16 machine
// epsilons of the dtype (2^-7, 2^-10), since a correct 16-bit run differs from
// another by a few roundings of each op's result, amplified by the sums of a
// matmul.
constexpr double kUlps16 = 16;
Tolerance tolerance_16bit(DType dtype) {
  const double eps = dtype == DType::bfloat16 ? 0x1p-7 : 0x1p-10;
  return {kUlps16 * eps, kUlps16 * eps};
}

const std::vector<std::string> kTopKeys = {"suite", "description", "defaults", "plugins", "cases"};
const std::vector<std::string> kCaseKeys = {
    "name",  "description", "compare", "reference", "level",     "shape",     "sweep",
    "dtype", "causal",      "scale",   "dropout_p", "mask",      "input_layout", "seed",
    "atol",  "rtol",        "tolerance", "check",   "expect",    "timeout", "rope", "taps", "bias",
    "qk_norm", "cross"};
const std::vector<std::string> kQkNormKeys = {"axis", "eps", "gain"};
// Sliding windows, soft-capping, sinks: their own keys (Parser::read_window_features).
const std::vector<std::string> kWindowFeatureKeys = {"window", "softcap", "sinks"};
const std::vector<std::string> kWindowKeys = {"left", "right"};
// Sweepable settings of the window and the cap: `sweep: {window_left: [1, 3], softcap: [1, 50]}`.
const std::vector<std::string> kFeatureSweepKeys = {"window_left", "window_right", "softcap"};
void apply_feature_sweep(CaseSpec& c, const std::string& key, std::int64_t value) {
  if (key == "window_left") c.window.left = value;
  else if (key == "window_right") c.window.right = value;
  else c.softcap = static_cast<double>(value);
}
// Every case key: the base ones, then each feature block's.
const std::vector<std::string>& case_keys() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> k = kCaseKeys;
    k.insert(k.end(), kWindowFeatureKeys.begin(), kWindowFeatureKeys.end());
    return k;
  }();
  return all;
}
const std::vector<std::string> kRopeKeys = {"theta", "style", "rotary_dim", "positions", "q_offset"};
const std::vector<std::string> kExpectKeys = {"fail", "diagnosis"};
const std::vector<std::string> kToleranceKeys = {"atol", "rtol"};
// Keys whose map values merge (defaults first, the case's entries win).
const std::set<std::string> kMergedKeys = {"shape", "sweep", "tolerance"};

std::string kind_of(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null: return "nothing";
    case YAML::NodeType::Scalar: return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    default: return "an undefined value";
  }
}

// One key of a case after defaults are applied: the case's value if it has
// one, else the default; map-valued keys keep both to merge them.
// !! yaml-cpp Nodes are handles: assigning to a copied Node rebinds the node
// every copy shares (it would rewrite the defaults). Entries are only ever
// constructed, never assigned. !!
struct Entry {
  YAML::Node key, value;                  // the effective key and value
  YAML::Node default_value;               // the defaults' value, when has_default
  bool has_default = false;
  bool from_case = false;
};

// A dim of `shape` or `sweep`, parsed: one value (shape) or a list (sweep).
struct DimValues {
  std::string dim;
  std::vector<std::int64_t> values;
  SourceLoc where;
};

class Parser {
 public:
  explicit Parser(fs::path file) : file_(std::move(file)), dir_(file_.parent_path()) {}

  Suite parse(std::string_view text);

 private:
  SourceLoc loc(const YAML::Node& n) const {
    const YAML::Mark m = n.Mark();
    if (m.is_null()) return {file_.string(), 0, 0};
    return {file_.string(), m.line + 1, m.column + 1};
  }
  [[noreturn]] void fail(const YAML::Node& at, const std::string& problem) const {
    throw ConfigError(loc(at), context_ + problem);
  }
  [[noreturn]] void fail(const SourceLoc& at, const std::string& problem) const {
    throw ConfigError(at, context_ + problem);
  }

  // (key, value) pairs of a map in file order; rejects unknown keys (duplicates
  // never get here: check_duplicate_keys refused them for the whole file).
  std::vector<std::pair<YAML::Node, YAML::Node>> entries(const YAML::Node& map,
                                                         const std::vector<std::string>& valid,
                                                         const std::string& what) const;
  std::string string_value(const YAML::Node& v, const std::string& key) const;
  bool bool_value(const YAML::Node& v, const std::string& key) const;
  void read_causal(const YAML::Node& v, CaseSpec& c) const;
  double number_value(const YAML::Node& v, const std::string& key) const;
  std::int64_t int_value(const YAML::Node& v, const std::string& key) const;
  std::string choice(const YAML::Node& v, const std::string& key,
                     const std::vector<std::string>& options) const;
  std::vector<std::string> string_list(const YAML::Node& v, const std::string& key) const;
  // from_defaults: the other level's dims are skipped (one default shape may
  // serve cases of both levels).
  void read_dims(const YAML::Node& map, Level level, const std::string& key, bool from_defaults,
                 std::vector<DimValues>& out) const;
  void read_tolerance_map(const YAML::Node& map, CaseSpec& c) const;
  // `rule:` and `k:` of a `tolerance:` map (the other keys are tensors' atol/rtol).
  void read_tolerance_rule(const YAML::Node& key, const YAML::Node& value, CaseSpec& c) const;
  // The case's own `tolerance:` keys against what applies to it: its level's
  // tensors (and taps), and `k` only where relative_to_baseline can judge.
  void check_tolerance_keys(const YAML::Node& map, CaseSpec& c) const;
  RopeCase read_rope(const YAML::Node& map, Level level) const;
  void read_rope_positions(const YAML::Node& v, RopeCase& r) const;
  void check_rope(const CaseSpec& c) const;
  // `qk_norm:` and `cross:` (mha level), read after `rope` and `bias`.
  void read_qk_norm_and_cross(std::map<std::string, Entry>& keys, CaseSpec& c) const;
  // cross: Tq and Tk given (T becomes Tq); without cross, the defaults' Tq, Tk dropped.
  void finish_cross_dims(CaseSpec& c, const SourceLoc& at) const;
  // A self-attention mha case's own shape or sweep naming Tq or Tk: refused at the key.
  void check_cross_dims(std::map<std::string, Entry>& keys, const CaseSpec& c) const;
  std::vector<pyplug::PythonPluginDecl> read_python_plugins(const YAML::Node& map) const;

  std::vector<CaseSpec> parse_case(const YAML::Node& node, std::size_t index,
                                   const std::map<std::string, Entry>& defaults);
  void read_tolerances(std::map<std::string, Entry>& keys, CaseSpec& c) const;
  void read_check_and_taps(std::map<std::string, Entry>& keys, CaseSpec& c) const;
  // window, softcap, sinks (before the check list: sinks add dsinks)
  void read_window_features(std::map<std::string, Entry>& keys, CaseSpec& c) const;
  std::vector<CaseSpec> expand(const CaseSpec& base, const std::vector<DimValues>& shape,
                               const std::vector<DimValues>& sweep);
  void finish_point(CaseSpec& c, const SourceLoc& at) const;
  // Hkv and d against H and D; `dim_at` says where each dim was written.
  void check_head_dims(const CaseSpec& c, const SourceLoc& at,
                       const std::map<std::string, SourceLoc>& dim_at) const;

  fs::path file_;
  fs::path dir_;
  std::string context_;  // "case 'x': " while a case is read
  std::size_t case_count_ = 0;  // cases of the suite so far (sweep points included)
};

std::vector<std::pair<YAML::Node, YAML::Node>> Parser::entries(
    const YAML::Node& map, const std::vector<std::string>& valid, const std::string& what) const {
  if (!map.IsMap())
    fail(map, what + " must be a map (key: value lines), got " + kind_of(map));
  std::vector<std::pair<YAML::Node, YAML::Node>> out;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const YAML::Node key = it->first;
    if (!key.IsScalar()) fail(key, "a key in " + what + " must be a plain name, got " + kind_of(key));
    const std::string name = key.Scalar();
    if (std::find(valid.begin(), valid.end(), name) == valid.end()) {
      const std::string near = closest_match(name, valid);
      fail(key, "unknown key '" + name + "' in " + what +
                    (near.empty() ? " (valid keys: " + join(valid) + ")"
                                  : " (did you mean '" + near + "'?)"));
    }
    out.emplace_back(key, it->second);
  }
  return out;
}

std::string Parser::string_value(const YAML::Node& v, const std::string& key) const {
  if (!v.IsScalar()) fail(v, "'" + key + "' must be a string, got " + kind_of(v));
  return v.Scalar();
}

bool Parser::bool_value(const YAML::Node& v, const std::string& key) const {
  bool b = false;
  if (!v.IsScalar() || !YAML::convert<bool>::decode(v, b))
    fail(v, "'" + key + "' must be true or false, got " + kind_of(v));
  return b;
}

// causal: true | false | top_left | bottom_right (true is top-left, PyTorch's is_causal).
void Parser::read_causal(const YAML::Node& v, CaseSpec& c) const {
  bool b = false;
  if (v.IsScalar() && YAML::convert<bool>::decode(v, b)) {
    c.causal = b;
    c.causal_alignment = CausalAlignment::top_left;
    return;
  }
  if (v.IsScalar() && (v.Scalar() == "top_left" || v.Scalar() == "bottom_right")) {
    c.causal = true;
    c.causal_alignment = v.Scalar() == "top_left" ? CausalAlignment::top_left : CausalAlignment::bottom_right;
    return;
  }
  fail(v, "'causal' must be true, false, top_left or bottom_right (true is top_left, as PyTorch's "
          "is_causal), got " + kind_of(v));
}

double Parser::number_value(const YAML::Node& v, const std::string& key) const {
  if (v.IsScalar()) {
    std::string s = v.Scalar();
    if (!s.empty() && s[0] == '+') s.erase(0, 1);
    double x = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (ec == std::errc() && end == s.data() + s.size() && std::isfinite(x)) return x;
  }
  fail(v, "'" + key + "' must be a finite number, got " + kind_of(v));
}

std::int64_t Parser::int_value(const YAML::Node& v, const std::string& key) const {
  if (v.IsScalar()) {
    std::string s = v.Scalar();
    if (!s.empty() && s[0] == '+') s.erase(0, 1);
    std::int64_t x = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (ec == std::errc() && end == s.data() + s.size()) return x;
  }
  fail(v, "'" + key + "' must be an integer, got " + kind_of(v));
}

std::string Parser::choice(const YAML::Node& v, const std::string& key,
                           const std::vector<std::string>& options) const {
  const std::string s = string_value(v, key);
  if (std::find(options.begin(), options.end(), s) != options.end()) return s;
  const std::string near = closest_match(s, options);
  fail(v, "'" + key + "' must be " + join(options, " | ") + ", got '" + s + "'" +
              (near.empty() ? "" : " (did you mean '" + near + "'?)"));
}

std::vector<std::string> Parser::string_list(const YAML::Node& v, const std::string& key) const {
  if (!v.IsSequence()) fail(v, "'" + key + "' must be a list like [a, b], got " + kind_of(v));
  std::vector<std::string> out;
  for (const auto& item : v) out.push_back(string_value(item, key + " entry"));
  return out;
}

void Parser::read_dims(const YAML::Node& map, Level level, const std::string& key, bool from_defaults,
                       std::vector<DimValues>& out) const {
  std::vector<std::string> valid = dim_names(level);
  valid.insert(valid.end(), optional_dim_names(level).begin(), optional_dim_names(level).end());
  if (key == "sweep" && level != Level::rope)  // the window's bounds and the cap sweep too
    valid.insert(valid.end(), kFeatureSweepKeys.begin(), kFeatureSweepKeys.end());
  if (!map.IsMap())
    fail(map, "'" + key + "' must be a map of dims like {" + join(valid, ": .., ") +
                  ": ..}, got " + kind_of(map));
  for (auto it = map.begin(); it != map.end(); ++it) {
    const YAML::Node k = it->first;
    const std::string name = k.IsScalar() ? k.Scalar() : "";
    if (std::find(valid.begin(), valid.end(), name) == valid.end()) {
      // a dim of another level (including its optional dims): named as such
      Level other_level = level;
      for (Level l : {Level::mha, Level::core, Level::rope}) {
        std::vector<std::string> dims = dim_names(l);
        dims.insert(dims.end(), optional_dim_names(l).begin(), optional_dim_names(l).end());
        if (l == Level::mha) std::erase_if(dims, [](const std::string& n) { return n == "Tq" || n == "Tk"; });  // cross only
        if (l != level && std::find(dims.begin(), dims.end(), name) != dims.end()) {
          other_level = l;
          break;
        }
      }
      const bool other_level_dim = other_level != level;
      if (other_level_dim && from_defaults) continue;
      if (other_level_dim)
        fail(k, "'" + name + "' is a " + std::string(level_name(other_level)) + "-level dim; this case is level " +
                    std::string(level_name(level)) + ", whose dims are " + join(valid));
      const std::string near = closest_match(name, valid);
      fail(k, "unknown dim '" + name + "' in '" + key + "'" +
                  (near.empty() ? " (" + std::string(level_name(level)) + " level dims: " + join(valid) + ")"
                                : " (did you mean '" + near + "'?)"));
    }
    const YAML::Node v = it->second;
    const bool bound = name == "window_left" || name == "window_right";  // may be 0
    auto positive = [&](const YAML::Node& n) {
      const std::int64_t x = int_value(n, name);
      if (bound && (x < 0 || x > kMaxWindowBound))
        fail(n, "'" + name + "' must be an integer from 0 to " + std::to_string(kMaxWindowBound) + ", got " +
                    std::to_string(x));
      if (!bound && x < 1)
        fail(n, "'" + name + "' must be a positive integer" +
                    (name == "softcap" ? std::string(" (a sweep's caps are whole numbers)") : "") + ", got " +
                    std::to_string(x));
      return x;
    };
    DimValues dv{name, {}, loc(v)};
    if (v.IsSequence()) {
      if (key != "sweep") fail(v, "'" + key + ": " + name + "' takes one value; lists go under 'sweep'");
      if (v.size() == 0) fail(v, "sweep '" + name + "' is an empty list");
      for (const auto& item : v) dv.values.push_back(positive(item));
    } else {
      dv.values.push_back(positive(v));
    }
    auto found = std::find_if(out.begin(), out.end(), [&](const DimValues& d) { return d.dim == name; });
    if (found != out.end()) *found = std::move(dv);  // the case's value replaces the default's
    else out.push_back(std::move(dv));
  }
}

void Parser::read_tolerance_map(const YAML::Node& map, CaseSpec& c) const {
  std::vector<std::string> names = all_tensor_names();
  names.push_back("rule");
  names.push_back("k");
  for (const auto& [tkey, tval] : entries(map, names, "'tolerance'")) {
    if (tkey.Scalar() == "rule" || tkey.Scalar() == "k") {
      read_tolerance_rule(tkey, tval, c);
      continue;
    }
    Tolerance t = c.tolerance;  // a missing atol or rtol falls back to the case's
    const auto it = c.tensor_tolerance.find(tkey.Scalar());
    if (it != c.tensor_tolerance.end()) t = it->second;
    for (const auto& [k, v] : entries(tval, kToleranceKeys, "'tolerance: " + tkey.Scalar() + "'")) {
      const double x = number_value(v, k.Scalar());
      if (x < 0) fail(v, "'" + k.Scalar() + "' must be >= 0");
      (k.Scalar() == "atol" ? t.atol : t.rtol) = x;
    }
    c.tensor_tolerance[tkey.Scalar()] = t;
  }
}

void Parser::read_tolerance_rule(const YAML::Node& key, const YAML::Node& value, CaseSpec& c) const {
  if (key.Scalar() == "rule") {
    c.tolerance_rule = choice(value, "tolerance: rule", {"allclose", "relative_to_baseline"}) == "allclose"
                           ? ToleranceRule::allclose
                           : ToleranceRule::relative_to_baseline;
    return;
  }
  std::vector<std::string> names = {"out", "grads"};
  for (const auto& n : all_tensor_names())
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  names.push_back("q_rot");
  names.push_back("k_rot");
  for (const auto& [kkey, kval] : entries(value, names, "'tolerance: k'")) {
    const std::string what = "tolerance: k: " + kkey.Scalar();
    const double x = number_value(kval, what);
    if (!(x > 0)) fail(kval, "'" + what + "' must be > 0 (a factor on the baseline's error), got " + kval.Scalar());
    if (kkey.Scalar() == "out") c.baseline_k.out = x;
    else if (kkey.Scalar() == "grads") c.baseline_k.grads = x;
    else c.baseline_k.tensor[kkey.Scalar()] = x;
  }
}

void Parser::check_tolerance_keys(const YAML::Node& map, CaseSpec& c) const {
  const auto& level_tensors = tensor_names(c);  // dbq..dbo too in a bias case
  auto applies = [&](const std::string& t) {
    return std::find(level_tensors.begin(), level_tensors.end(), t) != level_tensors.end() ||
           std::find(c.taps.begin(), c.taps.end(), t) != c.taps.end();
  };
  const std::string tensors = join(level_tensors) + (c.taps.empty() ? "" : ", " + join(c.taps));
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string key = it->first.Scalar();
    if (key == "rule") continue;
    if (key != "k") {
      if (!applies(key))
        fail(it->first, "'tolerance: " + key + "' is not a tensor of this " + std::string(level_name(c.level)) +
                            "-level case (" + tensors + ")");
      continue;
    }
    const bool allclose = c.tolerance_rule == ToleranceRule::allclose ||
                          (c.tolerance_rule == ToleranceRule::automatic && !c.is_reference() && c.dtype == DType::float64);
    c.baseline_k_at = loc(it->first);
    if (allclose)
      fail(it->first, "'tolerance: k' is the factor of relative_to_baseline, and this case is judged by allclose (" +
                          std::string(c.tolerance_rule == ToleranceRule::allclose ? "atol/rtol or rule: allclose on the case"
                                                                                  : "float64 is the checking precision") +
                          "); set atol/rtol instead, or drop 'k'");
    for (auto kt = it->second.begin(); kt != it->second.end(); ++kt) {
      const std::string t = kt->first.Scalar();
      if (t != "out" && t != "grads" && !applies(t))
        fail(kt->first, "'tolerance: k: " + t + "' is not a tensor of this " + std::string(level_name(c.level)) +
                            "-level case (out, grads, " + tensors + ")");
    }
  }
}

RopeCase Parser::read_rope(const YAML::Node& map, Level level) const {
  RopeCase r;
  r.positions_at = r.rotary_dim_at = loc(map);
  for (const auto& [k, v] : entries(map, kRopeKeys, "'rope'")) {
    const std::string key = k.Scalar();
    if (v.IsNull()) fail(k, "'rope: " + key + "' has no value");
    if (key == "theta") {
      r.theta = number_value(v, "theta");
      if (r.theta <= 1) fail(v, "'theta' must be > 1 (the RoPE base, e.g. 10000), got " + v.Scalar());
    } else if (key == "style") {
      r.style = choice(v, "style", {"interleaved", "half"}) == "half" ? RopeStyle::half : RopeStyle::interleaved;
    } else if (key == "rotary_dim") {
      r.rotary_dim = int_value(v, "rotary_dim");
      r.rotary_dim_at = loc(v);
      if (r.rotary_dim < 2 || r.rotary_dim % 2 != 0)
        fail(v, "'rotary_dim' must be an even integer >= 2 (dims rotate in pairs), got " + std::to_string(r.rotary_dim));
    } else if (key == "q_offset") {
      if (level != Level::core)
        fail(k, "'q_offset' is a core-level key (queries at q_offset + t, keys at t); at mha level "
                "queries and keys are the same tokens");
      r.q_offset = int_value(v, "q_offset");
      r.q_offset_at = loc(v);
      if (r.q_offset < 0 || r.q_offset > kMaxRopePosition)
        fail(v, "'q_offset' must be in [0, 2^53] (positions are exact in float64 up to 2^53), got " +
                    std::to_string(r.q_offset));
    } else {
      r.positions_at = loc(v);
      read_rope_positions(v, r);
    }
  }
  return r;
}

void Parser::read_rope_positions(const YAML::Node& v, RopeCase& r) const {
  const std::string forms =
      "{offset: N}, a list [p0, p1, ...], one list per batch row [[...], [...]], or "
      "{generator: gapped|reversed, start: N}";
  auto position = [&](const YAML::Node& n) {
    const std::int64_t p = int_value(n, "positions entry");
    if (p < 0 || p > (std::int64_t{1} << 53)) fail(n, "a position must be in [0, 2^53], got " + std::to_string(p));
    return p;
  };
  if (v.IsMap()) {
    const auto items = entries(v, {"offset", "generator", "start"}, "'rope: positions'");
    bool has_offset = false, has_generator = false, has_start = false;
    for (const auto& [k, val] : items) {
      if (k.Scalar() == "offset") {
        has_offset = true;
        r.offset = position(val);
      } else if (k.Scalar() == "generator") {
        has_generator = true;
        r.generator = choice(val, "generator", {"gapped", "reversed"});
      } else {
        has_start = true;
        r.start = position(val);
      }
    }
    if (has_offset && (has_generator || has_start))
      fail(v, "'positions' takes an offset or a generator, not both");
    if (has_start && !has_generator) fail(v, "'start' needs 'generator: gapped|reversed'");
    if (!has_offset && !has_generator) fail(v, "'positions' must be " + forms);
    return;
  }
  if (!v.IsSequence() || v.size() == 0) fail(v, "'positions' must be " + forms + ", got " + kind_of(v));
  r.per_row = v[0].IsSequence();
  for (const auto& item : v) {
    if (item.IsSequence() != r.per_row)
      fail(item, "'positions' mixes numbers and lists; give one list [T] or one list per batch row");
    if (!r.per_row) {
      if (r.rows.empty()) r.rows.emplace_back();
      r.rows.back().push_back(position(item));
      continue;
    }
    if (item.size() == 0) fail(item, "a positions row is empty");
    std::vector<std::int64_t> row;
    for (const auto& p : item) row.push_back(position(p));
    if (!r.rows.empty() && row.size() != r.rows.front().size())
      fail(item, "positions rows differ in length (" + std::to_string(r.rows.front().size()) + " and " +
                     std::to_string(row.size()) + ")");
    r.rows.push_back(std::move(row));
  }
}

// The rope block against the dims of one sweep point (or a reference's files).
void Parser::check_rope(const CaseSpec& c) const {
  if (!c.rope) return;
  const RopeCase& r = *c.rope;
  const std::int64_t d = c.dims.head_dim();
  if (r.rotary_dim > 0 && d > 0 && r.rotary_dim > d)
    fail(r.rotary_dim_at, "'rotary_dim' " + std::to_string(r.rotary_dim) + " is wider than the head width d=" +
                              std::to_string(d) + " (r <= d: the first r dims rotate)");
  if (r.rotary_dim == 0 && d > 0 && d % 2 != 0)
    fail(r.rotary_dim_at, "the head width d=" + std::to_string(d) +
                              " is odd and the 'rope' block gives no rotary_dim: RoPE rotates dims in pairs; "
                              "give an even 'rotary_dim' <= d (the first r dims rotate, the rest pass through)");
  if (const std::string problem = rope_position_problem(r, c.level, c.dims); !problem.empty())
    fail(r.q_offset && problem.find("q_offset") != std::string::npos ? r.q_offset_at : r.positions_at, problem);
  if (r.rows.empty() && r.generator.empty()) return;
  const bool mha = c.level != Level::core;  // mha and rope: T tokens
  if (!mha && c.dims.Tq > 0 && c.dims.Tk > 0 && c.dims.Tq != c.dims.Tk)
    fail(r.positions_at, "explicit positions at core level need Tq = Tk (one position per token, shared by "
                         "queries and keys), got Tq=" + std::to_string(c.dims.Tq) + ", Tk=" +
                             std::to_string(c.dims.Tk) + "; use {offset: N} and q_offset");
  const std::int64_t t = mha ? c.dims.T : c.dims.Tk;
  if (!r.rows.empty() && t > 0 && static_cast<std::int64_t>(r.rows.front().size()) != t)
    fail(r.positions_at, "'positions' has " + std::to_string(r.rows.front().size()) +
                             " per row, but the case has " + (mha ? "T=" : "Tq=Tk=") + std::to_string(t) +
                             " tokens");
  if (r.per_row && c.dims.B > 0 && static_cast<std::int64_t>(r.rows.size()) != c.dims.B)
    fail(r.positions_at, "'positions' has " + std::to_string(r.rows.size()) + " rows, but the case has B=" +
                             std::to_string(c.dims.B) + " (one row per batch row, or one list [T] for all)");
}

// yaml-cpp keeps both entries of a repeated key, and any map a suite holds
// (shape, rope, ...) could hide one: every map is checked, once, up front.
// Aliases make a small file a big tree; the walk gives up past a bound.
void check_duplicate_keys(const YAML::Node& root, const fs::path& file) {
  constexpr std::size_t kMaxNodes = 1'000'000;
  auto loc = [&](const YAML::Node& n) {
    const YAML::Mark m = n.Mark();
    return m.is_null() ? SourceLoc{file.string(), 0, 0} : SourceLoc{file.string(), m.line + 1, m.column + 1};
  };
  std::vector<YAML::Node> todo = {root};
  std::size_t visited = 0;
  while (!todo.empty()) {
    const YAML::Node n = todo.back();
    todo.pop_back();
    if (++visited > kMaxNodes)
      throw ConfigError(loc(n), "the suite holds more than " + std::to_string(kMaxNodes) +
                                    " values once its aliases (*name) are expanded");
    if (n.IsSequence()) {
      for (const auto& item : n) todo.push_back(item);
    } else if (n.IsMap()) {
      std::map<std::string, SourceLoc> seen;
      for (auto it = n.begin(); it != n.end(); ++it) {
        if (it->first.IsScalar()) {
          const auto [first, fresh] = seen.emplace(it->first.Scalar(), loc(it->first));
          if (!fresh)
            throw ConfigError(loc(it->first), "duplicate key '" + it->first.Scalar() + "' (first at line " +
                                                  std::to_string(first->second.line) +
                                                  "); each key may appear once in a map");
        }
        todo.push_back(it->second);
      }
    }
  }
}

// Whether a YAML document holds anything but null, and where it starts.
class DocumentContent final : public YAML::EventHandler {
 public:
  bool any = false;
  YAML::Mark mark;
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { seen(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t, const std::string&) override { seen(m); }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    seen(m);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    seen(m);
  }
  void OnMapEnd() override {}

 private:
  void seen(const YAML::Mark& m) {
    if (!any) mark = m;
    any = true;
  }
};

// plugins: {NAME: {python: FILE.py:FUNCTION | MODULE:FUNCTION, capabilities: [...], rope: {...}}}
std::vector<pyplug::PythonPluginDecl> Parser::read_python_plugins(const YAML::Node& map) const {
  std::vector<pyplug::PythonPluginDecl> out;
  if (map.IsNull()) return out;
  if (!map.IsMap()) fail(map, "'plugins' must be a map of plugin names, each {python: FILE.py:FUNCTION, capabilities: [...]}");
  for (auto it = map.begin(); it != map.end(); ++it) {
    const YAML::Node name = it->first, body = it->second;
    if (!name.IsScalar() || name.Scalar().empty()) fail(name, "a plugin name under 'plugins' must be a plain name");
    pyplug::PythonPluginDecl d;
    d.name = name.Scalar();
    d.origin = loc(name).str();
    for (const auto& other : out)
      if (other.name == d.name) fail(name, "plugin '" + d.name + "' is defined twice under 'plugins'");
    if (!body.IsMap()) fail(body, "plugin '" + d.name + "' must be a map {python: FILE.py:FUNCTION, capabilities: [...]}");
    YAML::Node python, caps;  // (a default YAML::Node is a valid null: presence tracked apart)
    bool has_python = false, has_caps = false;
    for (const auto& [k, v] : entries(body, {"python", "capabilities", "rope"}, "plugin '" + d.name + "'")) {
      if (k.Scalar() == "python") has_python = (python = v, true);
      else if (k.Scalar() == "capabilities") has_caps = (caps = v, true);
      else {
        for (const auto& [rk, rv] : entries(v, {"theta", "style", "rotary_dim"}, "plugin '" + d.name + "': 'rope'")) {
          if (rk.Scalar() == "theta") d.rope.theta = number_value(rv, "theta");
          else if (rk.Scalar() == "style") d.rope.style = choice(rv, "style", {"interleaved", "half"});
          else d.rope.rotary_dim = int_value(rv, "rotary_dim");
        }
      }
    }
    if (!has_python) fail(body, "plugin '" + d.name + "' has no 'python: FILE.py:FUNCTION'");
    const std::string spec = string_value(python, "python");
    const auto colon = spec.rfind(':');
    if (spec.size() > 1 && spec[0] == '@') {  // served by the calling process (headgrad.check)
      d.function = spec;
    } else {
      if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
        fail(python, "'python' must be FILE.py:FUNCTION or MODULE:FUNCTION, got '" + spec + "'");
      std::string file = spec.substr(0, colon);
      if (file.size() > 3 && file.ends_with(".py")) {
        fs::path p = fs::path(file).is_absolute() ? fs::path(file) : dir_ / file;
        std::error_code ec;
        if (!fs::is_regular_file(p, ec)) fail(python, "plugin '" + d.name + "': no file " + p.string());
        file = fs::absolute(p, ec).lexically_normal().string();
      }
      d.function = file + spec.substr(colon);
    }
    if (!has_caps) fail(body, "plugin '" + d.name + "' has no 'capabilities' list (as `headgrad plugins` names them: "
                          "mha, core, causal, bool_mask, cross_lengths, grouped_kv, rope, rope_level, bfloat16, float16)");
    try {
      d.capabilities = pyplug::parse_capabilities(string_list(caps, "capabilities"));
    } catch (const std::invalid_argument& e) {
      fail(caps, "plugin '" + d.name + "': " + e.what());
    }
    out.push_back(std::move(d));
  }
  return out;
}

Suite Parser::parse(std::string_view text) {
  YAML::Node root;
  try {
    // The first document, then at most one more parse to see whether a
    // second one holds anything: not YAML::LoadAll, which loops forever on
    // some malformed input in yaml-cpp 0.7 (a document that consumes nothing).
    const std::string yaml(text);
    root = YAML::Load(yaml);
    std::istringstream stream(yaml);
    YAML::Parser parser(stream);
    DocumentContent first, second;
    if (parser.HandleNextDocument(first) && parser.HandleNextDocument(second) && second.any)
      throw ConfigError({file_.string(), second.mark.line + 1, second.mark.column + 1},
                        "a second YAML document (after '---'): a suite file holds one document; "
                        "put every case under one 'cases:' list, or use two files");
  } catch (const YAML::Exception& e) {
    const SourceLoc where = e.mark.is_null() ? SourceLoc{file_.string(), 0, 0}
                                             : SourceLoc{file_.string(), e.mark.line + 1, e.mark.column + 1};
    // yaml-cpp's depth guard says only "bad file"
    if (dynamic_cast<const YAML::DeepRecursion*>(&e))
      throw ConfigError(where, "malformed YAML: lists and maps nested too deep for the YAML parser (a suite needs "
                               "a few levels)");
    throw ConfigError(where, "malformed YAML: " + e.msg);
  }
  check_duplicate_keys(root, file_);
  if (root.IsNull()) throw ConfigError({file_.string(), 1, 1}, "the suite is empty; it needs at least 'cases:'");

  Suite suite;
  suite.file = file_;
  suite.name = file_.stem().string();
  // (a default-constructed YAML::Node is a valid null node: presence is tracked apart)
  YAML::Node defaults_node, cases_node;
  bool has_defaults = false, has_cases = false;
  for (const auto& [k, v] : entries(root, kTopKeys, "the suite")) {
    const std::string key = k.Scalar();
    if (key == "suite") suite.name = string_value(v, key);
    else if (key == "description") suite.description = string_value(v, key);
    else if (key == "defaults") has_defaults = (defaults_node = v, true);
    else if (key == "plugins") suite.python_plugins = read_python_plugins(v);
    else has_cases = (cases_node = v, true);
  }

  std::map<std::string, Entry> defaults;
  if (has_defaults && !defaults_node.IsNull()) {
    std::vector<std::string> valid = case_keys();
    valid.erase(std::find(valid.begin(), valid.end(), "name"));
    for (const auto& [k, v] : entries(defaults_node, valid, "'defaults'"))
      defaults.emplace(k.Scalar(), Entry{k, v, v, true, false});
  }

  if (!has_cases) throw ConfigError({file_.string(), 1, 1}, "the suite has no 'cases:' list");
  if (!cases_node.IsSequence() || cases_node.size() == 0)
    fail(cases_node, "'cases' must be a non-empty list of cases (each starting with '- name: ...')");
  std::set<std::string> names;
  std::size_t index = 0;
  for (const auto& node : cases_node) {
    for (CaseSpec& c : parse_case(node, index++, defaults)) {
      if (!names.insert(c.name).second)
        throw ConfigError(c.source, "two cases are named '" + c.name + "'; names must be unique");
      suite.cases.push_back(std::move(c));
    }
    case_count_ = suite.cases.size();
  }
  return suite;
}

// atol, rtol and tolerance: the allclose bounds, the rule, the per-tensor k.
void Parser::read_tolerances(std::map<std::string, Entry>& keys, CaseSpec& c) const {
  auto has = [&](const char* key) { return keys.count(key) > 0; };
  auto val = [&](const char* key) -> const YAML::Node& { return keys.at(key).value; };
  for (const char* key : {"atol", "rtol"}) {
    if (!has(key)) continue;
    const double x = number_value(val(key), key);
    if (x < 0) fail(val(key), std::string("'") + key + "' must be >= 0");
    (std::string(key) == "atol" ? c.tolerance.atol : c.tolerance.rtol) = x;
  }
  if (has("tolerance")) {
    const Entry& e = keys["tolerance"];
    if (e.has_default && e.from_case) read_tolerance_map(e.default_value, c);
    read_tolerance_map(e.value, c);
  }
  {
    // atol/rtol written on the case itself (not inherited from defaults) ask for
    // allclose; `tolerance: {rule: ...}` says so outright
    std::string allclose_key;
    for (const char* key : {"atol", "rtol"})
      if (has(key) && keys[key].from_case && allclose_key.empty()) allclose_key = key;
    bool rule_on_case = false;
    if (has("tolerance") && keys["tolerance"].from_case && val("tolerance").IsMap())
      for (const auto& kv : val("tolerance")) {
        const std::string k = kv.first.Scalar();
        if (k == "rule") rule_on_case = true;
        else if (k != "k" && allclose_key.empty()) allclose_key = "tolerance: " + k;
      }
    if (!allclose_key.empty()) {
      if (rule_on_case && c.tolerance_rule == ToleranceRule::relative_to_baseline)
        fail(val("tolerance"), "'tolerance: {rule: relative_to_baseline}' and '" + allclose_key +
                                   "' contradict: atol and rtol are allclose's (drop them, or say rule: allclose)");
      if (!rule_on_case) c.tolerance_rule = ToleranceRule::allclose;
    }
    if (rule_on_case && c.tolerance_rule == ToleranceRule::relative_to_baseline && has("dtype") &&
        c.dtype == DType::float64)
      fail(val("tolerance"), "'tolerance: {rule: relative_to_baseline}' is for dtypes below float64; float64 is "
                             "the checking precision (allclose, atol 1e-8, rtol 1e-6 by default)");
  }
}

// check (the tensors compared) and taps (q and k after the rotation, added to check).
void Parser::read_check_and_taps(std::map<std::string, Entry>& keys, CaseSpec& c) const {
  auto has = [&](const char* key) { return keys.count(key) > 0; };
  auto val = [&](const char* key) -> const YAML::Node& { return keys.at(key).value; };
  // check: the case's own list is taken as written; a list from the defaults
  // keeps the names this level has (so one default serves both levels).
  const auto& level_tensors = tensor_names(c);
  if (has("check")) {
    const Entry& e = keys["check"];
    std::vector<std::string> wanted = string_list(e.value, "check");
    if (wanted.empty()) fail(e.value, "'check' is empty; list the tensors to compare");
    const std::vector<std::string> all = all_tensor_names();
    if (c.bias && !e.from_case) wanted = with_bias_gradients(wanted);
    if (!e.from_case) wanted = with_qk_norm_cross_gradients(wanted, c);
    std::set<std::string> chosen;
    for (const auto& t : wanted) {
      const bool here = std::find(level_tensors.begin(), level_tensors.end(), t) != level_tensors.end();
      if (!here && (e.from_case || std::find(all.begin(), all.end(), t) == all.end())) {
        const std::string near = closest_match(t, level_tensors);
        const bool bias_grad =
            std::find(bias_tensor_names().begin(), bias_tensor_names().end(), t) != bias_tensor_names().end();
        fail(e.value, "'" + t + "' is not a " + std::string(level_name(c.level)) + "-level tensor" +
                          (bias_grad && c.level == Level::mha ? " of a case without 'bias: true'" : "") + " (" +
                          join(level_tensors) + ")" + (near.empty() ? "" : "; did you mean '" + near + "'?"));
      }
      if (here) chosen.insert(t);
    }
    // A defaults list written for the other level (its gradients, maybe out)
    // does not narrow this level's checks.
    const bool other_grads = std::any_of(wanted.begin(), wanted.end(), [&](const std::string& t) {
      return t != "out" && std::find(level_tensors.begin(), level_tensors.end(), t) == level_tensors.end();
    });
    const bool own_grads = std::any_of(chosen.begin(), chosen.end(), [](const std::string& t) { return t != "out"; });
    if (!e.from_case && other_grads && !own_grads) chosen.insert(level_tensors.begin(), level_tensors.end());
    // a gradient list from the defaults brings dsinks to a sinks case
    if (c.sinks && !e.from_case && std::any_of(chosen.begin(), chosen.end(), [](const std::string& t) { return t != "out"; }))
      chosen.insert(sink_tensor_names().begin(), sink_tensor_names().end());
    for (const auto& t : level_tensors)
      if (chosen.count(t)) c.check.push_back(t);
    c.check_strict = e.from_case;
  }
  if (c.check.empty()) c.check = level_tensors;
  if (has("taps")) {
    const YAML::Node& v = val("taps");
    for (const auto& t : string_list(v, "taps")) {
      if (t != "q_rot" && t != "k_rot") {
        const std::string near = closest_match(t, {"q_rot", "k_rot"});
        fail(v, "'taps' takes q_rot and k_rot (q and k after the rotation), got '" + t + "'" +
                    (near.empty() ? "" : " (did you mean '" + near + "'?)"));
      }
      if (std::find(c.taps.begin(), c.taps.end(), t) != c.taps.end()) fail(v, "'taps' lists " + t + " twice");
      c.taps.push_back(t);
    }
    if (!c.taps.empty() && !c.rope) fail(v, "'taps' needs a 'rope:' block (they are q and k after the rotation)");
    if (!c.taps.empty() && c.level == Level::rope)
      fail(v, "'taps' belongs to the mha and core levels; at the rope level out is the rotated tensor");
    c.check.insert(c.check.end(), c.taps.begin(), c.taps.end());
  }
}

// ---- sliding windows, soft-capping, sinks
//   window: {left: L, right: R}   either may be omitted (unbounded), not both; integers >= 0
//   softcap: C                    a number > 0
//   sinks: true                   input sinks [H], gradient dsinks
// A case's own key at the rope level is an error (no attention runs); a default is ignored there.
void Parser::read_window_features(std::map<std::string, Entry>& keys, CaseSpec& c) const {
  const auto has = [&](const char* key) { return keys.count(key) > 0; };
  const auto rope_level = [&](const char* key) {
    if (c.level != Level::rope) return false;
    if (keys[key].from_case)
      fail(keys[key].value, "'" + std::string(key) + "' means nothing at the rope level (no attention runs)");
    return true;  // from the defaults: not this level's
  };
  if (has("window") && !rope_level("window")) {
    const YAML::Node& v = keys["window"].value;
    if (!v.IsMap())
      fail(v, "'window' must be a map {left: L, right: R} (keys p_i - L .. p_i + R; either bound may be omitted), "
              "got " + kind_of(v));
    for (const auto& [k, b] : entries(v, kWindowKeys, "'window'")) {
      const std::int64_t x = int_value(b, "window: " + k.Scalar());
      if (x < 0)
        fail(b, "'window: " + k.Scalar() + "' must be >= 0, got " + std::to_string(x) +
                    " (a Mistral-style window of W keys is {left: W-1, right: 0} with causal)");
      if (x > kMaxWindowBound)
        fail(b, "'window: " + k.Scalar() + "' " + std::to_string(x) + " is past " + std::to_string(kMaxWindowBound) +
                    "; omit the bound for an unbounded side");
      (k.Scalar() == "left" ? c.window.left : c.window.right) = x;
    }
    if (!c.window.enabled())
      fail(v, "'window' is empty; give left, right or both (a Mistral-style window of W keys is "
              "{left: W-1, right: 0} with causal)");
  }
  if (has("softcap") && !rope_level("softcap")) {
    const YAML::Node& v = keys["softcap"].value;
    const double cap = number_value(v, "softcap");
    if (!(cap > 0))
      fail(v, "'softcap' must be > 0 (scores become C tanh(s / C); Gemma 2 uses 50), got " + v.Scalar() +
                  "; drop the key for no cap");
    c.softcap = cap;
  }
  if (has("sinks") && !rope_level("sinks")) c.sinks = bool_value(keys["sinks"].value, "sinks");
}

std::vector<CaseSpec> Parser::parse_case(const YAML::Node& node, std::size_t index,
                                         const std::map<std::string, Entry>& defaults) {
  context_.clear();
  if (!node.IsMap()) fail(node, "case #" + std::to_string(index + 1) + " must be a map with 'name:' and 'compare:'");
  // Name the case in errors from the start when it has a readable name.
  if (const YAML::Node n = node["name"]; n && n.IsScalar() && !n.Scalar().empty())
    context_ = "case '" + n.Scalar() + "': ";
  std::map<std::string, Entry> keys = defaults;
  for (const auto& [k, v] : entries(node, case_keys(), context_.empty() ? "case #" + std::to_string(index + 1) : "the case")) {
    const auto d = defaults.find(k.Scalar());
    Entry e = d != defaults.end() ? Entry{k, v, d->second.default_value, true, true} : Entry{k, v, {}, false, true};
    keys.erase(k.Scalar());
    keys.emplace(k.Scalar(), e);
  }

  CaseSpec c;
  c.source = loc(node);
  if (!keys.count("name")) fail(node, "case #" + std::to_string(index + 1) + " has no 'name'");
  c.name = c.base_name = string_value(keys["name"].value, "name");
  if (c.name.empty()) fail(keys["name"].value, "'name' is empty");
  context_ = "case '" + c.name + "': ";
  for (const auto& [name, e] : keys) {
    // a key with nothing after it: its value's mark points past it, so name the key
    if (e.value.IsNull() && name != "scale") fail(e.key, "'" + name + "' has no value");
    c.key_source[name] = loc(e.value);
  }

  auto has = [&](const char* key) { return keys.count(key) > 0; };
  auto val = [&](const char* key) -> const YAML::Node& { return keys.at(key).value; };

  if (has("level")) {
    const std::string l = choice(val("level"), "level", {"mha", "core", "rope"});
    c.level = l == "mha" ? Level::mha : l == "core" ? Level::core : Level::rope;
  }
  if (has("dtype")) {
    c.dtype = dtype_from_name(choice(val("dtype"), "dtype", {"float64", "float32", "bfloat16", "float16"}));
    c.dtype_on_case = keys["dtype"].from_case;
  }
  if (c.dtype == DType::float32) c.tolerance = {1e-5, 1e-4};  // float32 defaults, unless set below
  if (is_16bit(c.dtype)) c.tolerance = tolerance_16bit(c.dtype);

  if (!has("compare")) fail(node, "no 'compare' list (one plugin with 'reference', or two plugins)");
  c.compare = string_list(val("compare"), "compare");
  if (has("reference")) {
    const std::string ref = string_value(val("reference"), "reference");
    if (ref.empty()) fail(val("reference"), "'reference' is empty");
    c.reference_text = ref;
    c.reference = fs::path(ref).is_absolute() ? fs::path(ref) : dir_ / ref;
  }
  if (c.is_reference() && c.compare.size() != 1)
    fail(val("compare"), "a case with 'reference' compares exactly one plugin against it, got " +
                             std::to_string(c.compare.size()) + " names");
  if (!c.is_reference() && c.compare.size() != 2)
    fail(val("compare"), "'compare' needs two plugins, or one plugin and a 'reference' directory; got " +
                             std::to_string(c.compare.size()) + (c.compare.size() == 1 ? " name" : " names"));
  for (std::size_t i = 0; i < c.compare.size(); ++i)
    if (c.compare[i].empty()) fail(val("compare"), "'compare' has an empty plugin name");

  if (has("causal")) read_causal(val("causal"), c);
  if (has("scale") && !val("scale").IsNull()) {
    const double s = number_value(val("scale"), "scale");
    if (s <= 0) fail(val("scale"), "'scale' must be > 0, got " + val("scale").Scalar());
    c.scale = s;
  }
  if (has("dropout_p")) {
    const double p = number_value(val("dropout_p"), "dropout_p");
    if (p != 0)
      fail(val("dropout_p"),
           "dropout_p must be 0 in a comparison, got " + val("dropout_p").Scalar() +
               ": dropout zeroes a random subset of attention weights, so the two sides draw "
               "different masks and cannot agree; and a module's eval() does not turn it off in a "
               "functional call (F.scaled_dot_product_attention applies dropout_p as passed)");
  }
  if (has("mask")) {
    const YAML::Node& m = val("mask");
    const std::string s = string_value(m, "mask");
    if (s == "causal") {
      if (has("causal") && keys["causal"].from_case == keys["mask"].from_case && !c.causal)
        fail(m, "'mask: causal' contradicts 'causal: false'");
      c.causal = true;
    } else if (s != "none") {
      if (c.level != Level::core)
        fail(m, "a mask file needs 'level: core' (at mha level the only masks are none and causal; "
                "use causal: true)");
      if (fs::path(s).extension() != ".npy")
        fail(m, "'mask' must be none, causal or a .npy file of bools, got '" + s + "'");
      c.mask_file = fs::path(s).is_absolute() ? fs::path(s) : dir_ / s;
    }
  }
  if (has("bias")) {
    // One default serves every level: only a case's own `bias: true` off the mha level is a mistake.
    const bool b = bool_value(val("bias"), "bias");
    if (b && c.level != Level::mha && keys["bias"].from_case)
      fail(val("bias"), "'bias: true' belongs to the mha level (bq, bk, bv, bo on the projections); a " +
                            std::string(level_name(c.level)) + "-level case has no projection");
    c.bias = b && c.level == Level::mha;
  }
  if (has("input_layout")) {
    const std::string s = choice(val("input_layout"), "input_layout", {"contiguous", "transposed", "sliced"});
    c.layout = s == "contiguous" ? InputLayout::contiguous
               : s == "transposed" ? InputLayout::transposed : InputLayout::sliced;
  }
  if (has("seed")) {
    const std::int64_t s = int_value(val("seed"), "seed");
    if (s < 0) fail(val("seed"), "'seed' must be >= 0, got " + std::to_string(s));
    c.seed = static_cast<std::uint64_t>(s);
  }
  read_tolerances(keys, c);
  if (has("timeout")) {
    const double t = number_value(val("timeout"), "timeout");
    if (const std::string problem = timeout_problem(t); !problem.empty())
      fail(val("timeout"), "'timeout' " + problem);
    c.timeout_s = t;
  }
  if (has("rope")) {
    c.rope = read_rope(val("rope"), c.level);
    if (c.is_reference() && (!c.rope->rows.empty() || !c.rope->generator.empty()))
      fail(c.rope->positions_at, "a reference case takes its positions from the reference's positions.npy; "
                                 "its 'rope' block gives theta, style and rotary_dim (an offset at most)");
  }
  read_qk_norm_and_cross(keys, c);
  if (c.level == Level::rope && !c.rope)
    fail(has("level") ? val("level") : node, "'level: rope' needs a 'rope:' block (theta, style, rotary_dim, positions)");
  if (c.level == Level::rope && (c.causal && has("causal") && keys["causal"].from_case))
    fail(val("causal"), "'causal' means nothing at the rope level (no attention runs)");
  if (c.level == Level::rope) c.causal = false;
  if (has("expect")) {
    for (const auto& [k, v] : entries(val("expect"), kExpectKeys, "'expect'")) {
      if (k.Scalar() == "fail") c.expect_fail = bool_value(v, "fail");
      else {
        c.expect_diagnosis = string_value(v, "diagnosis");  // a catalog name: checked by the analysis (analysis/catalog.hpp)
        c.expect_diagnosis_at = loc(v);
      }
    }
    if (!c.expect_diagnosis.empty() && !c.expect_fail)
      fail(val("expect"), "'expect: diagnosis' names the bug a failing case is caught by; it needs 'fail: true' "
                          "(a case expected to pass has no diagnosis)");
  }

  read_window_features(keys, c);
  read_check_and_taps(keys, c);

  if (has("tolerance") && keys["tolerance"].from_case) check_tolerance_keys(val("tolerance"), c);

  check_cross_dims(keys, c);
  std::vector<DimValues> shape, sweep;
  for (const char* key : {"shape", "sweep"}) {
    if (!has(key)) continue;
    const Entry& e = keys[key];
    auto& out = std::string(key) == "shape" ? shape : sweep;
    if (e.has_default && e.from_case) read_dims(e.default_value, c.level, key, true, out);
    read_dims(e.value, c.level, key, !e.from_case, out);
  }
  if (c.is_reference() && !sweep.empty())
    fail(val("sweep"), "a reference case cannot sweep: its shapes come from the reference files");
  return expand(c, shape, sweep);
}

std::vector<CaseSpec> Parser::expand(const CaseSpec& base, const std::vector<DimValues>& shape,
                                     const std::vector<DimValues>& sweep) {
  CaseSpec c = base;
  for (const auto& d : shape) *c.dims.find(d.dim) = d.values.front();
  // Where a sweep point's problems are reported: the sweep, else the shape, else the case.
  const SourceLoc at = !sweep.empty() ? sweep.front().where : !shape.empty() ? shape.front().where : c.source;
  std::map<std::string, SourceLoc> dim_at;  // a sweep's value replaces the shape's
  for (const auto* dims : {&shape, &sweep})
    for (const auto& d : *dims) dim_at[d.dim] = d.where;

  // Counted before anything is expanded: a few lines of sweeps can name millions of points.
  double points = 1;  // a double: the product of many long lists must not wrap
  for (const auto& d : sweep) points *= static_cast<double>(d.values.size());
  if (static_cast<double>(case_count_) + points > static_cast<double>(kMaxSuiteCases)) {
    std::string sizes;
    for (const auto& d : sweep) sizes += (sizes.empty() ? "" : " x ") + std::to_string(d.values.size());
    std::ostringstream count;
    count.precision(15);
    count << points;
    if (sweep.empty())
      fail(c.source, "this case would be case " + std::to_string(case_count_ + 1) + ", and a suite may hold at most " +
                         std::to_string(kMaxSuiteCases) + " cases: split the suite");
    fail(at, "the sweep expands to " + count.str() + " cases (" + sizes + " values)" +
                 (case_count_ ? ", after " + std::to_string(case_count_) + (case_count_ == 1 ? " case" : " cases") +
                                    " before it," : "") +
                 " and a suite may hold at most " + std::to_string(kMaxSuiteCases) +
                 " cases: sweep fewer values, or split the suite");
  }

  std::vector<CaseSpec> out;
  std::vector<std::size_t> pos(sweep.size(), 0);
  while (true) {
    CaseSpec p = c;
    std::string label;
    for (std::size_t i = 0; i < sweep.size(); ++i) {
      const std::int64_t value = sweep[i].values[pos[i]];
      if (std::int64_t* dim = p.dims.find(sweep[i].dim)) *dim = value;
      else apply_feature_sweep(p, sweep[i].dim, value);
      p.sweep_point.emplace_back(sweep[i].dim, value);
      if (sweep[i].values.size() > 1)
        label += (label.empty() ? "" : ",") + sweep[i].dim + "=" + std::to_string(value);
    }
    if (!label.empty()) p.name = c.base_name + "[" + label + "]";
    const std::string saved = context_;
    context_ = "case '" + p.name + "': ";
    check_head_dims(p, at, dim_at);
    finish_cross_dims(p, at);
    finish_point(p, at);
    context_ = saved;
    out.push_back(std::move(p));
    // odometer: the last dim varies fastest
    std::size_t i = sweep.size();
    while (i > 0 && ++pos[i - 1] == sweep[i - 1].values.size()) pos[--i] = 0;
    if (i == 0) break;
  }
  return out;
}

void Parser::finish_point(CaseSpec& c, const SourceLoc& at) const {
  const Dims& d = c.dims;
  if (c.is_reference()) {
    if (c.level == Level::mha && d.H == 0)
      fail(at, "a reference case at mha level needs the head count: shape: {H: ..} (B, T and D come "
               "from the files)");
  } else {
    std::vector<std::string> missing;
    for (const auto& dim : dim_names(c.level))
      if (c.dims.get(dim) == 0 && !(c.level == Level::rope && dim == "H")) missing.push_back(dim);
    if (!missing.empty())
      fail(at, "missing shape dim" + std::string(missing.size() > 1 ? "s " : " ") + join(missing) +
                   " (" + std::string(level_name(c.level)) + " level needs " +
                   join(dim_names(c.level)) + " in 'shape' or 'sweep')");
  }
  if (c.level == Level::mha && d.D > 0 && d.H > 0 && d.d == 0 && d.D % d.H != 0)
    fail(at, "D=" + std::to_string(d.D) + " is not divisible by H=" + std::to_string(d.H) +
                 " (each head takes d = D / H channels; give the head width d in 'shape' for "
                 "Wq [H*d, D])");
  check_rope(c);
}

// ---- QK-norm and cross-attention ----

void Parser::read_qk_norm_and_cross(std::map<std::string, Entry>& keys, CaseSpec& c) const {
  auto has = [&](const char* key) { return keys.count(key) > 0; };
  auto val = [&](const char* key) -> const YAML::Node& { return keys.at(key).value; };
  if (has("qk_norm") && !val("qk_norm").IsNull()) {
    const YAML::Node& v = val("qk_norm");
    bool off = true;
    if (v.IsScalar() && YAML::convert<bool>::decode(v, off) && !off) {
      c.qk_norm.enabled = false;  // `qk_norm: false` turns a default off
    } else {
      if (c.level != Level::mha) {
        if (keys["qk_norm"].from_case)
          fail(v, "'qk_norm' belongs to the mha level (RMSNorm of the projected q and k); a " +
                      std::string(level_name(c.level)) + "-level case has no projection");
      } else {
        if (!v.IsMap())
          fail(v, "'qk_norm' must be a map {axis: head|model, eps: 1.0e-6, gain: w|one_plus_w} (or false), got " +
                      kind_of(v));
        c.qk_norm.enabled = true;
        for (const auto& [k, kv] : entries(v, kQkNormKeys, "'qk_norm'")) {
          const std::string key = k.Scalar();
          if (kv.IsNull()) fail(k, "'qk_norm: " + key + "' has no value");
          if (key == "axis") {
            c.qk_norm.axis = choice(kv, "qk_norm: axis", {"head", "model"}) == "head" ? QkNormAxis::head : QkNormAxis::model;
          } else if (key == "gain") {
            c.qk_norm.gain = choice(kv, "qk_norm: gain", {"w", "one_plus_w"}) == "w" ? QkNormGain::w : QkNormGain::one_plus_w;
          } else {
            c.qk_norm.eps = number_value(kv, "qk_norm: eps");
            if (!(c.qk_norm.eps > 0) || c.qk_norm.eps > 1)
              fail(kv, "'qk_norm: eps' must be in (0, 1] (added to mean(x^2) under the root, e.g. 1.0e-6), got " +
                           kv.Scalar());
          }
        }
      }
    }
  }
  if (has("cross")) {
    const bool b = bool_value(val("cross"), "cross");
    if (b && c.level != Level::mha && keys["cross"].from_case)
      fail(val("cross"), "'cross: true' belongs to the mha level (k and v projected from x_kv); at the core level "
                         "give Tq and Tk");
    c.cross = b && c.level == Level::mha;
    // cross-attention has no causal mask unless the case itself asks for one (a default's causal: true stays out)
    if (c.cross && !(keys.count("causal") && keys["causal"].from_case) &&
        !(keys.count("mask") && keys["mask"].from_case))
      c.causal = false;
  }
  if (c.cross && c.rope)
    fail(has("rope") && keys["rope"].from_case ? val("rope") : val("cross"),
         "'rope' with 'cross: true': RoPE is not defined for cross-attention (the query and key streams' "
         "positions are unrelated); drop one of them");
}

void Parser::check_cross_dims(std::map<std::string, Entry>& keys, const CaseSpec& c) const {
  if (c.level != Level::mha || c.cross) return;
  for (const char* key : {"shape", "sweep"}) {
    if (!keys.count(key) || !keys[key].from_case || !keys[key].value.IsMap()) continue;
    for (auto it = keys[key].value.begin(); it != keys[key].value.end(); ++it)
      if (it->first.IsScalar() && (it->first.Scalar() == "Tq" || it->first.Scalar() == "Tk"))
        fail(it->first, "'" + it->first.Scalar() + "' at the mha level is for 'cross: true' (queries from x [B, Tq, D], "
                        "keys and values from x_kv [B, Tk, D]); self-attention gives T");
  }
}

void Parser::finish_cross_dims(CaseSpec& c, const SourceLoc& at) const {
  if (c.level != Level::mha) return;
  if (!c.cross) {  // a case's own Tq, Tk were refused by check_cross_dims; the defaults' serve core cases
    c.dims.Tq = c.dims.Tk = 0;
    return;
  }
  if (c.is_reference()) return;  // the files give Tq (x) and Tk (x_kv)
  if (c.dims.Tq == 0 || c.dims.Tk == 0)
    fail(at, "'cross: true' needs the query and key lengths: shape: {Tq: .., Tk: ..} (x [B, Tq, D], x_kv [B, Tk, D])");
  c.dims.T = c.dims.Tq;  // x's length, as every mha-level step reads it
}

void Parser::check_head_dims(const CaseSpec& c, const SourceLoc& at,
                             const std::map<std::string, SourceLoc>& dim_at) const {
  const Dims& d = c.dims;
  auto where = [&](const char* dim) {
    const auto it = dim_at.find(dim);
    return it != dim_at.end() ? it->second : at;
  };
  if (d.Hkv == 0 || d.H == 0) return;  // a reference case may take H from its files
  const std::string hkv = "Hkv=" + std::to_string(d.Hkv), h = "H=" + std::to_string(d.H);
  if (d.Hkv > d.H)
    fail(where("Hkv"), "'Hkv' is " + hkv + " but there are only " + h +
                           " query heads; Hkv must be at most H (Hkv = H is plain multi-head, 1 is MQA)");
  if (d.H % d.Hkv != 0)
    fail(where("Hkv"), "'Hkv': " + h + " is not a multiple of " + hkv +
                           " (each kv head serves G = H / Hkv query heads: query head h reads kv head h / G)");
}

}  // namespace

Suite parse_suite(std::string_view yaml_text, const fs::path& file) {
  return Parser(file).parse(yaml_text);
}

void check_suite_file(const fs::path& file) {
  const SourceLoc where{file.string(), 0, 0};
  std::error_code ec;
  const fs::file_status st = fs::status(file, ec);  // stat: a fifo or device is not opened
  if (ec || !fs::exists(st)) throw ConfigError(where, "cannot read the suite file: " + (ec ? ec.message() : "no such file"));
  if (fs::is_directory(st)) throw ConfigError(where, "is a directory; a suite is a YAML file");
  if (!fs::is_regular_file(st))
    throw ConfigError(where, "is not a regular file (a device, fifo or socket); a suite is a YAML file");
  const std::uintmax_t size = fs::file_size(file, ec);
  if (ec) throw ConfigError(where, "cannot read the suite file: " + ec.message());
  if (size > kMaxSuiteFileBytes)
    throw ConfigError(where, "is " + std::to_string(size) + " bytes; a suite file may hold at most " +
                                 std::to_string(kMaxSuiteFileBytes) + " bytes (16 MiB)");
}

double case_memory_bytes(const CaseSpec& c) {
  const Dims& d = c.dims;
  if (c.level == Level::rope)  // x, r, out, dx, the cos/sin tables, a side's copies: a few times x
    return 8.0 * static_cast<double>(d.B) * static_cast<double>(std::max<std::int64_t>(d.H, 1)) *
           static_cast<double>(d.T) * static_cast<double>(d.d) * static_cast<double>(dtype_size(c.dtype));
  AttentionDims a;
  a.mha = c.level == Level::mha;
  a.B = static_cast<double>(d.B);
  a.H = static_cast<double>(d.H);
  a.Hkv = static_cast<double>(d.kv_heads());
  a.d = static_cast<double>(d.head_dim());
  a.D = static_cast<double>(d.D);
  a.Tq = static_cast<double>(a.mha ? d.T : d.Tq);
  a.Tk = static_cast<double>(a.mha ? c.kv_length() : d.Tk);
  const double need = attention_bytes(a, static_cast<double>(dtype_size(c.dtype)));
  // Judged relative_to_baseline, the case also runs the oracle in float64 (the
  // golden): per_head, everything in 8 bytes, whose heads hold one head's
  // [Tq, Tk] buffers at a time once all of them would pass
  // kOracleRecomputeAboveBytes. A reference's own golden/ folder runs nothing.
  const bool oracle_golden = c.relative_rule() && !(c.files && !c.files->golden.empty());
  if (!oracle_golden || c.dtype == DType::float64) return need;
  a.one_head_at_a_time = a.B * a.H * a.Tq * a.Tk * 8.0 > kOracleRecomputeAboveBytes;
  return std::max(need, attention_bytes(a, 8.0));
}

void check_memory(const std::vector<const CaseSpec*>& cases, double budget_bytes, const std::string& budget_source) {
  for (const CaseSpec* c : cases) {
    const double need = case_memory_bytes(*c);
    if (need <= budget_bytes) continue;
    const bool overflows = need / static_cast<double>(dtype_size(c->dtype)) > 9.2e18;
    throw ConfigError(c->source, "case '" + c->name + "': " + describe_case(*c) + " needs about " +
                                     format_bytes(need) +
                                     " of memory (inputs, outputs, gradients and the [B, H, Tq, Tk] score "
                                     "buffers a plugin holds)" +
                                     (overflows ? ", more elements than 64-bit sizes can count, and" : ",") +
                                     " more than the budget of " +
                                     format_bytes(budget_bytes) + " (" + budget_source +
                                     "); use a smaller shape, or --max-memory SIZE");
  }
}

std::vector<std::pair<std::string, std::string>> missing_capabilities(const CaseSpec& c,
                                                                      const Capabilities& caps) {
  std::vector<std::pair<std::string, std::string>> out;
  if (c.level == Level::mha && !caps.mha) out.emplace_back(capability_name(&Capabilities::mha), "the case is at mha level");
  if (c.level == Level::core && !caps.core) out.emplace_back(capability_name(&Capabilities::core), "the case is at core level");
  if (c.level == Level::rope && !caps.rope_level) out.emplace_back(capability_name(&Capabilities::rope_level), "the case is at rope level");
  if (c.causal && !caps.causal) out.emplace_back(capability_name(&Capabilities::causal), "the case is causal");
  if (!c.mask_file.empty() && !caps.bool_mask)
    out.emplace_back(capability_name(&Capabilities::bool_mask), "the case has a boolean mask (" + c.mask_file.filename().string() + ")");
  if (c.level == Level::core && c.dims.Tq != c.dims.Tk && !caps.cross_lengths)
    out.emplace_back(capability_name(&Capabilities::cross_lengths), "Tq=" + std::to_string(c.dims.Tq) + ", Tk=" + std::to_string(c.dims.Tk));
  if (c.dims.Hkv > 0 && c.dims.Hkv < c.dims.H && !caps.grouped_kv)
    out.emplace_back(capability_name(&Capabilities::grouped_kv), "H=" + std::to_string(c.dims.H) + " query heads share Hkv=" +
                                       std::to_string(c.dims.Hkv) + " kv heads");
  if (c.dtype == DType::float32 && !caps.float32) out.emplace_back(capability_name(&Capabilities::float32), "dtype: float32");
  if (c.dtype == DType::float64 && !caps.float64) out.emplace_back(capability_name(&Capabilities::float64), "dtype: float64");
  // 16-bit support is declared in Capabilities::extra ("bfloat16", "float16"): no ABI change
  if (is_16bit(c.dtype) && std::find(caps.extra.begin(), caps.extra.end(), dtype_name(c.dtype)) == caps.extra.end())
    out.emplace_back(std::string(dtype_name(c.dtype)), "dtype: " + std::string(dtype_name(c.dtype)));
  if (c.rope && c.level != Level::rope && !caps.rope) out.emplace_back(capability_name(&Capabilities::rope), "the case has a 'rope:' block");
  if (c.bias && !caps.bias)
    out.emplace_back(capability_name(&Capabilities::bias), "the case has 'bias: true' (bq, bk, bv, bo on the projections)");
  if (c.level == Level::mha && c.qk_norm.enabled && !caps.qk_norm)
    out.emplace_back(capability_name(&Capabilities::qk_norm), "the case has 'qk_norm' (RMSNorm of q and k, gains q_norm and k_norm)");
  if (c.level == Level::mha && c.cross && !caps.cross_attention)
    out.emplace_back(capability_name(&Capabilities::cross_attention), "the case has 'cross: true' (k and v from x_kv)");
  // sliding windows, soft-capping, sinks
  if (c.window.enabled() && !caps.window)
    out.emplace_back(capability_name(&Capabilities::window), "the case has a 'window:' (keys p_i - left .. p_i + right)");
  if (c.softcap > 0 && !caps.softcap)
    out.emplace_back(capability_name(&Capabilities::softcap), "the case has 'softcap:' (scores capped to C tanh(s / C))");
  if (c.sinks && !caps.sinks)
    out.emplace_back(capability_name(&Capabilities::sinks), "the case has 'sinks: true' (a sink logit per query head, input sinks)");
  return out;
}

void check_capabilities(const std::vector<const CaseSpec*>& cases, const PluginRegistry& registry) {
  for (const CaseSpec* c : cases) {
    for (const auto& name : c->compare) {
      const LoadedPlugin* p = registry.find(name);
      if (!p) continue;
      const auto missing = missing_capabilities(*c, p->info.capabilities);
      if (missing.empty()) continue;
      const auto& [cap, why] = missing.front();
      std::string also;  // every other missing one too, so that one fix is not followed by the next refusal
      for (std::size_t i = 1; i < missing.size(); ++i)
        also += (also.empty() ? "; it also lacks '" : ", '") + missing[i].first + "' (" + missing[i].second + ")";
      throw ConfigError(c->where("compare"),
                        "case '" + c->name + "': plugin '" + name + "' lacks the capability '" + cap +
                            "' (" + why + ")" + also + "; it declares: " + capabilities_str(p->info.capabilities));
    }
  }
}

}  // namespace headgrad::runner
