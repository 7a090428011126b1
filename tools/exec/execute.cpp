#include "exec/execute.hpp"

#include <cxxabi.h>
#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>

#include <headgrad/child_process.hpp>
#include <headgrad/log.hpp>
#include <headgrad/ops.hpp>
#include <headgrad/parallel.hpp>

#include "case/axes.hpp"
#include "pyplug/python_plugin.hpp"

namespace headgrad::runner {

std::string_view side_status_name(SideStatus s) {
  switch (s) {
    case SideStatus::ok: return "ok";
    case SideStatus::not_loaded: return "not_loaded";
    case SideStatus::threw: return "threw";
    case SideStatus::crashed: return "crashed";
    case SideStatus::timed_out: return "timed_out";
    case SideStatus::bad_output: return "bad_output";
    case SideStatus::non_finite: return "non_finite";
  }
  return "?";
}

bool is_plugin_error(SideStatus s) {
  return s == SideStatus::not_loaded || s == SideStatus::threw || s == SideStatus::crashed ||
         s == SideStatus::timed_out;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void check_output(const Variable& out, const Tensor& r, DType dtype) {
  if (!out.defined()) throw BadOutputError("returned no output (an undefined Variable)");
  if (out.shape() != r.shape())
    throw BadOutputError("returned out of shape " + shape_str(out.shape()) + ", expected " + shape_str(r.shape()));
  if (out.dtype() != dtype)
    throw BadOutputError("returned " + std::string(dtype_name(out.dtype())) + " out for " +
                         std::string(dtype_name(dtype)) + " inputs");
}

// "std::runtime_error" for the exception being handled, when the ABI says.
std::string current_exception_type() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  if (!type) return "an exception";
  int status = 0;
  char* name = abi::__cxa_demangle(type->name(), nullptr, nullptr, &status);
  std::string s = status == 0 && name ? name : type->name();
  std::free(name);
  return s;
}

// ---- the child's message: one kind byte, then
//   'R' (result): f64 start of the run (steady clock, seconds), f64 compute seconds, u64 peak RSS bytes,
//        u64 peak tensor bytes, u32 count, then per tensor:
//        u32 name length, name, u8 defined, [u8 dtype, u32 ndim, i64 dims, raw row-major data]
//   'E' (threw) / 'B' (bad output): u64 length, UTF-8 text
class WireWriter {
 public:
  template <class T>
  void put(const T& v) { bytes(&v, sizeof v); }
  void bytes(const void* p, std::size_t n) { buf_.append(static_cast<const char*>(p), n); }
  void text(const std::string& s) {
    put<std::uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  std::string& str() { return buf_; }

 private:
  std::string buf_;
};

class WireReader {
 public:
  explicit WireReader(const std::string& buf) : buf_(buf) {}
  template <class T>
  T get() {
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  const char* take(std::size_t n) {
    if (buf_.size() - pos_ < n) throw std::runtime_error("the result is truncated");
    const char* p = buf_.data() + pos_;
    pos_ += n;
    return p;
  }
  std::size_t remaining() const { return buf_.size() - pos_; }
  std::string text() {
    const auto n = get<std::uint64_t>();
    if (n > buf_.size()) throw std::runtime_error("the result is truncated");
    return std::string(take(n), n);
  }

 private:
  const std::string& buf_;
  std::size_t pos_ = 0;
};

// The process's peak resident set since it began, or since reset_peak_rss()
// said true: Linux's high-water mark (VmHWM), which writing 5 to
// /proc/self/clear_refs sets back to the current RSS; getrusage's ru_maxrss
// (never reset) where /proc cannot say.
bool g_peak_rss_reset = false;
bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return (std::fclose(f) == 0) && ok;
}
std::uint64_t peak_rss() {
  if (g_peak_rss_reset)
    if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
      char line[256];
      unsigned long long kib = 0;
      bool found = false;
      while (!found && std::fgets(line, sizeof line, f)) found = std::sscanf(line, "VmHWM: %llu kB", &kib) == 1;
      std::fclose(f);
      if (found) return static_cast<std::uint64_t>(kib) * 1024;
    }
  rusage ru{};
  return ::getrusage(RUSAGE_SELF, &ru) == 0 ? static_cast<std::uint64_t>(ru.ru_maxrss) * 1024 : 0;  // KiB
}

// A side's memory figures (SideResult): this process's peak RSS, and the
// tensors' peak since reset_peak_memory() above what was live before.
struct SideMemory {
  std::uint64_t peak_rss_bytes = 0, peak_tensor_bytes = 0;
};
SideMemory side_memory(std::size_t live_before) {
  SideMemory m;
  m.peak_rss_bytes = peak_rss();
  const MemoryStats s = memory_stats();
  m.peak_tensor_bytes = s.peak_bytes > live_before ? s.peak_bytes - live_before : 0;
  return m;
}

// The 'R' message, sent length-first: the header bytes of each tensor built
// here, its data written from the tensor's own storage (a model-sized result
// is not copied into one buffer first). `tensors` are contiguous.
bool send_result(int fd, const TensorSet& tensors, double started_s, double compute_seconds, const SideMemory& memory) {
  const auto data_bytes = [](const Tensor& t) { return static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()); };
  WireWriter head;
  head.put('R');
  head.put(started_s);
  head.put(compute_seconds);
  head.put(memory.peak_rss_bytes);
  head.put(memory.peak_tensor_bytes);
  head.put(static_cast<std::uint32_t>(tensors.size()));
  std::vector<std::string> headers;  // the bytes before each tensor's data
  std::uint64_t length = 0;
  for (const auto& [name, t] : tensors) {
    head.put(static_cast<std::uint32_t>(name.size()));
    head.bytes(name.data(), name.size());
    head.put(static_cast<std::uint8_t>(t.defined()));
    if (t.defined()) {
      head.put(static_cast<std::uint8_t>(t.dtype()));
      head.put(static_cast<std::uint32_t>(t.dim()));
      for (std::int64_t s : t.shape()) head.put(s);
      length += data_bytes(t);
    }
    length += head.str().size();
    headers.push_back(std::move(head.str()));
    head.str().clear();
  }
  if (!write_all(fd, std::string_view(reinterpret_cast<const char*>(&length), sizeof length))) return false;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!write_all(fd, headers[i])) return false;
    const Tensor& t = tensors[i].tensor;
    if (!t.defined()) continue;
    const auto* data =
        static_cast<const char*>(t.storage()->data()) + static_cast<std::size_t>(t.offset()) * dtype_size(t.dtype());
    if (!write_all(fd, std::string_view(data, data_bytes(t)))) return false;
  }
  return true;
}

