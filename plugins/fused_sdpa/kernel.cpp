// fused_sdpa's kernel: the attention core as ONE custom op with a hand-written
// forward and backward, in the manner of FlashAttention-2.
//
// Shape legend: N leading index (batch x heads, flattened), Tq/Tk query/key
// lengths, d query/key width, dv value width, Br x Bc one tile (query rows x
// keys, Tiles in kernel.hpp), H query heads, Hkv key/value heads, G = H / Hkv,
// Nkv = N / G leading index of k and v.
//
// Grouped KV heads (GQA/MQA): when k and v have Hkv heads (dim -3) where q has
// H, H % Hkv == 0, query head h reads kv head h / G in place: query slice n
// reads kv slice n / G, and nothing is repeated. The backward sums dK and dV
// over the G query heads of a group itself, so they come out [..., Hkv, Tk, .].
//
// Forward, per leading index and block of Br query rows: walk the key tiles
// with an online softmax (running max m, running sum l, accumulator rescaled by
// exp(m_old - m_new) whenever the max grows). Only O [N, Tq, dv] and one
// log-sum-exp L = m + log(l) per query row [N, Tq] are kept for the backward,
// which recomputes P = exp(S - L) tile by tile:
//   D = rowsum(dO * O);  dV += P^T dO;  dP = dO V^T;  dS = P * (dP - D);
//   dQ += dS K * scale;  dK += dS^T Q * scale.
// Extra memory grows with T, never with Tq * Tk: O, L, D, the gradients, and
// per worker a few tiles of scratch. A bool mask is read through a strided view
// of the user's mask (never densified); causal is decided from indices (query
// i attends keys j <= i + shift: shift 0 top-left, Tk - Tq bottom-right), and
// causal tiles that lie entirely above that diagonal are skipped, not computed;
// tiles it crosses multiply in strips of 64 rows or keys that stop at it
// (Sdpa::row_strips, key_strips).
//
// Fully masked rows: a query row whose keys are all masked has l = 0 and
// L = -inf. Its output is zeros and it sends zero (finite) gradients to q, k
// and v, where a naive softmax gives NaN (the same rule as core's softmax).
//
// Sliding window (spec.window): query i sees keys i + o - left <= j <= i + o +
// right (o = shift under causal, else 0). A query block walks only the key
// tiles that meet its rows' windows and a key block only the query blocks that
// see it, so forward and backward cost O(Tq (left + right + Br) d), not
// O(Tq Tk d). Within a tile each row's visible keys are one band [lo, hi)
// (Sdpa::band): the columns outside it are filled, not tested one by one, and
// the exponentials run over the band only. Wide tiles (Tiles::wide) take a
// block's whole band of keys (forward) or query rows (backward) as one tile
// starting at the window's edge: fewer, larger products, and fewer scores
// outside the window than tiles aligned to a multiple of Bc.
// Soft-capping (spec.softcap = C): scores() computes c = C tanh(scale q.k / C)
// (the scale inside tanh) before any mask, and in the backward also
// 1 - tanh^2, which multiplies dS: dS = P (dP - D) (1 - t^2).
// Sinks (spec.sinks [H]): every row of query head h starts its online softmax
// at m = sigma_h, l = 1 (the sink column, which has no value), so O and L
// include it and a fully masked row gets O = 0, L = sigma_h. The backward pass
// that computes D also gives dsigma_h = -sum over rows of exp(sigma_h - L) D.
//
// Dropout (dropout_p > 0), on the attention weights as in PyTorch: key j of
// query i in leading index n is kept when a counter-based SplitMix64 hash of
// (dropout_seed, n, i, j) is >= p, and kept weights are scaled by 1/(1-p). The
// backward regenerates the same mask from the same hash, so none is stored.
// With dropout_p = 0 no dropout code runs and the op is exact.
//
// Threads (headgrad::num_threads(), the persistent pool of <headgrad/parallel.hpp>):
// the work is split WITHIN a slice too, so that B*H = 1 still uses every core.
// The forward hands out (leading index, query block) items, costliest first
// (causal blocks near the end see the most keys); each owns disjoint rows of
// O and L. The backward hands out (kv leading index, key block) items: each
// owns its rows of dK and dV and walks the query blocks (of the G query heads
// of its group) that see it. dQ rows are
// shared between key blocks: an item computes its [Br, d] part of a dQ block
// in scratch and adds it under that block's lock (FlashAttention-2 adds
// atomically), so no worker holds a copy of dQ. The order of those additions
// follows the threads: with more than one thread dQ is reproducible to
// rounding, not bit for bit (O, L, dK and dV are). Inside the loops BLAS runs
// single-threaded (SerialBlasScope): one kind of thread at a time.
//
// Products: float32 on AVX-512 (Sdpa::packed) multiplies tiles with
// <headgrad/tile_gemm.hpp>'s micro-kernel, B operands packed once per pass (Packs: K^T,
// V for the forward; K^T, V^T, dO, K, Q for the backward; O(T d) memory) and
// A read in place; otherwise each product is a BLAS call (product()).

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <headgrad/blas.hpp>
#include <headgrad/kernels.hpp>
#include <headgrad/parallel.hpp>

#include "kernel.hpp"
#include <headgrad/tile_gemm.hpp>

