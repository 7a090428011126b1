#include "pyplug/python_plugin.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <headgrad/child_process.hpp>

#include <headgrad/log.hpp>
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using nlohmann::json;

namespace headgrad::pyplug {

namespace {

using Clock = std::chrono::steady_clock;

const char* wire_dtype(DType d) {
  switch (d) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::bfloat16: return "bfloat16";
    case DType::float16: return "float16";
    case DType::boolean: return "bool";
  }
  return "?";
}

std::optional<DType> dtype_from_wire(const std::string& s) {
  if (s == "float32") return DType::float32;
  if (s == "float64") return DType::float64;
  if (s == "bfloat16") return DType::bfloat16;
  if (s == "float16") return DType::float16;
  if (s == "bool") return DType::boolean;
  return std::nullopt;
}

using Named = std::vector<std::pair<std::string, Tensor>>;

struct Reply {
  json header;
  std::map<std::string, Tensor> tensors;
};

// The folder holding the headgrad package: the source tree's for the program
// of this build tree, the installed one otherwise.
std::string package_dir() {
  std::error_code ec;
#if defined(HEADGRAD_BUILD_TOOLS_DIR) && defined(HEADGRAD_PYTHON_SOURCE_DIR)
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && fs::weakly_canonical(exe.parent_path(), ec) == fs::weakly_canonical(HEADGRAD_BUILD_TOOLS_DIR, ec))
    return HEADGRAD_PYTHON_SOURCE_DIR;
  // the test programs of the build tree (tests/) use the source tree's too
  if (!ec && exe.string().rfind(fs::weakly_canonical(fs::path(HEADGRAD_BUILD_TOOLS_DIR).parent_path()).string(), 0) == 0)
    return HEADGRAD_PYTHON_SOURCE_DIR;
#endif
#ifdef HEADGRAD_PYTHON_INSTALL_DIR
  return HEADGRAD_PYTHON_INSTALL_DIR;
#else
  return "";
#endif
}

std::string interpreter() {
  if (const char* p = std::getenv("HEADGRAD_PYTHON"); p && *p) return p;
  return fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
}

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw PythonError(std::string("the Python worker stopped reading (") + std::strerror(errno) + ")");
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

// The process-wide connection to one worker.
class Worker {
 public:
  static Worker& get() {
    static Worker w;
    return w;
  }

  // Before a side is forked, in the forking process: a worker of its own.
  void prepare() {
    if (child_) return;
    if (external()) return;
    if (process_.pid() > 0 && owner_ != ::getpid()) forget();  // inherited from the process that forked us: not ours
    if (process_.running() && process_.has_exited()) discard("it had exited");
    if (!process_.running()) start();
  }
  void mark_child() { child_ = true; }
  // Kills our worker (the next prepare starts another); an external one is lost.
  void discard(const std::string& why) {
    if (external()) {
      lost_ = why;
      return;
    }
    if (process_.pid() <= 0 || owner_ != ::getpid()) return forget();
    logging::plugins()->info("replacing the Python worker (pid {}): {}", process_.pid(), why);
    process_.kill_and_reap();
    process_ = ChildProcess();
    to_ = from_ = -1;
    session_ = 0;
  }

  Reply request(const json& header, const Named& tensors) {
    if (!lost_.empty())
      throw PythonError("the Python process serving the functions is lost (" + lost_ +
                        "); it cannot be restarted from here");
    if (!child_ && !external()) prepare();
    if (session_ != ::getpid()) hello();
    send(header, tensors);
    return receive(child_ ? -1 : 600);
  }

  bool external() const { return std::getenv("HEADGRAD_PYTHON_WORKER_FDS") != nullptr; }
  WorkerStats stats;

 private:
  Worker() {
    if (const char* fds = std::getenv("HEADGRAD_PYTHON_WORKER_FDS")) {
      if (std::sscanf(fds, "%d,%d", &from_, &to_) != 2)
        throw PythonError(std::string("HEADGRAD_PYTHON_WORKER_FDS='") + fds + "' is not R,W (two fds)");
    }
  }

  // A worker inherited from the process that forked this one: our copies of
  // its pipes closed, the worker left to its owner.
  void forget() {
    process_.disown();
    to_ = from_ = -1;
    session_ = 0;
  }

