from rlhub._proto.rlhub.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SyncClientMessage(_message.Message):
    __slots__ = ("hello", "running")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    hello: SyncHello
    running: SyncRunning
    def __init__(self, hello: _Optional[_Union[SyncHello, _Mapping]] = ..., running: _Optional[_Union[SyncRunning, _Mapping]] = ...) -> None: ...

class SyncHello(_message.Message):
    __slots__ = ("collector_id", "model", "version", "chunk_bytes", "wait_ms", "follow_lives", "life")
    COLLECTOR_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_LIVES_FIELD_NUMBER: _ClassVar[int]
    LIFE_FIELD_NUMBER: _ClassVar[int]
    collector_id: str
    model: str
    version: int
    chunk_bytes: int
    wait_ms: int
    follow_lives: bool
    life: int
    def __init__(self, collector_id: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., wait_ms: _Optional[int] = ..., follow_lives: _Optional[bool] = ..., life: _Optional[int] = ...) -> None: ...

class SyncRunning(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class SyncServerMessage(_message.Message):
    __slots__ = ("info", "chunk")
    INFO_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    info: _tensor_pb2.BlobInfo
    chunk: _tensor_pb2.Chunk
    def __init__(self, info: _Optional[_Union[_tensor_pb2.BlobInfo, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.Chunk, _Mapping]] = ...) -> None: ...

class SyncReportRequest(_message.Message):
    __slots__ = ("reports",)
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[CollectorReport]
    def __init__(self, reports: _Optional[_Iterable[_Union[CollectorReport, _Mapping]]] = ...) -> None: ...

class CollectorReport(_message.Message):
    __slots__ = ("collector_id", "model", "version", "via")
    COLLECTOR_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    collector_id: str
    model: str
    version: int
    via: str
    def __init__(self, collector_id: _Optional[str] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., via: _Optional[str] = ...) -> None: ...

class SyncReportResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SyncStatusRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class SyncStatusResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelSyncStatus]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelSyncStatus, _Mapping]]] = ...) -> None: ...

class ModelSyncStatus(_message.Message):
    __slots__ = ("model", "newest", "collectors", "histogram")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIELD_NUMBER: _ClassVar[int]
    COLLECTORS_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    model: str
    newest: int
    collectors: _containers.RepeatedCompositeFieldContainer[CollectorLag]
    histogram: _containers.RepeatedCompositeFieldContainer[LagBucket]
    def __init__(self, model: _Optional[str] = ..., newest: _Optional[int] = ..., collectors: _Optional[_Iterable[_Union[CollectorLag, _Mapping]]] = ..., histogram: _Optional[_Iterable[_Union[LagBucket, _Mapping]]] = ...) -> None: ...

class CollectorLag(_message.Message):
    __slots__ = ("collector_id", "version", "lag", "via", "attached", "reported_unix_nanos")
    COLLECTOR_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    REPORTED_UNIX_NANOS_FIELD_NUMBER: _ClassVar[int]
    collector_id: str
    version: int
    lag: int
    via: str
    attached: bool
    reported_unix_nanos: int
    def __init__(self, collector_id: _Optional[str] = ..., version: _Optional[int] = ..., lag: _Optional[int] = ..., via: _Optional[str] = ..., attached: _Optional[bool] = ..., reported_unix_nanos: _Optional[int] = ...) -> None: ...

class LagBucket(_message.Message):
    __slots__ = ("max_lag", "count")
    MAX_LAG_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    max_lag: int
    count: int
    def __init__(self, max_lag: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...
