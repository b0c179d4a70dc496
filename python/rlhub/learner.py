"""Python learners for the hub's learner aggregator (see docs/aggregator.md).

A learner attaches to the hub with one long-lived stream, holds its lease
with heartbeats and answers the coordinator's tasks. Override the hooks, or
pass callables:

    class MyLearner(rlhub.Learner):
        def on_start(self, task_id, info): self.lr = info["lr"]
        def on_demand(self, task_id): return rlhub.Demand(64, {"obs_dim": 4})
        def on_learn(self, task):            # task.batch: this learner's rows
            loss = train_on(task.batch)
            return {"loss": loss, "rows": task.rows}

    with MyLearner("127.0.0.1:7470", "l1", framework="torch"):
        ...                                  # served on a background thread

or ``MyLearner(...).run()`` to serve on the calling thread until ``stop()``.

Contract:
1. Hooks run one at a time on the serving thread. ``on_demand`` returns a
   ``Demand``, an int (rows) or ``(rows, fields)``; ``on_learn`` returns
   info: None, bool, int, float, str, lists/tuples and str-keyed dicts of
   these (numpy/torch scalars and arrays are converted to numbers and
   lists); integers reach the coordinator as integers. A hook that raises refuses
   or fails that task only (the learner stays attached; the error text
   travels to the coordinator). So does a reply over ``max_reply_bytes``
   (the hub's message bound, 4 MiB), which the hub would refuse.
2. Heartbeats go out every third of the lease from a thread owned by the
   session; it is stopped and joined when the session ends, so a hook may
   take longer than the lease.
3. Any break of the stream (hub restart, drain, protocol error) ends the
   session; ``run`` re-attaches after ``backoff`` seconds until ``stop()``.
   A permanent refusal (a learner id or request the hub refuses, missing
   or insufficient credentials: :func:`rlhub.errors.is_permanent`) is not
   retried: ``run`` raises it and ``error`` holds it (rlhub._attach).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple, Union

import grpc
from google.protobuf import json_format, struct_pb2

from rlhub import _channel, errors
from rlhub._attach import AttachLoop, outbox
from rlhub._proto.rlhub.v1 import aggregator_pb2, aggregator_pb2_grpc
from rlhub._transfer import Assembler
from rlhub.tensors import load_bytes, parse_header

log = logging.getLogger("rlhub.learner")

_MAX_SEND_BYTES = 8 << 20
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.max_send_message_length", _MAX_SEND_BYTES),
    # Re-attach soon after a hub restart: reconnect from 50ms backing off to
    # 1s (gRPC's defaults, 1s to 120s, leave the learner detached long after).
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.min_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


@dataclasses.dataclass
class Demand:
    """Rows of batch wanted per Learn, and other fields every learner of a
    task must report equally."""

    batch_size: int
    fields: Dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class LearnTask:
    """One learner's share of a batch: rows ``[row_start, row_start + rows)``."""

    task_id: str
    row_start: int
    rows: int
    batch: Dict[str, Any]
    """The share's tensors: numpy arrays (read-only views) or torch tensors."""
    metadata: Dict[str, str]
    """The batch's safetensors metadata (the same on every share)."""


