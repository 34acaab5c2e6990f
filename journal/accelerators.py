"""The one loader of the C accelerators, and the one meaning of TICKERTAPE_PURE_PYTHON.

Every byte format with a hot loop has a pure-Python reference and, when a compiler was there at
install time, a C twin built by setup.py (journal/_verify.c; server/_splice.c, _sowfold.c, _filterscan.c,
_publish.c, _replicate.c). The tests hold each pair to the same results, so the choice is only
one of speed:

    TICKERTAPE_PURE_PYTHON=1        pure Python everywhere (to compare, or to rule the C out)
    unset, empty or 0               the C where it was built, pure Python where it was not

It lives in the journal, the lowest package with an accelerator, so that the Spark job's
executors, which get only the journal package (journal/spark/job_code.py), have it too.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["load", "pure_python"]


def pure_python() -> bool:
    """TICKERTAPE_PURE_PYTHON is set to something other than 0."""
    return os.environ.get("TICKERTAPE_PURE_PYTHON", "") not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The compiled module `name` (e.g. "server._splice"); None when pure_python() or when it
    was not built or does not load here (e.g. a shared library it needs is missing)."""
    if pure_python():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
