// Several test plugin libraries from one compiled unit: each library would
// otherwise compile its own source, reading plugin.hpp again (1.5 CPU s a
// library). The folder's sources compile as one unity file into a static
// library, each registering its plugin class under its library's name
// (HEADGRAD_TEST_PLUGIN); each library links it whole with plugin_name.cpp,
// which names the plugin that library makes (HEADGRAD_TEST_PLUGIN_NAME), and
// the unit's one HEADGRAD_TEST_PLUGIN_FACTORY makes it.
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include <headgrad/plugin.hpp>

extern "C" const char headgrad_test_plugin_name[];  // plugin_name.cpp

namespace headgrad::test_plugins {

using Maker = std::shared_ptr<Attention> (*)();
inline std::map<std::string, Maker>& registry() {
  static std::map<std::string, Maker> plugins;
  return plugins;
}
template <class P>
struct Registered {
  explicit Registered(const char* name) {
    registry()[name] = [] { return std::shared_ptr<Attention>(std::make_shared<P>()); };
  }
};
inline std::shared_ptr<Attention> make_named() {
  const auto found = registry().find(headgrad_test_plugin_name);
  if (found == registry().end())
    throw std::logic_error(std::string("no test plugin named ") + headgrad_test_plugin_name + " in this unit");
  return found->second();
}

}  // namespace headgrad::test_plugins

// At namespace scope, once per plugin class: the library named `name` makes it.
#define HEADGRAD_TEST_PLUGIN(name, Class) \
  const ::headgrad::test_plugins::Registered<Class> registered_##Class(#name);
// Once per unit: the factory every library of the unit exports.
#define HEADGRAD_TEST_PLUGIN_FACTORY() HEADGRAD_PLUGIN_FACTORY(::headgrad::test_plugins::make_named)
