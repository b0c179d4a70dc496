"""A Python follower's election watch passes over a silent etcd member
(issue 15): internal/cluster's TestWatchLeaderPassesOverASilentMember, for
:class:`rlhub._channel.FollowingChannel`.

Three real etcd members; a follower given all three follows the election.
No call is made through it, so only its election watch can tell it where
the primary is. Each member in turn is SIGSTOPped — its sockets stay open
and it answers nothing, as a member whose machine died or was cut off —
and while it is stopped the primary changes ``CHANGES`` times (each term
ended and the next begun through a live member, with the keys a hub's
campaign writes), each change once the follower offered the one before.
Every primary must be offered while the member is still stopped. A watch
that stays on the stopped member is deaf to all of them; one whose reads
wait on the stopped member pays that wait at every change (before: up to
5 s of silence before the watch was opened again, and each leader read
tried the first endpoint for 3 s: the round that stops it took ~40 s and
failed the bound). The times are printed
(docs/benchlog/2026-12-03-s18-pywatch.md), not asserted: each round's
bound is a hang guard.

A member cut off from its peers is not silent: it answers progress
requests from memory, but no event reaches it and it has no leader to
read through. The lab test below cuts the follower's member off on a real
network (python/tests/netlab.py: a network namespace per member, blackhole
routes between them) and elects a new primary through the majority: the
WebSocket watch's leader check (``discover._WATCH_LEADER``: the member's
status names no raft leader) or its idle read (``discover._WATCH_IDLE``)
moves it on, a POST stream etcd's own leader requirement or its idle read
(docs/benchlog/2026-12-03-s19-pycut.md, 2026-12-03-s20-wsleader.md).
"""

from __future__ import annotations

import base64
import json
import pathlib
import shutil
import signal
import subprocess
import threading
import time
import urllib.error

import pytest
import websocket

from rlhub import _channel, discover, errors
from rlhub.store import StoreClient
import netlab
from etcdproc import Etcd, sigstop, start_etcd_cluster

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None,
                                reason="etcd is not installed: scripts/setup.d/20-etcd.sh installs etcd-server")

CLUSTER = "pywatch"
CHANGES = 10
ROUND_BOUND = 30.0  # seconds for a round's changes: a hang guard, not a speed check


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def write(e: Etcd, path: str, body: dict, user: tuple[str, str] | None = None) -> dict:
    """One write through member e (as ``user``, name and password, given
    one); it waits while etcd elects a leader of its own (the stopped
    member may have been it)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            tok = e.post("/v3/auth/authenticate", {"name": user[0], "password": user[1]})["token"] if user else None
            return e.post(path, body, token=tok, timeout=30)
        except (OSError, urllib.error.HTTPError) as err:
            assert time.monotonic() < deadline, f"etcd {e.url} refused {path} for 30 s: {err}"
            time.sleep(0.05)


def elect(e: Etcd, member: str, addr: str, user: tuple[str, str] | None = None) -> str:
    """Makes ``member`` at ``addr`` the primary, as its campaign would: its
    record under the election prefix, named by a lease of its own. Returns
    the key."""
    lease = int(write(e, "/v3/lease/grant", {"TTL": 300}, user)["ID"])
    key = f"/rlhub/{CLUSTER}/election/{lease:x}"
    record = json.dumps({"id": member, "addr": addr})
    write(e, "/v3/kv/put", {"key": b64(key), "value": b64(record), "lease": str(lease)}, user)
    return key


def watched(ch: _channel.FollowingChannel) -> str:
    """host:port of the etcd member the follower's watch is connected to
    ("" between watches): for the printed times only."""
    gw = discover.gateway(ch.target.etcd)
    with gw._mu:
        sock = gw._watching.get(ch._stop)
    sock = getattr(sock, "sock", sock)  # before: an http.client connection
    try:
        return "%s:%d" % sock.getpeername()[:2] if sock is not None else ""
    except OSError:
        return ""


def is_leader(e: Etcd) -> bool:
    """Whether e is etcd's own (raft) leader: for the printed times only."""
    st = e.post("/v3/maintenance/status", {})
    return st.get("leader") == st.get("header", {}).get("member_id")


