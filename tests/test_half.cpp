// bfloat16 and float16: the converters (every one of the 65536 bit patterns,
// and rounding against an independent formula), tensors and ops in 16 bits
// (each result is the float32 op on exact upcasts, rounded once), and .npy
// round trips with the bfloat16 refusal.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "checks.hpp"
#include "headgrad/attention.hpp"
#include "headgrad/blas.hpp"
#include "headgrad/half_convert.hpp"
#include "headgrad/kernels.hpp"
#include "headgrad/npy.hpp"
#include "headgrad/ops.hpp"
#include "headgrad/parallel.hpp"
#include "headgrad/tile_gemm.hpp"

namespace test_half {  // this file's names: test files share unity builds (tests/meson.build)

namespace hg = headgrad;
using hg::DType;
using hg::Tensor;

namespace {

// The reference rounding, written from the format's definition and nothing
// of the converter: a 16-bit format with `mant` stored mantissa bits and
// exponent range [emin, emax] holds the values m * 2^(e - mant) for integers
// |m| < 2^(mant+1), e >= emin; rounding is std::nearbyint on the scaled value
// (the default rounding mode: nearest, ties to even), in float64, where every
// float32 is exact and the scaled value is exact too (a power-of-two scaling).
double reference_round(double x, int mant, int emin, int emax) {
  if (std::isnan(x) || std::isinf(x) || x == 0) return x;
  int e = std::ilogb(x);            // x = 1.f * 2^e
  if (e < emin) e = emin;           // subnormal range: a fixed quantum 2^(emin - mant)
  const double quantum = std::ldexp(1.0, e - mant);
  const double r = std::nearbyint(x / quantum) * quantum;
  const double max_finite = std::ldexp(2.0 - std::ldexp(1.0, -mant), emax);
  // Past the largest finite value: rounds to inf when at or past the midpoint
  // to the next (non-existent) power 2^(emax+1).
  if (std::fabs(r) > max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}
double ref_bf16(double x) { return reference_round(x, 7, -126, 127); }
double ref_f16(double x) { return reference_round(x, 10, -14, 15); }

float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

// A float32 sample that exercises every rounding case of both formats: each
// exponent, with the dropped bits at 0, just below, at and just above the
// midpoint, with an odd and an even kept lsb, plus random patterns.
std::vector<float> rounding_sample() {
  std::vector<float> out;
  for (std::uint32_t exp = 0; exp < 255; ++exp)
    for (std::uint32_t kept : {0u, 1u, 2u, 3u, 0x3feu, 0x3ffu, 0x7eu, 0x7fu})
      for (std::uint32_t sign : {0u, 1u})
        for (int drop : {13, 16})  // float16 drops 13 mantissa bits, bfloat16 16
          for (std::uint32_t tail : {0u, 1u, 0x7ffu, 0x800u, 0x801u, 0xfffu}) {
            const std::uint32_t half = 1u << (drop - 1);
            const std::uint32_t low = tail == 0x800u ? half : tail == 0x7ffu ? half - 1 : tail == 0x801u ? half + 1 : tail;
            const std::uint32_t mantissa = ((kept << drop) | (low & ((1u << drop) - 1))) & 0x7fffffu;
            out.push_back(from_bits((sign << 31) | (exp << 23) | mantissa));
          }
  std::uint64_t s = 12345;
  for (int i = 0; i < 200000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const auto bits = static_cast<std::uint32_t>(s >> 32);
    if ((bits & 0x7f800000u) != 0x7f800000u) out.push_back(from_bits(bits));
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- converters

TEST(HalfConvert, EveryBfloat16PatternRoundTrips) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const hg::BFloat16 h{static_cast<std::uint16_t>(b)};
    const float f = hg::to_float(h);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(f), b << 16) << b;  // widening is exact: the top half
    const std::uint16_t back = hg::bfloat16_from_float(f).bits;
    if (std::isnan(f))  // NaN stays NaN, sign kept, made quiet
      EXPECT_EQ(back, b | 0x0040u) << b;
    else
      EXPECT_EQ(back, b) << b;
  }
}

TEST(HalfConvert, EveryFloat16PatternRoundTrips) {
  int subnormals = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const hg::Float16 h{static_cast<std::uint16_t>(b)};
    const float f = hg::to_float(h);
    const std::uint32_t e = (b >> 10) & 0x1f, m = b & 0x3ff;
    const double sign = (b & 0x8000) ? -1.0 : 1.0;
    // The value from the format's definition
    if (e == 0x1f && m == 0) {
      EXPECT_EQ(f, sign * std::numeric_limits<float>::infinity()) << b;
    } else if (e == 0x1f) {
      EXPECT_TRUE(std::isnan(f)) << b;
    } else {
      const double want = e == 0 ? sign * std::ldexp(m, -24) : sign * std::ldexp(1024.0 + m, static_cast<int>(e) - 25);
      EXPECT_EQ(static_cast<double>(f), want) << b;
      subnormals += e == 0 && m != 0;
    }
    const std::uint16_t back = hg::float16_from_float(f).bits;
    if (std::isnan(f)) {
      EXPECT_EQ(back, b | 0x0200u) << b;  // quiet bit set, payload and sign kept
    } else {
      EXPECT_EQ(back, b) << b;
    }
  }
  EXPECT_EQ(subnormals, 2 * 1023);
}

TEST(HalfConvert, RoundsToNearestEvenAsTheReferenceFormula) {
  for (const float f : rounding_sample()) {
    const double want_b = ref_bf16(f), want_h = ref_f16(f);
    EXPECT_EQ(static_cast<double>(hg::to_float(hg::bfloat16_from_float(f))), want_b)
        << "bfloat16 of " << std::hexfloat << f;
    EXPECT_EQ(static_cast<double>(hg::to_float(hg::float16_from_float(f))), want_h)
        << "float16 of " << std::hexfloat << f;
  }
}

TEST(HalfConvert, HandWorkedValues) {
  // ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 (float16): even is 1
  EXPECT_EQ(hg::float16_from_float(1.0f + 0x1p-11f).bits, 0x3c00);
  EXPECT_EQ(hg::float16_from_float(1.0f + 3 * 0x1p-11f).bits, 0x3c02);  // tie, odd lsb: up
  EXPECT_EQ(hg::float16_from_float(65504.0f).bits, 0x7bff);             // largest finite
  EXPECT_EQ(hg::float16_from_float(65519.0f).bits, 0x7bff);             // below the midpoint
  EXPECT_EQ(hg::float16_from_float(65520.0f).bits, 0x7c00);             // the midpoint: inf
  EXPECT_EQ(hg::float16_from_float(0x1p-24f).bits, 0x0001);             // smallest subnormal
  EXPECT_EQ(hg::float16_from_float(0x1p-25f).bits, 0x0000);             // its half: tie to 0
  EXPECT_EQ(hg::float16_from_float(0x1.000002p-25f).bits, 0x0001);      // just above: up
  EXPECT_EQ(hg::float16_from_float(-0.0f).bits, 0x8000);
  EXPECT_EQ(hg::bfloat16_from_float(1.0f / 3.0f).bits, 0x3eab);
  EXPECT_EQ(hg::bfloat16_from_float(1.0f + 0x1p-8f).bits, 0x3f80);      // tie to even
  EXPECT_EQ(hg::bfloat16_from_float(1.0f + 3 * 0x1p-8f).bits, 0x3f82);
  EXPECT_EQ(hg::bfloat16_from_float(std::numeric_limits<float>::max()).bits, 0x7f80);  // past bf16's max
  EXPECT_EQ(hg::bfloat16_from_float(-std::numeric_limits<float>::infinity()).bits, 0xff80);
}

// From float64 the rounding happens once: 1 + 2^-11 + 2^-40 is above the
// float16 midpoint, though float32 would round it to the midpoint itself
// (and a second rounding would then go to even: 1).
TEST(HalfConvert, FromFloat64RoundsOnce) {
  const double above = 1.0 + 0x1p-11 + 0x1p-40;
  EXPECT_EQ(static_cast<float>(above), 1.0f + 0x1p-11f);  // what double rounding would see
  EXPECT_EQ(hg::float16_from_double(above).bits, 0x3c01);
  EXPECT_EQ(hg::bfloat16_from_double(1.0 + 0x1p-8 + 0x1p-40).bits, 0x3f81);
  EXPECT_EQ(hg::float16_from_double(1e300).bits, 0x7c00);
  EXPECT_EQ(hg::float16_from_double(-1e-300).bits, 0x8000);
  std::uint64_t s = 99;
  for (int i = 0; i < 100000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double x = std::ldexp(static_cast<double>(s >> 11) * 0x1p-53 + 0.5, static_cast<int>(s % 60) - 30);
    EXPECT_EQ(static_cast<double>(hg::to_float(hg::float16_from_double(x))), ref_f16(x)) << x;
    EXPECT_EQ(static_cast<double>(hg::to_float(hg::bfloat16_from_double(x))), ref_bf16(x)) << x;
  }
}

// ---------------------------------------------------------------- bulk conversions (half_convert.hpp)

namespace {

// The vector paths this CPU runs (each one its own loops; best included).
std::vector<hg::HalfPath> vector_paths() {
  std::vector<hg::HalfPath> out{hg::HalfPath::best};
  for (auto p : {hg::HalfPath::avx2, hg::HalfPath::avx512, hg::HalfPath::avx512bf16})
    if (hg::half_path_available(p)) out.push_back(p);
  return out;
}

// float32 patterns for narrowing: rounding_sample() (every exponent, ties
// both ways for both formats), every bfloat16 pattern and every float16
// value widened with its dropped bits at, below and above the tie, float32
// subnormals, zeros, infinities, and NaNs of both signs, quiet and
// signalling, with payloads in the kept bits, the dropped bits, or both.
std::vector<float> narrowing_sample() {
  std::vector<float> out = rounding_sample();
  for (std::uint32_t h = 0; h < 65536; ++h) {
    for (std::uint32_t low : {0u, 1u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) out.push_back(from_bits((h << 16) | low));
    const std::uint32_t f = std::bit_cast<std::uint32_t>(hg::to_float(hg::Float16{static_cast<std::uint16_t>(h)}));
    for (std::int32_t delta : {0, 1, -1, 0xfff, 0x1000, 0x1001, -0x1000})
      out.push_back(from_bits(f + static_cast<std::uint32_t>(delta)));
  }
  for (std::uint32_t sign : {0u, 0x80000000u}) {
    for (std::uint32_t m : {1u, 2u, 0x7fffu, 0x8000u, 0x8001u, 0x18000u, 0x400000u, 0x7fffffu})
      out.push_back(from_bits(sign | m));  // subnormal float32
    for (std::uint32_t m : {1u, 0x1fffu, 0x2000u, 0xffffu, 0x10000u, 0x3fffffu, 0x400000u, 0x400001u, 0x7fffffu})
      out.push_back(from_bits(sign | 0x7f800000u | m));  // NaNs (below 0x400000: signalling)
    out.push_back(from_bits(sign | 0x7f800000u));         // inf
    out.push_back(from_bits(sign));                       // zero
  }
  return out;
}

template <class H>
void expect_same_bits(const std::vector<H>& want, const std::vector<H>& got, const std::vector<float>& in,
                      const char* what) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < in.size(); ++i)
    if (want[i].bits != got[i].bits && ++bad <= 5)
      ADD_FAILURE() << what << ": float32 bits 0x" << std::hex << std::bit_cast<std::uint32_t>(in[i]) << " scalar 0x"
                    << want[i].bits << " vector 0x" << got[i].bits;
  EXPECT_EQ(bad, 0u) << what;
}

}  // namespace

