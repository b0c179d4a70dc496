"""Weight-sync receivers against the real binary: shared memory written by a
Go writer publishing flat out (zero torn reads), the hub's push stream and the
store, "only if newer", lag visible in `rlhub sync status`, clear errors."""

from __future__ import annotations

import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import rlhub
import rlhub.wsync as ws
from conftest import Hub
from rlhub._crc32c import _serial, crc32c, crc32c_numpy


def linear(i: int, o: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(i, o)


def filled(module: torch.nn.Module, value: float) -> dict:
    return {k: torch.full_like(t, value) for k, t in module.state_dict().items()}


def sync_status(hub, model: str) -> str:
    return hub.run_cli("sync", "status", "--hub", hub.addr, "--model", model).stdout


def collector_row(text: str, cid: str) -> list:
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == cid:
            return f  # COLLECTOR VERSION LAG VIA ATTACHED REPORTED...
    raise AssertionError(f"collector {cid} not in status:\n{text}")


# ---------------------------------------------------------------- CRC-32C

def test_crc32c_known_vector_and_reference():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c_numpy(b"123456789") == 0xE3069283
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 255, 256, 257, 4096 * 3 + 5, 70_001, (1 << 20) + 13):
        b = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        want = _serial(0xFFFFFFFF, memoryview(b)) ^ 0xFFFFFFFF
        assert crc32c_numpy(b) == want, n


@pytest.mark.parametrize("native", [True, False])
def test_copy_crc32c_copies_and_checksums_in_one_pass(monkeypatch, native):
    """copy_crc32c (the shm reader's fused copy + CRC) gives the bytes and
    the CRC of the reference, across piece boundaries, from bytes, numpy
    arrays and memoryviews (what a segment is), native or numpy."""
    from rlhub import _crc32c

    if not native:
        monkeypatch.setattr(_crc32c, "_FAST", None)
        monkeypatch.setattr(_crc32c, "_warned", True)
    rng = np.random.default_rng(1)
    piece = _crc32c._CHUNK
    for n in (0, 1, 4095, piece - 1, piece, piece + 1, 3 * piece + 5):
        src = rng.integers(0, 256, n, dtype=np.uint8)
        want = _serial(0xFFFFFFFF, memoryview(src.tobytes())) ^ 0xFFFFFFFF
        for s in (src.tobytes(), src, memoryview(src.tobytes())):
            dst = np.zeros(n, np.uint8)
            assert _crc32c.copy_crc32c(memoryview(dst), s) == want, n
            assert np.array_equal(dst, src), n
        assert crc32c(memoryview(src)) == want and crc32c(bytearray(src.tobytes())) == want, n
    with pytest.raises(ValueError):
        _crc32c.copy_crc32c(np.zeros(3, np.uint8), b"four")


# ---------------------------------------------------------- shared memory

VERSIONS = 6000
TENSORS = "weight=256x256,bias=256"  # an nn.Linear(256, 256): 257 KiB a version

READER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import rlhub.wsync as ws
    path, last = sys.argv[1], int(sys.argv[2])
    src = ws.ShmSource(path, verify=True)
    have, reads, bad = 0, 0, []
    print("open", flush=True)
    while have < last:
        wv = src.wait_newer(have, timeout=30)
        if wv is None:
            break
        reads += 1
        for name, a in wv.tensors().items():
            if not (a == np.float32(wv.version)).all():
                bad.append([wv.version, name])
        have = wv.version
    print(json.dumps({"reads": reads, "bad": bad, "last": have, "retries": src.stats["retries"]}), flush=True)
