// A Python function as a headgrad plugin: its forward and backward run in a
// Python worker with torch (`python3 -m headgrad.worker`, tools/python), one
// custom op per call, so the gradients checked are torch.autograd's through
// the user's own code.
//
//   PythonPluginDecl d{"mine", "/abs/glue.py:my_attention", caps};
//   registry.add(make_python_plugin(d));     // then compare: [mine, per_head]
//
// The worker is started by the process that forks the sides (the runner, or
// each -j worker), on first use, and reused across cases: torch is imported
// once. A side child talks to its parent's worker through inherited pipes;
// run_isolated (execute.cpp) calls before_side() before forking, in_side_child()
// in the child and after_side() once the child is reaped, which replaces a
// worker whose side died or hung mid-conversation.
//
// HEADGRAD_PYTHON (default /usr/bin/python3) is the interpreter;
// HEADGRAD_PYTHON_WORKER_FDS=R,W makes this process talk to a worker it did
// not start (headgrad.check serving closures from the calling process): it
// is never restarted, and -j is 1.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <headgrad/loader.hpp>
#include <headgrad/plugin.hpp>

namespace headgrad::pyplug {

// Settings a function without the matching keyword argument does at one value only.
struct FixedRope {
  std::optional<double> theta;
  std::optional<std::string> style;        // "interleaved" | "half"
  std::optional<std::int64_t> rotary_dim;
};

struct PythonPluginDecl {
  std::string name;         // what `compare:` names
  std::string function;     // "/abs/file.py:fn", "module:fn" or "@fn" (served)
  Capabilities capabilities;
  FixedRope rope;           // the declared RoPE settings of a function that does not take them
  std::string origin;       // for messages: "suite.yaml:3:5" or "headgrad check"
};

// Capability names as `headgrad plugins` prints them (kCapabilityNames: mha,
// core, causal, bool_mask, cross_lengths, float32, float64, dropout,
// grouped_kv, rope, rope_level, bias, window, softcap, sinks, qk_norm,
// cross_attention; and bfloat16, float16), or the short
// spellings mask, Tq!=Tk, gqa, rope-level. float32 and float64 are on unless
// the list names one of them. Throws std::invalid_argument naming an unknown
// one (and the closest), and for bias, qk_norm or cross_attention without mha.
Capabilities parse_capabilities(const std::vector<std::string>& names);
const std::vector<std::string>& known_capability_names();

class PythonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What the worker knows of a function's signature.
struct FunctionInfo {
  std::vector<std::string> names;     // the offered keyword arguments it takes (all of them with **kwargs)
  bool var_keyword = false;
  std::string where;                  // "file.py:12"
  std::vector<std::string> declared;  // those its signature names itself (not through **kwargs)
  bool takes(const std::string& kw) const;
};
// Asks the worker (started here if need be); throws PythonError when the
// function cannot be imported, naming the exception and the line.
FunctionInfo describe_function(const std::string& function);

LoadedPlugin make_python_plugin(const PythonPluginDecl& decl);
bool is_python_plugin(const Attention& a);

// The hooks around a forked side (execute.cpp). No-ops for other plugins.
void before_side(const Attention& a);
void in_side_child();
void after_side(const Attention& a, bool clean);
// True when this process talks to an external worker (HEADGRAD_PYTHON_WORKER_FDS).
bool external_worker();

// Seconds spent: starting workers (torch import included) and moving tensors
// over the pipes, in this process; for `headgrad check -v` and the docs.
struct WorkerStats {
  double start_seconds = 0;
  int starts = 0;
};
WorkerStats worker_stats();

}  // namespace headgrad::pyplug
