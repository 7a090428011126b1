// Which bug this uncatalogued_<bug> library has (UNCATALOGUED_BUG="<bug>"),
// read by uncatalogued.cpp, which compiles once for all of them.
extern "C" const char headgrad_uncatalogued_bug[] = UNCATALOGUED_BUG;
