// .npy / .npz reading and writing. Format reference:
// https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
//
//   "\x93NUMPY" major minor  header_len  header (a Python dict literal)  data
//   6 bytes     1     1      2 (v1) or 4 (v2, v3), little-endian
//
// Files come from other people's tools, so every size is checked against the
// bytes actually present before anything is allocated.
#include "headgrad/npy.hpp"

#include <zip.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace headgrad {
namespace {

static_assert(std::endian::native == std::endian::little,
              "npy.cpp copies little-endian data as is; a big-endian host needs byte swaps here");
static_assert(sizeof(bool) == 1, "'|b1' data is copied into bool storage byte for byte");

constexpr std::array<unsigned char, 6> kMagic = {0x93, 'N', 'U', 'M', 'P', 'Y'};
constexpr const char* kSupportedDtypes = "'<f2' (float16), '<f4' (float32), '<f8' (float64), '|b1' (bool)";
// Where integers are expected (token positions): int64, or floats holding integers.
constexpr const char* kSupportedIntegers = "'<i8' (int64), or '<f2', '<f4', '<f8' holding integers";

// ---------------------------------------------------------------- byte sources

// Where an .npy image is read from: a file, memory, or a zip member.
class ByteSource {
 public:
  explicit ByteSource(std::string where) : where_(std::move(where)) {}
  virtual ~ByteSource() = default;
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  // Total bytes as declared up front (file size, zip directory entry). The
  // reader still checks what it actually gets: a zip directory can lie.
  virtual std::uint64_t size() const = 0;

  // Reads until n bytes or the end; returns how many were read.
  std::size_t read(void* dst, std::size_t n) {
    auto* out = static_cast<unsigned char*>(dst);
    std::size_t got = 0;
    while (got < n) {
      std::size_t r = read_some(out + got, n - got);
      if (r == 0) break;
      got += r;
    }
    return got;
  }

  const std::string& where() const { return where_; }

 protected:
  virtual std::size_t read_some(unsigned char* dst, std::size_t n) = 0;  // 0 at the end

 private:
  std::string where_;
};

class SpanSource final : public ByteSource {
 public:
  SpanSource(std::span<const std::byte> bytes, std::string where)
      : ByteSource(std::move(where)), bytes_(bytes) {}
  std::uint64_t size() const override { return bytes_.size(); }

 protected:
  std::size_t read_some(unsigned char* dst, std::size_t n) override {
    std::size_t k = std::min(n, bytes_.size() - pos_);
    if (k > 0) std::memcpy(dst, bytes_.data() + pos_, k);
    pos_ += k;
    return k;
  }

 private:
  std::span<const std::byte> bytes_;
  std::size_t pos_ = 0;
};

}  // namespace

std::string not_regular_file(const std::filesystem::path& file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(file, ec);
  if (ec || !fs::exists(link)) return "cannot open: no such file";
  const fs::file_status st = fs::status(file, ec);  // stat, never open: a fifo would block
  if (ec || !fs::exists(st)) return "is a dangling symlink (its target does not exist)";
  if (fs::is_directory(st)) return "is a folder, not a file";
  if (!fs::is_regular_file(st)) return "is not a regular file (a fifo, device or socket)";
  return "";
}

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

class FileSource final : public ByteSource {
 public:
  explicit FileSource(const std::filesystem::path& file) : ByteSource(file.string()) {
    if (const std::string problem = not_regular_file(file); !problem.empty()) throw NpyError(where(), problem);
    std::error_code ec;
    auto n = std::filesystem::file_size(file, ec);
    if (ec) throw NpyError(where(), "cannot open: " + ec.message());
    size_ = n;
    file_.reset(std::fopen(file.c_str(), "rb"));
    if (!file_) throw NpyError(where(), std::string("cannot open: ") + std::strerror(errno));
  }
  std::uint64_t size() const override { return size_; }

