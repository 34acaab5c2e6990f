"""The job's code on Spark executors: the zip shipped to them, the probe of their Python, and the
entry point of every task. No pyspark import at the top: executors import this module from the
zip (it must load before anything else of the job), the driver imports it to build the zip.

Executors need only a Python with the job's runtime needs (EXECUTOR_NEEDS: pyarrow, numpy,
zstandard); Tickertape itself is not installed there. The driver (batch.py / spark_env.py)
builds `tickertape-job-<fingerprint>.zip` from the installed `journal` package (its .py files,
this `spark` subpackage's included; no compiled parts, names sorted and dates fixed, so the same code gives the same bytes) plus
BUILD_FILE, a JSON note of what was built:

    {"fingerprint": "<sha256 of the zipped sources, 16 hex>", "tickertape": "0.1.0",
     "python": "3.11", "accelerator": "_verify.cpython-311-x86_64-linux-gnu.so" | null}

and adds it with `SparkContext.addPyFile` (Spark puts it first on the executors' sys.path). The
record checks' C accelerator (journal/_verify.c) cannot load from a zip: the driver ships it
apart (`addFile`), and `bootstrap` loads it on an executor whose Python takes that extension
suffix (same Python version and platform); otherwise the executor checks records in pure Python
(the same results, slower).

Before the job, the driver runs `probe` once per executor core and compares what comes back
with what it shipped (spark_env.check_executors): the code fingerprint (an executor importing
another `journal` from its own site-packages would run other code), the Python version, and the
runtime needs. Any difference stops the command with a message naming the host and the Python.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import pkgutil
import platform
import sys
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

BUILD_FILE = "_job_build.json"
EXECUTOR_NEEDS = (("pyarrow", "18"), ("numpy", "1.24"), ("zstandard", "0.22"))
"""(module, lowest version) the job imports on executors; also the `spark` extra's runtime."""
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def package_dir() -> str:
    """The `journal` package's directory (this module is in its `spark` subpackage)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sources(src: str) -> list[str]:
    """The package's .py files, subpackages included, as sorted paths relative to `src`."""
    names = []
    for d, dirs, files in os.walk(src):
        dirs[:] = [x for x in dirs if not x.startswith(("__pycache__", "."))]
        rel = os.path.relpath(d, src)
        names += [n if rel == "." else f"{rel}/{n}" for n in files if n.endswith(".py")]
    return sorted(names)


def accelerator_path() -> str | None:
    """The record checks' compiled extension the driver loaded, if any."""
    from .. import record

    if not record.VERIFY_ACCELERATED:
        return None
    mod = sys.modules.get("journal._verify")
    path = getattr(mod, "__file__", None)
    return path if path and os.path.isfile(path) else None


def tickertape_version() -> str:
    try:
        from importlib.metadata import version

        return version("tickertape")
    except Exception:  # run from a source tree that was never installed
        return "unknown"


def build_zip(dest_dir: str) -> tuple[str, dict[str, Any]]:
    """Write the job's zip into dest_dir; return its path and its build note (BUILD_FILE)."""
    src = package_dir()
    names = _sources(src)
    h = hashlib.sha256()
    files = []
    for n in names:
        data = Path(src, n).read_bytes()
        h.update(n.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
        files.append((n, data))
    acc = accelerator_path()
    note = {
        "fingerprint": h.hexdigest()[:16],
        "tickertape": tickertape_version(),
        "python": "%d.%d" % sys.version_info[:2],
        "accelerator": os.path.basename(acc) if acc else None,
    }
    files.append((BUILD_FILE, json.dumps(note, sort_keys=True).encode()))
    path = os.path.join(dest_dir, f"tickertape-job-{note['fingerprint']}.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, data in files:
            info = zipfile.ZipInfo(f"journal/{n}", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    return path, note


def build_note() -> dict[str, Any] | None:
    """The BUILD_FILE of the zip this package was imported from; None when it was not (the
    driver, local mode, an installed Tickertape)."""
    try:
        raw = pkgutil.get_data("journal", BUILD_FILE)
    except OSError:
        return None
    return json.loads(raw) if raw else None


# -- on the executors ------------------------------------------------------------------------------


def bootstrap() -> bool:
    """Load the shipped C accelerator before journal.record is imported, when this Python takes
    it. Returns whether the record checks run accelerated here."""
    if "journal.record" not in sys.modules:
        note = build_note()
        name = (note or {}).get("accelerator")
        if name and any(name.endswith(s) for s in importlib.machinery.EXTENSION_SUFFIXES):
            try:
                from pyspark import SparkFiles

                path = SparkFiles.get(name)
                if os.path.isfile(path):
                    spec = importlib.util.spec_from_file_location("journal._verify", path)
                    if spec is not None and spec.loader is not None:
                        mod = importlib.util.module_from_spec(spec)
                        spec.loader.exec_module(mod)
                        sys.modules["journal._verify"] = mod
            except (ImportError, OSError):  # e.g. its shared library (ISA-L) is not there
                pass
    from .. import record

    return bool(record.VERIFY_ACCELERATED)


def probe(_: Any = None) -> dict[str, Any]:
    """What this executor's Python runs: host, interpreter, the job code's fingerprint and where
    it came from, each runtime need's version (or why it does not import)."""
    accelerated = bootstrap()
    needs: dict[str, str] = {}
    for mod, _lowest in EXECUTOR_NEEDS:
        try:
            m = __import__(mod)
            needs[mod] = str(getattr(m, "__version__", "?"))
        except Exception as exc:  # report it: the driver names what to install
            needs[mod] = f"missing: {exc}"
    note = build_note()
    return {
        "host": platform.node(),
        "python": sys.executable,
        "python_version": "%d.%d" % sys.version_info[:2],
        "fingerprint": (note or {}).get("fingerprint"),
        "code_from": package_dir(),
        "accelerated": accelerated,
        "needs": needs,
    }


def spark_task(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The mapInArrow function of the job (batch.py): bootstrap, then jobs.spark_task."""
    bootstrap()
    from .jobs import spark_task as run

    yield from run(batches)
