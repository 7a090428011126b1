// The catalog of known multi-head attention bugs: each has a stable name, a
// one-line explanation, the fix, and the shapes at which it cannot be seen
// (its signature, used by localization and the weak-suite warnings).
#pragma once

#include <optional>
#include <span>
#include <string_view>

namespace headgrad::diagnosis {

enum class Bug {
#define HEADGRAD_BUG(name) name,
#include "analysis/bug_names.def"
#undef HEADGRAD_BUG
  count_,  // keep last
};

// What a bug needs in a case before it can show.
struct Visibility {
  bool needs_heads = false;    // invisible at H = 1
  bool needs_seq = false;      // invisible at T = 1 (or Tk = 1)
  bool needs_batch = false;    // invisible at B = 1
  bool needs_causal = false;   // invisible without a causal mask
  bool needs_d_lt_D = false;   // invisible when the head dim equals the model dim
  bool mha_only = false;       // lives in the projections or the head layout
  bool needs_tq_ne_tk = false; // invisible when Tq = Tk (so at the mha level): core cases only
  bool needs_empty_row = false;    // invisible unless a query row has every key masked
  bool needs_large_logits = false; // invisible unless a score passes exp's range (~11 float16, ~88 float32 and bfloat16, ~709 float64)
  // Grouped kv heads (G = H / Hkv query heads per kv head):
  bool needs_group = false;     // invisible at Hkv = H (G = 1)
  bool needs_kv_heads = false;  // invisible at Hkv = 1 (MQA)
  bool needs_non_square = false;  // invisible at H = Hkv^2 (G = Hkv)
  bool needs_16bit = false;  // invisible in float64 and float32: only bfloat16 / float16 show it
};

struct BugInfo {
  Bug bug;
  std::string_view name;         // stable: what suites write in expect.diagnosis (from bug_names.def)
  std::string_view explanation;  // one line
  std::string_view fix;          // one line
  Visibility visibility;
};

std::span<const BugInfo> bug_catalog();
const BugInfo& bug_info(Bug bug);
std::optional<Bug> bug_from_name(std::string_view name);

}  // namespace headgrad::diagnosis
