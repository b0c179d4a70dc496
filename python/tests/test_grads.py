"""GradClient against the real hub: steps match torch.optim, counters add up,
bad inputs get named exceptions, failover and back-off keep every push."""

from __future__ import annotations

import signal
import subprocess
import socket
import threading
import time

import numpy as np
import pytest
import torch

import rlhub
from rlhub.grads import GradClient, gradient_dict, optimizer_config
from conftest import Hub, free_port


def make_net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def fill_grads(net: torch.nn.Module, seed: int) -> None:
    """Gives every parameter a gradient from a real backward pass."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 5, generator=g)
    net.zero_grad()
    (net(x) ** 2).mean().backward()


def wait_version(store: rlhub.StoreClient, name: str, after: int) -> rlhub.ModelVersion:
    v = store.pull(name, if_newer_than=after)
    if v is not None:
        return v
    for v in store.watch(name, after=after, framework="torch", timeout=30):
        return v
    raise AssertionError("watch ended without a version")


def stats_at(g: GradClient, name: str, version: int, timeout: float = 30.0):
    """The client's stats once the hub counts ``version`` of ``name``: a step
    is counted right after its version lands, so a reader that saw the
    version can ask a moment before (docs/reducer.md, Stats)."""
    deadline = time.monotonic() + timeout
    while True:
        st = g.stats()
        if st.versions.get(name, 0) >= version or time.monotonic() > deadline:
            return st
        time.sleep(0.01)


def assert_close_to(pulled: dict, net: torch.nn.Module) -> None:
    want = net.state_dict()
    assert set(pulled) == set(want)
    for k, w in want.items():
        got = torch.as_tensor(np.asarray(pulled[k]))
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6, msg=lambda m: f"{k}: {m}")


def setup_model(hub_addr: str, name: str, net: torch.nn.Module) -> None:
    with rlhub.StoreClient(hub_addr) as s:
        s.push(name, net.state_dict(), version=1, expect=0)


MAKE_OPT = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, betas=(0.8, 0.99), eps=1e-7, weight_decay=1e-3),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.05, lr_decay=0.01, initial_accumulator_value=0.1),
    "adamax": lambda ps: torch.optim.Adamax(ps, lr=0.01, weight_decay=1e-3),
    "nadam": lambda ps: torch.optim.NAdam(ps, lr=0.01, momentum_decay=0.01, weight_decay=0.01, decoupled_weight_decay=True),
    "radam": lambda ps: torch.optim.RAdam(ps, lr=0.01, betas=(0.9, 0.9)),  # rectified from step 3
}


@pytest.mark.parametrize("kind", sorted(MAKE_OPT))
def test_steps_match_torch_optim_on_the_same_grads(hub, kind):
    ref = make_net()
    setup_model(hub.addr, "pol", ref)
    opt = MAKE_OPT[kind](ref.parameters())
    learner = make_net(seed=99)  # different weights: only its .grad travels
    with GradClient(hub.addr) as g, rlhub.StoreClient(hub.addr) as s:
        reg = g.register("pol", optimizer=opt)
        assert (reg.version, reg.restored_steps) == (1, 0)
        g.register("pol", optimizer=opt)  # same config: a no-op
        with pytest.raises(rlhub.AlreadyExists):
            g.register("pol", optimizer={"kind": "sgd", "lr": 0.5})
        version = 1
        steps = 3 if kind in ("adam", "sgd") else 5
        for step in range(steps):
            fill_grads(learner, seed=step)
            r = g.push("pol", version, learner)
            assert (r.version, r.weight, r.seq, r.duplicate) == (version, 1.0, step + 1, False)
            v = wait_version(s, "pol", version)
            assert v.version == version + 1
            # The same gradient, stepped by torch itself.
            for p, q in zip(ref.parameters(), learner.parameters()):
                p.grad = q.grad.clone()
            opt.step()
            assert_close_to(v.tensors, ref)
            version = v.version
        st = stats_at(g, "pol", steps + 1)
        assert (st.total.pushed, st.total.applied, st.total.steps, st.total.dropped_total) == (steps, steps, steps, 0)
        assert st.versions["pol"] == steps + 1 and st.accounted()


def test_register_reads_initial_lr_under_a_torch_linear_warmup(hub):
    """A LinearLR made before register has already scaled group["lr"] by its
    start factor; register must send the base rate (initial_lr), or the
    hub's warm-up would apply the factor twice. The hub's steps then equal
    torch's Adam stepped under the same LinearLR."""
    ref = make_net()
    setup_model(hub.addr, "pol", ref)
    opt = torch.optim.Adam(ref.parameters(), lr=0.02)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, end_factor=1.0, total_iters=3)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.005)  # already scaled
    assert optimizer_config(opt)["lr"] == 0.02
    learner = make_net(seed=99)
    with GradClient(hub.addr) as g, rlhub.StoreClient(hub.addr) as s:
        g.register("pol", optimizer=opt, schedule={"warmup_steps": 3, "warmup_start": 0.25})
        version = 1
        for step in range(5):
            fill_grads(learner, seed=step)
            g.push("pol", version, learner)
            v = wait_version(s, "pol", version)
            for p, q in zip(ref.parameters(), learner.parameters()):
                p.grad = q.grad.clone()
            opt.step()
            sched.step()
            assert_close_to(v.tensors, ref)
            version = v.version


