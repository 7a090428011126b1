// Running one side of a case: one plugin, fresh leaf variables holding this
// side's own copy of the shared inputs (what a plugin writes into its inputs
// never reaches the other side, isolated or not: private_copy in this
// process, a forked child's copy-on-write pages in isolation), forward,
// loss = sum(out * r), backward.
//
//   SideResult s = run_side(c, inputs, registry.get("batched"), {.timeout_s = 5});
//   if (s.status != SideStatus::ok) std::cout << s.cause;   // "plugin batched crashed with SIGSEGV (segmentation fault)"
//
// Isolated (the default), the side runs in a child (ChildProcess,
// headgrad/child_process.hpp), in a process group of its own, that sends its
// tensors back through a pipe (length first) and leaves with _exit; the parent
// reads until the message is complete or the time limit passes, then kills the
// whole group (whatever the plugin forked goes too, and cannot hold the result
// back). How a child ended is said in describe_end's words, as everywhere. So a plugin that throws, segfaults,
// aborts or hangs fails its case with the cause named, and the suite goes on.
// Without isolation the side runs in this process (handy under a debugger):
// exceptions are still caught, crashes and hangs are not.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <headgrad/loader.hpp>

#include "case/inputs.hpp"
#include "case/suite.hpp"

namespace headgrad::runner {

enum class SideStatus {
  ok,
  not_loaded,  // no plugin by that name (missing or rejected library)
  threw,       // the plugin threw an exception
  crashed,     // killed by a signal, or its process ended without a result
  timed_out,   // exceeded the case's time limit
  bad_output,  // out of the wrong shape or dtype
  non_finite,  // NaN or Inf in a returned tensor
};
std::string_view side_status_name(SideStatus s);  // "ok", "not_loaded", "threw", ...
// A plugin that could not run (not loaded, threw, crashed, hung): exit code 3.
// bad_output and non_finite are wrong results: the case fails (exit code 1).
bool is_plugin_error(SideStatus s);

struct SideResult {
  std::string plugin;
  SideStatus status = SideStatus::ok;
  std::string cause;          // "plugin X threw: ..."; empty when ok
  TensorSet tensors;          // out, then the gradients, in tensor_names() order
  double seconds = 0;         // wall time, child start (a later run in a shared child: its start) to result
  double compute_seconds = 0; // forward + backward, measured where they ran
  // Memory where the side ran, at the end of its forward + backward (0 when
  // unknown): the process's peak resident set (getrusage ru_maxrss; a forked
  // child's counts the pages it shares with the parent, the inputs among them),
  // and the most bytes live tensors held during the side, above what they held
  // before it (memory_stats(): leaves' copies, the graph, the gradients).
  std::uint64_t peak_rss_bytes = 0;
  std::uint64_t peak_tensor_bytes = 0;
};

struct ExecOptions {
  bool isolate = true;
  double timeout_s = 60;          // isolated runs only; in (0, 86400] (timeout_problem, case/suite.hpp)
  std::function<void()> on_wait;  // called about every 200 ms while a child runs (progress)
};

// One tap (q_rot or k_rot) from the parts rope_queries/rope_keys recorded:
// one [B, H, T, d] as it is, or one [B, T, d] per head stacked to [B, H, T, d];
// undefined when the parts do not assemble (none recorded, mixed shapes).
Tensor assemble_tap(const std::vector<Tensor>& parts);

// The mha-level leaves of a side: each weight (and bias, when the inputs have
// them) as a Variable that takes a gradient; an absent bias stays undefined.
MhaWeights leaf_weights(const CaseInputs& in);  // the QK-norm gains too, when the inputs have them

// Cross-attention: x_kv made a leaf that takes a gradient (spec.x_kv; nothing
// without one). After it, add_qk_norm_cross_grads appends dq_norm, dk_norm
// (a case with qk_norm) and dx_kv (a cross case) in tensor_names() order.
void make_x_kv_leaf(AttentionSpec& spec, const CaseInputs& in);
void add_qk_norm_cross_grads(const CaseSpec& c, const MhaWeights& w, const AttentionSpec& spec, TensorSet& out);

// In this process; throws what the plugin throws (BadOutputError for an
// output of the wrong shape or dtype). own_inputs: `in` belongs to this side
// alone (a forked child's copy-on-write pages), so it is not copied first.
TensorSet compute_side(const CaseSpec& c, const CaseInputs& in, const Attention& plugin, bool own_inputs = false);

class BadOutputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

SideResult run_side(const CaseSpec& c, const CaseInputs& in, const LoadedPlugin& plugin,
                    const ExecOptions& options);

// One plugin's runs one after another in one child, each result sent as it is
// ready and each run timed from the end of the one before (the oracle's
// float64 golden, then its baseline in the case's dtype: run_golden). What
// one run freed, the next reuses, where a fresh child would fault in fresh
// pages. A run that child does not finish (it crashed, hung, or sent garbage)
// fails as run_side says, and the runs after it get a child of their own.
// One result per job, in order; without isolation, run_side's in turn.
struct SideJob {
  const CaseSpec* c;
  const CaseInputs* in;
};
std::vector<SideResult> run_sides(const std::vector<SideJob>& jobs, const LoadedPlugin& plugin,
                                  const ExecOptions& options);

}  // namespace headgrad::runner
