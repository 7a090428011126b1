// old_abi_symbol: what a plugin built against headgrad's first SDK exports:
// an int ABI version (1) and the factory, no build description. The loader
// must reject it and say to rebuild, without calling anything.
#include <boost/config.hpp>

extern "C" BOOST_SYMBOL_EXPORT int headgrad_plugin_abi_version() { return 1; }