 protected:
  std::size_t read_some(unsigned char* dst, std::size_t n) override {
    std::size_t r = std::fread(dst, 1, n, file_.get());
    if (r == 0 && std::ferror(file_.get()))
      throw NpyError(where(), std::string("read error: ") + std::strerror(errno));
    return r;
  }

 private:
  FilePtr file_;
  std::uint64_t size_ = 0;
};

struct ZipFileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};
using ZipFilePtr = std::unique_ptr<zip_file_t, ZipFileCloser>;

class ZipMemberSource final : public ByteSource {
 public:
  ZipMemberSource(ZipFilePtr member, std::uint64_t size, std::string where)
      : ByteSource(std::move(where)), member_(std::move(member)), size_(size) {}
  std::uint64_t size() const override { return size_; }

 protected:
  std::size_t read_some(unsigned char* dst, std::size_t n) override {
    // A bad deflate stream or CRC shows up here, as a failed read.
    // !! One call asks for at most 1 GiB: with libzip 1.7.3, one request for
    // all 4 GiB + 4 KiB of a valid deflated member came back short of its data,
    // and the member was rejected as holding more than its shape. !!
    zip_int64_t r = zip_fread(member_.get(), dst, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (r < 0)
      throw NpyError(where(), std::string("broken member: ") +
                                  zip_error_strerror(zip_file_get_error(member_.get())));
    return static_cast<std::size_t>(r);
  }

 private:
  ZipFilePtr member_;
  std::uint64_t size_;
};

// ---------------------------------------------------------------- header dict

// The header is a Python literal such as
//   {'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }
// A small parser rather than pattern matching: key order, quotes, spacing and
// trailing commas vary between writers (numpy versions, other languages).
struct PyValue {
  enum class Kind { string, integer, boolean, none, sequence };
  Kind kind = Kind::none;
  std::string text;  // a string's contents, or an integer as written (sign and digits)
  bool truth = false;
  bool is_tuple = false;
  std::vector<PyValue> items;
};

std::string printable(std::string_view s) {
  constexpr std::size_t kMax = 160;  // headers can be huge; the start is what matters
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < kMax; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > kMax) out += "...";
  return out;
}

