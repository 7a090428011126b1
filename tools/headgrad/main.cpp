// headgrad: the command-line program.
//
//   headgrad run SUITE.yaml [--plugin-path DIR]... [--filter GLOB] [--json FILE]
//                [--junit FILE] [--html FILE] [--timeout SEC] [--max-memory SIZE] [--no-isolation]
//                [--probe-timeout SEC] [-j N] [--shard K/N] [-v | -q]
//   headgrad merge SHARD.json... [--json FILE] [--junit FILE] [--html FILE] [-q]
//   headgrad plugins [--plugin-path DIR]... [--all] [--json] [--strict] [--probe-timeout SEC]
//   headgrad export SUITE.yaml --case NAME [--plugin NAME] --out DIR [--max-memory SIZE]
//   headgrad bench [SUITE.yaml] ...          (tools/bench)
//   headgrad new-plugin NAME DIR             (tools/template)
//
// Every subcommand is wired the same way: add_<name>_command(app, exit_code)
// declares its flags and a callback that runs it and sets exit_code. run,
// plugins, export and merge live here, each as its args struct, its cmd_<name>
// function and its add_<name>_command; bench and new-plugin in their modules.
//
// Exit codes (docs/design.md): 0 every case as expected; 1 a comparison failed;
// 2 bad usage, config or input file; 3 a plugin could not be loaded or crashed;
// 4 headgrad could not do its own work (fork, pipe, poll, out of memory, a
// broken invariant): exit_code_for below, one place for every subcommand.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <headgrad/blas.hpp>
#include <headgrad/child_process.hpp>
#include <headgrad/log.hpp>
#include <headgrad/npy.hpp>
#include <nlohmann/json.hpp>

#include "analysis/analyze.hpp"
#include "job/run_suite.hpp"
#include "job/workers.hpp"
#include "bench.hpp"
#include "case/budget.hpp"
#include "case/inputs.hpp"
#include "case/reads.hpp"
#include "case/suite.hpp"
#include "judge/golden.hpp"
#include "judge/run_case.hpp"
#include "report/report.hpp"
#include "template/template.hpp"
#include "pyplug/check_suite.hpp"
#include "pyplug/python_plugin.hpp"

#ifndef HEADGRAD_VERSION
#define HEADGRAD_VERSION "unknown"
#endif

namespace fs = std::filesystem;
using namespace headgrad;
using namespace headgrad::runner;
using headgrad::runner::run_suite;

namespace {

constexpr int kExitOk = 0, kExitFailed = 1, kExitUsage = 2, kExitPlugin = 3, kExitInternal = 4;
// HEADGRAD_NUM_THREADS at most: past a few thousand, threads fail to start with an error naming nothing.
constexpr long kMaxThreads = 1024;

struct CommonArgs {
  std::vector<std::string> plugin_paths;
  double probe_timeout = ProbeOptions{}.timeout_s;
  int verbose = 0;
  bool quiet = false;
};

struct RunArgs : CommonArgs {
  std::string suite, filter, json, junit, html;
  std::optional<std::string> max_memory, shard;  // given (even as '') or not
  std::optional<double> timeout;
  std::optional<std::size_t> jobs;
  bool no_isolation = false;
};

struct MergeArgs {
  std::vector<std::string> reports;
  std::string json, junit, html;
  bool quiet = false;
};

struct PluginsArgs : CommonArgs {
  bool all = false, json = false, strict = false;
};

struct ExportArgs : CommonArgs {
  std::string suite, case_name, plugin, out;
  std::optional<std::string> max_memory;
  std::optional<double> timeout;
  bool no_isolation = false;
};

void add_common(CLI::App* cmd, CommonArgs& a, bool with_quiet = true) {
  cmd->add_option("--plugin-path", a.plugin_paths,
                  "a folder (searched recursively) or a plugin file; repeatable. Searched before "
                  "HEADGRAD_PLUGIN_PATH (colon-separated) and the built or installed plugin folder")
      ->type_name("DIR")
      ->allow_extra_args(false);
  cmd->add_option("--probe-timeout", a.probe_timeout,
                  "time limit in seconds for probing each plugin library (loading it, its checks, its factory "
                  "and info(), in a child process)")
      ->type_name("SEC")
      ->check(CLI::Validator(
          [](std::string& text) {  // CLI::Range lets NaN through (every comparison with it is false)
            double t = 0;
            std::istringstream in(text);
            if (!(in >> t) || !in.eof() || !(t >= 0.01 && t <= 3600.0))
              return "must be a number of seconds in [0.01, 3600], got '" + text + "'";
            return std::string();
          },
          "FLOAT in [0.01 - 3600]"))
      ->capture_default_str();
  CLI::Option* v = cmd->add_flag("-v,--verbose", a.verbose, "more detail (every tensor's figures); -vv: debug logs");
  if (with_quiet) {
    CLI::Option* q = cmd->add_flag("-q,--quiet", a.quiet, "only what did not go as expected, and the summary");
    v->excludes(q);
  }
}

// -v, -q and HEADGRAD_LOG_LEVEL (read by the core when a logger is first used)
void apply_verbosity(const CommonArgs& a) {
  if (a.quiet) logging::set_level(spdlog::level::err);
  else if (a.verbose >= 2) logging::set_level(spdlog::level::debug);
  else if (a.verbose == 1) logging::set_level(spdlog::level::info);
  else logging::core();  // the environment's level, or warn
}

std::vector<fs::path> search_path(const CommonArgs& a) {
  std::vector<fs::path> dirs(a.plugin_paths.begin(), a.plugin_paths.end());
  return plugin_search_path(dirs);
}

// Every library on the search path probed (in child processes); none loaded here yet.
PluginRegistry probed_registry(const CommonArgs& a) {
  ProbeOptions options;
  options.timeout_s = a.probe_timeout;
  PluginRegistry registry(options);
  registry.probe_directories(search_path(a));
  return registry;
}

// The suite's Python functions (its `plugins:` block) next to the libraries:
// a name clash is the suite's error, at the plugin's line.
void add_python_plugins(PluginRegistry& registry, const Suite& suite) {
  for (const auto& d : suite.python_plugins) {
    try {
      registry.add(pyplug::make_python_plugin(d));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(d.origin + ": " + e.what());
    }
  }
}

// The plugins these cases compare, each once, in order.
std::vector<std::string> plugins_named_by(const std::vector<const CaseSpec*>& cases) {
  std::vector<std::string> names;
  for (const CaseSpec* c : cases)
    for (const auto& name : c->compare)
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  return names;
}

bool stdout_colors() {
  const char* term = std::getenv("TERM");
  return ::isatty(STDOUT_FILENO) && !std::getenv("NO_COLOR") && !(term && std::string(term) == "dumb");
}

void error(const std::string& message) { std::cerr << "headgrad: error: " << terminal_safe(message) << "\n"; }

// "[12/133] 1 failed, 4.2 s" on stderr, on a terminal, once the run has
// taken a few seconds; cleared before each report line, so never mixed in.
class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled), start_(std::chrono::steady_clock::now()) {}
  void set_total(std::size_t total) { total_ = total; }
  void case_done(bool failed) {
    ++done_;
    failed_ += failed ? 1 : 0;
  }
  // Redraws the line, at most every 200 ms once the run has taken 2 s.
  void tick() {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - start_ < std::chrono::seconds(2) || (shown_ && now - drawn_ < std::chrono::milliseconds(200))) return;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f s", elapsed);
    std::cerr << "\r\033[K[" << done_ << "/" << total_ << "] " << failed_ << " failed, " << seconds << std::flush;
    shown_ = true;
    drawn_ = now;
  }
  void clear() {
    if (!shown_) return;
    std::cerr << "\r\033[K" << std::flush;
    shown_ = false;
  }

 private:
  bool enabled_;
  bool shown_ = false;
  std::size_t total_ = 0, done_ = 0, failed_ = 0;
  std::chrono::steady_clock::time_point start_, drawn_;
};

