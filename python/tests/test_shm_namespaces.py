"""Shared memory across pid namespaces (docs/shm-layout.md, "Liveness"): a
relay container and collector containers that share a /dev/shm volume but
not a pid namespace (Kubernetes' default). The Python reader judges the Go
writer, and other leasing readers, alive through OFD locks on the segment
file, never through pids, which mean another process or nothing here."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Callable, List, Optional

import pytest

import rlhub
import rlhub.wsync as ws

# The "high" namespaces give their process this pid (their ns_last_pid + 1),
# which no process here is likely to have: a pid rule would call it dead
# while it lives. The "init" ones run it as pid 1, which exists here too: a
# pid rule would call it alive for ever.
HIGH_PID = 32001


@functools.lru_cache(maxsize=None)
def _unshare() -> Optional[List[str]]:
    if sys.platform != "linux":
        return None
    for pre in (["unshare", "--pid", "--fork"], ["unshare", "--user", "--map-root-user", "--pid", "--fork"]):
        try:
            if subprocess.run(pre + ["--mount-proc", "true"], capture_output=True, timeout=30).returncode == 0:
                return pre
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None


def in_namespace(argv: List[str], high: bool, **kw) -> subprocess.Popen:
    """Starts argv in a new pid namespace as its pid 1 (high False) or
    HIGH_PID, in a process group of its own (killpg takes it down whole,
    like a container killed)."""
    pre = _unshare()
    if pre is None:
        if os.environ.get("RLHUB_REQUIRE_PIDNS"):  # scripts/test.sh as root: CI must show it
            pytest.fail("no pid namespaces here (unshare --pid fails), and RLHUB_REQUIRE_PIDNS is set")
        pytest.skip("no pid namespaces here (unshare --pid fails)")
    if high:
        argv = pre + ["--mount-proc", "sh", "-c",
                      f'echo {HIGH_PID - 1} > /proc/sys/kernel/ns_last_pid; "$@"; exit $?', "sh"] + argv
    else:
        argv = pre + argv
    return subprocess.Popen(argv, start_new_session=True, **kw)


def kill_group(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait(timeout=30)


def eventually(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return cond()


@pytest.fixture
def shm_path():
    p = f"/dev/shm/rlhub-pytest-ns-{os.getpid()}-{time.monotonic_ns()}"
    yield p
    if os.path.exists(p):
        os.unlink(p)


def start_ns_writer(rlhub_bin: str, path: str, high: bool, versions: int, slots: int) -> subprocess.Popen:
    """`rlhub sync shm-writer` in a pid namespace of its own, done writing
    `versions` versions and holding the segment open."""
    w = in_namespace([rlhub_bin, "sync", "shm-writer", "--path", path, "--model", "m", "--tensors", "w=8",
                      "--versions", str(versions), "--slots", str(slots), "--wait-stdin"], high,
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = w.stdout.readline()
        assert line.startswith("ready "), line
        w.stdin.write("go\n")
        w.stdin.flush()
        line = w.stdout.readline()
        assert line.startswith("done "), line
    except BaseException:
        kill_group(w)
        raise
    return w


def _pid_here(pid: int) -> str:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "no process"
    except PermissionError:
        pass
    return "a live process"


@pytest.mark.parametrize("high", [False, True], ids=["writer-is-pid-1", f"writer-is-pid-{HIGH_PID}"])
def test_go_writer_in_another_pid_namespace_alive_then_gone(rlhub_bin, shm_path, high):
    w = start_ns_writer(rlhub_bin, shm_path, high, 3, 2)
    try:
        src = ws.ShmSource(shm_path, model="m", lease=False)
        pid = src._pid
        print(f"the header's writer pid {pid} is, in this namespace, {_pid_here(pid)}")
        assert pid == (HIGH_PID if high else 1)
        assert src.writer_alive(), "the writer in another pid namespace lives"
        wv = src.get_if_newer(0)
        assert wv is not None and wv.version == 3
        assert src.get_if_newer(3) is None  # nothing newer, writer alive: no error
        kill_group(w)
        assert eventually(lambda: not src.writer_alive()), "writer_alive() still true 10 s after SIGKILL"
        with pytest.raises(rlhub.Unavailable, match="writer of .* is gone"):
            src.get_if_newer(3)
        src.close()
    finally:
        kill_group(w)


HOLDER = textwrap.dedent("""
    import sys, time
    import rlhub.wsync as ws
    src = ws.ShmSource(sys.argv[1], lease=True)
    wv = src.get_if_newer(0)
    print(src.leasing, src._entry, wv.version, flush=True)
    time.sleep(120)
