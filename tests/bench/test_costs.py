"""bench/bench_costs.py: the totals read back from callgrind's and strace's files (pure), the
counts each tool runs at, one real run under strace with this checkout on both sides; and
bench/bytecount.py: its split of the opcodes (pure) and its tracer on a small program."""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.append(os.path.join(ROOT, "bench"))  # last: its module names shadow nothing

import bench_costs  # noqa: E402
import bytecount  # noqa: E402

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


# per function [opcodes, calls] at 100 and 300 messages: `handle` runs once a message, the
# group commit's functions once every 20 messages at 100 and every 25 at 300
LO = {
    "server/session.py:10:handle": [5_000, 100],
    "journal/writer.py:40:_commit": [250, 5],
    "server/pipeline.py:70:_committed": [500, 5],
    "server/app.py:1:start": [9_000, 1],
}
HI = {
    "server/session.py:10:handle": [15_000, 300],
    "journal/writer.py:40:_commit": [600, 12],
    "server/pipeline.py:70:_committed": [1_200, 12],
    "server/app.py:1:start": [9_000, 1],
}


def test_split_separates_each_messages_work_from_the_commits():
    parts = bytecount.split(LO, HI, 200)
    assert parts["all"] == pytest.approx((10_000 + 350 + 700) / 200)
    assert parts["per_unit_fns"] == pytest.approx(50.0)  # handle: 50 opcodes a message
    assert parts["commits"] == pytest.approx(7 / 200)
    assert parts["per_commit"] == pytest.approx(150.0)  # (350 + 700) / 7 commits


def test_split_without_a_commit_has_no_per_commit_figure():
    lo = {"a.py:1:f": [10, 1]}
    assert bytecount.split(lo, {"a.py:1:f": [30, 3]}, 2)["per_commit"] == 0.0


def test_the_tracer_counts_every_threads_opcodes_per_function(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        "import sys, threading\n"
        "def work(n):\n"
        "    t = 0\n"
        "    for i in range(n):\n"
        "        t += i\n"
        "    return t\n"
        "th = threading.Thread(target=work, args=(1000,))\n"
        "th.start(); th.join()\n"
        "work(10)\n"
        "sys.exit(0)\n"  # the server leaves by SystemExit too: the counts are written at exit
    )
    out = tmp_path / "bc.json"
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "bytecount.py"),
            str(out),
            str(tmp_path),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())
    ops, calls = rows["prog.py:2:work"]
    assert calls == 2  # once in the thread, once in the main thread
    assert ops > 5 * 1000  # the loop's opcodes, the thread's included
    assert ops < 20 * 1010
    assert any(k.startswith("prog.py:1:") for k in rows)  # the module itself
