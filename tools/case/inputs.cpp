#include "case/inputs.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <headgrad/log.hpp>
#include <headgrad/npy.hpp>
#include <headgrad/ops.hpp>

#include "case/budget.hpp"

namespace fs = std::filesystem;

namespace headgrad::runner {

namespace {

std::atomic<std::size_t> g_files_read{0};

// Every read of a case's .npy file goes through here (an .npz archive counts
// once, when it is opened): regular files only, at most max_bytes of data.
Tensor read_case_npy(const fs::path& file, const NpyLimits& limits = {}) {
  ++g_files_read;
  return read_npy(file, limits);
}

// What a file whose shape the case does not fix yet may hold: no more than
// the memory the case may use at all.
std::uint64_t max_file_bytes() {
  static const double budget = memory_budget(std::nullopt).bytes;
  return budget >= 1.8e19 ? std::numeric_limits<std::uint64_t>::max() : static_cast<std::uint64_t>(budget);
}

// Something is at `path` (a file, a folder, a fifo, a dangling symlink): not "missing".
bool something_at(const fs::path& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(path, ec));
}

// Machine epsilon of a dtype: how far apart the golden (float64) and a
// reference's own tensors (in the dtype) may be, normwise, is a multiple of it.
double dtype_epsilon(DType d) {
  switch (d) {
    case DType::float16: return 0x1p-10;
    case DType::bfloat16: return 0x1p-7;
    case DType::float32: return 0x1p-23;
    default: return 0x1p-52;
  }
}

// The committed 16-bit and float32 references are 1-3 epsilons apart from
// their golden/ normwise; 32 leaves room for bigger shapes and still refuses a
// golden that is zeroed, scaled, negated or another tensor's.
constexpr double kGoldenEpsilons = 32;

// A reference directory's golden/ float64 tensors, one per expected tensor;
// empty when the folder is absent. A golden that is not float64, is shaped
// unlike its expected tensor, or holds NaN/Inf is a ConfigError naming it.
TensorSet read_reference_golden(const CaseSpec& c, const TensorSet& expected) {
  const fs::path dir = c.reference / "golden";
  std::error_code ec;
  if (c.reference.extension() == ".npz" || !something_at(dir)) return {};
  if (!fs::is_directory(dir, ec)) {
    const std::string problem = not_regular_file(dir);
    throw ConfigError(c.where("reference"), "case '" + c.name + "': " + c.reference_text + "/golden " +
                                                (problem.empty() ? "is a file" : problem) +
                                                "; golden/ is a folder of float64 .npy files");
  }
  TensorSet golden;
  for (const auto& [name, want] : expected) {
    const fs::path file = dir / (name + ".npy");
    const std::string shown = c.reference_text + "/golden/" + name + ".npy";
    auto fail = [&](const std::string& problem) -> void {
      throw ConfigError(c.where("reference"), "case '" + c.name + "': " + shown + " " + problem);
    };
    if (!something_at(file)) {
      fail("is missing (a golden/ folder holds one float64 file per expected tensor)");
      continue;
    }
    if (const std::string problem = not_regular_file(file); !problem.empty()) fail(problem);
    Tensor g;
    try {
      const NpyHeader h = read_npy_header(file);
      if (h.shape != want.shape())
        fail("has shape " + shape_str(h.shape) + ", expected " + shape_str(want.shape()) + " (as " + name + ".npy)");
      g = read_case_npy(file, {.max_bytes = h.data_bytes});
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      fail(std::string("cannot be read: ") + e.what());
    }
    if (g.dtype() != DType::float64) fail("holds " + std::string(dtype_name(g.dtype())) + "; a golden is float64");
    if (g.shape() != want.shape())
      fail("has shape " + shape_str(g.shape()) + ", expected " + shape_str(want.shape()) + " (as " + name + ".npy)");
    const std::vector<double> gv = g.to_vector(), ev = want.to_vector();
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < gv.size(); ++i) {
      if (!std::isfinite(gv[i])) fail("holds NaN or Inf");
      diff += (ev[i] - gv[i]) * (ev[i] - gv[i]);
      norm += gv[i] * gv[i];
    }
    // The same function in float64 as the reference's tensors in the dtype:
    // they agree within the dtype's rounding, or one of them is not what it says.
    // (a float64 case is judged by allclose: its golden/, if any, is not used)
    const double eps = dtype_epsilon(c.dtype), rel = std::sqrt(diff) / std::sqrt(norm);
    // dbk is zero in exact arithmetic (q_i . bk is one constant along a softmax row):
    // both files hold rounding noise, which no relative bound measures.
    const bool zero_in_exact = name == "dbk";
    if (c.dtype != DType::float64 && diff > 0 && !zero_in_exact && !(rel <= kGoldenEpsilons * eps)) {
      std::ostringstream os;
      os.precision(3);
      os << "disagrees with " << c.reference_text << "/" << name << ".npy: ||" << name << " - golden|| / ||golden|| = "
         << rel << ", more than " << kGoldenEpsilons << " x " << dtype_name(c.dtype) << "'s epsilon (" << kGoldenEpsilons * eps
         << "); a golden is the same tensor computed in float64 from the same inputs";
      fail(os.str());
    }
    golden.push_back({name, g});
  }
  return golden;
}

}  // namespace

std::size_t case_files_read() { return g_files_read.load(); }

const Tensor* find_tensor(const TensorSet& set, std::string_view name) {
  for (const auto& nt : set)
    if (nt.name == name) return &nt.tensor;
  return nullptr;
}

Tensor with_layout(const Tensor& t, InputLayout layout) {
  const std::int64_t n = t.dim();
  if (layout == InputLayout::contiguous || n < 2) return t;
  if (layout == InputLayout::transposed)
    return t.transpose(n - 2, n - 1).contiguous().transpose(n - 2, n - 1);
  // sliced: one spare row before, one after; two spare columns before, one after
  Shape wide_shape = t.shape();
  wide_shape[n - 2] += 2;
  wide_shape[n - 1] += 3;
  Tensor wide = Tensor::full(wide_shape, std::numeric_limits<double>::quiet_NaN(), t.dtype());
  Tensor view = wide.narrow(n - 2, 1, t.size(n - 2)).narrow(n - 1, 2, t.size(n - 1));
  view.copy_(t);
  return view;
}