TEST(HalfBulk, ScalarPathIsTheElementFunctions) {
  const std::vector<float> in = narrowing_sample();
  std::vector<hg::BFloat16> b(in.size());
  std::vector<hg::Float16> h(in.size());
  hg::convert(in.data(), b.data(), in.size(), hg::HalfPath::scalar);
  hg::convert(in.data(), h.data(), in.size(), hg::HalfPath::scalar);
  for (std::size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(b[i].bits, hg::bfloat16_from_float(in[i]).bits) << i;
    ASSERT_EQ(h[i].bits, hg::float16_from_float(in[i]).bits) << i;
  }
}

// Every 16-bit pattern widened, NaNs included (a float16 signalling NaN keeps
// its bits: the scalar rule, which vcvtph2ps alone would not follow).
TEST(HalfBulk, EveryPatternWidensAsTheScalarPath) {
  std::vector<hg::BFloat16> b(65536);
  std::vector<hg::Float16> h(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) b[i].bits = h[i].bits = static_cast<std::uint16_t>(i);
  std::vector<float> want_b(65536), want_h(65536), got(65536);
  hg::convert(b.data(), want_b.data(), 65536, hg::HalfPath::scalar);
  hg::convert(h.data(), want_h.data(), 65536, hg::HalfPath::scalar);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(want_b[i]), std::bit_cast<std::uint32_t>(hg::to_float(b[i])));
    ASSERT_EQ(std::bit_cast<std::uint32_t>(want_h[i]), std::bit_cast<std::uint32_t>(hg::to_float(h[i])));
  }
  for (hg::HalfPath p : vector_paths()) {
    SCOPED_TRACE(hg::half_path_name(p));
    hg::convert(b.data(), got.data(), 65536, p);
    for (std::uint32_t i = 0; i < 65536; ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want_b[i])) << "bfloat16 0x" << std::hex << i;
    hg::convert(h.data(), got.data(), 65536, p);
    for (std::uint32_t i = 0; i < 65536; ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want_h[i])) << "float16 0x" << std::hex << i;
  }
}

