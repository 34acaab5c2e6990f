"""Nothing in the repository points outside it: no file names the contract folder beside the
checkout or a path of the machine it was written on (the project's own docs/ hold what a reader
needs). bench/RESULTS.md is written by the benches, so its command lines show paths as DIR
(bench/benchlib.py shown_command)."""

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# spelled in pieces so that this file does not itself name such a path
OUTSIDE = re.compile("|".join(("\\.\\./" + "shared", "/" + "work/", "/" + "root/", "/" + "home/")))


def test_no_tracked_file_points_outside_the_repository():
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    hits = []
    for name in files:
        try:
            with open(os.path.join(ROOT, name), encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if OUTSIDE.search(line):
                        hits.append(f"{name}:{n}: {line.strip()[:120]}")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
    assert not hits, "\n".join(hits)
