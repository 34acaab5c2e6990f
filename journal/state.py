"""The journal's layout: the one piece of state its parts share.

A Journal (journal.py) is a façade over a few objects, each handed what it uses:

- `Layout` (here): every segment in position order, the last one being written; the manifest
  that names the compacted ones; the durable end. Recovery (recovery.py) builds it at open.
- `JournalReader` (reading.py) reads records through it (and owns the read descriptors).
- `JournalWriter` (writer.py) appends to its newest segment: it rolls a segment (appends to
  `segments`) and moves `end` after each commit.
- A layout change (maintenance, `Journal.commit_layout`) replaces `segments` in one assignment
  (`replace`), so a reader works on the list it took.
"""

from __future__ import annotations

import bisect

from .errors import JournalError
from .manifest import Manifest, save_manifest
from .segments import Segment, _seg_base


class Layout:
    __slots__ = ("directory", "end", "manifest", "segment_size", "segments")

    def __init__(
        self, directory: str, segment_size: int, segments: list[Segment], manifest: Manifest
    ):
        self.directory = directory
        self.segment_size = segment_size
        self.segments = segments  # never empty; replaced whole by replace(), appended by a roll
        self.manifest = manifest
        self.end = segments[-1].end  # position after the last durable record

    def find(self, position: int) -> tuple[list[Segment], int]:
        """(segments, index of the one holding position) from one snapshot of the layout."""
        segs = self.segments
        return segs, max(0, bisect.bisect_right(segs, position, key=_seg_base) - 1)

    def replace(self, manifest: Manifest, sealed: list[Segment]) -> list[Segment]:
        """Commit `manifest` and make `sealed` the sealed part of the layout (the segment being
        written stays); `sealed` must run without a gap up to it. The manifest's rename is the
        commit point. Returns the segments that left the layout. The writer thread's alone
        (Journal.commit_layout): a roll must not run meanwhile."""
        new = list(sealed) + [self.segments[-1]]
        for a, b in zip(new, new[1:]):
            if a.end != b.base:
                raise JournalError(
                    f"new layout has a gap or overlap at {a.end} / {b.base} ({a.path}, {b.path})"
                )
        manifest.generation = self.manifest.generation + 1
        save_manifest(self.directory, manifest)
        kept = {id(s) for s in new}
        gone = [s for s in self.segments if id(s) not in kept]
        self.manifest = manifest
        self.segments = new
        return gone