namespace {

// A mask must broadcast to [B, H, Tq, Tk] (3-D q, k, v: [B, Tq, Tk]) without growing it.
void check_mask_shape(const CaseSpec& c, const std::string& key, const Tensor& mask, const Shape& target,
                      const std::string& what) {
  const std::string dims = target.size() == 3 ? "[B, Tq, Tk]" : "[B, H, Tq, Tk]";
  bool fits = mask.dim() <= static_cast<std::int64_t>(target.size());
  for (std::int64_t i = 1; fits && i <= mask.dim(); ++i) {
    const std::int64_t m = mask.size(-i), want = target[target.size() - static_cast<std::size_t>(i)];
    fits = m == want || m == 1;
  }
  if (!fits)
    throw ConfigError(c.where(key), "case '" + c.name + "': " + what + " has shape " + shape_str(mask.shape()) +
                                        ", which does not broadcast to " + dims + " = " + shape_str(target) +
                                        (target.size() == 3 ? " (q, k, v are [B, T, d]: the scores are [B, Tq, Tk])" : ""));
}

// "[2, 0, 8]" has no element: a reference input like that is a mistake, not a case.
bool has_zero_dim(const Tensor& t) {
  for (std::int64_t s : t.shape())
    if (s == 0) return true;
  return false;
}

// The row-major index of the first NaN or Inf, if any.
std::optional<std::int64_t> first_non_finite_at(const Tensor& t) {
  const std::vector<double> v = t.to_vector();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) return static_cast<std::int64_t>(i);
  return std::nullopt;
}

struct ReferenceData {
  bool bias = false;   // bq, bk, bv, bo are among the inputs
  bool sinks = false;  // sinks [H] is among the inputs
  Tensor positions;    // positions.npy as float64; undefined: none
  TensorSet inputs;    // x, wq, ... | q, k, v, [mask], [r]
  TensorSet expected;  // every expected file present
  Dims dims;
  DType dtype = DType::float64;
};

// Reads and checks a reference (a directory of .npy files or one .npz)
// against the case's level and dims. Each file is read once.
class ReferenceReader {
 public:
  explicit ReferenceReader(const CaseSpec& c) : c_(c), npz_(c.reference.extension() == ".npz") {}

  ReferenceData read() {
    std::error_code ec;
    if (npz_) {
      if (!something_at(c_.reference)) fail("reference file " + c_.reference.string() + " does not exist");
      try {
        ++g_files_read;
        archive_ = std::make_unique<NpzArchive>(c_.reference);
      } catch (const std::exception& e) {
        fail(std::string("reference file ") + e.what());
      }
    } else if (!fs::is_directory(c_.reference, ec)) {
      if (!something_at(c_.reference)) fail("reference directory " + c_.reference.string() + " does not exist");
      const std::string problem = not_regular_file(c_.reference);
      fail("reference " + c_.reference.string() + " " + (problem.empty() ? "is a file" : problem) +
           "; a reference is a directory of .npy files or an .npz file");
    }
    warn_unknown_files();
    ReferenceData ref = c_.level == Level::mha ? read_mha() : c_.level == Level::core ? read_core() : read_rope();
    if (c_.level != Level::rope) read_sinks(ref);
    read_positions(ref);
    read_taps(ref);
    return ref;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw ConfigError(c_.where("reference"), "case '" + c_.name + "': " + problem);
  }
  std::string ref() const { return c_.reference_text.empty() ? c_.reference.string() : c_.reference_text; }
  // How a member is named in messages: "refs/case1/x.npy" or "refs/case1.npz member x".
  std::string file(const std::string& stem) const {
    return npz_ ? ref() + " member " + stem : ref() + "/" + stem + ".npy";
  }
  // Its short name, where the reference was just named: "x.npy" or "member x".
  std::string part(const std::string& stem) const { return npz_ ? "member " + stem : stem + ".npy"; }
  fs::path path(const std::string& stem) const { return c_.reference / (stem + ".npy"); }
  // Anything at the name counts: a folder, fifo or dangling symlink there is
  // an error naming it, never a file silently absent.
  bool has(const std::string& stem) const { return npz_ ? archive_->has(stem) : something_at(path(stem)); }

  // Reads one file or member. With `want`, a shape other than it is refused
  // from the header, before the data is read or inflated; without, the data
  // is bounded by the memory the case may use.
  Tensor load(const std::string& stem, bool required, const std::string& needs, const Shape* want = nullptr,
              const std::string& why = "", bool integers = false) {
    if (!has(stem)) {
      if (required)
        fail((npz_ ? "reference file " : "reference directory ") + ref() + " has no " + stem +
             (npz_ ? " member" : ".npy") + " (" + needs + ")");
      return {};
    }
    if (!npz_)
      if (const std::string problem = not_regular_file(path(stem)); !problem.empty())
        fail(file(stem) + " " + problem + "; a reference file is a regular .npy file");
    Tensor t;
    try {
      const NpyHeader h = npz_ ? archive_->header(stem, integers) : read_npy_header(path(stem), integers);
      if (want && h.shape != *want)
        fail(file(stem) + " has shape " + shape_str(h.shape) + ", expected " + shape_str(*want) + " (" + why + ")");
      const NpyLimits limits{.integers = integers, .max_bytes = want ? h.data_bytes : max_file_bytes()};
      t = npz_ ? archive_->read(stem, limits) : read_case_npy(path(stem), limits);
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      fail(std::string("reference file ") + e.what());
    }
    if (integers) return t;  // token positions: not values of the reference's dtype
    if (stem == "mask") {
      if (t.dtype() != DType::boolean)
        fail(file("mask") + " must hold bools (True = attend), got " + std::string(dtype_name(t.dtype())));
      return t;
    }
    if (t.dtype() == DType::boolean) fail(file(stem) + " holds bools; expected float32 or float64");
    if (!dtype_set_) {
      dtype_ = t.dtype();
      dtype_from_ = stem;
      dtype_set_ = true;
    } else if (t.dtype() != dtype_) {
      fail(file(stem) + " is " + std::string(dtype_name(t.dtype())) + " but " + part(dtype_from_) + " is " +
           std::string(dtype_name(dtype_)) + "; every file of a reference must share one dtype");
    }
    return t;
  }

  // An input the plugins will get: it must have elements and finite values.
  Tensor load_input(const std::string& stem, bool required, const std::string& needs, const Shape* want = nullptr,
                    const std::string& why = "") {
    Tensor t = load(stem, required, needs, want, why);
    if (!t.defined()) return t;
    if (has_zero_dim(t))
      fail(file(stem) + " has shape " + shape_str(t.shape()) + ", a zero-size dim: an input needs elements");
    if (const auto at = first_non_finite_at(t)) {
      const double v = t.flat(*at);
      fail(file(stem) + " holds " + (std::isnan(v) ? "NaN" : "Inf") + " at " +
           shape_str(unravel_index(*at, t.shape())) + ": reference inputs must be finite");
    }
    return t;
  }

