// The JSON report's schema: each struct's fields listed once, in one function
// that both writes them (Writer) and reads them back (Reader), so a field
// cannot be written and forgotten on the way back (merged shards, -j workers).
// The Reader checks every value's type and range and names the source and the
// JSON path of the first one that is wrong ("shard2.json: $.cases[1].tensors[0].max_abs:
// expected a number or null, got a string"); no nlohmann exception escapes it.
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/report.hpp"

#ifndef HEADGRAD_VERSION
#define HEADGRAD_VERSION "unknown"
#endif

namespace headgrad::runner {

namespace {

using nlohmann::json;

// S is T or const T: one field list serves the writer (const) and the reader.
template <class S, class T>
concept Is = std::same_as<std::remove_const_t<S>, T>;

std::string kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    case json::value_t::binary: return "binary data";
    case json::value_t::discarded: return "nothing";
    default: return "a number";
  }
}

// A value as the message shows it: numbers as written, anything else by kind.
std::string shown(const json& v) { return v.is_number() ? v.dump() : kind(v); }

// What a value written only for readers (derived from the rest) must be.
enum class Expect { string, string_or_null, number_or_null, boolean, count, strings };

// Whether an absent key reads as the field's default (keys older reports lack).
enum class Key { required, optional };

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// ---- the writer ----

class Writer {
 public:
  static constexpr bool reading = false;
  Writer(json& out, bool exact) : out_(out), exact_(exact) { out_ = json::object(); }

  // NaN and Inf: null in JSON text; kept with `exact` (CBOR holds them).
  json num(double x) const { return std::isfinite(x) || exact_ ? json(x) : json(nullptr); }

  void text(const char* k, const std::string& s, Key = Key::required) { out_[k] = s; }
  void text_or_null(const char* k, const std::string& s, Key = Key::required) {
    out_[k] = s.empty() ? json(nullptr) : json(s);
  }
  void texts(const char* k, const std::vector<std::string>& v, Key = Key::required) { out_[k] = v; }
  void number(const char* k, double x) { out_[k] = num(x); }
  void real(const char* k, double x, double = 0, double = 0) { out_[k] = num(x); }
  void numbers(const char* k, const std::vector<double>& v) {
    json a = json::array();
    for (double x : v) a.push_back(num(x));
    out_[k] = std::move(a);
  }
  void number_rows(const char* k, const std::vector<std::vector<double>>& rows) {
    json a = json::array();
    for (const auto& row : rows) {
      json r = json::array();
      for (double x : row) r.push_back(num(x));
      a.push_back(std::move(r));
    }
    out_[k] = std::move(a);
  }
  template <class I>
  void integer(const char* k, const I& v, I = {}, I = {}) {
    out_[k] = v;
  }
  // v: a std::vector<I> or a Shape.
  template <class Seq, class I>
  void integers(const char* k, const Seq& v, I = {}) {
    out_[k] = std::vector<I>(v.begin(), v.end());
  }
  void integer_rows(const char* k, const std::vector<std::vector<std::int64_t>>& v) { out_[k] = v; }
  void flag(const char* k, const bool& b) { out_[k] = b; }
  template <class E, class Name>
  void choice(const char* k, const E& e, std::initializer_list<E>, Name name) {
    out_[k] = std::string(name(e));
  }
  template <class S>
  void object(const char* k, S& s) {
    Writer w(out_[k], exact_);
    fields(w, s);
  }
  template <class S>
  void maybe(const char* k, const std::optional<S>& o) {
    if (!o) {
      out_[k] = nullptr;
      return;
    }
    Writer w(out_[k], exact_);
    fields(w, *o);
  }
  template <class S>
  void list(const char* k, const std::vector<S>& v, std::size_t = 0, std::size_t = 0, Key = Key::required) {
    json a = json::array();
    for (const S& s : v) {
      json item;
      Writer w(item, exact_);
      fields(w, s);
      a.push_back(std::move(item));
    }
    out_[k] = std::move(a);
  }
  // Written for readers of the report only; the reader checks its type.
  template <class F>
  void derived(const char* k, F&& make, Expect) {
    out_[k] = make();
  }
  // A field whose form is its own (a custom pair of a write and a read).
  template <class W, class R>
  void custom(const char* k, W&& write, R&&) {
    out_[k] = write();
  }

 private:
  json& out_;
  bool exact_;
};

// ---- the reader ----

class Reader {
 public:
  static constexpr bool reading = true;
  Reader(const json& j, std::string path, const std::string& source) : j_(j), path_(std::move(path)), source_(source) {
    if (!j_.is_object()) fail(path_, "expected an object, got " + kind(j_));
  }

