// The JUnit XML report, as CI servers (GitLab, Jenkins, GitHub actions that
// read test reports) expect it: <testsuites><testsuite><testcase>, a
// <failure> or <error> inside a case that did not succeed.
#include <chrono>
#include <cstdio>
#include <ctime>

#include "report/report.hpp"

namespace headgrad::runner {

namespace {

std::string seconds_attr(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", s);
  return buf;
}

std::string timestamp_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return buf;
}

// The failure's text: what the case is and every figure that matters.
std::string failure_text(const CaseResult& r) {
  std::string s = describe_case(r.spec) + "  " + pair_label(r) + "\n";
  if (!r.cause.empty()) s += r.cause + "\n";
  s += case_details(r, /*all=*/true, 2);
  s += analysis_details(r, 2);
  return s;
}

}  // namespace

std::string junit_report(const SuiteResult& result) {
  const std::size_t failures = result.count(CaseStatus::fail) + result.count(CaseStatus::xpass);
  const std::size_t errors = result.count(CaseStatus::error);
  const std::string counts = " tests=\"" + std::to_string(result.cases.size()) + "\" failures=\"" +
                             std::to_string(failures) + "\" errors=\"" + std::to_string(errors) +
                             "\" skipped=\"0\" time=\"" + seconds_attr(result.seconds) + "\"";
  const std::size_t replaced_before = utf8_replacements();
  std::string x = "  <testsuite name=\"" + xml_escape(result.name) + "\"" + counts + " timestamp=\"" + timestamp_now() +
                  "\" file=\"" + xml_escape(result.file.string()) + "\">\n";
  const std::size_t header_end = x.size();
  for (const auto& r : result.cases) {
    x += "    <testcase name=\"" + xml_escape(r.spec.name) + "\" classname=\"" + xml_escape(result.name) +
         "\" file=\"" + xml_escape(result.file.string()) + "\" time=\"" + seconds_attr(r.seconds) + "\">\n";
    const std::string text = xml_escape(failure_text(r));
    switch (r.status) {
      case CaseStatus::pass:
        break;
      case CaseStatus::xfail:
        x += "      <system-out>expected failure: " + xml_escape(r.cause) + "</system-out>\n";
        break;
      case CaseStatus::fail:
      case CaseStatus::xpass: {
        const bool nan = r.cause.rfind("plugin", 0) == 0;
        const char* type = r.status == CaseStatus::xpass ? "unexpected_pass" : nan ? "bad_output" : "mismatch";
        x += "      <failure type=\"" + std::string(type) + "\" message=\"" + xml_escape(r.cause) + "\">" + text +
             "</failure>\n";
        break;
      }
      case CaseStatus::error: {
        std::string type = "plugin_error";
        for (const auto& s : r.sides)
          if (is_plugin_error(s.status)) {
            type = std::string(side_status_name(s.status));
            break;
          }
        x += "      <error type=\"" + type + "\" message=\"" + xml_escape(r.cause) + "\">" + text + "</error>\n";
        break;
      }
    }
    x += "    </testcase>\n";
  }
  x += "  </testsuite>\n</testsuites>\n";
  if (const std::size_t replaced = utf8_replacements() - replaced_before)
    x.insert(header_end, "    <properties><property name=\"headgrad.note\" value=\"" +
                             xml_escape(text_replaced_note(replaced)) + "\"/></properties>\n");
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"headgrad\"" + counts + ">\n" + x;
}

}  // namespace headgrad::runner