  // An expected tensor the case checks (others are never read), of shape
  // `want`, finite: an Inf there would pass or fail anything.
  // `unlisted`: read though the check list does not (yet) name it (a bias
  // gradient where the files give the biases: the list gains them after the read).
  Tensor load_expected(const std::string& stem, const Shape& want, const std::string& why, bool unlisted = false) {
    if (!unlisted && std::find(c_.check.begin(), c_.check.end(), stem) == c_.check.end()) return {};
    Tensor t = load(stem, false, "", &want, why);
    if (!t.defined()) return t;
    if (const auto at = first_non_finite_at(t)) {
      const double v = t.flat(*at);
      fail(file(stem) + " holds " + (std::isnan(v) ? "NaN" : "Inf") + " at " +
           shape_str(unravel_index(*at, t.shape())) + ": expected tensors must be finite");
    }
    return t;
  }

  void expect_shape(const std::string& stem, const Tensor& t, const Shape& want, const std::string& why) {
    if (t.defined() && t.shape() != want)
      fail(file(stem) + " has shape " + shape_str(t.shape()) + ", expected " + shape_str(want) + " (" + why + ")");
  }

  void expect_dim(const char* name, std::int64_t from_files, const std::string& source) const {
    const std::int64_t given = c_.dims.get(name);
    if (given > 0 && given != from_files)
      fail(std::string("shape gives ") + name + "=" + std::to_string(given) + " but " + source + " has " +
           name + "=" + std::to_string(from_files));
  }

  // sinks.npy [H] (mha and core levels): present, the case has sinks and its
  // expected files may add dsinks.npy [H]. `sinks: true` without the file,
  // or `sinks: false` written on the case with it, is refused.
  void read_sinks(ReferenceData& data) {
    const std::int64_t h = data.dims.H > 0 ? data.dims.H : 1;
    const bool said_no = !c_.sinks && c_.key_source.count("sinks");
    if (!has("sinks")) {
      if (c_.sinks)
        fail(std::string("the case says 'sinks: true' but ") + (npz_ ? "reference file " : "reference directory ") +
             ref() + " has no sinks" + (npz_ ? " member" : ".npy") + " (sinks [H], one logit per query head); "
             "drop 'sinks: true' or add it");
      return;
    }
    if (said_no)
      fail(file("sinks") + " gives sinks, but the case says 'sinks: false'; drop 'sinks: false' or the file");
    const Shape want = {h};
    const std::string why = "one sink logit per query head, H=" + std::to_string(h);
    data.inputs.push_back({"sinks", load_input("sinks", true, "", &want, why)});
    data.sinks = true;
    // a check list from the defaults gains dsinks once the files give sinks
    Tensor e = load_expected("dsinks", want, "the gradient of " + part("sinks") + " " + shape_str(want),
                             !c_.sinks && !c_.check_strict);
    if (e.defined()) data.expected.push_back({"dsinks", e});
  }

  // positions.npy: int64 (or integer-valued floats), [T] or [B, T] of the
  // reference's tokens. Read only for a case with a rope block.
  void read_positions(ReferenceData& ref) {
    if (!c_.rope || !has("positions")) return;
    Tensor p = load("positions", false, "", nullptr, "", /*integers*/ true);
    const std::int64_t b = ref.dims.B, t = c_.level == Level::core ? ref.dims.Tk : ref.dims.T;
    if (c_.level == Level::core && ref.dims.Tq != ref.dims.Tk)
      fail(file("positions") + " gives one position per token, shared by queries and keys; it needs Tq = Tk");
    // [T], or [B, T] whose B is the inputs' first dim (rope() aligns positions with the leading dims)
    const bool fits = (p.dim() == 1 && p.size(0) == t) || (p.dim() == 2 && p.size(0) == b && p.size(1) == t);
    if (!fits)
      fail(file("positions") + " has shape " + shape_str(p.shape()) + ", expected [T] = [" + std::to_string(t) +
           "] or [B, T] = [" + std::to_string(b) + ", " + std::to_string(t) + "]");
    // queries sit at q_offset + p: every one of them must be exact in float64
    const double most = 9007199254740992.0 - static_cast<double>(c_.rope->q_offset);
    for (std::int64_t i = 0; i < p.numel(); ++i)
      if (p.flat(i) != std::floor(p.flat(i)) || p.flat(i) < 0 || p.flat(i) > most) {
        std::ostringstream v;
        v.precision(17);
        v << p.flat(i);
        fail(file("positions") + " holds " + v.str() + " at " + shape_str(unravel_index(i, p.shape())) +
             "; positions are integers in [0, 2^53" + (c_.rope->q_offset ? " - q_offset" : "") + "]");
      }
    ref.positions = p.to(DType::float64);
  }

  // q_rot [B, H, Tq, d], k_rot [B, Hkv, Tk, d]: q and k after the rotation,
  // read when the case lists them in `taps`.
  void read_taps(ReferenceData& ref) {
    for (const auto& tap : c_.taps) {
      const std::int64_t t_len = c_.level == Level::core ? (tap == "q_rot" ? ref.dims.Tq : ref.dims.Tk) : ref.dims.T;
      // q after the rotation has the H query heads, k the Hkv kv heads
      const std::int64_t heads = tap == "q_rot" ? ref.dims.H : ref.dims.kv_heads();
      const Shape want = {ref.dims.B, heads, t_len, ref.dims.head_dim()};
      const std::string why = std::string("[B, ") + (tap == "q_rot" ? "H" : "Hkv") + ", T, d] with B=" +
                              std::to_string(ref.dims.B) + ", " + (tap == "q_rot" ? "H=" : "Hkv=") +
                              std::to_string(heads) + ", T=" + std::to_string(t_len) +
                              ", d=" + std::to_string(ref.dims.head_dim());
      Tensor t = load(tap, true, "the case's 'taps' lists " + tap, &want, why);
      if (const auto at = first_non_finite_at(t))
        fail(file(tap) + " holds NaN or Inf at " + shape_str(unravel_index(*at, t.shape())) +
             ": expected tensors must be finite");
      ref.expected.push_back({tap, t});
    }
  }

