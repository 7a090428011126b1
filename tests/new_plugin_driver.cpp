// `new-plugin` alone, as the headgrad program will offer it once main.cpp
// calls add_new_plugin_command: test_install.sh uses it only when the
// installed headgrad does not have the subcommand yet (and says so).
#include <CLI/CLI.hpp>

#include "template/template.hpp"

int main(int argc, char** argv) {
  CLI::App app{"headgrad new-plugin (test driver)", "headgrad"};
  app.require_subcommand(1);
  int exit_code = 0;
  add_new_plugin_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}