  // On core's ChildProcess (the one fork of headgrad): its own process group,
  // killed with this process; the pipes stay open in the sides forked later,
  // which talk to it.
  void start() {
    const auto t0 = Clock::now();
    const std::string py = interpreter(), pkg = package_dir();
    std::string pythonpath = pkg;
    if (const char* old = std::getenv("PYTHONPATH"); old && *old) pythonpath += (pkg.empty() ? "" : ":") + std::string(old);
    ChildSpec spec;
    spec.to_parent = spec.from_parent = spec.close_other_fds = spec.shared_with_later_children = true;
    process_ = ChildProcess::spawn_program(spec, {py, "-m", "headgrad.worker"}, {{"PYTHONPATH", pythonpath}});
    to_ = process_.to_child();
    from_ = process_.from_child();
    owner_ = ::getpid();
    session_ = 0;
    try {
      hello(120);  // torch's import can take seconds on a loaded machine
    } catch (const PythonError& e) {
      discard("it did not start");
      throw PythonError(std::string(e.what()) + "; the worker is `" + py + " -m headgrad.worker` with PYTHONPATH=" +
                        pythonpath + " (it needs torch: Debian's python3-torch)");
    }
    stats.start_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    ++stats.starts;
  }

  // How our worker ended, once its pipe is closed: what it says itself if it
  // ends within a second, else killed.
  std::string ended() {
    for (int i = 0; i < 100 && !process_.has_exited(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ChildEnd end;
    end.wait_status = process_.kill_and_reap();
    process_ = ChildProcess();
    to_ = from_ = -1;
    session_ = 0;
    return describe_end(end);
  }

  // A fresh session: skips whatever a side that died left in the pipe.
  void hello(int timeout_s = 600) {
    const std::uint64_t nonce = (static_cast<std::uint64_t>(::getpid()) << 20) ^ ++counter_ ^
                                static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
    send({{"op", "hello"}, {"nonce", nonce}}, {});
    for (int tries = 0; tries < 64; ++tries) {
      const Reply r = receive(child_ ? -1 : timeout_s);
      if (r.header.value("op", "") == "hello" && r.header.value("nonce", std::uint64_t{0}) == nonce) {
        session_ = ::getpid();
        return;
      }
    }
    throw PythonError("the Python worker answers out of turn");
  }

  void send(const json& header, const Named& tensors) {
    if (to_ < 0) throw PythonError("no Python worker");
    json h = header;
    h["tensors"] = json::array();
    std::vector<std::pair<const char*, std::size_t>> blobs;
    for (const auto& [name, t] : tensors) {
      if (!t.defined()) {
        h["tensors"].push_back({{"name", name}, {"none", true}});
        continue;
      }
      // The view as it is: its span of storage, strides and offset within it.
      std::int64_t last = 0;
      bool empty = false;
      for (std::int64_t d = 0; d < t.dim(); ++d) {
        if (t.size(d) == 0) empty = true;
        last += (t.size(d) - 1) * t.strides()[static_cast<std::size_t>(d)];
      }
      const std::int64_t span = empty ? 0 : last + 1;
      const std::size_t elem = dtype_size(t.dtype());
      h["tensors"].push_back({{"name", name},
                              {"dtype", wire_dtype(t.dtype())},
                              {"shape", t.shape()},
                              {"strides", t.strides()},
                              {"offset", 0},
                              {"span", span}});
      blobs.emplace_back(static_cast<const char*>(t.storage()->data()) + static_cast<std::size_t>(t.offset()) * elem,
                         static_cast<std::size_t>(span) * elem);
    }
    const std::string text = h.dump();
    const auto n = static_cast<std::uint32_t>(text.size());
    write_all(to_, reinterpret_cast<const char*>(&n), sizeof n);
    write_all(to_, text.data(), text.size());
    for (const auto& [p, size] : blobs) write_all(to_, p, size);
  }

  // The pipe is non-blocking (ChildProcess makes it so): every read waits in poll first.
  void read_exact(char* p, std::size_t n, Clock::time_point deadline, bool timed) {
    while (n > 0) {
      int wait_ms = 1000;
      if (timed) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (ms <= 0) throw PythonError("the Python worker did not answer in time");
        wait_ms = static_cast<int>(std::min<long long>(ms, 1000));
      }
      std::vector<pollfd> pfd{{from_, POLLIN, 0}};
      if (poll_fds(pfd, wait_ms) == 0) continue;
      const ssize_t r = ::read(from_, p, n);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (r <= 0) {
        std::string how = "closed its pipe";
        if (!external() && !child_ && process_.pid() > 0 && owner_ == ::getpid()) how = ended();
        throw PythonError("the Python worker " + how + " (its messages are above, on stderr)");
      }
      p += r;
      n -= static_cast<std::size_t>(r);
    }
  }

  Reply receive(int timeout_s) {
    if (from_ < 0) throw PythonError("no Python worker");
    const bool timed = timeout_s > 0;
    const auto deadline = Clock::now() + std::chrono::seconds(timed ? timeout_s : 0);
    std::uint32_t n = 0;
    read_exact(reinterpret_cast<char*>(&n), sizeof n, deadline, timed);
    if (n > (1u << 24)) throw PythonError("the Python worker sent a header of " + std::to_string(n) + " bytes");
    std::string text(n, '\0');
    read_exact(text.data(), n, deadline, timed);
    Reply r;
    try {
      r.header = json::parse(text);
    } catch (const json::exception& e) {
      throw PythonError(std::string("the Python worker sent a malformed header: ") + e.what());
    }
    for (const auto& e : r.header.value("tensors", json::array())) {
      const std::string name = e.value("name", "");
      if (e.value("none", false)) {
        r.tensors[name] = Tensor();
        continue;
      }
      const auto dt = dtype_from_wire(e.value("dtype", ""));
      if (!dt) throw PythonError("the Python worker sent " + name + " as " + e.value("dtype", std::string("?")));
      Shape shape = e.at("shape").get<Shape>();
      Tensor t = Tensor::empty(shape, *dt);
      read_exact(static_cast<char*>(t.storage()->mutable_data()), static_cast<std::size_t>(t.numel()) * dtype_size(*dt),
                 deadline, timed);
      r.tensors[name] = t;
    }
    return r;
  }

  ChildProcess process_;  // ours (not an external one)
  int to_ = -1, from_ = -1;
  pid_t owner_ = 0, session_ = 0;
  bool child_ = false;
  std::uint64_t counter_ = 0;
  std::string lost_;
};

// Turns an error reply into the exception the side reports.
[[noreturn]] void raise(const json& h, const std::string& who) {
  const std::string op = h.value("op", "");
  if (op == "unsupported") throw UnsupportedError(h.value("message", std::string("unsupported")));
  std::string msg = who + " raised " + h.value("type", std::string("an exception")) + ": " +
                    h.value("message", std::string(""));
  if (const std::string where = h.value("where", std::string("")); !where.empty()) msg += " (at " + where + ")";
  throw PythonError(msg);
}

Reply call(const json& header, const Named& tensors, const std::string& who, const char* want) {
  Reply r = Worker::get().request(header, tensors);
  if (r.header.value("op", "") != want) raise(r.header, who);
  return r;
}

// RoPE settings as the worker offers them; positions as int-valued float64 [T] or [B, T].
json rope_settings(const RopeSpec& rope, std::int64_t d) {
  return {{"theta", rope.theta},
          {"style", std::string(rope_style_name(rope.style))},
          {"rotary_dim", rope.rotary_dim > 0 ? rope.rotary_dim : d},
          {"q_offset", rope.q_offset},
          {"default_positions", !rope.positions.defined() && rope.offset == 0}};
}

Tensor positions_of(const RopeSpec& rope, std::int64_t t) {
  if (rope.positions.defined()) return rope.positions;
  std::vector<double> v(static_cast<std::size_t>(t));
  for (std::int64_t i = 0; i < t; ++i) v[static_cast<std::size_t>(i)] = static_cast<double>(rope.offset + i);
  return Tensor::from_values(v, {t}, DType::float64);
}

class PythonAttention final : public Attention {
 public:
  explicit PythonAttention(PythonPluginDecl d) : decl_(std::move(d)) {}

