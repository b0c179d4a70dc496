"""GradClient: a reused sequence number is raised however its earlier attempts failed; a lost answer's retry is a duplicate; a closed client reopens (real hub, real torch)."""

from __future__ import annotations

import time

import pytest
import torch

import rlhub
from rlhub.grads import GradClient
from conftest import free_port
from test_grads import AnswerDropper
from test_silent_hub import _hub, _sends
from rlhub import _bulk


def setup(addr: str, name: str, sd: dict) -> None:
    with rlhub.StoreClient(addr) as s:
        s.push(name, sd, version=1, expect=0)


def wait_version(s: rlhub.StoreClient, name: str, v: int, timeout: float = 30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = s.pull(name)
        if got.version >= v:
            return got
        time.sleep(0.02)
    raise AssertionError(f"{name} never reached version {v}")


# -- Defect 1: a reused seq is reported as a successful duplicate ----------


def test_reused_seq_is_raised_even_when_an_earlier_attempt_sent_nothing(hub):
    """grads.py docstring: ALREADY_EXISTS "on a first attempt ... means the
    sequence number was used before, and is raised". When the first attempt
    provably sent nothing (its dial was refused) the second attempt is, for
    the hub, the first one: yet push() returns Receipt(duplicate=True) and
    the new gradient is silently dropped."""
    setup(hub.addr, "pol", {"w": torch.zeros(4)})
    with GradClient(hub.addr, "reuse") as g, rlhub.StoreClient(hub.addr) as s:
        g.register("pol", optimizer={"kind": "sgd", "lr": 1.0}, reduction="sum")
        g.push("pol", 1, {"w": torch.ones(4)}, seq=7)
        wait_version(s, "pol", 2)
        # Control: the reuse is refused when the first attempt reaches the hub.
        with pytest.raises(rlhub.AlreadyExists):
            g.push("pol", 2, {"w": torch.full((4,), 2.0)}, seq=7)
        # The same reuse, the first attempt going to a secondary nothing
        # listens on (connection refused: nothing sent).
        g._targets = [(f"127.0.0.1:{free_port()}", "gone")]
        with pytest.raises(rlhub.AlreadyExists):
            r = g.push("pol", 2, {"w": torch.full((4,), 3.0)}, seq=7)
            print("\nreused seq 7 reported as success:", r)
        assert s.pull("pol").version == 2


@pytest.mark.parametrize("first", [b"", _bulk.MAGIC[:4]], ids=["silent", "half-magic"])
def test_reused_seq_is_raised_after_a_handshake_that_sent_nothing(hub, monkeypatch, first):
    """As above, the first attempt going to a secondary that accepts the
    connection and never finishes the data-plane handshake: the request
    is sent only after the handshake, so nothing was sent, and the reuse
    is raised — not taken for an earlier attempt's duplicate."""
    monkeypatch.setattr(_bulk, "HANDSHAKE_TIMEOUT", 0.3)
    addr, close = _hub(_sends(first))
    try:
        reused_seq_is_raised_after(hub.addr, addr)
    finally:
        close()


def reused_seq_is_raised_after(hub_addr: str, first: str) -> None:
    """A gradient pushed with seq 7 and applied; the same seq reused for a
    new gradient whose first attempt goes to the secondary at ``first``
    (one that fails it before anything is sent), the rest to the hub: the
    hub's ALREADY_EXISTS is raised and the new gradient is not applied."""
    setup(hub_addr, "pol", {"w": torch.zeros(4)})
    with GradClient(hub_addr, "reuse") as g, rlhub.StoreClient(hub_addr) as s:
        g.register("pol", optimizer={"kind": "sgd", "lr": 1.0}, reduction="sum")
        g.push("pol", 1, {"w": torch.ones(4)}, seq=7)
        wait_version(s, "pol", 2)
        g._targets = [(first, "first")]
        g._refreshed = time.monotonic()
        with pytest.raises(rlhub.AlreadyExists):
            r = g.push("pol", 2, {"w": torch.full((4,), 3.0)}, seq=7)
            print("\nreused seq 7 reported as success:", r)
        assert s.pull("pol").version == 2


def test_lost_answer_retry_is_still_a_duplicate(hub):
    """The case ``duplicate`` is for (and test_retried_duplicate_is_success
    meant to show): the first attempt reached the hub and its answer was
    lost; the retry is answered ALREADY_EXISTS (or ABORTED first)."""
    setup(hub.addr, "pol", {"w": torch.zeros(4)})
    p = AnswerDropper(hub.addr)
    try:
        with GradClient(hub.addr, "dup", timeout=10.0) as g, rlhub.StoreClient(hub.addr) as s:
            g.register("pol", optimizer={"kind": "sgd", "lr": 1.0}, reduction="sum")
            g.secondaries()
            sid = g._targets[0][1]
            g._targets = [(p.addr, sid)]
            g._refreshed = time.monotonic()
            r = g.push("pol", 1, {"w": torch.ones(4)}, seq=5)
            assert r.duplicate and r.attempts >= 2 and r.addr == hub.addr, r
            v = wait_version(s, "pol", 2)
            assert v.tensors["w"].tolist() == [-1.0] * 4  # applied once
    finally:
        p.close()


# -- Defect 2: a closed GradClient is half usable ---------------------------


def test_operator_calls_after_close_work_like_push(hub):
    """close() re-creates channels on use (_bulk docstring: "as GradClient's
    gRPC channels are re-created after its close"; test_push_after_close_
    still_works) but ``self._hub`` keeps a stub on the closed channel:
    stats()/register()/secondaries() raise a bare ValueError."""
    setup(hub.addr, "pol", {"w": torch.zeros(4)})
    g = GradClient(hub.addr)
    try:
        g.register("pol", optimizer={"kind": "sgd", "lr": 0.1})
        g.push("pol", 1, {"w": torch.ones(4)})
        g.close()
        assert g.push("pol", 1, {"w": torch.ones(4)}).attempts == 1  # works today
        assert g.stats().total.pushed >= 1  # ValueError: Cannot invoke RPC on closed channel!
    finally:
        g.close()


def test_push_after_close_with_a_due_refresh(hub):
    """The same stale stub makes push() itself raise ValueError (not an
    RlhubError: _maybe_refresh swallows only those) once the secondaries'
    list is due a refresh."""
    setup(hub.addr, "pol", {"w": torch.zeros(4)})
    g = GradClient(hub.addr, refresh_every=0.1)
    try:
        g.register("pol", optimizer={"kind": "sgd", "lr": 0.1})
        g.push("pol", 1, {"w": torch.ones(4)})
        g.close()
        time.sleep(0.3)
        assert g.push("pol", 1, {"w": torch.ones(4)}).attempts == 1
    finally:
        g.close()
