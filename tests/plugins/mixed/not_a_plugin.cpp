// not_a_plugin: an ordinary shared library that happens to sit in a plugin
// folder. It exports one symbol, none of headgrad's.
extern "C" int not_a_plugin_answer() { return 42; }
