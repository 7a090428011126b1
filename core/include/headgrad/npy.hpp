// NumPy .npy and .npz files: the format reference tensors arrive in.
//
//   Tensor x = read_npy("refs/case1/x.npy");          // float64 [B, T, D]
//   write_npy("out.npy", y.transpose(0, 1));           // written in logical row-major order
//   auto arrays = read_npz("weights.npz");             // {"wq": ..., "wk": ...}, every member read
//   NpzArchive ref("ref.npz"); ref.read("wq");         // one member inflated, the others never
//   Tensor wq = read_npz_member("weights.npz", "wq");  // or "wq.npy"
//
// Supported: format versions 1.0, 2.0 and 3.0; C order; dtypes '<f2' (float16),
// '<f4' (float32), '<f8' (float64) and '|b1' (bool). bfloat16, which .npy
// cannot name, travels as float32 values that are all exactly bfloat16:
// write_npy writes a bfloat16 tensor so, read_npy_bfloat16 reads one back. Everything else (Fortran order, big-endian,
// other dtypes, sizes that disagree with the shape) is rejected, never guessed at.
// Every failure, reading or writing, throws NpyError whose message starts with
// the file (and, inside an .npz, the member).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "headgrad/tensor.hpp"

namespace headgrad {

class NpyError : public std::invalid_argument {
 public:
  // what() is "<where>: <problem>".
  NpyError(const std::string& where, const std::string& problem)
      : std::invalid_argument(where + ": " + problem) {}
};

Tensor read_npy(const std::filesystem::path& file);
// Like read_npy, and also reads int64 ('<i8', e.g. token positions) as float64
// values; an integer beyond 2^53 (not exact in float64) is an NpyError.
Tensor read_npy_integers(const std::filesystem::path& file);

// Version 1.0 unless the header needs more than 65535 bytes, then 2.0.
void write_npy(const std::filesystem::path& file, const Tensor& t);

// read_npy, then exact_bfloat16.
Tensor read_npy_bfloat16(const std::filesystem::path& file);
// t (float32 or float64) as bfloat16 when every value is exactly representable;
// otherwise an NpyError naming `where`, the first such value and its index.
Tensor exact_bfloat16(const Tensor& t, const std::string& where);

// A whole .npy image already in memory; `what` names it in errors.
Tensor parse_npy(std::span<const std::byte> bytes, const std::string& what);

// What a .npy header declares, read before any of the data.
struct NpyHeader {
  DType dtype = DType::float64;  // int64 data reads as float64
  bool integers = false;         // the data is int64 ('<i8')
  Shape shape;
  std::uint64_t data_bytes = 0;
};

// A bounded read: int64 allowed where integers are expected (read as float64,
// as read_npy_integers), and at most max_bytes of data, refused before
// anything is allocated.
struct NpyLimits {
  bool integers = false;
  std::uint64_t max_bytes = std::numeric_limits<std::uint64_t>::max();
};
Tensor read_npy(const std::filesystem::path& file, const NpyLimits& limits);
NpyHeader read_npy_header(const std::filesystem::path& file, bool integers = false);

// Empty when `file` is a regular file (or a symlink to one); else why not:
// "cannot open: no such file", "is a dangling symlink ...", "is a folder ...",
// "is not a regular file (a fifo, device or socket)". Nothing is opened, so a
// fifo never blocks. Every reader here refuses what is not a regular file.
std::string not_regular_file(const std::filesystem::path& file);

// An .npz archive whose members are read one at a time, only when asked for:
// opening reads the zip directory alone. Two members of one name are refused
// (NpyError naming the member).
class NpzArchive {
 public:
  explicit NpzArchive(const std::filesystem::path& file);
  ~NpzArchive();
  NpzArchive(const NpzArchive&) = delete;
  NpzArchive& operator=(const NpzArchive&) = delete;

  const std::vector<std::string>& names() const;  // array members without ".npy", in archive order
  bool has(const std::string& name) const;
  // `name` with or without ".npy"; a missing member's error lists those present.
  NpyHeader header(const std::string& name, bool integers = false);  // inflates the header alone
  Tensor read(const std::string& name, const NpyLimits& limits = {});

 private:
  struct Impl;
  std::uint64_t locate(const std::string& name, std::string& where) const;
  std::unique_ptr<Impl> impl_;
};

// Keys are member names without ".npy"; members not ending in ".npy" are not
// arrays (numpy would hand them back as raw bytes) and are skipped.
std::map<std::string, Tensor> read_npz(const std::filesystem::path& file);

// `name` with or without ".npy". A missing member's error lists those present.
Tensor read_npz_member(const std::filesystem::path& file, const std::string& name);

}  // namespace headgrad
