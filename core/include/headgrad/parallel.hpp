// Threads: how many workers headgrad uses, and the loops that use them.
//
//   headgrad::set_num_threads(2);          // headgrad's workers AND the BLAS's
//   headgrad::parallel_for(rows, [&](std::int64_t r0, std::int64_t r1, int worker) {
//     for (std::int64_t r = r0; r < r1; ++r) ...;   // disjoint output rows: no locks
//   });
//
// One persistent pool (no thread is created per op). A parallel loop started
// from inside a worker runs serially on that worker, so nesting cannot deadlock.
// The default count is HEADGRAD_NUM_THREADS, else the machine's core count.
#pragma once

#include <cstdint>
#include <functional>

namespace headgrad {

// n >= 1 (0 means the default). Sets the BLAS's thread count to the same n, so
// that one call sizes both kinds of parallelism. Call between ops, not in one.
void set_num_threads(int n);
int num_threads();

// body(begin, end, worker) on contiguous chunks of [0, n), at most num_threads()
// of them; worker is the chunk's index, in [0, num_threads()), and no two
// threads run the same index at once (scratch per worker stays private). The
// caller runs chunk 0, then any chunk no other thread has taken yet, so one
// thread may run several. The first exception a chunk throws is rethrown here
// after every chunk has finished.
// Loops with less than `min_per_worker` items per worker use fewer workers.
void parallel_for(std::int64_t n,
                  const std::function<void(std::int64_t, std::int64_t, int)>& body,
                  std::int64_t min_per_worker = 1);

// body(item, worker) for each item of [0, n), handed out one at a time to
// whichever worker is free: for items of uneven cost (causal tiles). Items are
// handed out in increasing order, so put the costliest first.
void parallel_items(std::int64_t n, const std::function<void(std::int64_t, int)>& body);

// While one is alive, each BLAS call runs on a single thread: for loops whose
// workers call BLAS themselves (small tiles), so that the two kinds of threads
// do not multiply. Restores the previous count when it ends.
class SerialBlasScope {
 public:
  SerialBlasScope();
  ~SerialBlasScope();
  SerialBlasScope(const SerialBlasScope&) = delete;
  SerialBlasScope& operator=(const SerialBlasScope&) = delete;

 private:
  int previous_;
};

}  // namespace headgrad
