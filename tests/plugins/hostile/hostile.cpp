// hostile: a plugin library that misbehaves on purpose, for the loader's
// probe. Compiled once; each library links it whole and adds which.cpp,
// which says how it misbehaves (hostile::Kind, hostile.hpp):
//   segfault, abort, hang, exit0 (exit(0)),
//   chatter (writes a forged report line on stdout),
//   grandchild (forks a child that sleeps holding every descriptor; its
//   pid goes to $HOSTILE_PID_DIR/NAME.pid),
//   garbage (writes junk into every descriptor above stderr);
// in a static constructor (at load) or in info(). Otherwise the correct
// core-level toy of tests/plugins/mixed/good_toy.cpp, named by which.cpp.
#include "hostile.hpp"

#include <headgrad/plugin.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

void misbehave() {
  switch (headgrad_hostile_kind) {
    case hostile::Kind::segfault:
      // A real SIGSEGV with the default action: a sanitizer's handler would
      // turn it into a report and exit(1), which is not the case under test.
      ::signal(SIGSEGV, SIG_DFL);
      ::raise(SIGSEGV);
      return;
    case hostile::Kind::abort:
      std::abort();
    case hostile::Kind::hang:
      for (;;) ::pause();
    case hostile::Kind::exit0:
      std::exit(0);
    case hostile::Kind::chatter:
      std::printf("  OK     a forged line on stdout  %s\n", headgrad_hostile_name);
      std::fflush(stdout);
      return;
    case hostile::Kind::grandchild: {
      const pid_t child = ::fork();
      if (child == 0) {
        ::sleep(600);
        ::_exit(0);
      }
      // HOSTILE_PID_DIR: where the test learns the grandchild's pid, to see it gone.
      if (const char* dir = std::getenv("HOSTILE_PID_DIR")) {
        const std::string file = std::string(dir) + "/" + headgrad_hostile_name + ".pid";
        if (std::FILE* f = std::fopen(file.c_str(), "w")) {
          std::fprintf(f, "%d\n", static_cast<int>(child));
          std::fclose(f);
        }
      }
      return;
    }
    case hostile::Kind::garbage:
      for (int fd = 3; fd < 64; ++fd) (void)!::write(fd, "garbage without a length\n", 25);
      return;
  }
}

// At load: a static constructor. headgrad_hostile_at_load is a constant,
// initialized before any constructor runs.
const bool g_misbehaved = headgrad_hostile_at_load ? (misbehave(), true) : false;

}  // namespace

#define HEADGRAD_TOY_NAME headgrad_hostile_name
#define HEADGRAD_TOY_ON_INFO() \
  if (!headgrad_hostile_at_load) misbehave()
#include "../mixed/good_toy.cpp"
