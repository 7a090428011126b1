// Reports of one mixed suite (pass, fail, plugin error, NaN, expected
// failure, a name full of markup characters): JSON parses and holds the
// figures, JUnit is well-formed XML with the right counts and text, HTML is
// self-contained, and the terminal lines read as documented.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "analysis/analyze.hpp"
#include "job/run_suite.hpp"
#include "report/report.hpp"

namespace test_runner_reports {  // this file's names: test files share unity builds (tests/meson.build)

namespace fs = std::filesystem;

namespace {

using namespace headgrad;
using namespace headgrad::runner;

// ---- a strict little XML reader: enough to prove the JUnit file is well-formed ----
// Accepts: the <?xml ...?> prolog, elements, double-quoted attributes, text,
// the five predefined entities and numeric character references. Rejects
// anything else (unescaped < or &, mismatched or unclosed tags, duplicate
// attributes, control characters, invalid UTF-8, trailing content).
struct XmlElement {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::vector<XmlElement> children;
  std::string text;

  void collect(const std::string& tag, std::vector<const XmlElement*>& out) const {
    if (name == tag) out.push_back(this);
    for (const auto& c : children) c.collect(tag, out);
  }
  std::vector<const XmlElement*> all(const std::string& tag) const {
    std::vector<const XmlElement*> out;
    collect(tag, out);
    return out;
  }
  const XmlElement* child(const std::string& tag) const {
    for (const auto& c : children)
      if (c.name == tag) return &c;
    return nullptr;
  }
};

class XmlReader {
 public:
  explicit XmlReader(std::string doc) : s_(std::move(doc)) {}