""")


def start_writer(rlhub_bin: str, path: str, versions: int, tensors: str = TENSORS, slots: int = 2) -> subprocess.Popen:
    w = subprocess.Popen([rlhub_bin, "sync", "shm-writer", "--path", path, "--model", "m", "--tensors", tensors,
                          "--versions", str(versions), "--slots", str(slots), "--wait-stdin"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = w.stdout.readline()
    assert line.startswith("ready "), line
    return w


@pytest.fixture
def shm_path():
    p = f"/dev/shm/rlhub-pytest-{os.getpid()}-{time.monotonic_ns()}"
    yield p
    if os.path.exists(p):
        os.unlink(p)


def test_shm_reader_never_torn_against_go_writer_flat_out(rlhub_bin, shm_path):
    """A Go writer publishes VERSIONS versions of an nn.Linear(256, 256) as
    fast as it can into a double buffer; every element of version v is
    float32(v). Two readers follow it: this process applies into a module
    with the seqlock alone (verify=False), a second process reads with
    CRC-32C verification. Every version either reader returns is checked in
    full: zero torn reads."""
    w = start_writer(rlhub_bin, shm_path, VERSIONS)
    child = None
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        child = subprocess.Popen([sys.executable, "-c", READER, shm_path, str(VERSIONS)],
                                 stdout=subprocess.PIPE, text=True, env=env)
        assert child.stdout.readline().strip() == "open"
        src = ws.ShmSource(shm_path, model="m", verify=False)
        m = torch.nn.Linear(256, 256)
        r = ws.Receiver(m, src)
        w.stdin.write("go\n")
        w.stdin.flush()
        applied, torn = 0, []
        while r.version < VERSIONS:
            assert r.wait(timeout=30), f"no newer version after v{r.version}"
            applied += 1
            v = float(r.version)
            # numpy checks: torch's intra-op threads crawl on a busy 2-core box.
            if not ((m.weight.detach().numpy() == v).all() and (m.bias.detach().numpy() == v).all()):
                torn.append(r.version)
        done = w.stdout.readline().strip()
        res = json.loads(child.stdout.readline())
        child.wait(timeout=30)
        print(f"writer: {done}; in-process reader (seqlock only): {applied} versions applied, "
              f"{src.stats['retries']} torn copies caught and retried; "
              f"child reader (CRC): {res['reads']} versions, {res['retries']} retries")
        assert torn == [] and res["bad"] == []
        assert r.version == VERSIONS and res["last"] == VERSIONS
        assert applied >= 2 and res["reads"] >= 2
        assert src.stats["reads"] == applied
        src.close()
    finally:
        if child is not None and child.poll() is None:
            child.kill()
        w.stdin.close()
        w.wait(timeout=30)
    assert not os.path.exists(shm_path)  # closing removes the segment


def test_shm_reader_reads_around_slots_leased_by_other_readers(rlhub_bin, shm_path):
    """Slot leases (docs/shm-layout.md): a Go writer with 4 slots has 2
    lease entries. Before it publishes, this test fills both as a Go
    leasing reader in this process would, naming slots 0 and 2; the writer
    then publishes flat out through slots 1 and 3 only, and the Python
    reader, which never leases, reads every version it gets whole."""
    versions = 2000
    w = start_writer(rlhub_bin, shm_path, versions, slots=4)
    try:
        fd = os.open(shm_path, os.O_RDWR)
        try:
            seg = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        slots, cap, stride = struct.unpack_from("<IQQ", seg, 12)
        (leases,) = struct.unpack_from("<I", seg, 60)
        assert (slots, leases) == (4, 2)
        for e, slot in enumerate((0, 2)):
            struct.pack_into("<QQ", seg, 512 + 32 * e, os.getpid() << 32 | (e + 1), slot + 1)
        src = ws.ShmSource(shm_path, model="m", verify=True)
        w.stdin.write("go\n")
        w.stdin.flush()
        have, reads, torn = 0, 0, []
        while have < versions:
            wv = src.wait_newer(have, timeout=30)
            assert wv is not None, f"no newer version after v{have}"
            reads += 1
            for name, a in wv.tensors().items():
                if not (a == np.float32(wv.version)).all():
                    torn.append((wv.version, name))
            have = wv.version
        assert w.stdout.readline().startswith("done ")
        seqs = [struct.unpack_from("<Q", seg, 4096 + i * stride)[0] for i in range(slots)]
        print(f"python reader: {reads} versions whole, {src.stats['retries']} retries; slot seqs {seqs}")
        assert torn == [] and have == versions and reads >= 2
        assert seqs[0] == 0 and seqs[2] == 0, f"the writer wrote a leased slot: seqs {seqs}"
        assert seqs[1] > 0 and seqs[3] > 0
        src.close()
        seg.close()
    finally:
        w.stdin.close()
        w.wait(timeout=30)


def test_shm_source_errors(rlhub_bin, shm_path):
    with pytest.raises(rlhub.NotFound):
        ws.ShmSource(shm_path)
    with open(shm_path, "wb") as f:
        f.write(b"NOTASEGM" + bytes(8192 - 8))
    with pytest.raises(rlhub.InvalidArgument, match="magic"):
        ws.ShmSource(shm_path)
    os.unlink(shm_path)

    w = start_writer(rlhub_bin, shm_path, 3, "w=8")
    try:
        with pytest.raises(rlhub.InvalidArgument, match="holds model 'm'"):
            ws.ShmSource(shm_path, model="other")
        src = ws.ShmSource(shm_path, model="m")
        assert src.get_if_newer(0) is None  # nothing published yet
        w.stdin.write("go\n")
        w.stdin.flush()
        w.stdout.readline()
        wv = src.get_if_newer(0)
        assert (wv.version, wv.model, wv.via) == (3, "m", "shm")
        np.testing.assert_array_equal(wv.tensors()["w"], np.full(8, 3, np.float32))
        assert src.get_if_newer(3) is None
        # A module of the wrong shape: a clear error, nothing copied.
        bad = torch.nn.Linear(2, 2)
        before = {k: t.clone() for k, t in bad.state_dict().items()}
        r = ws.Receiver({"w": torch.zeros(9)}, src)
        with pytest.raises(rlhub.InvalidArgument, match=r"'w': shape \[8\] in model 'm' v3, \[9\] in the module"):
            r.apply(wv)
        assert r.version == 0
        for k, t in bad.state_dict().items():
            assert torch.equal(t, before[k])
    finally:
        w.stdin.close()
        w.wait(timeout=30)
    with pytest.raises(rlhub.Unavailable, match="gone"):
        src.get_if_newer(3)  # the writer closed the segment
    src.close()


# ------------------------------------------------------- push and store

def test_shm_reopen_never_hands_out_another_models_versions(rlhub_bin, shm_path):
    """A ShmSource of model "m" whose writer died reopens the segment that
    replaced it at the same path; one of another model is refused, and the
    source stays closed: it used to stay open on it, its model switched, so
    the next poll wrote the other model's weights into "m"'s module."""

    def writer(model: str, start: int) -> subprocess.Popen:
        w = subprocess.Popen([rlhub_bin, "sync", "shm-writer", "--path", shm_path, "--model", model, "--tensors",
                              "w=8", "--start", str(start), "--versions", "3", "--slots", "4", "--wait-stdin"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert w.stdout.readline().startswith("ready ")
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().startswith("done ")
        return w

    a, b = writer("m", 1), None
    try:
        src = ws.ShmSource(shm_path, model="m")
        module = {"w": torch.zeros(8)}
        r = ws.Receiver(module, src)
        assert r.poll() and r.version == 3
        a.kill()  # SIGKILL: the segment stays, its writer is gone
        a.wait(timeout=30)
        b = writer("other", 10)  # replaces the file at the path
        with pytest.raises(rlhub.InvalidArgument, match="now holds model 'other'"):
            r.poll()
        with pytest.raises(rlhub.Unavailable, match="closed"):
            r.poll()
        assert r.version == 3 and torch.equal(module["w"], torch.full((8,), 3.0)), module
        src.close()
    finally:
        for w in (a, b):
            if w is not None and w.poll() is None:
                w.stdin.close()
                w.wait(timeout=30)


def test_push_receiver_applies_newer_only_and_reports_on_the_stream(hub):
    m = linear(8, 3)
    with rlhub.StoreClient(hub.addr) as store:
        store.push("pol", filled(m, 1.0), version=1)
        with ws.Receiver(m, ws.PushSource(hub.addr, "pol", collector_id="py-push")) as r:
            assert r.wait(timeout=30) and r.version == 1
            assert torch.equal(m.weight, torch.ones(3, 8))
            assert not r.wait(timeout=0.3)  # nothing newer: no-op
            # The same version offered again changes nothing.
            with torch.no_grad():
                m.weight.fill_(7.0)
            assert not r.apply(ws.WeightVersion("pol", 1, 0, bytearray(rlhub.save_bytes(filled(m, 1.0))), "push"))
            assert torch.equal(m.weight, torch.full((3, 8), 7.0))
            store.push("pol", filled(m, 2.0), version=2)
            store.push("pol", filled(m, 3.0), version=3)
            while r.version < 3:
                assert r.wait(timeout=30)
            assert torch.equal(m.weight, torch.full((3, 8), 3.0)) and torch.equal(m.bias, torch.full((3,), 3.0))
            # The stream report lands asynchronously; poll status briefly.
            for _ in range(100):
                row = collector_row(sync_status(hub, "pol"), "py-push")
                if row[1] == "3":
                    break
                time.sleep(0.05)
            assert row[1:5] == ["3", "0", "push", "true"], row


def test_store_receiver_polls_only_if_newer_and_lag_shows_on_the_hub(hub):
    m = linear(4, 2)
    with ws.Receiver(m, ws.StoreSource(hub.addr, "pol"), collector_id="py-pull", hub=hub.addr) as r:
        assert not r.poll()  # no such model yet: nothing newer
        with rlhub.StoreClient(hub.addr) as store:
            store.push("pol", filled(m, 5.0), version=5)
            assert r.poll() and r.version == 5
            assert torch.equal(m.weight, torch.full((2, 4), 5.0))
            with torch.no_grad():
                m.weight.zero_()
            assert not r.poll()  # same version: a no-op, module untouched
            assert torch.equal(m.weight, torch.zeros(2, 4))
            assert collector_row(sync_status(hub, "pol"), "py-pull")[1:5] == ["5", "0", "pull", "false"]

            store.push("pol", filled(m, 6.0), version=6)
            store.push("pol", filled(m, 7.0), version=7)
            # Not applied yet: the hub sees this collector 2 versions behind.
            assert collector_row(sync_status(hub, "pol"), "py-pull")[1:4] == ["5", "2", "pull"]
            [st] = ws.status(hub.addr, "pol")
            assert st.newest == 7 and [(c.collector_id, c.lag) for c in st.collectors] == [("py-pull", 2)]
            assert r.wait(timeout=30) and r.version == 7  # skips to the newest
            assert torch.equal(m.bias, torch.full((2,), 7.0))
            assert collector_row(sync_status(hub, "pol"), "py-pull")[1:3] == ["7", "0"]
            assert r.last_report_error is None


def test_wrong_shape_or_dtype_is_a_clear_error_and_copies_nothing(hub):
    with rlhub.StoreClient(hub.addr) as store:
        store.push("pol", filled(linear(8, 3), 1.0), version=1)
    m = linear(8, 4)
    before = {k: t.clone() for k, t in m.state_dict().items()}
    with ws.Receiver(m, ws.StoreSource(hub.addr, "pol")) as r:
        with pytest.raises(rlhub.InvalidArgument) as ei:
            r.poll()
        msg = str(ei.value)
        assert "'weight': shape [3, 8] in model 'pol' v1, [4, 8] in the module" in msg
        assert "'bias': shape [3]" in msg
        assert r.version == 0
        for k, t in m.state_dict().items():
            assert torch.equal(t, before[k])
    m64 = linear(8, 3).double()
    before = {k: t.clone() for k, t in m64.state_dict().items()}
    with ws.Receiver(m64, ws.StoreSource(hub.addr, "pol")) as r:
        with pytest.raises(rlhub.InvalidArgument, match="dtype torch.float32 in model 'pol' v1, torch.float64"):
            r.poll()
        assert r.version == 0
    for k, t in m64.state_dict().items():
        assert torch.equal(t, before[k]), k
    extra = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.BatchNorm1d(3))
    before = {k: t.clone() for k, t in extra.state_dict().items()}
    with ws.Receiver(extra, ws.StoreSource(hub.addr, "pol")) as r:
        with pytest.raises(rlhub.InvalidArgument, match="missing from model 'pol' v1: '0.bias', '0.weight', '1.bias' and 4 more"):
            r.poll()
        assert r.version == 0
    for k, t in extra.state_dict().items():
        assert torch.equal(t, before[k]), k
    # A version's names reach the error bounded: 200 tensors of 1 KiB names.
    with rlhub.StoreClient(hub.addr) as store:
        store.push("many", {("n" * 1024) + str(i): torch.zeros(1) for i in range(200)}, version=1)
    with ws.Receiver(linear(8, 3), ws.StoreSource(hub.addr, "many")) as r:
        with pytest.raises(rlhub.InvalidArgument) as ei:
            r.poll()
        assert "and 197 more" in str(ei.value) and len(str(ei.value)) < 2048, len(str(ei.value))


@pytest.mark.parametrize("target,why", [
    (lambda: torch.nn.Linear(8, 3, device="meta"), "meta device"),
    (lambda: {"bias": torch.zeros(3), "weight": torch.zeros(1, 8).expand(3, 8)}, "share memory"),
    (lambda: {"bias": torch.zeros(3), "weight": torch.zeros(3, 8).to_sparse()}, "layout"),
], ids=["meta", "expanded", "sparse"])
def test_a_target_that_cannot_be_written_whole_is_refused_before_any_copy(hub, target, why):
    """A meta module took the copy as a no-op and the version counted as
    applied; an expanded or sparse tensor made torch raise midway, after
    the tensors before it were written."""
    with rlhub.StoreClient(hub.addr) as store:
        store.push("pol", filled(linear(8, 3), 1.0), version=1)
    m = target()
    sd = m.state_dict() if isinstance(m, torch.nn.Module) else m
    dense = lambda t: t.to_dense() if t.layout != torch.strided else t  # noqa: E731
    before = {k: dense(t).clone() for k, t in sd.items() if t.device.type != "meta"}
    with ws.Receiver(m, ws.StoreSource(hub.addr, "pol")) as r:
        with pytest.raises(rlhub.InvalidArgument, match=why):
            r.poll()
        assert r.version == 0
    for k, t in before.items():
        assert torch.equal(dense(sd[k]), t), k


def test_chunk_codec_matches_protobuf():
    """The hand-made chunk codec (rlhub._transfer) writes the bytes protobuf
    writes, and reads them back as a view."""
    from rlhub._proto.rlhub.v1 import store_pb2, sync_pb2, tensor_pb2
    from rlhub._transfer import chunk_message, fast_decoder, parse_chunk, RawChunk

    rng = np.random.default_rng(1)
    for n in (0, 1, 127, 128, 16383, 16384, 1 << 20):
        d = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        ref = store_pb2.StorePushRequest(chunk=tensor_pb2.Chunk(data=d)).SerializeToString()
        assert chunk_message(d) == ref == sync_pb2.SyncServerMessage(chunk=tensor_pb2.Chunk(data=d)).SerializeToString()
        assert bytes(parse_chunk(ref).data) == d
    hdr = store_pb2.StorePullResponse(header=store_pb2.StorePullHeader(not_modified=True)).SerializeToString()
    got = fast_decoder(store_pb2.StorePullResponse)(hdr)
    assert not isinstance(got, RawChunk) and got.header.not_modified
    # A chunk message with an extra field is left to protobuf.
    odd = chunk_message(b"abc")[:1] + bytes([7]) + b"\x0a\x03abc\x10\x01"
    assert parse_chunk(odd) is None


def test_shm_source_reads_what_the_relay_writes_and_reports_via_shm(hub, shm_path):
    """The real path on one host: hub → `rlhub relay` → shared memory →
    Python collector, whose Report makes it show on the hub as via=shm."""
    from conftest import free_port

    m = linear(6, 2)
    with rlhub.StoreClient(hub.addr) as store:
        store.push("pol", filled(m, 1.0), version=1)
        relay = subprocess.Popen([hub.binary, "relay", "--upstream", hub.addr, "--model", "pol", "--id", "relay-t",
                                  "--listen", f"127.0.0.1:{free_port()}", "--shm", shm_path],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):  # the relay creates the segment on its first version
                if os.path.exists(shm_path):
                    break
                time.sleep(0.05)
            src = ws.ShmSource(shm_path, model="pol")
            with ws.Receiver(m, src, collector_id="py-shm", hub=hub.addr) as r:
                assert r.wait(timeout=30) and r.version == 1
                store.push("pol", filled(m, 2.0), version=2)
                assert r.wait(timeout=30) and r.version == 2
                assert torch.equal(m.weight, torch.full((2, 6), 2.0))
                assert collector_row(sync_status(hub, "pol"), "py-shm")[1:4] == ["2", "0", "shm"]
                # A version that outgrows the segment: the relay puts a bigger
                # one at the path and closes the old; the source re-opens it.
                big = {"w": np.full(100_000, 3.0, np.float32)}
                store.push("pol", big, version=3)
                wv = src.wait_newer(2, timeout=30)
                assert wv is not None and wv.version == 3
                np.testing.assert_array_equal(wv.tensors()["w"], big["w"])
                assert src.capacity >= len(rlhub.save_bytes(big))
        finally:
            relay.terminate()
            relay.wait(timeout=30)


def test_push_source_ends_unavailable_when_the_hub_stops(hub):
    with rlhub.StoreClient(hub.addr) as store:
        store.push("pol", filled(linear(2, 2), 1.0), version=1)
    src = ws.PushSource(hub.addr, "pol", collector_id="py-gone")
    try:
        assert src.wait_newer(0, timeout=30).version == 1
        hub.stop()
        with pytest.raises(rlhub.Unavailable):
            src.wait_newer(1, timeout=30)
    finally:
        src.close()



def test_push_via_follows_a_hub_killed_and_restarted(rlhub_bin, tmp_path):
    """``via="push"`` on one hub (open_source, which the TorchRL scheme and
    Ray actors use): the hub SIGKILLed and restarted on its address and
    --data ends the stream, and the source attaches again and hands out the
    version pushed to the restarted hub, only newer ones, instead of
    raising Unavailable."""
    from rlhub._sources import open_source

    h = Hub(rlhub_bin, tmp_path)
    addr = h.addr
    src = open_source("push", addr, "pol", collector_id="py-restart")
    try:
        with rlhub.StoreClient(addr) as store:
            store.push("pol", filled(linear(2, 2), 1.0), version=1)
        wv = src.wait_newer(0, timeout=30)
        assert wv is not None and wv.version == 1
        h.proc.send_signal(signal.SIGKILL)
        h.proc.wait()
        h.stop()
        h = Hub(rlhub_bin, tmp_path, addr=addr)
        with rlhub.StoreClient(addr) as store:
            store.push("pol", filled(linear(2, 2), 2.0), version=2, expect=1)
        deadline = time.monotonic() + 60
        while (wv := src.wait_newer(1, timeout=1)) is None and time.monotonic() < deadline:
            pass
        assert wv is not None and wv.version == 2
        assert set(wv.tensors()["weight"].ravel().tolist()) == {2.0}
    finally:
        src.close()
        h.stop()

LEASE_READER = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import rlhub.wsync as ws
    path, last = sys.argv[1], int(sys.argv[2])
    src = ws.ShmSource(path, verify=False, lease=True)
    print("open", src.leasing, flush=True)
    have, reads, bad, held_ok = 0, 0, [], 0
    while have < last:
        wv = src.wait_newer(have, timeout=30)
        if wv is None:
            break
        reads += 1
        ts = wv.tensors()
        for name, a in ts.items():
            if not (a == np.float32(wv.version)).all():
                bad.append([wv.version, name])
        if reads % 50 == 0 and wv.version + 3 <= last:
            # Hold this version while the writer publishes 3 more: the
            # lease keeps its slot untouched.
            while src.published < wv.version + 3:
                time.sleep(0.0005)
            for name, a in ts.items():
                if not (a == np.float32(wv.version)).all():
                    bad.append([wv.version, name, "changed while held"])
            held_ok += 1
        have = wv.version
    print(json.dumps({"reads": reads, "bad": bad, "last": have, "held": held_ok,
                      "in_place": src.stats["in_place"], "retries": src.stats["retries"]}), flush=True)
""")


