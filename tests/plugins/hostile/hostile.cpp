// hostile: a plugin library that misbehaves on purpose, for the loader's
// probe. Built once per kind and moment (tests/plugins/meson.build):
//   HOSTILE_SEGFAULT, HOSTILE_ABORT, HOSTILE_HANG, HOSTILE_EXIT0 (exit(0)),
//   HOSTILE_CHATTER (writes a forged report line on stdout),
//   HOSTILE_GRANDCHILD (forks a child that sleeps holding every descriptor; its
//   pid goes to $HOSTILE_PID_DIR/NAME.pid),
//   HOSTILE_GARBAGE (writes junk into every descriptor above stderr);
// in a static constructor (HOSTILE_AT_LOAD) or in info(). Otherwise the
// correct core-level toy of tests/plugins/mixed/good_toy.cpp, named HOSTILE_NAME.
#include <headgrad/plugin.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

void misbehave() {
#if defined(HOSTILE_SEGFAULT)
  // A real SIGSEGV with the default action: a sanitizer's handler would turn
  // it into a report and exit(1), which is not the case under test.
  ::signal(SIGSEGV, SIG_DFL);
  ::raise(SIGSEGV);
#elif defined(HOSTILE_ABORT)
  std::abort();
#elif defined(HOSTILE_HANG)
  for (;;) ::pause();
#elif defined(HOSTILE_EXIT0)
  std::exit(0);
#elif defined(HOSTILE_CHATTER)
  std::printf("  OK     a forged line on stdout  %s\n", HOSTILE_NAME);
  std::fflush(stdout);
#elif defined(HOSTILE_GRANDCHILD)
  const pid_t child = ::fork();
  if (child == 0) {
    ::sleep(600);
    ::_exit(0);
  }
  // HOSTILE_PID_DIR: where the test learns the grandchild's pid, to see it gone.
  if (const char* dir = std::getenv("HOSTILE_PID_DIR")) {
    const std::string file = std::string(dir) + "/" HOSTILE_NAME ".pid";
    if (std::FILE* f = std::fopen(file.c_str(), "w")) {
      std::fprintf(f, "%d\n", static_cast<int>(child));
      std::fclose(f);
    }
  }
#elif defined(HOSTILE_GARBAGE)
  for (int fd = 3; fd < 64; ++fd) (void)!::write(fd, "garbage without a length\n", 25);
#else
#error "say how to misbehave: HOSTILE_SEGFAULT, HOSTILE_ABORT, ..."
#endif
}

#if defined(HOSTILE_AT_LOAD)
const bool g_misbehaved = (misbehave(), true);
#define HEADGRAD_TOY_ON_INFO()
#else
#define HEADGRAD_TOY_ON_INFO() misbehave()
#endif

}  // namespace

#define HEADGRAD_TOY_NAME HOSTILE_NAME
#include "../mixed/good_toy.cpp"