  void warn_unknown_files() const {
    std::set<std::string> known = {"r", "positions", "q_rot", "k_rot"};
    if (c_.level != Level::rope) known.insert({"sinks", "dsinks"});
    for (const auto& n : tensor_names(c_.level)) known.insert(n);
    if (c_.level == Level::mha) known.insert({"x", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"});
    if (c_.level == Level::mha) {
      for (const auto& n : bias_tensor_names()) known.insert(n);
      known.insert({"q_norm", "k_norm", "x_kv", "dq_norm", "dk_norm", "dx_kv"});  // QK-norm, cross-attention
    }
    else if (c_.level == Level::core) known.insert({"q", "k", "v", "mask"});
    else known.insert("x");
    std::vector<std::string> stems;
    if (npz_) {
      stems = archive_->names();
    } else {
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(c_.reference, ec))
        if (entry.path().extension() == ".npy") stems.push_back(entry.path().stem().string());
    }
    for (const auto& stem : stems)
      if (!known.count(stem))
        logging::runner()->warn("{}: {} is not a reference file name at {} level; ignored", c_.where("reference").str(),
                                npz_ ? "member " + stem : stem + ".npy", level_name(c_.level));
  }

  ReferenceData read_mha() {
    ReferenceData ref;
    const std::string needs = "an mha-level reference needs x, wq, wk, wv, wo";
    Tensor x = load_input("x", true, needs);
    if (x.dim() != 3) fail(file("x") + " has shape " + shape_str(x.shape()) + ", expected [B, T, D]");
    const std::int64_t b = x.size(0), t = x.size(1), dm = x.size(2), h = c_.dims.H;
    const std::string from_x = "D=" + std::to_string(dm) + " from " + part("x") + " " + shape_str(x.shape());
    expect_dim("B", b, part("x"));
    expect_dim("T", t, part("x"));
    expect_dim("D", dm, part("x"));
    ref.inputs.push_back({"x", x});
    // wq [H*d, D] gives the head width (H from the case), wk [Hkv*d, D] the kv heads
    Tensor wq = load_input("wq", true, needs);
    if (wq.dim() != 2 || wq.size(1) != dm || wq.size(0) % h != 0)
      fail(file("wq") + " has shape " + shape_str(wq.shape()) + ", expected [H*d, D] with H=" + std::to_string(h) +
           " and " + from_x);
    const std::int64_t hd = wq.size(0), d = hd / h;
    expect_dim("d", d, part("wq") + " " + shape_str(wq.shape()) + " over H=" + std::to_string(h));
    ref.inputs.push_back({"wq", wq});
    Tensor wk = load_input("wk", true, needs);
    if (wk.dim() != 2 || wk.size(1) != dm || wk.size(0) % d != 0 || wk.size(0) / d < 1 || h % (wk.size(0) / d) != 0)
      fail(file("wk") + " has shape " + shape_str(wk.shape()) + ", expected [Hkv*d, D] with d=" + std::to_string(d) +
           " (" + part("wq") + " " + shape_str(wq.shape()) + " over H=" + std::to_string(h) + "), " + from_x +
           " and Hkv dividing H");
    const std::int64_t hkv = wk.size(0) / d;
    expect_dim("Hkv", hkv, part("wk") + " " + shape_str(wk.shape()));
    ref.inputs.push_back({"wk", wk});
    const Shape wq_shape = wq.shape(), kv_shape = wk.shape(), wo_shape = {dm, hd};
    const std::string kv_why = part("wk") + " is " + shape_str(kv_shape);
    const std::string wo_why = "Wo is [D, H*d]; " + part("wq") + " is " + shape_str(wq_shape);
    Tensor wv = load_input("wv", true, needs, &kv_shape, kv_why);
    expect_shape("wv", wv, kv_shape, kv_why);
    ref.inputs.push_back({"wv", wv});
    Tensor wo = load_input("wo", true, needs, &wo_shape, wo_why);
    expect_shape("wo", wo, wo_shape, wo_why);
    ref.inputs.push_back({"wo", wo});
    const bool bias = read_biases(ref, hd, hkv * d, dm, h, hkv, d);
    const std::int64_t tk = read_qk_norm_cross(ref, x, hd, hkv * d, d);
    const Shape act = {b, t, dm};
    const std::string act_why = part("x") + " is " + shape_str(x.shape());
    Tensor r = load_input("r", false, "", &act, act_why);
    if (r.defined()) ref.inputs.push_back({"r", r});
    if (bias)
      for (const auto& name : bias_tensor_names()) {  // a bias's gradient has its bias's shape
        const std::string of = name.substr(1);  // "dbq" -> "bq"
        const Shape want = find_tensor(ref.inputs, of)->shape();
        // a check list from the defaults gains the bias gradients once the files give biases
        const bool gained = !c_.bias && !c_.check_strict;
        Tensor e = load_expected(name, want, "the gradient of " + part(of) + " " + shape_str(want), gained);
        if (e.defined()) ref.expected.push_back({name, e});
      }
    for (const auto& name : tensor_names(Level::mha)) {
      const bool activation = name == "out" || name == "dx";
      const bool kv = name == "dwk" || name == "dwv";
      Tensor e = load_expected(name, activation ? act : kv ? kv_shape : name == "dwq" ? wq_shape : wo_shape,
                   activation ? act_why : kv ? kv_why : name == "dwq" ? part("wq") + " is " + shape_str(wq_shape) : wo_why);
      if (e.defined()) ref.expected.push_back({name, e});
    }
    // d and Hkv kept only where they differ from the defaults (D / H, H)
    ref.dims = Dims{.B = b, .T = t, .D = dm, .H = h, .d = hd == dm ? 0 : d, .Hkv = hkv == h ? 0 : hkv};
    if (c_.cross) {  // x [B, Tq, D], x_kv [B, Tk, D]
      ref.dims.Tq = t;
      ref.dims.Tk = tk;
    }
    ref.dtype = dtype_;
    return ref;
  }

  // ---- QK-norm and cross-attention ----
  // q_norm, k_norm (with `qk_norm`) and x_kv (with `cross: true`), their
  // expected gradients dq_norm, dk_norm, dx_kv; the files cannot say the
  // norm's axis, eps and gain, so a gain or x_kv without the case's key is
  // refused. Returns x_kv's length (x's without cross).
  std::int64_t read_qk_norm_cross(ReferenceData& ref, const Tensor& x, std::int64_t hd, std::int64_t kvd,
                                  std::int64_t d) {
    for (const char* stem : {"q_norm", "k_norm"})
      if (!c_.qk_norm.enabled && has(stem))
        fail(file(stem) + " is a QK-norm gain, but the case has no 'qk_norm' ({axis: head|model, eps, gain: "
             "w|one_plus_w}: the files cannot say them); add it or drop the gain files");
    if (!c_.cross && has("x_kv"))
      fail(file("x_kv") + " is cross-attention's key/value input, but the case has no 'cross: true'; add it or "
           "drop x_kv");
    if (c_.qk_norm.enabled) {
      const bool model = c_.qk_norm.axis == QkNormAxis::model;
      const std::string needs = std::string("the case has 'qk_norm' (axis ") +
                                std::string(qk_norm_axis_name(c_.qk_norm.axis)) + ")";
      const std::pair<const char*, Shape> gains[] = {{"q_norm", {model ? hd : d}}, {"k_norm", {model ? kvd : d}}};
      for (const auto& [stem, want] : gains) {
        const std::string why = model ? std::string(stem) + " is [" + (stem[0] == 'q' ? "H" : "Hkv") +
                                            "*d] under axis model, from the weights"
                                      : "axis head: one [d] gain shared by every head, d from wq";
        ref.inputs.push_back({stem, load_input(stem, true, needs, &want, why)});
        Tensor e = load_expected(std::string("d") + stem, want, "the gradient of " + part(stem));
        if (e.defined()) ref.expected.push_back({std::string("d") + stem, e});
      }
    }
    if (!c_.cross) return x.size(1);
    Tensor kv = load_input("x_kv", true, "the case has 'cross: true'");
    if (kv.dim() != 3 || kv.size(0) != x.size(0) || kv.size(2) != x.size(2))
      fail(file("x_kv") + " has shape " + shape_str(kv.shape()) + ", expected [B, Tk, D] with B=" +
           std::to_string(x.size(0)) + " and D=" + std::to_string(x.size(2)) + " from " + part("x"));
    expect_dim("Tq", x.size(1), part("x"));
    expect_dim("Tk", kv.size(1), part("x_kv"));
    ref.inputs.push_back({"x_kv", kv});
    Tensor e = load_expected("dx_kv", kv.shape(), part("x_kv") + " is " + shape_str(kv.shape()));
    if (e.defined()) ref.expected.push_back({"dx_kv", e});
    return kv.size(1);
  }

  // bq [H*d], bk and bv [Hkv*d], bo [D]: all four or none (a bias file
  // alone is a mistake, and so is `bias: true` without the files). True: the
  // reference has biases.
  bool read_biases(ReferenceData& data, std::int64_t hd, std::int64_t kvd, std::int64_t dm, std::int64_t h,
                   std::int64_t hkv, std::int64_t d) {
    const std::vector<std::string> stems = {"bq", "bk", "bv", "bo"};
    std::vector<std::string> present, absent;
    for (const auto& s : stems) (has(s) ? present : absent).push_back(s);
    const bool asked = c_.bias, said_no = !c_.bias && c_.key_source.count("bias");
    if (present.empty()) {
      if (asked)
        fail(std::string("the case says 'bias: true' but ") + (npz_ ? "reference file " : "reference directory ") + ref() +
             " has no bq, bk, bv, bo" + (npz_ ? " members" : " .npy files") +
             " (bq [H*d], bk and bv [Hkv*d], bo [D]); drop 'bias: true' or add them");
      return false;
    }
    if (said_no)
      fail(file(present.front()) + " is a bias, but the case says 'bias: false'; drop 'bias: false' (the files "
           "give the biases) or the bias files");
    if (!absent.empty()) {
      std::string have, missing;
      for (const auto& s : present) have += (have.empty() ? "" : ", ") + part(s);
      for (const auto& s : absent) missing += (missing.empty() ? "" : ", ") + part(s);
      fail(std::string(npz_ ? "reference file " : "reference directory ") + ref() + " holds " + have + " but not " + missing +
           ": a reference with biases holds all four of bq, bk, bv, bo");
    }
    const std::string dims = " (H=" + std::to_string(h) + ", Hkv=" + std::to_string(hkv) + ", d=" +
                             std::to_string(d) + ", D=" + std::to_string(dm) + " from the weights)";
    const std::pair<std::string, std::pair<std::int64_t, std::string>> want[] = {
        {"bq", {hd, "bq is [H*d]"}}, {"bk", {kvd, "bk is [Hkv*d]"}}, {"bv", {kvd, "bv is [Hkv*d]"}},
        {"bo", {dm, "bo is [D]"}}};
    for (const auto& [stem, shape_why] : want) {
      const Shape shape = {shape_why.first};
      Tensor t = load_input(stem, true, "a reference with biases holds all four", &shape, shape_why.second + dims);
      data.inputs.push_back({stem, t});
    }
    data.bias = true;
    return true;
  }

  // x [..., T, d] with any leading dims (CS336's run_rope takes [..., T, d_k]);
  // r, out and dx have x's shape.
  ReferenceData read_rope() {
    ReferenceData ref;
    Tensor x = load_input("x", true, "a rope-level reference needs x [..., T, d]");
    if (x.dim() < 2) fail(file("x") + " has shape " + shape_str(x.shape()) + ", expected [..., T, d]");
    const std::int64_t t = x.size(-2), d = x.size(-1), b = x.dim() >= 3 ? x.size(0) : 1;
    const std::int64_t h = x.dim() == 4 ? x.size(1) : 0;
    expect_dim("T", t, part("x"));
    expect_dim("d", d, part("x"));
    ref.inputs.push_back({"x", x});
    const std::string why = part("x") + " is " + shape_str(x.shape());
    Tensor r = load_input("r", false, "", &x.shape(), why);
    if (r.defined()) ref.inputs.push_back({"r", r});
    for (const auto& name : tensor_names(Level::rope)) {
      Tensor e = load_expected(name, x.shape(), why);
      if (e.defined()) ref.expected.push_back({name, e});
    }
    ref.dims = Dims{.B = b, .T = t, .H = h, .d = d};
    ref.dtype = dtype_;
    return ref;
  }

  ReferenceData read_core() {
    ReferenceData ref;
    const std::string needs = "a core-level reference needs q, k, v";
    Tensor q = load_input("q", true, needs), k = load_input("k", true, needs), v = load_input("v", true, needs);
    // [B, H, T, d] with k and v of Hkv heads, or all three [B, T, d] (one head, as CS336 writes them)
    const bool heads = q.dim() == 4;
    for (const auto& [stem, t] : {std::pair<const char*, Tensor&>{"q", q}, {"k", k}, {"v", v}})
      if (t.dim() != q.dim() || (t.dim() != 4 && t.dim() != 3))
        fail(file(stem) + " has shape " + shape_str(t.shape()) +
             ", expected [B, H, T, d] (k, v: [B, Hkv, Tk, d]), or q, k, v all [B, T, d]");
    const std::int64_t b = q.size(0), h = heads ? q.size(1) : 1, hkv = heads ? k.size(1) : 1;
    const std::int64_t tq = q.size(-2), d = q.size(-1), tk = k.size(-2), dv = v.size(-1);
    const std::string from_q = part("q") + " is " + shape_str(q.shape());
    if (heads && (hkv < 1 || h % hkv != 0))
      fail(file("k") + " has shape " + shape_str(k.shape()) + ": its " + std::to_string(hkv) +
           " kv heads do not divide the H=" + std::to_string(h) + " query heads of " + from_q);
    expect_shape("k", k, heads ? Shape{b, hkv, tk, d} : Shape{b, tk, d},
                 from_q + (heads ? ", so k must be [B, Hkv, Tk, d]" : ", so k must be [B, Tk, d]"));
    expect_shape("v", v, heads ? Shape{b, hkv, tk, dv} : Shape{b, tk, dv},
                 part("k") + " is " + shape_str(k.shape()) + (heads ? ", so v must be [B, Hkv, Tk, dv]" : ", so v must be [B, Tk, dv]"));
    expect_dim("B", b, part("q"));
    expect_dim("H", h, part("q"));
    expect_dim("Hkv", hkv, part("k"));
    expect_dim("Tq", tq, part("q"));
    expect_dim("Tk", tk, part("k"));
    expect_dim("d", d, part("q"));
    ref.inputs = {{"q", q}, {"k", k}, {"v", v}};
    Tensor mask = load("mask", false, "");
    if (mask.defined()) {
      // 3-D q, k, v (CS336's SDPA test) have [B, Tq, Tk] scores: a [B, Tq, Tk] mask, as PyTorch broadcasts it
      check_mask_shape(c_, "reference", mask, heads ? Shape{b, h, tq, tk} : Shape{b, tq, tk}, file("mask"));
      ref.inputs.push_back({"mask", mask});
    }
    const Shape out_shape = heads ? Shape{b, h, tq, dv} : Shape{b, tq, dv};
    const std::string out_why = heads ? "the output is [B, H, Tq, dv]" : "the output is [B, Tq, dv]";
    Tensor r = load_input("r", false, "", &out_shape, out_why);
    if (r.defined()) ref.inputs.push_back({"r", r});
    for (const auto& name : tensor_names(Level::core)) {
      Tensor e = name == "out" ? load_expected(name, out_shape, out_why)
                               : load_expected(name, (name == "dq" ? q : name == "dk" ? k : v).shape(),
                                               "a gradient has its input's shape");
      if (e.defined()) ref.expected.push_back({name, e});
    }
    ref.dims = Dims{.B = b, .H = h, .Tq = tq, .Tk = tk, .d = d, .Hkv = hkv == h ? 0 : hkv};
    ref.dtype = dtype_;
    return ref;
  }

  const CaseSpec& c_;
  const bool npz_;
  std::unique_ptr<NpzArchive> archive_;  // an .npz reference: members read one by one, when used
  DType dtype_ = DType::float64;
  std::string dtype_from_;
  bool dtype_set_ = false;
};

Tensor read_mask_file(const CaseSpec& c) {
  auto fail = [&](const std::string& problem) {
    throw ConfigError(c.where("mask"), "case '" + c.name + "': " + problem);
  };
  if (!something_at(c.mask_file)) fail("mask file " + c.mask_file.string() + " does not exist");
  if (const std::string problem = not_regular_file(c.mask_file); !problem.empty())
    fail("mask file " + c.mask_file.string() + " " + problem + "; a mask is a regular .npy file of bools");
  // A mask broadcasts to [B, H, Tq, Tk] without growing it: one byte per element at most.
  const Dims& d = c.dims;
  const double most = static_cast<double>(d.B) * static_cast<double>(d.H) * static_cast<double>(d.Tq) *
                      static_cast<double>(d.Tk);
  const std::uint64_t max_bytes =
      most > 0 && most < static_cast<double>(max_file_bytes()) ? static_cast<std::uint64_t>(most) : max_file_bytes();
  Tensor mask;
  try {
    mask = read_case_npy(c.mask_file, {.max_bytes = max_bytes});
  } catch (const std::exception& e) {
    fail(std::string("mask file ") + e.what());
  }
  if (mask.dtype() != DType::boolean)
    fail("mask file " + c.mask_file.string() + " must hold bools (True = attend), got " +
         std::string(dtype_name(mask.dtype())));
  return mask;
}

Shape mask_target(const Dims& d) { return {d.B, d.H, d.Tq, d.Tk}; }
// A reference's 3-D q, k, v [B, T, d] have [B, Tq, Tk] scores: its mask broadcasts to those.
Shape mask_target(const Dims& d, const CaseFiles& f) {
  const Tensor* q = find_tensor(f.inputs, "q");
  if (q && q->defined() && q->dim() == 3) return {d.B, d.Tq, d.Tk};
  return mask_target(d);
}

std::string mask_key(const CaseSpec& c) { return c.key_source.count("mask") ? "mask" : "reference"; }

// A case that says dtype: bfloat16 reads float32 files (.npy cannot name
// bfloat16) whose values must all be bfloat16 values: converted exactly, or
// refused naming the file, the index and the value.
void as_bfloat16(const CaseSpec& c, ReferenceData& ref) {
  const bool npz = c.reference.extension() == ".npz";
  auto convert = [&](TensorSet& set) {
    for (auto& nt : set) {
      if (nt.name == "mask" || nt.name == "positions") continue;
      const std::string file =
          npz ? c.reference_text + " member " + nt.name : c.reference_text + "/" + nt.name + ".npy";
      try {
        nt.tensor = exact_bfloat16(nt.tensor, file);
      } catch (const std::exception& e) {
        throw ConfigError(c.where("reference"), "case '" + c.name + "' (dtype: bfloat16): " + e.what());
      }
    }
  };
  convert(ref.inputs);
  convert(ref.expected);
  ref.dtype = DType::bfloat16;
}

}  // namespace