def test_shm_leasing_readers_never_torn_against_go_writer_flat_out(rlhub_bin, shm_path):
    """Leasing Python readers (docs/shm-layout.md, "Slot leases"): a Go
    writer with 4 slots (2 lease entries) publishes flat out; one leasing
    reader in this process and one in a child read every version in place
    (read-only numpy views, no copy) and check it whole, and every 50th
    version they hold while the writer publishes 3 more, then check it
    again: the writer never wrote a leased slot. A third leasing reader
    finds no free entry and copies."""
    versions = 3000
    w = start_writer(rlhub_bin, shm_path, versions, slots=4)
    child = None
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        child = subprocess.Popen([sys.executable, "-c", LEASE_READER, shm_path, str(versions)],
                                 stdout=subprocess.PIPE, text=True, env=env)
        assert child.stdout.readline().split() == ["open", "True"]
        src = ws.ShmSource(shm_path, model="m", verify=False, lease=True)
        third = ws.ShmSource(shm_path, model="m", lease=True)
        assert src.leasing and not third.leasing
        w.stdin.write("go\n")
        w.stdin.flush()
        have, reads, bad, held = 0, 0, [], 0
        while have < versions:
            wv = src.wait_newer(have, timeout=30)
            assert wv is not None, f"no newer version after v{have}"
            reads += 1
            ts = wv.tensors()
            assert not ts["weight"].flags.writeable  # a view of the read-only mapping
            for name, a in ts.items():
                if not (a == np.float32(wv.version)).all():
                    bad.append((wv.version, name))
            if reads % 50 == 0 and wv.version + 3 <= versions:
                while src.published < wv.version + 3:
                    time.sleep(0.0005)
                for name, a in ts.items():
                    if not (a == np.float32(wv.version)).all():
                        bad.append((wv.version, name, "changed while held"))
                held += 1
            have = wv.version
        last3 = third.get_if_newer(0)
        assert w.stdout.readline().startswith("done ")
        res = json.loads(child.stdout.readline())
        child.wait(timeout=30)
        print(f"in-process leasing reader: {reads} versions in place ({src.stats}), {held} held through 3 more; "
              f"child: {res}")
        assert bad == [] and res["bad"] == []
        assert have == versions and res["last"] == versions
        assert src.stats["in_place"] == reads and res["in_place"] == res["reads"]
        assert held >= 1 and res["held"] >= 1
        assert last3 is not None and last3.version == versions and third.stats["in_place"] == 0
        third.close()
        src.close()
    finally:
        if child is not None and child.poll() is None:
            child.kill()
        w.stdin.close()
        w.wait(timeout=30)