namespace headgrad::fused_sdpa {
namespace {

// ---------------------------------------------------------------- helpers

using blas::gemm;

using kernels::exp_shift_row;
using kernels::row_max;  // in lanes: one running max took ~13% of f+b at (1,2048,512,8)

constexpr std::uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
std::uint64_t mix64(std::uint64_t z) {
  z += kGolden;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The dropout mask as a pure function of (seed, n, i, j): forward and backward
// draw the same bits whatever the tiling or the thread that asks.
struct Dropout {
  bool on = false;
  double p = 0.0;
  std::uint64_t seed = 0;

  std::uint64_t row_key(std::int64_t n, std::int64_t i) const {
    return mix64(mix64(mix64(seed) + static_cast<std::uint64_t>(n)) +
                 static_cast<std::uint64_t>(i));
  }
  bool keep(std::uint64_t row_key, std::int64_t j) const {
    const std::uint64_t h = mix64(row_key + static_cast<std::uint64_t>(j) * kGolden);
    return static_cast<double>(h >> 11) * 0x1.0p-53 >= p;  // uniform in [0, 1)
  }
};

// Storage offsets (from the first element) of the slices of t's first `lead`
// dims, in row-major order of the leading index.
std::vector<std::int64_t> slice_offsets(const Tensor& t, std::size_t lead) {
  std::int64_t count = 1;
  for (std::size_t d = 0; d < lead; ++d) count *= t.size(static_cast<std::int64_t>(d));
  std::vector<std::int64_t> out(static_cast<std::size_t>(count));
  std::vector<std::int64_t> idx(lead, 0);
  std::int64_t off = 0;
  for (std::int64_t n = 0; n < count; ++n) {
    out[static_cast<std::size_t>(n)] = off;
    for (std::size_t d = lead; d-- > 0;) {
      const auto dd = static_cast<std::int64_t>(d);
      off += t.stride(dd);
      if (++idx[d] < t.size(dd)) break;
      off -= t.stride(dd) * t.size(dd);
      idx[d] = 0;
    }
  }
  return out;
}

// A [..., R, C] tensor seen as one row-major matrix per leading index: row r
// of slice n starts at slice(n) + r * ld and its C columns are contiguous,
// which is what CBLAS reads. Strided views that already are so are not copied.
template <class T>
struct Rows {
  Tensor tensor;  // keeps the storage alive
  const T* base = nullptr;
  std::vector<std::int64_t> offsets;
  std::int64_t ld = 1;
  const T* slice(std::int64_t n) const { return base + offsets[static_cast<std::size_t>(n)]; }
};

bool rows_readable(const Tensor& t) {
  const std::int64_t r = t.size(-2), c = t.size(-1);
  return (c <= 1 || t.stride(-1) == 1) && (r <= 1 || t.stride(-2) >= std::max<std::int64_t>(c, 1));
}

// dense: rows packed back to back (ld = C), copied when they are not. The
// tile products read q and dO in place as their A operand, 12 rows at a time:
// rows of a head split from [B, T, D] lie D floats apart (2 KiB at D = 512),
// so those 12 rows fall in few cache sets, and S = Q K^T ran 1.4x slower per
// FLOP than the products whose A is the tile scratch (docs/performance.md).
template <class T>
Rows<T> as_rows(const Tensor& x, const Shape& lead, bool dense = false) {
  Shape full = lead;
  full.push_back(x.size(-2));
  full.push_back(x.size(-1));
  const bool spread = dense && x.size(-2) > 1 && x.stride(-2) != x.size(-1);
  const Tensor t = (rows_readable(x) && !spread ? x : x.contiguous()).expand(full);
  Rows<T> rows;
  rows.tensor = t;
  rows.base = t.data<T>();
  rows.offsets = slice_offsets(t, lead.size());
  rows.ld = t.size(-2) <= 1 ? std::max<std::int64_t>(t.size(-1), 1) : t.stride(-2);
  return rows;
}

// The bool mask (True = attend) as a strided [N, Tq, Tk] view: element (n, i, j)
// at slice(n)[i * si + j * sj]. Broadcast dims have stride 0; nothing is copied.
struct MaskRows {
  bool on = false;
  Tensor tensor;
  const bool* base = nullptr;
  std::vector<std::int64_t> offsets;
  std::int64_t si = 0, sj = 0;
  const bool* slice(std::int64_t n) const { return base + offsets[static_cast<std::size_t>(n)]; }
};

// The B operands of the tile products, packed once per forward or backward
// (tile_gemm.hpp) when the products run there: float32 on AVX-512 with key
// tiles aligned to its panels (Sdpa::packed). off: every product through BLAS.
struct Packs {
  bool on = false;
  tile::Packed k_t, v_t;    // B = K^T, V^T of each kv slice (S = Q K^T, dP = dO V^T)
  tile::Packed k, v, q, dout;  // B = K, V, Q, dO as they are (dQ, O, dK, dV)
};

// The B of one tile product: rows [r0, ...) of slice `slice` of x (row stride
// ld; `trans`: B = that block transposed), packed in `panels` when not null.
template <class T>
struct Operand {
  const T* x;
  std::int64_t ld;
  bool trans;
  const tile::Packed* panels;
  std::int64_t slice, r0;
};

// C [m, n] = alpha op(A) B + beta C, A [m, k] (op(A) = A^T when ta) with row stride lda.
template <class T>
void product(bool ta, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
             std::int64_t lda, const Operand<T>& b, T beta, T* c, std::int64_t ldc) {
  if constexpr (std::is_same_v<T, float>)
    if (b.panels) {
      tile::gemm(m, n, k, alpha, a, ta ? 1 : lda, ta ? lda : 1, b.panels->at(b.slice, b.r0),
                 b.panels->stride, beta, c, ldc);
      return;
    }
  gemm(ta, b.trans, m, n, k, alpha, a, lda, b.x + b.r0 * b.ld, b.ld, beta, c, ldc);
}

// ---------------------------------------------------------------- the problem

// Everything forward and backward share: operands, mask, scale, dropout.
template <class T>
struct Sdpa {
  Shape lead;     // leading dims of q and the output; N = numel(lead)
  Shape kv_lead;  // of k and v: lead with Hkv in place of H; Nkv = N / group
  std::int64_t n = 1, tq = 0, tk = 0, d = 0, dv = 0;
  std::int64_t group = 1;  // G: query slice n reads kv slice n / G
  std::int64_t br = 0, bc = 0;  // the tile: query rows x keys
  // Wide tiles (Tiles::wide > 0, windows only): the forward's key tiles and the
  // backward's query tiles are up to `wide` long and start at the block's
  // first visible key (row) instead of a multiple of the tile.
  bool wide = false;
  // Tile products on panels packed once (Packs, tile_gemm.hpp): Tiles::packed,
  // float32 on AVX-512, Bc-aligned key tiles that start on a panel.
  bool packed = false;
  std::int64_t fwd_keys = 0;  // keys per forward tile: bc, or Tiles::wide
  std::int64_t bwd_rows = 0;  // query rows per backward tile: br, or Tiles::wide
  T scale = 1;
  bool causal = false;
  std::int64_t shift = 0;  // causal: query i attends keys j <= i + shift
  Rows<T> q, k, v;  // [N, Tq, d], [Nkv, Tk, d], [Nkv, Tk, dv]
  MaskRows mask;
  Dropout dropout;
  // The keys row i sees from indices: i + lo_off <= j (when has_lo: a window's
  // left bound) and j <= i + hi_off (when has_hi: causal and/or a window's right bound).
  bool has_lo = false, has_hi = false;
  std::int64_t lo_off = 0, hi_off = 0;
  T cap = 0;                 // soft-capping C; 0: off
  std::vector<T> sinks;      // sigma_h [H]; empty: no sinks
  std::int64_t heads = 1;    // H: slice n is query head n % H

  T sink(std::int64_t nn) const { return sinks[static_cast<std::size_t>(nn % heads)]; }

  // B = rows [r0, ...) of slice `slice` of x (transposed when trans), from
  // its panels when they are packed.
  static Operand<T> operand(const Rows<T>& x, const tile::Packed* panels, bool trans,
                            std::int64_t slice, std::int64_t r0) {
    return {x.slice(slice), x.ld, trans, panels, slice, r0};
  }

  // Keys a block of query rows [i0, i0 + br) can see: [key_begin, key_end).
  // Causal blocks stop at the diagonal and windowed blocks start at the window's
  // left edge, so the tiles outside are never computed (bottom-right with
  // Tq > Tk: the first blocks may see none).
  std::int64_t key_end(std::int64_t i0, std::int64_t br) const {
    return has_hi ? std::clamp<std::int64_t>(i0 + br - 1 + hi_off + 1, 0, tk) : tk;
  }
  // Aligned down to a key tile, so that forward and backward cut the same
  // tiles. Wide tiles start at the window's edge, so the two passes cut
  // different tiles and a BLAS may round a score differently in each (in the
  // last bit): the backward's P = exp(S - L) then sums to 1 within rounding.
  std::int64_t key_begin(std::int64_t i0) const {
    if (!has_lo) return 0;
    const std::int64_t first = std::clamp<std::int64_t>(i0 + lo_off, 0, tk);
    return wide ? first : first / bc * bc;
  }
  // Query rows that see some key of [j0, j0 + bc): [query_begin, query_end).
  std::int64_t query_begin(std::int64_t j0) const {
    return has_hi ? std::clamp<std::int64_t>(j0 - hi_off, 0, tq) : 0;
  }
  std::int64_t query_end(std::int64_t j0, std::int64_t bc) const {
    return has_lo ? std::clamp<std::int64_t>(j0 + bc - 1 - lo_off + 1, 0, tq) : tq;
  }

  // The columns [lo, hi) of key tile [j0, j0 + bc) that query row i may see by
  // the causal diagonal and the window (the bool mask aside). They are one
  // band per row, so the columns outside it are filled and skipped instead of
  // tested one by one, and the exponentials of a tile that straddles a window
  // edge run over the band only (a 128-row block with a 256-key window spans
  // 384 keys: a third of its exponentials would be of masked keys).
  struct Band {
    std::int64_t lo, hi;
  };
  Band band(std::int64_t i, std::int64_t j0, std::int64_t bc) const {
    const std::int64_t lo = has_lo ? std::clamp<std::int64_t>(i + lo_off - j0, 0, bc) : 0;
    const std::int64_t hi = has_hi ? std::clamp<std::int64_t>(i + hi_off - j0 + 1, 0, bc) : bc;
    return {lo, std::max(lo, hi)};
  }

  // A tile that the causal diagonal (or a window's right edge) crosses: its
  // first rows see only its first keys. Its products then run in strips of
  // kStrip rows (or keys), each over the keys (or rows) it can see, and the
  // part above the diagonal is not computed: of a 256 x 256 diagonal tile,
  // 10/16 is. (The columns a strip leaves out are filled by scores() and the
  // band loops, as are the masked ones.)
  static constexpr std::int64_t kStrip = 64;
  bool crossed(std::int64_t i0, std::int64_t br, std::int64_t j0, std::int64_t bc) const {
    return has_hi && br > kStrip && bc > kStrip && j0 + bc - 1 > i0 + hi_off;
  }
  // f(r0, r1, keys): rows [r0, r1) of the tile see none of its keys from `keys` on
  template <class F>
  void row_strips(std::int64_t i0, std::int64_t br, std::int64_t j0, std::int64_t bc, F&& f) const {
    if (!crossed(i0, br, j0, bc)) return f(std::int64_t{0}, br, bc);
    for (std::int64_t r0 = 0; r0 < br; r0 += kStrip) {
      const std::int64_t r1 = std::min(br, r0 + kStrip);
      f(r0, r1, std::clamp<std::int64_t>(i0 + r1 - 1 + hi_off + 1 - j0, 0, bc));
    }
  }
  // f(c0, c1, first): keys [c0, c1) of the tile are seen by none of its rows before `first`
  template <class F>
  void key_strips(std::int64_t i0, std::int64_t br, std::int64_t j0, std::int64_t bc, F&& f) const {
    if (!crossed(i0, br, j0, bc)) return f(std::int64_t{0}, bc, std::int64_t{0});
    for (std::int64_t c0 = 0; c0 < bc; c0 += kStrip)
      f(c0, std::min(bc, c0 + kStrip), std::clamp<std::int64_t>(j0 + c0 - hi_off - i0, 0, br));
  }

  // s [br, bc] = scale * q[i0:i0+br] k[j0:j0+bc]^T, capped (s = C tanh(s / C))
  // when a cap is on, then masked entries -inf. dtanh (null: not wanted)
  // receives 1 - tanh^2 of each element in the band (0 outside it).
  // Forward and backward both call this, so on the same tiles they see
  // bit-identical scores.
  void scores(const Packs& packs, std::int64_t nn, std::int64_t i0, std::int64_t br,
              std::int64_t j0, std::int64_t bc, T* s, T* dtanh = nullptr) const {
    row_strips(i0, br, j0, bc, [&](std::int64_t r0, std::int64_t r1, std::int64_t keys) {
      product(false, r1 - r0, keys, d, scale, q.slice(nn) + (i0 + r0) * q.ld, q.ld,
              operand(k, packs.on ? &packs.k_t : nullptr, true, nn / group, j0), T(0), s + r0 * bc, bc);
    });
    const bool right = has_hi && j0 + bc - 1 > i0 + hi_off;       // some key j > i + hi_off here
    const bool left = has_lo && j0 < i0 + br - 1 + lo_off;         // some key j < i + lo_off here
    if (!right && !left && !mask.on && cap == T(0)) return;
    constexpr T neg_inf = -std::numeric_limits<T>::infinity();
    const bool* m = mask.on ? mask.slice(nn) : nullptr;
    const T inv_cap = cap > T(0) ? T(1) / cap : T(0);
    for (std::int64_t r = 0; r < br; ++r) {
      const std::int64_t i = i0 + r;
      const auto [lo, hi] = band(i, j0, bc);
      T* sr = s + r * bc;
      std::fill(sr, sr + lo, neg_inf);
      std::fill(sr + hi, sr + bc, neg_inf);
      if (cap > T(0)) {  // after the scale, before the bool mask
        T* dr = dtanh ? dtanh + r * bc : nullptr;
        for (std::int64_t c = lo; c < hi; ++c) {
          const T t = std::tanh(sr[c] * inv_cap);
          sr[c] = cap * t;
          if (dr) dr[c] = T(1) - t * t;
        }
        if (dr) {
          std::fill(dr, dr + lo, T(0));
          std::fill(dr + hi, dr + bc, T(0));
        }
      }
      if (m)
        for (std::int64_t c = lo; c < hi; ++c)
          if (!m[i * mask.si + (j0 + c) * mask.sj]) sr[c] = neg_inf;
    }
  }
};

template <class T>
Sdpa<T> make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sinks,
                     const AttentionSpec& spec, Tiles tiles) {
  const auto shapes = [&] {
    return "q " + shape_str(q.shape()) + ", k " + shape_str(k.shape()) + ", v " +
           shape_str(v.shape());
  };
  if (q.dim() < 2 || k.dim() < 2 || v.dim() < 2 || q.size(-1) != k.size(-1) ||
      k.size(-2) != v.size(-2))
    throw std::invalid_argument("fused_sdpa: " + shapes() +
                                " are not [..., Tq, d], [..., Tk, d], [..., Tk, dv]");
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype())
    throw std::invalid_argument("fused_sdpa: q, k, v dtypes differ (" +
                                std::string(dtype_name(q.dtype())) + ", " +
                                std::string(dtype_name(k.dtype())) + ", " +
                                std::string(dtype_name(v.dtype())) + ")");
  if (!(spec.dropout_p >= 0.0 && spec.dropout_p < 1.0))
    throw std::invalid_argument("fused_sdpa: dropout_p " + std::to_string(spec.dropout_p) +
                                " is not in [0, 1)");
  if (tiles.rows < 1 || tiles.keys < 1 || tiles.wide < 0)
    throw std::invalid_argument("fused_sdpa: tiles " + std::to_string(tiles.rows) + " x " +
                                std::to_string(tiles.keys) + " (query rows x keys), wide " +
                                std::to_string(tiles.wide) + ": rows and keys must be >= 1, wide >= 0");
  Sdpa<T> a;
  a.br = tiles.rows;
  a.bc = tiles.keys;
  a.wide = tiles.wide > 0 && spec.window.enabled();
  a.fwd_keys = a.wide ? tiles.wide : a.bc;
  a.bwd_rows = a.wide ? tiles.wide : a.br;
  if constexpr (std::is_same_v<T, float>)
    a.packed = tiles.packed && !a.wide && a.bc % tile::kPanel == 0 && tile::available();
  // Grouped KV heads: k and v agree on Hkv heads at dim -3, fewer than q's H
  // (more is plain broadcasting of q). The lead is then broadcast with Hkv read as H.
  Shape lead_k = lead_dims(k.shape()), lead_v = lead_dims(v.shape());
  if (q.dim() >= 3 && k.dim() >= 3 && v.dim() >= 3 && k.size(-3) == v.size(-3) &&
      k.size(-3) < q.size(-3)) {
    const std::int64_t h = q.size(-3), hkv = k.size(-3);
    if (h % hkv != 0)
      throw std::invalid_argument("fused_sdpa: " + shapes() + ": q has H = " + std::to_string(h) +
                                  " heads (dim -3) and k, v have Hkv = " + std::to_string(hkv) +
                                  "; grouped KV heads need H to be a multiple of Hkv");
    a.group = h / hkv;
    lead_k.back() = h;
    lead_v.back() = h;
  }
  a.lead = broadcast_shapes(broadcast_shapes(lead_dims(q.shape()), lead_k, "fused_sdpa"), lead_v,
                            "fused_sdpa");
  a.n = shape_numel(a.lead);
  a.kv_lead = a.lead;
  if (a.group > 1) a.kv_lead.back() /= a.group;
  a.tq = q.size(-2);
  a.tk = k.size(-2);
  a.d = q.size(-1);
  a.dv = v.size(-1);
  a.scale = static_cast<T>(spec.scale_for(a.d));
  a.causal = spec.causal;
  a.shift = spec.causal_shift(a.tq, a.tk);
  // Causal and the window from indices: row i sees i + lo_off <= j <= i + hi_off.
  check_window(spec.window, "fused_sdpa");
  const std::int64_t o = window_offset(spec, a.tq, a.tk);
  constexpr std::int64_t kFar = std::int64_t{1} << 62;  // a bound past every key
  a.has_hi = a.causal || spec.window.right.has_value();
  a.hi_off = std::min(a.causal ? a.shift : kFar,
                      spec.window.right ? o + std::min(*spec.window.right, kFar) : kFar);
  a.has_lo = spec.window.left.has_value();
  a.lo_off = a.has_lo ? o - std::min(*spec.window.left, kFar) : 0;
  if (!(spec.softcap >= 0.0) || !std::isfinite(spec.softcap))
    throw std::invalid_argument("fused_sdpa: softcap " + std::to_string(spec.softcap) +
                                " is not a finite number >= 0 (0 is off)");
  a.cap = static_cast<T>(spec.softcap);
  a.q = as_rows<T>(q, a.lead, true);
  a.k = as_rows<T>(k, a.kv_lead);
  a.v = as_rows<T>(v, a.kv_lead);