def test_the_election_watch_passes_over_a_silent_member(tmp_path):
    es = start_etcd_cluster(tmp_path, 3)
    ch = None
    stopped = None
    try:
        ch = _channel.channel("etcd://" + ",".join(e.hostport for e in es) + "/" + CLUSTER)
        assert isinstance(ch, _channel.FollowingChannel)

        def offered(addr: str, deadline: float) -> float:
            while (ch.primary() or ("",))[0] != addr:
                assert time.monotonic() < deadline, f"the follower still follows {ch.primary()}, not {addr}"
                time.sleep(0.002)
            return time.monotonic()

        key = elect(es[0], "p", "127.0.0.1:1000")
        offered("127.0.0.1:1000", time.monotonic() + ROUND_BOUND)
        epoch, n = ch.primary()[1], 1000
        for i, e in enumerate(es):
            live = es[(i + 1) % 3]
            t_stop = None
            for k in range(CHANGES):
                write(live, "/v3/kv/deleterange", {"key": b64(key)})  # the term ends
                if k == 0:
                    # Right after the watch heard of the term's end (or
                    # just before): what it hears next is the member's
                    # silence.
                    on, leader = watched(ch) == e.hostport, is_leader(e)
                    sigstop(e.proc)
                    stopped, t_stop = e, time.monotonic()
                n += 1
                key = elect(live, f"p{n}", f"127.0.0.1:{n}")
                t_elected = time.monotonic()
                t_seen = offered(f"127.0.0.1:{n}", t_stop + ROUND_BOUND)
                assert ch.primary()[1] > epoch
                epoch = ch.primary()[1]
                if k == 0:
                    print(f"member {i} stopped (the watch's: {on}; etcd's leader: {leader}): primary elected after "
                          f"{t_elected - t_stop:.3f} s, offered after {t_seen - t_stop:.3f} s")
            print(f"member {i} stopped: {CHANGES} primaries offered within {time.monotonic() - t_stop:.3f} s")
            e.proc.send_signal(signal.SIGCONT)
            stopped = None
    finally:
        if stopped is not None:
            stopped.proc.send_signal(signal.SIGCONT)
        if ch is not None:
            ch.close()
        for e in es:
            e.stop()


def follow(ch: _channel.FollowingChannel, e: Etcd, ports: range, pause: float = 0.0,
           user: tuple[str, str] | None = None) -> None:
    """Makes a primary at each of ``ports`` in turn through ``e`` (each term
    ended first, ``pause`` seconds before the next begins); the follower
    offers each (30 s each at most). The last term ends too."""
    key = None
    for port in ports:
        if key is not None:
            write(e, "/v3/kv/deleterange", {"key": b64(key)}, user)
        time.sleep(pause)
        key = elect(e, f"p{port}", f"127.0.0.1:{port}", user)
        deadline = time.monotonic() + 30
        while (ch.primary() or ("",))[0] != f"127.0.0.1:{port}":
            assert time.monotonic() < deadline, f"the follower still follows {ch.primary()}, not 127.0.0.1:{port}"
            time.sleep(0.005)
    if key is not None:
        write(e, "/v3/kv/deleterange", {"key": b64(key)}, user)


def test_the_watch_over_tls(rlhub_bin, tmp_path):
    """The watch's WebSocket is TLS with the client's CA and certificate
    (etcd checks client certificates), and one watch holds: through 6 s
    without an event too, its progress requests answered."""
    certs = tmp_path / "certs"
    subprocess.run([rlhub_bin, "cert", "--dir", str(certs), "--hosts", "127.0.0.1"], check=True, capture_output=True)
    tls = {"ca": str(certs / "ca.pem"), "cert": str(certs / "server.pem"), "key": str(certs / "server-key.pem"),
           "client_cert": str(certs / "client.pem"), "client_key": str(certs / "client-key.pem")}
    e = Etcd(tmp_path, tls)
    discover.configure(discover.EtcdSecurity(cacert=tls["ca"], cert=tls["client_cert"], key=tls["client_key"]))
    ch = _channel.channel(f"etcd://{e.hostport}/{CLUSTER}")
    try:
        assert discover.gateway(ch.target.etcd).endpoints[0].startswith("https://")
        follow(ch, e, range(2000, 2003))
        follow(ch, e, range(2003, 2005), pause=6.0)
        assert e.metric("grpc_server_started_total", 'grpc_method="Watch"') == 1
    finally:
        ch.close()
        discover.configure(None)
        e.stop()