  [[noreturn]] void fail(const std::string& path, const std::string& why) const {
    throw ReportError(source_ + ": " + path + ": " + why);
  }
  std::string path(const char* k) const { return path_ + "." + k; }
  const std::string& path() const { return path_; }
  const std::string& source() const { return source_; }
  const json* find(const char* k) const {
    const auto it = j_.find(k);
    return it == j_.end() ? nullptr : &*it;
  }
  const json& at(const char* k) const {
    if (const json* v = find(k)) return *v;
    fail(path(k), "missing");
  }

  std::string string_of(const json& v, const std::string& p) const {
    if (!v.is_string()) fail(p, "expected a string, got " + kind(v));
    return v.get<std::string>();
  }
  // null reads NaN (JSON text has no NaN or Inf).
  double number_of(const json& v, const std::string& p) const {
    if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
    if (!v.is_number()) fail(p, "expected a number or null, got " + kind(v));
    return v.get<double>();
  }
  template <class I>
  I integer_of(const json& v, const std::string& p, I lo, I hi) const {
    auto refuse = [&] {
      const std::string range = hi == std::numeric_limits<I>::max()
                                    ? ">= " + std::to_string(lo)
                                    : "from " + std::to_string(lo) + " to " + std::to_string(hi);
      fail(p, "expected a whole number " + range + ", got " + shown(v));
    };
    if (!v.is_number_integer()) refuse();  // 1.5 and 2.0 alike: every integer is written as one
    if (v.is_number_unsigned() || v.get<std::int64_t>() >= 0) {
      const std::uint64_t u = v.is_number_unsigned() ? v.get<std::uint64_t>()
                                                     : static_cast<std::uint64_t>(v.get<std::int64_t>());
      if (hi < 0 || u > static_cast<std::uint64_t>(hi) || (lo > 0 && u < static_cast<std::uint64_t>(lo))) refuse();
      return static_cast<I>(u);
    }
    const std::int64_t s = v.get<std::int64_t>();
    if (!std::is_signed_v<I> || s < static_cast<std::int64_t>(lo)) refuse();
    return static_cast<I>(s);
  }
  const json& array_at(const char* k, std::size_t min_size = 0,
                       std::size_t max_size = std::numeric_limits<std::size_t>::max()) const {
    const json& a = at(k);
    if (!a.is_array()) fail(path(k), "expected an array, got " + kind(a));
    if (a.size() < min_size || a.size() > max_size)
      fail(path(k), "expected " + std::to_string(min_size) + " to " + std::to_string(max_size) + " entries, got " +
                        std::to_string(a.size()));
    return a;
  }
  static std::string item(const std::string& p, std::size_t i) { return p + "[" + std::to_string(i) + "]"; }