class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& where) : text_(text), where_(where) {}

  std::vector<std::pair<std::string, PyValue>> parse_dict() {
    std::vector<std::pair<std::string, PyValue>> entries;
    skip_space();
    expect('{');
    skip_space();
    while (!at('}')) {
      if (!at('\'') && !at('"')) fail("a quoted key or '}'");
      std::string key = parse_string();
      skip_space();
      expect(':');
      skip_space();
      PyValue value = parse_value(0);
      entries.emplace_back(std::move(key), std::move(value));
      skip_space();
      if (at(',')) {
        ++pos_;
        skip_space();
      } else if (!at('}')) {
        fail("',' or '}'");
      }
    }
    ++pos_;
    skip_space();
    if (pos_ != text_.size()) fail("the end of the header after '}'");
    return entries;
  }

 private:
  static constexpr int kMaxDepth = 32;  // nested tuples only occur in structured dtypes

  [[noreturn]] void fail(const std::string& expected) const {
    throw NpyError(where_, "malformed header: expected " + expected + " at byte " +
                               std::to_string(pos_) + " of \"" + printable(text_) + "\"");
  }
  bool at(char c) const { return pos_ < text_.size() && text_[pos_] == c; }
  void expect(char c) {
    if (!at(c)) fail(std::string("'") + c + "'");
    ++pos_;
  }
  void skip_space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  bool take_word(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  std::string parse_string() {
    char quote = text_[pos_++];
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) ++pos_;  // keep the escaped char
      out += text_[pos_++];
    }
    if (pos_ >= text_.size()) fail(std::string("a closing ") + quote);
    ++pos_;
    return out;
  }

  PyValue parse_value(int depth) {
    if (depth > kMaxDepth) fail("less nesting");
    PyValue v;
    if (at('\'') || at('"')) {
      v.kind = PyValue::Kind::string;
      v.text = parse_string();
    } else if (at('(') || at('[')) {
      char close = at('(') ? ')' : ']';
      v.kind = PyValue::Kind::sequence;
      v.is_tuple = close == ')';
      ++pos_;
      skip_space();
      while (!at(close)) {
        v.items.push_back(parse_value(depth + 1));
        skip_space();
        if (at(',')) {
          ++pos_;
          skip_space();
        } else if (!at(close)) {
          fail(std::string("',' or '") + close + "'");
        }
      }
      ++pos_;
    } else if (take_word("True")) {
      v.kind = PyValue::Kind::boolean;
      v.truth = true;
    } else if (take_word("False")) {
      v.kind = PyValue::Kind::boolean;
    } else if (take_word("None")) {
      v.kind = PyValue::Kind::none;
    } else if (at('-') || (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9')) {
      v.kind = PyValue::Kind::integer;
      if (at('-')) v.text += text_[pos_++];
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') v.text += text_[pos_++];
      if (v.text == "-") fail("digits after '-'");
      if (at('L')) ++pos_;  // Python 2 longs, written by old numpy
    } else {
      fail("a value (string, integer, True, False, None or tuple)");
    }
    return v;
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  const std::string& where_;
};

// ---------------------------------------------------------------- header meaning

struct Header {
  DType dtype = DType::float64;
  bool int64 = false;  // '<i8' read as float64 (read_npy_integers only)
  std::string descr;
  Shape shape;
  std::string shape_text;  // as numpy would print it, for messages
  std::uint64_t data_bytes = 0;
};

DType dtype_from_descr(const PyValue& descr, const std::string& where, bool int64_ok) {
  const std::string supported = int64_ok ? kSupportedIntegers : kSupportedDtypes;
  if (descr.kind == PyValue::Kind::sequence)
    throw NpyError(where, "unsupported dtype: a structured (record) dtype; supported: " + supported);
  if (descr.kind != PyValue::Kind::string)
    throw NpyError(where, "malformed header: 'descr' must be a string");
  const std::string& d = descr.text;
  if (int64_ok && (d == "<f2" || d == "<f4" || d == "<f8")) return d == "<f8" ? DType::float64 : d == "<f4" ? DType::float32 : DType::float16;
  if (int64_ok)
    throw NpyError(where, "unsupported dtype '" + printable(d) + "' where integers are expected (supported: " +
                              supported + ")");
  if (d == "<f2") return DType::float16;
  if (d == "<f4") return DType::float32;
  if (d == "<f8") return DType::float64;
  // One byte has no byte order: numpy writes '|b1', other writers may not.
  if (d.size() == 3 && d.substr(1) == "b1" && (d[0] == '|' || d[0] == '<' || d[0] == '>' || d[0] == '='))
    return DType::boolean;
  if (d == ">f2" || d == ">f4" || d == ">f8")
    throw NpyError(where, "big-endian data ('" + d +
                              "') is not supported: headgrad reads little-endian arrays; save with "
                              "a.astype('<" + d.substr(1) + "')");
  throw NpyError(where, "unsupported dtype '" + printable(d) + "' (supported: " +
                            std::string(kSupportedDtypes) + ")");
}

// Parses one dimension as written; the caller reports overflow with the whole shape.
bool parse_dim(const std::string& text, std::int64_t& out) {
  std::int64_t v = 0;
  for (char c : text) {
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v)) return false;
  }
  out = v;
  return true;
}

