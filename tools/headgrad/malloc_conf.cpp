// jemalloc's settings for the programs that link it (meson.build's
// malloc_dep: headgrad and the test programs). jemalloc reads this symbol
// when it starts; MALLOC_CONF in the environment is read after it, so a
// user's settings still win.
//
// thp:always: jemalloc asks for transparent huge pages (madvise) on the
// memory it maps. A check at a model's size allocates its work buffers in
// the gigabytes through malloc (the comparison, the oracle's inputs, the
// results read back from the sides), and on a VM where each 4 KiB page
// fault is dear, faulting them in 4 KiB at a time took half of the whole
// check (docs/performance.md, "The heap allocator and the runner's children").
extern "C" {
extern const char* malloc_conf;
const char* malloc_conf = "thp:always";
}