std::string encode_text(char kind, const std::string& text) {
  WireWriter w;
  w.put(kind);
  w.text(text);
  return std::move(w.str());
}

TensorSet decode_result(WireReader& r, double& started_s, double& compute_seconds, SideMemory& memory) {
  started_s = r.get<double>();
  compute_seconds = r.get<double>();
  memory.peak_rss_bytes = r.get<std::uint64_t>();
  memory.peak_tensor_bytes = r.get<std::uint64_t>();
  const auto count = r.get<std::uint32_t>();
  TensorSet out;
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto name_len = r.get<std::uint32_t>();
    std::string name(r.take(name_len), name_len);
    if (!r.get<std::uint8_t>()) {
      out.push_back({name, Tensor()});
      continue;
    }
    const auto dtype = static_cast<DType>(r.get<std::uint8_t>());
    if (dtype != DType::float32 && dtype != DType::float64 && dtype != DType::boolean && !is_16bit(dtype))
      throw std::runtime_error("unknown dtype in the result");
    const auto ndim = r.get<std::uint32_t>();
    if (ndim > 16) throw std::runtime_error("implausible rank in the result");
    Shape shape(ndim);
    for (auto& s : shape) {
      s = r.get<std::int64_t>();
      if (s < 0) throw std::runtime_error("negative size in the result");
    }
    // The sizes come from another process: checked against the bytes that
    // actually arrived before anything is allocated for them.
    std::uint64_t nbytes = dtype_size(dtype);
    for (const std::int64_t s : shape)
      if (__builtin_mul_overflow(nbytes, static_cast<std::uint64_t>(s), &nbytes))
        throw std::runtime_error("a tensor size that overflows in the result");
    if (nbytes > r.remaining()) throw std::runtime_error("the result is truncated");
    Tensor t = Tensor::empty(shape, dtype);
    std::memcpy(t.storage()->mutable_data(), r.take(nbytes), nbytes);
    out.push_back({name, t});
  }
  return out;
}

