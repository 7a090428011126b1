// The ways a hostile plugin misbehaves (hostile.cpp), and what each library
// says of itself (which.cpp): its kind, its name, and whether it misbehaves
// at load (in a static constructor) or in info().
#pragma once

namespace hostile {

enum class Kind {
  segfault,    // a real SIGSEGV
  abort,       // std::abort()
  hang,        // pause() forever
  exit0,       // exit(0)
  chatter,     // writes a forged report line on stdout
  grandchild,  // forks a child that sleeps holding every descriptor
  garbage,     // writes junk into every descriptor above stderr
};

}  // namespace hostile

// Defined by which.cpp, one per library; read by hostile.cpp, compiled once.
extern "C" const hostile::Kind headgrad_hostile_kind;
extern "C" const bool headgrad_hostile_at_load;
extern "C" const char headgrad_hostile_name[];
