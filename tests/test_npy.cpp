// .npy / .npz I/O: round trips, files written by numpy (fixtures made by
// tests/data/npz/make_fixtures.py), hand-built files for each format version,
// and one case per way a file can be wrong, each error naming the file.
#include "headgrad/npy.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace test_npy {  // this file's names: test files share unity builds (tests/meson.build)

namespace hg = headgrad;
namespace fs = std::filesystem;

namespace {

const fs::path kData = HEADGRAD_TEST_DATA_DIR;

fs::path scratch_root() {
  return fs::path(::testing::TempDir()) / ("headgrad_npy_" + std::to_string(::getpid()));
}

// Removes this run's scratch files once every test has finished.
class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(scratch_root(), ignored);
  }
};
[[maybe_unused]] auto* const kScratchCleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

// A fresh folder per test, so that tests may run in parallel.
fs::path test_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "_" + info->name();
  for (char& c : name)
    if (c == '/') c = '_';
  fs::path dir = scratch_root() / name;
  fs::create_directories(dir);
  return dir;
}

void write_bytes(const fs::path& file, const std::string& bytes) {
  std::ofstream out(file, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << file;
}

std::string read_bytes(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// An .npy image: magic, version, little-endian header length, header, data.
std::string npy_image(int major, const std::string& header, const std::string& data) {
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const std::size_t len = header.size();
  const int len_bytes = major == 1 ? 2 : 4;
  for (int i = 0; i < len_bytes; ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string f8_bytes(const std::vector<double>& values) {
  return {reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double)};
}

std::string f8_header(const std::string& shape) {
  return "{'descr': '<f8', 'fortran_order': False, 'shape': " + shape + ", }\n";
}

std::vector<double> iota(std::size_t n, double scale = 1.0) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<double>(i) * scale;
  return v;
}

// Runs f, expects an NpyError whose message holds every phrase; returns the message.
template <class F>
std::string expect_npy_error(F&& f, const std::vector<std::string>& phrases) {
  try {
    f();
  } catch (const hg::NpyError& e) {
    std::string msg = e.what();
    for (const auto& p : phrases) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no NpyError thrown";
  return {};
}

hg::Tensor round_trip(const hg::Tensor& t) {
  fs::path file = test_dir() / "t.npy";
  hg::write_npy(file, t);
  return hg::read_npy(file);
}

void expect_same(const hg::Tensor& got, const hg::Tensor& want) {
  EXPECT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.shape(), want.shape());
  EXPECT_TRUE(got.is_contiguous());
  EXPECT_EQ(got.to_vector(), want.to_vector());
}

// ---------------------------------------------------------------- round trips

TEST(NpyRoundTrip, Float64) {
  hg::Generator gen(7);
  hg::Tensor x = hg::randn({2, 3, 4}, hg::DType::float64, gen);
  expect_same(round_trip(x), x);
}

TEST(NpyRoundTrip, Float32) {
  hg::Generator gen(8);
  hg::Tensor x = hg::randn({5, 3}, hg::DType::float32, gen);
  expect_same(round_trip(x), x);
}

TEST(NpyRoundTrip, Bool) {
  std::vector<double> v = {1, 0, 0, 1, 1, 1};
  hg::Tensor m = hg::Tensor::from_values(v, {3, 2}, hg::DType::boolean);
  expect_same(round_trip(m), m);
}

TEST(NpyRoundTrip, TransposedIsWrittenInLogicalOrder) {
  std::vector<double> v = iota(24);
  hg::Tensor xt = hg::Tensor::from_values(v, {2, 3, 4}, hg::DType::float64).transpose(0, 2);
  ASSERT_FALSE(xt.is_contiguous());
  hg::Tensor back = round_trip(xt);
  EXPECT_EQ(back.shape(), (hg::Shape{4, 3, 2}));
  expect_same(back, xt);
}

TEST(NpyRoundTrip, ViewsWithAnOffset) {
  std::vector<double> v = iota(24);
  hg::Tensor x = hg::Tensor::from_values(v, {2, 3, 4}, hg::DType::float32);
  hg::Tensor row = x.narrow(0, 1, 1);  // contiguous, offset 12
  ASSERT_TRUE(row.is_contiguous());
  expect_same(round_trip(row), row);
  hg::Tensor middle = x.narrow(1, 1, 2);  // strided, offset 4
  expect_same(round_trip(middle), middle);
}

TEST(NpyRoundTrip, ScalarHasEmptyShape) {
  hg::Tensor s = hg::Tensor::scalar(-3.25, hg::DType::float64);
  fs::path file = test_dir() / "s.npy";
  hg::write_npy(file, s);
  EXPECT_NE(read_bytes(file).find("'shape': ()"), std::string::npos);
  hg::Tensor back = hg::read_npy(file);
  EXPECT_EQ(back.dim(), 0);
  EXPECT_EQ(back.item(), -3.25);
}

TEST(NpyRoundTrip, ZeroSizedDims) {
  for (const hg::Shape& shape : {hg::Shape{0, 3}, hg::Shape{2, 0}, hg::Shape{0}}) {
    hg::Tensor e = hg::Tensor::zeros(shape, hg::DType::float32);
    hg::Tensor back = round_trip(e);
    EXPECT_EQ(back.shape(), shape);
    EXPECT_EQ(back.numel(), 0);
  }
}

TEST(NpyWrite, Version1HeaderAsNumpyWritesIt) {
  fs::path file = test_dir() / "x.npy";
  hg::write_npy(file, hg::Tensor::zeros({2, 3}, hg::DType::float64));
  std::string bytes = read_bytes(file);
  ASSERT_EQ(bytes.size(), 128u + 48u);  // data starts 64-byte aligned
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8), 118);
  std::string header = bytes.substr(10, 118);
  EXPECT_EQ(header.substr(0, header.find_last_not_of(" \n") + 1),
            "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }");
  EXPECT_EQ(header.back(), '\n');
}

