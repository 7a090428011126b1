"""main() of a test script run as `TEST.py HEADGRAD_EXE [unittest args]`
(tests/meson.build): the built program's path goes into the script's global
HEADGRAD, the rest to unittest. `--except A,B` in place of the unittest
args runs every TestCase class of the script but A and B: tests/meson.build
runs a long script as several tests, the last one `--except` the classes the
others name, so that a class added later still runs.

    if __name__ == "__main__":
        sys.exit(headgrad_main.main(globals()))
"""
import pathlib
import sys
import unittest


def main(test_globals):
    if len(sys.argv) < 2:
        print(f"usage: {pathlib.Path(sys.argv[0]).name} HEADGRAD_EXE [unittest args]", file=sys.stderr)
        return 2
    test_globals["HEADGRAD"] = sys.argv[1]
    args = sys.argv[2:]
    if args[:1] == ["--except"]:
        excluded = set(args[1].split(",")) if len(args) > 1 else set()
        classes = {name for name, value in test_globals.items()
                   if isinstance(value, type) and issubclass(value, unittest.TestCase)
                   and value.__module__ == test_globals["__name__"]}
        if unknown := excluded - classes:
            print(f"--except names no TestCase class of this script: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        if not classes - excluded:
            print("--except leaves no TestCase class to run", file=sys.stderr)
            return 2
        args = sorted(classes - excluded) + args[2:]
    prog = unittest.main(argv=[sys.argv[0]] + args, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1