def test_the_watch_with_an_etcd_user(tmp_path):
    """With etcd auth on, the watch sends the user's token; etcd 3.4 does
    not take it over a WebSocket (etcd-io/etcd#19752), and the watch falls
    back to a POST stream, which it opens again after 5 s without a line.
    Tokens last 1 s here: the watch and its reads authenticate again when
    theirs has expired, and follow the primary all along."""
    root = ("root", "rootpw")
    e = Etcd(tmp_path, extra=("--auth-token-ttl", "1"))
    e.post("/v3/auth/user/add", {"name": root[0], "password": root[1]})
    e.post("/v3/auth/user/grant", {"user": root[0], "role": "root"})
    e.post("/v3/auth/enable", {})
    (tmp_path / "pw").write_text(root[1] + "\n")
    discover.configure(discover.EtcdSecurity(user=root[0], password_file=str(tmp_path / "pw")))
    ch = _channel.channel(f"etcd://{e.hostport}/{CLUSTER}")
    try:
        follow(ch, e, range(2000, 2002), user=root)
        follow(ch, e, range(2002, 2004), pause=6.0, user=root)  # past the stream's 5 s and the tokens' 1 s
        bearer = discover.gateway(ch.target.etcd)._bearer
        assert bearer is not None  # found out: False on etcd 3.4, True where etcd takes it
        print(f"etcd takes a bearer token over the WebSocket: {bearer}")
    finally:
        ch.close()
        discover.configure(None)
        e.stop()


def test_a_refused_watch_names_its_member_and_the_role(tmp_path):
    """A watch etcd cancels for the user's role (its role covers another
    prefix) is a PermissionDenied naming the member and the role, worded
    as over the WebSocket, not an Unavailable: here the POST stream etcd
    3.4 needs with a user (before, the stream said only "etcd watch
    canceled")."""
    e = Etcd(tmp_path)
    prefix = f"/rlhub/{CLUSTER}/"
    e.post("/v3/auth/user/add", {"name": "root", "password": "rootpw"})
    e.post("/v3/auth/user/grant", {"user": "root", "role": "root"})
    e.post("/v3/auth/role/add", {"name": "r"})
    e.post("/v3/auth/role/grant", {"name": "r", "perm": {"key": b64(prefix), "range_end": b64(prefix[:-1] + "0"),
                                                         "permType": "READ"}})
    e.post("/v3/auth/user/add", {"name": "hub", "password": "hubpw"})
    e.post("/v3/auth/user/grant", {"user": "hub", "role": "r"})
    e.post("/v3/auth/enable", {})
    (tmp_path / "pw").write_text("hubpw\n")
    gw = discover.Gateway((e.url,), discover.EtcdSecurity(user="hub", password_file=str(tmp_path / "pw")))
    try:
        gw._bearer = False  # etcd 3.4 (test_the_watch_with_an_etcd_user): a POST stream
        with pytest.raises(errors.PermissionDenied) as ei:
            gw.watch("/rlhub/elsewhere/", 1, lambda evs: None, threading.Event())
        msg = str(ei.value)
        assert f"etcd {e.url}: the watch was canceled: " in msg and "permission denied" in msg, msg
        assert "role must grant" in msg, msg
    finally:
        e.stop()