def test_mean_of_a_batch_and_global_clip_match_torch(rlhub_bin, tmp_path):
    # A batch of exactly two gradients (long max-wait), reduced by mean and clipped.
    h = Hub(rlhub_bin, tmp_path, extra=("--reduce-batch-size", "2", "--max-wait", "20s"))
    try:
        ref = make_net()
        setup_model(h.addr, "pol", ref)
        opt = torch.optim.SGD(ref.parameters(), lr=0.5)
        a, b = make_net(1), make_net(2)
        fill_grads(a, 10)
        fill_grads(b, 11)
        with GradClient(h.addr, "a") as ga, GradClient(h.addr, "b") as gb, rlhub.StoreClient(h.addr) as s:
            ga.register("pol", optimizer=opt, reduction="mean", gradient_max=0.05)
            ra = ga.push("pol", 1, a)
            rb = gb.push("pol", 1, {k: v.numpy() for k, v in gradient_dict(b).items()})
            assert ra.seq > 1_000_000 and rb.seq > 1_000_000  # explicit ids start at Unix µs
            v = wait_version(s, "pol", 1)
            assert v.version == 2
            for p, qa, qb in zip(ref.parameters(), a.parameters(), b.parameters()):
                p.grad = (qa.grad + qb.grad) / 2
            norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
            assert norm > 0.05, "the test wants the clip to bite"
            opt.step()
            assert_close_to(v.tensors, ref)
            st = stats_at(ga, "pol", 2)
            assert (st.total.pushed, st.total.applied, st.total.steps) == (2, 2, 1)
    finally:
        h.stop()


def test_bad_inputs_raise_named_exceptions_and_are_counted(hub):
    net = make_net()
    setup_model(hub.addr, "pol", net)
    with GradClient(hub.addr) as g, rlhub.StoreClient(hub.addr) as s:
        with pytest.raises(rlhub.NotFound):
            fill_grads(net, 0)
            g.push("pol", 1, net)  # not registered yet
        g.register("pol", optimizer={"kind": "sgd", "lr": 0.1}, staleness="drop", max_lag=0)
        good = {k: v.clone() for k, v in gradient_dict(net).items()}

        wrong_shape = dict(good, **{"0.weight": torch.zeros(8, 6)})
        with pytest.raises(rlhub.InvalidArgument, match="0.weight"):
            g.push("pol", 1, wrong_shape)
        nan = {k: v.clone() for k, v in good.items()}
        nan["2.bias"][1] = float("nan")
        with pytest.raises(rlhub.InvalidArgument):
            g.push("pol", 1, nan)
        inf = {k: v.clone() for k, v in good.items()}
        inf["0.weight"][3, 4] = float("inf")
        with pytest.raises(rlhub.InvalidArgument):
            g.push("pol", 1, inf)
        with pytest.raises(rlhub.InvalidArgument):
            g.push("pol", 1, {k: v for k, v in good.items() if k != "2.bias"})  # a tensor missing
        with pytest.raises(rlhub.InvalidArgument):
            g.push("pol", 1, {k: v.double() for k, v in good.items()})  # wrong dtype
        with pytest.raises(rlhub.InvalidArgument):
            g.push("pol", 7, good)  # a base version from the future
        with pytest.raises(rlhub.NotFound):
            g.push("nope", 1, good)
        with pytest.raises(TypeError):
            g.push("pol", 1, [1, 2, 3])

        r = g.push("pol", 1, good, seq=1000)
        assert wait_version(s, "pol", 1).version == 2
        with pytest.raises(rlhub.StaleVersion) as ei:
            g.push("pol", 1, good)  # drop, max_lag 0: version 1 is now too old
        assert ei.value.current_version == 2
        with pytest.raises(rlhub.AlreadyExists):
            g.push("pol", 2, good, seq=r.seq)  # a first attempt reusing an applied seq
        assert s.pull("pol").version == 2  # none of the above changed the model

        st = g.stats()
        t = st.total
        assert t.applied == 1 and t.pushed == 11  # the TypeError never left the client
        assert t.pushed == t.applied + t.dropped_total, t
        assert t.dropped.get("unknown_model") == 2 and t.dropped.get("nonfinite") == 2
        assert t.dropped.get("invalid") == 4 and t.dropped.get("stale") == 1 and t.dropped.get("duplicate") == 1
        assert st.accounted()