Header interpret_header(std::string_view text, const std::string& where, bool int64_ok) {
  auto entries = HeaderParser(text, where).parse_dict();
  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape = nullptr;
  for (const auto& [key, value] : entries) {
    const PyValue** slot = key == "descr"           ? &descr
                           : key == "fortran_order" ? &fortran
                           : key == "shape"         ? &shape
                                                    : nullptr;
    if (!slot)
      throw NpyError(where, "malformed header: unexpected key '" + printable(key) +
                                "' (a .npy header has exactly 'descr', 'fortran_order' and 'shape')");
    if (*slot) throw NpyError(where, "malformed header: key '" + key + "' appears twice");
    *slot = &value;
  }
  for (auto [name, value] : {std::pair{"descr", descr}, {"fortran_order", fortran}, {"shape", shape}})
    if (!value) throw NpyError(where, std::string("malformed header: missing key '") + name + "'");

  Header h;
  if (int64_ok && descr->kind == PyValue::Kind::string && descr->text == "<i8") {
    h.int64 = true;  // 8 bytes like float64: converted in place once read
    h.dtype = DType::float64;
  } else {
    h.dtype = dtype_from_descr(*descr, where, int64_ok);
  }
  h.descr = descr->text;

  if (fortran->kind != PyValue::Kind::boolean)
    throw NpyError(where, "malformed header: 'fortran_order' must be True or False");
  if (fortran->truth)
    throw NpyError(where, "fortran_order is True: headgrad reads C-order arrays; save with "
                          "np.ascontiguousarray");

  if (shape->kind != PyValue::Kind::sequence)
    throw NpyError(where, "malformed header: 'shape' must be a tuple of integers");
  h.shape_text = "(";
  for (std::size_t i = 0; i < shape->items.size(); ++i) {
    if (shape->items[i].kind != PyValue::Kind::integer)
      throw NpyError(where, "malformed header: 'shape' must be a tuple of integers");
    h.shape_text += (i ? ", " : "") + shape->items[i].text;
  }
  h.shape_text += shape->items.size() == 1 ? ",)" : ")";

  // Element and byte counts are computed with overflow checks: a hostile shape
  // must fail here, not wrap around into a small allocation.
  // Zero dims count as 1 here: strides are products of the other dims, so
  // (0, 2**62, 4) holds no data yet still cannot be indexed in int64.
  bool overflow = false;
  for (const auto& item : shape->items) {
    if (item.text[0] == '-')
      throw NpyError(where, "malformed header: negative dimension in shape " + h.shape_text);
    std::int64_t dim = 0;
    overflow = overflow || !parse_dim(item.text, dim);
    h.shape.push_back(dim);
  }
  std::int64_t extent = static_cast<std::int64_t>(dtype_size(h.dtype));
  for (std::int64_t dim : h.shape)
    overflow = overflow || __builtin_mul_overflow(extent, std::max<std::int64_t>(dim, 1), &extent);
  if (overflow) throw NpyError(where, "shape " + h.shape_text + " overflows int64: too many elements");
  h.data_bytes = static_cast<std::uint64_t>(shape_numel(h.shape)) * dtype_size(h.dtype);
  return h;
}

// ---------------------------------------------------------------- reading