  PluginInfo info() const override {
    PluginInfo i;
    i.name = decl_.name;
    i.version = "python";
    i.description = "Python function " + decl_.function + " (torch, in a worker)";
    i.capabilities = decl_.capabilities;
    return i;
  }

  Variable mha_forward(const Variable& x, const MhaWeights& w, const AttentionSpec& spec) const override {
    const MhaDims dims = mha_dims(x, w, spec, decl_.name);
    json settings = {{"num_heads", dims.heads}, {"num_kv_heads", dims.kv_heads}, {"head_dim", dims.head_dim},
                     {"causal", spec.causal}};
    if (spec.scale) settings["scale"] = *spec.scale;
    Named extra;
    if (spec.causal && spec.causal_alignment == CausalAlignment::bottom_right)
      throw UnsupportedError(decl_.name + ": bottom-right causal at the MHA level is the same as top-left only at "
                                          "Tq = Tk; not offered to Python functions");
    if (spec.rope.enabled) {
      settings["rope"] = rope_settings(spec.rope, dims.head_dim);
      extra.emplace_back("positions", positions_of(spec.rope, x.size(-2)));
    }
    add_feature_settings(settings, spec, true);
    Inputs in{{x, w.wq, w.wk, w.wv, w.wo}, {"x", "wq", "wk", "wv", "wo"}};
    // with biases (mha_dims checked all four or none): passed as bq, bk, bv, bo, their gradients back
    if (w.has_bias()) in.add({{"bq", w.bq}, {"bk", w.bk}, {"bv", w.bv}, {"bo", w.bo}});
    if (spec.sinks.defined()) in.add({{"sinks", spec.sinks}});
    if (spec.qk_norm.enabled) in.add({{"q_norm", w.q_norm}, {"k_norm", w.k_norm}});
    if (spec.x_kv.defined()) in.add({{"x_kv", spec.x_kv}});
    return run("mha", std::move(in), settings, extra, spec);
  }

