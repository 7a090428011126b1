// `headgrad new-plugin NAME DIR`: writes a ready-to-build plugin project
// outside headgrad's tree: meson.build (dependency('headgrad')), NAME.cpp (a
// correct batched attention built from core ops, the places to change marked),
// suite.yaml (NAME against per_head across heads, lengths, batch sizes,
// non-contiguous inputs and the edge cases: Tq = 1, Tq > Tk, a boolean mask, a
// fully masked row, large logits), features.yaml (NAME against per_head on
// window, softcap, sinks, qk_norm and cross-attention, one section per
// capability, run once the plugin declares it), masks/*.npy (its mask files)
// and README.md. The text lives here, not in data files,
// so an installed headgrad needs nothing else.
//
//   CLI::App app;  int exit_code = 0;
//   add_new_plugin_command(app, exit_code);   // the subcommand's callback sets exit_code
//   app.parse(argc, argv);
//   if (app.got_subcommand("new-plugin")) return exit_code;
#pragma once

#include <filesystem>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

namespace headgrad::templates {

// [A-Za-z_][A-Za-z0-9_]* and not a C or C++ keyword.
bool is_c_identifier(std::string_view name);

// my_attn -> MyAttn (the plugin's class name).
std::string class_name_for(std::string_view name);

// Checks NAME and DIR (throws std::invalid_argument saying what is wrong: NAME
// not a C identifier or the name of a built-in plugin; DIR a file or a
// non-empty folder), then writes the project. Returns the files written.
// Throws std::runtime_error when a file cannot be written.
std::vector<std::filesystem::path> write_plugin_project(const std::string& name,
                                                        const std::filesystem::path& dir);

// How a generated project finds the headgrad that wrote it. An installed
// program (bin/headgrad): its installation's headgrad.pc folder. The
// uninstalled program of this build tree (build/tools/headgrad): the build's
// own headgrad.pc (its source headers and libheadgrad.so) and the program's
// path, so that neither pkg-config nor the shell picks another installed
// headgrad. Anything else: nothing known (pkg-config's own search, `headgrad`).
struct SdkLocation {
  std::filesystem::path pkgconfig_dir;  // empty: leave PKG_CONFIG_PATH alone
  std::string headgrad = "headgrad";    // the command that runs the suite
  bool uninstalled = false;
};
SdkLocation sdk_for_program(const std::filesystem::path& exe);

// The subcommand's work: 0 on success (files and next steps on `out`); 2 with
// "headgrad: error: ..." on `err` for a bad NAME or DIR or a failed write.
int run_new_plugin(const std::string& name, const std::filesystem::path& dir, std::ostream& out,
                   std::ostream& err);

// Adds `new-plugin NAME DIR` to `app`; its callback stores run_new_plugin's
// result in exit_code, which must outlive app.parse().
void add_new_plugin_command(CLI::App& app, int& exit_code);

}  // namespace headgrad::templates

// The short name, at global scope for main.cpp.
using headgrad::templates::add_new_plugin_command;
