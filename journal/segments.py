"""A segment in the journal's layout, and the name a plain segment file has on disk."""

from __future__ import annotations

from dataclasses import dataclass

from .compacted import CompactedReader
from .record import SEGMENT_HEADER_SIZE

DEFAULT_SEGMENT_SIZE = 256 * 1024 * 1024
READ_BLOCK = 256 * 1024


@dataclass(eq=False)
class Segment:
    base: int
    path: str
    # bytes of records: the file's size minus the header, but for the active segment, whose
    # file also holds its zeroed runway (writer.py); for a compacted one, end - base
    size: int
    reader: CompactedReader | None = None  # set for a compacted segment

    @property
    def end(self) -> int:
        return self.base + self.size

    @property
    def kind(self) -> str:
        return "plain" if self.reader is None else "compacted"

    @property
    def file_bytes(self) -> int:
        return (
            self.reader.file_bytes if self.reader is not None else self.size + SEGMENT_HEADER_SIZE
        )


def _seg_base(seg: Segment) -> int:
    return seg.base


def segment_name(base: int) -> str:
    return f"{base:020d}.seg"


def _base_of(name: str) -> int | None:
    """The base position in a plain segment's name, or None for a name not made by segment_name."""
    stem = name[:-4]
    return int(stem) if len(stem) == 20 and stem.isdigit() else None