bool needs_files(const CaseSpec& c) { return c.is_reference() || !c.mask_file.empty(); }

void load_case_files(CaseSpec& c) {
  if (!needs_files(c) || c.files) return;
  auto files = std::make_shared<CaseFiles>();
  if (c.is_reference()) {
    ReferenceData ref = ReferenceReader(c).read();
    // A dtype the case states is a claim about the files: bfloat16 arrives as
    // float32 files, anything else must be the files' own dtype.
    const bool bf16_files = c.dtype == DType::bfloat16 && ref.dtype == DType::float32;
    if (c.dtype_on_case && c.dtype != ref.dtype && !bf16_files)
      throw ConfigError(c.where("dtype"), "case '" + c.name + "': 'dtype: " + std::string(dtype_name(c.dtype)) +
                                              "' but the files of " + c.reference_text + " are " +
                                              std::string(dtype_name(ref.dtype)) +
                                              "; a reference case runs in its files' dtype (drop 'dtype', or "
                                              "write the files in " + std::string(dtype_name(c.dtype)) + ")");
    if (c.dtype == DType::bfloat16) as_bfloat16(c, ref);
    c.dims = ref.dims;
    c.dtype = ref.dtype;
    if (ref.bias && !c.bias) {  // the files give the biases: a check list not the case's own compares theirs too
      c.bias = true;
      if (!c.check_strict) c.check = with_bias_gradients(c.check);
    }
    if (ref.sinks && !c.sinks) {  // the files give sinks: a check list not the case's own compares dsinks too
      c.sinks = true;
      if (!c.check_strict) c.check.push_back("dsinks");
    }
    if (c.baseline_k_at.line > 0 && !c.relative_rule())
      throw ConfigError(c.baseline_k_at, "case '" + c.name + "': 'tolerance: k' is the factor of relative_to_baseline, "
                                         "and this reference's files are " + std::string(dtype_name(c.dtype)) +
                                         ", judged by allclose; set atol/rtol instead, or drop 'k'");
    files->positions = ref.positions;
    if (c.rope && c.rope->rotary_dim > c.dims.head_dim())
      throw ConfigError(c.rope->rotary_dim_at, "case '" + c.name + "': 'rotary_dim' " +
                                                   std::to_string(c.rope->rotary_dim) +
                                                   " is wider than the reference's head width d=" +
                                                   std::to_string(c.dims.head_dim()));
    if (c.rope && c.rope->rotary_dim == 0 && c.dims.head_dim() % 2 != 0)
      throw ConfigError(c.rope->rotary_dim_at, "case '" + c.name + "': the reference's head width d=" +
                                                   std::to_string(c.dims.head_dim()) +
                                                   " is odd and the 'rope' block gives no rotary_dim: RoPE rotates "
                                                   "dims in pairs; give an even 'rotary_dim' <= d");
    if (c.rope && !files->positions.defined())
      if (const std::string problem = rope_position_problem(*c.rope, c.level, c.dims); !problem.empty())
        throw ConfigError(c.rope->positions_at, "case '" + c.name + "': " + problem);
    if (const Tensor* mask = find_tensor(ref.inputs, "mask")) {
      const fs::path ref_mask = c.reference / "mask.npy";
      if (!c.mask_file.empty() && c.mask_file != ref_mask)
        throw ConfigError(c.where("mask"), "case '" + c.name + "': both 'mask' and " + c.reference_text +
                                               (c.reference.extension() == ".npz" ? " member mask" : "/mask.npy") +
                                               " give a mask; keep one");
      c.mask_file = ref_mask;
      files->mask = *mask;
    }
    std::vector<std::string> present;
    for (const auto& name : c.check) {
      if (find_tensor(ref.expected, name)) present.push_back(name);
      else if (c.check_strict)
        throw ConfigError(c.where("check"), "case '" + c.name + "': 'check' lists " + name + " but " +
                                                c.reference_text + " has no " + name + ".npy");
    }
    if (present.empty()) {
      std::string wanted;
      for (const auto& n : c.check) wanted += (wanted.empty() ? "" : ", ") + n + ".npy";
      throw ConfigError(c.where("reference"), "case '" + c.name + "': reference " + c.reference_text +
                                                  " holds none of the expected files " + wanted);
    }
    c.check = present;
    for (auto& nt : ref.inputs)
      if (nt.name != "mask") files->inputs.push_back(std::move(nt));
    for (const auto& name : c.check) files->expected.push_back({name, *find_tensor(ref.expected, name)});
    files->golden = read_reference_golden(c, files->expected);
  }
  if (!files->mask.defined() && !c.mask_file.empty()) files->mask = read_mask_file(c);
  if (files->mask.defined())
    check_mask_shape(c, mask_key(c), files->mask, mask_target(c.dims, *files), "mask file " + c.mask_file.string());
  c.files = std::move(files);
}