std::uint32_t read_le(const unsigned char* p, int n) {
  std::uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The preamble and header, checked against the bytes the source holds; the
// data is not read.
Header read_header_from(ByteSource& src, bool int64_ok) {
  const std::string& where = src.where();
  const std::uint64_t total = src.size();

  std::array<unsigned char, 12> pre{};
  std::size_t got = src.read(pre.data(), 8);
  if (got < kMagic.size() || std::memcmp(pre.data(), kMagic.data(), kMagic.size()) != 0)
    throw NpyError(where, "not a .npy file (bad magic: it does not start with \"\\x93NUMPY\")");
  if (got < 8) throw NpyError(where, "truncated preamble: the file ends before the format version");
  const int major = pre[6], minor = pre[7];
  if (!((major == 1 || major == 2 || major == 3) && minor == 0))
    throw NpyError(where, "unsupported .npy format version " + std::to_string(major) + "." +
                              std::to_string(minor) + " (headgrad reads 1.0, 2.0 and 3.0)");
  const int len_bytes = major == 1 ? 2 : 4;
  if (src.read(pre.data() + 8, len_bytes) < static_cast<std::size_t>(len_bytes))
    throw NpyError(where, "truncated preamble: the file ends inside the header length");
  const std::uint64_t preamble = 8 + len_bytes;
  const std::uint64_t after_preamble = total > preamble ? total - preamble : 0;
  const std::uint64_t header_len = read_le(pre.data() + 8, len_bytes);
  if (header_len > after_preamble)
    throw NpyError(where, "truncated header: header length is " + std::to_string(header_len) +
                              " bytes, file has " + std::to_string(after_preamble) +
                              " after the preamble");

  // Version 3.0 only changes the header's encoding (utf-8 instead of latin-1),
  // which does not matter to the ASCII keys and values read here.
  std::string text(header_len, '\0');
  if (src.read(text.data(), text.size()) < text.size())
    throw NpyError(where, "truncated header: the data ends inside the header");
  Header h = interpret_header(text, where, int64_ok);

  const std::uint64_t available = after_preamble - header_len;
  if (available < h.data_bytes)
    throw NpyError(where, "truncated data: expected " + std::to_string(h.data_bytes) +
                              " bytes for shape " + h.shape_text + " of '" + h.descr + "', file has " +
                              std::to_string(available));
  if (available > h.data_bytes)
    throw NpyError(where, "shape does not match the data size: shape " + h.shape_text + " of '" +
                              h.descr + "' is " + std::to_string(h.data_bytes) + " bytes, file has " +
                              std::to_string(available) + " after the header");
  return h;
}

// The data after read_header_from, at most max_bytes of it (checked before
// anything is allocated).
Tensor read_data_from(ByteSource& src, const Header& h, std::uint64_t max_bytes) {
  const std::string& where = src.where();
  if (h.data_bytes > max_bytes)
    throw NpyError(where, "shape " + h.shape_text + " of '" + h.descr + "' is " + std::to_string(h.data_bytes) +
                              " bytes of data, more than the " + std::to_string(max_bytes) + " it may hold here");
  Tensor t = Tensor::empty(h.shape, h.dtype);
  auto* bytes = static_cast<unsigned char*>(t.storage()->mutable_data());
  const std::size_t n = static_cast<std::size_t>(h.data_bytes);
  const std::size_t read = src.read(bytes, n);
  if (read < n)
    throw NpyError(where, "truncated data: expected " + std::to_string(n) + " bytes for shape " +
                              h.shape_text + ", got " + std::to_string(read));
  unsigned char extra = 0;
  if (src.read(&extra, 1) != 0)  // a zip member can hold more than its directory entry says
    throw NpyError(where, "shape does not match the data size: more than " + std::to_string(n) +
                              " bytes follow the header");
  // bool storage must hold exactly 0 or 1; other writers may store any nonzero byte.
  if (h.dtype == DType::boolean)
    for (std::size_t i = 0; i < n; ++i) bytes[i] = bytes[i] != 0;
  if (h.int64) {
    constexpr std::int64_t kExact = std::int64_t{1} << 53;  // float64 holds every integer up to here
    auto* values = reinterpret_cast<double*>(bytes);
    for (std::size_t i = 0; i < n / 8; ++i) {
      std::int64_t v = 0;
      std::memcpy(&v, bytes + 8 * i, 8);
      if (v > kExact || v < -kExact)
        throw NpyError(where, "integer " + std::to_string(v) + " at flat index " + std::to_string(i) +
                                  " is beyond 2^53, which float64 cannot hold exactly");
      values[i] = static_cast<double>(v);
    }
  }
  return t;
}

Tensor read_npy_from(ByteSource& src, bool int64_ok = false,
                     std::uint64_t max_bytes = std::numeric_limits<std::uint64_t>::max()) {
  const Header h = read_header_from(src, int64_ok);
  return read_data_from(src, h, max_bytes);
}

// ---------------------------------------------------------------- writing

std::string descr_of(DType dtype) {
  switch (dtype) {
    case DType::float32: return "<f4";
    case DType::float64: return "<f8";
    case DType::boolean: return "|b1";
    case DType::float16: return "<f2";
    case DType::bfloat16: break;  // written as float32 by write_npy
  }
  throw std::logic_error("descr_of: unknown dtype");
}

std::string shape_tuple(const Shape& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

void write_all(std::FILE* f, const void* data, std::size_t n, const std::string& where) {
  if (n > 0 && std::fwrite(data, 1, n, f) != n)
    throw NpyError(where, std::string("write failed: ") + std::strerror(errno));
}

// ---------------------------------------------------------------- npz

struct ZipDiscarder {
  void operator()(zip_t* z) const { zip_discard(z); }  // read-only: nothing to write back
};
using ZipPtr = std::unique_ptr<zip_t, ZipDiscarder>;

ZipPtr open_npz(const std::filesystem::path& file) {
  const std::string where = file.string();
  int code = 0;
  zip_t* z = zip_open(file.c_str(), ZIP_RDONLY, &code);
  if (z) return ZipPtr(z);
  if (code == ZIP_ER_NOZIP)
    throw NpyError(where, "not a zip file (an .npz is a zip archive of .npy files)");
  zip_error_t error;
  zip_error_init_with_code(&error, code);
  std::string reason = zip_error_strerror(&error);
  zip_error_fini(&error);
  throw NpyError(where, "cannot open as a zip archive: " + reason);
}

std::string member_where(const std::filesystem::path& file, const std::string& member) {
  return file.string() + " (member '" + member + "')";
}

std::string array_name(std::string_view member) {
  return std::string(member.substr(0, member.size() - 4));  // drop ".npy"
}

bool is_array_member(std::string_view member) {
  return member.size() > 4 && member.substr(member.size() - 4) == ".npy";
}

// Deflate's best case: 258 bytes of output from about 2 bits of input.
constexpr std::uint64_t kDeflateMaxRatio = 1032;

// !! The zip directory's sizes are claims: a 126-byte file can declare a
// 4 GB member. Before anything is allocated from them, they are bounded by
// what the archive can hold: its compressed bytes must fit in the file, and
// the uncompressed size in what those bytes can expand to (bzip2, xz and zstd
// have no useful bound: their declared size stands, and the reader never
// takes more than it, nor more than the caller's max_bytes). Sizes are 64-bit
// (libzip reads zip64 entries), so a real member over 4 GiB is read. !!
std::unique_ptr<ZipMemberSource> open_member(zip_t* z, zip_uint64_t index, const std::string& where,
                                             std::uint64_t archive_bytes) {
  zip_stat_t st;
  zip_stat_init(&st);
  const zip_uint64_t needed = ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD;
  if (zip_stat_index(z, index, 0, &st) != 0 || (st.valid & needed) != needed)
    throw NpyError(where, std::string("broken member: ") + zip_strerror(z));
  if (st.comp_size > archive_bytes)
    throw NpyError(where, "broken member: its directory entry declares " + std::to_string(st.comp_size) +
                              " compressed bytes, but the archive has only " + std::to_string(archive_bytes));
  const bool stored = st.comp_method == ZIP_CM_STORE;
  const bool deflated = st.comp_method == ZIP_CM_DEFLATE || st.comp_method == ZIP_CM_DEFLATE64;
  const std::uint64_t most = stored     ? st.comp_size
                             : deflated ? st.comp_size * kDeflateMaxRatio + 1024
                                        : std::numeric_limits<std::uint64_t>::max();
  if (st.size > most)
    throw NpyError(where, "broken member: its directory entry declares " + std::to_string(st.size) +
                              " bytes, more than its " + std::to_string(st.comp_size) + " " +
                              (stored ? "stored" : "deflated") + " bytes can hold (" + std::to_string(most) + ")");
  ZipFilePtr member(zip_fopen_index(z, index, 0));
  if (!member) throw NpyError(where, std::string("broken member: ") + zip_strerror(z));
  return std::make_unique<ZipMemberSource>(std::move(member), st.size, where);
}

std::uint64_t archive_size(const std::filesystem::path& file) {
  std::error_code ec;
  const std::uintmax_t n = std::filesystem::file_size(file, ec);  // zip_open already read it
  if (ec) throw NpyError(file.string(), "cannot open: " + ec.message());
  return n;
}

}  // namespace

// ---------------------------------------------------------------- public API

Tensor read_npy(const std::filesystem::path& file) {
  FileSource src(file);
  return read_npy_from(src);
}

Tensor read_npy_integers(const std::filesystem::path& file) {
  FileSource src(file);
  return read_npy_from(src, true);
}

Tensor parse_npy(std::span<const std::byte> bytes, const std::string& what) {
  SpanSource src(bytes, what);
  return read_npy_from(src);
}

void write_npy(const std::filesystem::path& file, const Tensor& t) {
  const std::string where = file.string();
  if (!t.defined()) throw NpyError(where, "cannot write an undefined tensor");
  // logical row-major order, whatever t's strides; bfloat16 as its exact float32 values
  const Tensor c = t.dtype() == DType::bfloat16 ? t.to(DType::float32) : t.contiguous();

  std::string header = "{'descr': '" + descr_of(c.dtype()) +
                       "', 'fortran_order': False, 'shape': " + shape_tuple(c.shape()) + ", }";
  // numpy pads with spaces and a final '\n' so the data starts 64-byte aligned
  // (it memory-maps files); version 2.0 only when the header outgrows 16 bits.
  auto padded_len = [&](std::size_t preamble) {
    std::size_t unpadded = preamble + header.size() + 1;
    return (unpadded + 63) / 64 * 64 - preamble;
  };
  const bool v1 = padded_len(10) <= 0xffff;
  const std::size_t preamble = v1 ? 10 : 12;
  const std::size_t header_len = padded_len(preamble);
  if (header_len > 0xffffffffu) throw NpyError(where, "header too large for .npy format 2.0");
  header.resize(header_len - 1, ' ');
  header += '\n';

  std::array<unsigned char, 12> pre{};
  std::memcpy(pre.data(), kMagic.data(), kMagic.size());
  pre[6] = v1 ? 1 : 2;
  pre[7] = 0;
  for (std::size_t i = 0; i < preamble - 8; ++i)
    pre[8 + i] = static_cast<unsigned char>((header_len >> (8 * i)) & 0xff);

  FilePtr f(std::fopen(file.c_str(), "wb"));
  if (!f) throw NpyError(where, std::string("cannot open for writing: ") + std::strerror(errno));
  try {
    write_all(f.get(), pre.data(), preamble, where);
    write_all(f.get(), header.data(), header.size(), where);
    const auto* data = static_cast<const std::byte*>(c.storage()->data()) +
                       c.offset() * static_cast<std::int64_t>(dtype_size(c.dtype()));
    write_all(f.get(), data, static_cast<std::size_t>(c.numel()) * dtype_size(c.dtype()), where);
    if (std::fclose(f.release()) != 0)
      throw NpyError(where, std::string("write failed: ") + std::strerror(errno));
  } catch (...) {
    f.reset();
    std::error_code ignored;
    std::filesystem::remove(file, ignored);  // a half-written file would later read as "truncated"
    throw;
  }
}

Tensor exact_bfloat16(const Tensor& t, const std::string& where) {
  if (t.dtype() == DType::bfloat16) return t;
  if (t.dtype() != DType::float32 && t.dtype() != DType::float64)
    throw NpyError(where, "bfloat16 data must arrive as float32 values, got " + std::string(dtype_name(t.dtype())));
  const Tensor b = t.to(DType::bfloat16);
  const std::vector<double> want = t.to_vector(), got = b.to_vector();
  for (std::size_t i = 0; i < want.size(); ++i) {
    // NaN is representable (any NaN stays a NaN); everything else must come back equal.
    if (got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))) continue;
    std::ostringstream v;
    v.precision(17);
    v << want[i];
    throw NpyError(where, "value " + v.str() + " at " +
                              shape_str(unravel_index(static_cast<std::int64_t>(i), t.shape())) +
                              " is not exactly representable in bfloat16 (nearest: " +
                              std::to_string(got[i]) + "); a bfloat16 reference stores bfloat16 values as float32");
  }
  return b;
}

