"""main() of a test script run as `TEST.py HEADGRAD_EXE [unittest args]`
(tests/meson.build): the built program's path goes into the script's global
HEADGRAD, the rest to unittest.

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
    prog = unittest.main(argv=[sys.argv[0]] + sys.argv[2:], exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1
