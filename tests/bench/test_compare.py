"""bench/compare.py: the figures read back from a benchmark's printed tables, their medians and
the after ÷ before table (pure); --pin's CPU set as a benchmark sees it; and one tiny real run of
bench_publish on both sides (slow)."""

import io
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.append(os.path.join(ROOT, "bench"))  # last: its module names shadow nothing

import compare  # noqa: E402

PRINTED = """\
## Queue consume-and-ack, one consumer (bench_queue)

- date: 2026-11-27
- one consumer; the notes above a table are not its name:

Backlog 1:

| peer | msgs/s | srv CPU µs/msg | msgs/ack write |
|---|---:|---:|---:|
| tickertape | 12,345 (11,000–13,000) | 4.50 | — |
| jetstream (push) | 9,000 | 12.25 | 1.0 |

| tickertape ÷ peer | msgs/s (higher is better) |
|---|---:|
| jetstream (push) | 1.37× |

### backlog 10

| peer | msgs/s | srv CPU µs/msg | msgs/ack write |
|---|---:|---:|---:|
| tickertape | 40,000 | 2.00 | 9.5 |

## Next section

- a note:

| peer | msgs/s |
|---|---:|
| tickertape | 7 |
"""


def test_number_reads_the_leading_figure_of_a_cell():
    assert compare.number("12,345 (11,000–13,000)") == 12345.0
    assert compare.number("4.50") == 4.5
    assert compare.number("-0.25") == -0.25
    assert compare.number("—") is None
    assert compare.number("yes") is None


def test_figures_reads_every_peer_table_named_by_its_caption():
    figs = compare.figures(PRINTED)
    assert figs[("Backlog 1:", "tickertape", "msgs/s")] == 12345.0
    assert figs[("Backlog 1:", "jetstream (push)", "srv CPU µs/msg")] == 12.25
    assert figs[("Backlog 1:", "tickertape", "msgs/ack write")] is None
    assert figs[("backlog 10", "tickertape", "msgs/ack write")] == 9.5
    assert figs[("", "tickertape", "msgs/s")] == 7.0  # a new section, no heading
    # the ratio table is not a figure table
    assert not [k for k in figs if k[2].startswith("msgs/s (")]
    assert len(figs) == 10


def test_figures_numbers_tables_that_share_a_caption():
    two = "Rows:\n\n| peer | a |\n|---|---:|\n| x | 1 |\n\n| peer | a |\n|---|---:|\n| x | 2 |\n"
    assert compare.figures(two) == {("Rows:", "x", "a"): 1.0, ("Rows: #2", "x", "a"): 2.0}


def test_compare_table_takes_medians_and_marks_what_got_worse():
    k_rate = ("", "tickertape", "msgs/s")
    k_cpu = ("", "tickertape", "srv CPU µs/msg")
    k_rss = ("", "tickertape", "peak RSS MiB")
    runs = {
        "publish": {
            "before": [
                {k_rate: 100.0, k_cpu: 10.0, k_rss: 50.0},
                {k_rate: 300.0, k_cpu: 10.0, k_rss: 50.0},
                {k_rate: 200.0, k_cpu: 10.0, k_rss: 50.0},
            ],
            "after": [
                {k_rate: 180.0, k_cpu: 9.0, k_rss: 60.0},
                {k_rate: 1000.0, k_cpu: 9.0, k_rss: None},
                {k_rate: 185.0, k_cpu: 9.0, k_rss: 60.0},
            ],
        }
    }
    better = {"publish": {"msgs/s": "higher", "srv CPU µs/msg": "lower", "peak RSS MiB": "lower"}}
    rows = {
        line.split("|")[4].strip(): line
        for line in compare.compare_table(runs, better).splitlines()[2:]
    }
    # medians 200 -> 185: 0.93x, below 0.95 with higher better
    assert "| 200 | 185 | 0.93× | **worse** |" in rows["msgs/s"]
    # lower is better: 10 -> 9 is better, not marked
    assert "| 10.00 | 9.00 | 0.90× |  |" in rows["srv CPU µs/msg"]
    # the missing figure of rep 2 is left out of the median, not counted as zero
    assert "| 50.00 | 60.00 | 1.20× | **worse** |" in rows["peak RSS MiB"]