  Variable core_forward(const Variable& q, const Variable& k, const Variable& v,
                        const AttentionSpec& spec) const override {
    const std::int64_t tq = q.size(-2), tk = k.size(-2);
    json settings = {{"num_heads", q.dim() >= 3 ? q.size(-3) : 1},
                     {"num_kv_heads", k.dim() >= 3 ? k.size(-3) : 1},
                     {"head_dim", q.size(-1)},
                     {"causal", spec.causal}};
    if (spec.scale) settings["scale"] = *spec.scale;
    Named extra;
    const bool folded = spec.causal && spec.causal_alignment == CausalAlignment::bottom_right && tq != tk;
    if (folded) {
      // what a function that takes `mask` can be given: the whole mask (the window's included), causal off
      extra.emplace_back("mask", attention_mask(spec, tq, tk));
      settings["causal"] = false;
    } else if (spec.mask.defined()) {
      extra.emplace_back("mask", spec.mask);
    }
    if (spec.rope.enabled) {
      settings["rope"] = rope_settings(spec.rope, q.size(-1));
      extra.emplace_back("positions", positions_of(spec.rope, tk));
    }
    add_feature_settings(settings, spec, !folded);
    Inputs in{{q, k, v}, {"q", "k", "v"}};
    if (spec.sinks.defined()) in.add({{"sinks", spec.sinks}});
    return run("core", std::move(in), settings, extra, spec);
  }

  Variable rope_forward(const Variable& x, const RopeSpec& spec) const override {
    json settings = {{"rope", rope_settings(spec, x.size(-1))}, {"head_dim", x.size(-1)}};
    return run("rope", Inputs{{x}, {"x"}}, settings, {{"positions", positions_of(spec, x.size(-2))}}, {});
  }

 private:
  json fixed() const {
    json f = {{"causal", decl_.capabilities.causal}, {"rope", decl_.capabilities.rope}};
    json r = json::object();
    if (decl_.rope.theta) r["theta"] = *decl_.rope.theta;
    if (decl_.rope.style) r["style"] = *decl_.rope.style;
    // a function that takes no rotary_dim rotates the whole head unless declared otherwise
    r["rotary_dim"] = decl_.rope.rotary_dim.value_or(0);
    f["rope_settings"] = r;
    return f;
  }

