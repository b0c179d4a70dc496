"""Discovery from etcd, and etcd's TLS and auth, from Python (issue 15).

Real etcd processes and real `rlhub serve` / `rlhub relay` processes:

* a GradClient given ``etcd://`` and told never to poll the primary
  (``refresh_every=0``) learns a hub of secondaries started after it from
  the etcd watch and pushes to it; one SIGKILLed drops out when its lease
  expires;
* a collector asks for the relay on its host and gets it, then the hub
  once the relay is SIGKILLed and its lease expired;
* the JSON gateway client reaches an etcd with TLS, client-certificate
  checks and auth (certificates from `rlhub cert`, users made through the
  gateway): the right credentials work; a wrong password, no client
  certificate or the wrong CA fail with an error naming etcd.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

import rlhub
from rlhub import _channel, discover, errors
from rlhub.grads import GradClient
from conftest import Hub
from etcdproc import Etcd

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None,
                                reason="etcd is not installed: scripts/setup.d/20-etcd.sh installs etcd-server")


def wait_for(what: str, cond, timeout: float = 30.0) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"{what} within {timeout:.0f} s"
        time.sleep(0.02)
    return time.monotonic() - t0


def leader(etcd: Etcd, cluster: str):
    def has() -> bool:
        try:
            return _channel._etcd_leader(_channel.parse_target(_channel.etcd_target(etcd.url, cluster)), 2.0)[0] != ""
        except errors.Unavailable:
            return False
    wait_for("a primary elected", has)


def test_gradclient_discovers_secondaries_from_etcd(rlhub_bin, tmp_path):
    etcd = Etcd(tmp_path)
    cluster = f"pydisc{os.getpid()}"
    target = _channel.etcd_target(etcd.url, cluster)
    procs: list[Hub] = []

    def hub(name: str, *extra: str) -> Hub:
        d = tmp_path / name
        d.mkdir()
        h = Hub(rlhub_bin, d, extra=["--etcd", etcd.url, "--cluster", cluster, "--lease-ttl", "1s",
                                     "--member-id", name, "--reduce-batch-size", "1", *extra])
        procs.append(h)
        return h

    try:
        hub("p", "--reducer-secondaries", "-1")
        leader(etcd, cluster)
        store = rlhub.StoreClient(target, timeout=30.0)
        grads = GradClient(target, "pyd", timeout=30.0, refresh_every=0)
        try:
            store.push("d", {"w": np.zeros(2, dtype=np.float32)}, version=1, expect=0)
            grads.register("d", {"kind": "sgd", "lr": 0.5})
            assert grads.known() == []
            t0 = time.monotonic()
            s1 = hub("s1", "--role", "reducer")
            wait_for("the client to learn s1 from etcd", lambda: any(a == s1.addr for a, _ in grads.known()))
            r = grads.push("d", 1, {"w": np.ones(2, dtype=np.float32)})
            assert r.addr == s1.addr, r
            print(f"secondary process started -> first push taken there: {time.monotonic() - t0:.3f} s")
            s2 = hub("s2", "--role", "reducer")
            wait_for("the client to learn s2 from etcd", lambda: any(a == s2.addr for a, _ in grads.known()))
            s1.proc.send_signal(signal.SIGKILL)
            s1.proc.wait()
            took = wait_for("s1 to drop out when its lease expires",
                            lambda: all(a != s1.addr for a, _ in grads.known()))
            print(f"secondary SIGKILLed -> out of the client's list (lease 1s): {took:.3f} s")
            ann = discover.services(target, discover.KIND_SECONDARY)
            assert [(s.id, s.addr, s.secondaries) for s in ann] == [("s2", s2.addr, ("s0",))]
            for _ in range(3):
                v = store.pull("d").version
                assert grads.push("d", v, {"w": np.ones(2, dtype=np.float32)}).addr == s2.addr
            assert grads._watch is not None and grads._watch.opened == 1, grads._watch.error  # one watch saw it all
        finally:
            store.close()
            grads.close()
            assert grads._watch is not None and not grads._watch._thread.is_alive()  # close stopped the watch
    finally:
        for h in procs:
            h.stop()
        etcd.stop()


def test_collector_finds_its_relay_from_etcd(rlhub_bin, tmp_path, monkeypatch):
    # Relay and collector name their machine by $RLHUB_HOST (a Kubernetes
    # node's name), not by their hostnames.
    node = f"pynode-{os.getpid()}"
    monkeypatch.setenv(discover.HOST_ENV, node)
    etcd = Etcd(tmp_path)
    cluster = f"pyrelay{os.getpid()}"
    target = _channel.etcd_target(etcd.url, cluster)
    d = tmp_path / "p"
    d.mkdir()
    h = Hub(rlhub_bin, d, extra=["--etcd", etcd.url, "--cluster", cluster, "--lease-ttl", "1s", "--member-id", "p"])
    relay = None
    seg = f"/dev/shm/rlhub-pydisc-{os.getpid()}-{time.time_ns()}"
    try:
        leader(etcd, cluster)
        assert discover.collector_target(target, "m") == (target, False)
        relay = subprocess.Popen([rlhub_bin, "--log-level", "warn", "relay", "--etcd", etcd.url, "--cluster", cluster,
                                  "--model", "m", "--listen", "127.0.0.1:0", "--shm", seg, "--id", "pyrelay"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env={**os.environ, discover.HOST_ENV: node})
        line = relay.stdout.readline()
        m = re.search(r"listening on (\S+),", line)
        assert m, line
        addr = m.group(1)
        assert discover.collector_target(target, "m") == (addr, True)
        assert discover.local_relay(target, "m", host=node).addr == addr  # announced under $RLHUB_HOST
        with monkeypatch.context() as mp:
            mp.delenv(discover.HOST_ENV)  # this machine's hostname is not the relay's host
            assert discover.host_name() == socket.gethostname() != node
            assert discover.collector_target(target, "m") == (target, False)
            mp.setenv(discover.HOST_ENV, "no such host\n" + "x" * 300)
            with pytest.raises(rlhub.errors.InvalidArgument, match="RLHUB_HOST") as ei:
                discover.host_name()
            assert "xxx" not in str(ei.value)
        assert discover.collector_target(target, "other") == (target, False)
        assert discover.local_relay(target, "m", host="another-host") is None
        # A failover source given only the cluster finds the relay
        # (segment, stream) when it dials and falls back to the primary:
        # it reads through the relay, then from the hub once the relay is
        # SIGKILLed.
        store = rlhub.StoreClient(target, timeout=30.0)
        store.push("m", {"w": np.ones(2, dtype=np.float32)}, version=1, expect=0)
        from rlhub._sources import discovers_relay, open_source
        assert discovers_relay(target) and not discovers_relay(target, relay=addr)
        assert discover.failover_for(target, "m") == [("relay-shm", "shm", seg), ("relay", "push", addr),
                                                     ("upstream", "push", target)]
        # The relay makes its segment when its first version arrives: a
        # source dialed before that takes the relay's stream instead.
        wait_for("the relay's segment", lambda: os.path.exists(seg))
        src = open_source("failover", target, "m", collector_id="pydisc")
        push = open_source("push", target, "m", collector_id="pydisc-push")  # the Go ViaPush order
        try:
            v = src.wait_newer(0, timeout=30)
            assert v is not None and v.version == 1 and src.current == "relay-shm", (v, src.current)
            v = push.wait_newer(0, timeout=30)
            assert v is not None and v.version == 1 and push.current == "relay", (v, push.current)
            relay.send_signal(signal.SIGKILL)
            relay.wait()
            killed = time.monotonic()
            store.push("m", {"w": np.full(2, 2.0, dtype=np.float32)}, version=2, expect=1)
            v = src.wait_newer(1, timeout=30)
            assert v is not None and v.version == 2 and src.current == "upstream", (v, src.current)
            v = push.wait_newer(1, timeout=30)
            assert v is not None and v.version == 2 and push.current == "push", (v, push.current)
            print(f"relay SIGKILLed -> failover collector receiving from the hub: {time.monotonic() - killed:.3f} s")
            took = wait_for("the relay to drop out", lambda: discover.collector_target(target, "m") == (target, False))
            print(f"relay SIGKILLed -> etcd lookups answer the hub (lease 2s): {time.monotonic() - killed:.3f} s")
            assert discover.failover_for(target, "m") == [("upstream", "push", target)]
        finally:
            src.close()
            push.close()
            store.close()
    finally:
        if relay is not None and relay.poll() is None:
            relay.kill()
            relay.wait()
        if relay is not None:
            relay.stdout.close()
        if os.path.exists(seg):
            os.unlink(seg)
        h.stop()
        etcd.stop()


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def test_gateway_tls_and_auth(rlhub_bin, tmp_path):
    certs, other = tmp_path / "certs", tmp_path / "other"
    subprocess.run([rlhub_bin, "cert", "--dir", str(certs), "--hosts", "127.0.0.1"], check=True, capture_output=True)
    subprocess.run([rlhub_bin, "cert", "--dir", str(other), "--hosts", "127.0.0.1"], check=True, capture_output=True)
    # etcd 3.4's JSON gateway refuses a client certificate that carries a
    # CommonName once auth is on (the CN would be ignored there): Python
    # clients get one without (rlhub cert --no-cn; docs/cluster.md).
    subprocess.run([rlhub_bin, "cert", "--dir", str(certs), "--name", "py", "--client", "--no-cn"],
                   check=True, capture_output=True)
    key, crt = certs / "py-key.pem", certs / "py.pem"
    tls = {"ca": str(certs / "ca.pem"), "cert": str(certs / "server.pem"), "key": str(certs / "server-key.pem"),
           "client_cert": str(crt), "client_key": str(key), "go_cert": str(certs / "client.pem"),
           "go_key": str(certs / "client-key.pem")}
    etcd = Etcd(tmp_path, tls)
    cluster = "pysec"
    try:
        # root, and a user whose role covers only /rlhub/pysec/.
        prefix = f"/rlhub/{cluster}/"
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        etcd.post("/v3/auth/role/add", {"name": "root"})
        etcd.post("/v3/auth/user/add", {"name": "root", "password": "rootpw"})
        etcd.post("/v3/auth/user/grant", {"user": "root", "role": "root"})
        etcd.post("/v3/auth/role/add", {"name": "r"})
        etcd.post("/v3/auth/role/grant", {"name": "r", "perm": {"key": b64(prefix), "range_end": b64(end), "permType": "READWRITE"}})
        etcd.post("/v3/auth/user/add", {"name": "hub", "password": "hubpw"})
        etcd.post("/v3/auth/user/grant", {"user": "hub", "role": "r"})
        etcd.post("/v3/auth/enable", {})
        (tmp_path / "pw").write_text("hubpw\n")
        (tmp_path / "wrong").write_text("nope\n")
        target = f"etcd://{etcd.hostport}/{cluster}"
        good = discover.EtcdSecurity(cacert=tls["ca"], cert=tls["client_cert"], key=tls["client_key"],
                                     user="hub", password_file=str(tmp_path / "pw"))
        import dataclasses
        cases = {
            "wrong password": (dataclasses.replace(good, password_file=str(tmp_path / "wrong")), errors.Unauthenticated, "authentication failed"),
            "no client cert": (dataclasses.replace(good, cert=None, key=None), errors.Unavailable, "TLS handshake"),
            "wrong CA": (dataclasses.replace(good, cacert=str(other / "ca.pem")), errors.Unavailable, "TLS handshake"),
        }
        for name, (sec, exc, text) in cases.items():
            discover.configure(sec)
            with pytest.raises(exc) as ei:
                discover.services(target)
            assert "etcd" in str(ei.value) and text in str(ei.value), (name, ei.value)
            assert len(str(ei.value)) < 1000
        discover.configure(good)
        assert discover.services(target) == []
        with pytest.raises(errors.PermissionDenied) as ei:  # another cluster's keys
            discover.services(f"etcd://{etcd.hostport}/elsewhere")
        assert "etcd" in str(ei.value)
        # The same credentials through the Go command line, with a relay
        # announcing itself (a real write, under the user's role).
        seg = f"/dev/shm/rlhub-pysec-{os.getpid()}-{time.time_ns()}"
        d = tmp_path / "p"
        d.mkdir()
        flags = ["--etcd-cacert", tls["ca"], "--etcd-cert", tls["go_cert"], "--etcd-key", tls["go_key"],
                 "--etcd-user", "hub", "--etcd-password-file", str(tmp_path / "pw")]
        h = Hub(rlhub_bin, d, extra=[*flags, "--etcd", etcd.hostport, "--cluster", cluster, "--member-id", "p"])
        relay = subprocess.Popen([rlhub_bin, "--log-level", "warn", *flags,
                                  "relay", "--etcd", etcd.hostport, "--cluster", cluster,
                                  "--model", "m", "--listen", "127.0.0.1:0", "--shm", seg, "--id", "secrelay"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            line = relay.stdout.readline()
            assert "listening on" in line, line + relay.stdout.read()
            wait_for("the relay's announcement", lambda: [s.id for s in discover.services(target, "relay")] == ["secrelay"])
            ok = subprocess.run([rlhub_bin, *flags, "cluster", "status", "--etcd", etcd.hostport, "--cluster", cluster],
                                capture_output=True, text=True, timeout=60)
            assert ok.returncode == 0 and "primary p@" in ok.stdout, (ok.stdout, ok.stderr)
        finally:
            relay.kill()
            relay.wait()
            relay.stdout.close()
            h.stop()
            if os.path.exists(seg):
                os.unlink(seg)
        bad = subprocess.run([rlhub_bin, "--etcd-cacert", tls["ca"], "--etcd-cert", tls["client_cert"], "--etcd-key", tls["client_key"],
                              "--etcd-user", "hub", "--etcd-password-file", str(tmp_path / "wrong"),
                              "cluster", "status", "--etcd", etcd.hostport, "--cluster", cluster],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode != 0 and "etcd" in bad.stderr and "authentication failed" in bad.stderr, bad.stderr
    finally:
        discover.configure(None)
        etcd.stop()


def test_plaintext_off_loopback_is_refused():
    with pytest.raises(errors.InvalidArgument) as ei:
        discover.services("etcd://10.9.8.7:2379/x")
    assert "loopback" in str(ei.value)
    discover.configure(discover.EtcdSecurity(user="u"))
    try:
        with pytest.raises(errors.InvalidArgument):
            discover.services("etcd://127.0.0.1:1/x")
    finally:
        discover.configure(None)


def test_relay_lookup_answers_from_its_watch(tmp_path):
    """A failover source's relay lookup follows the announcements with one
    etcd watch: it sees a relay announced, replaced and withdrawn (another
    model's or host's ignored) and, once it has a list, answers from memory
    — with etcd stopped it still answers at once, where a read per probe
    would fail. Closing it ends the watch's thread."""
    import json
    import socket
    import threading
    from rlhub._sources import _RelayLookup

    etcd = Etcd(tmp_path)
    cluster = f"pylookup{os.getpid()}"
    target = _channel.etcd_target(etcd.url, cluster)
    host = socket.gethostname()

    def put(sid: str, model: str, addr: str, on: str = host) -> None:
        info = {"kind": "relay", "id": sid, "addr": addr, "model": model, "host": on}
        etcd.post("/v3/kv/put", {"key": b64(f"/rlhub/{cluster}/services/relay/{sid}"), "value": b64(json.dumps(info))})

    def delete(sid: str) -> None:
        etcd.post("/v3/kv/deleterange", {"key": b64(f"/rlhub/{cluster}/services/relay/{sid}")})

    lookup = _RelayLookup(target, "m", timeout=10.0)
    try:
        with pytest.raises(errors.Unavailable, match="no relay of 'm' is announced"):
            lookup.get()
        put("critic", "other", "127.0.0.1:1")
        put("elsewhere", "m", "127.0.0.1:2", on="another-host")
        put("r1", "m", "127.0.0.1:3")

        def addr() -> str:
            try:
                return lookup.get().addr
            except errors.Unavailable:
                return ""
        wait_for("the lookup to see r1", lambda: addr() == "127.0.0.1:3")
        delete("r1")
        wait_for("the lookup to see r1 withdrawn", lambda: addr() == "")
        put("r2", "m", "127.0.0.1:4")
        wait_for("the lookup to see r2", lambda: addr() == "127.0.0.1:4")
        etcd.stop()
        t0 = time.monotonic()
        assert lookup.get().addr == "127.0.0.1:4"
        print(f"lookup with etcd stopped: {1e3 * (time.monotonic() - t0):.2f} ms")
    finally:
        lookup.close()
        etcd.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("rlhub-etcd-watch-relay")], "the watch's thread outlived close"
    with pytest.raises(errors.Unavailable, match="closed"):
        lookup.get()


