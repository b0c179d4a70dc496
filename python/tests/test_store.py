import signal
import threading
import time
import urllib.request

import grpc
import numpy as np
import pytest
import safetensors.numpy as stn

import rlhub
from rlhub import _channel

import conftest
from conftest import Hub
from etcdproc import sigstop


def sd(seed=0, n=1000):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((n, 4)).astype(np.float32), "b": np.zeros(4, np.float32)}


def test_push_pull_newest_exact_and_not_modified(hub):
    with rlhub.StoreClient(hub.addr) as s:
        s.push("pol", sd(1), version=1, expect=0)
        s.push("pol", sd(2), version=2, expect=1)
        v = s.pull("pol")
        assert (v.name, v.version) == ("pol", 2)
        np.testing.assert_array_equal(v.tensors["w"], sd(2)["w"])
        np.testing.assert_array_equal(s.pull("pol", 1).tensors["w"], sd(1)["w"])
        assert s.pull("pol", if_newer_than=2) is None
        assert s.pull("pol", if_newer_than=1).version == 2
        [info] = s.list()
        assert (info.name, info.version) == ("pol", 2)


def test_stale_push_raises_with_current_version_and_changes_nothing(hub):
    with rlhub.StoreClient(hub.addr) as s:
        s.push("pol", sd(1), version=5, expect=0)
        with pytest.raises(rlhub.StaleVersion) as ei:
            s.push("pol", sd(2), version=4)
        assert ei.value.current_version == 5
        with pytest.raises(rlhub.StaleVersion) as ei:
            s.push("pol", sd(2), version=9, expect=3)
        assert ei.value.current_version == 5
        v = s.pull("pol")
        assert v.version == 5
        np.testing.assert_array_equal(v.tensors["w"], sd(1)["w"])


def test_bad_inputs_get_named_exceptions(hub):
    with rlhub.StoreClient(hub.addr) as s:
        with pytest.raises(rlhub.NotFound):
            s.pull("nope")
        with pytest.raises(rlhub.InvalidArgument):
            s.push("pol", b"\x10" + b"\0" * 7 + b"not json at all!", version=1)
        with pytest.raises(rlhub.InvalidArgument):
            s.push("bad name with spaces/..", sd(), version=1)
        # Versions out of a uint64's range name their field (protobuf's
        # own refusal is a bare ValueError naming neither).
        for call, field in [
            (lambda: s.push("pol", sd(), version=-1), "version"),
            (lambda: s.push("pol", sd(), version=1, expect=-2), "expect"),
            (lambda: s.push("pol", sd(), version=1 << 64), "version"),
            (lambda: s.pull("pol", version=-1), "version"),
            (lambda: s.pull("pol", if_newer_than=-1), "if_newer_than"),
            (lambda: s.pull_into("pol", {"w": np.zeros(4, np.float32)}, version=-3), "version"),
            (lambda: next(s.watch("pol", after=-1)), "after"),
            (lambda: next(s.watch_into("pol", {"w": np.zeros(4, np.float32)}, after=10**40)), "after"),
        ]:
            with pytest.raises(rlhub.InvalidArgument, match=f"^{field} must be a whole number") as ei:
                call()
            assert len(str(ei.value)) < 100
        with rlhub.GradClient(hub.addr, "c") as g:
            with pytest.raises(rlhub.InvalidArgument, match="^base_version must"):
                g.push("pol", -1, {"w": np.zeros(4, np.float32)})
        assert s.list() == []


def test_watch_sees_increasing_versions_and_ends_on_newest(hub):
    with rlhub.StoreClient(hub.addr) as s:
        s.push("pol", sd(0, 10), version=1)
        seen = []

        def writer():
            with rlhub.StoreClient(hub.addr) as w:
                for v in range(2, 31):
                    w.push("pol", sd(v, 10), version=v)

        t = threading.Thread(target=writer)
        t.start()
        for v in s.watch("pol", after=0, timeout=60):
            seen.append(v.version)
            if v.version == 30:
                break
        t.join()
        assert seen == sorted(set(seen)) and seen[-1] == 30


