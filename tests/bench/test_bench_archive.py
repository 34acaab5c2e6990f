"""bench/bench_archive.py between two jobs: what a job left in the source journal's _maint/
(its request, its result, its staging files) is removed, so the next repetition starts clean."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "bench"))  # last: its module names shadow nothing

import bench_archive  # noqa: E402

from journal import manifest  # noqa: E402


def test_clean_removes_a_jobs_request_result_and_staging(tmp_path):
    src = str(tmp_path)
    left = [manifest.request_path(src, "r1"), manifest.result_path(src, "r1")]
    for p in left:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        Path(p).write_text("{}")
    staging = manifest.staging_dir(src, "r1")
    os.makedirs(os.path.join(staging, "part"))
    bench_archive._clean(src, {"id": "r1"})
    assert not any(os.path.exists(p) for p in [*left, staging])