// Reading a numpy file and writing it back gives numpy's bytes exactly.
TEST(NpyWrite, ByteIdenticalToNumpy) {
  for (const char* name : {"numpy_f8.npy", "numpy_f4.npy", "numpy_bool.npy", "numpy_scalar.npy"}) {
    fs::path original = kData / "npy" / name;
    fs::path copy = test_dir() / name;
    hg::write_npy(copy, hg::read_npy(original));
    EXPECT_EQ(read_bytes(copy), read_bytes(original)) << name;
  }
}

TEST(NpyWrite, Version2WhenTheHeaderOutgrows16Bits) {
  // 25000 dims of size 1: the shape tuple alone needs about 75000 header bytes.
  hg::Tensor t = hg::Tensor::full(hg::Shape(25000, 1), 4.5, hg::DType::float64);
  fs::path file = test_dir() / "wide.npy";
  hg::write_npy(file, t);
  std::string bytes = read_bytes(file);
  EXPECT_EQ(bytes[6], 2);
  EXPECT_EQ((bytes.size() - 8) % 64, 0u);
  hg::Tensor back = hg::read_npy(file);
  EXPECT_EQ(back.dim(), 25000);
  EXPECT_EQ(back.item(), 4.5);
}

TEST(NpyWrite, ErrorsNameTheFile) {
  fs::path missing_dir = test_dir() / "no_such_dir" / "x.npy";
  expect_npy_error([&] { hg::write_npy(missing_dir, hg::Tensor::zeros({1}, hg::DType::float64)); },
                   {missing_dir.string(), "cannot open for writing"});
  fs::path file = test_dir() / "undefined.npy";
  expect_npy_error([&] { hg::write_npy(file, hg::Tensor()); }, {file.string(), "undefined"});
}

// ---------------------------------------------------------------- files from numpy