@pytest.mark.parametrize("transport", ["auto", "grpc"])
@pytest.mark.parametrize("follow_lives", [True, False])
def test_watch_into_rides_out_a_hub_killed_and_restarted(rlhub_bin, tmp_path, transport, follow_lives):
    """A hub SIGKILLed under a watch and restarted on its address and
    --data: the watch goes on after the last version it yielded, on either
    transport (over gRPC its stream broke Unavailable and ended the watch,
    while the data plane's polls were tried again), and each version it
    yields is whole in the target. The restarted hub names other lives, so
    a watch that follows them (the default) may yield the hub's newest, v2,
    once again (docs/weight-sync.md, "Lives"); one that does not only goes
    on after it."""
    h = Hub(rlhub_bin, tmp_path)
    addr = h.addr
    w = rlhub.StoreClient(addr, transport=transport, retries=8)
    try:
        with rlhub.StoreClient(addr) as s:
            s.push("m", {"w": np.full(1000, 1, np.float32)}, version=1, expect=0)
        tgt = {"w": np.zeros(1000, np.float32)}
        seen, errs = [], []

        def watch():
            try:
                for v in w.watch_into("m", tgt, timeout=60, follow_lives=follow_lives):
                    seen.append((v, set(tgt["w"].tolist())))
                    if v == 3:
                        return
            except Exception as e:  # noqa: BLE001 - the test looks at it
                errs.append(e)

        t = threading.Thread(target=watch)
        t.start()
        _until(lambda: seen or errs)
        with rlhub.StoreClient(addr) as s:
            s.push("m", {"w": np.full(1000, 2, np.float32)}, version=2)
        _until(lambda: len(seen) == 2 or errs)
        h.proc.send_signal(signal.SIGKILL)
        h.proc.wait()
        h.stop()
        h = Hub(rlhub_bin, tmp_path, addr=addr)
        with rlhub.StoreClient(addr) as s:
            s.push("m", {"w": np.full(1000, 3, np.float32)}, version=3)
        t.join(60)
        assert not t.is_alive()
        assert not errs, errs
        if follow_lives and seen[2:3] == [(2, {2.0})]:
            del seen[2]  # v2 again, from the restarted hub's life (if v3 was not there yet)
        assert seen == [(1, {1.0}), (2, {2.0}), (3, {3.0})]
    finally:
        w.close()
        h.stop()


@pytest.mark.parametrize("transport", ["auto", "grpc"])
def test_a_watch_outlasts_a_hub_down_longer_than_its_retries(rlhub_bin, tmp_path, transport):
    """A watch with no timeout on one hub, SIGKILLed and restarted on its
    address and --data 4 s later: far longer than the client's retries
    (one, ~0.1 s), which bounded the watch before. The watch waits through
    the outage and yields the version pushed after the restart (after v1
    once again when it asked before v2 landed: the restarted hub names
    another life, docs/weight-sync.md "Lives"). Killed again, it waits
    again until close() ends it (CANCELLED). An error a retry cannot
    change (InvalidArgument) still ends a watch at once."""
    h = Hub(rlhub_bin, tmp_path)
    addr = h.addr
    w = rlhub.StoreClient(addr, transport=transport, retries=1)
    try:
        with pytest.raises(rlhub.InvalidArgument):
            next(iter(w.watch("no spaces allowed")))
        with rlhub.StoreClient(addr) as s:
            s.push("m", {"w": np.ones(3, np.float32)}, version=1, expect=0)
        seen, errs = [], []

        def watch():
            try:
                for v in w.watch("m"):
                    seen.append(v.version)
            except Exception as e:  # noqa: BLE001 - the test looks at it
                errs.append(e)

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        _until(lambda: seen == [1] or errs)
        h.proc.send_signal(signal.SIGKILL)
        h.proc.wait()
        h.stop()
        time.sleep(4)  # the outage
        assert t.is_alive() and not errs, errs
        h = Hub(rlhub_bin, tmp_path, addr=addr)
        with rlhub.StoreClient(addr) as s:
            s.push("m", {"w": np.full(3, 2, np.float32)}, version=2)
        _until(lambda: seen[-1:] == [2] or errs)
        assert not errs, errs
        if seen[1:2] == [1]:
            del seen[1]  # v1 again, from the restarted hub's life
        assert seen == [1, 2]

        h.proc.send_signal(signal.SIGKILL)
        h.proc.wait()
        time.sleep(1.5)
        assert t.is_alive() and not errs, errs
        w.close()
        t.join(15)
        assert not t.is_alive(), "close() did not end a watch waiting for its hub"
        assert len(errs) == 1 and errs[0].code == grpc.StatusCode.CANCELLED, errs
        assert seen == [1, 2]
    finally:
        w.close()
        h.stop()