  // The spec's bool mask alone (attention_mask checks its dtype); causal is
  // applied from indices so that it costs no [Tq, Tk] tensor.
  AttentionSpec mask_only = spec;
  mask_only.causal = false;
  mask_only.window = {};  // from indices too (its offset follows causal, which is off here)
  if (const Tensor m = attention_mask(mask_only, a.tq, a.tk); m.defined()) {
    Shape full = a.lead;
    full.push_back(a.tq);
    full.push_back(a.tk);
    if (broadcast_shapes(m.shape(), full, "fused_sdpa mask") != full)
      throw std::invalid_argument("fused_sdpa: mask " + shape_str(m.shape()) +
                                  " does not broadcast to [..., Tq, Tk] = " + shape_str(full));
    const Tensor expanded = m.expand(full);  // a view: broadcast dims get stride 0
    a.mask.on = true;
    a.mask.tensor = expanded;
    a.mask.base = expanded.data<bool>();
    a.mask.offsets = slice_offsets(expanded, a.lead.size());
    a.mask.si = expanded.stride(-2);
    a.mask.sj = expanded.stride(-1);
  }
  a.dropout.on = spec.dropout_p > 0.0;
  a.dropout.p = spec.dropout_p;
  a.dropout.seed = spec.dropout_seed;
  if (sinks.defined()) {  // one logit per query head: q's dim -3 (1 without one)
    a.heads = q.dim() >= 3 ? a.lead.back() : 1;
    if (sinks.dim() != 1 || sinks.numel() != a.heads)
      throw std::invalid_argument("fused_sdpa: sinks " + shape_str(sinks.shape()) + " for " + shapes() +
                                  ": expected [" + std::to_string(a.heads) + "], one logit per query head");
    if (sinks.dtype() != q.dtype())
      throw std::invalid_argument("fused_sdpa: sinks are " + std::string(dtype_name(sinks.dtype())) +
                                  ", q is " + std::string(dtype_name(q.dtype())));
    for (std::int64_t h = 0; h < a.heads; ++h) a.sinks.push_back(static_cast<T>(sinks.flat(h)));
  }
  return a;
}

// ---------------------------------------------------------------- packing

// The slices [count, rows, cols] of x packed as B operands, slices in parallel.
tile::Packed pack(const Rows<float>& x, std::int64_t count, std::int64_t rows, std::int64_t cols,
                  bool transposed) {
  tile::Packed p = tile::make_packed(count, rows, cols, transposed);
  parallel_for(count, [&](std::int64_t n0, std::int64_t n1, int) {
    for (std::int64_t n = n0; n < n1; ++n) tile::pack_slice(p, n, x.slice(n), x.ld, rows, cols);
  }, 1);
  return p;
}

// Which B operands a pass multiplies by (K^T always: S = Q K^T).
struct PackWants {
  bool v_t = false, v = false, k = false, q = false, dout = false;
};

// Those operands packed, when the products run on panels (Sdpa::packed);
// dout only when wants.dout.
template <class T>
Packs make_packs(const Sdpa<T>& a, PackWants wants, const Rows<T>* dout = nullptr) {
  Packs packs;
  if constexpr (std::is_same_v<T, float>)
    if (a.packed) {
      const std::int64_t nkv = a.n / a.group;
      packs.on = true;
      packs.k_t = pack(a.k, nkv, a.tk, a.d, true);
      if (wants.v_t) packs.v_t = pack(a.v, nkv, a.tk, a.dv, true);
      if (wants.v) packs.v = pack(a.v, nkv, a.tk, a.dv, false);
      if (wants.k) packs.k = pack(a.k, nkv, a.tk, a.d, false);
      if (wants.q) packs.q = pack(a.q, a.n, a.tq, a.d, false);
      if (wants.dout) packs.dout = pack(*dout, a.n, a.tq, a.dv, false);
    }
  return packs;
}

// ---------------------------------------------------------------- forward

// o [N, Tq, dv] and lse [N, Tq] (contiguous): rows [i0, i0 + br) of slice nn,
// one block of query rows. scratch: s [Br, fwd_keys], acc [Br, dv], m [Br], l [Br].
template <class T>
void sdpa_forward_block(const Sdpa<T>& a, const Packs& packs, std::int64_t nn, std::int64_t i0, T* o,
                        T* lse, T* scratch) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  const T keep_scale = static_cast<T>(1.0 / (1.0 - a.dropout.p));
  T* s = scratch;
  T* acc = s + a.br * a.fwd_keys;
  T* m = acc + a.br * a.dv;
  T* l = m + a.br;
  T* on = o + nn * a.tq * a.dv;
  T* ln = lse + nn * a.tq;
  const std::int64_t br = std::min(a.br, a.tq - i0);
  // A sink is the first column of every row: m = sigma, l = exp(sigma - m) = 1, no value.
  std::fill(m, m + br, a.sinks.empty() ? neg_inf : a.sink(nn));
  std::fill(l, l + br, a.sinks.empty() ? T(0) : T(1));
  std::fill(acc, acc + br * a.dv, T(0));
  const std::int64_t j_end = a.key_end(i0, br);
  for (std::int64_t j0 = a.key_begin(i0); j0 < j_end; j0 += a.fwd_keys) {
    const std::int64_t bc = std::min(a.fwd_keys, j_end - j0);
    a.scores(packs, nn, i0, br, j0, bc, s);
    bool any = false;  // a tile whose weights are all zero adds nothing to acc
    for (std::int64_t r = 0; r < br; ++r) {
      T* sr = s + r * bc;
      const auto [lo, hi] = a.band(i0 + r, j0, bc);  // outside it the scores are -inf: weights 0
      const T tile_max = row_max(sr + lo, hi - lo);
      const T m_new = std::max(m[r], tile_max);
      if (m_new == neg_inf) {  // no key attended so far: weights 0, nothing to rescale
        std::fill(sr, sr + bc, T(0));
        continue;
      }
      const T alpha = std::exp(m[r] - m_new);  // 0 when m[r] was -inf
      const T row_sum = exp_shift_row(sr + lo, hi - lo, m_new);
      std::fill(sr, sr + lo, T(0));
      std::fill(sr + hi, sr + bc, T(0));
      l[r] = l[r] * alpha + row_sum;
      m[r] = m_new;
      if (alpha != T(1))
        for (T* x = acc + r * a.dv; x != acc + (r + 1) * a.dv; ++x) *x *= alpha;
      if (a.dropout.on) {  // l keeps the undropped sum: dropout acts after softmax
        const std::uint64_t key = a.dropout.row_key(nn, i0 + r);
        for (std::int64_t c = 0; c < bc; ++c)
          sr[c] = a.dropout.keep(key, j0 + c) ? sr[c] * keep_scale : T(0);
      }
      any = true;
    }
    if (any)  // acc += P V[j0:j0+bc]
      a.row_strips(i0, br, j0, bc, [&](std::int64_t r0, std::int64_t r1, std::int64_t keys) {
        product(false, r1 - r0, a.dv, keys, T(1), s + r0 * bc, bc,
                a.operand(a.v, packs.on ? &packs.v : nullptr, false, nn / a.group, j0), T(1),
                acc + r0 * a.dv, a.dv);
      });
  }
  for (std::int64_t r = 0; r < br; ++r) {
    T* orow = on + (i0 + r) * a.dv;
    const T* arow = acc + r * a.dv;
    if (l[r] == T(0)) {  // every key masked: zeros, and L = -inf marks the row
      std::fill(orow, orow + a.dv, T(0));
      ln[i0 + r] = neg_inf;
      continue;
    }
    const T inv = T(1) / l[r];
    for (std::int64_t c = 0; c < a.dv; ++c) orow[c] = arow[c] * inv;
    ln[i0 + r] = m[r] + std::log(l[r]);
  }
}