// In the forked child: computes one run and sends its message length-first,
// so the parent knows when it is complete even if a process the plugin
// forked still holds the pipe open. False when the parent is gone.
bool compute_and_send(int fd, const CaseSpec& c, const CaseInputs& in, const Attention& plugin) {
  std::string message;  // a failure's text
  std::optional<TensorSet> result;
  double seconds = 0;
  SideMemory memory;
  const auto t0 = Clock::now();
  try {
    const std::size_t live_before = memory_stats().current_bytes;
    reset_peak_memory();
    TensorSet out = compute_side(c, in, plugin, /*own_inputs=*/true);
    seconds = seconds_since(t0);
    memory = side_memory(live_before);
    for (auto& named : out) named.tensor = named.tensor.defined() ? named.tensor.contiguous() : Tensor();
    result = std::move(out);
  } catch (const BadOutputError& e) {
    message = encode_text('B', e.what());
  } catch (const std::exception& e) {
    message = encode_text('E', current_exception_type() + ": " + e.what());
  } catch (...) {
    message = encode_text('E', current_exception_type() + " (not a std::exception)");
  }
  std::cout.flush();  // what the plugin printed, if anything: before the result, after
  std::cerr.flush();  // which the parent ends this process group
  std::fflush(nullptr);
  const double started_s = std::chrono::duration<double>(t0.time_since_epoch()).count();
  return result ? send_result(fd, *result, started_s, seconds, memory) : send_message(fd, message);
}

// One child's runs, one after another (run_sides). Between two, the tensor
// cache goes back to the system: the next run's buffers are other sizes, and
// the pages just freed are the cheapest to map again; the peak RSS starts over.
int child_main(int fd, const std::vector<SideJob>& jobs, const Attention& plugin) {
  pyplug::in_side_child();  // a Python plugin talks to its parent's worker
  set_num_threads(0);  // this process's own workers (HEADGRAD_NUM_THREADS or the core count)
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    if (k > 0) {
      empty_cache();
      g_peak_rss_reset = reset_peak_rss();
    }
    if (!compute_and_send(fd, *jobs[k].c, *jobs[k].in, plugin)) break;  // the parent is gone or gave up on us
  }
  return 0;
}

// Bytes of the tensors a side sends back: out has r's shape, each gradient its input's.
std::uint64_t result_bytes(const CaseInputs& in) {
  std::uint64_t n = 0;
  for (const Tensor* t : {&in.r, &in.x, &in.wq, &in.wk, &in.wv, &in.wo, &in.q, &in.k, &in.v, &in.sinks})
    if (t->defined()) n += static_cast<std::uint64_t>(t->numel()) * dtype_size(t->dtype());
  return n;
}

