"""The Python client against a hub with mutual TLS and tokens (issue 16):
every client through rlhub._channel, the data plane over TLS with its
token, Unauthenticated / PermissionDenied as named exceptions, a Python
ARS worker training CartPole and a shortened PPO example."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest

import rlhub
from rlhub import _channel
from rlhub._proto.rlhub.v1 import store_pb2, store_pb2_grpc

from conftest import REPO, free_port

ROLES = {"admin": "*", "trainer": "t/", "worker": "*", "reader": "*"}


class SecureHub:
    """`rlhub serve` with a development CA, mutual TLS and a token file
    made by `rlhub cert` and `rlhub token new`."""

    def __init__(self, binary: str, d: pathlib.Path, extra=()):
        self.binary, self.dir = binary, d
        self._cli("cert", "--dir", str(d / "certs"), "--hosts", "127.0.0.1")
        for role, scope in ROLES.items():
            self._cli("token", "new", "--role", role, "--scope", scope, "--name", role,
                      "--out", str(d / f"{role}.token"), "--append", str(d / "tokens"))
        self.addr = f"127.0.0.1:{free_port()}"
        self.log = open(d / "hub.log", "wb")
        c = d / "certs"
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", self.addr, "--data", str(d / "data"),
             "--tls-cert", str(c / "server.pem"), "--tls-key", str(c / "server-key.pem"),
             "--tls-client-ca", str(c / "ca.pem"), "--auth-tokens", str(d / "tokens"), *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        ch = _channel.channel(self.addr, security=self.security(None))
        try:
            grpc.channel_ready_future(ch).result(timeout=30)
        except grpc.FutureTimeoutError:
            self.stop()
            raise RuntimeError(f"hub did not start: {(d / 'hub.log').read_text()}")
        finally:
            ch.close()

    def _cli(self, *args: str) -> str:
        return subprocess.run([self.binary, *args], capture_output=True, text=True, check=True, timeout=60).stdout

    def security(self, role):
        c = self.dir / "certs"
        tok = _channel.read_token(str(self.dir / f"{role}.token")) if role else None
        return rlhub.Security(ca=str(c / "ca.pem"), cert=str(c / "client.pem"), key=str(c / "client-key.pem"),
                              token=tok)

    def env(self, role) -> dict:
        c = self.dir / "certs"
        e = dict(os.environ, RLHUB_TLS_CA=str(c / "ca.pem"), RLHUB_TLS_CERT=str(c / "client.pem"),
                 RLHUB_TLS_KEY=str(c / "client-key.pem"), RLHUB_TOKEN_FILE=str(self.dir / f"{role}.token"),
                 PYTHONPATH=str(REPO / "python"))
        e.pop("RLHUB_TOKEN", None)
        return e

    def flags(self, role) -> list:
        c = self.dir / "certs"
        return ["--tls-ca", str(c / "ca.pem"), "--tls-cert", str(c / "client.pem"),
                "--tls-key", str(c / "client-key.pem"), "--token-file", str(self.dir / f"{role}.token")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def secure_hub(rlhub_bin, tmp_path):
    h = SecureHub(rlhub_bin, tmp_path, extra=("--reduce-batch-size", "2", "--max-wait", "200ms"))
    yield h
    h.stop()
    rlhub.configure(None)


def weights():
    return {"w": np.arange(4, dtype=np.float32)}


def test_store_roles_and_scopes_map_to_named_exceptions(secure_hub):
    rlhub.configure(secure_hub.security("trainer"))
    with rlhub.StoreClient(secure_hub.addr) as s:
        s.push("t/m", weights(), version=1, expect=0)
        with pytest.raises(rlhub.PermissionDenied, match="does not cover model"):
            s.push("u/m", weights(), version=1, expect=0)  # outside the trainer's scope
    rlhub.configure(secure_hub.security("reader"))
    with rlhub.StoreClient(secure_hub.addr) as s:
        got = s.pull("t/m")
        assert got.version == 1 and np.array_equal(got.tensors["w"], weights()["w"])
        with pytest.raises(rlhub.PermissionDenied, match="needs role trainer"):
            s.push("t/m", weights(), version=2, expect=1)
    rlhub.configure(secure_hub.security(None))  # TLS, no token
    with rlhub.StoreClient(secure_hub.addr) as s:
        with pytest.raises(rlhub.Unauthenticated):
            s.pull("t/m")
    bad = rlhub.Security(ca=secure_hub.security(None).ca, cert=secure_hub.security(None).cert,
                         key=secure_hub.security(None).key, token="rlh_never-issued")
    rlhub.configure(bad)
    with rlhub.StoreClient(secure_hub.addr) as s:
        with pytest.raises(rlhub.Unauthenticated, match="unknown token"):
            s.list()


def test_plaintext_client_of_a_tls_hub_is_told_to_pass_the_ca(secure_hub):
    # The hub closes a connection whose first bytes are no TLS handshake;
    # grpc says only "Socket closed".
    rlhub.configure(None)
    with rlhub.StoreClient(secure_hub.addr, transport="grpc") as s:
        with pytest.raises(rlhub.Unavailable, match=r"Socket closed.*if it serves TLS, pass its CA"):
            s.list()


def test_no_client_certificate_is_refused(secure_hub):
    sec = secure_hub.security("admin")
    ch = _channel.channel(secure_hub.addr, security=rlhub.Security(ca=sec.ca, token=sec.token))
    try:
        with pytest.raises(grpc.RpcError) as e:
            store_pb2_grpc.ModelStoreStub(ch).List(store_pb2.StoreListRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        ch.close()


def test_gradients_over_the_tls_data_plane(secure_hub):
    torch = pytest.importorskip("torch")
    rlhub.configure(secure_hub.security("admin"))
    net = torch.nn.Linear(4, 2)
    with rlhub.StoreClient(secure_hub.addr) as s:
        s.push("t/lin", net.state_dict(), version=1, expect=0)
    admin = rlhub.GradClient(secure_hub.addr, "admin")
    admin.register("t/lin", optimizer=torch.optim.SGD(net.parameters(), lr=0.1), reduction="sum")
    admin.close()
    # The trainer (scope t/) pushes on the data plane over TLS; a reader
    # is refused there with the same named exception gRPC would raise.
    rlhub.configure(secure_hub.security("trainer"))
    g = rlhub.GradClient(secure_hub.addr, "trainer-1")
    try:
        net(torch.ones(3, 4)).sum().backward()
        for _ in range(4):
            g.push("t/lin", 1, net)
        assert g.transport_stats()["bulk"] >= 4 and g.transport_stats()["fallback"] == 0, g.transport_stats()
        deadline = time.monotonic() + 30
        while g.stats().total.applied < 4:
            assert time.monotonic() < deadline, g.stats()
            time.sleep(0.05)
    finally:
        g.close()
    rlhub.configure(secure_hub.security("reader"))
    r = rlhub.GradClient(secure_hub.addr, "reader-1")
    try:
        with pytest.raises(rlhub.PermissionDenied, match="needs role trainer"):
            r.push("t/lin", 1, net)
        assert r.transport_stats()["bulk"] >= 1
    finally:
        r.close()


def test_python_ars_worker_trains_cartpole_over_mtls(secure_hub, tmp_path):
    pytest.importorskip("gymnasium")
    worker = subprocess.Popen([sys.executable, "-m", "rlhub.ars_worker", "--hub", secure_hub.addr,
                               "--env", "CartPole-v1", "--name", "py-1"],
                              env=secure_hub.env("worker"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out = subprocess.run([secure_hub.binary, *secure_hub.flags("admin"), "--log-level", "warn", "train", "ars",
                              "--hub", secure_hub.addr, "--workers", "0", "--env", "CartPole-v1", "--seed", "2",
                              "--target", "200", "--out", str(tmp_path / "run")],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert '"reached_target": true' in (tmp_path / "run" / "summary.json").read_text()
    finally:
        worker.send_signal(signal.SIGINT)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def test_ppo_example_over_mtls(secure_hub, tmp_path):
    """The PPO example (2 learners, 2 collectors, a coordinator) through
    the TLS hub for three iterations: the gradients are applied."""
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    out = subprocess.run([sys.executable, str(REPO / "examples" / "cartpole_ppo" / "run.py"), "--hub", secure_hub.addr,
                          "--max-iters", "3", "--target", "1e9", "--csv", str(tmp_path / "c.csv"),
                          "--png", str(tmp_path / "c.png")],
                         env=secure_hub.env("admin"), capture_output=True, text=True, timeout=600)
    log = out.stdout + out.stderr
    m = re.search(r"reducer counters: pushed (\d+)\s+reduced \d+\s+applied (\d+)", log)
    assert m, log[-4000:]
    assert int(m.group(2)) > 0, log[-4000:]
    assert "every gradient accounted for (pushed = applied + dropped): True" in log, log[-4000:]


def test_owner_quota_and_revocation_from_python(secure_hub):
    """A model is its pushing token's: another trainer token gets
    PermissionDenied; a token past max-models gets the ResourceExhausted
    exception (QueueFull) before anything lands; a token revoked with
    `rlhub token revoke` is refused without a hub restart."""
    d = secure_hub.dir
    secure_hub._cli("token", "new", "--role", "trainer", "--scope", "t/", "--name", "other",
                    "--out", str(d / "other.token"), "--append", str(d / "tokens"))
    secure_hub._cli("token", "new", "--role", "trainer", "--scope", "t/", "--name", "capped", "--max-models", "1",
                    "--out", str(d / "capped.token"), "--append", str(d / "tokens"))
    secure_hub.proc.send_signal(signal.SIGHUP)

    def retry(fn, exc=rlhub.Unauthenticated):
        deadline = time.monotonic() + 30
        while True:
            try:
                return fn()
            except exc:
                assert time.monotonic() < deadline, "the hub never reloaded its token file"
                time.sleep(0.05)

    rlhub.configure(secure_hub.security("trainer"))
    with rlhub.StoreClient(secure_hub.addr) as s:
        s.push("t/owned", weights(), version=1, expect=0)
    rlhub.configure(secure_hub.security("other"))
    with rlhub.StoreClient(secure_hub.addr) as s:
        retry(s.list)
        with pytest.raises(rlhub.PermissionDenied, match="token:trainer"):
            s.push("t/owned", weights(), version=2, expect=1)
    rlhub.configure(secure_hub.security("capped"))
    with rlhub.StoreClient(secure_hub.addr) as s:
        s.push("t/c1", weights(), version=1, expect=0)
        with pytest.raises(rlhub.RlhubError, match="max-models") as e:
            s.push("t/c2", weights(), version=1, expect=0)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert [m.name for m in s.list()].count("t/c2") == 0
    secure_hub._cli("token", "revoke", "--file", str(d / "tokens"), "--name", "capped")
    secure_hub.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    with rlhub.StoreClient(secure_hub.addr) as s:
        while True:
            try:
                s.list()
            except rlhub.Unauthenticated:
                break
            assert time.monotonic() < deadline, "the revoked token is still accepted"
            time.sleep(0.05)