// Plugins that the cases name but that did not load: said once, up front,
// with the rejected library that would have provided it, if one would.
// A plugin the selected cases name that is not loaded stops the run before
// any case (exit 3): one message naming each such plugin, the cases that
// need it, why (a rejected library) or where it was searched, and the fix.
bool report_missing_plugins(const std::vector<const CaseSpec*>& cases, const PluginRegistry& registry,
                            const std::vector<fs::path>& searched) {
  std::vector<std::string> found_names;
  for (const auto& f : registry.found()) found_names.push_back(f.info.name);
  std::vector<std::string> parts;
  bool not_found = false;
  for (const auto& name : plugins_named_by(cases)) {
    if (registry.find(name)) continue;
    std::vector<std::string> users;
    for (const CaseSpec* c : cases)
      if (std::find(c->compare.begin(), c->compare.end(), name) != c->compare.end()) users.push_back(c->name);
    std::string part = "plugin " + name;
    const auto skipped = registry.rejections_for(name);
    if (skipped.empty()) {
      not_found = true;
      const std::string near = closest_match(name, found_names);
      part += " is not found" + (near.empty() ? "" : " (did you mean '" + near + "'?)");
    } else {
      part += " is not loaded";
      for (const PluginRejection* r : skipped) part += "; skipped the rejected library " + r->file.string() + ": " + r->reason;
    }
    parts.push_back(part + " (needed by " + join(users) + ")");
  }
  if (parts.empty()) return false;
  std::vector<std::string> dirs;
  for (const auto& d : searched) dirs.push_back(d.string());
  std::string message = join(parts, "; ") + "; searched: " + (dirs.empty() ? "no folder" : join(dirs)) + ".";
  if (not_found)
    message += " Add the folder that holds it with --plugin-path DIR (or HEADGRAD_PLUGIN_PATH); "
               "`headgrad plugins` lists what is found.";
  error(message);
  return true;
}

// A plugin taken from an earlier folder than another library of the same
// name: said, so that a shadowed oracle never goes unnoticed.
void report_shadowed_plugins(const PluginRegistry& registry) {
  for (const auto& p : registry.plugins())
    for (const PluginRejection* r : registry.rejections_for(p.info.name))
      if (r->shadowed_by == p.file)
        std::cerr << "headgrad: plugin " << p.info.name << " comes from " << p.file.string() << ", which shadows "
                  << r->file.string() << " (earlier folders on the search path win)\n";
}

// Refuses (ConfigError, exit 2) a case that cannot fit, before any input is made.
void check_memory_budget(const std::vector<const CaseSpec*>& cases, const std::optional<std::string>& max_memory) {
  std::optional<double> limit;
  if (max_memory) {  // '' is a size too, and a wrong one
    try {
      limit = parse_size(*max_memory);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--max-memory: ") + e.what());
    }
  }
  const MemoryBudget budget = memory_budget(limit);
  check_memory(cases, budget.bytes, budget.source);
}

