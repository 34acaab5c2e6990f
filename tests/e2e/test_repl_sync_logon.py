"""The logon ack under sync replication (docs/replication.md): a publisher that reconnects is
told the last sequence that is durable where it counts, here and at every active sync
destination, not the last one the instance accepted. Its acks of 101..200 are held while the
sync destination is down, so it must resend them: a logon ack saying 200 would make it skip
messages the destination never got."""

from tests.e2e.test_repl_sync import flushed, pair, publish, stats, wait_for
from tests.support.raw import Raw


def test_a_reconnecting_publisher_is_told_the_durable_sequence(tmp_path):
    a, b = pair(tmp_path)
    a.start()
    b.start()
    pub = again = None
    try:
        wait_for(lambda: stats(a)["destinations"]["tt-b"]["connected"])
        pub = Raw(a.port)
        pub.logon("pub")
        publish(pub, 1, 100)
        assert flushed(pub, 10)  # B is up: 1..100 durable on both
        b.kill()
        wait_for(lambda: not stats(a)["destinations"]["tt-b"]["connected"])
        publish(pub, 101, 200)
        assert not flushed(pub, 1.5)  # stored at A, held for B
        pub.close()
        pub = None
        again = Raw(a.port)
        ack = again.logon("pub")
        assert ack["status"] == "success"
        assert ack["s"] == 100, f"logon ack s={ack['s']}: 101..200 are not acknowledged yet"
    finally:
        for c in (pub, again):
            if c is not None:
                c.close()
        a.stop()
        b.stop()
