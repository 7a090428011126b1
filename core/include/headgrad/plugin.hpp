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
// A kernel written in C (or wrapped in C) uses <headgrad/c_plugin.h> instead.
// The guide: docs/plugin-guide.md.
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

#include "headgrad/attention.hpp"
#include "headgrad/ops.hpp"

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
