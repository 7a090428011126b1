// Which plugin this u_<name> library makes (UNCATALOGUED_NAME="u_<name>"),
// read by plugin.cpp, which compiles once for all of them.
extern "C" const char headgrad_uncatalogued_name[] = UNCATALOGUED_NAME;