TEST(NpyNumpyFixtures, Float64) {
  hg::Tensor t = hg::read_npy(kData / "npy" / "numpy_f8.npy");
  EXPECT_EQ(t.dtype(), hg::DType::float64);
  EXPECT_EQ(t.shape(), (hg::Shape{2, 3, 4}));
  std::vector<double> want(24);
  for (int i = 0; i < 24; ++i) want[i] = i / 7.0;  // np.arange / 7 rounds the same way
  EXPECT_EQ(t.to_vector(), want);
}

TEST(NpyNumpyFixtures, Float32BoolAndScalar) {
  hg::Tensor f = hg::read_npy(kData / "npy" / "numpy_f4.npy");
  EXPECT_EQ(f.dtype(), hg::DType::float32);
  EXPECT_EQ(f.shape(), (hg::Shape{3, 2}));
  EXPECT_EQ(f.to_vector(), (std::vector<double>{-2.5, -1.5, -0.5, 0.5, 1.5, 2.5}));

  hg::Tensor m = hg::read_npy(kData / "npy" / "numpy_bool.npy");
  EXPECT_EQ(m.dtype(), hg::DType::boolean);
  EXPECT_EQ(m.to_vector(), (std::vector<double>{1, 0, 1, 0, 0, 1}));

  hg::Tensor s = hg::read_npy(kData / "npy" / "numpy_scalar.npy");
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item(), 2.5);
}

TEST(NpyNumpyFixtures, RejectedLayoutsAndDtypes) {
  fs::path fortran = kData / "npy" / "numpy_f4_fortran.npy";
  expect_npy_error([&] { hg::read_npy(fortran); },
                   {fortran.string(), "fortran_order is True", "np.ascontiguousarray"});
  fs::path big = kData / "npy" / "numpy_f8_bigendian.npy";
  expect_npy_error([&] { hg::read_npy(big); }, {big.string(), "big-endian", "'>f8'"});
  fs::path i4 = kData / "npy" / "numpy_i4.npy";
  expect_npy_error([&] { hg::read_npy(i4); }, {i4.string(), "unsupported dtype '<i4'", "'<f8'"});
}

// ---------------------------------------------------------------- hand-built files

struct VersionCase {
  std::string name;
  int major;
  std::string header;
};

class NpyVersions : public ::testing::TestWithParam<VersionCase> {};

TEST_P(NpyVersions, ReadsHandBuiltFile) {
  const VersionCase& c = GetParam();
  fs::path file = test_dir() / (c.name + ".npy");
  write_bytes(file, npy_image(c.major, c.header, f8_bytes(iota(6, 0.5))));
  hg::Tensor t = hg::read_npy(file);
  EXPECT_EQ(t.shape(), (hg::Shape{2, 3}));
  EXPECT_EQ(t.to_vector(), iota(6, 0.5));
}

// Header spellings that numpy or other writers produce: any key order, double
// quotes, no trailing comma, odd spacing, Python 2 longs, no padding.
INSTANTIATE_TEST_SUITE_P(
    HeaderStyles, NpyVersions,
    ::testing::Values(
        VersionCase{"v1", 1, f8_header("(2, 3)")},
        VersionCase{"v2", 2, f8_header("(2, 3)")},
        VersionCase{"v3_utf8", 3, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }    \n"},
        VersionCase{"key_order", 1, "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f8'}\n"},
        VersionCase{"double_quotes", 1, "{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (2,3)}"},
        VersionCase{"whitespace", 2, "  {  'descr' :'<f8' ,\n 'fortran_order':False,'shape':( 2 , 3 , ) , }\t\n"},
        VersionCase{"python2_longs", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2L, 3L), }\n"}),
    [](const ::testing::TestParamInfo<VersionCase>& p) { return p.param.name; });

