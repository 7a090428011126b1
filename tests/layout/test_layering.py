#!/usr/bin/env python3
"""The house rules of tools/ that a compiler does not check (docs/design.md, "The house").

- Each folder of tools/ includes headers only from the folders below it:
  headgrad -> job -> report -> analysis -> judge -> exec -> case -> pyplug (bench -> report).
- No folder holds more than 10 .cpp files.
- fork() and exec*() are called in one file of core/, tools/ and plugins/:
  the child-process helper (core/src/util/child_process.cpp); the Python
  worker is started through it (ChildProcess::spawn_program).

Usage: test_layering.py SOURCE_ROOT
"""
import pathlib
import re
import sys

# Each folder and the folders it may include from (the arrows, transitively closed).
ORDER = ["pyplug", "case", "exec", "judge", "analysis", "report", "job"]
ALLOWED = {name: set(ORDER[:i]) for i, name in enumerate(ORDER)}
ALLOWED.update({"bench": set(ORDER[:ORDER.index("report") + 1]), "template": set(), "headgrad": set(ORDER) | {"bench", "template"}})
MAX_CPP = 10
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^/"]+)/[^"]+"', re.M)
FORK = re.compile(r"\b(?:v?fork|exec[lv]p?e?|posix_spawnp?)\s*\(")
HELPER = "core/src/util/child_process.cpp"


def main(root: pathlib.Path) -> int:
    problems = []
    tools = root / "tools"
    folders = sorted(p for p in tools.iterdir() if p.is_dir() and any(p.glob("*.[ch]pp")))
    for folder in folders:
        name = folder.name
        if name not in ALLOWED:
            problems.append(f"tools/{name}/: a folder the layering does not know; add it to docs/design.md and here")
            continue
        cpps = list(folder.glob("*.cpp"))
        if len(cpps) > MAX_CPP:
            problems.append(f"tools/{name}/ holds {len(cpps)} .cpp files (at most {MAX_CPP}): split the stage")
        for src in sorted(folder.glob("*.[ch]pp")):
            for used in INCLUDE.findall(src.read_text()):
                if used != name and used in ALLOWED and used not in ALLOWED[name]:
                    problems.append(f"{src.relative_to(root)} includes {used}/: an arrow back up "
                                    f"(tools/{name}/ may include {', '.join(sorted(ALLOWED[name])) or 'no tools/ folder'})")
    forks = [str(p.relative_to(root)) for d in ("core", "tools", "plugins") for p in (root / d).rglob("*.cpp")
             if FORK.search(re.sub(r"//[^\n]*", "", p.read_text()))]
    if forks != [HELPER]:
        problems.append("fork() or exec() is called in " + (", ".join(forks) or "no file") +
                        f": it belongs in {HELPER} alone (ChildProcess)")
    for p in problems:
        print(p)
    print(f"{len(folders)} folders of tools/ checked: {'ok' if not problems else str(len(problems)) + ' problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1])))