  void text(const char* k, std::string& s, Key key = Key::required) {
    if (key == Key::optional && !find(k)) return;
    s = string_of(at(k), path(k));
  }
  void text_or_null(const char* k, std::string& s, Key key = Key::required) {
    if (key == Key::optional && !find(k)) return;
    const json& v = at(k);
    s = v.is_null() ? std::string() : string_of(v, path(k));
  }
  void texts(const char* k, std::vector<std::string>& out, Key key = Key::required) {
    if (key == Key::optional && !find(k)) return;
    const json& a = array_at(k);
    out.clear();
    for (std::size_t i = 0; i < a.size(); ++i) out.push_back(string_of(a[i], item(path(k), i)));
  }
  void number(const char* k, double& x) { x = number_of(at(k), path(k)); }
  // A finite number in [lo, hi].
  void real(const char* k, double& x, double lo = -std::numeric_limits<double>::max(),
            double hi = std::numeric_limits<double>::max()) {
    const json& v = at(k);
    if (!v.is_number()) fail(path(k), "expected a number, got " + kind(v));
    x = v.get<double>();
    if (!(x >= lo && x <= hi)) fail(path(k), "expected a number from " + json(lo).dump() + " to " + json(hi).dump() +
                                                 ", got " + json(x).dump());
  }
  void numbers(const char* k, std::vector<double>& out) {
    const json& a = array_at(k);
    out.clear();
    for (std::size_t i = 0; i < a.size(); ++i) out.push_back(number_of(a[i], item(path(k), i)));
  }
  void number_rows(const char* k, std::vector<std::vector<double>>& out) {
    const json& a = array_at(k);
    out.clear();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::string p = item(path(k), i);
      if (!a[i].is_array()) fail(p, "expected an array, got " + kind(a[i]));
      std::vector<double> row;
      for (std::size_t j = 0; j < a[i].size(); ++j) row.push_back(number_of(a[i][j], item(p, j)));
      out.push_back(std::move(row));
    }
  }
  template <class I>
  void integer(const char* k, I& v, I lo = std::numeric_limits<I>::min(), I hi = std::numeric_limits<I>::max()) {
    v = integer_of<I>(at(k), path(k), lo, hi);
  }
  template <class Seq, class I>
  void integers(const char* k, Seq& out, I lo = std::numeric_limits<I>::min()) {
    const json& a = array_at(k);
    out.clear();
    for (std::size_t i = 0; i < a.size(); ++i)
      out.push_back(integer_of<I>(a[i], item(path(k), i), lo, std::numeric_limits<I>::max()));
  }
  void integer_rows(const char* k, std::vector<std::vector<std::int64_t>>& out) {
    const json& a = array_at(k);
    out.clear();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const std::string p = item(path(k), i);
      if (!a[i].is_array()) fail(p, "expected an array, got " + kind(a[i]));
      std::vector<std::int64_t> row;
      for (std::size_t j = 0; j < a[i].size(); ++j)
        row.push_back(integer_of<std::int64_t>(a[i][j], item(p, j), std::numeric_limits<std::int64_t>::min(),
                                               kInt64Max));
      out.push_back(std::move(row));
    }
  }
  void flag(const char* k, bool& b) {
    const json& v = at(k);
    if (!v.is_boolean()) fail(path(k), "expected true or false, got " + kind(v));
    b = v.get<bool>();
  }
  template <class E, class Name>
  void choice(const char* k, E& e, std::initializer_list<E> all, Name name) {
    const std::string text = string_of(at(k), path(k));
    std::string names;
    for (E option : all) {
      if (name(option) == text) {
        e = option;
        return;
      }
      names += (names.empty() ? "" : ", ") + std::string(name(option));
    }
    fail(path(k), "expected one of " + names + ", got '" + text + "'");
  }
  template <class S>
  void object(const char* k, S& s) {
    Reader r(at(k), path(k), source_);
    fields(r, s);
  }
  template <class S>
  void maybe(const char* k, std::optional<S>& o) {
    const json& v = at(k);
    if (v.is_null()) {
      o.reset();
      return;
    }
    Reader r(v, path(k), source_);
    S s{};
    fields(r, s);
    o = std::move(s);
  }
  template <class S>
  void list(const char* k, std::vector<S>& out, std::size_t min_size = 0,
            std::size_t max_size = std::numeric_limits<std::size_t>::max(), Key key = Key::required) {
    if (key == Key::optional && !find(k)) return;
    const json& a = array_at(k, min_size, max_size);
    out.clear();
    for (std::size_t i = 0; i < a.size(); ++i) {
      Reader r(a[i], item(path(k), i), source_);
      S s{};
      fields(r, s);
      out.push_back(std::move(s));
    }
  }
  template <class F>
  void derived(const char* k, F&&, Expect e) {
    const json& v = at(k);
    bool ok = false;
    std::string want;
    switch (e) {
      case Expect::string: ok = v.is_string(), want = "a string"; break;
      case Expect::string_or_null: ok = v.is_string() || v.is_null(), want = "a string or null"; break;
      case Expect::number_or_null: ok = v.is_number() || v.is_null(), want = "a number or null"; break;
      case Expect::boolean: ok = v.is_boolean(), want = "true or false"; break;
      case Expect::count: ok = v.is_number_integer() && v.get<std::int64_t>() >= 0, want = "a whole number >= 0"; break;
      case Expect::strings:
        ok = v.is_array();
        for (const auto& s : v) ok = ok && s.is_string();
        want = "an array of strings";
        break;
    }
    if (!ok) fail(path(k), "expected " + want + ", got " + kind(v));
  }
  template <class W, class R>
  void custom(const char* k, W&&, R&& read) {
    read(at(k), path(k));
  }

 private:
  const json& j_;
  std::string path_;
  const std::string& source_;
};

// ---- the fields of each struct ----

template <class Io, Is<Tolerance> S>
void fields(Io& io, S& t) {
  io.real("atol", t.atol, 0.0);
  io.real("rtol", t.rtol, 0.0);
}

template <class Io, Is<ElementRef> S>
void fields(Io& io, S& w) {
  io.integers("index", w.index, std::int64_t{0});
  io.text("where", w.where);
  io.number("lhs", w.lhs);
  io.number("rhs", w.rhs);
}

template <class Io, Is<BaselineCheck> S>
void fields(Io& io, S& b) {
  io.text("side", b.side);
  io.number("error", b.err);
  io.number("baseline_error", b.baseline_err);
  io.number("ratio", b.ratio);
  io.real("k", b.k, 0.0);
  io.number("floor", b.floor);
  io.number("bound", b.bound);
  io.number("normwise", b.normwise);
  io.number("baseline_normwise", b.baseline_normwise);
  io.text_or_null("position_axis", b.position_axis);
  io.numbers("error_by_position", b.err_by_position);
  io.numbers("baseline_error_by_position", b.baseline_by_position);
  io.number_rows("error_by_head_position", b.err_by_head_position);
}

