"""bench/bench_costs.py: the totals read back from callgrind's and strace's files (pure), the
counts each tool runs at, and one real run under strace with this checkout on both sides."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.append(os.path.join(ROOT, "bench"))  # last: its module names shadow nothing

import bench_costs  # noqa: E402

STRACE_C = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 92.96    0.566216        4194       135        14 futex
  2.59    0.015765          15      1029           write
------ ----------- ----------- --------- --------- ----------------
100.00    0.609013          53     10023       658 total
"""
STRACE_C_NO_ERRORS = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
100.00    0.001000           5       200           write
------ ----------- ----------- --------- --------- ----------------
100.00    0.001000           5       200           total
"""


def test_strace_total_is_the_calls_column_of_the_total_row(tmp_path):
    (tmp_path / "st.txt").write_text(STRACE_C)
    assert bench_costs.tool_total("strace", str(tmp_path)) == 10023
    (tmp_path / "st.txt").write_text(STRACE_C_NO_ERRORS)
    assert bench_costs.tool_total("strace", str(tmp_path)) == 200


def test_strace_without_a_total_row_says_so(tmp_path):
    (tmp_path / "st.txt").write_text("strace: exec: No such file or directory\n")
    with pytest.raises(bench_costs.CostsError, match="no strace total"):
        bench_costs.tool_total("strace", str(tmp_path))


def test_callgrind_total_sums_every_process_file(tmp_path):
    (tmp_path / "cg.101").write_text("# callgrind format\nevents: Ir\nsummary: 2386499596\n")
    (tmp_path / "cg.102").write_text("# callgrind format\nevents: Ir\ntotals: 1000\n")
    assert bench_costs.tool_total("callgrind", str(tmp_path)) == 2386500596


def test_callgrind_with_no_counts_says_so(tmp_path):
    (tmp_path / "cg.7").write_text("")  # killed before it could write
    with pytest.raises(bench_costs.CostsError, match="no callgrind counts"):
        bench_costs.tool_total("callgrind", str(tmp_path))


def test_strace_runs_ten_times_callgrinds_counts():
    class Args:
        scale = 0.5

    spec = bench_costs.Spec(None, {}, (300, 1300))
    assert bench_costs.counts(Args, spec, "callgrind") == (150, 650)
    assert bench_costs.counts(Args, spec, "strace") == (1500, 6500)


@pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed here")
def test_a_real_run_under_strace_counts_both_sides():
    """This checkout on both sides, tiny counts: a row with a figure for each side."""
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "bench_costs.py"),
            "--before-tree",
            ROOT,
            "--benches",
            "publish",
            "--tools",
            "strace",
            "--scale",
            "0.02",
            "--no-results",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    row = [line for line in r.stdout.splitlines() if line.startswith("| publish | msg |")]
    assert row, r.stdout[-2000:]
    before, after = (float(c) for c in row[0].split("|")[3:5])
    assert before > 0 and after > 0, row[0]