""")


@pytest.mark.parametrize("high", [False, True], ids=["holder-is-pid-1", f"holder-is-pid-{HIGH_PID}"])
def test_python_lease_across_pid_namespaces(rlhub_bin, shm_path, high):
    """Two leasing Python readers hold the 2 entries of a 4-slot segment,
    one in another pid namespace; a third finds none free while both live,
    and takes the other namespace's entry once that reader is SIGKILLed."""
    w = subprocess.Popen([rlhub_bin, "sync", "shm-writer", "--path", shm_path, "--model", "m", "--tensors", "w=8",
                          "--versions", "5", "--slots", "4", "--wait-stdin"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    holder = None
    try:
        assert w.stdout.readline().startswith("ready ")
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().startswith("done ")
        a = ws.ShmSource(shm_path, lease=True)
        assert a.leasing and a._entry == 0
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        holder = in_namespace([sys.executable, "-c", HOLDER, shm_path], high, stdout=subprocess.PIPE, text=True,
                              env=env)
        leasing, entry, version = holder.stdout.readline().split()
        assert (leasing, version) == ("True", "5")
        assert entry == "1", f"the holder in the other namespace took entry {entry}: reader A's, while A lives"
        assert a._hq[512 // 8] == a._token
        owner = int(a._hq[(512 + 32) // 8])
        print(f"entry 1's owner {owner:#x}: pid {owner >> 32}, of the holder's namespace")
        c = ws.ShmSource(shm_path, lease=True)
        assert not c.leasing and "every one of the 2 lease entries" in c.copy_reason
        c.close()
        kill_group(holder)
        got: List[ws.ShmSource] = []

        def claim() -> bool:
            d = ws.ShmSource(shm_path, lease=True)
            if d.leasing:
                got.append(d)
                return True
            d.close()
            return False

        assert eventually(claim), "no reader took the killed holder's entry within 10 s"
        d = got[0]
        assert d._entry == 1
        wv = d.get_if_newer(0)
        assert wv is not None and wv.version == 5 and (wv.tensors()["w"] == 5).all()
        d.close()
        a.close()
    finally:
        if holder is not None:
            kill_group(holder)
        w.stdin.close()
        w.wait(timeout=30)


def _segment(path: str, pid: int, liveness: int) -> None:
    """A 2-slot segment with no version, as a writer whose liveness field is
    ``liveness`` would leave it (0: an older writer, which knows no lock)."""
    import struct

    cap = 4096
    b = bytearray(4096 + 2 * (4096 + cap))
    struct.pack_into("<8sIIQQQ", b, 0, b"RLHUBWS1", 1, 2, cap, 4096 + cap, pid)
    struct.pack_into("<I", b, 56, 1)
    b[64:65] = b"m"
    struct.pack_into("<I", b, 320, liveness)
    with open(path, "wb") as f:
        f.write(b)


def test_writer_liveness_by_pid_for_older_writers_and_by_lock_for_new(shm_path):
    """Liveness 0 (an older writer): the pid decides, the lock is not looked
    at. Liveness 1: the lock decides, the pid is not looked at."""
    from rlhub.wsync import _shm

    dead = subprocess.Popen(["true"])
    dead.wait()
    for pid, alive in ((os.getpid(), True), (dead.pid, False)):
        _segment(shm_path, pid, 0)
        with ws.ShmSource(shm_path, lease=False) as src:
            assert src.writer_alive() is alive, f"liveness 0, pid {pid}"
            if not alive:
                with pytest.raises(rlhub.Unavailable, match="is gone"):
                    src.get_if_newer(0)
    _segment(shm_path, os.getpid(), 1)  # a live pid, but nobody holds the lock
    with ws.ShmSource(shm_path, lease=False) as src:
        assert not src.writer_alive()
        fd = os.open(shm_path, os.O_RDWR)  # another open file description: the "writer"
        try:
            assert _shm._ofd_lock(fd, 320)
            assert src.writer_alive()
            _shm._ofd_unlock(fd, 320)
            assert not src.writer_alive()
            assert _shm._ofd_lock(fd, 320)
        finally:
            os.close(fd)  # closing drops the lock, as the kernel does for a dead writer
        assert not src.writer_alive()
    _segment(shm_path, os.getpid(), 2)
    with pytest.raises(rlhub.InvalidArgument, match="liveness scheme 2"):
        ws.ShmSource(shm_path)


def test_python_lease_taken_over_falls_back_to_copying(rlhub_bin, shm_path):
    """A leasing source whose entry another reader took over (an older one,
    which goes by pids, judging this process gone) stops writing the entry,
    drops its lock and copies from then on, saying why."""
    from rlhub.wsync import _shm

    w = subprocess.Popen([rlhub_bin, "sync", "shm-writer", "--path", shm_path, "--model", "m", "--tensors", "w=8",
                          "--versions", "2", "--slots", "3", "--wait-stdin"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert w.stdout.readline().startswith("ready ")
        src = ws.ShmSource(shm_path, lease=True)
        assert src.leasing and src._token & _shm._LEASE_LOCKED
        other = 999999 << 32 | 1  # an older reader's token: no lock bit
        src._hq[512 // 8] = other
        w.stdin.write("go\n")
        w.stdin.flush()
        assert w.stdout.readline().startswith("done ")
        wv = src.get_if_newer(0)
        assert wv is not None and wv.version == 2 and (wv.tensors()["w"] == 2).all()
        assert not src.leasing and "taken over" in src.copy_reason
        assert src._hq[512 // 8] == other and src._hq[512 // 8 + 1] == 0  # the entry is left alone
        fd = os.open(shm_path, os.O_RDWR)
        try:
            assert _shm._ofd_lock(fd, 512), "the source kept the lock of an entry it gave up"
        finally:
            os.close(fd)
        src.close()
    finally:
        w.stdin.close()
        w.wait(timeout=30)
