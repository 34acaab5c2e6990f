"""The maintenance files (journal/manifest.py's write_json_atomic: the MANIFEST, archive
catalogs, requests, results, answers) on a disk that fills up while one is written.

A write to a nearly full filesystem may be short: the kernel writes the pages it has room for
and returns their count; only the next write fails with ENOSPC. write_json_atomic made one
write and renamed the temp file into place whatever it wrote: a MANIFEST or a catalog cut
short at a page boundary, which no reader can parse (the journal does not open; compaction and
removal cannot read what the archive holds). Found reading the maintenance code for issue 23."""

from __future__ import annotations

import errno
import os

import pytest

from journal.manifest import read_json, write_json_atomic
from tests.support.disk import fill, small_disk  # noqa: F401 (the fixture)


def test_a_file_the_disk_has_no_room_for_is_not_put_in_place(small_disk):  # noqa: F811
    path = str(small_disk / "MANIFEST")
    old = {"version": 1, "generation": 1}
    write_json_atomic(path, old)
    filler = str(small_disk / "filler")
    fill(filler)
    os.truncate(filler, os.path.getsize(filler) - 8192)  # room for two pages, no more
    new = {"version": 1, "generation": 2, "applied": [f"compact-{i:06d}" for i in range(2000)]}
    with pytest.raises(OSError) as exc:
        write_json_atomic(path, new)
    assert exc.value.errno == errno.ENOSPC
    assert read_json(path) == old  # the old file stays, whole
    assert sorted(os.listdir(small_disk)) == ["MANIFEST", "filler"]  # no temp file left
    os.unlink(filler)
    write_json_atomic(path, new)
    assert read_json(path) == new