template <class Io, Is<TensorComparison> S>
void fields(Io& io, S& t) {
  io.text("name", t.name);
  io.integers("shape", t.shape, std::int64_t{0});
  io.object("tolerance", t.tolerance);
  io.flag("allclose", t.allclose);
  io.number("max_abs", t.max_abs);
  io.number("max_rel", t.max_rel);
  io.integer("numel", t.numel, std::int64_t{0}, kInt64Max);
  io.integer("mismatched", t.mismatched, std::int64_t{0}, kInt64Max);
  io.text_or_null("problem", t.problem);
  io.maybe("baseline", t.baseline);
  io.maybe("worst", t.worst);
  if constexpr (Io::reading)
    if (t.mismatched > t.numel)
      io.fail(io.path("mismatched"), std::to_string(t.mismatched) + " mismatched of " + std::to_string(t.numel) +
                                         " elements (numel)");
}

template <class Io, Is<HypothesisFit> S>
void fields(Io& io, S& f) {
  io.text("bug", f.bug);
  io.text("side", f.side);
  io.number("worst_ratio", f.worst_ratio);
  io.number("max_abs", f.max_abs);
  io.text("explanation", f.explanation, Key::optional);  // absent from older reports
  io.text("fix", f.fix, Key::optional);
}

template <class Io, Is<Finding> S>
void fields(Io& io, S& f) {
  io.text("kind", f.kind);
  io.text("relation", f.relation);
  io.text("side", f.side);
  io.texts("tensors", f.tensors);
  io.text("figure", f.figure);
  io.texts("confirmed_at", f.confirmed_at);
  io.text("sentence", f.sentence);
}

template <class Io, Is<Diagnosis> S>
void fields(Io& io, S& d) {
  io.derived("best", [&] { return d.best().empty() ? json(nullptr) : json(d.best()); }, Expect::string_or_null);
  io.list("fits", d.fits);
  io.list("near", d.near, 0, std::numeric_limits<std::size_t>::max(), Key::optional);
  io.text_or_null("judged_side", d.judged_side);
  io.text_or_null("correct_side", d.correct_side);
  io.texts("ruled_out", d.ruled_out);
  io.texts("evidence", d.evidence, Key::optional);
  io.list("findings", d.findings, 0, std::numeric_limits<std::size_t>::max(), Key::optional);
  io.text_or_null("reference_side", d.reference_side, Key::optional);
  io.text("sentence", d.sentence);
}

constexpr std::initializer_list<CaseStatus> kCaseStatuses = {CaseStatus::pass, CaseStatus::fail, CaseStatus::error,
                                                             CaseStatus::xfail, CaseStatus::xpass};

template <class Io, Is<LocalizationRow> S>
void fields(Io& io, S& row) {
  io.text("change", row.change);
  io.text("shape", row.shape);
  io.choice("status", row.status, kCaseStatuses, case_status_name);
  io.number("max_abs", row.max_abs);
  io.text("cause", row.cause);
}

template <class Io, Is<ErrorSpread> S>
void fields(Io& io, S& s) {
  io.text("tensor", s.tensor);
  io.numbers("per_head", s.per_head);
  io.numbers("per_position", s.per_position);
  io.numbers("per_batch", s.per_batch);
  io.number("tolerance", s.tolerance);
}

template <class Io, Is<Localization> S>
void fields(Io& io, S& loc) {
  io.list("rows", loc.rows);
  io.texts("depends_on", loc.depends_on);
  io.texts("independent_of", loc.independent_of);
  io.text("sentence", loc.sentence);
  io.text("where", loc.where);
  io.list("spread", loc.spread);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0); }

// The map's geometry as error_maps() makes it (error_maps.hpp): the HTML
// draws cell_rows x cell_cols cells and one separator per head block, so
// every count must follow from rows and cols and match the cells present.
void check_geometry(const Reader& io, const ErrorMap& m) {
  auto wrong = [&](const char* key, std::int64_t got, std::int64_t want, const std::string& rule) {
    io.fail(io.path(key), "expected " + std::to_string(want) + " (" + rule + "), got " + std::to_string(got));
  };
  if (m.row_step != ceil_div(m.rows, kMaxMapRows))
    wrong("row_step", m.row_step, ceil_div(m.rows, kMaxMapRows), "rows / " + std::to_string(kMaxMapRows) + ", rounded up");
  if (m.col_step != ceil_div(m.cols, kMaxMapCols))
    wrong("col_step", m.col_step, ceil_div(m.cols, kMaxMapCols), "cols / " + std::to_string(kMaxMapCols) + ", rounded up");
  if (m.cell_rows != ceil_div(m.rows, m.row_step))
    wrong("cell_rows", m.cell_rows, ceil_div(m.rows, m.row_step), "rows / row_step, rounded up");
  if (m.cell_cols != ceil_div(m.cols, m.col_step))
    wrong("cell_cols", m.cell_cols, ceil_div(m.cols, m.col_step), "cols / col_step, rounded up");
  const auto cells = static_cast<std::size_t>(m.cell_rows * m.cell_cols);  // at most 48 x 72 here
  if (m.cells.size() != cells)
    io.fail(io.path("cells"), "expected " + std::to_string(cells) + " numbers (cell_rows x cell_cols), got " +
                                  std::to_string(m.cells.size()));
}

