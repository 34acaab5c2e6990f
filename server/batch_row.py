"""The row a batch keeps per message to fan out once durable (`Batch.msgs`, server/pipeline_batch.py).

One NamedTuple, `BatchRow`, is the shape every path that fills a batch builds: the ordinary
publish and replication paths in Python, the fast intakes in Python (server/publish_scan.py,
server/replicate_scan.py) and in C (server/_publish.c, server/_replicate.c). The C gets this
type from its `configure()` at import and builds its instances (server/_batch_row.h), and it
refuses a type whose fields are not the ones it fills: a field added here without the C
stops the import instead of making rows one field short.

A format between Python and C, so it lives with the formats (layer 1), below the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple

__all__ = ["BatchRow", "new_row"]


class BatchRow(NamedTuple):
    topic: str
    pub: int
    seq: int
    ts: int  # receive time, µs
    body: bytes
    offset: int  # of its record in the journal (Batch.data's base + offset), or -1
    hdr: bytes  # header fragment (b"": none)
    exp: Any  # the publish's expiration `e`, or None


# A row from a tuple of its fields without a Python call (BatchRow(...) is one, about 0.5 µs
# more per message): the paths that make a row per message use this.
new_row: Callable[[Iterable[Any]], BatchRow] = partial(tuple.__new__, BatchRow)
