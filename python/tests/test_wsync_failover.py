"""A Python collector fed by a real `rlhub relay` process fails over like a
Go one: relay SIGKILLed -> the upstream hub, relay restarted -> back to it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid

import pytest

torch = pytest.importorskip("torch")

import rlhub  # noqa: E402
import rlhub.wsync as ws  # noqa: E402
from conftest import Hub, free_port  # noqa: E402


def weights(v: float) -> dict:
    return {"weight": torch.full((2, 4), float(v)), "bias": torch.full((2,), float(v))}


def start_relay(hub, shm: str, listen: str) -> subprocess.Popen:
    return subprocess.Popen([hub.binary, "relay", "--upstream", hub.addr, "--model", "pol", "--id", "relay-fo",
                             "--listen", listen, "--shm", shm],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def test_collector_fails_over_to_upstream_and_returns_to_the_relay(hub):
    shm = f"/dev/shm/rlhub-fo-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    listen = f"127.0.0.1:{free_port()}"
    policy = torch.nn.Linear(4, 2)
    store = rlhub.StoreClient(hub.addr)
    store.push("pol", weights(1), version=1)
    relay = start_relay(hub, shm, listen)
    src = r = None
    try:
        wait_for(lambda: os.path.exists(shm), 30, "the relay's segment")
        src = ws.FailoverSource([
            ("relay-shm", lambda: ws.ShmSource(shm, model="pol")),
            ("relay", lambda: ws.PushSource(listen, "pol", collector_id="py-fo")),
            ("upstream", lambda: ws.PushSource(hub.addr, "pol", collector_id="py-fo")),
        ], model="pol", collector_id="py-fo", hub=hub.addr, probe_every=0.2)
        r = ws.Receiver(policy, src, collector_id="py-fo", hub=hub.addr)
        assert r.wait(timeout=30) and r.version == 1 and src.current == "relay-shm"

        relay.send_signal(signal.SIGKILL)
        relay.wait(timeout=30)
        for v in (2, 3):  # the relay is gone: versions keep coming from the upstream
            store.push("pol", weights(v), version=v)
            wait_for(lambda: r.wait(timeout=0.5) or r.version >= v, 30, f"v{v} after the relay died")
            assert r.version == v and src.current == "upstream", (r.version, src.current)
            assert torch.equal(policy.weight, torch.full((2, 4), float(v)))
        # The collector reports what it applied to the hub after applying
        # it (its acknowledgement on the push stream): the hub's row
        # follows the receiver, it does not lead it.
        def reported() -> int:
            rows = {c.collector_id: c for m in ws.status(hub.addr, "pol") for c in m.collectors}
            return rows["py-fo"].version if "py-fo" in rows else 0
        wait_for(lambda: reported() == 3, 30, "the hub's status row at v3")

        relay = start_relay(hub, shm, listen)  # back: the collector returns to its segment
        wait_for(lambda: (r.wait(timeout=0.2), src.current)[1] == "relay-shm", 30, "the return to the relay")
        store.push("pol", weights(4), version=4)
        wait_for(lambda: r.wait(timeout=0.5) or r.version >= 4, 30, "v4 through the restarted relay")
        assert r.version == 4 and src.current == "relay-shm"
        assert torch.equal(policy.bias, torch.full((2,), 4.0))
    finally:
        if r is not None:
            r.close()
        elif src is not None:
            src.close()
        store.close()
        if relay.poll() is None:
            relay.terminate()
            relay.wait(timeout=30)
        if os.path.exists(shm):
            os.unlink(shm)


# A collector ID the hub refuses for good (InvalidArgument: over 256
# bytes), as it refuses a wrong token: the real service's refusal.
BAD_ID = "x" * 257


def test_failover_raises_when_every_source_refuses_for_good(hub):
    rlhub.StoreClient(hub.addr).push("pol", weights(1), version=1)
    src = ws.FailoverSource([
        ("relay", lambda: ws.PushSource(hub.addr, "pol", collector_id=BAD_ID)),
        ("upstream", lambda: ws.PushSource(hub.addr, "pol", collector_id=BAD_ID)),
    ], model="pol", backoff=0.01)
    try:
        t0 = time.monotonic()
        with pytest.raises(rlhub.errors.InvalidArgument, match="refused for good") as ei:
            src.wait_newer(0, timeout=60)
        assert "relay" in str(ei.value) and "upstream" in str(ei.value)
        assert time.monotonic() - t0 < 60, "it retried until the timeout"
    finally:
        src.close()


def test_failover_passes_a_refusing_source_and_keeps_trying_an_unreachable_one(hub):
    rlhub.StoreClient(hub.addr).push("pol", weights(1), version=1)
    src = ws.FailoverSource([
        ("relay", lambda: ws.PushSource(hub.addr, "pol", collector_id=BAD_ID)),
        ("upstream", lambda: ws.PushSource(hub.addr, "pol", collector_id="py-ok")),
    ], model="pol", backoff=0.01)
    try:
        wv = src.wait_newer(0, timeout=30)
        assert wv is not None and wv.version == 1 and src.current == "upstream"
    finally:
        src.close()
    # Refused by one, nothing listening at the other: it may come back.
    dead = f"127.0.0.1:{free_port()}"
    src = ws.FailoverSource([
        ("relay", lambda: ws.PushSource(dead, "pol", collector_id="py-ok")),
        ("upstream", lambda: ws.PushSource(hub.addr, "pol", collector_id=BAD_ID)),
    ], model="pol", backoff=0.01)
    try:
        assert src.wait_newer(0, timeout=1.0) is None
    finally:
        src.close()


class _Feed:
    """An in-process source whose versions arrive with :meth:`publish`,
    the newest kept, as on a push stream. ``on_wait``, when set, runs once
    when a ``wait_newer`` finds nothing newer and is about to block: a
    relay that catches up while a probe waits for it."""

    via = "feed"

    def __init__(self) -> None:
        self._cond = threading.Condition()  # an RLock: on_wait may publish
        self._newest: "ws.WeightVersion | None" = None
        self.on_wait = None
        self.up = True  # False: dialing it fails, as a relay that is not running

    def publish(self, version: int, epoch: int) -> None:
        with self._cond:
            self._newest = ws.WeightVersion("pol", version, epoch, b"", self.via)
            self._cond.notify_all()

    def get_if_newer(self, than: int):
        with self._cond:
            return self._newest if self._newest is not None and self._newest.version > than else None

    def wait_newer(self, after: int, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                wv = self.get_if_newer(after)
                if wv is not None:
                    return wv
                catch_up, self.on_wait = self.on_wait, None
                if catch_up is not None:
                    catch_up()
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)

    def close(self) -> None:
        pass


def test_failover_probe_waits_for_a_preferred_source_to_catch_up_and_passes_a_stale_one():
    """The twin of the Go TestFailoverGoesBackOnlyToAnUpToDatePreferredSource,
    with a probe at every call (probe_every=0): on the upstream at v5, a
    preferred source at an older epoch is passed over without an error, one
    that stays behind (v4) is left after probe_timeout, and one that catches
    up while the probe waits for it (a restarted relay whose first version
    is older than the collector's, its next one newer) is gone back to
    within the same probe, its v6 handed out."""
    pref, up = _Feed(), _Feed()

    def dial_pref():
        if not pref.up:
            raise rlhub.Unavailable("not running")
        return pref

    f = ws.FailoverSource([("pref", dial_pref), ("up", lambda: up)], model="pol", probe_every=0,
                          probe_timeout=0.05, backoff=0.001)
    try:
        pref.up = False
        up.publish(5, epoch=3)
        wv = f.get_if_newer(0)
        assert wv is not None and wv.version == 5 and f.current == "up", (wv, f.current)
        pref.up = True

        pref.publish(6, epoch=2)  # stale: a deposed primary's relay
        assert f.get_if_newer(5) is None and f.current == "up"

        pref.publish(4, epoch=3)  # behind, and it stays behind
        assert f.get_if_newer(5) is None and f.current == "up"

        f.probe_timeout = 60.0  # a bound on the test, not a pace: the catch-up comes within the wait
        pref.on_wait = lambda: pref.publish(6, epoch=3)
        wv = f.get_if_newer(5)
        assert pref.on_wait is None, "the probe did not wait for a version at least as new as the collector's"
        assert wv is not None and (wv.version, wv.epoch) == (6, 3) and f.current == "pref", (wv, f.current)
        assert f.switches == 2  # up, then back to pref
    finally:
        f.close()


def test_sources_that_fail_before_serving_are_closed(rlhub_bin, tmp_path):
    """Relay and hub both SIGKILLed (a node outage), the relay's segment left
    behind: the collector keeps dialling its sources. One that fails before
    serving a version is closed at once, as the Go Failover closes it, and
    dialled again only after the back-off; they used to be kept until a
    newer version came (never, here), each holding its segment's descriptor,
    mapping and a lease entry, or a gRPC channel: ~170 descriptors a second."""
    hub = Hub(rlhub_bin, tmp_path)
    shm = f"/dev/shm/rlhub-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    relay = start_relay(hub, shm, f"127.0.0.1:{free_port()}")
    src = None
    try:
        with rlhub.StoreClient(hub.addr) as store:
            store.push("pol", weights(1), version=1)
        wait_for(lambda: os.path.exists(shm), 30, "the relay's segment")
        src = ws.FailoverSource([
            ("relay-shm", lambda: ws.ShmSource(shm, model="pol")),
            ("upstream", lambda: ws.PushSource(hub.addr, "pol", collector_id="py-fo")),
        ], model="pol", collector_id="py-fo", probe_every=0.2, backoff=0.05)
        r = ws.Receiver(torch.nn.Linear(4, 2), src)
        assert r.wait(timeout=30) and r.version == 1 and src.current == "relay-shm"
        relay.send_signal(signal.SIGKILL)
        relay.wait(timeout=30)
        hub.proc.send_signal(signal.SIGKILL)
        hub.proc.wait(timeout=30)
        assert os.path.exists(shm)  # a SIGKILLed relay leaves its segment
        r.wait(timeout=1.0)  # the first failover
        before, t0 = len(os.listdir("/proc/self/fd")), time.monotonic()
        while time.monotonic() - t0 < 4.0:
            assert not r.wait(timeout=0.5)
        after = len(os.listdir("/proc/self/fd"))
        assert after - before <= 4, f"descriptors grew from {before} to {after} while failing over"
        assert len(src._retired) <= 1, src._retired
    finally:
        if src is not None:
            src.close()
        if relay.poll() is None:
            relay.kill()
        hub.stop()
        if os.path.exists(shm):
            os.unlink(shm)
