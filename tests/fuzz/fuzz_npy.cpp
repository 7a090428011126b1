// libFuzzer target: the .npy reader (parse_npy, the code read_npy and the
// .npz reader share) on arbitrary bytes. Any input may be rejected, but only
// with NpyError; anything else (a crash, a sanitizer report, another
// exception, an allocation past -malloc_limit_mb) is a finding.
// Run longer: see README, "Sanitizers and fuzzing".
#include <cstddef>
#include <cstdint>
#include <span>

#include "headgrad/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const headgrad::Tensor t = headgrad::parse_npy(bytes, "fuzz.npy");
    // A tensor that was accepted must be whole: touch every element.
    volatile double sink = 0;
    for (double v : t.to_vector()) sink = sink + v;
  } catch (const headgrad::NpyError&) {
  }
  return 0;
}