// The result of one run from its complete message, or why there is none.
// `started`: when the parent saw the run begin, moved back to when the child
// says it began (steady_clock is the system's monotonic clock, one for every
// process), if earlier.
SideResult receive_side(const std::string& who, Message& wire, const ChildProcess::ReadOutcome& read,
                        std::uint64_t max_wire, Clock::time_point& started) {
  SideResult res;
  if (read.oversized) {
    res.status = SideStatus::crashed;
    res.cause = who + "'s process sent more than the " + std::to_string(max_wire) +
                " bytes its result can take (a malformed result)";
    return res;
  }
  // With a complete result, how the process ended afterwards (our SIGKILL) does not matter.
  if (!wire.complete()) {
    res.status = read.end.timed_out ? SideStatus::timed_out : SideStatus::crashed;
    res.cause = who + " " + describe_end(read.end, read.end.exited() ? "without a result (did the plugin call exit()?)" : "");
    return res;
  }
  std::string& message = wire.take_body();  // in place: a result can be large
  try {
    WireReader r(message);
    const char kind = r.get<char>();
    if (kind == 'R') {
      SideMemory memory;
      double started_s = 0;
      res.tensors = decode_result(r, started_s, res.compute_seconds, memory);
      started = std::min(started, Clock::time_point(std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(started_s))));
      res.peak_rss_bytes = memory.peak_rss_bytes;
      res.peak_tensor_bytes = memory.peak_tensor_bytes;
    } else if (kind == 'E') {
      res.status = SideStatus::threw;
      res.cause = who + " threw " + r.text();
    } else if (kind == 'B') {
      res.status = SideStatus::bad_output;
      res.cause = who + " " + r.text();
    } else {
      throw std::runtime_error("unknown message kind");
    }
  } catch (const std::exception& e) {
    res.status = SideStatus::crashed;
    res.cause = who + "'s process sent a malformed result (" + e.what() + ")";
    res.tensors.clear();
  }
  return res;
}

// The jobs in one child, each result read as it comes, each run timed from
// the end of the one before (the first from the fork). Returns the results of the runs the child
// finished (a message, whatever it said) and, last, that of the run it did
// not (crashed, hung, or sent garbage) if any: the runs after it are not here.
std::vector<SideResult> run_isolated(const std::vector<SideJob>& jobs, const LoadedPlugin& plugin,
                                     const ExecOptions& options) {
  const std::string who = "plugin " + plugin.info.name;
  pyplug::before_side(*plugin.attention);  // a Python plugin's worker, started here once and reused
  auto t0 = Clock::now();
  ChildProcess child = ChildProcess::spawn({.to_parent = true}, [&](const ChildEnds& ends) {
    return child_main(ends.to_parent, jobs, *plugin.attention);
  });
  std::vector<SideResult> out;
  bool clean = true;
  for (std::size_t k = 0; k < jobs.size(); ++k) {
    // Reading stops once the message is complete, or once it grows past what
    // the side's tensors (and a message) can take.
    const std::uint64_t max_wire = 2 * result_bytes(*jobs[k].in) + (std::uint64_t{1} << 20);
    Message wire;
    const auto deadline =
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_s));
    const bool last = k + 1 == jobs.size();
    const auto read = child.read_message(wire, deadline, options.timeout_s, max_wire, options.on_wait, last);
    const auto received = Clock::now();
    const bool finished = wire.complete() && !read.oversized;  // asked before receive_side takes the body
    // The child went on to the next run as soon as it had sent this one's result.
    const auto previous_end = t0;
    auto started = t0;
    t0 = received;
    SideResult res = receive_side(who, wire, read, max_wire, started);
    // The child began this run while the last of the one before was still
    // being read: the two meet where this one began, so the runs' times add
    // up to the wall time and none is shorter than its own compute.
    if (k > 0 && started < previous_end)
      out.back().seconds -= std::chrono::duration<double>(previous_end - started).count();
    res.plugin = plugin.info.name;
    res.seconds = std::chrono::duration<double>(received - started).count();
    clean = finished && !read.end.timed_out;
    out.push_back(std::move(res));
    if (!finished) break;  // read_message has ended the child
  }
  // A side that died or hung mid-conversation leaves its Python worker in an unknown state.
  pyplug::after_side(*plugin.attention, clean);
  return out;
}

