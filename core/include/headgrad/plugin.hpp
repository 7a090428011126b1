// The headgrad plugin SDK: everything an attention plugin includes.
//
// A plugin is a shared library with one class implementing Attention:
//
//   #include <headgrad/plugin.hpp>
//   using namespace headgrad;
//
//   class MyAttention final : public Attention {
//    public:
//     PluginInfo info() const override {
//       PluginInfo i;
//       i.name = "my_attention";
//       i.version = "0.1.0";
//       i.description = "batched attention written by me";
//       i.capabilities.mha = true;
//       i.capabilities.core = true;
//       return i;
//     }
//     Variable mha_forward(const Variable& x, const MhaWeights& w,
//                          const AttentionSpec& spec) const override { ... }
//     Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
//                           const AttentionSpec& spec) const override { ... }
//   };
//   HEADGRAD_PLUGIN(MyAttention)
//
// Built from the ops in <headgrad/ops.hpp>, a plugin gets its backward for
// free; a fused plugin wraps its kernel in custom_op() with its own backward.
//
// Shape legend: B batch, T sequence, Tq/Tk query/key lengths, D model width,
// H query heads, Hkv key/value heads, d = D / H head width, [...] leading dims.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/dll/alias.hpp>

#include "headgrad/ops.hpp"
#include "headgrad/variable.hpp"

// Bumped whenever a type below changes layout or meaning. The loader reads a
// plugin's version through a plain C function before any C++ call and skips
// the plugin on a mismatch (Boost.DLL promises no ABI stability of its own).
#define HEADGRAD_PLUGIN_ABI_VERSION 1

namespace headgrad {

inline constexpr int plugin_abi_version = HEADGRAD_PLUGIN_ABI_VERSION;

// What a plugin implements. The runner checks a case's needs against these
// before calling the plugin, and says which capability is missing.
struct Capabilities {
  bool mha = false;             // mha_forward: [..., T, D] -> [..., T, D] with projections
  bool core = false;            // core_forward: q, k, v -> attention output
  bool causal = true;           // AttentionSpec::causal
  bool bool_mask = false;       // AttentionSpec::mask
  bool cross_lengths = false;   // Tq != Tk (core level)
  bool float32 = true;
  bool float64 = true;
  bool dropout = false;         // dropout_p > 0 (never in comparisons)
  bool grouped_kv = false;      // num_kv_heads < num_heads (GQA/MQA)
  bool rope = false;            // rotary position embeddings
  std::vector<std::string> extra;  // free-form capabilities for what comes next
};

struct PluginInfo {
  std::string name;         // unique; what suites write in `compare:`
  std::string version;
  std::string description;  // one line
  Capabilities capabilities;
  // A deliberately wrong variant that exists to prove suites catch a bug:
  // loaded on request, never listed among the real variants.
  bool mutant = false;
};

struct RopeSpec {
  bool enabled = false;
  double theta = 10000.0;
};

struct AttentionSpec {
  std::int64_t d_model = 0;       // D (mha level)
  std::int64_t num_heads = 1;     // H
  std::int64_t num_kv_heads = 0;  // Hkv; 0 means H (plain multi-head)
  bool causal = false;            // query i attends keys j <= i, aligned top-left
  std::optional<double> scale;    // default 1/sqrt(d)
  double dropout_p = 0.0;         // on the attention weights; 0 in every comparison
  std::uint64_t dropout_seed = 0;
  // Optional bool mask broadcastable to [..., Tq, Tk]: True = attend.
  // Combined with `causal` when both are set (a key is attended when both allow it).
  Tensor mask;
  RopeSpec rope;
  std::map<std::string, double> options;  // room for settings that come later

  std::int64_t head_dim() const { return d_model / num_heads; }
  std::int64_t kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  double scale_for(std::int64_t d) const {
    return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(d));
  }
};

// The four projections, PyTorch's layout: W is [out, in] and y = x W^T.
// Head h owns rows [h*d, (h+1)*d) of wq, wk, wv and columns [h*d, (h+1)*d) of wo.
struct MhaWeights {
  Variable wq;  // [D, D]
  Variable wk;  // [Hkv*d, D]
  Variable wv;  // [Hkv*d, D]
  Variable wo;  // [D, D]
};

class Attention {
 public:
  virtual ~Attention() = default;
  virtual PluginInfo info() const = 0;

  // x [..., T, D] -> [..., T, D]. The default throws: the plugin lacks the level.
  virtual Variable mha_forward(const Variable& x, const MhaWeights& w,
                               const AttentionSpec& spec) const;
  // q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] -> [..., Tq, dv]
  virtual Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                                const AttentionSpec& spec) const;
};

// Thrown by the default implementations above, and by plugins for settings
// they do not support.
class UnsupportedError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The two symbols every plugin exports.
inline constexpr const char* plugin_abi_symbol = "headgrad_plugin_abi_version";
inline constexpr const char* plugin_factory_symbol = "headgrad_create_plugin";
using PluginFactory = std::shared_ptr<Attention>();

}  // namespace headgrad

// Exports the ABI version as a plain C function and the factory as a Boost.DLL
// alias. Use once per plugin library, at namespace scope.
#define HEADGRAD_PLUGIN(ClassName)                                                  \
  extern "C" BOOST_SYMBOL_EXPORT int headgrad_plugin_abi_version() {                \
    return HEADGRAD_PLUGIN_ABI_VERSION;                                             \
  }                                                                                 \
  namespace {                                                                       \
  std::shared_ptr<::headgrad::Attention> headgrad_make_plugin() {                   \
    return std::make_shared<ClassName>();                                           \
  }                                                                                 \
  }                                                                                 \
  BOOST_DLL_ALIAS(headgrad_make_plugin, headgrad_create_plugin)
