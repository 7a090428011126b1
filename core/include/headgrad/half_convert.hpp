// Bulk conversions between the 16-bit storage types and float32 (and from
// float64): the loops
// under Tensor::to and copy_ (and so under every op's upcast and rounding).
//
//   std::vector<BFloat16> h(n);
//   convert(x.data(), h.data(), n);            // float32 -> bfloat16, the fastest path this CPU has
//   convert(h.data(), y.data(), n, HalfPath::scalar);  // the portable loop of half.hpp
//
// Every path gives, bit for bit, what the scalar functions of half.hpp give
// element by element (round to nearest even; a NaN keeps its sign and top
// payload bits, quieted when narrowed; float16 subnormals exact; widening
// keeps a NaN's bits as they are). tests/test_half.cpp checks each vector
// path against the scalar one over all 65536 16-bit patterns and a large set
// of float32 patterns.
//
// HalfPath::best is chosen once, at the first call, by what the CPU has:
//   float32 -> bfloat16   AVX512-BF16 (vcvtneps2bf16, its flush-to-zero of
//                         subnormal inputs undone lane by lane), else AVX-512F
//                         integer rounding, else scalar
//   bfloat16 -> float32   AVX-512F, else AVX2 (a shift), else scalar
//   float32 <-> float16   AVX-512F (vcvtps2ph / vcvtph2ps), else F16C
//                         (8 lanes), else scalar; a float16 NaN widened keeps
//                         its signalling bit (the hardware would quiet it)
// HEADGRAD_HALF_CONVERT=scalar (read at that first call) keeps every
// conversion on the scalar loops, for comparison.
//
// Not installed with the SDK (plugins convert through Tensor::to, which uses
// these loops); core and its tests include it.
#pragma once

#include <cstddef>
#include <string>

#include "headgrad/half.hpp"

namespace headgrad {

enum class HalfPath {
  best,        // the fastest this CPU has (the default; scalar under HEADGRAD_HALF_CONVERT=scalar)
  scalar,      // half.hpp's functions, element by element: the portable rule
  avx2,        // 8 lanes: AVX2 integer bfloat16 rounding, F16C float16 (scalar float16 without F16C)
  avx512,      // 16 lanes, AVX-512F alone: integer bfloat16 rounding, vcvtps2ph / vcvtph2ps
  avx512bf16,  // avx512 with vcvtneps2bf16 for float32 -> bfloat16 (needs AVX512-BF16, BW, VL)
};
// Whether this CPU runs `path` (best and scalar: always). convert() throws
// std::invalid_argument for a path the CPU lacks.
bool half_path_available(HalfPath path);
const char* half_path_name(HalfPath path);  // "avx512bf16"

void convert(const float* src, BFloat16* dst, std::size_t n, HalfPath path = HalfPath::best);
void convert(const BFloat16* src, float* dst, std::size_t n, HalfPath path = HalfPath::best);
void convert(const float* src, Float16* dst, std::size_t n, HalfPath path = HalfPath::best);
void convert(const Float16* src, float* dst, std::size_t n, HalfPath path = HalfPath::best);
// float64 -> 16-bit, rounded once (half.hpp's *_from_double): the vector
// paths round to odd in float32 (vcvtpd2ps and a fix-up, no branch) a block at
// a time, then narrow that block with their float32 loop.
void convert(const double* src, BFloat16* dst, std::size_t n, HalfPath path = HalfPath::best);
void convert(const double* src, Float16* dst, std::size_t n, HalfPath path = HalfPath::best);

// The instructions each direction uses under HalfPath::best, for logs and the
// bench: "float32->bfloat16 avx512bf16, bfloat16->float32 avx512f, ...".
std::string half_convert_paths();

}  // namespace headgrad