TEST(HalfBulk, Float32PatternsNarrowAsTheScalarPath) {
  const std::vector<float> in = narrowing_sample();
  ASSERT_GT(in.size(), 1000000u);
  std::vector<hg::BFloat16> want_b(in.size()), got_b(in.size());
  std::vector<hg::Float16> want_h(in.size()), got_h(in.size());
  hg::convert(in.data(), want_b.data(), in.size(), hg::HalfPath::scalar);
  hg::convert(in.data(), want_h.data(), in.size(), hg::HalfPath::scalar);
  for (hg::HalfPath p : vector_paths()) {
    SCOPED_TRACE(hg::half_path_name(p));
    hg::convert(in.data(), got_b.data(), in.size(), p);
    expect_same_bits(want_b, got_b, in, "to bfloat16");
    hg::convert(in.data(), got_h.data(), in.size(), p);
    expect_same_bits(want_h, got_h, in, "to float16");
  }
}

// float64 -> 16-bit: every path rounds once, as bfloat16_from_double and
// float16_from_double do. The sample: each float32 of narrowing_sample()
// widened and nudged by 1 and 2^28 float64 ulps either way (so that float32
// rounds it away from zero, toward zero, or exactly), float64 values past
// float32's range and below its subnormals, and random bit patterns of every
// exponent. Lengths that leave tails after a block.
TEST(HalfBulk, Float64PatternsNarrowAsTheScalarRule) {
  std::vector<double> in;
  for (float f : narrowing_sample()) {
    const std::uint64_t b = std::bit_cast<std::uint64_t>(static_cast<double>(f));
    for (std::int64_t delta : {std::int64_t{0}, std::int64_t{1}, std::int64_t{-1}, std::int64_t{1} << 28, -(std::int64_t{1} << 28)})
      in.push_back(std::bit_cast<double>(b + static_cast<std::uint64_t>(delta)));
  }
  for (double x : {1e300, -1e300, 3.4028235677973366e38, 3.4028235677973362e38, 1e-300, -1e-300, 1e-46, 0x1p-150,
                   0x1.0000000000001p-150, 65519.99, 65520.0, -65520.0, 1.0 + 0x1p-11 + 0x1p-40, 1.0 + 0x1p-8 + 0x1p-40})
    in.push_back(x);
  std::uint64_t s = 12345;
  for (int i = 0; i < 200000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    in.push_back(std::bit_cast<double>(s));
  }
  std::vector<hg::BFloat16> want_b(in.size()), got_b(in.size());
  std::vector<hg::Float16> want_h(in.size()), got_h(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    want_b[i] = hg::bfloat16_from_double(in[i]);
    want_h[i] = hg::float16_from_double(in[i]);
  }
  std::vector<hg::HalfPath> paths = vector_paths();
  paths.push_back(hg::HalfPath::scalar);
  for (hg::HalfPath p : paths) {
    SCOPED_TRACE(hg::half_path_name(p));
    for (std::size_t n : {in.size(), std::size_t{1023}, std::size_t{1025}, std::size_t{17}}) {
      const std::size_t checked = std::min(n + 1, in.size());  // n, and the one past it
      std::fill_n(got_b.begin(), checked, hg::BFloat16{0xabcd});
      std::fill_n(got_h.begin(), checked, hg::Float16{0xabcd});
      hg::convert(in.data(), got_b.data(), n, p);
      hg::convert(in.data(), got_h.data(), n, p);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i)
        if ((got_b[i].bits != want_b[i].bits || got_h[i].bits != want_h[i].bits) && ++bad <= 5)
          ADD_FAILURE() << "float64 bits 0x" << std::hex << std::bit_cast<std::uint64_t>(in[i]) << ": bfloat16 0x"
                        << got_b[i].bits << " (scalar 0x" << want_b[i].bits << "), float16 0x" << got_h[i].bits
                        << " (scalar 0x" << want_h[i].bits << ")";
      EXPECT_EQ(bad, 0u) << n;
      if (n < in.size()) {  // past the end: untouched
        EXPECT_EQ(got_b[n].bits, 0xabcd);
      }
    }
  }
  // Tensor::to from float64 takes these loops, contiguous or by rows
  const Tensor x = Tensor::from_values(std::vector<double>(in.begin(), in.begin() + 6000), {3, 2000}, DType::float64);
  for (const Tensor& view : {x, x.narrow(1, 5, 1900)})
    for (DType dt : {DType::bfloat16, DType::float16}) {
      const Tensor h = view.to(dt);
      for (std::int64_t i = 0; i < view.numel(); ++i) {
        const double v = view.flat(i);
        const float want = dt == DType::bfloat16 ? hg::to_float(hg::bfloat16_from_double(v))
                                                 : hg::to_float(hg::float16_from_double(v));
        const float got = static_cast<float>(h.flat(i));
        ASSERT_TRUE(got == want || (got != got && want != want)) << i;
      }
    }
}