def test_a_grpc_client_reaches_a_hub_back_from_a_long_outage(rlhub_bin, tmp_path):
    """A hub down for seconds while a client keeps calling it, then
    restarted on its address: the client's next call (a pull and a list,
    each retried with back-off for about a second) reaches it. With gRPC's
    default reconnect back-off (1 s growing to 120 s) the channel had
    backed off past the client's retries and kept failing 'Failed to
    connect' for seconds after the hub was back."""
    h = Hub(rlhub_bin, tmp_path)
    addr = h.addr
    s = rlhub.StoreClient(addr, transport="grpc")
    try:
        s.push("m", {"w": np.ones(3, np.float32)}, version=1, expect=0)
        h.proc.send_signal(signal.SIGKILL)
        h.proc.wait()
        h.stop()
        end = time.monotonic() + 5
        while time.monotonic() < end:  # callers that keep trying meanwhile
            with pytest.raises(rlhub.Unavailable):
                s.pull("m")
        h = Hub(rlhub_bin, tmp_path, addr=addr)
        assert s.pull("m").version == 1
        assert [m.name for m in s.list()] == ["m"]
    finally:
        s.close()
        h.stop()


def test_a_grpc_watch_on_a_hub_that_hangs_asks_again(rlhub_bin, tmp_path, monkeypatch):
    """A hub that stops answering under a watch with no timeout (SIGSTOP:
    as a machine cut off, no reset comes): the channel's keepalive pings
    find it silent, the stream breaks Unavailable, and the watch opens it
    again (a watch outlasts its hub: test above); continued, the hub
    serves the watch its next version. Without the pings the stream waited
    forever and was never opened again. The pings are shortened here from
    30 s + 20 s to 10 s (the least interval a hub allows) + 2 s."""
    monkeypatch.setattr(_channel, "KEEPALIVE_MS", (10_000, 2_000))
    h = Hub(rlhub_bin, tmp_path)
    s = rlhub.StoreClient(h.addr, transport="grpc", retries=0)
    opened = []  # when each watch stream was opened
    real = s._watch

    def counting(*a, **kw):
        opened.append(time.monotonic())
        return real(*a, **kw)

    s._watch = counting
    try:
        s.push("m", {"w": np.ones(3, np.float32)}, version=1, expect=0)
        seen, errs = [], []

        def watch():
            try:
                for v in s.watch("m", after=1):
                    seen.append(v.version)
            except Exception as e:  # noqa: BLE001 - the test looks at it
                errs.append(e)

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        with rlhub.StoreClient(h.addr) as p:
            p.push("m", {"w": np.ones(3, np.float32)}, version=2)
        _until(lambda: seen == [2])  # the watch's stream is up
        time.sleep(1)  # and quiet: nothing in flight the hub owes an answer
        assert len(opened) == 1
        t0 = time.monotonic()
        sigstop(h.proc)
        _until(lambda: len(opened) > 1 or errs, 40)
        assert not errs, errs
        print(f"the watch asked again {opened[1] - t0:.1f} s after the hub stopped")
        h.proc.send_signal(signal.SIGCONT)
        with rlhub.StoreClient(h.addr) as p:
            p.push("m", {"w": np.ones(3, np.float32)}, version=3)
        _until(lambda: seen == [2, 3] or errs, 40)
        assert not errs, errs
    finally:
        s.close()
        h.proc.send_signal(signal.SIGKILL)
        h.stop()


