#include "pyplug/check_suite.hpp"

#include <algorithm>
#include <functional>
#include <fstream>
#include <sstream>

#include <headgrad/npy.hpp>

namespace fs = std::filesystem;

namespace headgrad::pyplug {

namespace {

constexpr const char* kBiasNames[] = {"bq", "bk", "bv", "bo"};

Tensor bool_mask(std::int64_t bn, std::int64_t tq, std::int64_t tk,
                 const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& attend) {
  std::vector<double> v;
  for (std::int64_t b = 0; b < bn; ++b)
    for (std::int64_t i = 0; i < tq; ++i)
      for (std::int64_t j = 0; j < tk; ++j) v.push_back(attend(b, i, j));
  return Tensor::from_values(v, {bn, 1, tq, tk}, DType::boolean);
}

// Batch item b pads its last b + 1 keys away; each query also skips keys j
// with (i + j) % 4 == 3, never its last valid key (the template's padding mask).
Tensor padding_mask(std::int64_t bn, std::int64_t tq, std::int64_t tk) {
  return bool_mask(bn, tq, tk, [tk](std::int64_t b, std::int64_t i, std::int64_t j) {
    const std::int64_t valid = tk - (b + 1);
    return j < valid && ((i + j) % 4 != 3 || j == valid - 1);
  });
}

// Batch item b's query row (2b + 1) % Tq has every key masked (a cap applied
// after the mask leaks into it; with sinks all its mass is on the sink); the
// other rows skip the keys j with (i + j) % 3 == 2, never all of them.
Tensor empty_row_mask(std::int64_t bn, std::int64_t tq, std::int64_t tk) {
  return bool_mask(bn, tq, tk, [tq](std::int64_t b, std::int64_t i, std::int64_t j) {
    return i != (2 * b + 1) % tq && ((i + j) % 3 != 2 || j == 0);
  });
}

struct Rope {
  std::string theta = "10000", style = "interleaved", rotary_dim;
};

Rope parse_rope(const std::string& text) {
  Rope r;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (eq == std::string::npos || value.empty())
      throw std::invalid_argument("--rope item '" + item + "' is not KEY=VALUE (theta=.., style=.., rotary_dim=..)");
    if (key == "theta") r.theta = value;
    else if (key == "style") {
      if (value != "interleaved" && value != "half")
        throw std::invalid_argument("--rope style must be interleaved or half, got '" + value + "'");
      r.style = value;
    } else if (key == "rotary_dim") r.rotary_dim = value;
    else throw std::invalid_argument("--rope key '" + key + "' is not theta, style or rotary_dim");
  }
  return r;
}

// The features of current models a function is checked on: those whose
// arguments its signature names itself (not through **kwargs alone).
struct Features {
  bool window = false, softcap = false, sinks = false, qk_norm = false, cross = false;
};

Features features_of(const CheckOptions& o, const FunctionInfo& f) {
  auto names = [&](const char* kw) { return std::find(f.declared.begin(), f.declared.end(), kw) != f.declared.end(); };
  Features x;
  if (!o.features || o.level == "rope") return x;
  x.window = names("window");
  x.softcap = names("softcap");
  x.sinks = names("sinks");
  x.qk_norm = o.level == "mha" && names("q_norm") && names("k_norm");
  x.cross = o.level == "mha" && names("x_kv");
  return x;
}

// The cases of each feature, at the shapes where its known bugs show: a
// window of 4 keys at T 11 (T <= W + 1 hides an off-by-one), a cap of 0.75
// so that scores reach 3-5 times it, sinks of U(-1, 3) (the case inputs'),
// a fully masked row (a cap after the mask leaks into it; a sink takes all
// of it), per-dim QK-norm gains at H 6, cross-attention at Tq != Tk. `noncausal`:
// the function can run a non-causal case; `r`: the RoPE key of a case.
void write_feature_cases(std::ostream& y, const CheckOptions& o, const FunctionInfo& f, const Features& x,
                         bool noncausal, const std::string& r, const fs::path& dir) {
  const std::int64_t n = o.kv_heads;
  const bool core = o.level == "core";
  const std::string lvl = core ? "    level: core\n" : "";
  // a core case at Tq = Tk = T, an MHA one at T with D = H d
  auto shape = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t hkv) {
    std::ostringstream s;
    s << "    shape: {B: " << b << (core ? ", Tq: " + std::to_string(t) + ", Tk: " + std::to_string(t) : ", T: " + std::to_string(t))
      << (core ? ", d: 8" : ", D: " + std::to_string(4 * h)) << ", H: " << h;
    if (hkv) s << ", Hkv: " << hkv;
    s << "}\n";
    return s.str();
  };
  const std::string not_causal = "    causal: false\n";
  const bool empty_row = core && f.takes("mask") && noncausal;
  if (empty_row) {
    fs::create_directories(dir / "masks");
    write_npy(dir / "masks" / "empty_row_B2_Tq4_Tk6.npy", empty_row_mask(2, 4, 6));
  }
  const std::string empty_row_case = lvl + not_causal + "    mask: masks/empty_row_B2_Tq4_Tk6.npy\n    shape: {B: 2, H: 6, Tq: 4, Tk: 6, d: 8}\n";
  if (x.window) {
    y << "  - name: window, W = 4 keys\n" << lvl << "    window: {left: 3, right: 0}\n" << shape(2, 11, 6, 0) << r;
    if (noncausal) {
      y << "  - name: window, two-sided, not causal\n" << lvl << not_causal << "    window: {left: 2, right: 1}\n"
        << shape(2, 12, 6, 0) << r;
      y << "  - name: window, right bound only\n" << lvl << not_causal << "    window: {right: 1}\n" << shape(2, 10, 6, 0) << r;
    }
    if (core && f.takes("mask") && f.takes("causal"))  // handed as the whole mask, causal off
      y << "  - name: window, decode step\n" << lvl << "    causal: bottom_right\n    window: {left: 3, right: 0}\n"
        << "    shape: {B: 2, H: 6, Tq: 3, Tk: 11, d: 8}\n" << r;
  }
  if (x.softcap) {
    y << "  - name: softcap, scores at 3-5 C\n" << lvl << "    softcap: 0.75\n" << shape(2, 11, 6, 0) << r;
    if (noncausal) y << "  - name: softcap, not causal\n" << lvl << not_causal << "    softcap: 0.75\n" << shape(2, 12, 6, 0) << r;
    if (empty_row) y << "  - name: softcap, a fully masked row\n    softcap: 0.75\n" << empty_row_case << r;
  }
  if (x.sinks) {
    y << "  - name: sinks\n" << lvl << "    sinks: true\n" << shape(2, 11, 6, 0) << r;
    if (n)  // B apart from H and Hkv; H 3n, not n^2 (a wrong per-head stride lands right at H = Hkv^2)
      y << "  - name: sinks, grouped kv heads\n" << lvl << "    sinks: true\n" << shape(3, 9, 3 * n, n) << r;
    if (empty_row) y << "  - name: sinks, a fully masked row\n    sinks: true\n" << empty_row_case << r;
  }
  if (x.window && x.softcap && x.sinks)
    y << "  - name: window, softcap and sinks\n" << lvl << "    window: {left: 3, right: 0}\n    softcap: 0.75\n"
      << "    sinks: true\n" << shape(2, 12, 6, n ? 3 : 0) << r;
  if (x.qk_norm) {
    y << "  - name: qk_norm, per head\n    qk_norm: {axis: head, eps: 1.0e-6, gain: w}\n" << shape(2, 7, 6, 0) << r;
    if (f.takes("qk_norm"))  // a function without it normalizes as the defaults only
      y << "  - name: qk_norm, whole projection, gain 1 + w\n    qk_norm: {axis: model, eps: 1.0e-6, gain: one_plus_w}\n"
        << "    input_layout: transposed\n" << shape(2, 6, 6, 0) << r;
    if (n) y << "  - name: qk_norm, grouped kv heads\n    qk_norm: {axis: head, eps: 1.0e-6, gain: w}\n" << shape(3, 7, 3 * n, n) << r;
  }
  if (x.cross) {  // no RoPE: the two streams' positions are unrelated; not causal where the function can
    const std::string c = noncausal ? not_causal : "";
    y << "  - name: cross, Tq != Tk\n    cross: true\n" << c << "    shape: {B: 2, Tq: 5, Tk: 9, D: 24, H: 6}\n";
    y << "  - name: cross, more queries than keys\n    cross: true\n" << c << "    input_layout: sliced\n"
      << "    shape: {B: 2, Tq: 9, Tk: 5, D: 24, H: 6}\n";
    if (n)
      y << "  - name: cross, grouped kv heads\n    cross: true\n" << c << "    shape: {B: 2, Tq: 5, Tk: 9, D: " << 24 * n
        << ", H: " << 3 * n << ", Hkv: " << n << "}\n";
  }
}