// Lengths that leave a tail after the 8 or 16 lanes, and unaligned starts.
TEST(HalfBulk, TailsAndOffsets) {
  const std::vector<float> in = narrowing_sample();
  for (hg::HalfPath p : vector_paths())
    for (std::size_t start : {0u, 1u, 3u})
      for (std::size_t n : {0u, 1u, 7u, 8u, 15u, 17u, 33u, 100u}) {
        std::vector<hg::BFloat16> want(n + 1), got(n + 1);
        got[n].bits = 0xabcd;  // past the end: untouched
        hg::convert(in.data() + start, want.data(), n, hg::HalfPath::scalar);
        hg::convert(in.data() + start, got.data(), n, p);
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i].bits, want[i].bits) << hg::half_path_name(p) << " " << n;
        EXPECT_EQ(got[n].bits, 0xabcd);
        std::vector<float> back(n + 1, 7.0f);
        hg::convert(got.data(), back.data(), n, p);
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(back[i], hg::to_float(want[i]));
        EXPECT_EQ(back[n], 7.0f);
      }
}

// Tensor::to takes the bulk loops for contiguous tensors and for views whose
// rows are contiguous, element by element otherwise: every way gives the scalar rule.
TEST(HalfBulk, TensorConversionsFollowTheScalarRule) {
  hg::Generator gen(7);
  const Tensor x = hg::randn({3, 5, 40}, DType::float32, gen, 100.0);
  for (DType dt : {DType::bfloat16, DType::float16}) {
    for (const Tensor& view : {x, x.narrow(2, 3, 33), x.transpose(0, 1), x.transpose(1, 2)}) {
      const Tensor h = view.to(dt);
      const Tensor back = h.to(DType::float32);
      for (std::int64_t i = 0; i < view.numel(); ++i) {
        const float f = static_cast<float>(view.flat(i));
        const float want = dt == DType::bfloat16 ? hg::to_float(hg::bfloat16_from_float(f))
                                                 : hg::to_float(hg::float16_from_float(f));
        ASSERT_EQ(static_cast<float>(h.flat(i)), want) << i;
        ASSERT_EQ(static_cast<float>(back.flat(i)), want) << i;
      }
      // a 16-bit view widened (rows contiguous, then not)
      const Tensor hv = h.transpose(0, 1).to(DType::float32);
      for (std::int64_t i = 0; i < hv.numel(); ++i) ASSERT_EQ(hv.flat(i), h.transpose(0, 1).flat(i)) << i;
    }
  }
}

// to_vector's contiguous fast path (offset views included) against element reads.
TEST(HalfBulk, ToVectorReadsEveryElement) {
  hg::Generator gen(11);
  const Tensor x = hg::randn({5, 4099}, DType::float64, gen, 10.0);
  for (DType dt : {DType::float64, DType::float32, DType::bfloat16, DType::float16}) {
    const Tensor t = x.to(dt);
    for (const Tensor& view : {t, t.narrow(0, 1, 3), t.narrow(1, 2, 4000)}) {
      const std::vector<double> v = view.to_vector();
      ASSERT_EQ(v.size(), static_cast<std::size_t>(view.numel()));
      for (std::int64_t i = 0; i < view.numel(); ++i) ASSERT_EQ(v[static_cast<std::size_t>(i)], view.flat(i)) << i;
    }
  }
}

// ---------------------------------------------------------------- tensors

TEST(HalfTensor, DtypeNamesSizesAndConversions) {
  EXPECT_EQ(hg::dtype_name(DType::bfloat16), "bfloat16");
  EXPECT_EQ(hg::dtype_name(DType::float16), "float16");
  EXPECT_EQ(hg::dtype_from_name("bfloat16"), DType::bfloat16);
  EXPECT_EQ(hg::dtype_from_name("float16"), DType::float16);
  EXPECT_EQ(hg::dtype_size(DType::bfloat16), 2u);
  EXPECT_EQ(hg::dtype_size(DType::float16), 2u);
  const std::vector<double> v = {1.0, 1.0 / 3.0, -65504.0, 1e5, 0x1p-24, -0.0};
  const Tensor d = Tensor::from_values(v, {2, 3}, DType::float64);
  const Tensor h = d.to(DType::float16), b = d.to(DType::bfloat16);
  for (std::int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(h.flat(i), ref_f16(v[static_cast<std::size_t>(i)])) << i;
    EXPECT_EQ(b.flat(i), ref_bf16(v[static_cast<std::size_t>(i)])) << i;
  }
  EXPECT_TRUE(std::isinf(h.flat(3)));  // 1e5 is past float16's range
  // transposed (strided) conversions, and 16 -> 16 through float32
  const Tensor ht = d.transpose(0, 1).to(DType::float16);
  EXPECT_EQ(ht.at({2, 0}), h.at({0, 2}));
  EXPECT_EQ(b.to(DType::float16).flat(1), ref_f16(ref_bf16(1.0 / 3.0)));
  EXPECT_EQ(h.data<hg::Float16>()[0].bits, 0x3c00);
  EXPECT_THROW(static_cast<void>(h.data<float>()), std::invalid_argument);
  Tensor f = Tensor::full({3}, 0.1, DType::bfloat16);
  EXPECT_EQ(f.flat(2), ref_bf16(0.1));
}

// ---------------------------------------------------------------- ops