TEST(NpyRead, OneDimAndScalarShapes) {
  fs::path file = test_dir() / "one.npy";
  write_bytes(file, npy_image(1, f8_header("(3,)"), f8_bytes({1, 2, 3})));
  EXPECT_EQ(hg::read_npy(file).shape(), (hg::Shape{3}));
  write_bytes(file, npy_image(3, f8_header("()"), f8_bytes({9})));
  EXPECT_EQ(hg::read_npy(file).dim(), 0);
}

TEST(NpyRead, BoolBytesOtherThanOneReadAsTrue) {
  fs::path file = test_dir() / "b.npy";
  write_bytes(file, npy_image(1, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }\n",
                              std::string("\x00\x02\xff", 3)));
  EXPECT_EQ(hg::read_npy(file).to_vector(), (std::vector<double>{0, 1, 1}));
}

TEST(NpyRead, ParseFromMemory) {
  std::string image = npy_image(1, f8_header("(2,)"), f8_bytes({1.5, -2}));
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(image.data()), image.size());
  EXPECT_EQ(hg::parse_npy(bytes, "buffer").to_vector(), (std::vector<double>{1.5, -2}));
  expect_npy_error([&] { hg::parse_npy(bytes.first(20), "my buffer"); }, {"my buffer: ", "truncated"});
}

TEST(NpyRead, MissingFileIsNamed) {
  fs::path file = test_dir() / "absent.npy";
  expect_npy_error([&] { hg::read_npy(file); }, {file.string(), "cannot open"});
}

TEST(NpyRead, HugeShapeFailsBeforeAllocating) {
  // 10^9 float64s (8 GB) announced, 8 bytes present.
  fs::path file = test_dir() / "huge.npy";
  write_bytes(file, npy_image(1, f8_header("(1000000000,)"), f8_bytes({1})));
  hg::reset_peak_memory();
  const std::size_t before = hg::memory_stats().current_bytes;
  expect_npy_error([&] { hg::read_npy(file); },
                   {file.string(), "truncated data: expected 8000000000 bytes", "file has 8"});
  EXPECT_LT(hg::memory_stats().peak_bytes - before, 1u << 20);
}

// ---------------------------------------------------------------- malformed files

struct BadCase {
  std::string name;
  std::string bytes;
  std::string phrase;
};

class NpyMalformed : public ::testing::TestWithParam<BadCase> {};

TEST_P(NpyMalformed, ThrowsNamingTheFile) {
  const BadCase& c = GetParam();
  fs::path file = test_dir() / (c.name + ".npy");
  write_bytes(file, c.bytes);
  expect_npy_error([&] { hg::read_npy(file); }, {file.string() + ": ", c.phrase});
}

