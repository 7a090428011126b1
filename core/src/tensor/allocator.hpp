// Internal: where tensor storage comes from.
//
// The caching allocator keeps freed buffers in free lists by size class and
// hands them back to later tensors of the same class, so that a loop of ops
// (and of training or benchmark iterations) stops asking the system for fresh
// pages: a first touch of a fresh page is expensive, far more than reusing one.
//   - size classes: 4 per power of two (at most 25% slack), 64-byte aligned;
//   - large buffers (>= 2 MiB) are 2 MiB-aligned multiples of 2 MiB, mapped
//     with madvise(MADV_HUGEPAGE) so the kernel can back them with huge pages;
//   - thread-safe (one mutex around the free lists; counters are atomic);
//   - at most HEADGRAD_CACHE_LIMIT_MB (default 8192) MiB stay cached; beyond
//     that a freed buffer goes back to the system;
//   - HEADGRAD_ALLOCATOR=system bypasses the cache (aligned_alloc and free per
//     tensor), for comparison.
#pragma once

#include <cstddef>

namespace headgrad::detail {

struct Block {
  void* data = nullptr;
  std::size_t capacity = 0;  // bytes really reserved (the size class)
};

Block storage_alloc(std::size_t nbytes);
void storage_free(const Block& block);

}  // namespace headgrad::detail