namespace {

Tensor seeded(const hg::Shape& shape, DType dt, std::uint64_t seed, double stddev = 1.0) {
  hg::Generator gen(seed);
  return hg::randn(shape, dt, gen, stddev);
}

// The per-op rule, element by element: result == round(float32 op on exact upcasts).
void expect_rounded_float32(const Tensor& got, const Tensor& f32_result, const char* what) {
  ASSERT_EQ(got.shape(), f32_result.shape()) << what;
  const Tensor want = f32_result.to(got.dtype());
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.flat(i), w = want.flat(i);
    if (std::isnan(w)) EXPECT_TRUE(std::isnan(g)) << what << " at " << i;
    else ASSERT_EQ(g, w) << what << " at " << i << " (" << hg::dtype_name(got.dtype()) << ")";
  }
}

class HalfOps : public ::testing::TestWithParam<DType> {};

}  // namespace

TEST_P(HalfOps, ElementwiseResultsAreTheRoundedFloat32Op) {
  namespace k = hg::kernels;
  const DType dt = GetParam();
  const Tensor a = seeded({3, 4, 5}, dt, 1), b = seeded({4, 5}, dt, 2);  // b broadcasts
  const Tensor a32 = a.to(DType::float32), b32 = b.to(DType::float32);
  // the upcasts are exact: converting back gives the same bits
  expect_rounded_float32(a, a32, "upcast");
  using BO = k::BinaryOp;
  for (BO op : {BO::add, BO::sub, BO::mul, BO::div})
    expect_rounded_float32(k::binary(op, a, b), k::binary(op, a32, b32), "binary");
  expect_rounded_float32(k::unary(k::UnaryOp::exp, a), k::unary(k::UnaryOp::exp, a32), "exp");
  expect_rounded_float32(k::unary(k::UnaryOp::neg, a), k::unary(k::UnaryOp::neg, a32), "neg");
  expect_rounded_float32(k::scale(a, 0.3), k::scale(a32, 0.3), "scale");
  expect_rounded_float32(k::sum_to(a, {1, 4, 1}), k::sum_to(a32, {1, 4, 1}), "sum_to");
  expect_rounded_float32(k::sum_all(a), k::sum_all(a32), "sum_all");
  expect_rounded_float32(k::softmax(a, 1), k::softmax(a32, 1), "softmax");
  expect_rounded_float32(k::softmax_backward(a, b.expand({3, 4, 5}), -1),
                         k::softmax_backward(a32, b32.expand({3, 4, 5}), -1), "softmax_backward");
  const Tensor causal = hg::causal_mask(4, 5);
  expect_rounded_float32(k::masked_fill(a, causal, -1.5), k::masked_fill(a32, causal, -1.5), "masked_fill");
  expect_rounded_float32(k::masked_softmax(a, 0.7, Tensor(), true), k::masked_softmax(a32, 0.7, Tensor(), true),
                         "masked_softmax");
  // matmul: float32 tiles on the upcasts, one rounding of each result
  const Tensor m = seeded({3, 5, 6}, dt, 3);
  expect_rounded_float32(k::matmul(a, m), k::matmul(a32, m.to(DType::float32)), "matmul");
  expect_rounded_float32(k::matmul(a.transpose(1, 2), a), k::matmul(a32.transpose(1, 2), a32), "matmul^T");
}