std::string hdr(const std::string& descr, const std::string& fortran, const std::string& shape) {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }\n";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, NpyMalformed,
    ::testing::Values(
        BadCase{"fortran_order", npy_image(1, hdr("<f8", "True", "(2, 3)"), f8_bytes(iota(6))),
                "fortran_order is True: headgrad reads C-order arrays; save with np.ascontiguousarray"},
        BadCase{"big_endian", npy_image(1, hdr(">f8", "False", "(2,)"), f8_bytes(iota(2))),
                "big-endian data ('>f8')"},
        BadCase{"big_endian_f4", npy_image(1, hdr(">f4", "False", "(2,)"), f8_bytes(iota(1))),
                "big-endian data ('>f4')"},
        BadCase{"int32", npy_image(1, hdr("<i4", "False", "(2,)"), f8_bytes(iota(1))),
                "unsupported dtype '<i4' (supported: '<f2' (float16), '<f4' (float32), '<f8' (float64), '|b1' (bool))"},
        BadCase{"structured", npy_image(1, "{'descr': [('a', '<f8'), ('b', '<i4', (2,))], "
                                           "'fortran_order': False, 'shape': (1,), }\n", f8_bytes(iota(2))),
                "unsupported dtype: a structured"},
        BadCase{"truncated", npy_image(1, f8_header("(2, 3)"), f8_bytes(iota(5))),
                "truncated data: expected 48 bytes for shape (2, 3) of '<f8', file has 40"},
        BadCase{"extra_bytes", npy_image(1, f8_header("(2,)"), f8_bytes(iota(3))),
                "shape does not match the data size"},
        BadCase{"overflowing_shape", npy_image(1, f8_header("(4611686018427387904, 4)"), f8_bytes(iota(1))),
                "shape (4611686018427387904, 4) overflows int64"},
        BadCase{"overflowing_dim", npy_image(1, f8_header("(0, 99999999999999999999)"), ""),
                "overflows int64"},
        BadCase{"overflowing_bytes", npy_image(1, f8_header("(2305843009213693952,)"), f8_bytes(iota(1))),
                "overflows int64"},
        BadCase{"bad_magic", "\x93NUMPZ\x01\x00" + std::string(100, ' '), "bad magic"},
        BadCase{"empty_file", "", "bad magic"},
        BadCase{"version_4", npy_image(4, f8_header("(1,)"), f8_bytes(iota(1))),
                "unsupported .npy format version 4.0"},
        BadCase{"preamble_cut", std::string("\x93NUMPY\x01\x00\x10", 9), "truncated preamble"},
        BadCase{"header_cut", npy_image(1, f8_header("(1,)"), "").substr(0, 30), "truncated header"},
        BadCase{"unclosed_dict", npy_image(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,)\n",
                                           f8_bytes(iota(1))),
                "malformed header: expected ',' or '}'"},
        BadCase{"not_a_dict", npy_image(1, "descr=<f8 shape=(1,)\n", f8_bytes(iota(1))),
                "malformed header"},
        BadCase{"unclosed_string", npy_image(1, "{'descr: '<f8'}", ""), "malformed header"},
        BadCase{"text_after_dict", npy_image(1, f8_header("(1,)") + "x", f8_bytes(iota(1))),
                "malformed header: expected the end of the header"},
        BadCase{"missing_key", npy_image(1, "{'descr': '<f8', 'shape': (1,)}\n", f8_bytes(iota(1))),
                "malformed header: missing key 'fortran_order'"},
        BadCase{"unknown_key", npy_image(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), "
                                            "'extra': 1}\n", f8_bytes(iota(1))),
                "malformed header: unexpected key 'extra'"},
        BadCase{"duplicate_key", npy_image(1, "{'descr': '<f8', 'descr': '<f8', 'fortran_order': False, "
                                              "'shape': (1,)}\n", f8_bytes(iota(1))),
                "appears twice"},
        BadCase{"shape_not_tuple", npy_image(1, f8_header("3"), f8_bytes(iota(3))),
                "malformed header: 'shape' must be a tuple of integers"},
        BadCase{"shape_of_strings", npy_image(1, f8_header("('2',)"), f8_bytes(iota(2))),
                "malformed header: 'shape' must be a tuple of integers"},
        BadCase{"negative_dim", npy_image(1, f8_header("(-1,)"), f8_bytes(iota(1))),
                "negative dimension"},
        BadCase{"fortran_not_bool", npy_image(1, hdr("<f8", "0", "(1,)"), f8_bytes(iota(1))),
                "'fortran_order' must be True or False"},
        BadCase{"deep_nesting", npy_image(1, f8_header(std::string(100, '(') + std::string(100, ')')), ""),
                "malformed header"}),
    [](const ::testing::TestParamInfo<BadCase>& p) { return p.param.name; });

// ---------------------------------------------------------------- npz

class NpzFixtures : public ::testing::TestWithParam<std::string> {};