def _until(cond, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_python_push_is_byte_identical_when_pulled_by_go_cli(hub, tmp_path):
    d = sd(3)
    with rlhub.StoreClient(hub.addr) as s:
        s.push("cross", d, version=1)
    out = tmp_path / "go.safetensors"
    hub.run_cli("model", "pull", "--hub", hub.addr, "--name", "cross", "-o", str(out))
    assert out.read_bytes() == rlhub.save_bytes(d) == stn.save(d)


def test_go_cli_push_is_byte_identical_when_pulled_by_python(hub, tmp_path):
    d = sd(4)
    f = tmp_path / "in.safetensors"
    stn.save_file(d, str(f))
    hub.run_cli("model", "push", "--hub", hub.addr, "--name", "cross", "--version", "3", str(f))
    with rlhub.StoreClient(hub.addr) as s:
        v = s.pull("cross")
    assert v.version == 3 and bytes(v.blob) == f.read_bytes()


def test_torch_state_dict_round_trip(hub):
    torch = pytest.importorskip("torch")
    m = torch.nn.Linear(8, 3)
    with rlhub.StoreClient(hub.addr) as s:
        s.push("lin", m.state_dict(), version=1)
        v = s.pull("lin", framework="torch")
    m2 = torch.nn.Linear(8, 3)
    m2.load_state_dict(v.tensors)
    for k, t in m.state_dict().items():
        assert torch.equal(t, m2.state_dict()[k])
    # The tensors are views over the pulled bytes, not copies of them.
    blob = np.frombuffer(v.blob, np.uint8)
    for k, t in v.tensors.items():
        assert blob.ctypes.data <= t.data_ptr() < blob.ctypes.data + blob.nbytes, k


def test_unread_grpc_watch_is_cut_and_goes_on_at_the_newest(rlhub_bin, tmp_path):
    """A gRPC watch left unconsumed while a large version lands: the hub
    cannot send it (flow control) and, without a bound, held that version
    for as long as the caller did not ask for the next. The hub now ends
    the stream once the version is not taken within --body-timeout + its
    length at --body-min-rate, releasing it and counting the cut; the
    watch asks again on its next turn and yields the newest version whole,
    without an error."""
    port = conftest.free_port()
    h = Hub(rlhub_bin, tmp_path, extra=("--body-timeout", "2s", "--body-min-rate", "16MiB",
                                        "--metrics-listen", f"127.0.0.1:{port}"))
    n = 10 << 20  # 40 MiB of float32: more than gRPC's windows and the sockets take unread
    # Without BDP probing the watch's stream window stays at its initial
    # size; with it, grpc's core may grow the window past the 40 MiB while
    # the first version is read fast, take the second whole unread, and
    # leave nothing blocked on the hub to cut (seen once in CI).
    ch = _channel.channel(h.addr, options=[("grpc.http2.bdp_probe", 0)])
    try:
        with rlhub.StoreClient(h.addr) as s, rlhub.StoreClient(h.addr, transport="grpc", channel_=ch) as w:
            s.push("m", {"w": np.full(n, 1, np.float32)}, version=1, expect=0)
            it = w.watch("m", timeout=60)
            first = next(it)
            assert first.version == 1
            s.push("m", {"w": np.full(n, 2, np.float32)}, version=2, expect=1)

            def cut() -> bool:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    return 'rlhub_grpc_streams_cut_total{direction="sent"} 1' in r.read().decode()

            deadline = time.monotonic() + 30
            while not cut():  # the watch's stream, v2 unread on it
                assert time.monotonic() < deadline, "the hub never cut the unread watch"
                time.sleep(0.1)
            s.push("m", {"w": np.full(n, 3, np.float32)}, version=3, expect=2)
            v = next(it)
            assert v.version in (2, 3)
            assert np.array_equal(v.tensors["w"], np.full(n, v.version, np.float32))
            it.close()
    finally:
        ch.close()
        h.stop()
