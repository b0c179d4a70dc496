"""Bring your own optimizer: an optimizer host for the hub's reducer.

A model registered with optimizer kind ``"external"`` is reduced by the hub
as any other -- secondaries admit and batch the gradients, the primary
applies the exactly-once ledger, reduces, clips, counts and publishes every
version -- but each step is performed here, by any ``torch.optim`` optimizer
and any ``torch.optim.lr_scheduler`` (Machin's PushPullGradServer primary):

    net = make_net()                                  # same weights as the store's
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=1000)
    GradClient(hub).register("policy", optimizer={"kind": "external"})
    with rlhub.OptimizerHost(hub, "policy", opt, lr_scheduler=sched, module=net):
        ...                                           # learners push gradients as usual

Contract (docs/optimizer-host.md):
1. The host attaches to the primary's hub and is welcomed with the model's
   newest version V. It loads the weights of V from the store into
   ``module`` and its own checkpointed optimizer and scheduler state of V
   (or keeps the fresh ones it was given when no host state exists yet).
2. For each reduced batch the primary sends (gradient, V): the host sets
   every parameter's ``.grad``, calls ``optimizer.step()`` then
   ``lr_scheduler.step()``, checkpoints ``optimizer.state_dict()`` and
   ``lr_scheduler.state_dict()`` to the store as model
   ``"<model>/host-state"`` at version V+1 (tensors in safetensors, the rest
   as JSON in its metadata: no pickle; naming the model's life the step
   was of, so that the hub refuses it once the model is deleted), and
   replies with the new weights (``module.state_dict()``), which the
   primary publishes as V+1.
3. A host killed at any point loses nothing: the primary re-sends the step
   in flight to the next host, which resumes from the state of V.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from typing import Any, Dict, Iterator, Optional, Tuple

import grpc

from rlhub import _channel, errors
from rlhub._attach import AttachLoop, outbox
from rlhub._proto.rlhub.v1 import opthost_pb2, opthost_pb2_grpc, tensor_pb2
from rlhub._transfer import DEFAULT_CHUNK_BYTES, Assembler, iter_chunks
from rlhub.store import StoreClient
from rlhub.tensors import load_bytes, save_bytes

log = logging.getLogger("rlhub.opthost")

HOST_STATE_SUFFIX = "/host-state"

_MAX_CAUSE = 1024  # characters of a failed step's error sent to the hub and kept in StepFailed

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.max_send_message_length", 8 << 20),
]


class StateLost(errors.NotFound):
    """The host state of the version the host is welcomed at cannot be
    loaded (missing, or of a step the hub lost): re-attaching cannot bring
    it back, so the host stops (``run()`` raises it) rather than restart
    the optimizer or re-attach for ever."""


class StepFailed(errors.Aborted):
    """A step this host failed (its optimizer, scheduler or checkpoint
    raised; the cause is chained): it replied with the error, and the hub
    failed the step and stopped the model, which takes no more gradients
    until the hub restarts. Re-attaching would be welcomed and never sent a
    step, so the host stops (``run()`` raises it, ``error`` holds it)."""


def encode_state(obj: Any) -> Tuple[Dict[str, Any], str]:
    """Splits a (nested) state dict into its tensors and a JSON string for
    the rest; ``decode_state`` inverts it. Dict keys keep their type (torch's
    optimizer state is keyed by int), tuples stay tuples."""
    tensors: Dict[str, Any] = {}

    def enc(v: Any) -> Any:
        import torch

        if isinstance(v, torch.Tensor):
            name = f"t{len(tensors)}"
            tensors[name] = v.detach().cpu().contiguous()
            return {"__tensor__": name}
        if isinstance(v, dict):
            return {"__dict__": [[enc(k), enc(x)] for k, x in v.items()]}
        if isinstance(v, tuple):
            return {"__tuple__": [enc(x) for x in v]}
        if isinstance(v, list):
            return [enc(x) for x in v]
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        raise TypeError(f"cannot checkpoint a {type(v).__name__} in an optimizer or scheduler state")

    return tensors, json.dumps(enc(obj))


def weights_digest(tensors: Dict[str, Any]) -> str:
    """SHA-256 over a state dict's names, dtypes, shapes and bytes (sorted
    by name): recorded with a checkpoint, it names the weights the step
    produced, so a checkpoint of a step that never published is told apart."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = torch.as_tensor(tensors[name]).detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def decode_state(tensors: Dict[str, Any], text: str) -> Any:
    def dec(v: Any) -> Any:
        if isinstance(v, dict):
            if "__tensor__" in v:
                return tensors[v["__tensor__"]].clone()
            if "__dict__" in v:
                return {dec(k): dec(x) for k, x in v["__dict__"]}
            if "__tuple__" in v:
                return tuple(dec(x) for x in v["__tuple__"])
        if isinstance(v, list):
            return [dec(x) for x in v]
        return v

    return dec(json.loads(text))


