"""Python weight collectors follow a cluster's primary (issue 15).

One real etcd and three real `rlhub serve --etcd` processes; the primary is
SIGKILLed twice while collectors given only the cluster wait for versions:
a :class:`rlhub.wsync.DataPlaneSource` on ``etcd://…`` and a push stream
(:class:`rlhub.wsync.PushSource` under a :class:`FailoverSource`) on the
hub list. Every collector ends on the final version; each saw versions
that only grow, epochs that never go back, the bytes published under each
number, and accounts for every version number (delivered or skipped).
"""

from __future__ import annotations

import shutil
import signal
import threading
import time

import numpy as np
import pytest

import rlhub
import rlhub.wsync as ws
from rlhub import _channel
from rlhub.tensors import load_bytes
from conftest import Hub
from test_cluster_follow import CLUSTER, Etcd

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None,
                                reason="etcd is not installed: scripts/setup.d/20-etcd.sh installs etcd-server")

MODEL = "pol"


def weights(v: int) -> dict:
    return {"w": np.full(256, float(v), dtype=np.float32)}


class Collector:
    """A thread taking every newest version from ``src`` (as a Receiver
    does: ``wait_newer`` after the version it runs)."""

    def __init__(self, name: str, src):
        self.name, self.src = name, src
        self.got: list[tuple[int, int, bool]] = []  # (version, epoch, bytes are that version's)
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name=name, daemon=True)
        self._t.start()

    def _run(self) -> None:
        have = 0
        try:
            while not self._stop.is_set():
                wv = self.src.wait_newer(have, timeout=0.5)
                if wv is None:
                    continue
                w = load_bytes(bytes(wv.blob))["w"]
                self.got.append((wv.version, wv.epoch, bool(np.all(w == float(wv.version)))))
                have = wv.version
                self.src.running(have)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    @property
    def version(self) -> int:
        return self.got[-1][0] if self.got else 0

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=30)
        self.src.close()


def wait_until(cond, timeout: float, what: str, collectors=()) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        for c in collectors:
            assert c.error is None, f"{c.name} stopped: {c.error!r}"
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.02)


def test_python_collectors_follow_the_primary_across_two_sigkills(rlhub_bin, tmp_path):
    etcd = Etcd(tmp_path)
    hubs: dict[str, Hub] = {}
    collectors: list[Collector] = []
    try:
        for i in range(3):
            d = tmp_path / f"h{i}"
            d.mkdir()
            hubs[f"h{i}"] = Hub(rlhub_bin, d, extra=["--etcd", etcd.url, "--cluster", CLUSTER, "--lease-ttl", "1s",
                                                     "--member-id", f"h{i}"])
        listed = ",".join(h.addr for h in hubs.values())
        target = _channel.etcd_target(etcd.url, CLUSTER)
        store = rlhub.StoreClient(listed, timeout=30.0)
        epochs: dict[int, int] = {}

        def live_primary(after: int) -> tuple[str, int]:
            got: list[tuple[str, int]] = []

            def elected() -> bool:
                lead = etcd.leader()
                if lead is not None and lead[1] > after and hubs[lead[0]].proc.poll() is None:
                    got.append(lead)
                    return True
                return False
            wait_until(elected, 60, f"a live primary elected after epoch {after}")
            return got[-1]

        def publish(v: int) -> None:
            deadline = time.monotonic() + 60
            while True:
                try:
                    epochs[v] = store.push(MODEL, weights(v), version=v, expect=v - 1).epoch
                    return
                except rlhub.StaleVersion as e:
                    if e.current_version == v:  # it landed before the answer was lost
                        epochs[v] = e.current_epoch
                        return
                    raise
                except rlhub.Unavailable:
                    assert time.monotonic() < deadline, f"v{v} not published within 60 s"
                    time.sleep(0.1)

        pid, e1 = live_primary(0)
        publish(1)
        collectors.append(Collector("py data plane (etcd)", ws.DataPlaneSource(target, MODEL, collector_id="py-dp")))
        collectors.append(Collector("py push stream (hub list) under failover", ws.FailoverSource(
            [("push", lambda: ws.PushSource(listed, MODEL, collector_id="py-push"))], model=MODEL, backoff=0.02)))
        last_epoch, v = e1, 1
        for rnd in range(3):
            for _ in range(4):
                v += 1
                publish(v)
            final = v
            wait_until(lambda: all(c.version >= final for c in collectors), 120,
                       f"every collector on v{final} (round {rnd})", collectors)
            assert epochs[final] == last_epoch, (rnd, epochs, last_epoch)
            if rnd < 2:
                hubs[pid].proc.send_signal(signal.SIGKILL)  # the collectors are waiting on it
                hubs[pid].proc.wait()
                pid, last_epoch = live_primary(last_epoch)
        for c in collectors:
            assert c.error is None, f"{c.name}: {c.error!r}"
            got = c.got
            for i, (ver, ep, right) in enumerate(got):
                assert right, f"{c.name}: v{ver} does not carry the bytes published as v{ver}"
                assert ep == epochs[ver], f"{c.name}: v{ver} of epoch {ep}, published in epoch {epochs[ver]}"
                if i:
                    assert ver > got[i - 1][0] and ep >= got[i - 1][1], f"{c.name}: {got[i]} after {got[i - 1]}"
            skipped = c.src.stats["skipped"] if isinstance(c.src, ws.DataPlaneSource) else c.src.skipped
            assert got[0][0] - 1 + len(got) + skipped == v, (c.name, got, skipped)
            assert got[-1][0] == v
        dp = collectors[0].src
        assert dp.transport == "dataplane" and dp.stats["follows"] >= 2, dp.stats
    finally:
        for c in collectors:
            c.stop()
        for h in hubs.values():
            h.stop()
        etcd.stop()