template <class Io, Is<ErrorMap> S>
void fields(Io& io, S& m) {
  io.text("title", m.title);
  io.integer("rows", m.rows, std::int64_t{1}, kInt64Max);
  io.integer("cols", m.cols, std::int64_t{1}, kInt64Max);
  io.integer("row_step", m.row_step, std::int64_t{1}, kInt64Max);
  io.integer("col_step", m.col_step, std::int64_t{1}, kInt64Max);
  io.integer("cell_rows", m.cell_rows, std::int64_t{1}, kMaxMapRows);
  io.integer("cell_cols", m.cell_cols, std::int64_t{1}, kMaxMapCols);
  io.numbers("cells", m.cells);
  io.integer("row_block", m.row_block, std::int64_t{0}, m.rows);
  io.integer("col_block", m.col_block, std::int64_t{0}, m.cols);
  io.flag("position_rows", m.position_rows);
  if constexpr (Io::reading) check_geometry(io, m);
}

template <class Io, Is<TensorErrorMaps> S>
void fields(Io& io, S& t) {
  io.text("tensor", t.tensor);
  io.integers("shape", t.shape, std::int64_t{0});
  io.flag("allclose", t.allclose);
  io.number("vmax", t.vmax);
  io.flag("non_finite", t.non_finite);
  io.text("axes", t.axes);
  io.integer("batches", t.batches, std::int64_t{0}, kInt64Max);
  io.list("maps", t.maps, 1, static_cast<std::size_t>(kMaxMapBatch));
}

template <class Io, Is<SideResult> S>
void fields(Io& io, S& s) {
  io.text("plugin", s.plugin);
  io.choice("status", s.status,
            {SideStatus::ok, SideStatus::not_loaded, SideStatus::threw, SideStatus::crashed, SideStatus::timed_out,
             SideStatus::bad_output, SideStatus::non_finite},
            side_status_name);
  io.text_or_null("cause", s.cause);
  io.real("seconds", s.seconds, 0.0);
  io.real("compute_seconds", s.compute_seconds, 0.0);
  io.integer("peak_rss_bytes", s.peak_rss_bytes);
  io.integer("peak_tensor_bytes", s.peak_tensor_bytes);
}

template <class Io, Is<RopeCase> S>
void fields(Io& io, S& r) {
  io.real("theta", r.theta, std::numeric_limits<double>::min());
  io.choice("style", r.style, {RopeStyle::interleaved, RopeStyle::half}, rope_style_name);
  io.integer("rotary_dim", r.rotary_dim, std::int64_t{0}, kInt64Max);
  io.integer("offset", r.offset);
  io.integer_rows("positions", r.rows);
  io.flag("per_row", r.per_row);
  io.text("generator", r.generator);
  io.integer("start", r.start);
  io.integer("q_offset", r.q_offset);
  io.derived("description", [&] { return r.describe(); }, Expect::string);
}

template <class Io, Is<WeakSuiteWarning> S>
void fields(Io& io, S& w) {
  io.text("condition", w.condition);
  io.texts("bugs", w.bugs);
  io.text("message", w.message);
}

template <class Io, Is<SourceLoc> S>
void fields(Io& io, S& s) {
  io.text("file", s.file);
  io.integer("line", s.line, 0, std::numeric_limits<int>::max());
  io.integer("column", s.column, 0, std::numeric_limits<int>::max());
}

template <class Io, class S>
  requires Is<S, CaseSpec>
