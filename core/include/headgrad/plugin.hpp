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
// Same toolchain: a C++ plugin must be compiled with the compiler ABI, the
// C++ standard library and its settings (_GLIBCXX_USE_CXX11_ABI,
// _GLIBCXX_DEBUG), the C++ standard (-std=c++20) and the SDK headers that
// headgrad itself was built with: std::string, std::shared_ptr, std::function
// and exceptions cross the boundary. HEADGRAD_PLUGIN compiles a description
// of the plugin's build into it (<headgrad/abi.hpp>); the loader reads it
// through a plain C function before any C++ call and rejects a plugin whose
// build differs, naming what differs. `headgrad new-plugin` writes a project
// that builds this way (meson with dependency('headgrad')).
//
// Shape legend: B batch, T sequence, Tq/Tk query/key lengths, D model width,
// H query heads, Hkv key/value heads, d = D / H head width, [...] leading dims.
#pragma once

#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// Boost.DLL's paths as std::filesystem's: the alias macro below needs none of
// them, and Boost.DLL's default (boost::filesystem) made this header about a
// second of compiling longer in every plugin source. headgrad's own build
// defines it for every file (meson.build), so all of it agrees.
#ifndef BOOST_DLL_USE_STD_FS
#define BOOST_DLL_USE_STD_FS
#endif
#include <boost/dll/alias.hpp>

#include "headgrad/abi.hpp"
#include "headgrad/attention.hpp"
#include "headgrad/ops.hpp"

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
  bool rope_level = false;      // rope_forward: the rotation alone (level: rope)
  bool bias = false;            // MhaWeights::bq, bk, bv, bo (y = x W^T + b; plugin ABI 5)
  bool window = false;          // AttentionSpec::window (plugin ABI 6, as the four below)
  bool softcap = false;         // AttentionSpec::softcap
  bool sinks = false;           // AttentionSpec::sinks
  bool qk_norm = false;         // AttentionSpec::qk_norm, MhaWeights::q_norm, k_norm (mha level)
  bool cross_attention = false; // AttentionSpec::x_kv (mha level)
  std::vector<std::string> extra;  // free-form capabilities for what comes next
};

// The one vocabulary of capabilities: each flag's name is its field's name, and
// errors, `headgrad plugins` (--json: a list), the docs and a suite's
// `capabilities:` lists all use it; Capabilities::extra adds its strings as
// they are ("bfloat16", "float16", "c-abi").
struct CapabilityName {
  bool Capabilities::*flag;
  std::string_view name;
};
inline constexpr CapabilityName kCapabilityNames[] = {
    {&Capabilities::mha, "mha"},           {&Capabilities::core, "core"},
    {&Capabilities::causal, "causal"},     {&Capabilities::bool_mask, "bool_mask"},
    {&Capabilities::cross_lengths, "cross_lengths"},
    {&Capabilities::float32, "float32"},   {&Capabilities::float64, "float64"},
    {&Capabilities::dropout, "dropout"},   {&Capabilities::grouped_kv, "grouped_kv"},
    {&Capabilities::rope, "rope"},         {&Capabilities::rope_level, "rope_level"},
    {&Capabilities::bias, "bias"},         {&Capabilities::window, "window"},
    {&Capabilities::softcap, "softcap"},   {&Capabilities::sinks, "sinks"},
    {&Capabilities::qk_norm, "qk_norm"},   {&Capabilities::cross_attention, "cross_attention"},
};
constexpr std::string_view capability_name(bool Capabilities::*flag) {
  for (const auto& c : kCapabilityNames)
    if (c.flag == flag) return c.name;
  return {};
}
// The names a plugin declares, in the table's order, then its extras.
std::vector<std::string> capability_names(const Capabilities& caps);

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
  // x [..., T, d] -> [..., T, d]: the RoPE rotation alone (spec.enabled is not
  // read). The default throws: the plugin lacks the rope level.
  virtual Variable rope_forward(const Variable& x, const RopeSpec& spec) const;
};

// Thrown by the default implementations above, and by plugins for settings
// they do not support.
class UnsupportedError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The two symbols every plugin exports: the build description (a plain C
// function, checked first: Boost.DLL promises no ABI stability of its own)
// and the factory (a Boost.DLL alias).
inline constexpr const char* plugin_build_symbol = HEADGRAD_BUILD_INFO_SYMBOL;
inline constexpr const char* plugin_factory_symbol = "headgrad_create_plugin";
using PluginFactory = std::shared_ptr<Attention>();

}  // namespace headgrad

// Exports the build description (<headgrad/abi.hpp>) as a plain C function
// and the factory as a Boost.DLL alias. Use once per plugin library, at
// namespace scope.
#define HEADGRAD_PLUGIN(ClassName) HEADGRAD_PLUGIN_FACTORY(std::make_shared<ClassName>)

// The same with a factory of your own: `factory()` returns the library's
// std::shared_ptr<headgrad::Attention>. For one compiled source behind
// several libraries, each choosing its class when the plugin is made.
#define HEADGRAD_PLUGIN_FACTORY(factory)                                            \
  namespace {                                                                       \
  HEADGRAD_DEFINE_BUILD_INFO(headgrad_this_build);                                  \
  std::shared_ptr<::headgrad::Attention> headgrad_make_plugin() { return factory(); } \
  }                                                                                 \
  extern "C" BOOST_SYMBOL_EXPORT const ::headgrad_build_info* headgrad_plugin_build() { \
    return &headgrad_this_build;                                                    \
  }                                                                                 \
  BOOST_DLL_ALIAS(headgrad_make_plugin, headgrad_create_plugin)