void add_max_memory(CLI::App* cmd, std::optional<std::string>& value) {
  cmd->add_option("--max-memory", value,
                  "refuse (exit 2) a case whose estimated memory (inputs, outputs, gradients, score buffers) "
                  "exceeds SIZE, like 4G or 512M (default: the machine's physical memory)")
      ->type_name("SIZE");
}

// --timeout: positive, finite, at most a day (NaN or 1e16 would overflow the deadline).
CLI::Validator timeout_check() {
  return CLI::Validator(
      [](std::string& text) {
        double t = 0;
        std::istringstream in(text);
        if (!(in >> t) || !in.eof()) return std::string("must be a number of seconds, got '" + text + "'");
        return timeout_problem(t);
      },
      "FLOAT in (0 - 86400]");
}

// --json, --junit, --html (each when given); false (said) when one cannot be written.
bool write_reports(const SuiteResult& result, const std::string& json, const std::string& junit,
                   const std::string& html) {
  try {  // every report rendered, then all written or none
    std::vector<std::pair<fs::path, std::string>> files;
    if (!json.empty())
      files.emplace_back(json,
                         json_report(result).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    if (!junit.empty()) files.emplace_back(junit, junit_report(result));
    if (!html.empty()) files.emplace_back(html, html_report(result));
    write_reports_all_or_none(files);
  } catch (const std::exception& e) {
    error(e.what());
    return false;
  }
  return true;
}

// The report files asked for, as check_outputs takes them.
std::vector<std::pair<std::string, fs::path>> report_outputs(const std::string& json, const std::string& junit,
                                                             const std::string& html) {
  std::vector<std::pair<std::string, fs::path>> outputs;
  if (!json.empty()) outputs.emplace_back("--json", json);
  if (!junit.empty()) outputs.emplace_back("--junit", junit);
  if (!html.empty()) outputs.emplace_back("--html", html);
  return outputs;
}

int cmd_run(const RunArgs& a) {
  apply_verbosity(a);
  const Suite suite = load_suite(a.suite);
  const std::vector<const CaseSpec*> selected = select_cases(suite, a.filter);
  if (selected.empty()) {
    std::string names;
    for (const auto& c : suite.cases) names += (names.empty() ? "" : ", ") + c.name;
    error("no case of " + a.suite + " matches --filter '" + a.filter + "' (cases: " + names + ")");
    return kExitUsage;
  }
  // --shard wins over GTEST_SHARD_INDEX / GTEST_TOTAL_SHARDS (then not even read).
  const ShardSpec shard = a.shard ? parse_shard(*a.shard) : shard_from_environment().value_or(ShardSpec{});
  if (a.no_isolation && a.jobs.value_or(1) > 1)
    throw std::invalid_argument("-j " + std::to_string(*a.jobs) +
                                " needs isolation: --no-isolation runs every case in this process, one at a time");
  check_memory_budget(selected, a.max_memory);
  check_outputs(report_outputs(a.json, a.junit, a.html), run_reads(suite, selected));
  // Only the plugins the selected cases name are loaded into this process.
  PluginRegistry registry = probed_registry(a);
  add_python_plugins(registry, suite);
  registry.load(plugins_named_by(selected));
  // The oracle of the relative_to_baseline rule (golden and baseline), when it is on the path.
  if (std::any_of(selected.begin(), selected.end(), [](const CaseSpec* c) { return c->relative_rule(); }))
    registry.load({"per_head"});
  if (report_missing_plugins(selected, registry, search_path(a))) return kExitPlugin;
  report_shadowed_plugins(registry);
  check_capabilities(selected, registry);
  check_goldens(selected, registry);
  if (a.no_isolation && a.timeout)
    logging::runner()->warn("--timeout has no effect with --no-isolation (plugins run in this process)");

  const TerminalStyle style = terminal_style(selected, stdout_colors(), a.quiet, a.verbose > 0);
  print_header(std::cout, suite, selected.size(), registry, style);
  if (!a.quiet && shard.count > 1)
    std::cout << "shard " << shard.str() << ": " << shard_cases(selected, shard).size() << " of the " << selected.size()
              << " cases\n";
  Progress progress(::isatty(STDERR_FILENO) && !a.quiet);
  progress.set_total(shard_cases(selected, shard).size());
  RunOptions options;
  options.isolate = !a.no_isolation;
  options.timeout_s = a.timeout;
  options.filter = a.filter;
  options.shard = shard;
  options.jobs = a.jobs.value_or(default_jobs(shard_cases(selected, shard).size(), options.isolate));
  // A worker served by the calling Python process (headgrad.check) has one connection: one case at a time.
  if (pyplug::external_worker() && !suite.python_plugins.empty()) options.jobs = 1;
  options.threads_per_case = options.jobs > 1 ? threads_per_case(options.jobs) : 0;
  logging::runner()->info("{} case(s) at once, {} plugin thread(s) each", options.jobs,
                          options.jobs > 1 ? std::to_string(options.threads_per_case) : "default");
  options.on_case_start = [&](std::size_t, std::size_t, const CaseSpec&) { progress.tick(); };
  options.on_wait = [&] { progress.tick(); };
  options.on_case_done = [&](const CaseResult& r) {
    progress.clear();
    progress.case_done(!is_success(r.status));
    print_case(std::cout, r, style);
    std::cout.flush();
    progress.tick();
  };
  const SuiteResult result = run_suite(suite, registry, options);
  progress.clear();
  print_summary(std::cout, result, style);

  if (!write_reports(result, a.json, a.junit, a.html)) return kExitUsage;
  return result.exit_code();
}

void add_run_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* run = app.add_subcommand("run", "Run a YAML suite: each case compares two plugins, or one plugin "
                                            "against a reference directory, on the output and every gradient.");
  run->add_option("suite", args->suite, "the suite (YAML)")->required()->check(CLI::ExistingFile)->type_name("SUITE.yaml");
  add_common(run, *args);
  run->add_option("--filter", args->filter,
                  "only the cases whose name matches this glob (*, ?, [..]); a sweep's points also match "
                  "by the case's own name")
      ->type_name("GLOB");
  run->add_option("--json", args->json, "write the JSON report here")->type_name("FILE");
  run->add_option("--junit", args->junit, "write a JUnit XML report here (for CI)")->type_name("FILE");
  run->add_option("--html", args->html, "write a self-contained HTML report here")->type_name("FILE");
  run->add_option("--timeout", args->timeout,
                  "time limit in seconds for each plugin run; overrides every case's 'timeout' (default 60)")
      ->type_name("SEC")
      ->check(timeout_check());
  add_max_memory(run, args->max_memory);
  run->add_option("-j,--jobs", args->jobs,
                  "how many cases run at once, each in its own process with cores / N plugin threads; the output "
                  "is in suite order, as a serial run's. Default: 1 on one core, for fewer than 4 cases or with "
                  "--no-isolation; otherwise one case per core at 1 thread each (cores / HEADGRAD_NUM_THREADS "
                  "cases when that is set)")
      ->type_name("N")
      ->check(CLI::Range(std::size_t{1}, std::size_t{1024}));
  run->add_option("--shard", args->shard,
                  "run shard K of N (1-based: 1/3, 2/3, 3/3): every N-th selected case from the K-th, counted after "
                  "--filter and after sweeps are expanded; `headgrad merge` joins the shards' --json reports. Without it, "
                  "GTEST_SHARD_INDEX (0-based) and GTEST_TOTAL_SHARDS select a shard; --shard wins over them")
      ->type_name("K/N");
  run->add_flag("--no-isolation", args->no_isolation,
                "run plugins in this process instead of a forked child (for a debugger); a crash or hang then "
                "takes the runner down and --timeout has no effect");
  run->callback([args, &exit_code] { exit_code = cmd_run(*args); });
}

