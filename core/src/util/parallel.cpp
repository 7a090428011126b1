#include "headgrad/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "headgrad/blas.hpp"

namespace headgrad {

namespace {

thread_local bool t_in_worker = false;

int default_threads() {
  if (const char* env = std::getenv("HEADGRAD_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return n;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Until done() or kSpin has passed, yields the core (sched_yield) between
// looks; whether done() came true. Waking a sleeping thread costs tens of
// microseconds on a virtual machine (a futex wake, an interrupt to the other
// core): a worker that has just finished a chunk, and a caller waiting for
// the last one, look again for a while before they sleep, so that jobs
// posted back to back (the small ops of a forward + backward) find them
// awake. Yielding rather than spinning gives the core to whatever else is
// runnable there (another process sharing the machine) while they look.
constexpr auto kSpin = std::chrono::microseconds(50);

template <class Done>
bool yield_until(Done&& done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return done();
    std::this_thread::yield();
  }
  return true;
}

// Workers 1..n-1 look for a new generation number (yield_until), then sleep
// on a condition variable; a job posts one. The caller runs chunk 0, then
// any chunk no worker has taken yet: chunks 1..n-1 go, each once, to whichever
// thread claims it first. On a loaded machine a woken worker can wait a whole
// time slice for a core, and a caller that waited for it took ten times as
// long (`headgrad check` beside two busy processes: 47.9 s against 4.8 at one
// thread). The caller returns only when every chunk is done, so a job never
// outlives its call.
class Pool {
 public:
  using Chunk = std::function<void(int)>;

  ~Pool() { resize(1); }

  int size() {
    std::lock_guard lock(resize_mutex_);
    return size_;
  }

  void resize(int n) {
    std::lock_guard resize_lock(resize_mutex_);
    if (n == size_) return;
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
    stop_ = false;
    size_ = n;
    // A worker must not take the generation when it first runs: a job posted
    // before it got there would be missed and its chunk never run.
    std::uint64_t start;
    {
      std::lock_guard lock(mutex_);
      start = generation_;
    }
    for (int w = 1; w < n; ++w) threads_.emplace_back([this, start] { loop(start); });
  }

  // Runs chunk(w) for w in [0, chunks), chunks <= size().
  void run(int chunks, const Chunk& chunk) {
    std::lock_guard job_lock(job_mutex_);  // one job at a time
    errors_.assign(static_cast<std::size_t>(chunks), nullptr);
    std::uint64_t gen;
    {
      std::lock_guard lock(mutex_);
      job_ = &chunk;
      chunks_ = chunks;
      pending_ = chunks - 1;
      gen = ++generation_;
      claim_ = tag(gen) | 1;  // chunk 0 is the caller's
    }
    wake_.notify_all();  // no system call when every worker is still looking
    run_one(0, chunk);
    run_claimed(gen, chunks, chunk);
    if (!yield_until([&] { return pending_ == 0; })) {
      std::unique_lock lock(mutex_);
      done_.wait(lock, [&] { return pending_ == 0; });
    }
    {
      std::lock_guard lock(mutex_);
      job_ = nullptr;
    }
    for (const auto& e : errors_)
      if (e) std::rethrow_exception(e);
  }

 private:
  void run_one(int w, const Chunk& chunk) {
    const bool was = t_in_worker;
    t_in_worker = true;
    try {
      chunk(w);
    } catch (...) {
      errors_[static_cast<std::size_t>(w)] = std::current_exception();
    }
    t_in_worker = was;
  }

  static std::uint64_t tag(std::uint64_t gen) { return gen << 32; }

  // The next chunk of job `gen` that nobody has taken, or -1. A claim names
  // its job: a worker that woke late, after its job ended and another began,
  // gets -1, never a chunk of the new job to run with the old job's function.
  int claim(std::uint64_t gen, int chunks) {
    std::uint64_t v = claim_.load();
    while ((v >> 32) == (tag(gen) >> 32) && static_cast<int>(v & 0xffffffffu) < chunks)
      if (claim_.compare_exchange_weak(v, v + 1)) return static_cast<int>(v & 0xffffffffu);
    return -1;
  }

  // Runs the chunks of job `gen` it can claim. The caller may be looking at
  // pending_ rather than waiting on done_: the decrement is seen either way,
  // and the notify reaches a sleeper because it is sent under the mutex its
  // predicate is read under.
  void run_claimed(std::uint64_t gen, int chunks, const Chunk& job) {
    for (int c = claim(gen, chunks); c >= 0; c = claim(gen, chunks)) {
      run_one(c, job);
      if (pending_.fetch_sub(1) == 1) {
        std::lock_guard lock(mutex_);
        done_.notify_one();
      }
    }
  }

  void loop(std::uint64_t seen) {
    while (true) {
      const Chunk* job = nullptr;
      int chunks = 0;
      yield_until([&] { return stop_ || generation_ != seen; });
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
        chunks = chunks_;
      }
      // job_ is null once its job has ended; a job that ends now leaves
      // nothing to claim, and *job is read only for a chunk claimed
      if (job) run_claimed(seen, chunks, *job);
    }
  }

  std::mutex resize_mutex_, job_mutex_, mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  std::vector<std::exception_ptr> errors_;
  const Chunk* job_ = nullptr;
  int size_ = 1, chunks_ = 0;
  // changed under mutex_ (the sleepers' predicates), atomic for the looks
  std::atomic<int> pending_{0};
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<std::uint64_t> claim_{0};  // tag(generation) | the next chunk to hand out
  std::atomic<bool> stop_{false};
};

Pool& pool() {
  static Pool p;
  static std::once_flag once;
  std::call_once(once, [] { p.resize(default_threads()); });
  return p;
}

std::atomic<int> g_threads{0};  // 0: not yet set

}  // namespace

void set_num_threads(int n) {
  if (n <= 0) n = default_threads();
  g_threads.store(n);
  blas::set_num_threads(n);
  pool().resize(n);
}

int num_threads() {
  const int n = g_threads.load();
  return n > 0 ? n : pool().size();
}

SerialBlasScope::SerialBlasScope() : previous_(blas::num_threads()) {
  if (previous_ != 1) blas::set_num_threads(1);
}
SerialBlasScope::~SerialBlasScope() {
  if (previous_ != 1) blas::set_num_threads(previous_);
}

void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t, int)>& body,
                  std::int64_t min_per_worker) {
  if (n <= 0) return;
  std::int64_t workers = t_in_worker ? 1 : num_threads();
  workers = std::clamp<std::int64_t>(n / std::max<std::int64_t>(min_per_worker, 1), 1, workers);
  if (workers == 1) {
    body(0, n, 0);
    return;
  }
  pool().run(static_cast<int>(workers), [&](int w) {
    body(n * w / workers, n * (w + 1) / workers, w);
  });
}

void parallel_items(std::int64_t n, const std::function<void(std::int64_t, int)>& body) {
  if (n <= 0) return;
  const std::int64_t workers = std::min<std::int64_t>(t_in_worker ? 1 : num_threads(), n);
  if (workers == 1) {
    for (std::int64_t i = 0; i < n; ++i) body(i, 0);
    return;
  }
  std::atomic<std::int64_t> next{0};
  pool().run(static_cast<int>(workers), [&](int w) {
    for (std::int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) body(i, w);
  });
}

}  // namespace headgrad
