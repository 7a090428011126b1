// Which bug this mutant library has (HEADGRAD_MUTANT="<bug name>"), read by
// mutant.cpp. Every mutant links the same compiled mutant.cpp; only this
// definition differs, so the heavy source compiles once, not once per bug.
extern "C" const char headgrad_mutant_bug[] = HEADGRAD_MUTANT;