def to_struct_value(v: Any) -> Any:
    """Converts numpy/torch scalars and arrays (recursively) to plain Python."""
    if isinstance(v, Mapping):
        return {str(k): to_struct_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [to_struct_value(x) for x in v]
    if isinstance(v, (str, bool, int, float)) or v is None:
        return v
    if hasattr(v, "tolist"):  # numpy arrays and scalars, torch tensors
        if hasattr(v, "detach"):
            v = v.detach().cpu()
        return v.tolist()
    raise TypeError(f"cannot put a {type(v).__name__} into info")


def to_struct(d: Optional[Mapping[str, Any]]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    if d:
        s.update(to_struct_value(d))
    return s


def from_struct(s: struct_pb2.Struct) -> Dict[str, Any]:
    return json_format.MessageToDict(s)


_INT64 = (-(1 << 63), (1 << 63) - 1)


def to_value(v: Any, _depth: int = 0) -> aggregator_pb2.Value:
    """Converts info to the wire's ``Value`` (integers stay integers)."""
    if _depth > 64:
        raise TypeError("info nested deeper than 64")
    out = aggregator_pb2.Value()
    if v is None:
        out.null_value = True
    elif isinstance(v, bool):
        out.bool_value = v
    elif isinstance(v, int):
        if not _INT64[0] <= v <= _INT64[1]:
            raise TypeError(f"integer {v} does not fit in int64")
        out.int_value = v
    elif isinstance(v, float):
        out.float_value = v
    elif isinstance(v, str):
        out.string_value = v
    elif isinstance(v, Mapping):
        out.map_value.SetInParent()
        for k, x in v.items():
            if not isinstance(k, str):
                raise TypeError(f"info dict key {k!r} is a {type(k).__name__}, not a str")
            out.map_value.fields[k].CopyFrom(to_value(x, _depth + 1))
    elif isinstance(v, (list, tuple)):
        out.list_value.SetInParent()
        out.list_value.values.extend(to_value(x, _depth + 1) for x in v)
    elif hasattr(v, "tolist"):  # numpy arrays and scalars, torch tensors
        if hasattr(v, "detach"):
            v = v.detach().cpu()
        return to_value(v.tolist(), _depth)
    else:
        raise TypeError(f"cannot put a {type(v).__name__} into info")
    return out


def from_value(v: aggregator_pb2.Value) -> Any:
    """Converts a wire ``Value`` back to None/bool/int/float/str/list/dict."""
    kind = v.WhichOneof("kind")
    if kind == "int_value":
        return v.int_value
    if kind == "float_value":
        return v.float_value
    if kind == "string_value":
        return v.string_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "list_value":
        return [from_value(x) for x in v.list_value.values]
    if kind == "map_value":
        return {k: from_value(x) for k, x in v.map_value.fields.items()}
    return None


DemandLike = Union[Demand, int, Tuple[int, Mapping[str, Any]]]


class Learner(AttachLoop):
    """A learner served from Python. Thread-safe ``start``/``stop``/``close``.

    ``framework`` ("numpy" or "torch") decides how shares are decoded.
    Hooks may be overridden in a subclass or given as callables (which take
    precedence). ``resources`` are declared to the aggregator as is.
    """

    def __init__(self, hub_addr: str, learner_id: str, *, resources: Optional[Mapping[str, str]] = None,
                 on_start: Optional[Callable[[str, Dict[str, Any]], None]] = None,
                 on_demand: Optional[Callable[[str], DemandLike]] = None,
                 on_learn: Optional[Callable[[LearnTask], Mapping[str, Any]]] = None,
                 framework: str = "numpy", backoff: float = 0.2, welcome_timeout: float = 30.0,
                 max_share_bytes: int = 2 << 30, max_reply_bytes: int = 4 << 20):
        if not learner_id or " " in learner_id or len(learner_id) > 128:
            raise ValueError(f"learner id {learner_id!r}: non-empty, no spaces, at most 128 bytes")
        if framework not in ("numpy", "torch"):
            raise ValueError(f"framework {framework!r}: want numpy or torch")
        if not 0 < max_reply_bytes <= _MAX_SEND_BYTES:
            raise ValueError(f"max_reply_bytes {max_reply_bytes}: want 1 to {_MAX_SEND_BYTES}")
        self.hub_addr = hub_addr
        self.learner_id = learner_id
        self.resources = dict(resources or {})
        self.framework = framework
        self.backoff = backoff
        self.welcome_timeout = welcome_timeout
        self.max_share_bytes = max_share_bytes
        self.max_reply_bytes = max_reply_bytes
        """The hub's message bound (``rlhub serve``: 4 MiB): a reply over it
        fails its task instead of being sent (see ``_bounded``)."""
        if on_start is not None:
            self.on_start = on_start  # type: ignore[method-assign, assignment]  # a per-instance callback
        if on_demand is not None:
            self.on_demand = on_demand  # type: ignore[method-assign, assignment]
        if on_learn is not None:
            self.on_learn = on_learn  # type: ignore[method-assign, assignment]
        self.attached = threading.Event()
        """Set while a session is attached (after the Welcome)."""
        self.sessions = 0
        """Sessions attached so far (re-attaches included)."""
        self.lease_ms = 0
        self._init_loop(f"learner {learner_id}", f"rlhub-learner-{learner_id}", log, backoff)
        self._channel = _channel.channel(hub_addr, options=_CHANNEL_OPTIONS)
        self._stub = aggregator_pb2_grpc.LearnerAggregatorStub(self._channel)

    # -- hooks -------------------------------------------------------------

    def on_start(self, task_id: str, info: Dict[str, Any]) -> None:
        """Prepares for a task; raising refuses it. The default accepts."""

    def on_demand(self, task_id: str) -> DemandLike:
        """Returns this learner's demand for the task."""
        raise NotImplementedError("override on_demand or pass on_demand=")

    def on_learn(self, task: LearnTask) -> Mapping[str, Any]:
        """Learns on one share and returns its info."""
        raise NotImplementedError("override on_learn or pass on_learn=")

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Stops and closes the channel. Safe to call twice."""
        self.stop()
        self._channel.close()

    # -- one session -------------------------------------------------------

    def _session(self) -> None:
        out, requests = outbox(aggregator_pb2.LearnerMessage(
            hello=aggregator_pb2.Hello(learner_id=self.learner_id, resources=self.resources)))

        call = self._stub.Attach(requests, wait_for_ready=True)
        with self._mu:
            self._call = call
        done = threading.Event()
        beat: Optional[threading.Thread] = None
        # A hub that accepts the stream but never welcomes must not hold us.
        no_welcome = threading.Timer(self.welcome_timeout, call.cancel)
        no_welcome.daemon = True
        no_welcome.start()
        try:
            if self._stop.is_set():
                return
            it = iter(call)
            first = self._recv(it)
            no_welcome.cancel()
            if first is None or not first.HasField("welcome") or first.welcome.lease_ms == 0:
                raise errors.Unavailable(f"{_HUB_PROTOCOL}: first aggregator message is not a Welcome")
            self.lease_ms = first.welcome.lease_ms
            self.sessions += 1
            self.attached.set()
            log.info("learner %s: attached, lease %dms", self.learner_id, self.lease_ms)

            def heartbeats() -> None:
                period = max(self.lease_ms / 3000.0, 0.001)
                while not done.wait(period):
                    out.put(aggregator_pb2.LearnerMessage(heartbeat=aggregator_pb2.Heartbeat()))

            beat = threading.Thread(target=heartbeats, name=f"rlhub-heartbeat-{self.learner_id}", daemon=True)
            beat.start()
            while True:
                m = self._recv(it)
                if m is None:
                    raise errors.Unavailable("aggregator ended the stream")
                out.put(self._bounded(self._serve(m, it)))
        finally:
            no_welcome.cancel()
            self.attached.clear()
            done.set()
            if beat is not None:
                beat.join()
            out.put(None)
            call.cancel()
            with self._mu:
                self._call = None

    def _bounded(self, reply: aggregator_pb2.LearnerReply) -> aggregator_pb2.LearnerMessage:
        """Wraps a reply, or an error in its place if it is over
        max_reply_bytes: the hub refuses a message over its bound by ending
        the stream, which would fail the task as a lost learner and detach
        it; this fails that task only, as a hook's error does."""
        m = aggregator_pb2.LearnerMessage(reply=reply)
        n = m.ByteSize()
        if n <= self.max_reply_bytes:
            return m
        return aggregator_pb2.LearnerMessage(reply=aggregator_pb2.LearnerReply(
            request_id=reply.request_id,
            error=f"reply of {n} bytes exceeds the hub's message bound of {self.max_reply_bytes} bytes"))

    @staticmethod
    def _recv(it: Iterator[aggregator_pb2.AggregatorMessage]) -> Optional[aggregator_pb2.AggregatorMessage]:
        try:
            return next(it, None)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    def _serve(self, m: aggregator_pb2.AggregatorMessage,
               it: Iterator[aggregator_pb2.AggregatorMessage]) -> aggregator_pb2.LearnerReply:
        kind = m.WhichOneof("body")
        if kind == "start":
            reply = aggregator_pb2.LearnerReply(request_id=m.start.request_id)
            try:
                self.on_start(m.start.task_id, from_struct(m.start.task_info))
            except Exception as e:  # noqa: BLE001 - refused: the error travels
                reply.error = f"{type(e).__name__}: {e}"
            return reply
        if kind == "demand":
            reply = aggregator_pb2.LearnerReply(request_id=m.demand.request_id)
            try:
                d = _as_demand(self.on_demand(m.demand.task_id))
                reply.demand.CopyFrom(aggregator_pb2.Demand(batch_size=d.batch_size, fields=to_struct(d.fields)))
            except Exception as e:  # noqa: BLE001
                reply.error = f"{type(e).__name__}: {e}"
            return reply
        if kind == "learn":
            lt = m.learn
            total = lt.blob.total_bytes
            reply = aggregator_pb2.LearnerReply(request_id=lt.request_id)
            # A share over max_share_bytes fails that share only, as a
            # hook's error does: its chunks are read past, not kept, so the
            # stream stays in step and the learner attached.
            asm = Assembler(total, max_bytes=self.max_share_bytes) if total <= self.max_share_bytes else None
            got = 0
            while got < total:  # protocol errors raise: the stream is out of step
                c = self._recv(it)
                if c is None or not c.HasField("chunk"):
                    raise errors.Unavailable(f"{_HUB_PROTOCOL}: learn share ended after {got} of {total} bytes")
                if asm is not None:
                    asm.write(c.chunk.data)
                elif got + len(c.chunk.data) > total:
                    raise errors.Unavailable(f"{_HUB_PROTOCOL}: chunks overrun the announced {total} bytes")
                got += len(c.chunk.data)
            if asm is None:
                reply.error = (f"share of {total} bytes exceeds this learner's "
                               f"max_share_bytes of {self.max_share_bytes}")
                return reply
            blob = asm.finish()
            try:
                _, _, md = parse_header(memoryview(blob))
                task = LearnTask(lt.task_id, lt.row_start, lt.rows, load_bytes(blob, framework=self.framework),
                                 dict(md))
                reply.info.CopyFrom(to_value(self.on_learn(task)))
            except Exception as e:  # noqa: BLE001
                reply.error = f"{type(e).__name__}: {e}"
            return reply
        raise errors.Unavailable(f"{_HUB_PROTOCOL}: unexpected aggregator message {kind!r}")


# A message from the hub the learner does not expect or understand (a newer
# hub's, during a rolling upgrade, or a hub's bug) is not a refusal: it is
# raised as Unavailable, so the learner re-attaches after its backoff
# instead of giving up as on a permanent error.
_HUB_PROTOCOL = "the hub's message breaks the learner protocol"


def _as_demand(d: DemandLike) -> Demand:
    if isinstance(d, Demand):
        return d
    if isinstance(d, int):
        return Demand(d)
    if isinstance(d, tuple) and len(d) == 2:
        return Demand(int(d[0]), dict(d[1]))
    raise TypeError(f"on_demand returned {type(d).__name__}; want Demand, int or (rows, fields)")