int cmd_merge(const MergeArgs& a) {
  if (a.quiet) logging::set_level(spdlog::level::err);
  std::vector<fs::path> files(a.reports.begin(), a.reports.end());
  std::vector<ReadPath> inputs;
  for (const auto& f : files) inputs.push_back({"a shard report", f, false});
  check_outputs(report_outputs(a.json, a.junit, a.html), inputs);
  const SuiteResult result = merge_shard_reports(files);
  std::vector<const CaseSpec*> specs;
  for (const auto& c : result.cases) specs.push_back(&c.spec);
  const TerminalStyle style = terminal_style(specs, stdout_colors(), a.quiet, false);
  if (!a.quiet)
    std::cout << "suite " << terminal_safe(result.name) << " (" << terminal_safe(result.file.string()) << "): "
              << files.size() << " shard" << (files.size() > 1 ? "s" : "") << " merged, " << result.cases.size()
              << " cases\n";
  for (const auto& c : result.cases) print_case(std::cout, c, style);
  print_summary(std::cout, result, style);
  if (!write_reports(result, a.json, a.junit, a.html)) return kExitUsage;
  return result.exit_code();
}

void add_merge_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<MergeArgs>();
  CLI::App* merge = app.add_subcommand(
      "merge", "Join the JSON reports of the shards of one suite (each from headgrad run --shard K/N --json FILE) "
               "into one report in suite order, printed as run prints it, with the exit code the whole suite "
               "would have had. Refused with exit 2, naming the file: a file that is not a headgrad JSON report, "
               "shards of different suites (another suite file, or the same file with other cases), of different "
               "shard counts, a shard missing or given twice.");
  merge->add_option("reports", args->reports, "every shard's --json report, in any order")
      ->required()
      ->check(CLI::ExistingFile)
      ->type_name("SHARD.json");
  merge->add_option("--json", args->json, "write the merged JSON report here")->type_name("FILE");
  merge->add_option("--junit", args->junit, "write a JUnit XML report of the merged result here")->type_name("FILE");
  merge->add_option("--html", args->html, "write a self-contained HTML report of the merged result here")
      ->type_name("FILE");
  merge->add_flag("-q,--quiet", args->quiet, "only what did not go as expected, and the summary");
  merge->footer(
      "Exit codes: 0 every case of the suite as expected; 1 a comparison failed in some shard; 2 bad usage or a\n"
      "report refused; 3 a plugin could not be loaded or crashed in some shard; 4 headgrad could not do its own\n"
      "work.");
  merge->callback([args, &exit_code] { exit_code = cmd_merge(*args); });
}

