// fused_sdpa's kernel: the attention core as one custom op with a hand-written
// forward and backward (kernel.cpp says how). The plugin (fused_sdpa.cpp) calls
// it with the default tiles; tests link it directly and choose small tiles, so
// that a few dozen rows already cross several tiles in each direction.
//
// Shape legend: [...] leading dims, Tq/Tk query/key lengths, d query/key width,
// dv value width; Br x Bc one tile (query rows x keys); H query heads, Hkv
// key/value heads.
#pragma once

#include <cstdint>

#include <headgrad/attention.hpp>

namespace headgrad::fused_sdpa {

struct Tiles {
  std::int64_t rows = 128;  // Br: query rows per tile
  std::int64_t keys = 128;  // Bc: keys per tile
  // With a window only, > 0: the forward takes a query block's visible keys,
  // and the backward a key block's visible query rows, in tiles of up to
  // `wide` starting at the window's edge (one product where Bc-aligned tiles
  // would take several); 0: Br x Bc tiles throughout.
  std::int64_t wide = 0;
  // float32 on a CPU with AVX-512, keys a multiple of 32, no wide tiles: the
  // tile products run on operands packed once per pass (tile_gemm.hpp)
  // instead of BLAS calls that pack them again per tile. false: BLAS always.
  bool packed = true;
};

// q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] -> [..., Tq, dv], float32 or
// float64; leading dims broadcast. Grouped KV heads: q [..., H, Tq, d] with
// k [..., Hkv, Tk, d], v [..., Hkv, Tk, dv], H % Hkv == 0; query head h reads kv
// head h / (H / Hkv), without repeating k and v. Throws invalid_argument for bad
// shapes (H not a multiple of Hkv), dtypes, dropout_p outside [0, 1) or tiles
// below 1.
Variable sdpa(const Variable& q, const Variable& k, const Variable& v, const AttentionSpec& spec,
              Tiles tiles = {});

}  // namespace headgrad::fused_sdpa