def test_pair_ratio_is_the_median_of_each_repetitions_own_ratio():
    """A load that drifts between repetitions moves both sides of a repetition alike: each
    repetition's after ÷ before stays near the change, where the medians' ratio does not."""
    k = ("", "tickertape", "msgs/s")
    other = ("", "tickertape", "peak RSS MiB")
    sides = {
        # a quiet rep, then two loaded ones: after is 1.10x in each
        "before": [{k: 300.0, other: 40.0}, {k: 100.0}, {k: 120.0, other: 40.0}],
        "after": [{k: 330.0, other: 40.0}, {k: 110.0, other: 44.0}, {k: 132.0}],
    }
    assert compare.pair_ratio(sides, k) == 1.1  # the medians' ratio: 132 / 120 = 1.10 too here
    sides["after"][0][k] = 90.0  # a slow spell in rep 1's after run: 0.3, 1.1, 1.1
    assert compare.pair_ratio(sides, k) == 1.1
    assert compare.pair_ratio(sides, other) == 1.0  # reps missing the figure are left out
    assert compare.pair_ratio(sides, ("", "x", "y")) is None
    table = compare.compare_table({"publish": sides}, {"publish": {"msgs/s": "higher"}})
    assert table.splitlines()[0].endswith("| pairs ÷ |")
    assert next(r for r in table.splitlines() if "| msgs/s |" in r).endswith("| 1.10× |")


def test_verdict_within_tolerance_and_without_a_direction():
    assert compare.verdict(100.0, 96.0, "higher") == ""
    assert compare.verdict(100.0, 94.0, "higher") == "**worse**"
    assert compare.verdict(100.0, 104.0, "lower") == ""
    assert compare.verdict(100.0, 110.0, "lower") == "**worse**"
    assert compare.verdict(100.0, 10.0, None) == ""
    assert compare.verdict(None, 10.0, "higher") == ""


def test_better_by_title_reads_the_benchmarks_metrics():
    b = compare.better_by_title("publish")
    assert b["msgs/s"] == "higher"
    assert b["srv CPU µs/msg"] == "lower"
    assert "client CPU %" not in b  # shown by the benchmark without a ratio: not judged


@pytest.mark.slow
def test_compare_runs_publish_on_both_sides(tmp_path):
    """One real comparison with tiny counts, this checkout on both sides (--before-tree: no
    worktree, no second install), one run a side: both must print their figures."""
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "compare.py"),
            "--before",
            "HEAD",
            "--benches",
            "publish",
            "--reps",
            "1",
            "--arg",
            "publish=--count 2000 --per-send 0",
            "--before-tree",
            ROOT,
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    row = [
        line
        for line in r.stdout.splitlines()
        if line.startswith("| publish |") and "| msgs/s |" in line
    ]
    assert row, r.stdout[-2000:]
    assert "—" not in row[0].split("|")[5:7], row[0]


@pytest.mark.skipif(not shutil.which("taskset"), reason="taskset is not installed here")
def test_pin_runs_the_benchmark_on_the_cpus_named(tmp_path):
    """run_one with a pin: the benchmark process (and so the servers it starts) sees only that
    CPU; without one, every CPU this test may use."""
    tree = tmp_path / "tree"
    (tree / ".venv" / "bin").mkdir(parents=True)
    (tree / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (tree / "bench").mkdir()
    (tree / "bench" / "bench_cpus.py").write_text(
        "import os\n"
        "print('| peer | cpus |')\n"
        "print('|---|---:|')\n"
        "print(f'| tickertape | {len(os.sched_getaffinity(0))} |')\n"
    )
    log = io.StringIO()
    key = ("", "tickertape", "cpus")
    pinned = compare.run_one(str(tree), "cpus", [], log, pin="0")
    assert pinned[key] == 1, log.getvalue()
    free = compare.run_one(str(tree), "cpus", [], log)
    assert free[key] == len(os.sched_getaffinity(0)), log.getvalue()
    assert "taskset -c 0" in log.getvalue()
