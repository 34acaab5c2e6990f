"""The SOW manager's commit hook on its own: a real journal and store, a real `Batch`, the
pipeline's steps (before_flush, then the batch's `durable` callbacks) called by hand."""

import gc
import weakref

from config.loader import load_config_text
from journal.journal import Journal
from server.pipeline_batch import Batch
from server.sow.keys import k_fragment
from server.sow.manager import SowManager
from tests.support.proc import make_config


class _Marker:
    """Something a batch holds, to see when the batch is freed (Batch has no weakref slot)."""


def test_a_committed_batch_is_freed_by_reference_counting(tmp_path):
    """The commit callback the manager hangs on a batch must not keep the batch itself: a
    batch -> durable -> callback -> batch cycle is freed only by the cycle collector, so every
    batch of SOW publishes (its journal bytes and a tuple per message) outlived its commit, and
    the collector walked them all, again and again."""
    xml = make_config(str(tmp_path), extra="<SOW><Topic><Name>px</Name><Key>/k</Key></Topic></SOW>")
    journal = Journal(str(tmp_path / "journal"))
    mgr = SowManager(load_config_text(xml), journal)
    mgr.recover()
    gc.disable()
    try:
        batch = Batch()
        body = b'{"k":1}'
        batch.data += b"x" * 64
        batch.msgs.append(("px", 7, 1, 1000, body, 0, k_fragment("WzFd"), None))
        marker = _Marker()
        batch.flushes.append(marker)  # type: ignore[arg-type]
        seen = weakref.ref(marker)
        del marker
        mgr.before_flush(batch)
        assert batch.durable, "a batch with SOW puts gets a commit callback"
        for on_durable in batch.durable:
            on_durable(64, None)
        assert mgr.held is not None and mgr.held.body("px", "WzFd") == body  # applied (held)
        del batch, on_durable
        assert seen() is None, "the committed batch is still alive: a reference cycle"
    finally:
        gc.enable()
        mgr.close()
        journal.close()
