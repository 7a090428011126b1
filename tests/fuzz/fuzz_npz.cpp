// libFuzzer target: the .npz reader (read_npz, read_npz_member and NpzArchive:
// libzip's directory, then each member through the .npy reader) on arbitrary bytes.
// read_npz takes a path, so each input is written to an in-memory file
// (memfd) and opened through /proc/self/fd. Rejections must be NpyError;
// anything else is a finding. Run longer: see README, "Sanitizers and fuzzing".
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "headgrad/npy.hpp"

namespace {

// One in-memory file for the whole run, rewritten for each input.
struct MemFile {
  int fd;
  std::filesystem::path path;  // /proc/self/fd/<fd>
};

const MemFile& archive() {
  static const MemFile file = [] {
    const int fd = ::memfd_create("fuzz.npz", 0);
    if (fd < 0) {
      std::perror("fuzz_npz: memfd_create");
      std::abort();  // no input can be tried: stop the fuzzer loudly
    }
    return MemFile{fd, std::filesystem::path("/proc/self/fd") / std::to_string(fd)};
  }();
  return file;
}

void write_archive(const std::uint8_t* data, std::size_t size) {
  const int fd = archive().fd;
  if (::ftruncate(fd, 0) != 0) std::abort();
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  write_archive(data, size);
  try {
    headgrad::read_npz(archive().path);
  } catch (const headgrad::NpyError&) {
  }
  try {  // one named member: the lookup, and the error that lists the members present
    headgrad::read_npz_member(archive().path, "x");
  } catch (const headgrad::NpyError&) {
  }
  try {  // as a reference is read: headers first, then bounded reads, int64 allowed
    headgrad::NpzArchive npz(archive().path);
    for (const auto& name : npz.names()) {
      try {
        const headgrad::NpyHeader h = npz.header(name, true);
        npz.read(name, {.integers = true, .max_bytes = h.data_bytes});
      } catch (const headgrad::NpyError&) {
      }
    }
  } catch (const headgrad::NpyError&) {
  }
  return 0;
}
