// Which plugin of its unit this library makes (HEADGRAD_TEST_PLUGIN_NAME,
// set per library in meson.build): see one_unit.hpp.
extern "C" const char headgrad_test_plugin_name[] = HEADGRAD_TEST_PLUGIN_NAME;