// The kernels that convert a tile or a row at a time (binary ops of two
// contiguous tensors of one shape, the masked softmax and its backward) give
// the bits of the float32 kernel on whole upcasts, rounded once: over many
// tiles and rows with ragged tails, causal rows of every length, a bool mask,
// signed zeros, infinities and NaNs.
TEST_P(HalfOps, TiledKernelsAreTheRoundedFloat32Kernel) {
  namespace k = hg::kernels;
  const DType dt = GetParam();
  const auto same_bits = [](const Tensor& got, const Tensor& f32_result, const char* what) {
    ASSERT_EQ(got.shape(), f32_result.shape()) << what;
    const std::vector<double> g = got.to_vector(), w = f32_result.to(got.dtype()).to_vector();
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (std::isnan(w[i])) ASSERT_TRUE(std::isnan(g[i])) << what << " at " << i;
      else ASSERT_TRUE(g[i] == w[i] && std::signbit(g[i]) == std::signbit(w[i]))
          << what << " at " << i << ": " << g[i] << " against " << w[i];
    }
  };
  // 3 x 9001: two 4096-element tiles and a ragged one per row, 7 tiles in all
  Tensor a = seeded({3, 9001}, dt, 21, 30.0), b = seeded({3, 9001}, dt, 22, 30.0);
  const std::vector<double> specials = {0.0, -0.0, INFINITY, -INFINITY, NAN};
  for (std::size_t i = 0; i < specials.size(); ++i)
    for (std::int64_t j : {std::int64_t{0}, std::int64_t{4095}, std::int64_t{26990}}) {
      a.set_flat(j + static_cast<std::int64_t>(i), specials[i]);
      b.set_flat(j + static_cast<std::int64_t>((i + 1) % specials.size()), specials[i]);
    }
  const Tensor a32 = a.to(DType::float32), b32 = b.to(DType::float32);
  using BO = k::BinaryOp;
  for (BO op : {BO::add, BO::sub, BO::mul, BO::div}) same_bits(k::binary(op, a, b), k::binary(op, a32, b32), "binary");
  // an offset view of one shape: a contiguous run that starts past the storage's start
  same_bits(k::binary(BO::add, a.narrow(0, 1, 2), b.narrow(0, 0, 2)),
            k::binary(BO::add, a32.narrow(0, 1, 2), b32.narrow(0, 0, 2)), "binary, offset views");
  // views of one shape with contiguous rows, taken row by row: a slice of
  // rows of a [.., T, d] gradient, a narrowed last dim (K^T's keys), rows
  // longer than a tile, the specials above included
  {
    const Tensor g = seeded({2, 3, 40, 64}, dt, 41), h = seeded({2, 3, 40, 64}, dt, 42);
    const Tensor g32 = g.to(DType::float32), h32 = h.to(DType::float32);
    const Tensor blk = seeded({2, 3, 16, 64}, dt, 43), blk32 = blk.to(DType::float32);
    for (BO op : {BO::add, BO::sub, BO::mul, BO::div}) {
      same_bits(k::binary(op, g.narrow(2, 8, 16), blk), k::binary(op, g32.narrow(2, 8, 16), blk32), "binary, row slice");
      same_bits(k::binary(op, g.narrow(3, 5, 40), h.narrow(3, 0, 40)),
                k::binary(op, g32.narrow(3, 5, 40), h32.narrow(3, 0, 40)), "binary, narrowed last dim");
      same_bits(k::binary(op, a.narrow(1, 3, 8990), b.narrow(1, 0, 8990)),
                k::binary(op, a32.narrow(1, 3, 8990), b32.narrow(1, 0, 8990)), "binary, long rows");
    }
  }

  // add with a tile of +0 on one side (tile 1 of b, tile 3 of a): the other
  // side copied, but -0 becomes +0 and a signalling NaN is quieted, as the
  // float32 add does; compared bit for bit
  const auto raw_bits = [](const Tensor& t) {
    std::vector<std::uint16_t> out(static_cast<std::size_t>(t.numel()));
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = t.dtype() == DType::bfloat16 ? t.data<hg::BFloat16>()[i].bits : t.data<hg::Float16>()[i].bits;
    return out;
  };
  const auto set_bits = [](Tensor& t, std::int64_t i, std::uint16_t bits) {
    if (t.dtype() == DType::bfloat16) t.mutable_data<hg::BFloat16>()[i].bits = bits;
    else t.mutable_data<hg::Float16>()[i].bits = bits;
  };
  Tensor za = a.clone(), zb = b.clone();
  for (std::int64_t i = 4096; i < 8192; ++i) set_bits(zb, i, 0);
  for (std::int64_t i = 12288; i < 16384; ++i) set_bits(za, i, 0);
  const bool bf = dt == DType::bfloat16;
  // -0, +0, signalling and quiet NaNs with payloads, infinities, a subnormal, the largest finite
  const std::vector<std::uint16_t> special_bits = {
      0x8000, 0x0000, static_cast<std::uint16_t>(bf ? 0x7f81 : 0x7c01), static_cast<std::uint16_t>(bf ? 0xffa5 : 0xfd05),
      static_cast<std::uint16_t>(bf ? 0x7fc3 : 0x7e03), static_cast<std::uint16_t>(bf ? 0x7f80 : 0x7c00),
      static_cast<std::uint16_t>(bf ? 0xff80 : 0xfc00), 0x0001, 0x8003, static_cast<std::uint16_t>(bf ? 0x7f7f : 0x7bff)};
  for (std::size_t i = 0; i < special_bits.size(); ++i) {
    set_bits(za, 4100 + static_cast<std::int64_t>(i), special_bits[i]);
    set_bits(zb, 12300 + static_cast<std::int64_t>(i), special_bits[i]);
  }
  for (const auto& [x, y] : {std::pair{za, zb}, std::pair{zb, za}}) {
    const Tensor got = k::binary(BO::add, x, y);
    const Tensor want = k::binary(BO::add, x.to(DType::float32), y.to(DType::float32)).to(dt);
    const std::vector<std::uint16_t> g = raw_bits(got), w = raw_bits(want);
    for (std::size_t i = 0; i < g.size(); ++i)
      ASSERT_EQ(g[i], w[i]) << "add with a +0 tile at " << i << std::hex << ": 0x" << g[i] << " against 0x" << w[i];
    EXPECT_EQ(g[4100], 0x0000) << "-0 + +0 is +0";
  }

  // masked softmax: [2, 3, 37, 301] scores, causal with several shifts, a bool mask
  const Tensor s = seeded({2, 3, 37, 301}, dt, 23, 4.0), dy = seeded({2, 3, 37, 301}, dt, 24);
  const Tensor s32 = s.to(DType::float32), dy32 = dy.to(DType::float32);
  hg::Generator gen(25);
  const Tensor draw = hg::rand_uniform({37, 301}, DType::float64, gen, 0.0, 1.0);
  Tensor mask = Tensor::empty({37, 301}, DType::boolean);
  for (std::int64_t i = 0; i < mask.numel(); ++i) mask.set_flat(i, draw.flat(i) > 0.3);  // 70% attended
  for (bool causal : {false, true})
    for (std::int64_t shift : {std::int64_t{0}, std::int64_t{264}, std::int64_t{-5}})
      for (const Tensor& m : {Tensor(), mask}) {
        const Tensor y = k::masked_softmax(s, 0.125, m, causal, shift);
        const Tensor y32 = k::masked_softmax(s32, 0.125, m, causal, shift);
        same_bits(y, y32, "masked_softmax");
        // the backward from the 16-bit weights (what the op saves), upcast
        same_bits(k::masked_softmax_backward(y, dy, 0.125, causal, shift),
                  k::masked_softmax_backward(y.to(DType::float32), dy32, 0.125, causal, shift),
                  "masked_softmax_backward");
      }
  // a transposed (non-contiguous) input takes a 16-bit copy first
  same_bits(k::masked_softmax(s.transpose(-2, -1), 0.5, Tensor(), true),
            k::masked_softmax(s32.transpose(-2, -1), 0.5, Tensor(), true), "masked_softmax of a view");

  // matmul's transposed operands, widened and transposed in 16 x 256 blocks
  // (ragged at both ends): the float32 product of the transposed copies
  const Tensor p = seeded({2, 3, 37, 301}, dt, 26), v = seeded({2, 3, 37, 5}, dt, 27);
  const Tensor pt = p.transpose(-2, -1), heads = seeded({2, 37, 3, 5}, dt, 28).transpose(1, 2);
  same_bits(k::matmul(pt, v), k::matmul(pt.to(DType::float32).contiguous(), v.to(DType::float32)), "P^T V");
  same_bits(k::matmul(v.transpose(-2, -1), p), k::matmul(v.transpose(-2, -1).to(DType::float32).contiguous(),
                                                         p.to(DType::float32)), "V^T P");
  same_bits(k::matmul(pt, heads), k::matmul(pt.to(DType::float32).contiguous(), heads.to(DType::float32)),
            "P^T of permuted heads");
}

