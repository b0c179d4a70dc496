"""Client for the ordered model store: push, pull and watch versioned models.

    with rlhub.StoreClient("127.0.0.1:7470") as store:
        store.push("policy", model.state_dict(), version=1, expect=0)
        v = store.pull("policy", framework="torch")
        for v in store.watch("policy", after=v.version):
            model.load_state_dict(v.tensors)

State dicts travel as safetensors bytes (no pickle). A stale or
conflicting push raises ``rlhub.StaleVersion`` with the current version.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional

import grpc

from rlhub import _channel, errors
from rlhub._proto.rlhub.v1 import store_pb2, store_pb2_grpc, tensor_pb2
from rlhub._transfer import DEFAULT_CHUNK_BYTES, Assembler, RawChunk, chunk_messages, fast_decoder
from rlhub.tensors import load_bytes, save_bytes

EXPECT_ANY = object()

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.max_send_message_length", 8 << 20),
]


def channel(addr: str) -> grpc.Channel:
    """Opens a channel with rlhub's message-size options (TLS and token per
    ``rlhub._channel.default_security()``)."""
    return _channel.channel(addr, options=_CHANNEL_OPTIONS)


@dataclasses.dataclass
class ModelVersion:
    """One version of a model as pulled."""

    name: str
    version: int
    epoch: int
    blob: Any  # safetensors bytes; a writable bytes-like memoryview when pulled
    metadata: Dict[str, str]
    created_unix_nano: int
    skipped: int = 0
    framework: str = "numpy"
    _tensors: Optional[Dict[str, Any]] = dataclasses.field(default=None, repr=False)

    @property
    def tensors(self) -> Dict[str, Any]:
        """The state dict (numpy views over ``blob``, or torch tensors)."""
        if self._tensors is None:
            self._tensors = load_bytes(self.blob, framework=self.framework)
        return self._tensors


@dataclasses.dataclass
class ModelInfo:
    name: str
    version: int
    epoch: int
    bytes: int
    created_unix_nano: int
    retained: List[int]


def _info(m: store_pb2.StoreModelInfo) -> ModelInfo:
    return ModelInfo(m.name, m.version, m.epoch, m.bytes, m.created_unix_nano, list(m.retained))


class StoreClient:
    """A model-store client. Thread-safe; close it (or use ``with``)."""

    def __init__(self, addr: str, *, timeout: float = 60.0, retries: int = 4,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, channel_: Optional[grpc.Channel] = None):
        self._own = channel_ is None
        self._channel = channel_ or channel(addr)
        self._stub = store_pb2_grpc.ModelStoreStub(self._channel)
        # Push, Pull and Watch move chunks with the hand-made codec of
        # rlhub._transfer (one copy per chunk each way); same wire bytes.
        self._push = self._channel.stream_unary(
            "/rlhub.v1.ModelStore/Push", request_serializer=bytes,
            response_deserializer=store_pb2.StorePushResponse.FromString)
        self._pull = self._channel.unary_stream(
            "/rlhub.v1.ModelStore/Pull", request_serializer=store_pb2.StorePullRequest.SerializeToString,
            response_deserializer=fast_decoder(store_pb2.StorePullResponse))
        self._watch = self._channel.unary_stream(
            "/rlhub.v1.ModelStore/Watch", request_serializer=store_pb2.StoreWatchRequest.SerializeToString,
            response_deserializer=fast_decoder(store_pb2.StorePullResponse))
        self.timeout = timeout
        self.retries = retries
        self.chunk_bytes = chunk_bytes

    def close(self) -> None:
        if self._own:
            self._channel.close()

    def __enter__(self) -> "StoreClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, fn):
        """Runs fn, retrying with backoff on Unavailable; maps errors."""
        delay = 0.05
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE and attempt < self.retries:
                    time.sleep(delay * (1 + random.random()))
                    delay = min(delay * 2, 2.0)
                    continue
                raise errors.from_rpc_error(e) from None
        raise AssertionError("unreachable")

    def push(self, name: str, state_dict: Any, *, version: int, expect: Any = EXPECT_ANY,
             epoch: int = 0, metadata: Optional[Mapping[str, str]] = None) -> ModelInfo:
        """Pushes a version. ``state_dict`` is a dict of numpy arrays or torch
        tensors, or safetensors bytes. ``expect`` is the version you believe is
        current (0: the model must not exist); by default it is not checked."""
        blob = state_dict if isinstance(state_dict, (bytes, bytearray, memoryview)) else save_bytes(state_dict, metadata)
        header = store_pb2.StorePushHeader(
            blob=tensor_pb2.BlobInfo(model=name, version=version, epoch=epoch,
                                     total_bytes=len(blob), chunk_bytes=self.chunk_bytes),
            expect=0 if expect is EXPECT_ANY else int(expect),
            expect_any=expect is EXPECT_ANY,
        )

        def requests():
            yield store_pb2.StorePushRequest(header=header).SerializeToString()
            yield from chunk_messages(blob, self.chunk_bytes)

        resp = self._call(lambda: self._push(requests(), timeout=self.timeout))
        return _info(resp.info)

    def _read_version(self, it, framework: str) -> Optional[ModelVersion]:
        """Reads one header + its chunks from a pull/watch stream."""
        first = next(it, None)
        if first is None:
            return None
        if isinstance(first, RawChunk) or not first.HasField("header"):
            raise errors.InvalidArgument("stream did not start with a header")
        h = first.header
        if h.not_modified:
            return None
        asm = Assembler(h.blob.total_bytes)
        got = 0
        while got < h.blob.total_bytes:
            msg = next(it, None)
            if msg is None:
                raise errors.InvalidArgument(f"stream ended after {got} of {h.blob.total_bytes} bytes")
            if not isinstance(msg, RawChunk):
                if not msg.HasField("chunk"):
                    raise errors.InvalidArgument(f"a header arrived after {got} of {h.blob.total_bytes} bytes")
                msg = msg.chunk
            try:
                asm.write(msg.data)
            except ValueError as e:
                raise errors.InvalidArgument(str(e)) from None
            got += len(msg.data)
        return ModelVersion(h.blob.model, h.blob.version, h.blob.epoch, asm.finish(), dict(h.metadata),
                            h.created_unix_nano, h.skipped, framework)

    def pull(self, name: str, version: int = 0, *, if_newer_than: Optional[int] = None,
             framework: str = "numpy") -> Optional[ModelVersion]:
        """Pulls the newest version (or an exact one). With ``if_newer_than``
        returns None when the newest is not newer ("not modified")."""
        req = store_pb2.StorePullRequest(model=name, version=version, chunk_bytes=self.chunk_bytes)
        if if_newer_than is not None:
            req.if_newer_than = if_newer_than

        def do():
            it = iter(self._pull(req, timeout=self.timeout))
            return self._read_version(it, framework)

        return self._call(do)

    def watch(self, name: str, after: int = 0, *, framework: str = "numpy",
              timeout: Optional[float] = None) -> Iterator[ModelVersion]:
        """Yields each new version as it lands (skipping to the newest when
        the reader is slow; ``ModelVersion.skipped`` says how many)."""
        call = self._watch(store_pb2.StoreWatchRequest(model=name, after=after, chunk_bytes=self.chunk_bytes),
                                timeout=timeout)
        it = iter(call)
        try:
            while True:
                try:
                    v = self._read_version(it, framework)
                except grpc.RpcError as e:
                    raise errors.from_rpc_error(e) from None
                if v is None:
                    return
                yield v
        finally:
            call.cancel()

    def list(self) -> List[ModelInfo]:
        resp = self._call(lambda: self._stub.List(store_pb2.StoreListRequest(), timeout=self.timeout))
        return [_info(m) for m in resp.models]