def test_shm_lease_of_a_killed_python_reader_is_reclaimed(rlhub_bin, shm_path):
    """A leasing reader killed with SIGKILL leaves its entry owned by a
    dead pid; the writer goes on around its slot, and the next leasing
    reader takes the entry over."""
    w = start_writer(rlhub_bin, shm_path, 40, "w=8", slots=3)  # 1 lease entry
    try:
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().startswith("done ")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
            import sys, time
            import rlhub.wsync as ws
            src = ws.ShmSource(sys.argv[1], lease=True)
            wv = src.get_if_newer(0)
            print(src.leasing, wv.version, flush=True)
            time.sleep(60)
        """), shm_path], stdout=subprocess.PIPE, text=True, env=env)
        assert holder.stdout.readline().split() == ["True", "40"]
        busy = ws.ShmSource(shm_path, lease=True)
        assert not busy.leasing  # the only entry is the live holder's
        busy.close()
        holder.kill()
        holder.wait(timeout=30)
        src = ws.ShmSource(shm_path, lease=True)
        assert src.leasing
        wv = src.get_if_newer(0)
        assert wv.version == 40 and (wv.tensors()["w"] == np.float32(40)).all()
        src.close()
    finally:
        w.stdin.close()
        w.wait(timeout=30)


def _flip_last_blob_byte(path: str, version: int) -> None:
    """Damages version's blob in the segment (its last byte), as a faulty
    writer or memory would: the seqlock and the lease cannot see it, the
    CRC can."""
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        try:
            slots, cap, stride = struct.unpack_from("<IQQ", m, 12)
            for i in range(slots):
                off = 4096 + i * stride
                seq, ver, _, length = struct.unpack_from("<QQQQ", m, off)
                if seq and seq % 2 == 0 and ver == version:
                    m[off + 4096 + length - 1] ^= 0xFF
                    return
            raise AssertionError(f"v{version} is in no slot")
        finally:
            m.close()


def test_default_shm_source_leases_whole_versions_into_a_module(rlhub_bin, shm_path):
    """The default ShmSource is a lease reader, and a Receiver over it
    copies each version straight from the leased slot into the module's
    tensors (CRC-32C checked in that pass) and releases the slot at once.
    Against a Go writer publishing flat out into 4 slots, every version
    applied is in the module whole; a second receiver whose module does
    not fit (a shape, a name) is refused with the module unchanged."""
    versions = 1500
    w = start_writer(rlhub_bin, shm_path, versions, slots=4)  # 2 lease entries
    try:
        src = ws.ShmSource(shm_path, model="m")
        assert src.leasing and src.copy_reason == "" and src.verify
        module = linear(256, 256)
        r = ws.Receiver(module, src, collector_id="default-shm")
        w.stdin.write("go\n")
        w.stdin.flush()
        applied, bad = 0, []
        while r.version < versions:
            assert r.wait(30), f"no newer version after v{r.version}"
            applied += 1
            for name, t in module.state_dict().items():
                if not (t == float(r.version)).all():
                    bad.append((r.version, name))
        assert w.stdout.readline().startswith("done ")
        print(f"{applied} of {versions} versions applied into the module, stats {src.stats}")
        assert bad == []
        assert src.stats["in_place"] == src.stats["reads"] == src.stats["released"] == applied
        assert not module.weight.grad_fn and module.weight.requires_grad  # parameters stay parameters

        for what, target in (("shape", linear(256, 128)),
                             ("name", {"weight": torch.zeros(256, 256), "other": torch.zeros(256)})):
            other = ws.ShmSource(shm_path, model="m")
            assert other.leasing
            before = {k: v.clone() for k, v in ws._targets(target).items()}
            ro = ws.Receiver(target, other)
            with pytest.raises(rlhub.InvalidArgument, match="do not fit"):
                ro.poll()
            assert ro.version == 0
            for k, v in ws._targets(target).items():
                assert torch.equal(v, before[k]), f"{what} mismatch changed {k}"
            assert other.stats["released"] == 1  # refused, and the slot given back
            other.close()
        src.close()
    finally:
        w.stdin.close()
        w.wait(timeout=30)


def test_default_shm_source_checks_the_crc_in_the_copy_and_says_why_it_copies(rlhub_bin, shm_path):
    """A version damaged in its slot (the CRC no longer matches) is
    refused by the receiver's one pass, which checks the CRC as it copies:
    InvalidArgument naming the CRC, the version not taken. A segment
    without a lease table (2 slots) is read by copying, and the source
    says why."""
    w = start_writer(rlhub_bin, shm_path, 3, "w=4096", slots=3)
    try:
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().startswith("done ")
        _flip_last_blob_byte(shm_path, 3)
        src = ws.ShmSource(shm_path, model="m")
        assert src.leasing
        r = ws.Receiver({"w": torch.zeros(4096)}, src)
        with pytest.raises(rlhub.InvalidArgument, match="CRC-32C"):
            r.poll()
        assert r.version == 0 and src.stats["released"] == 1
        wv = src.get_if_newer(0)
        with pytest.raises(rlhub.InvalidArgument, match="CRC-32C"):
            wv.tensors()  # a direct reader checks it in place
        src.close()
    finally:
        w.stdin.close()
        w.wait(timeout=30)
    double = shm_path + "-2"
    w = start_writer(rlhub_bin, double, 1, "w=8", slots=2)
    try:
        src = ws.ShmSource(double, model="m")
        assert not src.leasing and "no lease table" in src.copy_reason
        src.close()
        cp = ws.ShmSource(double, model="m", lease=False)
        assert not cp.leasing and "lease=False" in cp.copy_reason
        cp.close()
    finally:
        w.stdin.close()
        w.wait(timeout=30)
        if os.path.exists(double):
            os.unlink(double)
