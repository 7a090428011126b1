// headgrad-bench: `headgrad bench` on its own, for scripts and tests.
//
//   headgrad-bench [bench] [SUITE.yaml] [--plugin NAME]... [--shape B,T,D,H]... ...
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench.hpp"

int main(int argc, char** argv) {
  CLI::App app{"headgrad-bench: the `headgrad bench` subcommand as a program of its own"};
  app.require_subcommand(1);
  int exit_code = 0;
  headgrad::bench::add_bench_command(app, exit_code);
  // "bench" may be left out: headgrad-bench --shape 2,3,8,2 == headgrad-bench bench --shape ...
  std::vector<std::string> args(argv, argv + argc);
  const bool top_help = argc == 2 && (args[1] == "-h" || args[1] == "--help");
  if (!top_help && (argc < 2 || args[1] != "bench")) args.insert(args.begin() + 1, "bench");
  std::vector<const char*> cargs;
  for (const auto& a : args) cargs.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(cargs.size()), cargs.data());
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return exit_code;
}