// Through the graph: the output is 16-bit, the gradients are 16-bit, and each
// equals the rounded float32 computation of the same op.
TEST_P(HalfOps, BackwardGradientsAreStoredIn16Bits) {
  const DType dt = GetParam();
  const Tensor a = seeded({4, 6}, dt, 4), w = seeded({5, 6}, dt, 5), r = seeded({4, 5}, dt, 6);
  hg::Variable va(a, true), vw(w, true);
  const hg::Variable y = hg::linear(va, vw);
  EXPECT_EQ(y.dtype(), dt);
  hg::sum(hg::mul(y, hg::Variable(r))).backward();
  ASSERT_EQ(va.grad().dtype(), dt);
  ASSERT_EQ(vw.grad().dtype(), dt);
  namespace k = hg::kernels;
  // dy = round(1 * r) = r; da = round(dy @ w), dw = round(dy^T @ a), each in float32 inside
  const Tensor r32 = r.to(DType::float32);
  expect_rounded_float32(va.grad(), k::matmul(r32, w.to(DType::float32)), "da");
  expect_rounded_float32(vw.grad(), k::matmul(r32.transpose(0, 1), a.to(DType::float32)), "dw");
  // cast: float32 in the middle, gradient back in 16 bits
  hg::Variable vc(a, true);
  hg::sum(hg::mul(hg::cast(vc, DType::float32), hg::Variable(Tensor::full({4, 6}, 1.0 / 3.0, DType::float32))))
      .backward();
  ASSERT_EQ(vc.grad().dtype(), dt);
  EXPECT_EQ(vc.grad().flat(0), Tensor::full({}, 1.0 / 3.0, dt).item());
}

// RoPE in 16 bits: rotated in float32 (float64 tables), rounded once; its
// backward (the rotation by -phi) stores dx in 16 bits the same way.
TEST_P(HalfOps, RopeIsTheRoundedFloat32Rotation) {
  const DType dt = GetParam();
  hg::RopeSpec spec;
  spec.style = hg::RopeStyle::half;
  spec.rotary_dim = 6;
  spec.offset = 1000;
  const Tensor x = seeded({2, 3, 5, 8}, dt, 10), r = seeded({2, 3, 5, 8}, dt, 11);
  hg::Variable v(x, true), v32(x.to(DType::float32), true);
  const hg::Variable y = hg::rope(v, spec), y32 = hg::rope(v32, spec);
  expect_rounded_float32(y.data(), y32.data(), "rope");
  hg::sum(hg::mul(y, hg::Variable(r))).backward();
  hg::sum(hg::mul(y32, hg::Variable(r.to(DType::float32)))).backward();
  expect_rounded_float32(v.grad(), v32.grad(), "rope dx");
}

// Overflow behaves as the dtype does: float16 exp(12) is inf, bfloat16's is finite.
TEST_P(HalfOps, Float16OverflowsWhereBfloat16DoesNot) {
  const DType dt = GetParam();
  const Tensor big = Tensor::full({2}, 12.0, dt);
  const double e = hg::kernels::unary(hg::kernels::UnaryOp::exp, big).flat(0);
  if (dt == DType::float16) EXPECT_TRUE(std::isinf(e));
  else EXPECT_NEAR(e, std::exp(12.0), std::exp(12.0) * 0x1p-8);
}