TEST_P(NpzFixtures, ReadsEveryMember) {
  fs::path file = kData / "npz" / (GetParam() + ".npz");
  auto arrays = hg::read_npz(file);
  ASSERT_EQ(arrays.size(), 3u);
  const hg::Tensor& a = arrays.at("a");
  EXPECT_EQ(a.dtype(), hg::DType::float64);
  EXPECT_EQ(a.shape(), (hg::Shape{2, 3}));
  std::vector<double> want(6);
  for (int i = 0; i < 6; ++i) want[i] = i / 7.0;
  EXPECT_EQ(a.to_vector(), want);
  const hg::Tensor& b = arrays.at("b");
  EXPECT_EQ(b.dtype(), hg::DType::float32);
  EXPECT_EQ(b.to_vector(), (std::vector<double>{0.5, -1.25, 3.0, static_cast<double>(1e-3f)}));
  const hg::Tensor& m = arrays.at("m");
  EXPECT_EQ(m.dtype(), hg::DType::boolean);
  EXPECT_EQ(m.to_vector(), (std::vector<double>{1, 0, 0, 1}));
}

TEST_P(NpzFixtures, ReadsOneMemberWithOrWithoutSuffix) {
  fs::path file = kData / "npz" / (GetParam() + ".npz");
  EXPECT_EQ(hg::read_npz_member(file, "m").shape(), (hg::Shape{2, 2}));
  EXPECT_EQ(hg::read_npz_member(file, "b.npy").shape(), (hg::Shape{4}));
}

TEST_P(NpzFixtures, MissingMemberListsThosePresent) {
  fs::path file = kData / "npz" / (GetParam() + ".npz");
  expect_npy_error([&] { hg::read_npz_member(file, "wq"); },
                   {file.string(), "no member 'wq'", "members: a, b, m"});
}

INSTANTIATE_TEST_SUITE_P(Compression, NpzFixtures, ::testing::Values("stored", "deflated"));

TEST(Npz, NotAZipFile) {
  fs::path npy = kData / "npy" / "numpy_f8.npy";
  expect_npy_error([&] { hg::read_npz(npy); }, {npy.string(), "not a zip file"});
  fs::path text = test_dir() / "text.npz";
  write_bytes(text, "just some text, long enough to not be an empty archive\n");
  expect_npy_error([&] { hg::read_npz_member(text, "a"); }, {text.string(), "not a zip file"});
}

TEST(Npz, MissingArchive) {
  fs::path file = test_dir() / "absent.npz";
  expect_npy_error([&] { hg::read_npz(file); }, {file.string(), "cannot open"});
}

TEST(Npz, CorruptDeflateStreamNamesTheMember) {
  fs::path file = kData / "npz" / "corrupt.npz";
  expect_npy_error([&] { hg::read_npz_member(file, "a"); },
                   {file.string() + " (member 'a.npy'): ", "broken member"});
  expect_npy_error([&] { hg::read_npz(file); }, {"member 'a.npy'", "broken member"});
  EXPECT_EQ(hg::read_npz_member(file, "b").numel(), 4);  // the other members are intact
}

// A one-member zip written by hand, whose directory entries claim the sizes
// given (the CRC is never reached: the sizes are refused first).
std::string one_member_zip(const std::string& name, const std::string& data, std::uint16_t method,
                           std::uint32_t claimed_size, std::uint32_t claimed_compressed) {
  std::string out;
  auto u16 = [&](std::uint16_t v) { out += static_cast<char>(v & 0xff), out += static_cast<char>(v >> 8); };
  auto u32 = [&](std::uint32_t v) { u16(static_cast<std::uint16_t>(v & 0xffff)), u16(static_cast<std::uint16_t>(v >> 16)); };
  auto sizes = [&] { u32(0), u32(claimed_compressed), u32(claimed_size), u16(static_cast<std::uint16_t>(name.size())); };
  // local file header, then the data
  u32(0x04034b50), u16(20), u16(0), u16(method), u16(0), u16(0), sizes(), u16(0);
  out += name + data;
  const auto directory_at = static_cast<std::uint32_t>(out.size());
  // central directory entry
  u32(0x02014b50), u16(20), u16(20), u16(0), u16(method), u16(0), u16(0), sizes();
  u16(0), u16(0), u16(0), u16(0), u32(0), u32(0);
  out += name;
  const auto directory_size = static_cast<std::uint32_t>(out.size()) - directory_at;
  // end of central directory
  u32(0x06054b50), u16(0), u16(0), u16(1), u16(1), u32(directory_size), u32(directory_at), u16(0);
  return out;
}