def test_service_watch_survives_a_malformed_answer():
    """An etcd answer that does not decode (a value that is not base64) is
    read again, and the announcement after it delivered; it ended the
    watch's thread for good, silently, before. A gateway on loopback plays
    etcd here: a real etcd does not send such an answer."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    ranges = []
    good = base64.b64encode(json.dumps({"kind": "secondary", "id": "h1", "addr": "127.0.0.1:9",
                                        "secondaries": ["s1"]}).encode()).decode()
    key = base64.b64encode(b"/rlhub/c/services/secondary/h1").decode()

    class Gateway(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/v3/kv/range":
                self._send(404, {"error": "not here"})
                return
            ranges.append(1)
            value = "abc" if len(ranges) == 1 else good  # "abc": bad base64 padding
            self._send(200, {"header": {"revision": "5"}, "kvs": [{"key": key, "value": value}]})

        def do_GET(self):  # noqa: N802 - the WebSocket watch: refused, so the watcher reads again
            self._send(404, {"error": "no websocket"})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    seen = []
    w = discover.ServiceWatch(f"etcd://127.0.0.1:{srv.server_address[1]}/c", discover.KIND_SECONDARY,
                              lambda ss: seen.append([s.id for s in ss]))
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and ["h1"] not in seen:
            time.sleep(0.05)
        assert ["h1"] in seen, f"watch thread alive={w._thread.is_alive()}, error={w.error!r}, ranges={len(ranges)}"
    finally:
        w.close()
        srv.shutdown()
        srv.server_close()


def test_a_gateway_that_trickles_its_answer_fails_within_the_timeout():
    """A gateway that answers a read's headers and then its body a byte
    every 0.2 s (each wait shorter than the timeout) fails the read with
    Unavailable within about its timeout, not when the body is done (4096
    bytes: 14 minutes). A gateway on loopback plays etcd here."""
    import threading

    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen(4)
    stop = threading.Event()

    def one(c):
        with c:
            try:
                c.recv(1 << 16)
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n")
                while not stop.wait(0.2):
                    c.sendall(b" ")
            except OSError:
                pass

    def serve():
        while True:
            try:
                c, _ = lis.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    out = []

    def read():
        t0 = time.monotonic()
        try:
            discover.services(f"etcd://127.0.0.1:{lis.getsockname()[1]}/c", timeout=1.0)
            out.append(("answered", time.monotonic() - t0))
        except errors.RlhubError as e:
            out.append((e, time.monotonic() - t0))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(20)
    stop.set()
    lis.close()
    assert out, "the read was still waiting for the trickled answer 20 s into a 1 s timeout"
    err, took = out[0]
    assert isinstance(err, errors.Unavailable) and took < 5, out


@pytest.mark.parametrize("status,body", [(200, []), (200, "x"), (503, []), (500, "x"),
                                         (200, {"kvs": "x"}), (200, {"kvs": [1]}),
                                         (200, {"kvs": [{"key": "k", "value": "abc"}]})])
def test_a_gateway_answer_of_another_shape_is_unavailable(status, body):
    """An etcd answer that is JSON but not of etcd's shape (not an object,
    its kvs not a list of them, a value not base64) fails a read with
    Unavailable: a collector then connects to the hub and a failover source
    list is the primary alone, instead of an AttributeError ending the
    collector. A gateway on loopback plays etcd here."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Gateway(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    target = f"etcd://127.0.0.1:{srv.server_address[1]}/c"
    try:
        with pytest.raises(errors.Unavailable):
            discover.services(target, timeout=2.0)
        assert discover.collector_target(target, "m", timeout=2.0) == (target, False)
        assert discover.failover_for(target, "m", timeout=2.0) == [("upstream", "push", target)]
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_gateway_that_closes_after_its_answer_is_read_whole():
    """A gateway answering HTTP/1.0 style (Connection: close, as a proxy in
    front of etcd may), its body a moment after its headers, is read whole:
    the connection is closed once the answer is in, not under the read. A
    gateway on loopback plays etcd here."""
    import json
    import threading

    value = base64.b64encode(json.dumps({"kind": "relay", "id": "r1", "addr": "127.0.0.1:9",
                                         "model": "m", "host": "h"}).encode()).decode()
    body = json.dumps({"header": {"revision": "5"}, "kvs": [{"key": "k", "value": value}]}).encode()
    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen(4)

    def serve():
        while True:
            try:
                c, _ = lis.accept()
            except OSError:
                return
            with c:
                try:
                    c.recv(1 << 16)
                    c.sendall(b"HTTP/1.0 200 OK\r\nConnection: close\r\nContent-Type: application/json\r\n"
                              b"Content-Length: %d\r\n\r\n" % len(body))
                    time.sleep(0.1)
                    c.sendall(body)
                except OSError:
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        for _ in range(3):
            ss = discover.services(f"etcd://127.0.0.1:{lis.getsockname()[1]}/c", timeout=5.0)
            assert [s.id for s in ss] == ["r1"]
    finally:
        lis.close()
        t.join(10)
