"""StoreClient over the data plane on a silent hub: a real listener that
accepts connections and sends nothing, stops mid-handshake, or answers the
handshake and then never the request (a hung or SIGSTOPped hub). A pull or
push ends within the client's ``timeout`` with ``DeadlineExceeded`` whose
message says the hub sent nothing, not a bare "deadline exceeded"."""

from __future__ import annotations

import time

import pytest

import rlhub
from rlhub import _bulk
from test_silent_hub import _counting_hub, _hub, _sends

CASES = [(b"", "sent nothing"), (_bulk.MAGIC[:4], "then nothing"), (_bulk.MAGIC, "sent no answer")]


@pytest.mark.parametrize("op", ["pull", "push"])
@pytest.mark.parametrize("first,says", CASES, ids=["silent", "half-sent", "magic-then-silent"])
def test_store_call_on_a_silent_hub_says_it_sent_nothing(first, says, op):
    timeout = 1.5
    addr, close = _hub(_sends(first))
    try:
        with rlhub.StoreClient(addr, timeout=timeout) as s:
            t0 = time.monotonic()
            with pytest.raises(rlhub.DeadlineExceeded) as e:
                if op == "pull":
                    s.pull("m")
                else:
                    s.push("m", b"x" * 64, version=1)
            took = time.monotonic() - t0
        msg = str(e.value)
        assert says in msg, msg
        assert took < timeout + 5, f"{op} with timeout={timeout} took {took:.1f} s"  # a backstop only
    finally:
        close()


@pytest.mark.parametrize("first,says", CASES[:2], ids=["silent", "half-sent"])
def test_a_silent_handshake_with_time_left_is_unavailable_naming_it(first, says, monkeypatch):
    # With the call's time left, a handshake that times out is Unavailable
    # (tried again within the retries); the last one's message says what the
    # hub sent. The handshake's bound is shortened so the test is quick.
    monkeypatch.setattr(_bulk, "HANDSHAKE_TIMEOUT", 0.3)
    addr, close = _hub(_sends(first))
    try:
        with rlhub.StoreClient(addr, timeout=60, retries=1) as s:
            with pytest.raises(rlhub.Unavailable) as e:
                s.pull("m")
        msg = str(e.value)
        assert "timed out" in msg and says in msg, msg
    finally:
        close()


@pytest.mark.parametrize("op", ["pull", "push"])
@pytest.mark.parametrize("first,says", CASES[:2], ids=["silent", "half-sent"])
def test_a_silent_handshake_is_not_tried_again_and_again(first, says, op, monkeypatch):
    # A hub that accepted the connection and sent nothing for a whole
    # handshake bound will not start on the fifth try: with the default
    # retries a call dialled it five times (five 10 s handshakes, ~51 s of
    # a 60 s timeout) before ending Unavailable. Now a second silent
    # handshake to the same address ends the call, saying what was waited
    # for. The handshake's bound is shortened so the test is quick; the
    # connections the hub accepted are counted.
    monkeypatch.setattr(_bulk, "HANDSHAKE_TIMEOUT", 0.3)
    addr, close, dials = _counting_hub(first)
    try:
        with rlhub.StoreClient(addr, timeout=60) as s:
            assert s.retries == 4
            with pytest.raises(rlhub.Unavailable) as e:
                if op == "pull":
                    s.pull("m")
                else:
                    s.push("m", b"x" * 64, version=1)
        assert len(dials) == 2, f"{op} dialled a silent hub {len(dials)} times"
        msg = str(e.value)
        assert says in msg and "not tried again" in msg, msg
    finally:
        close()