  XmlElement parse() {
    check_characters();
    expect("<?xml ");
    const std::size_t end = s_.find("?>", pos_);
    if (end == std::string::npos) fail("unterminated prolog");
    pos_ = end + 2;
    skip_space();
    XmlElement root = element();
    skip_space();
    if (pos_ != s_.size()) fail("content after the root element");
    return root;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("XML error at byte " + std::to_string(pos_) + ": " + what);
  }
  void expect(std::string_view t) {
    if (s_.compare(pos_, t.size(), t) != 0) fail("expected '" + std::string(t) + "'");
    pos_ += t.size();
  }
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  void check_characters() {
    for (std::size_t i = 0; i < s_.size();) {
      const auto c = static_cast<unsigned char>(s_[i]);
      if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
        pos_ = i;
        fail("control character");
      }
      const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
      if (n == 0 || i + n > s_.size()) {
        pos_ = i;
        fail("invalid UTF-8");
      }
      for (std::size_t k = 1; k < n; ++k)
        if ((static_cast<unsigned char>(s_[i + k]) >> 6) != 2) {
          pos_ = i;
          fail("invalid UTF-8");
        }
      i += n;
    }
  }
  std::string name() {
    const std::size_t start = pos_;
    auto ok = [&](char c, bool first) {
      return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':' ||
             (!first && (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.'));
    };
    while (pos_ < s_.size() && ok(s_[pos_], pos_ == start)) ++pos_;
    if (pos_ == start) fail("expected a name");
    return s_.substr(start, pos_ - start);
  }
  // Text up to `stop`, entities decoded; a raw '<' or a bad '&' is an error.
  std::string chars(char stop) {
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != stop) {
      const char c = s_[pos_];
      if (c == '<') fail("unescaped '<'");
      if (c != '&') {
        out += c;
        ++pos_;
        continue;
      }
      const std::size_t semi = s_.find(';', pos_);
      if (semi == std::string::npos || semi - pos_ > 10) fail("unescaped '&'");
      const std::string ent = s_.substr(pos_ + 1, semi - pos_ - 1);
      static const std::map<std::string, std::string> named = {
          {"amp", "&"}, {"lt", "<"}, {"gt", ">"}, {"quot", "\""}, {"apos", "'"}};
      if (named.count(ent)) {
        out += named.at(ent);
      } else if (ent.size() > 1 && ent[0] == '#') {
        const long code = ent[1] == 'x' ? std::stol(ent.substr(2), nullptr, 16) : std::stol(ent.substr(1));
        if (code != 9 && code != 10 && code != 13 && (code < 0x20 || code > 0x7f)) fail("unexpected character reference");
        out += static_cast<char>(code);
      } else {
        fail("unknown entity &" + ent + ";");
      }
      pos_ = semi + 1;
    }
    return out;
  }
  XmlElement element() {
    expect("<");
    XmlElement e;
    e.name = name();
    while (true) {
      skip_space();
      if (s_.compare(pos_, 2, "/>") == 0) {
        pos_ += 2;
        return e;
      }
      if (pos_ < s_.size() && s_[pos_] == '>') {
        ++pos_;
        break;
      }
      const std::string attr = name();
      skip_space();
      expect("=");
      skip_space();
      expect("\"");
      const std::string value = chars('"');
      expect("\"");
      if (!e.attrs.emplace(attr, value).second) fail("duplicate attribute " + attr);
    }
    while (true) {
      if (pos_ >= s_.size()) fail("unclosed <" + e.name + ">");
      if (s_.compare(pos_, 2, "</") == 0) {
        pos_ += 2;
        if (name() != e.name) fail("mismatched closing tag for <" + e.name + ">");
        skip_space();
        expect(">");
        return e;
      }
      if (s_[pos_] == '<') e.children.push_back(element());
      else e.text += chars('<');
    }
  }

  std::string s_;
  std::size_t pos_ = 0;
};

TEST(XmlReader, RejectsWhatIsNotWellFormed) {
  auto bad = [](const std::string& doc) {
    try {
      XmlReader(doc).parse();
    } catch (const std::runtime_error&) {
      return true;
    }
    return false;
  };
  EXPECT_FALSE(bad("<?xml version=\"1.0\"?>\n<a x=\"1 &amp; 2\"><b/>t &lt; u</a>\n"));
  EXPECT_TRUE(bad("<?xml version=\"1.0\"?><a><b></a>"));
  EXPECT_TRUE(bad("<?xml version=\"1.0\"?><a x=\"1 & 2\"/>"));
  EXPECT_TRUE(bad("<?xml version=\"1.0\"?><a>1 < 2</a>"));
  EXPECT_TRUE(bad("<?xml version=\"1.0\"?><a x=\"1\" x=\"2\"/>"));
  EXPECT_TRUE(bad("<?xml version=\"1.0\"?><a/><b/>"));
  EXPECT_TRUE(bad("<?xml version=\"1.0\"?><a>\x01</a>"));
  EXPECT_TRUE(bad("<?xml version=\"1.0\"?><a>\xff</a>"));
  EXPECT_TRUE(bad("<a/>"));
}

// ---- one mixed suite, run once for every test below ----

const char* kOddName = "odd <name> & \"quotes\" 'here'";

class Reports : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new PluginRegistry();
    registry_->load_directories(plugin_search_path({RUNNER_TEST_PLUGIN_DIR}));
    const fs::path file = fs::temp_directory_path() / ("headgrad_reports_" + std::to_string(::getpid()) + ".yaml");
    std::ofstream(file) << R"(
suite: mixed
defaults: {causal: true, shape: {B: 2, T: 3, D: 8, H: 2}}
cases:
  - {name: passes, compare: [per_head, batched]}
  - {name: too-tight, compare: [per_head, batched], dtype: float32, atol: 0, rtol: 0}
  - {name: throws, compare: [throws, per_head]}
  - {name: nan, compare: [returns_nan, per_head]}
  - {name: known-failure, compare: [per_head, batched], dtype: float32, atol: 0, rtol: 0, expect: {fail: true}}
  - {name: "odd <name> & \"quotes\" 'here'", compare: [batched, per_head]}
)";
    const Suite suite = load_suite(file);
    fs::remove(file);
    result_ = new SuiteResult(headgrad::runner::run_suite(suite, *registry_, {}));
  }
  static void TearDownTestSuite() {
    delete result_;
    delete registry_;
  }
  static const CaseResult& find(const std::string& name) {
    for (const auto& c : result_->cases)
      if (c.spec.name == name) return c;
    throw std::logic_error("no case " + name);
  }

  static PluginRegistry* registry_;
  static SuiteResult* result_;
};
PluginRegistry* Reports::registry_ = nullptr;
SuiteResult* Reports::result_ = nullptr;

