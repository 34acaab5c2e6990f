"""The suite's order (tests/conftest.py): the modules named as the longest exist, and they and
the slow tests are collected ahead of the rest."""

import os
import subprocess
import sys

from tests.conftest import LONGEST_FIRST

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_module_named_longest_exists():
    missing = [p for p in LONGEST_FIRST if not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, f"renamed or removed: update LONGEST_FIRST in tests/conftest.py: {missing}"


def test_the_longest_and_the_slow_tests_are_collected_first():
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/server/test_sync_gate.py", "tests/e2e/test_replication_random.py",
         "tests/e2e/test_fault_seams.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    ids = [ln for ln in out.stdout.splitlines() if "::" in ln]
    assert ids, out.stdout + out.stderr
    files = [i.split("::")[0] for i in ids]
    first_fast = files.index("tests/server/test_sync_gate.py")
    assert set(files[:first_fast]) == {
        "tests/e2e/test_fault_seams.py",
        "tests/e2e/test_replication_random.py",
    }, files
    assert ids[0].startswith("tests/e2e/test_fault_seams.py::test_seams_rounds_keep")