Suite load_suite(const fs::path& file) {
  check_suite_file(file);
  std::ifstream in(file, std::ios::binary);
  if (!in) throw ConfigError({file.string(), 0, 0}, "cannot read the suite file");
  std::stringstream ss;
  ss << in.rdbuf();
  Suite suite = parse_suite(ss.str(), file);
  for (CaseSpec& c : suite.cases) load_case_files(c);
  return suite;
}

CaseInputs seeded_inputs(Level level, const Dims& d, DType dt, std::uint64_t seed, bool bias,
                         const QkNormSpec& qk_norm, std::int64_t kv_length, bool sinks) {
  Generator gen(seed);
  CaseInputs in;
  in.level = level;
  if (level == Level::mha) {
    // Wq [H*d, D], Wk and Wv [Hkv*d, D], Wo [D, H*d]: all [D, D] for plain MHA
    const std::int64_t hd = d.H * d.head_dim(), kv_hd = d.kv_heads() * d.head_dim();
    const double w_std = 1.0 / std::sqrt(static_cast<double>(d.D));  // N(0, 1/fan in)
    in.x = randn({d.B, d.T, d.D}, dt, gen);
    in.wq = randn({hd, d.D}, dt, gen, w_std);
    in.wk = randn({kv_hd, d.D}, dt, gen, w_std);
    in.wv = randn({kv_hd, d.D}, dt, gen, w_std);
    in.wo = randn({d.D, hd}, dt, gen, 1.0 / std::sqrt(static_cast<double>(hd)));
    in.r = randn({d.B, d.T, d.D}, dt, gen);
    if (bias) {  // after r: a case without biases keeps every value it had
      in.bq = randn({hd}, dt, gen, w_std);
      in.bk = randn({kv_hd}, dt, gen, w_std);
      in.bv = randn({kv_hd}, dt, gen, w_std);
      in.bo = randn({d.D}, dt, gen, 1.0 / std::sqrt(static_cast<double>(hd)));
    }
    // ---- QK-norm and cross-attention: after every earlier draw, so other cases keep their values ----
    if (qk_norm.enabled) {
      const bool model = qk_norm.axis == QkNormAxis::model;
      // g = 1 + 0.5 N(0, 1) per dim: gains equal within a rotated pair would hide a norm after RoPE
      auto gain = [&](std::int64_t n) {
        std::vector<double> w = randn({n}, DType::float64, gen, 0.5).to_vector();
        if (qk_norm.gain == QkNormGain::w)
          for (double& v : w) v += 1.0;
        return Tensor::from_values(w, {n}, DType::float64).to(dt);
      };
      in.q_norm = gain(model ? hd : d.head_dim());
      in.k_norm = gain(model ? kv_hd : d.head_dim());
    }
    if (kv_length > 0) in.x_kv = randn({d.B, kv_length, d.D}, dt, gen);
  } else if (level == Level::rope) {
    const Shape x_shape = d.H > 0 ? Shape{d.B, d.H, d.T, d.d} : Shape{d.B, d.T, d.d};
    in.x = randn(x_shape, dt, gen);
    in.r = randn(x_shape, dt, gen);
  } else {
    in.q = randn({d.B, d.H, d.Tq, d.d}, dt, gen);
    in.k = randn({d.B, d.kv_heads(), d.Tk, d.d}, dt, gen);
    in.v = randn({d.B, d.kv_heads(), d.Tk, d.d}, dt, gen);
    in.r = randn({d.B, d.H, d.Tq, d.d}, dt, gen);
  }
  // Sinks after every other input: a case without them keeps every value it had.
  // U(-1, 3) against N(0, 1) scores: P_sink 0.01 .. 0.97, visible in every dtype.
  if (sinks && level != Level::rope) in.sinks = rand_uniform({d.H}, dt, gen, -1.0, 3.0);
  return in;
}