// ---------------------------------------------------------------- backward

// sum of x[c] * y[c] in 16 lanes (lane c mod 16), added in lane order: the
// loop vectorizes, where one running sum is a chain of dependent additions.
template <class T>
T dot_in_lanes(const T* x, const T* y, std::int64_t n) {
  constexpr int kLanes = 16;
  T lane[kLanes] = {};
  std::int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += x[c + l] * y[c + l];
  for (; c < n; ++c) lane[c % kLanes] += x[c] * y[c];
  T sum = lane[0];
  for (int l = 1; l < kLanes; ++l) sum += lane[l];
  return sum;
}

struct Needs {
  bool q = false, k = false, v = false;
};

// dQ [N, Tq, d], shared by every key block: one lock per (slice, query block).
template <class T>
struct SharedDq {
  T* data = nullptr;                 // null: dQ not needed
  bool exclusive = false;            // one key block: each item owns its dQ rows
  std::int64_t q_blocks = 1;
  std::vector<std::mutex>* locks = nullptr;  // [N * q_blocks]

  // dQ[nn, i0:i0+br] += tile [br, d], each block of block_rows rows under its
  // lock (a wide tile may start inside one block and cross several).
  void add(std::int64_t nn, std::int64_t i0, std::int64_t br, std::int64_t d, std::int64_t tq,
           std::int64_t block_rows, const T* tile) const {
    for (std::int64_t r0 = i0; r0 < i0 + br;) {
      const std::int64_t block = r0 / block_rows;
      const std::int64_t r1 = std::min(i0 + br, (block + 1) * block_rows);
      T* dst = data + (nn * tq + r0) * d;
      const T* src = tile + (r0 - i0) * d;
      const std::lock_guard<std::mutex> hold((*locks)[static_cast<std::size_t>(nn * q_blocks + block)]);
      for (std::int64_t e = 0; e < (r1 - r0) * d; ++e) dst[e] += src[e];
      r0 = r1;
    }
  }
};