int cmd_plugins(const PluginsArgs& a) {
  apply_verbosity(a);
  const std::vector<fs::path> dirs = search_path(a);
  const PluginRegistry registry = probed_registry(a);  // listing needs no plugin code in this process
  std::vector<const FoundPlugin*> shown;
  std::size_t hidden = 0;
  for (const auto& p : registry.found()) {
    if (p.info.mutant && !a.all) ++hidden;
    else shown.push_back(&p);
  }
  // Rejections are listed, not fatal, unless asked for (--strict) or nothing is usable.
  const bool fail = registry.found().empty() || (a.strict && !registry.rejections().empty());
  const int code = fail ? kExitPlugin : kExitOk;

  if (a.json) {
    nlohmann::json j = {{"plugins", nlohmann::json::array()}, {"rejected", nlohmann::json::array()},
                        {"search_path", nlohmann::json::array()}, {"abi_version", plugin_abi_version}};
    for (const FoundPlugin* p : shown) {
      const Capabilities& c = p->info.capabilities;
      j["plugins"].push_back({{"name", p->info.name},
                              {"version", p->info.version},
                              {"abi", p->abi_version},
                              {"description", p->info.description},
                              {"capabilities", capability_names(c)},
                              {"mutant", p->info.mutant},
                              {"file", p->file.string()}});
    }
    for (const auto& r : registry.rejections())
      j["rejected"].push_back({{"file", r.file.string()}, {"reason", r.reason}, {"not_a_plugin", r.not_a_plugin}});
    for (const auto& d : dirs) j["search_path"].push_back(d.string());
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return code;
  }

  std::vector<std::vector<std::string>> rows = {{"NAME", "VERSION", "ABI", "CAPABILITIES", "FILE"}};
  // Names and versions come from the plugins: control characters escaped, so
  // that none can forge a line of this table.
  for (const FoundPlugin* p : shown)
    rows.push_back({terminal_safe(p->info.name) + (p->info.mutant ? " (mutant)" : ""),
                    terminal_safe(p->info.version), std::to_string(p->abi_version),
                    capabilities_str(p->info.capabilities), terminal_safe(p->file.string())});
  std::vector<std::size_t> width(rows[0].size(), 0);
  for (const auto& row : rows)
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i)
      line += i + 1 < row.size() ? row[i] + std::string(width[i] - row[i].size() + 2, ' ') : row[i];
    std::cout << line << "\n";
  }
  if (shown.empty()) std::cout << "(no plugins)\n";
  // Files that are no plugin at all (a system folder holds thousands):
  // one line for them unless -v asks for each.
  std::size_t not_plugins = 0;
  for (const auto& r : registry.rejections()) {
    if (r.not_a_plugin && a.verbose == 0) {
      ++not_plugins;
      continue;
    }
    std::cout << "rejected  " << terminal_safe(r.file.string()) << ": " << terminal_safe(r.reason) << "\n";
  }
  if (not_plugins)
    std::cout << "(" << not_plugins << " file" << (not_plugins > 1 ? "s" : "")
              << " without headgrad symbols (libraries, linker scripts) skipped; -v lists them)\n";
  if (hidden) std::cout << "(" << hidden << " mutant plugin" << (hidden > 1 ? "s" : "") << " hidden; --all lists them)\n";
  std::string searched;
  for (const auto& d : dirs) searched += (searched.empty() ? "" : ", ") + d.string();
  std::cout << "searched: " << searched << "\n";
  if (registry.found().empty()) error("no plugin could be loaded from the search path");
  return code;
}

void add_plugins_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<PluginsArgs>();
  CLI::App* plugins = app.add_subcommand(
      "plugins", "List the plugins found: name, version, ABI, capabilities, file; and each rejected library with "
                 "its reason. Each library is probed in a child process: one that crashes, hangs or exits is "
                 "rejected, not fatal. Exit code 3 only when no plugin is usable, or with --strict when any library "
                 "was rejected.");
  add_common(plugins, *args);
  plugins->add_flag("--all", args->all, "also list mutant plugins (deliberately wrong variants)");
  plugins->add_flag("--json", args->json, "print JSON instead of a table");
  plugins->add_flag("--strict", args->strict, "exit with code 3 when any library was rejected");
  plugins->callback([args, &exit_code] { exit_code = cmd_plugins(*args); });
}

// A YAML double-quoted string.
std::string yaml_quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// suite.yaml beside the exported files: a suite that checks the plugin against them.
std::string exported_suite(const CaseSpec& c, const LoadedPlugin& p, const std::string& suite_file,
                           bool has_positions_file) {
  std::ostringstream y;
  y.precision(17);
  y << "# Written by headgrad export: plugin " << p.info.name << " " << p.info.version << ", case '" << c.name
    << "' of " << suite_file << ".\n"
    << "# Run it with: headgrad run <this folder>/suite.yaml\n"
    << "suite: exported\ncases:\n"
    << "  - name: " << yaml_quoted(c.name + " vs " + p.info.name) << "\n"
    << "    compare: [" << p.info.name << "]\n"
    << "    reference: .\n"
    << "    level: " << level_name(c.level) << "\n"
    << "    causal: "
    << (!c.causal ? "false" : c.causal_alignment == CausalAlignment::bottom_right ? "bottom_right" : "true")
    << "\n";  // bottom_right also anchors a window (p_i = i + Tk - Tq)
  if (c.level == Level::mha) y << "    shape: {H: " << c.dims.H << "}\n";
  if (c.rope) {  // explicit or generated positions are in positions.npy; offset positions are said here
    const RopeCase& r = *c.rope;
    y << "    rope: {theta: " << r.theta << ", style: " << rope_style_name(r.style);
    if (r.rotary_dim > 0) y << ", rotary_dim: " << r.rotary_dim;
    if (!has_positions_file && r.offset != 0) y << ", positions: {offset: " << r.offset << "}";
    if (r.q_offset != 0) y << ", q_offset: " << r.q_offset;
    y << "}\n";
  }
  if (!c.taps.empty()) {
    y << "    taps: [";
    for (std::size_t i = 0; i < c.taps.size(); ++i) y << (i ? ", " : "") << c.taps[i];
    y << "]\n";
  }
  if (c.bias) y << "    bias: true\n";
  if (c.qk_norm.enabled)  // the files cannot say the norm's settings
    y << "    qk_norm: {axis: " << qk_norm_axis_name(c.qk_norm.axis) << ", eps: " << c.qk_norm.eps
      << ", gain: " << qk_norm_gain_name(c.qk_norm.gain) << "}\n";
  if (c.cross) y << "    cross: true\n";
  // sliding windows and soft-capping live in the case, not in the files; sinks.npy says sinks
  if (c.window.enabled()) {
    y << "    window: {";
    if (c.window.left) y << "left: " << *c.window.left << (c.window.right ? ", " : "");
    if (c.window.right) y << "right: " << *c.window.right;
    y << "}\n";
  }
  if (c.softcap > 0) y << "    softcap: " << c.softcap << "\n";
  if (c.scale) y << "    scale: " << *c.scale << "\n";
  if (c.relative_rule()) {  // below float64: judged against per_head's float64 golden, as the case was
    y << "    tolerance: {rule: relative_to_baseline, k: {out: " << c.baseline_k.out << ", grads: " << c.baseline_k.grads;
    for (const auto& [tensor, k] : c.baseline_k.tensor) y << ", " << tensor << ": " << k;
    y << "}}\n";
  } else {
    y << "    atol: " << c.tolerance.atol << "\n    rtol: " << c.tolerance.rtol << "\n";
  }
  return y.str();
}