  // The op's inputs (the leaves whose gradients come back) and the names the worker knows them by.
  struct Inputs {
    std::vector<Variable> vars;
    std::vector<std::string> names;
    void add(std::initializer_list<std::pair<const char*, Variable>> named) {
      for (const auto& [name, var] : named) vars.push_back(var), names.emplace_back(name);
    }
  };

  // The settings of the features of current models the spec turns on (the
  // window unless it is folded into the mask); the worker hands them on as
  // window={left, right}, softcap=C, qk_norm={axis, eps, gain} (tools/headgrad_ref.py's).
  static void add_feature_settings(json& settings, const AttentionSpec& spec, bool window) {
    auto bound = [](const std::optional<std::int64_t>& b) { return b ? json(*b) : json(nullptr); };
    if (window && spec.window.enabled())
      settings["window"] = {{"left", bound(spec.window.left)}, {"right", bound(spec.window.right)}};
    if (spec.softcap > 0) settings["softcap"] = spec.softcap;
    if (spec.qk_norm.enabled)
      settings["qk_norm"] = {{"axis", std::string(qk_norm_axis_name(spec.qk_norm.axis))},
                             {"eps", spec.qk_norm.eps},
                             {"gain", std::string(qk_norm_gain_name(spec.qk_norm.gain))}};
  }

  Variable run(const std::string& level, Inputs op_inputs, const json& settings, const Named& extra,
               const AttentionSpec& spec) const {
    std::vector<Variable> inputs = std::move(op_inputs.vars);
    const std::vector<std::string> names = std::move(op_inputs.names);
    const std::string who = "Python function " + decl_.function;
    const std::string fn = decl_.function;
    const json fixed_settings = fixed();
    std::shared_ptr<RopeTaps> taps = spec.rope_taps;
    const bool grad = grad_enabled();
    auto forward = [=](CustomOpContext& ctx, const std::vector<Tensor>& in) {
      Named tensors;
      for (std::size_t i = 0; i < in.size(); ++i) tensors.emplace_back(names[i], in[i]);
      for (const auto& e : extra) tensors.push_back(e);
      const json header = {{"op", "forward"},       {"fn", fn},
                           {"level", level},       {"inputs", names},  // the leaves' names, in the order of the gradients
                           {"settings", settings}, {"fixed", fixed_settings},
                           {"grad", grad}};
      Reply r = call(header, tensors, who, "out");
      ctx.scalars = {static_cast<double>(r.header.value("id", 0))};
      auto out = r.tensors.find("out");
      if (out == r.tensors.end() || !out->second.defined()) throw PythonError(who + " returned no output");
      if (taps) {
        if (auto t = r.tensors.find("q_rot"); t != r.tensors.end() && t->second.defined()) taps->q_rot.push_back(t->second);
        if (auto t = r.tensors.find("k_rot"); t != r.tensors.end() && t->second.defined()) taps->k_rot.push_back(t->second);
      }
      return out->second;
    };
    auto backward = [=](const CustomOpContext& ctx, const Tensor& grad_out) {
      const auto id = static_cast<std::int64_t>(ctx.scalars.at(0));
      if (id == 0) throw PythonError(who + ": its output does not require a gradient (no input reaches it)");
      Reply r = call({{"op", "backward"}, {"id", id}}, {{"grad_out", grad_out}}, who, "grads");
      std::vector<Tensor> grads;
      for (std::size_t i = 0; i < names.size(); ++i) {
        auto g = r.tensors.find("g" + std::to_string(i));
        grads.push_back(g == r.tensors.end() ? Tensor() : g->second);
      }
      return grads;
    };
    return custom_op("python:" + decl_.name, std::move(inputs), forward, backward);
  }

  PythonPluginDecl decl_;
};

}  // namespace

bool FunctionInfo::takes(const std::string& kw) const {
  return var_keyword || std::find(names.begin(), names.end(), kw) != names.end();
}

// The names `headgrad plugins` prints (kCapabilityNames), the 16-bit extras, and
// the short spellings of older listings (mask, Tq!=Tk, gqa, rope-level).
const std::vector<std::string>& known_capability_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& c : kCapabilityNames) n.emplace_back(c.name);
    n.insert(n.end(), {"bfloat16", "float16"});
    return n;
  }();
  return names;
}