Tensor read_npy_bfloat16(const std::filesystem::path& file) { return exact_bfloat16(read_npy(file), file.string()); }

struct NpzArchive::Impl {
  std::filesystem::path file;
  ZipPtr zip;
  std::uint64_t bytes = 0;
  std::vector<std::string> names;
  std::map<std::string, zip_uint64_t> index;  // array name -> zip entry
};

NpzArchive::NpzArchive(const std::filesystem::path& file) : impl_(std::make_unique<Impl>()) {
  if (const std::string problem = not_regular_file(file); !problem.empty()) throw NpyError(file.string(), problem);
  impl_->file = file;
  impl_->zip = open_npz(file);
  impl_->bytes = archive_size(file);
  zip_t* z = impl_->zip.get();
  const zip_int64_t n = zip_get_num_entries(z, 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* name = zip_get_name(z, static_cast<zip_uint64_t>(i), 0);
    if (!name) throw NpyError(file.string(), std::string("broken archive: ") + zip_strerror(z));
    if (!is_array_member(name)) continue;
    // two entries of one name: which one numpy would load depends on the reader
    if (!impl_->index.emplace(array_name(name), static_cast<zip_uint64_t>(i)).second)
      throw NpyError(member_where(file, name), "the archive holds two members of this name; keep one");
    impl_->names.push_back(array_name(name));
  }
}