int cmd_export(const ExportArgs& a) {
  apply_verbosity(a);
  const Suite suite = load_suite(a.suite);
  std::string problem;
  const CaseSpec* found = find_case(suite, a.case_name, a.suite, &problem);
  if (!found) {
    error(problem);
    return kExitUsage;
  }
  check_memory_budget({found}, a.max_memory);
  CaseSpec c = *found;
  const std::string plugin_name = a.plugin.empty() ? c.compare.at(0) : a.plugin;
  c.compare = {plugin_name};
  if (!c.is_reference()) c.compare.push_back(plugin_name);  // keeps the spec well-formed

  PluginRegistry registry = probed_registry(a);
  add_python_plugins(registry, suite);
  registry.load({plugin_name});
  const LoadedPlugin* plugin = registry.find(plugin_name);
  if (!plugin) {
    report_missing_plugins({&c}, registry, search_path(a));
    return kExitPlugin;
  }
  check_capabilities({&c}, registry);

  load_case_files(c);
  const CaseInputs inputs = make_inputs(c);
  const std::vector<ReadPath> reads = run_reads(suite, {found});
  check_output_folder("--out", a.out, reads);
  if (fs::is_directory(a.out)) {  // a folder made here holds no input
    std::vector<std::pair<std::string, fs::path>> outputs;
    for (const auto& nt : input_tensors(inputs)) outputs.emplace_back("--out", fs::path(a.out) / (nt.name + ".npy"));
    if (inputs.positions.defined()) outputs.emplace_back("--out", fs::path(a.out) / "positions.npy");
    for (const auto& name : tensor_names(c)) outputs.emplace_back("--out", fs::path(a.out) / (name + ".npy"));
    outputs.emplace_back("--out", fs::path(a.out) / "suite.yaml");
    check_outputs(outputs, reads);
  }
  ExecOptions exec;
  exec.isolate = !a.no_isolation;
  exec.timeout_s = a.timeout.value_or(c.timeout_s);
  const SideResult side = run_side(c, inputs, *plugin, exec);
  if (side.status != SideStatus::ok && side.status != SideStatus::non_finite) {
    error(side.cause);
    return is_plugin_error(side.status) ? kExitPlugin : kExitFailed;
  }

  std::error_code ec;
  fs::create_directories(a.out, ec);
  if (ec) {
    error("cannot create " + a.out + ": " + ec.message());
    return kExitUsage;
  }
  std::vector<std::string> written;
  try {
    TensorSet in_files = input_tensors(inputs);
    if (inputs.positions.defined()) in_files.push_back({"positions", inputs.positions});  // a RoPE case's list or generator
    for (const TensorSet& set : {in_files, side.tensors})
      for (const NamedTensor& nt : set) {  // (a lambda may not capture a structured binding in C++20)
        if (!nt.tensor.defined()) continue;
        write_file_atomically(fs::path(a.out) / (nt.name + ".npy"),
                              [&](const fs::path& tmp) { write_npy(tmp, nt.tensor); });
        written.push_back(nt.name + ".npy");
      }
    write_report(fs::path(a.out) / "suite.yaml", exported_suite(c, *plugin, a.suite, inputs.positions.defined()));
  } catch (const std::exception& e) {
    error(e.what());
    return kExitUsage;
  }
  std::string files;
  for (const auto& w : written) files += " " + w;
  if (!a.quiet)
    std::cout << "wrote " << a.out << ":" << files << " suite.yaml\n"
              << "(" << plugin_name << " on " << describe_case(c) << "; check it with: headgrad run " << a.out
              << "/suite.yaml)\n";
  if (side.status == SideStatus::non_finite) {
    error(side.cause);
    return kExitFailed;
  }
  return kExitOk;
}