void expect_fields(Io& io, S& c) {
  io.flag("fail", c.expect_fail);
  io.text_or_null("diagnosis", c.expect_diagnosis);
}
// What a case's spec is read from: the fields the reports show (describe_case,
// the pair, tolerances, the suite position), not its files.
template <class Io, Is<CaseSpec> S>
void spec_fields(Io& io, S& c) {
  io.text("name", c.name);
  io.text("base_name", c.base_name);
  io.derived("source", [&] { return c.source.str(); }, Expect::string);
  io.object("source_at", c.source);
  io.choice("level", c.level, {Level::mha, Level::core, Level::rope}, level_name);
  io.custom(
      "shape",
      [&] {
        json dims = json::object();
        for (const auto& d : dim_names(c.level))
          if (c.dims.get(d) > 0) dims[d] = c.dims.get(d);
        for (const auto& d : optional_dim_names(c.level))  // Hkv and an mha-level d, when given
          if (c.dims.get(d) > 0) dims[d] = c.dims.get(d);
        return dims;
      },
      [&](const json& v, const std::string& p) {
        if constexpr (Io::reading) {
          if (!v.is_object()) io.fail(p, "expected an object, got " + kind(v));
          for (const auto& [d, n] : v.items()) {
            std::int64_t* dim = c.dims.find(d);
            if (!dim) io.fail(p, "unknown dim '" + d + "'");
            *dim = io.template integer_of<std::int64_t>(n, p + "." + d, 1, kInt64Max);
          }
        }
      });
  io.custom(
      "sweep",
      [&] {
        json sweep = json::object();
        for (const auto& [d, v] : c.sweep_point) sweep[d] = v;
        return sweep;
      },
      [&](const json& v, const std::string& p) {
        if constexpr (Io::reading) {
          if (!v.is_object()) io.fail(p, "expected an object, got " + kind(v));
          for (const auto& [d, n] : v.items())
            c.sweep_point.emplace_back(
                d, io.template integer_of<std::int64_t>(n, p + "." + d, std::numeric_limits<std::int64_t>::min(),
                                                        kInt64Max));
        }
      });
  io.derived("description", [&] { return describe_case(c); }, Expect::string);
  io.choice("dtype", c.dtype, {DType::float64, DType::float32, DType::bfloat16, DType::float16}, dtype_name);
  io.flag("causal", c.causal);
  io.custom(
      "causal_alignment",
      [&] { return c.causal ? json(causal_alignment_name(c.causal_alignment)) : json(nullptr); },
      [&](const json& v, const std::string& p) {
        if constexpr (Io::reading) {
          if (!c.causal) {
            if (!v.is_null()) io.fail(p, "expected null (the case is not causal), got " + kind(v));
            return;
          }
          io.choice("causal_alignment", c.causal_alignment,
                    {CausalAlignment::top_left, CausalAlignment::bottom_right}, causal_alignment_name);
        }
      });
  io.custom(
      "scale", [&] { return c.scale ? json(*c.scale) : json(nullptr); },
      [&](const json& v, const std::string& p) {
        if constexpr (Io::reading) {
          if (v.is_null()) return;
          if (!v.is_number() || !std::isfinite(v.get<double>()) || !(v.get<double>() > 0))
            io.fail(p, "expected a number > 0 or null, got " + shown(v));
          c.scale = v.get<double>();
        }
      });
  io.custom(
      "mask", [&] { return c.mask_file.empty() ? json(nullptr) : json(c.mask_file.string()); },
      [&](const json& v, const std::string& p) {
        if constexpr (Io::reading) c.mask_file = v.is_null() ? std::string() : io.string_of(v, p);
      });
  io.choice("input_layout", c.layout, {InputLayout::contiguous, InputLayout::transposed, InputLayout::sliced},
            layout_name);
  io.flag("bias", c.bias);
  // QK-norm: null when off, else {axis, eps, gain}; cross: k and v from x_kv
  io.custom(
      "qk_norm",
      [&] {
        if (!c.qk_norm.enabled) return json(nullptr);
        return json{{"axis", qk_norm_axis_name(c.qk_norm.axis)}, {"eps", c.qk_norm.eps},
                    {"gain", qk_norm_gain_name(c.qk_norm.gain)}};
      },
      [&](const json& v, const std::string& p) {
        if constexpr (Io::reading) {
          c.qk_norm = QkNormSpec{};
          if (v.is_null()) return;
          if (!v.is_object()) io.fail(p, "expected null or an object {axis, eps, gain}, got " + kind(v));
          for (const char* k : {"axis", "eps", "gain"})
            if (!v.contains(k)) io.fail(p + "." + k, "missing");
          const std::string axis = io.string_of(v["axis"], p + ".axis"), gain = io.string_of(v["gain"], p + ".gain");
          if (axis != "head" && axis != "model") io.fail(p + ".axis", "expected head or model, got " + shown(v["axis"]));
          if (gain != "w" && gain != "one_plus_w") io.fail(p + ".gain", "expected w or one_plus_w, got " + shown(v["gain"]));
          c.qk_norm.enabled = true;
          c.qk_norm.axis = axis == "head" ? QkNormAxis::head : QkNormAxis::model;
          c.qk_norm.gain = gain == "w" ? QkNormGain::w : QkNormGain::one_plus_w;
          c.qk_norm.eps = io.number_of(v["eps"], p + ".eps");
        }
      });
  io.flag("cross", c.cross);
  // sliding windows, soft-capping, sinks: window {left, right} (a bound null
  // when unbounded; null without a window), softcap 0 when off, sinks a flag
  io.custom(
      "window",
      [&] {
        if (!c.window.enabled()) return json(nullptr);
        json w = json::object();
        w["left"] = c.window.left ? json(*c.window.left) : json(nullptr);
        w["right"] = c.window.right ? json(*c.window.right) : json(nullptr);
        return w;
      },
      [&](const json& v, const std::string& p) {
        if constexpr (Io::reading) {
          c.window = {};
          if (v.is_null()) return;
          if (!v.is_object()) io.fail(p, "expected null or an object {left, right}, got " + kind(v));
          for (const char* side : {"left", "right"}) {
            if (!v.contains(side)) io.fail(p + "." + side, "missing");
            if (v[side].is_null()) continue;
            (std::string(side) == "left" ? c.window.left : c.window.right) =
                io.template integer_of<std::int64_t>(v[side], p + "." + side, 0, kMaxWindowBound);
          }
          if (!c.window.enabled()) io.fail(p, "expected at least one bound (a case without a window has null)");
        }
      });
  io.real("softcap", c.softcap, 0.0);
  io.flag("sinks", c.sinks);
  io.integer("seed", c.seed);
  io.texts("compare", c.compare);
  io.custom(
      "reference", [&] { return c.is_reference() ? json(c.reference_text) : json(nullptr); },
      [&](const json& v, const std::string& p) {
        if constexpr (Io::reading) {
          c.reference_text = v.is_null() ? std::string() : io.string_of(v, p);
          c.reference = c.reference_text;
        }
      });
  if constexpr (Io::reading)  // the reports name both sides: compare.at(0), and at(1) without a reference
    if (c.compare.size() != (c.is_reference() ? 1u : 2u))
      io.fail(io.path("compare"), std::string("expected ") + (c.is_reference() ? "1 plugin (the case has a reference)"
                                                                                 : "2 plugins (the case has no reference)") +
                                      ", got " + std::to_string(c.compare.size()));
  io.texts("check", c.check);
  io.custom(
      "tolerance",
      [&] {
        json tolerances = json::object();
        for (const auto& name : c.check) {
          json t;
          Writer w(t, false);
          const Tolerance tol = c.tolerance_for(name);
          fields(w, tol);
          tolerances[name] = std::move(t);
        }
        return tolerances;
      },
      [&](const json& v, const std::string& p) {
        if constexpr (Io::reading) {
          if (!v.is_object()) io.fail(p, "expected an object, got " + kind(v));
          for (const auto& [name, t] : v.items()) {
            Reader r(t, p + "." + name, io.source());
            Tolerance tol;
            fields(r, tol);
            c.tensor_tolerance[name] = tol;
          }
        }
      });
  io.object("default_tolerance", c.tolerance);
  io.custom(
      "tolerance_rule", [&] { return c.relative_rule() ? "relative_to_baseline" : "allclose"; },
      [&](const json&, const std::string&) {
        if constexpr (Io::reading)
          io.choice("tolerance_rule", c.tolerance_rule, {ToleranceRule::allclose, ToleranceRule::relative_to_baseline},
                    [](ToleranceRule r) {
                      return std::string_view(r == ToleranceRule::allclose ? "allclose" : "relative_to_baseline");
                    });
      });
  io.custom(
      "expect",
      [&] {
        json e;
        Writer w(e, false);
        expect_fields(w, c);
        return e;
      },
      [&](const json& v, const std::string& p) {
        if constexpr (Io::reading) {
          Reader r(v, p, io.source());
          expect_fields(r, c);
        }
      });
  io.maybe("rope", c.rope);
  io.texts("taps", c.taps);
  io.real("timeout", c.timeout_s, 0.0);
}