def test_optimizer_config_refuses_what_the_reducer_cannot_do():
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert optimizer_config(torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0))["kind"] == "adam"
    assert optimizer_config(torch.optim.RMSprop(p, lr=1e-3, centered=True))["centered"] is True
    for bad in (torch.optim.Adam(p, amsgrad=True), torch.optim.SGD(p, lr=1, maximize=True),
                torch.optim.Adam(p, betas=(0.0, 0.9)), torch.optim.Rprop(p), torch.optim.NAdam(p, momentum_decay=0.0),
                # 0 on the wire is the default: these would train with eps 1e-8 / alpha 0.99.
                torch.optim.Adam(p, eps=0.0), torch.optim.Adagrad(p, eps=0.0), torch.optim.RMSprop(p, alpha=0.0)):
        with pytest.raises(ValueError):
            optimizer_config(bad)


def test_retried_duplicate_is_success(hub):
    net = make_net()
    setup_model(hub.addr, "pol", net)
    fill_grads(net, 0)
    with GradClient(hub.addr, "dup", timeout=10.0) as g, rlhub.StoreClient(hub.addr) as s:
        g.register("pol", optimizer={"kind": "sgd", "lr": 0.1})
        g.push("pol", 1, net, seq=5)
        assert wait_version(s, "pol", 1).version == 2
        # A first attempt that provably sent nothing (the client still lists
        # a secondary that is gone: its dial is refused) does not make the
        # retry's ALREADY_EXISTS "ours": seq 5 was used before, raised.
        g._targets = [(f"127.0.0.1:{free_port()}", "gone")]
        with pytest.raises(rlhub.AlreadyExists):
            g.push("pol", 1, net, seq=5)
        # An attempt whose answer was lost after it reached the hub
        # (AnswerDropper, below): its retry's ALREADY_EXISTS is a success.
        p = AnswerDropper(hub.addr)
        try:
            g._targets = [(p.addr, g.secondaries()[0][1])]
            r = g.push("pol", 2, net, seq=6)
            assert r.duplicate and r.attempts >= 2 and r.addr == hub.addr
        finally:
            p.close()
        assert wait_version(s, "pol", 2).version == 3
        st = g.stats()
        assert st.total.applied == 2 and st.total.dropped.get("duplicate", 0) >= 2
        assert s.pull("pol").version == 3


def test_fails_over_when_a_secondary_process_is_killed(hub, tmp_path):
    """Pushes keep succeeding while the remote secondary they use is SIGKILLed."""
    net = make_net()
    setup_model(hub.addr, "pol", net)
    addr = f"127.0.0.1:{free_port()}"
    log = open(tmp_path / "sec.log", "wb")
    sec = subprocess.Popen([hub.binary, "serve", "--role", "reducer", "--primary", hub.addr, "--listen", addr,
                            "--data", ""], stdout=log, stderr=subprocess.STDOUT)
    try:
        with GradClient(hub.addr, seed=1) as g, rlhub.StoreClient(hub.addr) as s:
            g.register("pol", optimizer={"kind": "sgd", "lr": 0.01})
            for _ in range(200):  # the remote secondary attaches to the primary
                if any(a == addr for a, _ in g.secondaries()):
                    break
                threading.Event().wait(0.05)
            else:
                pytest.fail("remote secondary never listed")
            used = set()
            version = 1
            for i in range(12):
                if i == 6:
                    sec.send_signal(signal.SIGKILL)
                    sec.wait()
                fill_grads(net, i)
                r = g.push("pol", version, net)
                used.add(r.addr)
                version = wait_version(s, "pol", version).version
            assert addr in used and hub.addr in used
            st = g.stats()  # the primary and the hub's own secondary
            assert st.parts["primary"].applied >= 6
    finally:
        if sec.poll() is None:
            sec.kill()
            sec.wait()
        log.close()


