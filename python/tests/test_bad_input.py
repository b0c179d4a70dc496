"""Bad input from the caller or the peer gets a clear, bounded error and
changes nothing: malformed tokens, huge tensor names, a silent hub."""

from __future__ import annotations

import socket
import subprocess
import threading

import numpy as np
import pytest
import torch

import rlhub
from rlhub import _channel, wsync
from conftest import Hub

HUGE = "y" * (1 << 20)


@pytest.fixture
def token_hub(rlhub_bin, tmp_path):
    subprocess.run([rlhub_bin, "token", "new", "--role", "admin", "--scope", "*", "--out",
                    str(tmp_path / "admin.token"), "--append", str(tmp_path / "tokens")],
                   check=True, capture_output=True, timeout=60)
    h = Hub(rlhub_bin, tmp_path, extra=("--auth-tokens", str(tmp_path / "tokens")))
    h.token = _channel.read_token(str(tmp_path / "admin.token"))
    yield h
    h.stop()
    rlhub.configure(None)


def test_a_token_from_the_environment_with_a_trailing_newline_is_trimmed(token_hub, monkeypatch):
    """RLHUB_TOKEN as `$(cat f; echo)` or a secret mounted from a file
    leaves a newline: the Go clients trim it, and so does Python (before,
    every gRPC call failed with a bare "Invalid metadata" while the data
    plane was told "unknown token")."""
    rlhub.configure(None)
    monkeypatch.delenv("RLHUB_TOKEN_FILE", raising=False)
    monkeypatch.setenv("RLHUB_TOKEN", token_hub.token + "\n")
    for transport in ("auto", "grpc"):
        with rlhub.StoreClient(token_hub.addr, transport=transport, timeout=20) as s:
            s.push(f"m-{transport}", {"w": np.ones(3, np.float32)}, version=1, expect=0)
            assert s.pull(f"m-{transport}").version == 1
            assert [m.name for m in s.list()].count(f"m-{transport}") == 1


@pytest.mark.parametrize("token", ["rlh_ab cd", "rlh_ab\ncd", "rlh_ab\x00cd", "rlh_é", "r" * 1025])
def test_a_malformed_token_is_refused_before_anything_is_sent(token_hub, token):
    """A token no header can carry (white space, a control or non-ASCII
    character) or longer than the data plane's hello takes is refused as
    Unauthenticated where it is given, on either transport alike, without
    echoing the secret; the hub is unchanged."""
    with pytest.raises(rlhub.Unauthenticated, match="malformed token") as ei:
        rlhub.configure(rlhub.Security(token=token))
    assert token not in str(ei.value) and "rlh_ab" not in str(ei.value)
    rlhub.configure(rlhub.Security(token=token_hub.token))
    with rlhub.StoreClient(token_hub.addr) as s:
        assert s.list() == []


def test_huge_tensor_names_are_not_echoed_whole(hub):
    """A tensor's name may be as long as a header allows (the hub takes 1
    MiB ones): errors about it, the caller's or a pulled version's, quote
    it bounded."""
    with rlhub.StoreClient(hub.addr) as s:
        for bad in ({HUGE: np.array(["a"])}, {(HUGE,): np.ones(1, np.float32)},
                    {HUGE: torch.ones(1, dtype=torch.complex128)}):
            with pytest.raises((TypeError, ValueError)) as ei:
                s.push("m", bad, version=1)
            assert len(str(ei.value)) < 300, len(str(ei.value))
        assert s.list() == []  # nothing sent
        s.push("m", {HUGE: torch.ones(2, dtype=torch.bfloat16)}, version=1, expect=0)
        v = s.pull("m")  # numpy has no bfloat16
        with pytest.raises(TypeError, match="no numpy equivalent") as ei:
            v.tensors
        assert len(str(ei.value)) < 300, len(str(ei.value))
        frozen = np.zeros(2, np.float16)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="read-only") as ei:
            s.pull_into("m", {HUGE: frozen})
        assert len(str(ei.value)) < 300, len(str(ei.value))


class _Silent:
    """A server that accepts connections and never answers."""

    def __init__(self) -> None:
        self._l = socket.socket()
        self._l.bind(("127.0.0.1", 0))
        self._l.listen(16)
        self.addr = "127.0.0.1:%d" % self._l.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while True:
            try:
                c, _ = self._l.accept()
            except OSError:
                return
            self._conns.append(c)

    def close(self) -> None:
        self._l.shutdown(socket.SHUT_RDWR)
        self._l.close()
        self._t.join()
        for c in self._conns:
            c.close()


def test_a_watch_of_a_silent_hub_names_a_long_model_bounded():
    """A watch whose deadline passes while the hub never answers raises
    DeadlineExceeded naming the model, bounded (the name is anyone's, up
    to what the hub refuses only once it answers)."""
    srv = _Silent()
    try:
        with rlhub.StoreClient(srv.addr, transport="grpc", timeout=0.5) as s:
            with pytest.raises(rlhub.DeadlineExceeded) as ei:
                next(s.watch("z" * 400_000, timeout=1))
            assert len(str(ei.value)) < 1000, len(str(ei.value))
    finally:
        srv.close()


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_a_push_expecting_an_absurd_version_is_refused_and_lands_nothing(hub, transport):
    """expect=2**64-1 (a whole uint64, so the client sends it) is a
    compare-and-set no model passes; the hub took it for the Go API's
    "unchecked" and let the push land over version 1."""
    with rlhub.StoreClient(hub.addr, transport=transport) as s:
        s.push("m", {"w": np.ones(3, np.float32)}, version=1, expect=0)
        with pytest.raises(rlhub.InvalidArgument, match="expect"):
            s.push("m", {"w": np.zeros(3, np.float32)}, version=2, expect=(1 << 64) - 1)
        v = s.pull("m")
        assert v.version == 1 and np.array_equal(v.tensors["w"], np.ones(3, np.float32))


def test_out_of_range_versions_in_weight_sync_and_register_name_their_field(hub):
    """Versions, lives and counts out of a uint64's range are refused as
    InvalidArgument naming the field, before anything is sent (protobuf's
    own refusal is a bare ValueError naming neither), as the store client
    does."""
    with rlhub.StoreClient(hub.addr) as s:
        s.push("m", {"w": np.ones(3, np.float32)}, version=1, expect=0)
    calls = [
        (lambda: wsync.PushSource(hub.addr, "m", start=-1), "start"),
        (lambda: wsync.PushSource(hub.addr, "m", start_life=1 << 64), "start_life"),
        (lambda: wsync.DataPlaneSource(hub.addr, "m", start=-1), "start"),
        (lambda: wsync.report(hub.addr, "c", "m", -1, "push"), "version"),
    ]
    with wsync.DataPlaneSource(hub.addr, "m") as dp:
        calls += [(lambda: dp.wait_newer(-1, 1), "after"), (lambda: dp.get_if_newer(1 << 64), "than"),
                  (lambda: dp.wait_newer(0, 1, life=-1), "life")]
        with rlhub.GradClient(hub.addr, "c") as g:
            calls += [(lambda: g.register("m", {"kind": "sgd", "lr": 0.1}, max_lag=-1), "max_lag"),
                      (lambda: g.register("m", {"kind": "sgd", "lr": 0.1}, checkpoint_every=-5), "checkpoint_every")]
            for call, field in calls:
                with pytest.raises(rlhub.InvalidArgument, match=f"^{field} must be a whole number"):
                    call()
            assert dp.stats["polls"] == 0
            assert "m" not in g.stats().versions  # nothing registered
