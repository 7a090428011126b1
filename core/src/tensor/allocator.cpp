#include "tensor/allocator.hpp"

#include <sys/mman.h>

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "headgrad/tensor.hpp"

// Under AddressSanitizer (tools/test's build-san) the bytes of a block past
// what its tensor asked for, and a whole block waiting in the cache, are
// poisoned: ASan then reports an overflow into the size class's slack, and a
// use of a freed tensor's buffer that the cache would otherwise hand out again.
#if defined(__SANITIZE_ADDRESS__)
#define HEADGRAD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEADGRAD_ASAN 1
#endif
#endif
#ifdef HEADGRAD_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace headgrad {

namespace {

void poison(void* p, std::size_t n) {
#ifdef HEADGRAD_ASAN
  ASAN_POISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n;
#endif
}

void unpoison(void* p, std::size_t n) {
#ifdef HEADGRAD_ASAN
  ASAN_UNPOISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n;
#endif
}

constexpr std::size_t kAlign = 64;
constexpr std::size_t kHuge = std::size_t{2} << 20;  // 2 MiB

// Live bytes as tensors asked for them (memory_stats' meaning), and bytes
// reserved from the system (live size classes + cached).
std::atomic<std::size_t> g_current{0}, g_peak{0};
std::atomic<std::size_t> g_reserved{0}, g_peak_reserved{0}, g_cached{0};

void raise_peak(std::atomic<std::size_t>& peak, std::size_t now) {
  std::size_t p = peak.load();
  while (now > p && !peak.compare_exchange_weak(p, now)) {
  }
}

// 4 classes per power of two: n in (2^(k-1), 2^k] rounds up to a multiple of 2^(k-3).
std::size_t size_class(std::size_t n) {
  if (n <= kAlign) return kAlign;
  const int k = std::bit_width(n - 1);  // 2^k >= n
  std::size_t step = std::size_t{1} << (k - 3);
  if (step < kAlign) step = kAlign;
  std::size_t c = (n + step - 1) / step * step;
  if (c >= kHuge) c = (c + kHuge - 1) / kHuge * kHuge;
  return c;
}

void* system_large(std::size_t bytes) {
  // Over-map by 2 MiB, then trim both ends so that the block starts on a 2 MiB boundary.
  const std::size_t span = bytes + kHuge;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (base + kHuge - 1) & ~(kHuge - 1);
  if (aligned > base) ::munmap(raw, aligned - base);
  const std::uintptr_t end = base + span, used_end = aligned + bytes;
  if (end > used_end) ::munmap(reinterpret_cast<void*>(used_end), end - used_end);
  void* p = reinterpret_cast<void*>(aligned);
  ::madvise(p, bytes, MADV_HUGEPAGE);  // advice only: ignore a refusal
  return p;
}

void* system_alloc(std::size_t bytes) {
  return bytes >= kHuge ? system_large(bytes) : std::aligned_alloc(kAlign, bytes);
}

void system_free(void* p, std::size_t bytes) {
  if (bytes >= kHuge) ::munmap(p, bytes);
  else std::free(p);
}

class Cache {
 public:
  Cache() {
    if (const char* env = std::getenv("HEADGRAD_ALLOCATOR"))
      caching_ = std::string(env) != "system";
    if (const char* env = std::getenv("HEADGRAD_CACHE_LIMIT_MB"))
      limit_ = static_cast<std::size_t>(std::strtoull(env, nullptr, 10)) << 20;
  }

  bool caching() const { return caching_; }

  detail::Block alloc(std::size_t nbytes) {
    if (!caching_) {
      const std::size_t bytes = (std::max(nbytes, std::size_t{1}) + kAlign - 1) / kAlign * kAlign;
      return {fresh(bytes, /*large_ok=*/false), bytes};
    }
    const std::size_t bytes = size_class(nbytes);
    {
      // The smallest cached block of this class or up to twice its size: on a
      // machine where a fresh page is dear, a larger block already mapped
      // beats a new one (its other half stays unused until it is freed).
      std::lock_guard lock(mutex_);
      for (auto it = free_.lower_bound(bytes); it != free_.end() && it->first <= 2 * bytes; ++it) {
        if (it->second.empty()) continue;
        void* p = it->second.back();
        it->second.pop_back();
        g_cached.fetch_sub(it->first);
        return {p, it->first};
      }
    }
    return {fresh(bytes, /*large_ok=*/true), bytes};
  }

  void free(const detail::Block& b) {
    if (caching_) {
      std::lock_guard lock(mutex_);
      if (g_cached.load() + b.capacity <= limit_) {
        poison(b.data, b.capacity);
        free_[b.capacity].push_back(b.data);
        g_cached.fetch_add(b.capacity);
        return;
      }
    }
    give_back(b.data, b.capacity, caching_);
  }

  void empty() {
    std::map<std::size_t, std::vector<void*>> all;
    {
      std::lock_guard lock(mutex_);
      all.swap(free_);
    }
    for (auto& [bytes, list] : all)
      for (void* p : list) {
        g_cached.fetch_sub(bytes);
        give_back(p, bytes, true);
      }
  }

 private:
  void* fresh(std::size_t bytes, bool large_ok) {
    void* p = large_ok ? system_alloc(bytes) : std::aligned_alloc(kAlign, bytes);
    if (!p && caching_) {  // the cache may hold what the system now lacks
      empty();
      p = system_alloc(bytes);
    }
    if (!p) throw std::bad_alloc();
    raise_peak(g_peak_reserved, g_reserved.fetch_add(bytes) + bytes);
    return p;
  }

  static void give_back(void* p, std::size_t bytes, bool large_ok) {
    unpoison(p, bytes);  // mmap'ed memory keeps its shadow after munmap
    if (large_ok) system_free(p, bytes);
    else std::free(p);
    g_reserved.fetch_sub(bytes);
  }

  bool caching_ = true;
  std::size_t limit_ = std::size_t{8192} << 20;
  std::mutex mutex_;
  std::map<std::size_t, std::vector<void*>> free_;  // by size class
};

// Never destroyed: tensors in static objects may be freed after main returns.
Cache& cache() {
  static Cache* c = new Cache();
  return *c;
}

}  // namespace

namespace detail {

Block storage_alloc(std::size_t nbytes) {
  Block b = cache().alloc(nbytes);
  raise_peak(g_peak, g_current.fetch_add(nbytes) + nbytes);
  return b;
}

void storage_free(const Block& block) { cache().free(block); }

}  // namespace detail

Storage::Storage(std::size_t nbytes) : nbytes_(nbytes) {
  const detail::Block b = detail::storage_alloc(nbytes);
  data_ = b.data;
  capacity_ = b.capacity;
  unpoison(data_, nbytes_);
  poison(static_cast<std::byte*>(data_) + nbytes_, capacity_ - nbytes_);
}

Storage::~Storage() {
  detail::storage_free({data_, capacity_});
  g_current.fetch_sub(nbytes_);
}

MemoryStats memory_stats() {
  return {g_current.load(), g_peak.load(), g_cached.load(), g_reserved.load(),
          g_peak_reserved.load()};
}

void reset_peak_memory() {
  g_peak.store(g_current.load());
  g_peak_reserved.store(g_reserved.load());
}

void empty_cache() { cache().empty(); }

std::string_view allocator_name() { return cache().caching() ? "caching" : "system"; }

}  // namespace headgrad