def test_reads_start_at_the_member_that_answered(tmp_path):
    """A read through the gateway starts at the endpoint that answered the
    last one, so a silent member (SIGSTOPped: each request to it waits out
    its timeout) is passed over by one read, not by every read after it.
    Before, every read began at the first endpoint: all five reads below
    waited their 1 s there."""
    es = start_etcd_cluster(tmp_path)
    try:
        # The stopped member first in the list, and not etcd's leader (its
        # election would pause every read, which is not this test's case).
        order = sorted(es, key=is_leader)
        gw = discover.Gateway(tuple(e.url for e in order))
        gw.range_prefix("/rlhub/reads/", 5.0)
        sigstop(order[0].proc)
        try:
            for _ in range(5):
                gw.range_prefix("/rlhub/reads/", 1.0)
        finally:
            order[0].proc.send_signal(signal.SIGCONT)
        assert gw.passed == 1, f"{gw.passed} reads waited on the stopped member, want the first one only"
    finally:
        for e in es:
            e.stop()


@pytest.fixture
def lab_etcd(tmp_path: pathlib.Path):
    """Three etcd members, each on its own lab host (m1, m2, m3), and the
    lab; the Gateway may speak plaintext to them (they are off loopback).
    At the end: the lab healed, the members killed, the lab removed."""
    why = netlab.unavailable()
    if why:
        pytest.skip(f"no network lab on this machine: {why}")
    lab = netlab.Lab("m1", "m2", "m3")
    es: list[netlab.LabEtcd] = []
    try:
        es = netlab.start_etcd_on(lab, tmp_path)
        discover.configure(discover.EtcdSecurity(insecure=True))
        yield lab, es
    finally:
        discover.configure(None)
        try:
            lab.heal_all()
        finally:
            for e in es:
                e.stop()
            lab.remove()


def progress_answered(ws: websocket.WebSocket, within: float = 2.0) -> bool:
    """Whether the watch on ``ws`` answers a progress request within
    ``within`` seconds."""
    ws.send('{"progress_request": {}}')
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        ws.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            msg = json.loads(ws.recv())
        except websocket.WebSocketTimeoutException:
            return False
        if msg.get("result", {}).get("watch_id") == "-1":  # a progress notification
            return True
    return False


@pytest.mark.parametrize("auth,idle", [(False, True), (False, False), (True, True), (True, False)],
                         ids=["websocket", "websocket-without-idle-read", "etcd-user", "etcd-user-without-idle-read"])
