"""The coordinator's client for the hub's learner aggregator (docs/aggregator.md).

    with rlhub.AggregatorClient("127.0.0.1:7470") as agg:
        task = agg.start(info={"lr": 1e-3}).task_id
        demand = agg.get_data_demand(task)          # merged: batch sizes add up
        res = agg.learn(task, {"obs": obs, "act": act}, metadata={"step": "7"})
        res.info["loss"]                            # one entry per learner, row order
        agg.resource()                              # DI-engine's resource task: {"gpu": world_size}

Infos merge by DI-engine's ``merge_info`` rule unless the hub (``rlhub serve
--aggregator-merge``) or the task (``start(merge="strict",
homogeneous_keys=[...])``) says otherwise; integers stay integers.

Errors are rlhub's named exceptions (``Unavailable`` "no learners attached",
``FailedPrecondition`` as ``StaleVersion`` for a wrong task,
``InvalidArgument`` for ragged batches or malformed info...).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

import grpc

from rlhub import _channel, errors
from rlhub._proto.rlhub.v1 import aggregator_pb2, aggregator_pb2_grpc, tensor_pb2
from rlhub._transfer import DEFAULT_CHUNK_BYTES, iter_chunks
from rlhub.learner import Demand, from_struct, from_value, to_struct
from rlhub.tensors import save_bytes

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.max_send_message_length", 8 << 20),
]


@dataclasses.dataclass(frozen=True)
class Started:
    task_id: str
    learners: List[str]


@dataclasses.dataclass(frozen=True)
class MergedDemand:
    demand: Demand
    learners: List[str]
    """Learner order recorded with the task."""
    batch_sizes: List[int]


@dataclasses.dataclass(frozen=True)
class Share:
    learner_id: str
    row_start: int
    rows: int


@dataclasses.dataclass(frozen=True)
class Learned:
    info: Any
    """Merged info, in row order, by the task's rule (docs/aggregator.md):
    by default DI-engine's -- scalars become the list of the learners'
    values, lists concatenate, dicts merge key by key and homogeneous keys
    (learner_step, buffer_id, task_id, learner_done) take the first
    learner's value."""
    shares: List[Share]
    failed: List[str]


class AggregatorClient:
    """Coordinator-side client. Thread-safe; close it (or use ``with``)."""

    def __init__(self, addr: str, *, timeout: float = 120.0, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        self._channel = _channel.channel(addr, options=_CHANNEL_OPTIONS)
        self._stub = aggregator_pb2_grpc.LearnerAggregatorStub(self._channel)
        self.timeout = timeout
        self.chunk_bytes = chunk_bytes

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "AggregatorClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Callable[..., Any], req: Any) -> Any:
        """``fn(req)`` (a generated stub method, untyped) with the named errors."""
        try:
            return fn(req, timeout=self.timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None

    def resources(self) -> List[aggregator_pb2.LearnerInfo]:
        return list(self._call(self._stub.Resources, aggregator_pb2.ResourcesRequest()).learners)

    def resource(self) -> Dict[str, int]:
        """DI-engine's resource task: ``{"gpu": world_size}``, world_size
        being the number of attached learners."""
        r = self._call(self._stub.Resources, aggregator_pb2.ResourcesRequest())
        return {"gpu": int(r.world_size)}

    def status(self) -> aggregator_pb2.StatusResponse:
        st: aggregator_pb2.StatusResponse = self._call(self._stub.Status, aggregator_pb2.StatusRequest())
        return st

    def start(self, task_id: str = "", info: Optional[Mapping[str, Any]] = None, *,
              merge: str = "", homogeneous_keys: Optional[List[str]] = None) -> Started:
        """Starts a task on every attached learner ("" lets the hub name it).

        ``merge`` ("di-engine" or "strict"; "" the hub's) and
        ``homogeneous_keys`` (None: the hub's; [] none) choose how this
        task's infos merge."""
        mo = aggregator_pb2.MergeOptions(rule=merge)
        if homogeneous_keys is not None:
            mo.set_homogeneous_keys = True
            mo.homogeneous_keys.extend(homogeneous_keys)
        r = self._call(self._stub.Start, aggregator_pb2.StartRequest(task_id=task_id, task_info=to_struct(info), merge=mo))
        return Started(r.task_id, list(r.learners))

    def get_data_demand(self, task_id: str) -> MergedDemand:
        r = self._call(self._stub.GetDataDemand, aggregator_pb2.DemandRequest(task_id=task_id))
        d = Demand(r.demand.batch_size, from_struct(r.demand.fields))
        return MergedDemand(d, list(r.learners), list(r.batch_sizes))

    def learn(self, task_id: str, batch: Any, metadata: Optional[Mapping[str, str]] = None) -> Learned:
        """Splits ``batch`` (a dict of arrays/tensors with equal first
        dimension, or safetensors bytes) among the learners and merges their
        info. ``metadata`` reaches every learner's share."""
        blob = batch if isinstance(batch, (bytes, bytearray)) else save_bytes(batch, metadata)
        header = aggregator_pb2.LearnHeader(
            task_id=task_id, blob=tensor_pb2.BlobInfo(total_bytes=len(blob), chunk_bytes=self.chunk_bytes))

        def requests() -> Iterator[aggregator_pb2.LearnRequest]:
            yield aggregator_pb2.LearnRequest(header=header)
            for c in iter_chunks(blob, self.chunk_bytes):
                yield aggregator_pb2.LearnRequest(chunk=tensor_pb2.Chunk(data=c))

        # A Learn a standby refused was not applied: on a cluster target it
        # is sent again (the channel follows the primary the refusal
        # names), with the channel's own back-off for unary calls; any
        # other failure is the caller's (a Learn cut mid-way has an
        # unknown outcome: learners may have pushed gradients).
        follows = isinstance(self._channel, _channel.FollowingChannel)
        try:
            r = _channel.retry_following(
                time.monotonic() + self.timeout,
                lambda left: self._stub.Learn(requests(), timeout=left),
                lambda e: True if follows and isinstance(e, grpc.RpcError) and _channel.refusal(e) is not None
                else None,
                lambda e: e)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        return Learned(from_value(r.info), [Share(s.learner_id, s.row_start, s.rows) for s in r.shares],
                       list(r.failed))