void add_export_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* exp = app.add_subcommand(
      "export", "Run one plugin on one case and write its inputs, output and gradients as a reference directory "
                "(.npy files: x, wq, wk, wv, wo, r, out, dx, dwq, dwk, dwv, dwo, with biases bq, bk, bv, bo, dbq, dbk, "
                "dbv, dbo; or q, k, v, mask, r, out, dq, dk, dv; and the case's sinks, q_norm, k_norm, x_kv with their "
                "gradients, positions for listed or generated RoPE positions), plus a suite.yaml that checks the "
                "plugin against it (the case's rope, taps, window, softcap, qk_norm, cross and tolerance).");
  exp->add_option("suite", args->suite, "the suite (YAML)")->required()->check(CLI::ExistingFile)->type_name("SUITE.yaml");
  exp->add_option("--case", args->case_name, "the case's name as reports show it (a sweep point: name[B=2,T=5])")
      ->required()
      ->type_name("NAME");
  exp->add_option("--plugin", args->plugin, "the plugin to run (default: the case's first)")->type_name("NAME");
  exp->add_option("--out", args->out, "the folder to write (created if missing)")->required()->type_name("DIR");
  exp->add_option("--timeout", args->timeout, "time limit in seconds (default: the case's)")
      ->type_name("SEC")
      ->check(timeout_check());
  add_max_memory(exp, args->max_memory);
  exp->add_flag("--no-isolation", args->no_isolation, "run the plugin in this process");
  add_common(exp, *args);
  exp->callback([args, &exit_code] { exit_code = cmd_export(*args); });
}

// What a subcommand threw, said and turned into its exit code: 2 only for
// the user's to fix (bad input, a path that cannot be used), 4 for headgrad's
// own failures.
int exit_code_for(const std::exception_ptr& thrown) {
  const std::string own = " (headgrad could not do its own work)";
  try {
    std::rethrow_exception(thrown);
  } catch (const std::invalid_argument& e) {  // ConfigError, NpyError, ...
    error(e.what());
    return kExitUsage;
  } catch (const std::filesystem::filesystem_error& e) {  // a folder or file of the user's
    error(e.what());
    return kExitUsage;
  } catch (const InternalError& e) {  // fork, pipe, poll
    error(e.what() + own);
    return kExitInternal;
  } catch (const std::bad_alloc&) {
    error("out of memory" + own);
    return kExitInternal;
  } catch (const std::logic_error& e) {
    error(std::string("internal error (a broken invariant): ") + e.what() + own);
    return kExitInternal;
  } catch (const std::exception& e) {
    error(e.what() + own);
    return kExitInternal;
  } catch (...) {
    error("an exception that is not a std::exception" + own);
    return kExitInternal;
  }
}

struct CheckArgs : RunArgs {
  std::string function, level = "mha", rope, dtype;
  bool causal = false, no_causal = false, bias = false, no_bias = false, no_features = false;
  std::int64_t kv_heads = 0;
  std::string keep_suite;
};

int cmd_check(CheckArgs a) {
  apply_verbosity(a);
  pyplug::CheckOptions o;
  o.level = a.level;
  if (a.causal && a.no_causal) throw std::invalid_argument("--causal and --no-causal exclude each other");
  if (a.causal) o.causal = true;
  if (a.no_causal) o.causal = false;
  if (a.bias && a.no_bias) throw std::invalid_argument("--bias and --no-bias exclude each other");
  if (a.bias) o.bias = true;
  if (a.no_bias) o.bias = false;
  o.features = !a.no_features;
  o.kv_heads = a.kv_heads;
  o.rope = a.rope;
  o.dtype = a.dtype;
  // FILE.py:FUNCTION, relative to here; MODULE:FUNCTION; @NAME (served by headgrad.check)
  const auto colon = a.function.rfind(':');
  if (a.function.rfind('@', 0) != 0 && (colon == std::string::npos || colon == 0 || colon + 1 == a.function.size()))
    throw std::invalid_argument("'" + a.function + "' is not FILE.py:FUNCTION (or MODULE:FUNCTION)");
  o.function = a.function;
  if (a.function[0] != '@') {
    const std::string file = a.function.substr(0, colon);
    if (file.ends_with(".py")) {
      if (!fs::is_regular_file(file)) throw std::invalid_argument("no file " + file + " (from " + a.function + ")");
      o.function = fs::absolute(file).lexically_normal().string() + a.function.substr(colon);
    }
  }
  pyplug::FunctionInfo info;
  try {
    info = pyplug::describe_function(o.function);
  } catch (const pyplug::PythonError& e) {
    error(e.what());
    return kExitPlugin;
  }
  fs::path dir = a.keep_suite;
  std::string tmpl = (fs::temp_directory_path() / "headgrad-check-XXXXXX").string();
  if (dir.empty()) {
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("cannot make a temporary folder for the check suite");
    dir = tmpl;
  }
  a.suite = pyplug::write_check_suite(o, info, dir).string();
  // One case at a time unless asked: the worker this process started (torch
  // imported once) then serves every side; -j N starts one worker per job.
  if (!a.jobs) a.jobs = 1;
  int code = kExitUsage;
  try {
    code = cmd_run(a);
  } catch (...) {
    if (a.keep_suite.empty()) fs::remove_all(dir);
    throw;
  }
  if (a.keep_suite.empty()) fs::remove_all(dir);
  if (a.verbose > 0) {
    const auto st = pyplug::worker_stats();
    std::cout << "python worker: " << st.starts << " start(s) in this process, " << st.start_seconds
              << " s (torch import included)\n";
  }
  return code;
}

