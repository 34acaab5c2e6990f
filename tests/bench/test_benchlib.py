"""bench/benchlib.py, the one runner of the benchmarks: repetitions, problems, medians and the
RESULTS.md section (pure, no server); and every benchmark module small enough and able to start
(`--help` imports it and builds its options)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT / "bench"))  # last: its module names shadow nothing

import benchlib  # noqa: E402
from benchlib import Metric  # noqa: E402

BENCH = ROOT / "bench"
MAX_MODULE_LINES = 600


def test_repeat_counts_valid_reps_and_reports_every_problem(capsys):
    def rep(r):
        if r == 1:
            raise ValueError("server gone\nsecond line")
        if r == 2:
            return {"x": 3.0, "problem": "short by 1", "valid": False}
        if r == 3:
            return {"x": 9.0, "problem": "slow, still counted"}
        return {"x": 1.0}

    results, problems = benchlib.repeat("row", 4, rep)
    assert results == [{"x": 1.0}, {"x": 9.0, "problem": "slow, still counted"}]
    assert problems == [
        "rep 2: ValueError: server gone",
        "rep 3: short by 1",
        "rep 4: slow, still counted",
    ]
    out = capsys.readouterr().out
    assert "rep 2/4: FAILED ValueError" in out and "rep 4/4: x=9.0" in out


def test_repeat_numbers_interleaved_reps_of_the_whole_run(capsys):
    benchlib.repeat("row", 1, lambda r: {"r": r}, first_rep=2, of=3)
    assert "rep 3/3: r=2" in capsys.readouterr().out


def test_load_problems_and_judged():
    r = {"timed_out": True, "errors": ["boom"], "pub_errors": 0, "acked": 7}
    probs = benchlib.load_problems(r, 5.0, 7, 10)
    assert probs == [
        "timed out after 5.0s: 7/10, 7 acked",
        "errors: ['boom'], 0 failed publishes",
        "got 7 of 10",
    ]
    assert benchlib.judged({"a": 1}, probs)["valid"] is False
    assert benchlib.judged({"a": 1}, ["rate not sustained"], valid=True)["valid"] is True
    clean = {"timed_out": False, "errors": [], "pub_errors": 0, "acked": 10}
    assert benchlib.judged({"a": 1}, benchlib.load_problems(clean, 5.0, 10, 10)) == {"a": 1}


def test_medians_of_named_metrics_with_spread_and_of_every_figure():
    reps = [{"a": 1.0, "b": 10, "ok": True}, {"a": 3.0, "b": None}, {"a": 2.0, "b": 30}]
    assert benchlib.medians(reps, [Metric("a", "A", spread=True), Metric("b", "B")]) == {
        "a": 2.0,
        "a~": (1.0, 3.0),
        "b": 20.0,
    }
    assert benchlib.medians(reps) == {"a": 2.0, "b": 20.0}  # no bool "figures"


def test_report_writes_one_section_and_replaces_it(tmp_path, monkeypatch):
    monkeypatch.setattr(benchlib, "RESULTS", str(tmp_path / "RESULTS.md"))
    monkeypatch.setattr(benchlib, "header_block", lambda title, argv, notes: f"## {title}")
    rows = [("tickertape", {"m": 200.0}), ("jetstream", {"m": 100.0})]
    metrics = [Metric("m", "msgs/s")]
    for problems in ({"jetstream": ["rep 1: slow"]}, {}):
        table = benchlib.Table(rows, problems, ["redis: none"])
        benchlib.report("bench_x", "X", table, metrics, [], False)
    text = (tmp_path / "RESULTS.md").read_text()
    assert text.count("<!-- BEGIN bench_x -->") == 1
    assert "| tickertape | 200 |" in text and "| jetstream | 2.00× |" in text
    assert "- skipped redis: none" in text and "rep 1: slow" not in text


def test_no_bench_module_is_over_600_lines():
    big = {
        p.name: n
        for p in sorted(BENCH.glob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert big == {}, f"bench modules over {MAX_MODULE_LINES} lines (split by object): {big}"


BENCHES = sorted(p.name for p in BENCH.glob("bench_*.py"))


@pytest.mark.parametrize("name", BENCHES + ["compare.py"])
def test_every_benchmark_starts(name):
    """--help imports the module (and all it imports) and builds its options: a broken import
    or a moved name shows here, without a server."""
    r = subprocess.run(
        [sys.executable, str(BENCH / name), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
        check=False,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage:" in r.stdout


def test_the_recorded_command_names_no_path_of_this_machine():
    assert (
        benchlib.shown_command(
            ["compare", "--workdir", "/data/x", "--json=/tmp/f.json", "--arg", "queue=--count 10"]
        )
        == "./run bench compare --workdir DIR --json=DIR --arg 'queue=--count 10'"
    )
