// Which hostile plugin this library is: the one file compiled per library
// (tests/plugins/hostile/meson.build gives HOSTILE_KIND, a hostile::Kind
// enumerator, so a kind that does not exist fails to compile; HOSTILE_NAME;
// HOSTILE_AT_LOAD, true or false). hostile.cpp, the plugin itself, compiles
// once and is linked whole into every library, as the mutants do.
#include "hostile.hpp"

extern "C" const hostile::Kind headgrad_hostile_kind = hostile::Kind::HOSTILE_KIND;
extern "C" const bool headgrad_hostile_at_load = HOSTILE_AT_LOAD;
extern "C" const char headgrad_hostile_name[] = HOSTILE_NAME;