template <class Io, Is<CaseResult> S>
void fields(Io& io, S& r) {
  spec_fields(io, r.spec);
  io.choice("status", r.status, kCaseStatuses, case_status_name);
  io.derived("passed", [&] { return is_success(r.status); }, Expect::boolean);
  io.text_or_null("cause", r.cause);
  io.text("lhs", r.lhs_label);
  io.text("rhs", r.rhs_label);
  io.text_or_null("golden", r.golden_label, Key::optional);
  io.text_or_null("baseline", r.baseline_label, Key::optional);
  io.derived("max_abs", [&] { return std::isfinite(r.max_abs()) ? json(r.max_abs()) : json(nullptr); },
             Expect::number_or_null);
  io.real("seconds", r.seconds, 0.0);
  io.list("sides", r.sides);
  io.list("tensors", r.tensors);
  io.text_or_null("mutant", r.mutant);
  io.maybe("diagnosis", r.diagnosis);
  io.maybe("localization", r.localization);
  io.list("error_maps", r.error_maps);
}

// Replaces invalid UTF-8 in every string value (dump() would throw on it); returns how many bytes.
std::size_t make_valid_utf8(json& j) {
  std::size_t replaced = 0;
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    std::size_t here = 0;
    std::string fixed = valid_utf8(s, &here);
    if (here) j = std::move(fixed);
    replaced += here;
  } else if (j.is_structured()) {
    for (auto& item : j) replaced += make_valid_utf8(item);
  }
  return replaced;
}