// 16-bit products on the packed micro-kernel (tile::gemm_16bit: op(B) widened
// while packed, A a block of rows at a time, each block rounded once): the
// bits of the float32 product of the upcasts on the same kernel
// (gemm_packing_b) rounded once, and within the float32 sum's error bound of
// a float64 product of the same 16-bit values. Sizes off the 12 x 32 block
// and off the row blocks (n large enough for several), both transpositions,
// leading dims wider than the rows (the padding never written). Then through
// kernels::matmul on one and on two threads, with the views batched makes
// (a block of rows, K^T narrowed to a block's keys, P^T): the bits of the
// float32 matmul of the upcasts, rounded once. Without AVX-512 a direct call
// is refused and matmul keeps the whole upcasts.
TEST_P(HalfOps, PackedProductsAreTheRoundedFloat32Product) {
  namespace k = hg::kernels;
  const DType dt = GetParam();
  const bool bf = dt == DType::bfloat16;
  const auto bits = [&](const Tensor& t, std::int64_t i) -> std::uint16_t {
    return bf ? t.data<hg::BFloat16>()[i].bits : t.data<hg::Float16>()[i].bits;
  };
  const auto call = [&](bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t kk, const Tensor& a,
                        std::int64_t lda, const Tensor& b, std::int64_t ldb, Tensor& c, std::int64_t ldc) {
    if (bf)
      hg::tile::gemm_16bit(ta, tb, m, n, kk, a.data<hg::BFloat16>(), lda, b.data<hg::BFloat16>(), ldb,
                           c.mutable_data<hg::BFloat16>(), ldc);
    else
      hg::tile::gemm_16bit(ta, tb, m, n, kk, a.data<hg::Float16>(), lda, b.data<hg::Float16>(), ldb,
                           c.mutable_data<hg::Float16>(), ldc);
  };
  if (!hg::tile::available()) {
    const Tensor a = seeded({4, 4}, dt, 1);
    Tensor c = Tensor::zeros({4, 4}, dt);
    EXPECT_THROW(call(false, false, 4, 4, 4, a, 4, a, 4, c, 4), std::logic_error);
  } else {
    const double u = bf ? 0x1p-8 : 0x1p-11;  // the unit roundoff of the output's rounding
    for (const auto& [m, n, kk] : {std::array<std::int64_t, 3>{37, 45, 19}, {12, 32, 1}, {1, 1, 3},
                                   {13, 2100, 5}, {128, 512, 64}, {128, 64, 512}, {512, 64, 128}, {61, 97, 300}}) {
      for (const bool ta : {false, true})
        for (const bool tb : {false, true}) {
          SCOPED_TRACE(std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(kk) +
                       (ta ? ", A^T" : "") + (tb ? ", B^T" : ""));
          const std::int64_t lda = (ta ? m : kk) + 3, ldb = (tb ? kk : n) + 5, ldc = n + 2;
          const Tensor a = seeded({ta ? kk : m, lda}, dt, static_cast<std::uint64_t>(m + kk));
          const Tensor b = seeded({tb ? n : kk, ldb}, dt, static_cast<std::uint64_t>(n + 7 * kk));
          Tensor c = Tensor::full({m, ldc}, 0.5, dt);
          call(ta, tb, m, n, kk, a, lda, b, ldb, c, ldc);
          const Tensor a32 = a.to(DType::float32), b32 = b.to(DType::float32);
          Tensor c32 = Tensor::zeros({m, n}, DType::float32);
          hg::tile::gemm_packing_b(ta, tb, m, n, kk, 1.0f, a32.data<float>(), lda, b32.data<float>(), ldb, 0.0f,
                                   c32.mutable_data<float>(), n);
          const Tensor want = c32.to(dt);
          const Tensor half = Tensor::full({1}, 0.5, dt);
          std::int64_t wrong = 0;
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < ldc; ++j)
              wrong += bits(c, i * ldc + j) != (j >= n ? bits(half, 0) : bits(want, i * n + j));
          EXPECT_EQ(wrong, 0) << "elements that differ from the rounded float32 product";
          // float32 sums of kk terms, then one rounding to 16 bits (and
          // float16's subnormal spacing)
          EXPECT_LE(hg::test::product_worst_over_bound(c, ldc, a, lda, ta, b, ldb, tb, m, n, kk, u, 0x1p-24), 1.0)
              << "the largest error over its bound";
        }
    }
  }
  // kernels::matmul: q's block of rows @ K^T narrowed to its keys, P @ V's
  // first keys, P^T @ dO, on one thread (each product on the packed kernel)
  // and two (the products spread over the workers, each on one BLAS thread).
  // bfloat16 products this large go to the CPU's bfloat16 dot products where
  // there are some (tests/test_bf16_products.cpp): switched off here.
  const bool bf16_products = hg::blas::bf16_products();
  hg::blas::set_bf16_products(false);
  const Tensor q = seeded({2, 3, 300, 64}, dt, 31), kv = seeded({2, 3, 300, 64}, dt, 32);
  const Tensor kt = kv.transpose(-2, -1);
  const Tensor qb = q.narrow(-2, 128, 128), ktb = kt.narrow(-1, 0, 256);
  const Tensor p = seeded({2, 3, 128, 256}, dt, 33), v = kv.narrow(-2, 0, 256);
  const auto up = [](const Tensor& t) { return t.to(DType::float32); };
  for (const int threads : {1, 2}) {
    hg::set_num_threads(threads);
    if (threads == 1) {
      EXPECT_EQ(hg::blas::float32_on_tiles(128, 256, 64), hg::tile::available());
    }
    expect_rounded_float32(k::matmul(qb, ktb), k::matmul(up(qb), up(ktb)), "q K^T");
    expect_rounded_float32(k::matmul(p, v), k::matmul(up(p), up(v)), "P V");
    expect_rounded_float32(k::matmul(p.transpose(-2, -1), qb), k::matmul(up(p).transpose(-2, -1), up(qb)), "P^T dO");
    expect_rounded_float32(k::matmul(qb, v.transpose(-2, -1)), k::matmul(up(qb), up(v).transpose(-2, -1)), "dO V^T");
    // a broadcast batch: one b for every head
    expect_rounded_float32(k::matmul(p, v.narrow(0, 0, 1).narrow(1, 0, 1)),
                           k::matmul(up(p), up(v.narrow(0, 0, 1).narrow(1, 0, 1))), "broadcast b");
  }
  hg::set_num_threads(0);
  hg::blas::set_bf16_products(bf16_products);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HalfOps, ::testing::Values(DType::bfloat16, DType::float16),
                         [](const auto& info) { return std::string(hg::dtype_name(info.param)); });

// ---------------------------------------------------------------- npy

namespace {
std::filesystem::path temp_file(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("headgrad_half_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / name;
}
}  // namespace

TEST(HalfNpy, Float16RoundTripsAsF2) {
  const Tensor h = seeded({3, 4}, DType::float16, 7);
  const auto file = temp_file("h.npy");
  hg::write_npy(file, h.transpose(0, 1));
  const Tensor back = hg::read_npy(file);
  ASSERT_EQ(back.dtype(), DType::float16);
  ASSERT_EQ(back.shape(), (hg::Shape{4, 3}));
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t j = 0; j < 3; ++j) EXPECT_EQ(back.at({i, j}), h.at({j, i}));
}

TEST(HalfNpy, Bfloat16TravelsAsExactFloat32) {
  const Tensor b = seeded({2, 5}, DType::bfloat16, 8);
  const auto file = temp_file("b.npy");
  hg::write_npy(file, b);
  const Tensor as_written = hg::read_npy(file);
  EXPECT_EQ(as_written.dtype(), DType::float32);  // numpy has no bfloat16
  const Tensor back = hg::read_npy_bfloat16(file);
  ASSERT_EQ(back.dtype(), DType::bfloat16);
  for (std::int64_t i = 0; i < b.numel(); ++i) EXPECT_EQ(back.flat(i), b.flat(i));
}

TEST(HalfNpy, Bfloat16RefusesAValueItCannotHold) {
  Tensor f = seeded({2, 3}, DType::bfloat16, 9).to(DType::float32);
  f.set({1, 2}, 1.0 + 0x1p-10);  // needs 10 mantissa bits; bfloat16 has 7
  const auto file = temp_file("bad_bf16.npy");
  hg::write_npy(file, f);
  try {
    static_cast<void>(hg::read_npy_bfloat16(file));
    FAIL() << "a value outside bfloat16 was accepted";
  } catch (const hg::NpyError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("[1, 2]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1.0009765625"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not exactly representable in bfloat16"), std::string::npos) << msg;
  }
}

}  // namespace test_half
