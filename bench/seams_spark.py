"""The Spark of the seams campaign's `maint` rounds: the same journal job, started for less.

A `maint` round's instance runs archive -> compact -> remove on a short schedule, and each
archive or compaction step is a child process with a JVM of its own (server/maintenance.py,
journal/spark/batch.py). On two shared cores that JVM was most of a round. The settings that
make it start for less (the client compiler and the serial collector, a class-data archive
dumped once by a warm-up session, one task per job, no whole-stage code generation or adaptive
planning) are tests/support/spark_fast.py's, which the Spark tests use too: one owner.

`prepare(root)` returns the environment for the servers of maint rounds ({} leaves them as
they are: the job then runs with its own defaults, only slower). A failed warm-up (no Java)
falls back to the options without the archive and says so once.
"""

from __future__ import annotations

from tests.support import spark_fast


def prepare(root: str) -> dict[str, str]:
    """Write the Spark configuration under `root` and dump the class-data archive; the
    environment the maint rounds' servers get."""
    return spark_fast.prepare(root, lambda msg: print(f"maint: {msg}", flush=True))
