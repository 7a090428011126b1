// bfloat16 products on the CPU's bfloat16 dot products (blas.hpp, gemm_bf16),
// through oneDNN's matmul when headgrad is built with it (HEADGRAD_ONEDNN,
// set by meson from the `onednn` option). oneDNN picks its kernel for the CPU
// at run time; on AVX512-BF16 (vdpbf16ps: two bfloat16 products per float32
// lane and instruction) it runs at 2-3x sgemm's rate, and the operands are
// never widened into float32 copies (docs/performance.md).
//
// Threads: Debian's oneDNN runs on OpenMP. headgrad forks children (a side, a
// probe, a -j worker), and GNU OpenMP's thread pool does not survive a fork,
// so oneDNN never gets to start one: every thread that calls it is set to one
// OpenMP thread, and a large product is split over headgrad's own workers
// (split_product.hpp), one oneDNN call each.
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>

#include "headgrad/blas.hpp"
#include "headgrad/parallel.hpp"
#include "ops/split_product.hpp"

#if defined(HEADGRAD_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
extern "C" void omp_set_num_threads(int);  // libgomp's, without needing its header under clang
#endif
#endif

namespace headgrad::blas {

namespace {

// HEADGRAD_BF16_GEMM=float32 (read once): the float32 upcasts instead, as
// on a CPU without bfloat16 dot products. -1 = not read yet, 0 off, 1 on.
std::atomic<int> g_bf16_wanted{-1};

#if defined(HEADGRAD_ONEDNN)

bool bf16_wanted() {
  int w = g_bf16_wanted.load(std::memory_order_relaxed);
  if (w < 0) {
    const char* env = std::getenv("HEADGRAD_BF16_GEMM");
    w = env && std::strcmp(env, "float32") == 0 ? 0 : 1;
    g_bf16_wanted.store(w, std::memory_order_relaxed);
  }
  return w == 1;
}

// Only where oneDNN has a kernel with bfloat16 dot products: without one it
// would emulate them, slower than the float32 upcasts.
bool cpu_has_bf16_kernels() {
  static const bool has = [] {
    const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
  }();
  return has;
}

const char* isa_name() {
  return dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx ? "avx512_core_amx" : "avx512_core_bf16";
}

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// One product shape's primitive and its memory objects, made once per thread
// (making a primitive costs 20-50 us even from oneDNN's own cache; a run
// multiplies the same few shapes thousands of times).
struct Prepared {
  dnnl::matmul matmul;
  dnnl::memory a, b, c;
};

using Key = std::array<std::int64_t, 8>;  // m, n, k, lda, ldb, ldc, trans_a, trans_b

// A row-major [rows, cols] view with row stride ld, or its transpose (stored [cols, rows]).
dnnl::memory::desc view(std::int64_t rows, std::int64_t cols, std::int64_t ld, bool trans) {
  const dnnl::memory::dims strides = trans ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1};
  return {{rows, cols}, dnnl::memory::data_type::bf16, strides};
}

Prepared& prepared(const Key& key) {
  thread_local std::map<Key, Prepared> cache;
  thread_local bool one_omp_thread = false;
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (!one_omp_thread) {
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
    omp_set_num_threads(1);  // this thread's OpenMP count: oneDNN reads it
#endif
    one_omp_thread = true;
  }
  if (cache.size() >= 256) cache.clear();  // shapes come and go with the cases of a run
  const auto [m, n, k, lda, ldb, ldc, ta, tb] = key;
  const auto ad = view(m, k, lda, ta != 0), bd = view(k, n, ldb, tb != 0), cd = view(m, n, ldc, false);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), engine());
  Prepared p{dnnl::matmul(pd), dnnl::memory(ad, engine(), DNNL_MEMORY_NONE),
             dnnl::memory(bd, engine(), DNNL_MEMORY_NONE), dnnl::memory(cd, engine(), DNNL_MEMORY_NONE)};
  return cache.emplace(key, std::move(p)).first->second;
}

void one_call(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const BFloat16* a,
              std::int64_t lda, const BFloat16* b, std::int64_t ldb, BFloat16* c, std::int64_t ldc) {
  thread_local dnnl::stream stream(engine());
  try {
    Prepared& p = prepared({m, n, k, lda, ldb, ldc, ta, tb});
    // oneDNN's handles are not const; it does not write through a or b
    p.a.set_data_handle(const_cast<BFloat16*>(a));
    p.b.set_data_handle(const_cast<BFloat16*>(b));
    p.c.set_data_handle(c);
    p.matmul.execute(stream, {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}});
    stream.wait();
  } catch (const dnnl::error& e) {
    throw std::runtime_error("bfloat16 product " + std::to_string(m) + " x " + std::to_string(n) + " x " +
                             std::to_string(k) + " on oneDNN failed: " + e.what());
  }
}

#endif

}  // namespace

bool bf16_products() {
#if defined(HEADGRAD_ONEDNN)
  return bf16_wanted() && cpu_has_bf16_kernels();
#else
  return false;
#endif
}

void set_bf16_products(bool on) { g_bf16_wanted.store(on ? 1 : 0, std::memory_order_relaxed); }

std::string bf16_products_info() {
#if defined(HEADGRAD_ONEDNN)
  if (!cpu_has_bf16_kernels()) return "float32 upcasts (oneDNN, but no AVX512-BF16 on this CPU)";
  const char* env = std::getenv("HEADGRAD_BF16_GEMM");
  const bool env_off = env && std::strcmp(env, "float32") == 0;
  if (!bf16_wanted())
    return env_off ? "float32 upcasts (HEADGRAD_BF16_GEMM=float32)" : "float32 upcasts (set_bf16_products(false))";
  const dnnl_version_t* v = dnnl_version();
  std::string info = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                     std::to_string(v->patch) + " (" + isa_name() + ")";
  if (env && *env && !env_off) info += std::string("; HEADGRAD_BF16_GEMM=") + env + " ignored: only float32 is understood";
  return info;
#else
  return "float32 upcasts (built without oneDNN)";
#endif
}

void gemm_bf16(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const BFloat16* a,
               std::int64_t lda, const BFloat16* b, std::int64_t ldb, BFloat16* c, std::int64_t ldc) {
#if defined(HEADGRAD_ONEDNN)
  if (!bf16_products()) throw std::logic_error("gemm_bf16: no bfloat16 products here (blas::bf16_products())");
  if (m <= 0 || n <= 0) return;
  if (macs(m, n, k) < kSplitMinMacs || num_threads() < 2)  // one thread under SerialBlasScope
    return one_call(ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
  split_product(m, n, [&](std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) {
    one_call(ta, tb, rows, cols, k, a + (ta ? i0 : i0 * lda), lda, b + (tb ? j0 * ldb : j0), ldb,
             c + i0 * ldc + j0, ldc);
  });
#else
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc;
  throw std::logic_error("gemm_bf16: headgrad was built without oneDNN (blas::bf16_products())");
#endif
}

}  // namespace headgrad::blas