// The gradients that key block [j0, j0 + bc) of kv slice nn / G receives from
// every query block of query slice nn that sees it: additions to its rows of
// dk [Nkv, Tk, d] and dv [Nkv, Tk, dv] (contiguous, owned by the caller's
// item) and to dQ. Null pointers:
// not needed. drow [N, Tq] holds D = rowsum(dO * O). With R = bwd_rows: scratch
// p [R, Bc], ds [R, Bc], dq_tile [R, d], and with a cap dtanh [R, Bc].
template <class T>
void sdpa_backward_block(const Sdpa<T>& a, const Packs& packs, const Rows<T>& dout, const T* lse,
                         const T* drow, std::int64_t nn, std::int64_t j0, const SharedDq<T>& dq,
                         T* dk, T* dvv, T* scratch) {
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  const T keep_scale = static_cast<T>(1.0 / (1.0 - a.dropout.p));
  T* p = scratch;
  T* ds = p + a.bwd_rows * a.bc;
  T* dq_tile = ds + a.bwd_rows * a.bc;
  T* dtanh = a.cap > T(0) ? dq_tile + a.bwd_rows * a.d : nullptr;
  const bool need_ds = dq.data != nullptr || dk != nullptr;
  const std::int64_t nkv = nn / a.group;
  const auto packed = [&](const tile::Packed& x) { return packs.on ? &x : nullptr; };
  const T* don = dout.slice(nn);
  const T* ln = lse + nn * a.tq;
  const T* dn = drow + nn * a.tq;
  const std::int64_t bc = std::min(a.bc, a.tk - j0);
  // the query blocks whose rows' windows (and causal diagonal) meet these keys:
  // aligned to Br, or with wide tiles from the first row that sees them
  const std::int64_t i_begin = a.query_begin(j0), i_end = a.query_end(j0, bc);
  for (std::int64_t i0 = a.wide ? i_begin : i_begin / a.br * a.br; i0 < i_end; i0 += a.bwd_rows) {
    const std::int64_t br = std::min(a.bwd_rows, (a.wide ? i_end : a.tq) - i0);
    if (j0 >= a.key_end(i0, br)) continue;  // causal: this query block sees no key here
    // in the forward pass this was: P = softmax(S) over all key tiles
    a.scores(packs, nn, i0, br, j0, bc, p, need_ds ? dtanh : nullptr);
    bool any = false;
    for (std::int64_t r = 0; r < br; ++r) {
      T* pr = p + r * bc;
      const T lr = ln[i0 + r];
      const auto [lo, hi] = a.band(i0 + r, j0, bc);
      if (lr == neg_inf || lo == hi) {  // fully masked row, or none of its keys here: no weights
        std::fill(pr, pr + bc, T(0));
        continue;
      }
      exp_shift_row(pr + lo, hi - lo, lr);
      std::fill(pr, pr + lo, T(0));
      std::fill(pr + hi, pr + bc, T(0));
      any = true;
    }
    if (!any) continue;
    const T* dob = don + i0 * dout.ld;  // dO[i0:i0+br]
    // in the forward pass this was: O += dropout(P) V, so dP = dO V^T
    if (need_ds)  // columns a strip leaves out are zeros (the dropout loop reads every column)
      a.row_strips(i0, br, j0, bc, [&](std::int64_t r0, std::int64_t r1, std::int64_t keys) {
        product(false, r1 - r0, keys, a.dv, T(1), dob + r0 * dout.ld, dout.ld,
                a.operand(a.v, packed(packs.v_t), true, nkv, j0), T(0), ds + r0 * bc, bc);
        for (std::int64_t r = r0; r < r1; ++r) std::fill(ds + r * bc + keys, ds + (r + 1) * bc, T(0));
      });
    if (a.dropout.on) {  // p := dropout(P) for dV; ds := P * (dropout'(dP) - D)
      for (std::int64_t r = 0; r < br; ++r) {
        const std::uint64_t key = a.dropout.row_key(nn, i0 + r);
        T* pr = p + r * bc;
        T* dsr = ds + r * bc;
        for (std::int64_t c = 0; c < bc; ++c) {
          const T z = a.dropout.keep(key, j0 + c) ? keep_scale : T(0);
          if (need_ds) dsr[c] = pr[c] * (dsr[c] * z - dn[i0 + r]);
          pr[c] *= z;
        }
      }
    } else if (need_ds) {  // ds := P * (dP - D) in the band, 0 outside (P is 0 there)
      for (std::int64_t r = 0; r < br; ++r) {
        const T* pr = p + r * bc;
        T* dsr = ds + r * bc;
        const T dr = dn[i0 + r];
        const auto [lo, hi] = a.band(i0 + r, j0, bc);
        std::fill(dsr, dsr + lo, T(0));
        for (std::int64_t c = lo; c < hi; ++c) dsr[c] = pr[c] * (dsr[c] - dr);
        std::fill(dsr + hi, dsr + bc, T(0));
      }
    }
    if (need_ds && dtanh)  // through the cap: ds *= 1 - tanh^2 (finite, 0 outside the band)
      for (std::int64_t e = 0; e < br * bc; ++e) ds[e] *= dtanh[e];
    // dV[j0:j0+bc] += P^T dO and dK[j0:j0+bc] += dS^T Q * scale, each key
    // strip from the first row that sees it
    a.key_strips(i0, br, j0, bc, [&](std::int64_t c0, std::int64_t c1, std::int64_t first) {
      if (dvv)
        product(true, c1 - c0, a.dv, br - first, T(1), p + first * bc + c0, bc,
                a.operand(dout, packed(packs.dout), false, nn, i0 + first), T(1),
                dvv + (nkv * a.tk + j0 + c0) * a.dv, a.dv);
      if (dk)
        product(true, c1 - c0, a.d, br - first, a.scale, ds + first * bc + c0, bc,
                a.operand(a.q, packed(packs.q), false, nn, i0 + first), T(1),
                dk + (nkv * a.tk + j0 + c0) * a.d, a.d);
    });
    // dQ[i0:i0+br] += dS K * scale: into the rows this item owns (one key
    // block), or into scratch (beta 0: every row written) added under the block's lock
    if (dq.data) {
      T* dst = dq.exclusive ? dq.data + (nn * a.tq + i0) * a.d : dq_tile;
      a.row_strips(i0, br, j0, bc, [&](std::int64_t r0, std::int64_t r1, std::int64_t keys) {
        product(false, r1 - r0, a.d, keys, a.scale, ds + r0 * bc, bc,
                a.operand(a.k, packed(packs.k), false, nkv, j0), dq.exclusive ? T(1) : T(0),
                dst + r0 * a.d, a.d);
      });
      if (!dq.exclusive) dq.add(nn, i0, br, a.d, a.tq, a.br, dq_tile);
    }
  }
}