TEST_F(Reports, TheSuiteRanAsIntended) {
  EXPECT_EQ(find("passes").status, CaseStatus::pass);
  EXPECT_EQ(find("too-tight").status, CaseStatus::fail);
  EXPECT_EQ(find("throws").status, CaseStatus::error);
  EXPECT_EQ(find("nan").status, CaseStatus::fail);
  EXPECT_EQ(find("known-failure").status, CaseStatus::xfail);
  EXPECT_EQ(find(kOddName).status, CaseStatus::pass);
  EXPECT_EQ(result_->exit_code(), 3);
}

TEST_F(Reports, JsonHoldsEveryCaseAndFigure) {
  const std::string text = json_report(*result_).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  const nlohmann::json j = nlohmann::json::parse(text);  // throws if it is not JSON
  EXPECT_EQ(j["suite"], "mixed");
  EXPECT_EQ(j["summary"]["cases"], 6);
  EXPECT_EQ(j["summary"]["passed"], 3);
  EXPECT_EQ(j["summary"]["failed"], 3);
  EXPECT_EQ(j["summary"]["counts"]["error"], 1);
  EXPECT_EQ(j["summary"]["counts"]["xfail"], 1);
  EXPECT_EQ(j["summary"]["exit_code"], 3);
  ASSERT_EQ(j["cases"].size(), 6u);

  const auto& passes = j["cases"][0];
  EXPECT_EQ(passes["name"], "passes");
  EXPECT_EQ(passes["status"], "pass");
  EXPECT_EQ(passes["shape"], (nlohmann::json{{"B", 2}, {"T", 3}, {"D", 8}, {"H", 2}}));
  EXPECT_EQ(passes["causal"], true);
  EXPECT_EQ(passes["compare"], (nlohmann::json{"per_head", "batched"}));
  EXPECT_TRUE(passes["cause"].is_null());
  EXPECT_GT(passes["seconds"].get<double>(), 0);
  ASSERT_EQ(passes["tensors"].size(), 6u);
  const auto& out = passes["tensors"][0];
  EXPECT_EQ(out["name"], "out");
  EXPECT_EQ(out["shape"], (nlohmann::json{2, 3, 8}));
  EXPECT_EQ(out["allclose"], true);
  EXPECT_LT(out["max_abs"].get<double>(), 1e-12);
  EXPECT_EQ(out["tolerance"]["atol"], 1e-8);
  EXPECT_EQ(out["worst"]["index"].size(), 3u);
  ASSERT_EQ(passes["sides"].size(), 2u);
  EXPECT_EQ(passes["sides"][1]["plugin"], "batched");
  EXPECT_EQ(passes["sides"][1]["status"], "ok");

  const auto& tight = j["cases"][1];
  EXPECT_EQ(tight["status"], "fail");
  EXPECT_EQ(tight["dtype"], "float32");
  bool some_tensor_fails = false;
  for (const auto& t : tight["tensors"]) {
    if (t["allclose"] == true) continue;
    some_tensor_fails = true;
    EXPECT_GT(t["mismatched"].get<int>(), 0);
    EXPECT_GT(t["max_abs"].get<double>(), 0);
    EXPECT_TRUE(t["worst"]["where"].is_string());
  }
  EXPECT_TRUE(some_tensor_fails);

  const auto& throws = j["cases"][2];
  EXPECT_EQ(throws["status"], "error");
  EXPECT_EQ(throws["cause"], "plugin throws threw std::runtime_error: deliberate failure in mha_forward");
  EXPECT_EQ(throws["sides"][0]["status"], "threw");

  const auto& nan = j["cases"][3];
  EXPECT_EQ(nan["sides"][0]["status"], "non_finite");
  EXPECT_TRUE(nan["tensors"][0]["max_abs"].is_null());  // NaN is written as null
  EXPECT_EQ(j["cases"][5]["name"], kOddName);
}