def test_the_election_watch_leaves_a_member_cut_off_from_its_peers(lab_etcd, tmp_path, monkeypatch, auth, idle):
    """The follower's watch is on member W; W is cut off from the two
    others (both directions; the test process still reaches it) and loses
    its raft leader, yet answers progress requests, so the watch's silence
    check never fires. The primary's term is ended and a new one elected
    through the majority: the follower must offer it while W is still cut
    off. Over the WebSocket the watch's leader check makes it do so (W's
    status names no leader twice in a row), and the idle read —
    linearizable, on W, failing there — would after ``_WATCH_IDLE``; with
    the idle read disabled (``idle`` False) only the leader check can.
    (With both disabled the follower stays on W and this test fails:
    docs/benchlog/2026-12-03-s19-pycut.md, 2026-12-03-s20-wsleader.md.)

    With an etcd user (``auth``) etcd 3.4's gateway does not take the
    token over a WebSocket and the watch is a POST stream, which cannot be
    probed: it returns after ``_WATCH_IDLE`` without a line and the
    follower reads on the same member, which fails there; and it asks etcd
    to end it when its member has no leader, which etcd does: without the
    idle read (``idle`` False: the stream never times out) that alone
    moves the follower on. (Before that request, the follower stayed on W.)"""
    lab, es = lab_etcd
    if not idle:
        monkeypatch.setattr(discover, "_WATCH_IDLE", 1e9)
    user = None
    if auth:
        user = ("root", "rootpw")
        es[0].post("/v3/auth/user/add", {"name": user[0], "password": user[1]})
        es[0].post("/v3/auth/user/grant", {"user": user[0], "role": "root"})
        es[0].post("/v3/auth/enable", {})
        (tmp_path / "pw").write_text(user[1] + "\n")
        discover.configure(discover.EtcdSecurity(user=user[0], password_file=str(tmp_path / "pw"), insecure=True))
    ch = _channel.channel("etcd://" + ",".join(e.hostport for e in es) + "/" + CLUSTER)
    probe = None
    try:
        assert isinstance(ch, _channel.FollowingChannel)
        key = elect(es[0], "p1", "10.0.0.1:1000", user)
        deadline = time.monotonic() + 30
        while (ch.primary() or ("",))[0] != "10.0.0.1:1000" or not (at := watched(ch)):
            assert time.monotonic() < deadline, f"the follower offers {ch.primary()}, watching {watched(ch)!r}"
            time.sleep(0.005)
        epoch = ch.primary()[1]
        w = next(e for e in es if e.hostport == at)
        majority = [e for e in es if e is not w]
        if not auth:
            # A watch of its own on W, to see whether W answers progress
            # requests while it is cut off.
            probe = websocket.create_connection(f"ws://{w.hostport}/v3/watch", timeout=5)
            probe.send(json.dumps({"create_request": {"key": b64("/rlhub/probe/")}}))
            assert json.loads(probe.recv())["result"].get("created"), "the probe watch on W was not created"

        # A POST stream is opened again every 5 s on the same member: the
        # moment between two is not a move.
        deadline = time.monotonic() + 5
        while not (at := watched(ch)) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert at == w.hostport, f"the follower's watch left {w.hostport}, not cut off, for {at!r}"
        lab.cut_from(w.host, [e.host for e in majority])
        t_cut = time.monotonic()
        while w.has_leader():
            assert time.monotonic() < t_cut + 30, f"{w.host} still has a raft leader 30 s after the cut"
            time.sleep(0.05)
        t_lost = time.monotonic()
        if probe is not None:
            assert progress_answered(probe), f"{w.host}, cut off, did not answer a progress request within 2 s"

        live = majority[0]
        write(live, "/v3/kv/deleterange", {"key": b64(key)}, user)  # the term ends
        key = elect(live, "p2", "10.0.0.2:1000", user)
        t_elected = time.monotonic()
        while (ch.primary() or ("",))[0] != "10.0.0.2:1000":
            assert time.monotonic() < t_cut + 30, \
                f"the follower still follows {ch.primary()} 30 s after the cut (watching {watched(ch)!r})"
            time.sleep(0.005)
        t_seen = time.monotonic()
        assert ch.primary()[1] > epoch
        # Still cut off (and still answering progress requests): the new
        # primary reached the follower through another member.
        assert not w.has_leader(), f"{w.host} has a raft leader again: the cut did not hold"
        if probe is not None:
            assert progress_answered(probe), f"{w.host}, cut off, stopped answering progress requests"
        stream = auth and discover.gateway(ch.target.etcd)._bearer is False
        print(f"{w.host.name} cut off ({'POST stream' if stream else 'WebSocket'}"
              f"{'' if idle else ', no idle read'}): its raft leader lost after "
              f"{t_lost - t_cut:.3f} s, the primary elected after {t_elected - t_cut:.3f} s and offered "
              f"{t_seen - t_elected:.3f} s later ({t_seen - t_cut:.3f} s after the cut)")

        lab.heal_from(w.host, [e.host for e in majority])
        t_heal = time.monotonic()
        while not w.has_leader():
            assert time.monotonic() < t_heal + 30, f"{w.host} has no raft leader 30 s after healing"
            time.sleep(0.05)
        print(f"healed: {w.host.name} has a raft leader after {time.monotonic() - t_heal:.3f} s; the follower "
              f"watches {watched(ch) or 'nothing'} (W was {w.hostport})")
    finally:
        if probe is not None:
            probe.close()
        ch.close()


