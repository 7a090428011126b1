// The plugin ABI's layout, pinned: the sizes and offsets of every type that
// crosses the plugin boundary, as of HEADGRAD_PLUGIN_ABI_VERSION 7 on LP64
// libstdc++ (x86-64, aarch64) with the C++11 string ABI. A change to any of
// these types fails to compile here: bump HEADGRAD_PLUGIN_ABI_VERSION in
// <headgrad/abi.hpp> and write the new numbers below. Then the build
// description's comparison, field by field, with each way it can differ.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "checks.hpp"
#include "headgrad/loader.hpp"

namespace test_abi_layout {  // this file's names: test files share unity builds (tests/meson.build)

namespace hg = headgrad;
using headgrad::test::contains;

namespace {

static_assert(HEADGRAD_PLUGIN_ABI_VERSION == 7,
              "the numbers below are ABI 7's: write the new ABI's layout here");

#if defined(__LP64__) && defined(__GLIBCXX__) && _GLIBCXX_USE_CXX11_ABI
// offsetof on classes with std members is conditionally supported; GCC and
// Clang give the real offsets.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
static_assert(sizeof(hg::PluginInfo) == 152 && alignof(hg::PluginInfo) == 8);
static_assert(offsetof(hg::PluginInfo, name) == 0 && offsetof(hg::PluginInfo, version) == 32 &&
              offsetof(hg::PluginInfo, description) == 64 && offsetof(hg::PluginInfo, capabilities) == 96 &&
              offsetof(hg::PluginInfo, mutant) == 144);
static_assert(sizeof(hg::Capabilities) == 48);
static_assert(offsetof(hg::Capabilities, mha) == 0 && offsetof(hg::Capabilities, core) == 1 &&
              offsetof(hg::Capabilities, causal) == 2 && offsetof(hg::Capabilities, bool_mask) == 3 &&
              offsetof(hg::Capabilities, cross_lengths) == 4 && offsetof(hg::Capabilities, float32) == 5 &&
              offsetof(hg::Capabilities, float64) == 6 && offsetof(hg::Capabilities, dropout) == 7 &&
              offsetof(hg::Capabilities, grouped_kv) == 8 && offsetof(hg::Capabilities, rope) == 9 &&
              offsetof(hg::Capabilities, rope_level) == 10 && offsetof(hg::Capabilities, bias) == 11 &&
              offsetof(hg::Capabilities, window) == 12 && offsetof(hg::Capabilities, softcap) == 13 &&
              offsetof(hg::Capabilities, sinks) == 14 && offsetof(hg::Capabilities, qk_norm) == 15 &&
              offsetof(hg::Capabilities, cross_attention) == 16 && offsetof(hg::Capabilities, extra) == 24);
static_assert(sizeof(hg::Attention) == 8);  // the vtable pointer
static_assert(sizeof(hg::UnsupportedError) == 16);
static_assert(sizeof(hg::AttentionSpec) == 936);
static_assert(offsetof(hg::AttentionSpec, d_model) == 0 && offsetof(hg::AttentionSpec, num_heads) == 8 &&
              offsetof(hg::AttentionSpec, num_kv_heads) == 16 && offsetof(hg::AttentionSpec, head_width) == 24 &&
              offsetof(hg::AttentionSpec, causal) == 32 && offsetof(hg::AttentionSpec, causal_alignment) == 36 &&
              offsetof(hg::AttentionSpec, scale) == 40 && offsetof(hg::AttentionSpec, dropout_p) == 56 &&
              offsetof(hg::AttentionSpec, dropout_seed) == 64 && offsetof(hg::AttentionSpec, mask) == 72 &&
              offsetof(hg::AttentionSpec, rope) == 248 && offsetof(hg::AttentionSpec, rope_taps) == 472 &&
              offsetof(hg::AttentionSpec, window) == 488 && offsetof(hg::AttentionSpec, softcap) == 520 &&
              offsetof(hg::AttentionSpec, sinks) == 528 && offsetof(hg::AttentionSpec, qk_norm) == 720 &&
              offsetof(hg::AttentionSpec, x_kv) == 744);
static_assert(sizeof(hg::WindowSpec) == 32 && offsetof(hg::WindowSpec, left) == 0 &&
              offsetof(hg::WindowSpec, right) == 16);
static_assert(sizeof(hg::QkNormSpec) == 24 && offsetof(hg::QkNormSpec, enabled) == 0 &&
              offsetof(hg::QkNormSpec, axis) == 4 && offsetof(hg::QkNormSpec, eps) == 8 &&
              offsetof(hg::QkNormSpec, gain) == 16);
static_assert(sizeof(hg::RopeSpec) == 224 && offsetof(hg::RopeSpec, enabled) == 0 &&
              offsetof(hg::RopeSpec, theta) == 8 && offsetof(hg::RopeSpec, style) == 16 &&
              offsetof(hg::RopeSpec, rotary_dim) == 24 && offsetof(hg::RopeSpec, positions) == 32 &&
              offsetof(hg::RopeSpec, offset) == 208 && offsetof(hg::RopeSpec, q_offset) == 216);
static_assert(sizeof(hg::MhaWeights) == 1920 && offsetof(hg::MhaWeights, wq) == 0 &&
              offsetof(hg::MhaWeights, wk) == 192 && offsetof(hg::MhaWeights, wv) == 384 &&
              offsetof(hg::MhaWeights, wo) == 576 && offsetof(hg::MhaWeights, bq) == 768 &&
              offsetof(hg::MhaWeights, bk) == 960 && offsetof(hg::MhaWeights, bv) == 1152 &&
              offsetof(hg::MhaWeights, bo) == 1344 && offsetof(hg::MhaWeights, q_norm) == 1536 &&
              offsetof(hg::MhaWeights, k_norm) == 1728);
static_assert(sizeof(hg::Tensor) == 176);  // storage, shape, strides, offset, dtype
static_assert(sizeof(hg::Storage) == 32);  // data, nbytes, capacity, version
static_assert(sizeof(hg::Variable) == 192);  // its value (a Tensor) and a shared_ptr to its node
static_assert(sizeof(hg::CustomOpContext) == 88 && offsetof(hg::CustomOpContext, saved) == 0 &&
              offsetof(hg::CustomOpContext, needs_input_grad) == 24 &&
              offsetof(hg::CustomOpContext, scalars) == 64);
static_assert(sizeof(hg::Generator) == 24);
static_assert(sizeof(hg::MemoryStats) == 40 && offsetof(hg::MemoryStats, current_bytes) == 0 &&
              offsetof(hg::MemoryStats, peak_bytes) == 8 && offsetof(hg::MemoryStats, cached_bytes) == 16 &&
              offsetof(hg::MemoryStats, reserved_bytes) == 24 &&
              offsetof(hg::MemoryStats, peak_reserved_bytes) == 32);
static_assert(sizeof(hg::DType) == 1);
static_assert(sizeof(hg::Shape) == 72 && alignof(hg::Shape) == 8);  // heap pointer, size, capacity, 6 dims
#pragma GCC diagnostic pop
// The description itself only ever grows at its end.
static_assert(sizeof(headgrad_build_info) == 72 && offsetof(headgrad_build_info, magic) == 0 &&
              offsetof(headgrad_build_info, info_size) == 4 && offsetof(headgrad_build_info, abi_version) == 8 &&
              offsetof(headgrad_build_info, stdlib) == 12 && offsetof(headgrad_build_info, stdlib_version) == 16 &&
              offsetof(headgrad_build_info, cxx11_abi) == 24 && offsetof(headgrad_build_info, features) == 28 &&
              offsetof(headgrad_build_info, cplusplus) == 32 &&
              offsetof(headgrad_build_info, headgrad_version) == 40 &&
              offsetof(headgrad_build_info, compiler) == 48 && offsetof(headgrad_build_info, layout_count) == 56 &&
              offsetof(headgrad_build_info, layout) == 64);
static_assert(sizeof(headgrad_type_layout) == 16);
#else
#error "pin the plugin ABI's layout for this platform and standard library here"
#endif

// This test's own build, described as HEADGRAD_PLUGIN describes a plugin's.
HEADGRAD_DEFINE_BUILD_INFO(g_test_build);

// A copy of the host's description with its own layout table, to doctor.
struct Doctored {
  headgrad_build_info info = hg::host_build_info();
  std::vector<headgrad_type_layout> rows{info.layout, info.layout + info.layout_count};
  const headgrad_build_info& get() {
    info.layout = rows.data();
    info.layout_count = static_cast<std::uint32_t>(rows.size());
    return info;
  }
  headgrad_type_layout& row(const char* name) {
    for (auto& r : rows)
      if (std::strcmp(r.name, name) == 0) return r;
    throw std::logic_error(std::string("no layout row ") + name);
  }
};

std::string mismatch_of(const headgrad_build_info& b) {
  return hg::compare_builds(b, hg::host_build_info()).reason();
}

TEST(AbiLayout, HostTableHoldsThePinnedSizes) {
  Doctored d;
  EXPECT_EQ(d.row("PluginInfo").size, 152u);
  EXPECT_EQ(d.row("AttentionSpec").size, 936u);
  EXPECT_EQ(d.row("MemoryStats").size, 40u);
  EXPECT_EQ(d.row("Tensor").size, 176u);
  EXPECT_EQ(d.row("Shape").size, 72u);
  EXPECT_EQ(d.row("std::string").size, 32u);
  EXPECT_EQ(d.row("std::shared_ptr").size, 16u);
  EXPECT_EQ(d.row("std::function").size, 32u);
  EXPECT_EQ(d.row("std::map").size, 48u);
  EXPECT_EQ(d.info.abi_version, 7u);
  EXPECT_EQ(d.info.cxx11_abi, 1);
  EXPECT_EQ(d.info.stdlib, HEADGRAD_STDLIB_LIBSTDCXX);
  EXPECT_EQ(d.info.cplusplus, 202002);
  EXPECT_EQ(d.info.features, HEADGRAD_FEATURE_EXCEPTIONS | HEADGRAD_FEATURE_RTTI);
  EXPECT_EQ(std::string(d.info.headgrad_version), HEADGRAD_VERSION_STRING);
}

TEST(AbiLayout, SameToolchainIsCompatible) {
  const hg::BuildComparison c = hg::compare_builds(g_test_build, hg::host_build_info());
  EXPECT_TRUE(c.compatible()) << c.reason();
  EXPECT_TRUE(c.notes.empty());
}

TEST(AbiLayout, EachFieldMismatchIsNamed) {
  {
    Doctored d;
    d.info.cxx11_abi = 0;
    EXPECT_EQ(mismatch_of(d.get()), "built with _GLIBCXX_USE_CXX11_ABI=0, headgrad uses 1");
  }
  {
    Doctored d;
    d.info.stdlib = HEADGRAD_STDLIB_LIBCXX;
    EXPECT_EQ(mismatch_of(d.get()), "built with libc++, headgrad uses libstdc++");
  }
  {
    Doctored d;
    d.info.cplusplus = 201703;
    EXPECT_EQ(mismatch_of(d.get()), "built as __cplusplus 201703, headgrad uses 202002 (-std=c++20)");
  }
  {
    Doctored d;
    d.info.features &= ~HEADGRAD_FEATURE_RTTI;
    EXPECT_EQ(mismatch_of(d.get()), "built without RTTI (-fno-rtti), headgrad with RTTI");
  }
  {
    Doctored d;
    d.info.features |= HEADGRAD_FEATURE_STDLIB_DEBUG;
    EXPECT_EQ(mismatch_of(d.get()), "built with _GLIBCXX_DEBUG, headgrad without _GLIBCXX_DEBUG");
  }
  {
    Doctored d;
    d.row("MemoryStats").size = 16;  // MemoryStats before it grew from 2 to 5 fields
    EXPECT_EQ(mismatch_of(d.get()), "sizeof(MemoryStats) is 16 in the plugin, 40 in headgrad");
  }
  {
    Doctored d;
    d.row("Tensor").align = 16;
    EXPECT_EQ(mismatch_of(d.get()), "alignof(Tensor) is 16 in the plugin, 8 in headgrad");
  }
  {
    Doctored d;
    d.rows.erase(d.rows.begin());  // an SDK whose table lacks PluginInfo
    EXPECT_EQ(mismatch_of(d.get()), "its layout table does not describe PluginInfo");
  }
}

TEST(AbiLayout, AnotherAbiVersionSaysOnlyThat) {
  Doctored d;
  d.info.abi_version = 6;  // the ABI before Shape kept its dims inline
  d.info.cxx11_abi = 0;  // not comparable across versions: not reported
  d.info.headgrad_version = "0.0.9";
  EXPECT_EQ(mismatch_of(d.get()), "built for plugin ABI version 6 (headgrad 0.0.9), headgrad uses 7");
}

TEST(AbiLayout, NotADescriptionAtAll) {
  Doctored d;
  d.info.magic = 0x12345678;
  EXPECT_TRUE(contains(mismatch_of(d.get()), "not a build description"));
  Doctored small;
  small.info.info_size = 40;
  EXPECT_EQ(mismatch_of(small.get()), "its build description has 40 bytes, headgrad's 72: built against an older SDK");
  Doctored no_table;
  no_table.info.layout = nullptr;
  no_table.info.layout_count = 0;
  EXPECT_TRUE(contains(hg::compare_builds(no_table.info, hg::host_build_info()).reason(), "layout table is missing"));
}

TEST(AbiLayout, CompilerAndLibraryReleasesAreNotesNotMismatches) {
  Doctored d;
  d.info.compiler = "othercc 99.1";
  d.info.stdlib_version = 20200101;
  d.info.headgrad_version = "0.1.1";
  const hg::BuildComparison c = hg::compare_builds(d.get(), hg::host_build_info());
  EXPECT_TRUE(c.compatible()) << c.reason();
  ASSERT_EQ(c.notes.size(), 3u);
  EXPECT_EQ(c.notes[0], "compiled by othercc 99.1, headgrad by " + std::string(hg::host_build_info().compiler));
  EXPECT_TRUE(contains(c.notes[1], "libstdc++ headers 20200101"));
  EXPECT_TRUE(contains(c.notes[2], "headgrad 0.1.1"));
}

}  // namespace

}  // namespace test_abi_layout