template <class Io, Is<SuiteIdentity> S>
void fields(Io& io, S& id) {
  io.text("file_hash", id.file_hash);
  io.text("cases_hash", id.cases_hash);
  io.integer("selected", id.selected, std::size_t{0}, kMaxSuiteCases);
  io.integer("expanded", id.expanded, id.selected, kMaxSuiteCases);
  io.texts("case_hashes", id.case_hashes);
  if constexpr (Io::reading)
    if (id.case_hashes.size() != id.selected)
      io.fail(io.path("case_hashes"), "expected " + std::to_string(id.selected) + " hashes (one per selected case), got " +
                                          std::to_string(id.case_hashes.size()));
}

// The shard block: which part of the suite this is and its cases' indices.
struct ShardFields {
  ShardSpec& shard;
  std::vector<std::size_t>& indices;
};
struct ConstShardFields {
  const ShardSpec& shard;
  const std::vector<std::size_t>& indices;
};
template <class Io, class S>
  requires Is<S, ShardFields> || Is<S, ConstShardFields>
void fields(Io& io, S& s) {
  io.integer("index", s.shard.index, std::size_t{1});
  io.integer("count", s.shard.count, std::size_t{1});
  io.integers("cases", s.indices, std::size_t{0});
}

template <class Io, Is<SuiteResult> S>
void fields(Io& io, S& result) {
  io.derived("headgrad_version", [] { return HEADGRAD_VERSION; }, Expect::string);
  io.text("suite", result.name);
  io.custom(
      "file", [&] { return result.file.string(); },
      [&](const json& v, const std::string& p) {
        if constexpr (Io::reading) result.file = io.string_of(v, p);
      });
  io.custom(
      "summary",
      [&] {
        json counts = json::object();
        for (CaseStatus s : kCaseStatuses) counts[std::string(case_status_name(s))] = result.count(s);
        return json{{"cases", result.cases.size()}, {"passed", result.passed()}, {"failed", result.failed()},
                    {"counts", counts},  {"seconds", result.seconds},  {"exit_code", result.exit_code()}};
      },
      [&](const json& v, const std::string& p) {
        if constexpr (Io::reading) {
          Reader r(v, p, io.source());
          r.real("seconds", result.seconds, 0.0);
          for (const char* k : {"cases", "passed", "failed", "exit_code"}) r.derived(k, [] { return 0; }, Expect::count);
          Reader counts(r.at("counts"), r.path("counts"), io.source());
          for (CaseStatus s : kCaseStatuses)
            counts.derived(std::string(case_status_name(s)).c_str(), [] { return 0; }, Expect::count);
        }
      });
  io.custom(
      "mutation_score",
      [&] {
        const MutationScore m = result.mutation_score();
        return m.mutants == 0 ? json(nullptr) : json{{"mutants", m.mutants}, {"caught", m.caught}, {"named", m.named}};
      },
      [&](const json& v, const std::string& p) {  // recomputed from the cases: only checked
        if constexpr (Io::reading) {
          if (v.is_null()) return;
          Reader r(v, p, io.source());
          for (const char* k : {"mutants", "caught", "named"}) r.derived(k, [] { return 0; }, Expect::count);
        }
      });
  io.list("warnings", result.warnings);
  if constexpr (Io::reading) {
    ShardFields shard{result.shard, result.case_indices};
    io.object("shard", shard);
  } else {
    ConstShardFields shard{result.shard, result.case_indices};
    io.object("shard", shard);
  }
  io.object("suite_identity", result.identity);
  io.list("cases", result.cases);
  io.derived("notes", [] { return json::array(); }, Expect::strings);  // json_report fills it
  if constexpr (Io::reading)
    if (result.case_indices.size() != result.cases.size())
      io.fail(io.path("shard") + ".cases", "lists " + std::to_string(result.case_indices.size()) +
                                               " case indices for " + std::to_string(result.cases.size()) + " cases");
}

}  // namespace

nlohmann::json case_report_json(const CaseResult& r, bool exact) {
  json j;
  Writer w(j, exact);
  fields(w, r);
  return j;
}

nlohmann::json json_report(const SuiteResult& result, bool exact) {
  json report;
  Writer w(report, exact);
  fields(w, result);
  json notes = json::array();
  if (const std::size_t replaced = make_valid_utf8(report)) notes.push_back(text_replaced_note(replaced));
  report["notes"] = notes;
  return report;
}

CaseResult case_result_from_json(const nlohmann::json& j, const CaseSpec* spec, const std::string& source) {
  CaseResult r;
  Reader reader(j, "$", source);
  fields(reader, r);
  if (spec) r.spec = *spec;
  r.spec.files.reset();
  return r;
}

SuiteResult suite_result_from_json(const nlohmann::json& j, const std::string& source) {
  SuiteResult result;
  Reader reader(j, "$", source);
  fields(reader, result);
  return result;
}

}  // namespace headgrad::runner