def _cpu_copy(obj: Any) -> Any:
    """A deep copy of a state dict with every tensor copied to the CPU."""
    import torch

    def cp(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            return o.detach().to("cpu", copy=True)
        if isinstance(o, dict):
            return {k: cp(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return type(o)(cp(v) for v in o)
        return copy.deepcopy(o)

    return cp(obj)


class OptimizerHost(AttachLoop):
    """Performs the reducer's steps for one ``"external"`` model.

    ``module`` is the torch module whose ``state_dict()`` is exactly the
    store model's tensors and whose parameters ``optimizer`` updates.
    ``run()`` serves on the calling thread until ``stop()``; ``start()`` (or
    ``with``) on a background thread. After any break it re-attaches after
    ``backoff`` seconds, except a permanent refusal (a model not registered
    as external, missing credentials), a newer host for the model
    replacing this one (``Aborted``) or a step of its own that raised
    (``StepFailed``: the hub stopped the model), which ``run()`` raises and
    ``error`` holds. ``steps`` counts the steps this object performed.
    """

    def __init__(self, hub_addr: str, model: str, optimizer: Any, lr_scheduler: Any = None, *, module: Any,
                 backoff: float = 0.2, timeout: float = 60.0, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        if module is None:
            raise ValueError("module is required: the torch module the optimizer's parameters belong to")
        self.hub_addr, self.model = hub_addr, model
        self.optimizer, self.lr_scheduler, self.module = optimizer, lr_scheduler, module
        self.backoff, self.timeout, self.chunk_bytes = backoff, timeout, chunk_bytes
        self.state_model = model + HOST_STATE_SUFFIX
        # The optimizer and scheduler as given: what load() returns to at a
        # version with no checkpoint (the start), also after this object
        # has stepped from it once already (a re-attach re-sends that step).
        # Kept on the CPU: load_state_dict moves the state to each
        # parameter's device.
        self._given = _cpu_copy({"optimizer": optimizer.state_dict(),
                                 "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None})
        self.version = 0  # the version module holds
        self.steps = 0
        self.attached = threading.Event()
        self._init_loop(f"optimizer host {model}", f"rlhub-opthost-{model}", log, backoff)
        self._channel = _channel.channel(hub_addr, options=_CHANNEL_OPTIONS)  # TLS and token as configured
        self._stub = opthost_pb2_grpc.OptimizerHostStub(self._channel)
        self._store = StoreClient(hub_addr, timeout=timeout)

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        self.stop()
        self._store.close()
        self._channel.close()

    def _permanent(self, e: BaseException) -> bool:
        # Aborted: a newer host for the model replaced this one. It wins;
        # re-attaching would replace it back, and the two would evict each
        # other every backoff, re-sending the step in flight to each.
        # StateLost: no re-attach brings the optimizer state back.
        # StepFailed (an Aborted): the hub stopped the model, which re-attaching
        # cannot restart.
        return errors.is_permanent(e) or isinstance(e, (errors.Aborted, StateLost))

    # -- state -------------------------------------------------------------

    def load(self, version: int) -> None:
        """Loads the weights of ``version`` into the module and the host
        state checkpointed at it (none yet: the optimizer and scheduler stay
        as given)."""
        import torch

        v = self._store.pull(self.model, version=version, framework="torch")
        if v is None:
            raise errors.NotFound(f"model {self.model!r} version {version}")
        with torch.no_grad():
            own = self.module.state_dict()
            if set(own) != set(v.tensors):
                # A retry cannot change it: InvalidArgument is permanent, so the
                # host stops and says why instead of re-attaching for ever.
                raise errors.InvalidArgument(
                    f"module tensors {sorted(own)[:8]} differ from the model's {sorted(v.tensors)[:8]}")
            for name, t in own.items():
                t.copy_(v.tensors[name])
        try:
            st = self._store.pull(self.state_model, version=version, framework="torch")
        except errors.NotFound:
            st = None
        want = st.metadata.get("host.weights_sha256") if st is not None else None
        if want is not None and want != weights_digest(v.tensors):
            # Checkpointed by a step whose version never published (the hub
            # died between the checkpoint and the publish, and a different
            # batch was stepped since): not the state of these weights.
            raise StateLost(f"host state of {self.model!r} at version {version} belongs to weights that were "
                            "never published (a hub restart lost that step): the optimizer state is lost")
        state = None
        if st is not None:
            state = decode_state(st.tensors, st.metadata["host.state"])
            log.info("optimizer host %s: resumed at version %d", self.model, version)
        else:
            newest = None
            try:
                newest = self._store.pull(self.state_model)
            except errors.NotFound:
                pass
            if newest is not None and newest.version < version:
                raise StateLost(f"host state of {self.model!r} at version {version} is missing "
                                f"(newest is {newest.version}): the optimizer state is lost")
            state = _cpu_copy(self._given)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.version = version

    def _checkpoint(self, version: int, weights: Dict[str, Any], life: int) -> None:
        state = {"optimizer": self.optimizer.state_dict(),
                 "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None}
        tensors, text = encode_state(state)
        digest = weights_digest(weights)
        try:
            # life, the step's: the hub refuses (StaleVersion) the
            # checkpoint of a step of the model deleted since, which the
            # model pushed again would find at its versions.
            self._store.push(self.state_model, tensors, version=version, life=life,
                             metadata={"host.state": text, "model.version": str(version),
                                       "host.weights_sha256": digest})
        except errors.StaleVersion as e:
            # Refused because the model was deleted mid-step (the hub names
            # no version it holds): nothing was written, and the hub ended
            # this host's stream ABORTED, on which it stops after replying.
            if e.current_version is None or e.current_version < version:
                log.info("optimizer host %s: the checkpoint at version %d is refused: %s", self.model, version, e)
                return
            # A predecessor killed after checkpointing this very step (the
            # same state from the same gradient) before it replied. If it
            # is another step's (the hub lost that batch), the checkpoint
            # cannot be replaced; load refuses it by its weights digest.
            try:
                old = self._store.pull(self.state_model, version=version)
            except errors.NotFound:
                old = None
            if old is not None and old.metadata.get("host.weights_sha256", digest) != digest:
                log.error("optimizer host %s: the checkpoint at version %d is of a step the hub lost; it cannot be "
                          "replaced, so a host restarted at version %d will refuse it", self.model, version, version)

    def _step(self, version: int, grad: Dict[str, Any], life: int) -> bytes:
        if version != self.version:
            self.load(version)  # another host stepped in between
        for name, p in self.module.named_parameters():
            g = grad.get(name)
            if g is None:
                raise ValueError(f"gradient lacks parameter {name!r}")
            p.grad = g.to(device=p.device, dtype=p.dtype).clone()
        self.optimizer.step()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        weights = {k: v.detach().cpu() for k, v in self.module.state_dict().items()}
        self._checkpoint(version + 1, weights, life)
        self.version = version + 1
        self.steps += 1
        return save_bytes(weights)

    # -- one session -------------------------------------------------------

    def _session(self) -> None:
        out, requests = outbox(opthost_pb2.HostMessage(hello=opthost_pb2.HostHello(model=self.model)))

        call = self._stub.Attach(requests, wait_for_ready=True)
        with self._mu:
            self._call = call
        try:
            it = iter(call)
            first = self._recv(it)
            if first is None or not first.HasField("welcome"):
                raise errors.InvalidArgument("first primary message is not a Welcome")
            self.load(first.welcome.version)
            self.attached.set()
            log.info("optimizer host %s: attached at version %d", self.model, self.version)
            while not self._stop.is_set():
                m = self._recv(it)
                if m is None:
                    raise errors.Unavailable("primary ended the stream")
                if not m.HasField("step"):
                    raise errors.InvalidArgument(f"unexpected primary message {m.WhichOneof('body')!r}")
                st = m.step
                asm = Assembler(st.grad.total_bytes)
                got = 0
                while got < st.grad.total_bytes:
                    c = self._recv(it)
                    if c is None or not c.HasField("chunk"):
                        raise errors.InvalidArgument(f"step gradient ended after {got} of {st.grad.total_bytes} bytes")
                    asm.write(c.chunk.data)
                    got += len(c.chunk.data)
                res = opthost_pb2.HostResult(step_id=st.step_id)
                try:
                    blob = self._step(st.version, load_bytes(asm.finish(), framework="torch"), st.grad.life)
                except Exception as e:  # noqa: BLE001 - the step fails, the primary says so
                    why = f"{type(e).__name__}: {e}"
                    if len(why) > _MAX_CAUSE:  # the hub keeps 1 KiB; a longer one could pass its message bound
                        why = why[:_MAX_CAUSE] + f"…({len(why)} characters)"
                    res.error = why
                    out.put(opthost_pb2.HostMessage(result=res))
                    # Half-close and wait for the hub to end the stream, so
                    # the error is delivered before the call is cancelled
                    # (a cancel overtaking it would read as a host lost
                    # mid-step, the step re-sent to the next host).
                    out.put(None)
                    self._drain(call, it)
                    raise StepFailed(f"optimizer host {self.model!r}: the step from version {st.version} failed "
                                     f"({why}); the hub stops the model until it restarts") from e
                res.params.CopyFrom(tensor_pb2.BlobInfo(model=self.model, version=st.version + 1,
                                                        total_bytes=len(blob), chunk_bytes=self.chunk_bytes))
                out.put(opthost_pb2.HostMessage(result=res))
                for piece in iter_chunks(blob, self.chunk_bytes):
                    out.put(opthost_pb2.HostMessage(chunk=tensor_pb2.Chunk(data=piece)))
        finally:
            self.attached.clear()
            out.put(None)
            call.cancel()
            with self._mu:
                self._call = None

    def _drain(self, call: Any, it: Iterator[opthost_pb2.PrimaryMessage]) -> None:
        """Reads ``it`` until the hub ends the stream, or cancels ``call``
        after ``timeout`` seconds."""
        guard = threading.Timer(self.timeout, call.cancel)
        guard.daemon = True
        guard.start()
        try:
            for _ in it:
                pass
        except grpc.RpcError:
            pass  # the hub ended the stream (with its status) or the guard cancelled it
        finally:
            guard.cancel()

    @staticmethod
    def _recv(it: Iterator[opthost_pb2.PrimaryMessage]) -> Optional[opthost_pb2.PrimaryMessage]:
        try:
            return next(it)
        except StopIteration:
            return None
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
