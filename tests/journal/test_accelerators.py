"""One meaning of TICKERTAPE_PURE_PYTHON for every C accelerator (journal/accelerators.py):
1 is pure Python everywhere; unset, empty or 0 is the C wherever it was built."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

# (the module that chooses, its flag, the compiled module)
CHOOSERS = [
    ("journal.record", "VERIFY_ACCELERATED", "journal._verify"),
    ("server.splice", "ACCELERATED", "server._splice"),
    ("server.filter_scan", "ACCELERATED", "server._filterscan"),
    ("server.publish_scan", "ACCELERATED", "server._publish"),
    ("server.replicate_scan", "ACCELERATED", "server._replicate"),
]


def _flags(value: str | None) -> dict[str, bool]:
    env = {k: v for k, v in os.environ.items() if k != "TICKERTAPE_PURE_PYTHON"}
    if value is not None:
        env["TICKERTAPE_PURE_PYTHON"] = value
    code = (
        "import importlib, json, sys\n"
        f"c = {[(m, f) for m, f, _ in CHOOSERS]!r}\n"
        "print(json.dumps({m: getattr(importlib.import_module(m), f) for m, f in c}))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _built() -> dict[str, bool]:
    return {m: importlib.util.find_spec(c) is not None for m, _, c in CHOOSERS}


@pytest.mark.parametrize("value", [None, "", "0"])
def test_unset_or_0_means_the_c_wherever_it_was_built(value):
    assert _flags(value) == _built()


@pytest.mark.parametrize("value", ["1", "yes"])
def test_set_means_pure_python_everywhere(value):
    assert _flags(value) == {m: False for m, _, _ in CHOOSERS}