TEST_F(Reports, JunitIsWellFormedXmlWithTheFigures) {
  const XmlElement root = XmlReader(junit_report(*result_)).parse();
  EXPECT_EQ(root.name, "testsuites");
  EXPECT_EQ(root.attrs.at("tests"), "6");
  EXPECT_EQ(root.attrs.at("failures"), "2");  // too-tight, nan
  EXPECT_EQ(root.attrs.at("errors"), "1");    // throws
  const XmlElement* suite = root.child("testsuite");
  ASSERT_NE(suite, nullptr);
  EXPECT_EQ(suite->attrs.at("name"), "mixed");
  const auto cases = root.all("testcase");
  ASSERT_EQ(cases.size(), 6u);
  EXPECT_EQ(cases[0]->attrs.at("name"), "passes");
  EXPECT_EQ(cases[0]->attrs.at("classname"), "mixed");
  EXPECT_TRUE(cases[0]->children.empty());
  EXPECT_EQ(cases[5]->attrs.at("name"), kOddName);  // escaped, and read back exactly

  const XmlElement* failure = cases[1]->child("failure");
  ASSERT_NE(failure, nullptr);
  EXPECT_EQ(failure->attrs.at("type"), "mismatch");
  EXPECT_NE(failure->attrs.at("message").find("tensors differ"), std::string::npos);
  EXPECT_NE(failure->text.find("MHA(B=2,T=3,D=8,H=2,causal,float32)  per_head vs batched"), std::string::npos)
      << failure->text;
  EXPECT_NE(failure->text.find("max|Δ|"), std::string::npos);
  EXPECT_NE(failure->text.find("worst ["), std::string::npos);
  EXPECT_NE(failure->text.find("outside atol 0.0e+00 + rtol 0.0e+00"), std::string::npos);

  const XmlElement* error = cases[2]->child("error");
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(error->attrs.at("type"), "threw");
  EXPECT_EQ(error->attrs.at("message"), "plugin throws threw std::runtime_error: deliberate failure in mha_forward");

  const XmlElement* nan = cases[3]->child("failure");
  ASSERT_NE(nan, nullptr);
  EXPECT_EQ(nan->attrs.at("message"), "plugin returns_nan returned NaN in out at [0, 1, 3] (b=0, t=1, head=0, ch=3)");
  EXPECT_EQ(cases[4]->child("failure"), nullptr);  // expected failure: a pass
  ASSERT_NE(cases[4]->child("system-out"), nullptr);
}