SideResult run_in_process(const CaseSpec& c, const CaseInputs& in, const LoadedPlugin& plugin) {
  SideResult res;
  res.plugin = plugin.info.name;
  const std::string who = "plugin " + plugin.info.name;
  const auto t0 = Clock::now();
  const std::size_t live_before = memory_stats().current_bytes;
  reset_peak_memory();
  try {
    res.tensors = compute_side(c, in, *plugin.attention);
  } catch (const BadOutputError& e) {
    res.status = SideStatus::bad_output;
    res.cause = who + " " + e.what();
  } catch (const std::exception& e) {
    res.status = SideStatus::threw;
    res.cause = who + " threw " + current_exception_type() + ": " + e.what();
  } catch (...) {
    res.status = SideStatus::threw;
    res.cause = who + " threw " + current_exception_type() + " (not a std::exception)";
  }
  res.seconds = res.compute_seconds = seconds_since(t0);
  const SideMemory memory = side_memory(live_before);
  res.peak_rss_bytes = memory.peak_rss_bytes;
  res.peak_tensor_bytes = memory.peak_tensor_bytes;
  return res;
}

}  // namespace

// The taps a case asks for, from what rope_queries/rope_keys recorded: one
// [B, H, T, d] as it is, or one [B, T, d] per head stacked on dim 1. A side
// that recorded none (it rotates without the engine's helpers) reports the
// tap as missing.
Tensor assemble_tap(const std::vector<Tensor>& parts) {
  if (parts.empty()) return {};
  if (parts.size() == 1 && parts[0].dim() == 4) return parts[0];
  const Shape& s = parts[0].shape();
  if (s.size() != 3) return parts.size() == 1 ? parts[0] : Tensor();
  Tensor out = Tensor::empty({s[0], static_cast<std::int64_t>(parts.size()), s[1], s[2]}, parts[0].dtype());
  for (std::size_t h = 0; h < parts.size(); ++h) {
    if (parts[h].shape() != s) return {};
    out.narrow(1, static_cast<std::int64_t>(h), 1).copy_(parts[h].reshape({s[0], 1, s[1], s[2]}));
  }
  return out;
}

namespace {

void add_taps(const CaseSpec& c, const AttentionSpec& spec, TensorSet& res) {
  for (const auto& tap : c.taps)
    res.push_back({tap, assemble_tap(tap == "q_rot" ? spec.rope_taps->q_rot : spec.rope_taps->k_rot)});
}

}  // namespace

MhaWeights leaf_weights(const CaseInputs& in) {
  auto leaf = [](const Tensor& t) { return t.defined() ? Variable(t, true) : Variable(); };
  MhaWeights w{leaf(in.wq), leaf(in.wk), leaf(in.wv), leaf(in.wo),
               leaf(in.bq), leaf(in.bk), leaf(in.bv), leaf(in.bo)};
  w.q_norm = leaf(in.q_norm);
  w.k_norm = leaf(in.k_norm);
  return w;
}

void make_x_kv_leaf(AttentionSpec& spec, const CaseInputs& in) {
  if (in.x_kv.defined()) spec.x_kv = Variable(in.x_kv, true);
}

void add_qk_norm_cross_grads(const CaseSpec& c, const MhaWeights& w, const AttentionSpec& spec, TensorSet& out) {
  auto grad = [](const Variable& v) { return v.defined() ? v.grad() : Tensor(); };
  if (c.qk_norm.enabled) {
    out.push_back({"dq_norm", grad(w.q_norm)});
    out.push_back({"dk_norm", grad(w.k_norm)});
  }
  if (c.cross) out.push_back({"dx_kv", grad(spec.x_kv)});
}

