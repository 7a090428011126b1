// The code docs/plugin-guide.md shows, compiled and checked: the page's block
// after "<!-- compiled: FILE -->" must be the lines of FILE between its two
// markers, so the page cannot drift from code that builds and is right.
// softcap (tests/doc_examples/softcap.hpp): values against std::tanh, gradients
// against central differences, the version rule as the guide states it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <headgrad/gradcheck.hpp>

#include "checks.hpp"
#include "doc_examples/softcap.hpp"

namespace test_doc_examples {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;
using namespace headgrad;

namespace {

// The ```cpp block right after "<!-- compiled: FILE -->" in the guide.
std::string guide_block(const std::string& file) {
  const std::string guide = headgrad::test::read_text(fs::path(HEADGRAD_SOURCE_ROOT) / "docs" / "plugin-guide.md");
  const std::string marker = "<!-- compiled: " + file + " -->\n```cpp\n";
  const std::size_t at = guide.find(marker);
  if (at == std::string::npos) return "(no block marked " + file + " in docs/plugin-guide.md)";
  const std::size_t from = at + marker.size(), to = guide.find("```\n", from);
  return guide.substr(from, to - from);
}

// The lines of FILE between its two "// [TAG]" lines.
std::string file_region(const std::string& file, const std::string& tag) {
  const std::string text = headgrad::test::read_text(fs::path(HEADGRAD_SOURCE_ROOT) / file);
  const std::string marker = "// [" + tag + "]\n";
  const std::size_t a = text.find(marker);
  const std::size_t b = a == std::string::npos ? a : text.find(marker, a + marker.size());
  if (b == std::string::npos) return "(no two " + marker + " lines in " + file + ")";
  return text.substr(a + marker.size(), b - a - marker.size());
}

TEST(DocExamples, TheGuideShowsTheCompiledSoftcap) {
  EXPECT_EQ(guide_block("tests/doc_examples/softcap.hpp"), file_region("tests/doc_examples/softcap.hpp", "softcap"));
}

TEST(DocExamples, SoftcapValuesOnAStridedViewInBothDtypes) {
  Generator gen(11);
  const double cap = 2.5;
  for (DType dtype : {DType::float64, DType::float32}) {
    const Tensor x = randn({3, 4}, DType::float64, gen, 4.0).to(dtype).transpose(0, 1);  // [4, 3], strided
    const Tensor y = myattn::softcap(Variable(x), cap).data();
    ASSERT_EQ(y.shape(), (Shape{4, 3}));
    ASSERT_EQ(y.dtype(), dtype);
    for (std::int64_t i = 0; i < 4; ++i)
      for (std::int64_t j = 0; j < 3; ++j) {
        const double want = cap * std::tanh(x.at({i, j}) / cap);
        EXPECT_NEAR(y.at({i, j}), want, dtype == DType::float64 ? 1e-15 : 1e-6) << i << "," << j;
      }
  }
}

TEST(DocExamples, SoftcapGradientMatchesFiniteDifferences) {
  Generator gen(12);
  const Tensor x = randn({2, 3, 5}, DType::float64, gen, 3.0).narrow(2, 1, 3);  // a narrowed view
  const GradcheckResult r =
      gradcheck([](const std::vector<Variable>& v) { return myattn::softcap(v[0], 1.5); }, {x});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.elements_checked, 18);
}

// data<T>() leaves the version alone; mutable_data<T>() bumps it; a write into
// the saved output after the forward makes the backward refuse, naming the op.
TEST(DocExamples, TheVersionRuleAsTheGuideStatesIt) {
  Tensor t = Tensor::zeros({3}, DType::float64);
  const std::uint64_t v0 = t.version();
  (void)t.data<double>();
  EXPECT_EQ(t.version(), v0);
  (void)t.mutable_data<double>();
  EXPECT_EQ(t.version(), v0 + 1);

  Generator gen(13);
  Variable x(randn({4}, DType::float64, gen), true);
  const Variable y = myattn::softcap(x, 2.0);
  Tensor out = y.data();
  out.mutable_data<double>()[0] = 0.0;
  try {
    sum(y).backward();
    FAIL() << "backward read a saved tensor written after the forward";
  } catch (const std::logic_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("backward of 'softcap': saved tensor 0"), std::string::npos) << what;
    EXPECT_NE(what.find("was written in place after the op saved it (version 1, now 2); write into a copy (clone()) "
                        "instead"),
              std::string::npos)
        << what;
  }
  // untouched, the same op runs backward
  Variable x2(randn({4}, DType::float64, gen), true);
  sum(myattn::softcap(x2, 2.0)).backward();
  EXPECT_TRUE(x2.grad().defined());
}

TEST(DocExamples, DispatchFloatNamesTheOpForOtherDtypes) {
  const Tensor mask = Tensor::zeros({2}, DType::boolean);
  try {
    dispatch_float(mask.dtype(), "softcap", []<class T>() {});
    FAIL() << "dispatch_float ran on a boolean tensor";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("softcap"), std::string::npos) << e.what();
  }
}

}  // namespace

}  // namespace test_doc_examples