std::string rope_block(const Rope& r, bool gapped) {
  std::string s = "{theta: " + r.theta + ", style: " + r.style;
  if (!r.rotary_dim.empty()) s += ", rotary_dim: " + r.rotary_dim;
  if (gapped) s += ", positions: {generator: gapped, start: 1000}";
  return s + "}";
}

}  // namespace

std::string check_plugin_name(const std::string& function) {
  std::string name = function.substr(function.rfind(':') + 1);
  if (!name.empty() && name[0] == '@') name = name.substr(1);
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') c = '_';
  return name.empty() ? "python_function" : name;
}

fs::path write_check_suite(const CheckOptions& o, const FunctionInfo& f, const fs::path& dir) {
  if (o.level != "mha" && o.level != "core" && o.level != "rope")
    throw std::invalid_argument("--level must be mha, core or rope, got '" + o.level + "'");
  if (o.level == "rope" && o.kv_heads) throw std::invalid_argument("--kv-heads has no meaning at the rope level");
  if (o.kv_heads < 0) throw std::invalid_argument("--kv-heads must be >= 1");
  const std::string name = check_plugin_name(o.function);
  const bool takes_causal = f.takes("causal");
  const bool causal = o.causal.value_or(true);
  const bool both = takes_causal && !o.causal.has_value() ? true : takes_causal;  // non-causal cases too
  const bool rope_on = !o.rope.empty() || o.level == "rope";
  const Rope rope = parse_rope(o.rope);
  const bool positions = f.takes("positions");
  // Biases: a function whose signature names all four (not through **kwargs
  // alone) is checked with them, every MHA case; --bias / --no-bias decide.
  const bool names_biases = std::all_of(std::begin(kBiasNames), std::end(kBiasNames), [&](const char* b) {
    return std::find(f.declared.begin(), f.declared.end(), b) != f.declared.end();
  });
  if (o.bias.value_or(false) && o.level != "mha")
    throw std::invalid_argument("--bias is an MHA-level setting (the biases of the projections), not --level " + o.level);
  if (o.bias.value_or(false) && !f.takes("bq"))
    throw std::invalid_argument("--bias: " + o.function + " takes no bq, bk, bv, bo arguments (at " + f.where + ")");
  const bool bias = o.level == "mha" && o.bias.value_or(names_biases);

  std::vector<std::string> caps;
  if (o.level == "rope") caps = {"rope_level"};
  else caps = {o.level};
  if (o.level != "rope" && (causal || takes_causal)) caps.push_back("causal");
  if (o.level == "core") caps.push_back("cross_lengths");
  if (o.level == "core" && f.takes("mask")) caps.push_back("bool_mask");
  if (o.kv_heads || o.level == "core") caps.push_back("grouped_kv");
  if (rope_on) caps.push_back("rope");
  if (o.dtype == "bfloat16" || o.dtype == "float16") caps.push_back(o.dtype);
  if (bias) caps.push_back("bias");
  const Features features = features_of(o, f);
  for (const auto& [on, cap] : {std::pair{features.window, "window"}, {features.softcap, "softcap"},
                                {features.sinks, "sinks"}, {features.qk_norm, "qk_norm"},
                                {features.cross, "cross_attention"}})
    if (on) caps.push_back(cap);
  const bool noncausal = both || !causal;

  std::ostringstream y;
  y << "# Written by `headgrad check " << o.function << "`: " << name << " against per_head.\n";
  y << "suite: check " << name << "\n";
  y << "plugins:\n  " << name << ":\n    python: \"" << o.function << "\"\n    capabilities: [";
  for (std::size_t i = 0; i < caps.size(); ++i) y << (i ? ", " : "") << caps[i];
  y << "]\n";
  if (!o.rope.empty()) {
    // what the function does when it takes no keyword for it
    y << "    rope: {theta: " << rope.theta << ", style: " << rope.style;
    if (!rope.rotary_dim.empty()) y << ", rotary_dim: " << rope.rotary_dim;
    y << "}\n";
  }
  y << "defaults:\n  compare: [" << name << ", per_head]\n  dtype: float64\n  seed: 0\n";
  if (o.level != "rope") y << "  causal: " << (causal ? "true" : "false") << "\n";
  if (bias) y << "  bias: true\n";  // the function as it is; localization varies it (bias off)
  y << "cases:\n";
  auto rope_key = [&](bool gapped) { return rope_on ? "    rope: " + rope_block(rope, gapped && positions) + "\n" : std::string(); };
  const std::string extra_dtype = o.dtype.empty() || o.dtype == "float64" ? "" : o.dtype;

  if (o.level == "mha") {
    const std::string r = rope_key(true);
    y << "  - name: closed-book\n    shape: {B: 2, T: 3, D: 8, H: 2}\n" << rope_key(false);
    y << "  - name: heads, lengths, batches\n    sweep: {B: [1, 2], T: [1, 5, 17], H: [1, 2, 4], D: [24]}\n" << r;
    if (both && causal)
      y << "  - name: not causal\n    causal: false\n    sweep: {B: [2], T: [4, 9], H: [1, 3], D: [12]}\n" << r;
    y << "  - name: non-contiguous input\n    input_layout: transposed\n    sweep: {B: [2], T: [5, 17], H: [2, 4], D: [24]}\n" << r;
    y << "  - name: sliced input\n    input_layout: sliced\n    shape: {B: 2, T: 7, D: 16, H: 4}\n" << r;
    if (f.takes("head_dim"))  // a function that reads d from D / H cannot run it
      y << "  - name: head width below D / H\n    shape: {B: 2, T: 5, D: 12, H: 3, d: 6}\n" << r;
    y << "  - name: float32\n    dtype: float32\n    shape: {B: 2, T: 9, D: 16, H: 4}\n" << r;
    // RoPE settings the function takes: a base other than 10000, a partial rotary width
    Rope other = rope;
    if (rope_on && f.takes("theta")) {
      other.theta = "500000";
      y << "  - name: rope theta 500000\n    shape: {B: 2, T: 7, D: 24, H: 4}\n    rope: " << rope_block(other, positions) << "\n";
    }
    if (rope_on && f.takes("rotary_dim")) {
      other.rotary_dim = "4";
      y << "  - name: partial rotary\n    shape: {B: 2, T: 7, D: 24, H: 4}\n    rope: " << rope_block(other, positions) << "\n";
    }
    if (o.kv_heads) {
      const std::int64_t n = o.kv_heads;
      // G = 2 and G = 4; B = 3, apart from H and Hkv (a head/batch axis mix-up shows)
      y << "  - name: grouped kv heads\n    shape: {B: 3, T: 7, D: " << 8 * n << ", H: " << 2 * n << ", Hkv: " << n << "}\n" << r;
      y << "  - name: grouped kv heads, G = 4\n    shape: {B: 3, T: 5, D: " << 16 * n << ", H: " << 4 * n << ", Hkv: " << n
        << "}\n" << r;
      y << "  - name: grouped kv heads, non-contiguous\n    input_layout: transposed\n    shape: {B: 3, T: 6, D: " << 12 * n
        << ", H: " << 3 * n << ", Hkv: " << n << "}\n" << r;
    }
    if (!extra_dtype.empty() && extra_dtype != "float32")
      y << "  - name: " << extra_dtype << "\n    dtype: " << extra_dtype << "\n    shape: {B: 2, T: 9, D: 16, H: 4}\n" << r;
    write_feature_cases(y, o, f, features, noncausal, r, dir);
  } else if (o.level == "core") {
    const std::string r = rope_key(false);
    y << "  - name: closed-book\n    level: core\n    shape: {B: 2, H: 2, Tq: 3, Tk: 3, d: 4}\n" << r;
    y << "  - name: heads, lengths, batches\n    level: core\n    sweep: {B: [1, 2], Tq: [1, 5], Tk: [5, 9], H: [1, 3]}\n"
         "    shape: {d: 4}\n" << r;
    if (both && causal)
      y << "  - name: not causal\n    level: core\n    causal: false\n    shape: {B: 2, H: 3, Tq: 5, Tk: 7, d: 4}\n" << r;
    y << "  - name: non-contiguous input\n    level: core\n    input_layout: transposed\n    shape: {B: 2, H: 3, Tq: 6, Tk: 6, d: 4}\n" << r;
    y << "  - name: sliced input\n    level: core\n    input_layout: sliced\n    shape: {B: 2, H: 2, Tq: 5, Tk: 5, d: 4}\n" << r;
    y << "  - name: decode step, Tq = 1\n    level: core\n    shape: {B: 2, H: 2, Tq: 1, Tk: 7, d: 4}\n" << r;
    y << "  - name: more queries than keys\n    level: core\n    shape: {B: 2, H: 2, Tq: 6, Tk: 4, d: 4}\n" << r;
    y << "  - name: float32\n    level: core\n    dtype: float32\n    shape: {B: 2, H: 3, Tq: 7, Tk: 7, d: 8}\n" << r;
    if (o.kv_heads)
      y << "  - name: grouped kv heads\n    level: core\n    shape: {B: 2, H: " << 3 * o.kv_heads << ", Hkv: " << o.kv_heads
        << ", Tq: 5, Tk: 5, d: 4}\n" << r;
    if (f.takes("mask")) {
      fs::create_directories(dir / "masks");
      write_npy(dir / "masks" / "padding_B2_Tq5_Tk7.npy", padding_mask(2, 5, 7));
      y << "  - name: boolean mask, padding and holes\n    level: core\n    causal: " << (causal && !both ? "true" : "false")
        << "\n    mask: masks/padding_B2_Tq5_Tk7.npy\n    shape: {B: 2, H: 3, Tq: 5, Tk: 7, d: 4}\n" << r;
    }
    if (f.takes("scale"))
      y << "  - name: large logits\n    level: core\n    scale: 2000\n    shape: {B: 2, H: 2, Tq: 4, Tk: 4, d: 4}\n" << r;
    if (!extra_dtype.empty() && extra_dtype != "float32")
      y << "  - name: " << extra_dtype << "\n    level: core\n    dtype: " << extra_dtype
        << "\n    shape: {B: 2, H: 3, Tq: 7, Tk: 7, d: 8}\n" << r;
    write_feature_cases(y, o, f, features, noncausal, r, dir);
  } else {
    const std::string r = rope_key(true);
    y << "  - name: rotation\n    level: rope\n    shape: {B: 2, T: 9, d: 16}\n" << r;
    y << "  - name: rotation with heads\n    level: rope\n    shape: {B: 2, H: 3, T: 5, d: 8}\n" << r;
    y << "  - name: rotation, float32\n    level: rope\n    dtype: float32\n    shape: {B: 2, T: 9, d: 16}\n" << r;
    y << "  - name: rotation, non-contiguous\n    level: rope\n    input_layout: transposed\n    shape: {B: 2, T: 6, d: 8}\n" << r;
    Rope other = rope;
    if (f.takes("theta")) {
      other.theta = "500000";
      y << "  - name: rotation, theta 500000\n    level: rope\n    shape: {B: 2, T: 9, d: 16}\n    rope: "
        << rope_block(other, true) << "\n";
    }
    if (f.takes("rotary_dim")) {
      other.rotary_dim = "8";
      y << "  - name: partial rotation\n    level: rope\n    shape: {B: 2, T: 9, d: 16}\n    rope: " << rope_block(other, true)
        << "\n";
    }
  }
  fs::create_directories(dir);
  const fs::path file = dir / "suite.yaml";
  std::ofstream(file) << y.str();
  return file;
}

}  // namespace headgrad::pyplug