// ---------------------------------------------------------------- the op

template <class T>
Variable fused_core(const Variable& q, const Variable& k, const Variable& v,
                    const AttentionSpec& spec, Tiles tiles) {
  const Variable& sinks = spec.sinks;  // undefined: no sinks
  const auto a = std::make_shared<const Sdpa<T>>(make_problem<T>(
      q.data(), k.data(), v.data(), sinks.defined() ? sinks.data() : Tensor(), spec, tiles));
  const Shape q_shape = q.shape(), k_shape = k.shape(), v_shape = v.shape();

  auto forward = [a](CustomOpContext& ctx, const std::vector<Tensor>& in) {
    Tensor o = Tensor::empty(with_last2(a->lead, a->tq, a->dv), dtype_of<T>());  // [..., Tq, dv]
    Shape lse_shape = a->lead;
    lse_shape.push_back(a->tq);
    Tensor lse = Tensor::empty(lse_shape, dtype_of<T>());  // [..., Tq]
    const std::int64_t q_blocks = (a->tq + a->br - 1) / a->br;
    const std::int64_t items = a->n * q_blocks;
    const std::int64_t workers = std::clamp<std::int64_t>(num_threads(), 1, std::max<std::int64_t>(items, 1));
    const std::int64_t per = a->br * a->fwd_keys + a->br * a->dv + 2 * a->br;
    Tensor scratch = Tensor::empty({workers, per}, dtype_of<T>());
    T* po = o.mutable_data<T>();
    T* pl = lse.mutable_data<T>();
    T* ps = scratch.mutable_data<T>();
    const Packs packs = make_packs(*a, PackWants{.v = true});  // S = Q K^T, O = P V
    const SerialBlasScope serial_blas;
    // Item -> (slice, query block), the last query block first: it sees the most keys.
    parallel_items(items, [&](std::int64_t item, int w) {
      const std::int64_t nn = item / q_blocks, qb = q_blocks - 1 - item % q_blocks;
      sdpa_forward_block(*a, packs, nn, qb * a->br, po, pl, ps + w * per);
    });
    // q, k, v are read again by the backward (through `a`, which may view
    // their storage): saved too, so an in-place write to one is caught.
    ctx.saved = {o, lse, in[0], in[1], in[2]};
    return o;
  };

  auto backward = [a, q_shape, k_shape, v_shape](const CustomOpContext& ctx, const Tensor& g) {
    const Tensor& o = ctx.saved[0];
    const Tensor& lse = ctx.saved[1];
    const Needs need{ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]};
    const bool need_sinks = !a->sinks.empty() && ctx.needs_input_grad[3];
    std::vector<Tensor> grads(a->sinks.empty() ? 3 : 4);
    if (!need.q && !need.k && !need.v && !need_sinks) return grads;
    const Rows<T> dout = as_rows<T>(g, a->lead, true);
    Tensor dq, dk, dv;
    if (need.q) dq = Tensor::zeros(with_last2(a->lead, a->tq, a->d), dtype_of<T>());
    if (need.k) dk = Tensor::zeros(with_last2(a->kv_lead, a->tk, a->d), dtype_of<T>());
    if (need.v) dv = Tensor::zeros(with_last2(a->kv_lead, a->tk, a->dv), dtype_of<T>());
    const std::int64_t q_blocks = (a->tq + a->br - 1) / a->br;
    const std::int64_t k_blocks = (a->tk + a->bc - 1) / a->bc;
    const std::int64_t items = a->n / a->group * k_blocks;
    const std::int64_t workers = std::clamp<std::int64_t>(num_threads(), 1, std::max<std::int64_t>(items, 1));
    const std::int64_t per = (a->cap > T(0) ? 3 : 2) * a->bwd_rows * a->bc + a->bwd_rows * a->d;
    Tensor scratch = Tensor::empty({workers, per}, dtype_of<T>());
    // D = rowsum(dO * O) [N, Tq], once for every key block that needs it.
    Tensor drow = Tensor::empty({a->n, a->tq}, dtype_of<T>());
    const T* po = o.data<T>();
    T* pd = drow.mutable_data<T>();
    parallel_for(a->n * a->tq, [&](std::int64_t r0, std::int64_t r1, int) {
      for (std::int64_t row = r0; row < r1; ++row) {
        const std::int64_t nn = row / a->tq, i = row % a->tq;
        const T* gr = dout.slice(nn) + i * dout.ld;
        const T* orow = po + row * a->dv;
        pd[row] = dot_in_lanes(gr, orow, a->dv);
      }
    }, 64);
    if (need_sinks) {  // dsigma_h = -sum over the rows of head h of P_sink D, P_sink = exp(sigma_h - L)
      std::vector<T> dsig(a->sinks.size(), T(0));
      const T* pl = lse.data<T>();
      for (std::int64_t row = 0; row < a->n * a->tq; ++row) {
        const std::int64_t nn = row / a->tq;
        dsig[static_cast<std::size_t>(nn % a->heads)] -= std::exp(a->sink(nn) - pl[row]) * pd[row];
      }
      Tensor ds = Tensor::empty({a->heads}, dtype_of<T>());
      std::copy(dsig.begin(), dsig.end(), ds.mutable_data<T>());
      grads[3] = ds;
    }
    std::vector<std::mutex> dq_locks(need.q && k_blocks > 1 ? static_cast<std::size_t>(a->n * q_blocks) : 0);
    SharedDq<T> shared_dq;
    shared_dq.data = need.q ? dq.mutable_data<T>() : nullptr;
    shared_dq.exclusive = k_blocks == 1;
    shared_dq.q_blocks = q_blocks;
    shared_dq.locks = &dq_locks;
    T* pdk = need.k ? dk.mutable_data<T>() : nullptr;
    T* pdv = need.v ? dv.mutable_data<T>() : nullptr;
    const T* pl = lse.data<T>();
    T* ps = scratch.mutable_data<T>();
    {
      // dP = dO V^T, dQ = dS K, dK = dS^T Q, dV = P^T dO
      const Packs packs = make_packs(*a, PackWants{.v_t = need.q || need.k, .k = need.q, .q = need.k,
                                                   .dout = need.v}, &dout);
      const SerialBlasScope serial_blas;
      // Item -> (kv slice, key block), the first key block first: every causal
      // query block sees it. The item walks the G query slices of its group,
      // so its dK and dV rows get the group's sum from one worker.
      parallel_items(items, [&](std::int64_t item, int w) {
        const std::int64_t nkv = item / k_blocks, kb = item % k_blocks;
        for (std::int64_t nn = nkv * a->group; nn < (nkv + 1) * a->group; ++nn)
          sdpa_backward_block(*a, packs, dout, pl, pd, nn, kb * a->bc, shared_dq, pdk, pdv,
                              ps + w * per);
      });
    }
    // Leading dims that were broadcast are summed back to each input's shape
    // (the kv groups are summed already).
    grads[0] = need.q ? kernels::sum_to(dq, q_shape) : Tensor();
    grads[1] = need.k ? kernels::sum_to(dk, k_shape) : Tensor();
    grads[2] = need.v ? kernels::sum_to(dv, v_shape) : Tensor();
    return grads;
  };

  if (sinks.defined())  // a fourth input: dsinks flows back through the op
    return custom_op("fused_sdpa", {q, k, v, sinks}, std::move(forward), std::move(backward));
  return custom_op("fused_sdpa", {q, k, v}, std::move(forward), std::move(backward));
}

}  // namespace

Variable sdpa(const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& spec,
              Tiles tiles) {
  return dispatch_float(q.dtype(), "fused_sdpa",
                        [&]<class T>() { return fused_core<T>(q, k, v, spec, tiles); });
}

}  // namespace headgrad::fused_sdpa