NpzArchive::~NpzArchive() = default;

const std::vector<std::string>& NpzArchive::names() const { return impl_->names; }

bool NpzArchive::has(const std::string& name) const { return impl_->index.count(name) > 0; }

zip_uint64_t NpzArchive::locate(const std::string& name, std::string& where) const {
  const std::string stem = is_array_member(name) ? array_name(name) : name;
  const auto it = impl_->index.find(stem);
  if (it == impl_->index.end()) {
    std::string present;
    for (const auto& m : impl_->names) present += (present.empty() ? "" : ", ") + m;
    throw NpyError(impl_->file.string(),
                   "no member '" + name + "' (members: " + (present.empty() ? "none" : present) + ")");
  }
  where = member_where(impl_->file, stem + ".npy");
  return it->second;
}

NpyHeader NpzArchive::header(const std::string& name, bool integers) {
  std::string where;
  const zip_uint64_t i = locate(name, where);
  const auto src = open_member(impl_->zip.get(), i, where, impl_->bytes);
  const Header h = read_header_from(*src, integers);
  return {h.dtype, h.int64, h.shape, h.data_bytes};
}

Tensor NpzArchive::read(const std::string& name, const NpyLimits& limits) {
  std::string where;
  const zip_uint64_t i = locate(name, where);
  const auto src = open_member(impl_->zip.get(), i, where, impl_->bytes);
  return read_npy_from(*src, limits.integers, limits.max_bytes);
}

std::map<std::string, Tensor> read_npz(const std::filesystem::path& file) {
  NpzArchive archive(file);
  std::map<std::string, Tensor> out;
  for (const auto& name : archive.names()) out[name] = archive.read(name);
  return out;
}

Tensor read_npz_member(const std::filesystem::path& file, const std::string& name) {
  return NpzArchive(file).read(name);
}

NpyHeader read_npy_header(const std::filesystem::path& file, bool integers) {
  FileSource src(file);
  const Header h = read_header_from(src, integers);
  return {h.dtype, h.int64, h.shape, h.data_bytes};
}

Tensor read_npy(const std::filesystem::path& file, const NpyLimits& limits) {
  FileSource src(file);
  return read_npy_from(src, limits.integers, limits.max_bytes);
}

}  // namespace headgrad
