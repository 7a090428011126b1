// data_symbol: exports a data object named headgrad_plugin_build where the
// function should be (and a factory), as a hand-made export gone wrong would.
// Calling it would jump into data; the loader must reject the library from
// its file, without loading it.
#include <boost/dll/alias.hpp>

#include <memory>

namespace {
std::shared_ptr<int> make_nothing() { return std::make_shared<int>(0); }
}  // namespace

extern "C" BOOST_SYMBOL_EXPORT const unsigned char headgrad_plugin_build[16] = {0xff, 0xff, 0xff, 0xff};
BOOST_DLL_ALIAS(make_nothing, headgrad_create_plugin)
