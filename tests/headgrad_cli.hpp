// Running the headgrad program from a test: no shell, stdout and stderr
// captured, HEADGRAD_PLUGIN_PATH, HEADGRAD_LOG_LEVEL and GTEST_SHARD_* cleared. The test's
// meson target defines HEADGRAD_EXE (build/tools/headgrad).
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace headgrad::test {

struct Outcome {
  int code = -1;  // the exit code; 128 + N for a signal N
  std::string out, err;
  double seconds = 0;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs build/tools/headgrad with `args` in `cwd`, with `env` set on top.
inline Outcome headgrad(const std::vector<std::string>& args,
                        const std::filesystem::path& cwd = std::filesystem::current_path(),
                        const std::vector<std::pair<std::string, std::string>>& env = {}) {
  namespace fs = std::filesystem;
  const fs::path tmp = fs::temp_directory_path();
  const std::string tag = std::to_string(::getpid());
  const fs::path out_file = tmp / ("headgrad_cli_out_" + tag), err_file = tmp / ("headgrad_cli_err_" + tag);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, 1);
    ::dup2(err, 2);
    if (::chdir(cwd.c_str()) != 0) ::_exit(127);
    ::unsetenv("HEADGRAD_PLUGIN_PATH");
    ::unsetenv("HEADGRAD_LOG_LEVEL");
    ::unsetenv("GTEST_SHARD_INDEX");  // a sharded test run must not shard the suites it runs
    ::unsetenv("GTEST_TOTAL_SHARDS");
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(HEADGRAD_EXE));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(HEADGRAD_EXE, argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  Outcome r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out_file);
  r.err = slurp(err_file);
  fs::remove(out_file);
  fs::remove(err_file);
  return r;
}

}  // namespace headgrad::test