def test_full_queue_backs_off_and_every_push_lands(rlhub_bin, tmp_path):
    h = Hub(rlhub_bin, tmp_path, extra=("--reduce-batch-size", "1", "--max-queue-size", "1"))
    try:
        big = {"w": torch.zeros(1 << 20)}  # 4 MiB: pushes overlap
        with rlhub.StoreClient(h.addr) as s:
            s.push("big", big, version=1)
        n_threads, per = 4, 5
        receipts, failures = [], []
        with GradClient(h.addr) as g:
            g.register("big", optimizer={"kind": "sgd", "lr": 0.1}, reduction="sum")

            def pusher(i):
                try:
                    for j in range(per):
                        receipts.append(g.push("big", 1, {"w": torch.full((1 << 20,), float(i + 1))}))
                except Exception as e:  # noqa: BLE001 - reported below
                    failures.append(e)

            ts = [threading.Thread(target=pusher, args=(i,)) for i in range(n_threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert failures == []
            assert len(receipts) == n_threads * per
            assert len({r.seq for r in receipts}) == n_threads * per
            for _ in range(200):
                st = g.stats()
                if st.total.applied == n_threads * per:
                    break
                threading.Event().wait(0.05)
            t = st.total
            assert t.applied == n_threads * per and st.accounted(), t
            # Counted per gradient: each pushed once, applied once, no drop
            # left for the refused attempts its retry settled; the attempts
            # are counted apart.
            assert t.pushed == n_threads * per and not t.dropped, t
            assert t.attempts - t.pushed == sum(r.attempts - 1 for r in receipts), t
            print("queue_full refusals retried:", t.attempts - t.pushed)
        with rlhub.StoreClient(h.addr) as s:
            v = s.pull("big")
            # sum reduction, lr 0.1, weight 0: w = -0.1 * Σ pushed values
            want = -0.1 * per * sum(range(1, n_threads + 1))
            np.testing.assert_allclose(v.tensors["w"][:3], want, rtol=1e-5)
    finally:
        h.stop()


def test_push_to_down_secondaries_backs_off():
    """Every listed secondary down (connections refused at once): the push
    retries with its backoff until its deadline, instead of spinning on the
    same dead secondary and the primary's listing (it made ~1800 attempts
    and ~3700 listings in 2 s before)."""
    import socket
    from concurrent import futures

    import grpc

    from rlhub._proto.rlhub.v1 import reducer_pb2, reducer_pb2_grpc

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()  # nothing listens there: refused at once
    listed = []

    class Primary(reducer_pb2_grpc.ReducerServicer):
        def Secondaries(self, request, context):  # noqa: N802 - gRPC's name
            listed.append(1)
            return reducer_pb2.ReducerSecondariesResponse(
                secondaries=[reducer_pb2.ReducerSecondary(addr=dead, id="s1")])

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    reducer_pb2_grpc.add_ReducerServicer_to_server(Primary(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with GradClient(f"127.0.0.1:{port}", deadline=2.0, timeout=1.0) as g:
            with pytest.raises(rlhub.Unavailable):
                g.push("m", 1, {"w": torch.zeros(4)})
            st = g.transport_stats()
    finally:
        server.stop(0)
    attempts = st["bulk"] + st["grpc"]
    # 1 ms doubling to max_backoff (100 ms) allows ~30 attempts in 2 s.
    assert 2 <= attempts <= 60 and len(listed) <= 150, f"{attempts} attempts and {len(listed)} listings in 2 s"


class AnswerDropper:
    """A TCP proxy to the hub that forwards the request and body but drops
    the hub's answer after the data plane's handshake (8 bytes) and
    continue (1 byte), then closes: the push reached the hub, its answer
    was lost. With ``drop``, only on the connections it accepts (it is
    given each one's first 8 bytes); the others are forwarded whole."""

    def __init__(self, upstream: str, drop=None):
        self.up = upstream
        self.drop = drop
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.addr = "127.0.0.1:%d" % self.srv.getsockname()[1]
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c):
        host, port = self.up.rsplit(":", 1)
        try:
            u = socket.create_connection((host, int(port)))
        except OSError:
            c.close()
            return

        def pipe(a, b):
            try:
                while (x := a.recv(1 << 16)):
                    b.sendall(x)
            except OSError:
                pass

        forward = self.drop is not None and not self.drop(c.recv(8, socket.MSG_PEEK | socket.MSG_WAITALL))
        threading.Thread(target=pipe, args=(c, u), daemon=True).start()
        if forward:
            pipe(u, c)
        else:
            passed = 0
            try:
                while passed < 9:
                    b = u.recv(9 - passed)
                    if not b:
                        break
                    c.sendall(b)
                    passed += len(b)
                u.recv(1)  # the final status begins: drop it
            except OSError:
                pass
        for x in (c, u):  # shutdown, not only close: the forwarding thread is blocked in c.recv
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            x.close()

    def close(self):
        self.srv.close()