CaseInputs make_inputs(const CaseSpec& spec) {
  std::shared_ptr<const CaseFiles> files = spec.files;
  if (!files && needs_files(spec)) {
    CaseSpec loaded = spec;
    load_case_files(loaded);
    files = loaded.files;
  }
  CaseInputs in;
  if (spec.is_reference()) {
    in.level = spec.level;
    auto get = [&](const char* name) {
      const Tensor* t = find_tensor(files->inputs, name);
      return t ? *t : Tensor();
    };
    if (spec.level == Level::rope) {
      in.x = get("x");
    } else if (spec.level == Level::mha) {
      in.x = get("x");
      in.wq = get("wq");
      in.wk = get("wk");
      in.wv = get("wv");
      in.wo = get("wo");
      in.bq = get("bq");
      in.bk = get("bk");
      in.bv = get("bv");
      in.bo = get("bo");
      in.q_norm = get("q_norm");
      in.k_norm = get("k_norm");
      in.x_kv = get("x_kv");
    } else {
      in.q = get("q");
      in.k = get("k");
      in.v = get("v");
    }
    in.sinks = get("sinks");
    in.r = get("r");
    if (!in.r.defined()) {
      Shape out_shape = spec.level != Level::core ? in.x.shape() : in.q.shape();
      if (spec.level == Level::core) out_shape.back() = in.v.size(-1);
      in.r = Tensor::ones(out_shape, spec.dtype);
    }
    in.expected = files->expected;
    in.positions = files->positions;
  } else {
    in = seeded_inputs(spec.level, spec.dims, spec.dtype, spec.seed, spec.bias,
                       spec.level == Level::mha ? spec.qk_norm : QkNormSpec{},
                       spec.level == Level::mha && spec.cross ? spec.dims.Tk : 0, spec.sinks);
  }
  if (spec.rope && !in.positions.defined()) {
    Shape shape;
    const std::vector<std::int64_t> p =
        rope_positions(*spec.rope, spec.dims.B, spec.level == Level::core ? spec.dims.Tk : spec.dims.T, shape);
    if (!p.empty()) in.positions = positions_tensor(p, shape);
  }
  if (files && files->mask.defined()) {
    // a localization variant keeps the mask of a case whose dims it changed
    check_mask_shape(spec, mask_key(spec), files->mask, mask_target(spec.dims, *files), "mask file " + spec.mask_file.string());
    in.mask = files->mask;
  }
  if (spec.level != Level::core) {
    in.x = with_layout(in.x, spec.layout);
    if (in.x_kv.defined()) in.x_kv = with_layout(in.x_kv, spec.layout);
  } else {
    in.q = with_layout(in.q, spec.layout);
    in.k = with_layout(in.k, spec.layout);
    in.v = with_layout(in.v, spec.layout);
  }
  return in;
}

