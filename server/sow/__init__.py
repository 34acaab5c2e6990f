"""State of the World (docs/sow.md; docs/protocol.md §14): the latest message per key of the
topics configured under `<SOW><Topic>`, kept from the journal.

===============  ============================================================================
``keys``         a record's key: from the `<Key>` paths of the body, or the publisher's `k`;
                 where it lives in a journal record (the `k` member of the header fragment)
``records``      the body of a SOW delete record (journal/record.py kind 3)
``store``        the LMDB store: key -> the latest message, and the journal position it
                 reflects, written in the same transaction
``held``         puts held as the latest row per key and written per flush
                 (live commits and the catch-up at start)
``manager``      `SowManager`: the store kept from committed batches, catch-up at start,
                 deletes journaled, the consistency point of queries
``query``        a query's plan (filter, sow_keys, order_by, top_n, skip_n) and its answer,
                 streamed at the reader's pace
``history``      historical queries: store checkpoints, and the journal folded after one
===============  ============================================================================
"""

from .keys import BadSowKey, KeyMaker
from .manager import SowManager
from .query import BadOrderBy, SowQuery, parse_order_by

__all__ = ["BadOrderBy", "BadSowKey", "KeyMaker", "SowManager", "SowQuery", "parse_order_by"]