Capabilities parse_capabilities(const std::vector<std::string>& names) {
  static const std::vector<std::pair<std::string, std::string>> aliases = {
      {"mask", "bool_mask"}, {"Tq!=Tk", "cross_lengths"}, {"gqa", "grouped_kv"}, {"rope-level", "rope_level"}};
  Capabilities c;
  c.causal = false;
  const bool dtypes_named = std::any_of(names.begin(), names.end(),
                                        [](const std::string& n) { return n == "float32" || n == "float64"; });
  c.float32 = c.float64 = !dtypes_named;
  for (std::string n : names) {
    for (const auto& [alias, field] : aliases)
      if (n == alias) n = field;
    if (n == "bfloat16" || n == "float16") {
      c.extra.push_back(n);
      continue;
    }
    bool found = false;
    for (const auto& cap : kCapabilityNames)
      if (cap.name == n) found = (c.*cap.flag = true, true);
    if (found) continue;
    std::vector<std::string> all = known_capability_names();
    for (const auto& a : aliases) all.push_back(a.first);
    // the closest name by edit distance (a typo), if close enough
    auto distance = [](const std::string& a, const std::string& b) {
      std::vector<std::size_t> row(b.size() + 1);
      for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
      for (std::size_t i = 1; i <= a.size(); ++i) {
        std::size_t prev = row[0]++;
        for (std::size_t j = 1; j <= b.size(); ++j) {
          const std::size_t cur = row[j];
          row[j] = std::min({row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] != b[j - 1])});
          prev = cur;
        }
      }
      return row[b.size()];
    };
    std::string near;
    std::size_t best = 3;
    for (const auto& k : all)
      if (const std::size_t dd = distance(n, k); dd < best) best = dd, near = k;
    std::string known;
    for (const auto& k : known_capability_names()) known += (known.empty() ? "" : ", ") + k;
    throw std::invalid_argument("unknown capability '" + n + "'" + (near.empty() ? "" : " (did you mean '" + near + "'?)") +
                                "; known: " + known);
  }
  if (!c.mha && !c.core && !c.rope_level)
    throw std::invalid_argument("the capabilities name no level: give mha, core or rope_level");
  if (c.bias && !c.mha) throw std::invalid_argument("capability 'bias' is an MHA-level one: give mha too");
  if ((c.qk_norm || c.cross_attention) && !c.mha)
    throw std::invalid_argument(std::string("capability '") + (c.qk_norm ? "qk_norm" : "cross_attention") +
                                "' is an MHA-level one: give mha too");
  return c;
}

FunctionInfo describe_function(const std::string& function) {
  Reply r = call({{"op", "describe"}, {"fn", function}}, {}, "Python function " + function, "described");
  FunctionInfo f;
  f.names = r.header.value("names", std::vector<std::string>{});
  f.declared = r.header.value("declared", std::vector<std::string>{});
  f.var_keyword = r.header.value("var_keyword", false);
  f.where = r.header.value("where", std::string(""));
  return f;
}

LoadedPlugin make_python_plugin(const PythonPluginDecl& decl) {
  LoadedPlugin p;
  auto a = std::make_shared<PythonAttention>(decl);
  p.info = a->info();
  p.abi_version = HEADGRAD_PLUGIN_ABI_VERSION;
  p.file = decl.function;
  p.attention = a;
  return p;
}

bool is_python_plugin(const Attention& a) { return dynamic_cast<const PythonAttention*>(&a) != nullptr; }

void before_side(const Attention& a) {
  if (is_python_plugin(a)) Worker::get().prepare();
}

void in_side_child() { Worker::get().mark_child(); }

void after_side(const Attention& a, bool clean) {
  if (!clean && is_python_plugin(a)) Worker::get().discard("its side did not finish cleanly (crash or timeout)");
}

bool external_worker() { return std::getenv("HEADGRAD_PYTHON_WORKER_FDS") != nullptr; }

WorkerStats worker_stats() { return Worker::get().stats; }

}  // namespace headgrad::pyplug
