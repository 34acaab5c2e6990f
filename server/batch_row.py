"""The row a batch keeps per message to fan out once durable (`Batch.msgs`, server/pipeline_batch.py).

`BatchRow` names its fields, once: the ordinary publish and replication paths, the fast
intakes in Python (server/publish_scan.py, server/replicate_scan.py) and in C
(server/_publish.c, server/_replicate.c) all build rows of exactly this shape. The C gets
`BatchRow` from its `configure()` at import and refuses it when its fields are not the ones
the C fills (server/_batch_row.h): a field added here without the C stops the import instead
of making rows one field short.

The rows themselves are plain tuples of that shape (`BatchTuple`), as the raw records are
(journal/record.py's RawRecord and RawTuple), for speed: a NamedTuple instance per message
cost the publish path 25% more server CPU (bench_publish, 50k messages: 2.4 -> 3.0 µs a
message). Unpacking a tuple subclass does not take CPython's fast path for exact tuples, and
exact tuples of plain values leave the garbage collector's lists, a subclass's do not. A
reader that is not hot names a row's fields with BatchRow._make(row).

A format between Python and C, so it lives with the formats (layer 1), below the pipeline.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["BatchRow", "BatchTuple"]


class BatchRow(NamedTuple):
    topic: str
    pub: int
    seq: int
    ts: int  # receive time, µs
    body: bytes
    offset: int  # of its record in the journal (Batch.data's base + offset), or -1
    hdr: bytes  # header fragment (b"": none)
    exp: Any  # the publish's expiration `e`, or None


BatchTuple = tuple[str, int, int, int, bytes, int, bytes, Any]
"""A BatchRow as a plain tuple: what every path puts in Batch.msgs."""