CaseInputs laid_out(const CaseInputs& in, InputLayout layout) {
  return map_inputs(in, [layout](const InputField& field, const Tensor& t) {
    return field.role == InputRole::activation ? with_layout(t, layout) : t;
  });
}

CaseInputs private_copy(const CaseInputs& in, InputLayout layout) {
  return map_inputs(in, [layout](const InputField& field, const Tensor& t) {
    return field.role == InputRole::activation ? with_layout(t.clone(), layout) : t.clone();
  });
}

AttentionSpec attention_spec(const CaseSpec& c, const CaseInputs& in) {
  AttentionSpec s;
  if (c.level == Level::rope) {
    s.d_model = in.x.size(-1);  // one head of width d: only s.rope is read there
  } else if (c.level == Level::mha) {
    s.d_model = in.x.size(-1);
    s.num_heads = c.dims.H;
    s.num_kv_heads = c.dims.kv_heads();
    s.head_width = in.wq.size(0) / c.dims.H;  // Wq [H*d, D]
  } else {
    // q [B, H, Tq, d], k [B, Hkv, Tk, d]; or all three [B, T, d] (one head)
    const bool heads = in.q.dim() == 4;
    s.num_heads = heads ? in.q.size(1) : 1;
    s.num_kv_heads = heads ? in.k.size(1) : 1;
    s.head_width = in.q.size(-1);
    s.d_model = s.num_heads * in.q.size(-1);
  }
  s.causal = c.causal;
  s.causal_alignment = c.causal_alignment;
  s.scale = c.scale;
  s.dropout_p = 0.0;
  s.mask = in.mask;
  if (c.level == Level::mha) {
    s.qk_norm = c.qk_norm;
    // x_kv without a gradient; a side that compares dx_kv makes it a leaf (exec/execute.hpp)
    if (in.x_kv.defined()) s.x_kv = Variable(in.x_kv);
  }
  s.window = c.window;
  s.softcap = c.softcap;
  if (in.sinks.defined()) s.sinks = Variable(in.sinks);
  if (c.rope) {
    s.rope.enabled = true;
    s.rope.theta = c.rope->theta;
    s.rope.style = c.rope->style;
    s.rope.rotary_dim = c.rope->rotary_dim;
    s.rope.q_offset = c.rope->q_offset;
    if (in.positions.defined()) s.rope.positions = in.positions;
    else s.rope.offset = c.rope->offset;
  }
  return s;
}

TensorSet input_tensors(const CaseInputs& in) {
  TensorSet out;
  for (const InputField& field : kInputFields) {
    const Tensor& t = in.*field.member;
    if (field.role == InputRole::positions || !t.defined()) continue;  // written by the writers, not by export
    // the rope level takes x alone (the mha level's x is its input too)
    const bool here = field.every_level || field.level == in.level || (in.level == Level::rope && field.name == "x");
    if (here) out.push_back({std::string(field.name), t.clone()});
  }
  return out;
}

}  // namespace headgrad::runner