TEST_F(Reports, XmlEscapeHandlesMarkupControlsAndBadUtf8) {
  EXPECT_EQ(xml_escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&apos;");
  EXPECT_EQ(xml_escape("tab\tnl\n"), "tab&#9;nl&#10;");
  EXPECT_EQ(xml_escape("bell\x07"), "bell\xEF\xBF\xBD");
  EXPECT_EQ(xml_escape("Δ ok, \xff bad"), "Δ ok, \xEF\xBF\xBD bad");
  EXPECT_NO_THROW(XmlReader("<?xml version=\"1.0\"?><a x=\"" + xml_escape("\x01<&\xc3") + "\"/>").parse());
}

// nlohmann's dump() checks UTF-8 strictly (an implementation independent of the reports').
bool is_valid_utf8(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

TEST(ReportText, Utf8IsStrict) {
  for (const char* bad : {"\xff", "\xc3", "\xc0\xaf" /* overlong '/' */, "\xe0\x80\xaf", "\xed\xa0\x80" /* surrogate */,
                          "\xf4\x90\x80\x80" /* past U+10FFFF */, "\xf8\x88\x80\x80\x80"}) {
    std::size_t replaced = 0;
    const std::string fixed = valid_utf8(std::string("a") + bad + "z", &replaced);
    EXPECT_TRUE(is_valid_utf8(fixed)) << fixed;
    EXPECT_EQ(replaced, std::string(bad).size()) << fixed;  // one U+FFFD per byte
    EXPECT_EQ(fixed, "a" + [&] { std::string r; for (std::size_t i = 0; i < replaced; ++i) r += "\uFFFD"; return r; }() + "z");
    EXPECT_TRUE(is_valid_utf8(xml_escape(std::string("a") + bad + "z"))) << bad;
  }
  std::size_t replaced = 0;
  EXPECT_EQ(valid_utf8("Δ \xf0\x9f\x98\x80 \uFFFD", &replaced), "Δ \xf0\x9f\x98\x80 \uFFFD");  // valid stays as is
  EXPECT_EQ(replaced, 0u);
}

TEST(ReportText, TerminalEscapesControlsSoNoLineCanBeForged) {
  EXPECT_EQ(terminal_safe("a\n  OK     forged"), "a\\n  OK     forged");
  EXPECT_EQ(terminal_safe("red\x1b[31m\r\t\x7f"), "red\\x1b[31m\\r\\t\\x7f");
  EXPECT_EQ(terminal_safe("bad \xff byte, Δ kept"), "bad \\xff byte, Δ kept");
  EXPECT_EQ(terminal_safe("c1 \xc2\x9b, bidi \xe2\x80\xae, sep \xe2\x80\xa8"), "c1 \\x9b, bidi \\u202e, sep \\u2028");
  EXPECT_EQ(terminal_safe("two\nlines\x1b", true), "two\nlines\\x1b");
}

// Names and messages from the input, with control characters and invalid
// UTF-8: every report stays valid, says what it replaced, and the terminal
// shows one line per case.
TEST(ReportText, HostileNamesAndMessages) {
  SuiteResult result;
  result.name = "suite \xff";
  result.file = "s.yaml";
  CaseResult r;
  r.spec.name = r.spec.base_name = "a\n  OK     forged \xc0\xaf";
  r.spec.compare = {"per_head", "batched"};
  r.spec.dims = {2, 3, 8, 2, 0, 0, 0};
  r.lhs_label = "per_head";
  r.rhs_label = "batched";
  r.status = CaseStatus::error;
  r.cause = "plugin batched threw std::runtime_error: \x1b[32m\n  OK     fake \xed\xa0\x80";
  result.cases.push_back(r);

  const nlohmann::json j = json_report(result);
  const std::string text = j.dump();  // strict: throws on invalid UTF-8
  ASSERT_EQ(j["notes"].size(), 1u);
  EXPECT_NE(j["notes"][0].get<std::string>().find("were replaced by U+FFFD"), std::string::npos) << j["notes"];
  EXPECT_EQ(j["cases"][0]["name"], "a\n  OK     forged \uFFFD\uFFFD");

  const std::string xml = junit_report(result);
  EXPECT_TRUE(is_valid_utf8(xml));
  const XmlElement root = XmlReader(xml).parse();
  const XmlElement* suite = root.child("testsuite");
  ASSERT_NE(suite, nullptr);
  const XmlElement* props = suite->child("properties");
  ASSERT_NE(props, nullptr) << xml;
  ASSERT_NE(props->child("property"), nullptr);
  EXPECT_EQ(props->child("property")->attrs.at("name"), "headgrad.note");
  EXPECT_NE(props->child("property")->attrs.at("value").find("replaced by U+FFFD"), std::string::npos);

  const std::string html = html_report(result);
  EXPECT_TRUE(is_valid_utf8(html));
  EXPECT_NE(html.find("<p class=\"note\">note: "), std::string::npos);

  // a clean result has no note
  SuiteResult clean = result;
  clean.name = "clean";
  clean.cases[0].spec.name = clean.cases[0].spec.base_name = "fine";
  clean.cases[0].cause = "plugin batched threw std::runtime_error: plain";
  EXPECT_TRUE(json_report(clean)["notes"].empty());
  EXPECT_EQ(junit_report(clean).find("<properties>"), std::string::npos);
  EXPECT_EQ(html_report(clean).find("class=\"note\""), std::string::npos);

  std::ostringstream os;
  const CaseSpec* spec = &result.cases[0].spec;
  print_case(os, result.cases[0], terminal_style({spec}, false, false, false));
  const std::string line = os.str();
  ASSERT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << line;  // one case, one line
  EXPECT_EQ(line.rfind("  ERROR  a\\n  OK     forged \\xc0\\xaf", 0), 0u) << line;
  EXPECT_NE(line.find("\\x1b[32m\\n  OK     fake \\xed\\xa0\\x80"), std::string::npos) << line;
}

TEST_F(Reports, HtmlIsOneSelfContainedPage) {
  const std::string html = html_report(*result_);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("3 passed, 3 failed"), std::string::npos);
  EXPECT_NE(html.find("odd &lt;name&gt; &amp; &quot;quotes&quot; &apos;here&apos;"), std::string::npos);
  EXPECT_EQ(html.find(kOddName), std::string::npos);  // never unescaped
  EXPECT_NE(html.find("plugin throws threw std::runtime_error"), std::string::npos);
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_NE(html.find("id=\"case-1\""), std::string::npos);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST_F(Reports, TerminalLinesAndSummary) {
  std::vector<const CaseSpec*> specs;
  for (const auto& c : result_->cases) specs.push_back(&c.spec);
  std::ostringstream os;
  const TerminalStyle style = terminal_style(specs, false, false, false);
  for (const auto& c : result_->cases) print_case(os, c, style);
  print_summary(os, *result_, style);
  const std::string text = os.str();
  EXPECT_EQ(text.find("\033["), std::string::npos);  // no colors unless asked
  const auto lines = lines_of(text);
  ASSERT_FALSE(lines.empty());
  // one line per case, readable at a glance
  EXPECT_EQ(lines[0].rfind("  OK     passes", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("MHA(B=2,T=3,D=8,H=2,causal)"), std::string::npos);
  EXPECT_NE(lines[0].find("per_head vs batched"), std::string::npos);
  EXPECT_NE(lines[0].find("max|Δ| "), std::string::npos);
  EXPECT_NE(lines[0].find("(6 tensors, "), std::string::npos);
  // the failure is expanded: one line per differing tensor, and its worst element
  EXPECT_EQ(lines[1].rfind("  FAIL   too-tight", 0), 0u) << lines[1];
  EXPECT_NE(lines[1].find("tensors differ"), std::string::npos);
  EXPECT_NE(lines[2].find("max rel"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find("allclose FAIL"), std::string::npos);
  EXPECT_NE(lines[3].find("worst ["), std::string::npos) << lines[3];
  EXPECT_NE(lines[3].find(" per_head "), std::string::npos);
  bool error_line = false, summary_line = false;
  for (const auto& l : lines) {
    error_line |= l.rfind("  ERROR  throws", 0) == 0 &&
                  l.find("plugin throws threw std::runtime_error: deliberate failure in mha_forward") != std::string::npos;
    summary_line |= l == "3 passed, 3 failed";  // exactly, alone on its line
  }
  EXPECT_TRUE(error_line) << text;
  EXPECT_TRUE(summary_line) << text;
  EXPECT_NE(text.find("  XFAIL  known-failure"), std::string::npos);
  EXPECT_NE(text.find("not as expected: too-tight, throws, nan"), std::string::npos);

  // quiet: only what did not go as expected, and the summary
  std::ostringstream quiet;
  const TerminalStyle q = terminal_style(specs, false, true, false);
  for (const auto& c : result_->cases) print_case(quiet, c, q);
  EXPECT_EQ(quiet.str().find("OK "), std::string::npos);
  EXPECT_EQ(quiet.str().find("XFAIL"), std::string::npos);
  EXPECT_NE(quiet.str().find("FAIL   too-tight"), std::string::npos);

  // colors, when asked
  std::ostringstream colored;
  print_case(colored, result_->cases[0], terminal_style(specs, true, false, false));
  EXPECT_NE(colored.str().find("\033[32mOK   \033[0m"), std::string::npos);
}

TEST(ReportFormat, Figures) {
  EXPECT_EQ(format_figure(2.2e-16), "2.2e-16");
  EXPECT_EQ(format_figure(0), "0.0e+00");
  EXPECT_EQ(format_figure(std::nan("")), "nan");
  EXPECT_EQ(format_duration(0.0031), "3 ms");
  EXPECT_EQ(format_duration(1.2), "1.20 s");
}

TEST(JsonReport, GroupedKvShapeCarriesHkvAndHeadWidth) {
  SuiteResult result;
  result.name = "g";
  result.file = "g.yaml";
  CaseResult r;
  r.spec.name = r.spec.base_name = "g";
  r.spec.compare = {"per_head", "batched"};
  r.spec.dims = Dims{.B = 2, .T = 7, .D = 24, .H = 12, .d = 10, .Hkv = 3};
  r.status = CaseStatus::pass;
  result.cases.push_back(r);
  const nlohmann::json j = json_report(result);
  EXPECT_EQ(j["cases"][0]["shape"], (nlohmann::json{{"B", 2}, {"T", 7}, {"D", 24}, {"H", 12}, {"Hkv", 3}, {"d", 10}}));
}

}  // namespace

}  // namespace test_runner_reports