TensorSet compute_side(const CaseSpec& c, const CaseInputs& shared, const Attention& plugin, bool own_inputs) {
  // This side's own copy: what the plugin writes into its inputs stays here.
  // A forked child's inputs are its own already (copy-on-write pages).
  const CaseInputs in = own_inputs ? laid_out(shared, c.layout) : private_copy(shared, c.layout);
  AttentionSpec spec = attention_spec(c, in);
  if (!c.taps.empty()) spec.rope_taps = std::make_shared<RopeTaps>();
  if (in.sinks.defined()) spec.sinks = Variable(in.sinks, true);  // a leaf: dsinks flows back to it
  const auto add_dsinks = [&](TensorSet& res) {
    if (c.sinks) res.push_back({"dsinks", spec.sinks.defined() ? spec.sinks.grad() : Tensor()});
  };
  const Variable r(in.r);
  auto backward = [&](const Variable& out) {
    const Variable loss = sum(mul(out, r));
    if (loss.requires_grad()) loss.backward();  // else no gradient reaches the inputs: reported as missing
  };
  if (c.level == Level::rope) {
    const Variable x(in.x, true);
    const Variable out = plugin.rope_forward(x, spec.rope);  // [..., T, d]
    check_output(out, in.r, in.x.dtype());
    backward(out);
    return {{"out", out.data().contiguous()}, {"dx", x.grad()}};
  }
  if (c.level == Level::mha) {
    const Variable x(in.x, true);
    const MhaWeights w = leaf_weights(in);
    make_x_kv_leaf(spec, in);
    const Variable out = plugin.mha_forward(x, w, spec);  // [B, T, D]
    check_output(out, in.r, in.x.dtype());
    backward(out);
    TensorSet res = {{"out", out.data().contiguous()}, {"dx", x.grad()},     {"dwq", w.wq.grad()},
                     {"dwk", w.wk.grad()},             {"dwv", w.wv.grad()}, {"dwo", w.wo.grad()}};
    if (c.bias)
      for (const auto& [name, b] : {std::pair<const char*, const Variable*>{"dbq", &w.bq}, {"dbk", &w.bk},
                                    {"dbv", &w.bv}, {"dbo", &w.bo}})
        res.push_back({name, b->grad()});
    add_qk_norm_cross_grads(c, w, spec, res);
    add_dsinks(res);
    add_taps(c, spec, res);
    return res;
  }
  const Variable q(in.q, true), k(in.k, true), v(in.v, true);
  const Variable out = plugin.core_forward(q, k, v, spec);  // [B, H, Tq, dv]
  check_output(out, in.r, in.q.dtype());
  backward(out);
  TensorSet res = {{"out", out.data().contiguous()}, {"dq", q.grad()}, {"dk", k.grad()}, {"dv", v.grad()}};
  add_dsinks(res);
  add_taps(c, spec, res);
  return res;
}

namespace {

// A finished run's tensors checked for NaN and Inf.
void check_finite(SideResult& res, const CaseSpec& c, const LoadedPlugin& plugin) {
  if (res.status != SideStatus::ok) return;
  for (const auto& [name, t] : res.tensors) {
    if (const auto bad = first_non_finite(t, c.level, name, head_blocks(c, name))) {
      res.status = SideStatus::non_finite;
      res.cause = "plugin " + plugin.info.name + " returned " + (std::isnan(bad->lhs) ? "NaN" : "Inf") + " in " +
                  name + " at " + shape_str(bad->index) + " (" + bad->where + ")";
      return;
    }
  }
}

}  // namespace

std::vector<SideResult> run_sides(const std::vector<SideJob>& jobs, const LoadedPlugin& plugin,
                                  const ExecOptions& options) {
  for (const SideJob& job : jobs)
    logging::runner()->debug("case '{}': running plugin {} {}", job.c->name, plugin.info.name,
                             options.isolate ? "in a child process" : "in this process");
  if (options.isolate && !timeout_problem(options.timeout_s).empty())
    throw std::invalid_argument("timeout " + timeout_problem(options.timeout_s));
  std::vector<SideResult> out;
  while (out.size() < jobs.size()) {
    if (!options.isolate) {
      const SideJob& job = jobs[out.size()];
      out.push_back(run_in_process(*job.c, *job.in, plugin));
      continue;
    }
    // The runs after one the child did not finish get a child of their own.
    const std::vector<SideJob> rest(jobs.begin() + static_cast<std::ptrdiff_t>(out.size()), jobs.end());
    for (SideResult& r : run_isolated(rest, plugin, options)) out.push_back(std::move(r));
  }
  for (std::size_t k = 0; k < jobs.size(); ++k) check_finite(out[k], *jobs[k].c, plugin);
  return out;
}

SideResult run_side(const CaseSpec& c, const CaseInputs& in, const LoadedPlugin& plugin,
                    const ExecOptions& options) {
  return std::move(run_sides({{&c, &in}}, plugin, options).front());
}

}  // namespace headgrad::runner
