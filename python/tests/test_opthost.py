"""rlhub.OptimizerHost against the real hub: a model registered with the
"external" optimizer is stepped by a host process running any torch
optimizer and lr scheduler; the published weights equal a single-process
torch run on the same reduced gradients, also across a SIGKILL of the host."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

import pytest
import torch

import rlhub
from rlhub.grads import GradClient
from rlhub.opthost import decode_state, encode_state
from test_grads import assert_close_to, fill_grads, setup_model
from opthost_proc import make_case, make_net

HERE = os.path.dirname(os.path.abspath(__file__))


def spawn_host(hub, case: str, log) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..")] + sys.path))
    return subprocess.Popen([sys.executable, os.path.join(HERE, "opthost_proc.py"), hub.addr, "pol", case],
                            env=env, stdout=subprocess.DEVNULL, stderr=log)


def wait_published(s: rlhub.StoreClient, after: int) -> rlhub.ModelVersion:
    """The next version; bounded generously: a host process starting
    (importing torch) on a loaded machine can take tens of seconds."""
    v = s.pull("pol", if_newer_than=after, framework="torch")
    if v is not None:
        return v
    for v in s.watch("pol", after=after, framework="torch", timeout=180):
        return v
    raise AssertionError(f"no version after {after}")


def kill(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)


def run(hub, tmp_path, case: str, steps: int, kill_after=()):
    """Pushes one gradient per version (so each reduced batch is that
    gradient) and checks every published version against torch itself."""
    ref = make_net()
    setup_model(hub.addr, "pol", ref)
    ref_opt, ref_sched = make_case(case, ref)
    learner = make_net(seed=99)  # only its .grad travels
    log = open(tmp_path / "hosts.log", "ab")
    hosts = [spawn_host(hub, case, log)]
    kills = 0
    try:
        with GradClient(hub.addr) as g, rlhub.StoreClient(hub.addr) as s:
            assert g.register("pol", optimizer={"kind": "external"}).version == 1
            version = 1
            for step in range(steps):
                fill_grads(learner, seed=step)
                g.push("pol", version, learner)
                if step in kill_after:
                    # The step may be in flight in the host, done, or not
                    # yet sent: whichever, a new host must finish it right.
                    kill(hosts[-1])
                    kills += 1
                    hosts.append(spawn_host(hub, case, log))
                v = wait_published(s, version)
                assert v.version == version + 1
                for p, q in zip(ref.parameters(), learner.parameters()):
                    p.grad = q.grad.clone()
                ref_opt.step()
                if ref_sched is not None:
                    ref_sched.step()
                assert_close_to(v.tensors, ref)
                version = v.version
            st = g.stats()
            assert (st.total.pushed, st.total.applied, st.total.steps) == (steps, steps, steps)
            assert st.accounted()
            # The host's state is checkpointed with every version.
            hs = s.pull("pol/host-state", version=version, framework="torch")
            state = decode_state(hs.tensors, hs.metadata["host.state"])
            assert state["optimizer"]["param_groups"][0]["lr"] == ref_opt.param_groups[0]["lr"]
    except BaseException:
        log.flush()
        print((tmp_path / "hosts.log").read_text(errors="replace")[-4000:])
        raise
    finally:
        for p in hosts:
            if p.poll() is None:
                kill(p)
        log.close()
    assert kills == len(kill_after)


def test_adam_with_onecycle_matches_torch(hub, tmp_path):
    run(hub, tmp_path, "adam_onecycle", steps=8)


def test_rprop_which_rlhub_has_no_builtin_for_matches_torch(hub, tmp_path):
    run(hub, tmp_path, "rprop", steps=8)


@pytest.mark.skipif(not hasattr(torch.optim, "Adafactor"), reason="torch without Adafactor")
def test_adafactor_with_steplr_matches_torch(hub, tmp_path):
    run(hub, tmp_path, "adafactor", steps=6)


def test_sigkilled_host_resumes_with_its_optimizer_state(hub, tmp_path):
    run(hub, tmp_path, "adam_onecycle", steps=12, kill_after=(3, 7))


def test_state_codec_round_trips_torch_state_dicts():
    net = make_net()
    opt, sched = make_case("adam_onecycle", net)
    fill_grads(net, 0)
    opt.step()
    sched.step()
    state = {"optimizer": opt.state_dict(), "lr_scheduler": sched.state_dict()}
    tensors, text = encode_state(state)
    back = decode_state(tensors, text)
    assert back["lr_scheduler"] == sched.state_dict()
    assert set(back["optimizer"]["state"]) == {0, 1, 2, 3}  # int keys stay ints
    assert isinstance(back["optimizer"]["param_groups"][0]["betas"], tuple)
    for k, v in opt.state_dict()["state"][0].items():
        assert torch.equal(back["optimizer"]["state"][0][k], v)
    with pytest.raises(TypeError, match="cannot checkpoint"):
        encode_state({"f": lambda: 0})


def test_external_registration_is_checked(hub):
    setup_model(hub.addr, "pol", make_net())
    with GradClient(hub.addr) as g:
        with pytest.raises(rlhub.InvalidArgument, match="external"):
            g.register("pol", optimizer={"kind": "external", "lr": 0.1})


def test_host_for_a_model_that_is_not_external_is_refused_not_retried(hub):
    """A host attaching for a model the reducer steps itself is refused with
    InvalidArgument; re-attaching cannot change that, so the host stops and
    says why instead of retrying every backoff forever."""
    net = make_net()
    setup_model(hub.addr, "pol", net)
    with GradClient(hub.addr) as g:
        g.register("pol", optimizer={"kind": "sgd", "lr": 0.1})

    def host():
        return rlhub.OptimizerHost(hub.addr, "pol", torch.optim.SGD(net.parameters(), lr=0.1), module=net,
                                   backoff=0.05)

    with host() as h:  # served on its own thread
        h._thread.join(60)
        assert not h._thread.is_alive(), "the host kept re-attaching after a permanent refusal"
        assert isinstance(h.error, rlhub.InvalidArgument) and h.steps == 0
    h = host()
    try:
        with pytest.raises(rlhub.InvalidArgument, match="not \"external\""):
            h.run()
        assert h.error is not None
    finally:
        h.close()
def test_host_whose_module_is_not_the_model_is_refused_not_retried(hub):
    """A host given a module whose tensors are not the model's cannot
    serve it however often it re-attaches: run() raises InvalidArgument
    naming the tensors (it re-attached every backoff for ever, error None)."""
    setup_model(hub.addr, "pol", make_net())
    with GradClient(hub.addr) as g:
        g.register("pol", optimizer={"kind": "external"})
    other = torch.nn.Linear(3, 2)
    h = rlhub.OptimizerHost(hub.addr, "pol", torch.optim.SGD(other.parameters(), lr=0.1), module=other, backoff=0.05)
    try:
        with pytest.raises(rlhub.InvalidArgument, match="differ from the model"):
            h.run()
        assert isinstance(h.error, rlhub.InvalidArgument)
    finally:
        h.close()


def test_external_registration_survives_hub_sigkills(rlhub_bin, tmp_path):
    """The hub is SIGKILLed mid-run (a step in flight in the host, or just
    published) and restarted on its --data and address, twice. The external
    registration is restored by the hub (nobody registers again), the same
    host process re-attaches by itself, and training continues from the
    newest version: every published version equals a single-process torch
    run over the gradients that were applied, each applied once."""
    from conftest import Hub

    steps, kill_after = 10, (2, 6)
    hub = Hub(rlhub_bin, tmp_path)
    addr = hub.addr
    ref = make_net()
    setup_model(addr, "pol", ref)
    ref_opt, ref_sched = make_case("adam_onecycle", ref)
    learner = make_net(seed=99)
    log = open(tmp_path / "hosts.log", "ab")
    host = spawn_host(hub, "adam_onecycle", log)
    kills = lost = 0
    pending = set(kill_after)
    try:
        with GradClient(addr, deadline=120.0) as g:
            assert g.register("pol", optimizer={"kind": "external"}).version == 1
        version = 1
        for step in range(steps):
            fill_grads(learner, seed=step)
            applied = False
            while not applied:
                # A fresh client per push: its pushes ride out the restart.
                with GradClient(addr, deadline=120.0) as g, rlhub.StoreClient(addr) as s:
                    g.push("pol", version, learner)
                    if step in pending:
                        pending.discard(step)
                        hub.proc.send_signal(signal.SIGKILL)
                        hub.proc.wait(timeout=30)
                        hub.log.close()
                        kills += 1
                        hub = Hub(rlhub_bin, tmp_path, addr=addr)
                        newest = s.pull("pol", framework="torch")
                        if newest.version == version:
                            lost += 1  # admitted, never published: counted lost; push it again
                            continue
                        v = newest
                    else:
                        v = wait_published(s, version)
                applied = True
            assert v.version == version + 1, (v.version, version)
            for p, q in zip(ref.parameters(), learner.parameters()):
                p.grad = q.grad.clone()
            ref_opt.step()
            ref_sched.step()
            assert_close_to(v.tensors, ref)
            version = v.version
        with GradClient(addr) as g:
            st = g.stats()
        # Counters restart with the hub; after the last restart every push
        # was applied exactly once, and the versions count every step.
        assert st.accounted(), st
        assert version == 1 + steps
        assert host.poll() is None, "the host process died"
        r = hub.run_cli("reducer", "stats", "--hub", addr)
        assert "NOT RECOVERED" not in r.stdout, r.stdout
    except BaseException:
        log.flush()
        print((tmp_path / "hosts.log").read_text(errors="replace")[-4000:])
        print((tmp_path / "hub.log").read_text(errors="replace")[-4000:])
        raise
    finally:
        if host.poll() is None:
            kill(host)
        log.close()
        hub.stop()
    assert kills == len(kill_after)


def test_checkpoint_of_a_step_the_hub_lost_is_refused(hub, tmp_path):
    """A checkpoint at V+1 whose weights never published (the hub died
    between the host's checkpoint and the publish, and another batch was
    stepped since) is not loaded as V+1's optimizer state: the host refuses
    it by the digest of the weights it was taken with."""
    from rlhub.opthost import OptimizerHost, encode_state

    net = make_net()
    setup_model(hub.addr, "pol", net)
    with GradClient(hub.addr) as g:
        g.register("pol", optimizer={"kind": "external"})
    opt, sched = make_case("adam_onecycle", net)
    # The orphan: a checkpoint at version 2 from a step that never published.
    tensors, text = encode_state({"optimizer": opt.state_dict(), "lr_scheduler": sched.state_dict()})
    with rlhub.StoreClient(hub.addr) as s:
        s.push("pol/host-state", tensors, version=2,
               metadata={"host.state": text, "model.version": "2", "host.weights_sha256": "0" * 64})
    host = OptimizerHost(hub.addr, "pol", opt, lr_scheduler=sched, module=net).start()
    try:
        learner = make_net(seed=99)
        fill_grads(learner, seed=0)
        with GradClient(hub.addr) as g, rlhub.StoreClient(hub.addr) as s:
            g.push("pol", 1, learner)
            v = wait_published(s, 1)
        assert v.version == 2 and host.steps == 1
    finally:
        host.close()
    net2 = make_net()
    opt2, sched2 = make_case("adam_onecycle", net2)
    again = OptimizerHost(hub.addr, "pol", opt2, lr_scheduler=sched2, module=net2)
    try:
        with pytest.raises(rlhub.NotFound, match="never published"):
            again.load(2)
        again.load(1)  # the state of version 1 (none: the fresh optimizer) is fine
    finally:
        again.close()


def test_host_reattached_at_start_version_steps_once(hub):
    """A host whose stream broke during its first step (here its call is
    cancelled under it: a network blip) is re-sent that step at the
    start version, where no host state is checkpointed: it steps from the
    optimizer it was given, not from the one it already stepped (Adam's
    moments and OneCycleLR used to advance twice, and the published
    version was not one torch step from the first)."""
    ref = make_net()
    setup_model(hub.addr, "pol", ref)
    ref_opt, ref_sched = make_case("adam_onecycle", ref)

    net = make_net()
    opt, sched = make_case("adam_onecycle", net)
    fired = threading.Event()

    def post_hook(optimizer, args, kwargs):
        # Only sequences the race deterministically: while the host is in
        # its first step, the stream breaks (here: its call is cancelled;
        # equally a network blip or a hub restart).
        if not fired.is_set():
            fired.set()
            host._call.cancel()

    opt.register_step_post_hook(post_hook)
    host = rlhub.OptimizerHost(hub.addr, "pol", opt, lr_scheduler=sched, module=net, backoff=0.2).start()
    try:
        learner = make_net(seed=99)
        fill_grads(learner, seed=0)
        with GradClient(hub.addr) as g, rlhub.StoreClient(hub.addr) as s:
            assert g.register("pol", optimizer={"kind": "external"}).version == 1
            g.push("pol", 1, learner)
            v = wait_published(s, 1)
            st = g.stats()
        assert v.version == 2 and fired.is_set()
        assert (st.total.applied, st.total.steps) == (1, 1)
        for p, q in zip(ref.parameters(), learner.parameters()):
            p.grad = q.grad.clone()
        ref_opt.step()
        ref_sched.step()
        assert_close_to(v.tensors, ref)  # version 2 is one Adam step from version 1
        assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"], "scheduler stepped twice"
    finally:
        host.close()


def test_second_host_for_a_model_wins_and_the_first_stops(hub):
    """Two hosts for one model (an old host still running when a new one
    is started): the newer replaces the older, which must then stop rather
    than re-attach and replace it back. Re-attaching after every
    replacement made the two evict each other every backoff, and a step
    longer than that was re-sent to each in turn and never answered."""
    import time

    setup_model(hub.addr, "pol", make_net())

    def slow_host():
        net = make_net()
        opt, sched = make_case("adam_onecycle", net)
        opt.register_step_pre_hook(lambda *a: time.sleep(1.0))  # a step longer than the backoff
        return rlhub.OptimizerHost(hub.addr, "pol", opt, lr_scheduler=sched, module=net, backoff=0.2)

    first = slow_host().start()
    second = None
    try:
        with GradClient(hub.addr) as g, rlhub.StoreClient(hub.addr) as s:
            assert g.register("pol", optimizer={"kind": "external"}).version == 1
            assert first.attached.wait(60)
            second = slow_host().start()
            assert second.attached.wait(60)
            learner = make_net(seed=99)
            fill_grads(learner, seed=0)
            g.push("pol", 1, learner)
            got = None
            for got in s.watch("pol", after=1, framework="torch", timeout=30):
                break
            assert got is not None and got.version == 2, "the two hosts kept replacing each other"
        first._thread.join(30)
        assert not first._thread.is_alive(), "the replaced host kept re-attaching"
        assert first.error is not None and "replaced" in str(first.error)
        assert second.error is None and second.steps == 1
    finally:
        first.close()
        if second is not None:
            second.close()


def test_host_whose_state_is_lost_stops_and_says_so(hub):
    """A host welcomed at a version whose optimizer state it cannot load
    (its checkpoint belongs to a step the hub lost) cannot serve however
    often it re-attaches: run() raises NotFound saying the state is lost
    and error holds it (it re-attached every backoff for ever, pulling the
    weights each time, error None)."""
    net = make_net()
    setup_model(hub.addr, "pol", net)
    with GradClient(hub.addr) as g:
        g.register("pol", optimizer={"kind": "external"})
    opt, sched = make_case("adam_onecycle", net)
    tensors, text = encode_state({"optimizer": opt.state_dict(), "lr_scheduler": sched.state_dict()})
    with rlhub.StoreClient(hub.addr) as s:  # the orphan at version 2, then version 2 of another step
        s.push("pol/host-state", tensors, version=2,
               metadata={"host.state": text, "model.version": "2", "host.weights_sha256": "0" * 64})
    first = rlhub.OptimizerHost(hub.addr, "pol", opt, lr_scheduler=sched, module=net).start()
    try:
        learner = make_net(seed=99)
        fill_grads(learner, seed=0)
        with GradClient(hub.addr) as g, rlhub.StoreClient(hub.addr) as s:
            g.push("pol", 1, learner)
            assert wait_published(s, 1).version == 2
    finally:
        first.close()
    net2 = make_net()
    opt2, sched2 = make_case("adam_onecycle", net2)
    again = rlhub.OptimizerHost(hub.addr, "pol", opt2, lr_scheduler=sched2, module=net2, backoff=0.05).start()
    try:
        again._thread.join(30)
        assert not again._thread.is_alive(), "the host kept re-attaching to a state it cannot load"
        assert isinstance(again.error, rlhub.NotFound) and "state is lost" in str(again.error)
    finally:
        again.close()


def test_host_whose_step_failed_stops_and_says_so(hub):
    """A host whose step raises replies with the error; the hub fails the
    step and stops the model (docs/optimizer-host.md, Failures), which no
    re-attach restarts. run() raises StepFailed (an Aborted) naming the
    cause and error holds it. Before, the host re-attached, was welcomed
    and waited for ever for a step that never came, error None, attached
    set, while every push to the model was refused."""
    import time

    def boom(*_):
        raise RuntimeError("the optimizer broke")

    with _host_ended_by_its_step(hub, lambda opt, _net: opt.register_step_pre_hook(boom)) as (h, g, learner):
        from rlhub.opthost import StepFailed
        assert isinstance(h.error, StepFailed) and isinstance(h.error, rlhub.Aborted), h.error
        assert "the optimizer broke" in str(h.error), h.error
        assert h.steps == 0
        # The hub took the error as the step's, not as a host lost
        # mid-step (whose step would wait for the next host): the
        # gradient is dropped and the model stopped, with the host's
        # reason.
        end = time.monotonic() + 30
        while g.stats().total.dropped.get("publish_failed", 0) != 1:
            assert time.monotonic() < end, f"the failed step was not counted: {g.stats().total}"
            time.sleep(0.05)
        with GradClient(hub.addr, max_attempts=1) as g1:  # the refusal, not a retry's
            fill_grads(learner, seed=1)
            with pytest.raises(rlhub.Unavailable, match="the optimizer broke"):
                g1.push("pol", 1, learner)


def test_host_of_a_model_the_hub_stopped_is_told(hub):
    """A host whose step succeeds but leaves a NaN in the weights: the hub
    refuses them, fails the step and stops the model. Before, the host was
    told nothing and waited for ever (attached, error None). The hub now
    ends its stream Aborted naming the model's failure, and the host stops
    (it does not re-attach on Aborted) with that error."""
    def poison(opt, net):
        def nan(*_):
            with torch.no_grad():
                next(net.parameters()).view(-1)[0] = float("nan")

        opt.register_step_post_hook(nan)

    with _host_ended_by_its_step(hub, poison) as (h, _, _):
        assert isinstance(h.error, rlhub.Aborted), h.error
        assert "stopped taking gradients" in str(h.error) and "NaN" in str(h.error), h.error


@contextlib.contextmanager
def _host_ended_by_its_step(hub, hook):
    """An SGD host of the external model "pol", its optimizer given hook(opt,
    net), and one gradient pushed: yields the host, once its thread has
    ended (it must not re-attach to the model its step stopped), the grad
    client and the learner net."""
    net = make_net()
    setup_model(hub.addr, "pol", net)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    hook(opt, net)
    h = rlhub.OptimizerHost(hub.addr, "pol", opt, module=net, backoff=0.05).start()
    try:
        with GradClient(hub.addr) as g:
            assert g.register("pol", optimizer={"kind": "external"}).version == 1
            assert h.attached.wait(60)
            learner = make_net(seed=99)
            fill_grads(learner, seed=0)
            g.push("pol", 1, learner)
            h._thread.join(30)
            assert not h._thread.is_alive(), "the host re-attached to, or still waits on, a model the hub stopped"
            yield h, g, learner
    finally:
        h.close()


def test_host_state_of_a_deleted_model_goes_with_it(hub):
    """An external model deleted by an administrator (`rlhub model rm`)
    and pushed again is a new model: its hosts start afresh and resume
    from their own checkpoints. The deleted model's host state
    (pol/host-state) used to survive the delete: the new model's first
    host, finding only newer states, started fresh, but its checkpoints
    at the old versions were refused as stale, so the next host,
    welcomed at version 2, found the deleted model's state there and
    stopped ("the optimizer state is lost"). It now goes with its
    model."""
    import time

    def host() -> rlhub.OptimizerHost:
        net = make_net()
        opt, sched = make_case("adam_onecycle", net)
        return rlhub.OptimizerHost(hub.addr, "pol", opt, lr_scheduler=sched, module=net, backoff=0.05).start()

    learner = make_net(seed=99)
    setup_model(hub.addr, "pol", make_net())
    with GradClient(hub.addr) as g, rlhub.StoreClient(hub.addr) as s:  # the first model: states at 2, 3, 4
        g.register("pol", optimizer={"kind": "external"})
        h = host()
        try:
            for v in (1, 2, 3):
                fill_grads(learner, seed=v)
                g.push("pol", v, learner)
                assert wait_published(s, v).version == v + 1
        finally:
            h.close()
    hub.run_cli("model", "rm", "--hub", hub.addr, "--name", "pol")

    ref = make_net(seed=7)  # the new model: other weights, stepped by torch alongside
    setup_model(hub.addr, "pol", ref)
    ref_opt, ref_sched = make_case("adam_onecycle", ref)
    with GradClient(hub.addr) as g, rlhub.StoreClient(hub.addr) as s:
        assert g.register("pol", optimizer={"kind": "external"}).version == 1
        for v in (1, 2):
            # A new host for each step: the second loads the state the
            # first checkpointed at version 2.
            h = host()
            try:
                deadline = time.monotonic() + 120
                while not h.attached.is_set() and h._thread.is_alive() and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert h.attached.is_set(), f"the new model's host at version {v} did not attach: {h.error!r}"
                fill_grads(learner, seed=10 + v)
                g.push("pol", v, learner)
                got = wait_published(s, v)
                assert got.version == v + 1 and h.error is None
            finally:
                h.close()
            for p, q in zip(ref.parameters(), learner.parameters()):
                p.grad = q.grad.clone()
            ref_opt.step()
            ref_sched.step()
            assert_close_to(got.tensors, ref)