@pytest.mark.parametrize("record", [
    json.dumps({"id": "h1", "addr": "h" * 200_000 + ":7470"}),   # past cluster.NamesPrimary's 300 bytes
    json.dumps({"id": "h1", "addr": "127.0.0.1:7470 and more"}),  # white space
    json.dumps({"id": "h1", "addr": 7470}),                      # not a string
    json.dumps(["127.0.0.1:7470"]),                              # not an object
    "\xff" * 1000 + "not json",
], ids=["long", "space", "number", "list", "garbage"])
def test_a_record_naming_no_address_names_no_primary(tmp_path, record):
    """The election key's record is read from etcd as it is: one that is
    not a hub's JSON, or whose address is one no hub could name (over 300
    bytes, white space: cluster.NamesPrimary, as a refusal's), names no
    primary. Resolving says so (Unavailable), without quoting the value or
    dialling it, and a client's call fails within its bound with a short
    message. Before, the address was followed as given (a 200 kB dial
    target, quoted in the call's error up to the 4 KiB cut of
    errors.MAX_MESSAGE), and a record that was not a JSON object raised a
    bare ValueError or AttributeError."""
    e = Etcd(tmp_path)
    lease = int(write(e, "/v3/lease/grant", {"TTL": 300})["ID"])
    key = f"/rlhub/{CLUSTER}/election/{lease:x}"
    write(e, "/v3/kv/put", {"key": b64(key), "value": b64(record), "lease": str(lease)})
    target = f"etcd://{e.hostport}/{CLUSTER}"
    st = StoreClient(target, timeout=2.0)
    try:
        with pytest.raises(errors.Unavailable) as ei:
            _channel._etcd_leader(_channel.parse_target(target), 2.0)
        msg = str(ei.value)
        assert "names no address" in msg and len(msg) < 400, msg[:500]
        with pytest.raises(errors.RlhubError) as ei2:
            st.list()
        assert len(str(ei2.value)) < 1000, str(ei2.value)[:500]
        assert "hhhhhhhhhh" not in str(ei2.value) and "and more" not in str(ei2.value), str(ei2.value)[:500]
    finally:
        st.close()
        e.stop()


REFUSED_WINDOW = 8.0  # seconds over which a follower's etcd reads are counted


def test_a_refused_record_is_watched_not_read_again_and_again(tmp_path):
    """While the election key's record names no usable address (refused,
    as above) a follower's election watch waits on etcd's watch for the
    next change, as Go's (cluster.Reader.WatchLeader: such a record is no
    primary, not a failure). Before, it was taken for a failing etcd: the
    watch was never opened and the election was read again after a
    back-off that grows to 1 s, on the next member each time — about one
    read a second for as long as the record stood. Reads are counted by
    etcd itself (its gRPC Range counter; the JSON gateway's reads go
    through it): over the window the watch's idle read (every
    ``discover._WATCH_IDLE``, 5 s) may come twice, the polling made one
    a second. The record's replacement is then offered, through the
    watch."""
    e = Etcd(tmp_path)
    ch = None
    try:
        lease = int(write(e, "/v3/lease/grant", {"TTL": 300})["ID"])
        key = f"/rlhub/{CLUSTER}/election/{lease:x}"
        record = json.dumps({"id": "h1", "addr": "127.0.0.1:7470 and more"})
        write(e, "/v3/kv/put", {"key": b64(key), "value": b64(record), "lease": str(lease)})
        ch = _channel.channel(f"etcd://{e.hostport}/{CLUSTER}")
        assert isinstance(ch, _channel.FollowingChannel)

        def reads() -> float:
            return e.metric("grpc_server_started_total", 'grpc_method="Range"')

        deadline = time.monotonic() + 10
        while reads() < 1:  # the follower's first read of the election
            assert time.monotonic() < deadline, "the follower did not read the election within 10 s"
            time.sleep(0.01)
        time.sleep(1.0)  # past the first back-offs (50 ms doubling) of a follower that polls
        before = reads()
        time.sleep(REFUSED_WINDOW)
        n = reads() - before
        assert ch.primary() is None, ch.primary()
        assert n <= 4, f"the follower read the election {n:.0f} times in {REFUSED_WINDOW} s of a refused record"

        write(e, "/v3/lease/revoke", {"ID": str(lease)})  # the refused record goes with its lease
        elect(e, "h2", "127.0.0.1:7471")
        deadline = time.monotonic() + 10
        while (ch.primary() or ("",))[0] != "127.0.0.1:7471":
            assert time.monotonic() < deadline, f"the follower follows {ch.primary()}, not the new primary, after 10 s"
            time.sleep(0.01)
    finally:
        if ch is not None:
            ch.close()
        e.stop()
