// `headgrad check FILE.py:FUNCTION`: the suite it runs, written for the
// function from what it can do (the template's suite: shapes where no bug
// hides, edge cases, non-contiguous input, float32; GQA with --kv-heads,
// RoPE with --rope, every case with biases when the function takes them, the
// cases of each feature of current models whose arguments its signature names:
// window, softcap, sinks, q_norm and k_norm, x_kv),
// the function against per_head.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "pyplug/python_plugin.hpp"

namespace headgrad::pyplug {

struct CheckOptions {
  std::string function;            // as given: FILE.py:FUNCTION (resolved), MODULE:FUNCTION or @NAME
  std::string level = "mha";       // mha | core | rope
  std::optional<bool> causal;      // --causal / --no-causal; none: both when the function takes `causal`, else causal
  std::int64_t kv_heads = 0;       // --kv-heads N: GQA cases at Hkv = N
  std::string rope;                // --rope theta=..,style=..,rotary_dim=..; empty: none (rope level: defaults)
  std::string dtype;               // --dtype: one more case in that dtype (bfloat16, float16, float32)
  std::optional<bool> bias;        // --bias / --no-bias; none: biases when the signature names bq, bk, bv and bo
  bool features = true;            // --no-features: no window, softcap, sinks, qk_norm or cross cases
};

// The plugin's name in the suite: the function's name ("my_attention").
std::string check_plugin_name(const std::string& function);

// Writes suite.yaml (and its mask files) into `dir` and returns its path.
// Throws std::invalid_argument for a bad option (a --rope item, --kv-heads at
// the rope level, ...).
std::filesystem::path write_check_suite(const CheckOptions& o, const FunctionInfo& f, const std::filesystem::path& dir);

}  // namespace headgrad::pyplug