// The directory's sizes are claims: a tiny file declaring a 4 GB member is
// refused before anything is allocated for it.
TEST(Npz, SizesTheArchiveCannotHoldAreRefused) {
  const std::string header = npy_image(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (500000000,), }", "");
  const std::uint32_t claimed = 4'000'000'000u + static_cast<std::uint32_t>(header.size());
  const fs::path stored = test_dir() / "stored_lie.npz";
  write_bytes(stored, one_member_zip("a.npy", header, /*store*/ 0, claimed, claimed));
  ASSERT_LT(fs::file_size(stored), 300u);
  expect_npy_error([&] { hg::read_npz(stored); },
                   {stored.string() + " (member 'a.npy'): ", "declares " + std::to_string(claimed) + " compressed bytes",
                    "the archive has only " + std::to_string(fs::file_size(stored))});
  // deflate expands at most 1032-fold: 100 compressed bytes cannot make 4 GB
  const fs::path deflated = test_dir() / "deflated_lie.npz";
  write_bytes(deflated, one_member_zip("a.npy", std::string(100, 'x'), /*deflate*/ 8, claimed, 100));
  expect_npy_error([&] { hg::read_npz_member(deflated, "a"); },
                   {"declares " + std::to_string(claimed) + " bytes, more than its 100 deflated bytes can hold (104224)"});
}

TEST(Npz, MemberThatIsNotAnNpyImage) {
  fs::path file = kData / "npz" / "bad_member.npz";
  expect_npy_error([&] { hg::read_npz(file); }, {file.string() + " (member 'bad.npy'): ", "bad magic"});
  EXPECT_EQ(hg::read_npz_member(file, "good").to_vector(), (std::vector<double>{1, 1, 1}));
  // README.txt is not an array, so it is neither read nor listed.
  expect_npy_error([&] { hg::read_npz_member(file, "README"); }, {"members: good, bad"});
}

}  // namespace

namespace {

std::string i8_bytes(const std::vector<std::int64_t>& values) {
  return {reinterpret_cast<const char*>(values.data()), values.size() * sizeof(std::int64_t)};
}

}  // namespace

// Token positions arrive as int64 ('<i8'); read_npy_integers reads them as float64 values.
TEST(NpyIntegers, Int64ReadsAsFloat64AndOnlyThere) {
  const fs::path file = test_dir() / "positions.npy";
  const std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }\n";
  write_bytes(file, npy_image(1, header, i8_bytes({0, 3, 7, 1000, 1002, 9007199254740992})));
  const hg::Tensor p = hg::read_npy_integers(file);
  EXPECT_EQ(p.dtype(), hg::DType::float64);
  EXPECT_EQ(p.shape(), (hg::Shape{2, 3}));
  EXPECT_EQ(p.to_vector(), (std::vector<double>{0, 3, 7, 1000, 1002, 9007199254740992.0}));
  expect_npy_error([&] { hg::read_npy(file); }, {file.string(), "unsupported dtype '<i8'"});
  // floats still read as they are
  write_bytes(file, npy_image(1, f8_header("(2,)"), f8_bytes({1.5, 2.0})));
  EXPECT_EQ(hg::read_npy_integers(file).to_vector(), (std::vector<double>{1.5, 2.0}));
  // 2^53 + 1 is not exact in float64
  write_bytes(file, npy_image(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }\n",
                              i8_bytes({9007199254740993})));
  expect_npy_error([&] { hg::read_npy_integers(file); }, {file.string(), "9007199254740993", "2^53"});
}

}  // namespace test_npy
