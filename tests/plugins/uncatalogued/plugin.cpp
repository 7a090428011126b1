// The factory of every u_<name> library: the plugin its name selects, from
// the registry the folder's sources fill (common.hpp).
#include <stdexcept>

#include "common.hpp"

extern "C" const char headgrad_uncatalogued_name[];  // u_<name>.cpp

namespace {
std::shared_ptr<headgrad::Attention> make_selected() {
  const auto found = uncatalogued::registry().find(headgrad_uncatalogued_name);
  if (found == uncatalogued::registry().end())
    throw std::logic_error(std::string("no uncatalogued plugin named ") + headgrad_uncatalogued_name);
  return found->second();
}
}  // namespace

HEADGRAD_PLUGIN_FACTORY(make_selected)