void add_check_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<CheckArgs>();
  CLI::App* cmd = app.add_subcommand(
      "check", "Check a Python (PyTorch) attention function against per_head, no YAML: the suite new-plugin writes "
               "(shapes where no bug hides, edge cases, non-contiguous input, float32; GQA with --kv-heads, RoPE with "
               "--rope), adapted to what the function's signature takes. Exit codes as run's.");
  cmd->add_option("function", args->function, "FILE.py:FUNCTION or MODULE:FUNCTION")->required()->type_name("FILE.py:FUNCTION");
  cmd->add_option("--level", args->level, "mha: fn(x, wq, wk, wv, wo, **kw); core: fn(q, k, v, **kw); rope: fn(x, positions, **kw)")
      ->check(CLI::IsMember({"mha", "core", "rope"}))
      ->capture_default_str();
  cmd->add_flag("--causal", args->causal, "the function is causal (needed when it takes no `causal` argument: the default)");
  cmd->add_flag("--no-causal", args->no_causal, "the function is not causal (it takes no `causal` argument)");
  cmd->add_option("--kv-heads", args->kv_heads, "add grouped-kv cases (GQA) with N kv heads")->type_name("N");
  cmd->add_flag("--bias", args->bias,
                "every MHA case with biases bq, bk, bv, bo (the default when the signature names all four; "
                "headgrad.module_function's does for a module whose projections all have biases)");
  cmd->add_flag("--no-bias", args->no_bias, "no biases, even when the function takes them");
  cmd->add_flag("--no-features", args->no_features,
                "no cases of the features of current models (added for each one whose arguments the signature names: "
                "window, softcap, sinks, q_norm and k_norm, x_kv)");
  cmd->add_option("--rope", args->rope, "add RoPE cases: theta=..,style=interleaved|half,rotary_dim=.. (what the function does "
                                        "when it takes no keyword for them)")->type_name("SETTINGS");
  cmd->add_option("--dtype", args->dtype, "one more case in this dtype (float32 is always in)")
      ->check(CLI::IsMember({"float64", "float32", "bfloat16", "float16"}));
  cmd->add_option("--filter", args->filter, "run only the cases whose name matches this glob (e.g. 'window*')")
      ->type_name("GLOB");
  cmd->add_option("--json", args->json, "write the JSON report here")->type_name("FILE");
  cmd->add_option("--junit", args->junit, "write a JUnit XML report here")->type_name("FILE");
  cmd->add_option("--html", args->html, "write a self-contained HTML report here")->type_name("FILE");
  cmd->add_option("--timeout", args->timeout, "time limit in seconds for each plugin run (default 60)")
      ->type_name("SEC")
      ->check(timeout_check());
  cmd->add_option("-j,--jobs", args->jobs, "cases at once, each job with its own Python worker (default 1: one torch import)")->type_name("N")->check(CLI::Range(std::size_t{1}, std::size_t{1024}));
  cmd->add_option("--keep-suite", args->keep_suite, "write the suite into DIR and keep it (to edit and `headgrad run` it)")
      ->type_name("DIR");
  add_common(cmd, *args);
  cmd->callback([args, &exit_code] { exit_code = cmd_check(*args); });
}

}  // namespace

int main(int argc, char** argv) {
  headgrad::blas::select_kernels_for_this_cpu();  // first: BLIS reads its choice at its first call
  CLI::App app{"headgrad: cross-check attention implementations (plugins) on identical weights, for the output "
               "and the gradients of X, Wq, Wk, Wv, Wo.",
               "headgrad"};
  app.require_subcommand(1);
  app.set_version_flag("--version", HEADGRAD_VERSION);
  app.footer(
      "Exit codes: 0 every case as expected; 1 a comparison failed; 2 bad usage, config or input file;\n"
      "3 a plugin could not be loaded or crashed; 4 headgrad could not do its own work (fork, pipe, out of\n"
      "memory, a broken invariant).\n"
      "Environment: HEADGRAD_PLUGIN_PATH (plugin folders, colon-separated), HEADGRAD_LOG_LEVEL (trace, debug,\n"
      "info, warn, error, critical, off), NO_COLOR, HEADGRAD_NUM_THREADS (plugin threads), GTEST_SHARD_INDEX and\n"
      "GTEST_TOTAL_SHARDS (run's shard when --shard is not given).");

  // Each subcommand's callback runs it and sets the exit code.
  int exit_code = kExitUsage;
  add_run_command(app, exit_code);
  add_check_command(app, exit_code);
  add_plugins_command(app, exit_code);
  add_export_command(app, exit_code);
  add_merge_command(app, exit_code);
  headgrad::bench::add_bench_command(app, exit_code);
  headgrad::templates::add_new_plugin_command(app, exit_code);

  // Read by the core's pool and the BLAS, which would each take anything: checked once, here.
  if (const char* env = std::getenv("HEADGRAD_NUM_THREADS"); env && *env) {
    const std::string text = env;
    const bool digits = text.size() <= 6 && text.find_first_not_of("0123456789") == std::string::npos;
    const long n = digits ? std::stol(text) : 0;
    if (n < 1 || n > kMaxThreads) {
      error("HEADGRAD_NUM_THREADS=" + text.substr(0, 40) + ": expected a whole number of threads in [1, " +
            std::to_string(kMaxThreads) + "]");
      return kExitUsage;
    }
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  } catch (...) {
    return exit_code_for(std::current_exception());
  }
  return exit_code;
}
