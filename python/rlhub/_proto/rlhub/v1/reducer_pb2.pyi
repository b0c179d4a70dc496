from rlhub._proto.rlhub.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReducerOptimizer(_message.Message):
    __slots__ = ("kind", "lr", "weight_decay", "momentum", "dampening", "nesterov", "beta1", "beta2", "eps", "alpha", "centered", "schedule", "step_size", "gamma", "t_max", "min_lr", "warmup_steps", "warmup_start", "lr_decay", "initial_accumulator_value", "momentum_decay", "decoupled_weight_decay")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    DAMPENING_FIELD_NUMBER: _ClassVar[int]
    NESTEROV_FIELD_NUMBER: _ClassVar[int]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    CENTERED_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    STEP_SIZE_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    T_MAX_FIELD_NUMBER: _ClassVar[int]
    MIN_LR_FIELD_NUMBER: _ClassVar[int]
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    WARMUP_START_FIELD_NUMBER: _ClassVar[int]
    LR_DECAY_FIELD_NUMBER: _ClassVar[int]
    INITIAL_ACCUMULATOR_VALUE_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_DECAY_FIELD_NUMBER: _ClassVar[int]
    DECOUPLED_WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    kind: str
    lr: float
    weight_decay: float
    momentum: float
    dampening: float
    nesterov: bool
    beta1: float
    beta2: float
    eps: float
    alpha: float
    centered: bool
    schedule: str
    step_size: int
    gamma: float
    t_max: int
    min_lr: float
    warmup_steps: int
    warmup_start: float
    lr_decay: float
    initial_accumulator_value: float
    momentum_decay: float
    decoupled_weight_decay: bool
    def __init__(self, kind: _Optional[str] = ..., lr: _Optional[float] = ..., weight_decay: _Optional[float] = ..., momentum: _Optional[float] = ..., dampening: _Optional[float] = ..., nesterov: _Optional[bool] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., eps: _Optional[float] = ..., alpha: _Optional[float] = ..., centered: _Optional[bool] = ..., schedule: _Optional[str] = ..., step_size: _Optional[int] = ..., gamma: _Optional[float] = ..., t_max: _Optional[int] = ..., min_lr: _Optional[float] = ..., warmup_steps: _Optional[int] = ..., warmup_start: _Optional[float] = ..., lr_decay: _Optional[float] = ..., initial_accumulator_value: _Optional[float] = ..., momentum_decay: _Optional[float] = ..., decoupled_weight_decay: _Optional[bool] = ...) -> None: ...

class ReducerRegisterRequest(_message.Message):
    __slots__ = ("model", "optimizer", "reduction", "gradient_max", "staleness", "max_lag", "checkpoint_every")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    REDUCTION_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_MAX_FIELD_NUMBER: _ClassVar[int]
    STALENESS_FIELD_NUMBER: _ClassVar[int]
    MAX_LAG_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    model: str
    optimizer: ReducerOptimizer
    reduction: str
    gradient_max: float
    staleness: str
    max_lag: int
    checkpoint_every: int
    def __init__(self, model: _Optional[str] = ..., optimizer: _Optional[_Union[ReducerOptimizer, _Mapping]] = ..., reduction: _Optional[str] = ..., gradient_max: _Optional[float] = ..., staleness: _Optional[str] = ..., max_lag: _Optional[int] = ..., checkpoint_every: _Optional[int] = ...) -> None: ...

class ReducerRegisterResponse(_message.Message):
    __slots__ = ("version", "restored_steps")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RESTORED_STEPS_FIELD_NUMBER: _ClassVar[int]
    version: int
    restored_steps: int
    def __init__(self, version: _Optional[int] = ..., restored_steps: _Optional[int] = ...) -> None: ...

class ReducerSecondariesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReducerSecondary(_message.Message):
    __slots__ = ("addr", "id")
    ADDR_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    addr: str
    id: str
    def __init__(self, addr: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class ReducerSecondariesResponse(_message.Message):
    __slots__ = ("secondaries",)
    SECONDARIES_FIELD_NUMBER: _ClassVar[int]
    secondaries: _containers.RepeatedCompositeFieldContainer[ReducerSecondary]
    def __init__(self, secondaries: _Optional[_Iterable[_Union[ReducerSecondary, _Mapping]]] = ...) -> None: ...

class ReducerPushRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: ReducerPushHeader
    chunk: _tensor_pb2.Chunk
    def __init__(self, header: _Optional[_Union[ReducerPushHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.Chunk, _Mapping]] = ...) -> None: ...

class ReducerPushHeader(_message.Message):
    __slots__ = ("blob", "client_id", "seq", "secondary")
    BLOB_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SECONDARY_FIELD_NUMBER: _ClassVar[int]
    blob: _tensor_pb2.BlobInfo
    client_id: str
    seq: int
    secondary: str
    def __init__(self, blob: _Optional[_Union[_tensor_pb2.BlobInfo, _Mapping]] = ..., client_id: _Optional[str] = ..., seq: _Optional[int] = ..., secondary: _Optional[str] = ...) -> None: ...

class ReducerPushResponse(_message.Message):
    __slots__ = ("version", "weight")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    version: int
    weight: float
    def __init__(self, version: _Optional[int] = ..., weight: _Optional[float] = ...) -> None: ...

class ReducerStatsRequest(_message.Message):
    __slots__ = ("local",)
    LOCAL_FIELD_NUMBER: _ClassVar[int]
    local: bool
    def __init__(self, local: _Optional[bool] = ...) -> None: ...

class ReducerCounters(_message.Message):
    __slots__ = ("pushed", "reduced", "applied", "steps", "dropped", "queue_depth", "attempts")
    class DroppedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PUSHED_FIELD_NUMBER: _ClassVar[int]
    REDUCED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    pushed: int
    reduced: int
    applied: int
    steps: int
    dropped: _containers.ScalarMap[str, int]
    queue_depth: int
    attempts: int
    def __init__(self, pushed: _Optional[int] = ..., reduced: _Optional[int] = ..., applied: _Optional[int] = ..., steps: _Optional[int] = ..., dropped: _Optional[_Mapping[str, int]] = ..., queue_depth: _Optional[int] = ..., attempts: _Optional[int] = ...) -> None: ...

class ReducerStatsResponse(_message.Message):
    __slots__ = ("total", "parts", "publish_p50_us", "publish_p99_us", "versions", "blobs_reused", "models", "unreachable")
    class PartsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ReducerCounters
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ReducerCounters, _Mapping]] = ...) -> None: ...
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class BlobsReusedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ModelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ReducerModelStats
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ReducerModelStats, _Mapping]] = ...) -> None: ...
    class UnreachableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_P50_US_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_P99_US_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    BLOBS_REUSED_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    total: ReducerCounters
    parts: _containers.MessageMap[str, ReducerCounters]
    publish_p50_us: float
    publish_p99_us: float
    versions: _containers.ScalarMap[str, int]
    blobs_reused: _containers.ScalarMap[str, int]
    models: _containers.MessageMap[str, ReducerModelStats]
    unreachable: _containers.ScalarMap[str, str]
    def __init__(self, total: _Optional[_Union[ReducerCounters, _Mapping]] = ..., parts: _Optional[_Mapping[str, ReducerCounters]] = ..., publish_p50_us: _Optional[float] = ..., publish_p99_us: _Optional[float] = ..., versions: _Optional[_Mapping[str, int]] = ..., blobs_reused: _Optional[_Mapping[str, int]] = ..., models: _Optional[_Mapping[str, ReducerModelStats]] = ..., unreachable: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ReducerModelStats(_message.Message):
    __slots__ = ("version", "counters", "blobs_reused", "optimizer_steps", "state_error")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    BLOBS_REUSED_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_STEPS_FIELD_NUMBER: _ClassVar[int]
    STATE_ERROR_FIELD_NUMBER: _ClassVar[int]
    version: int
    counters: ReducerCounters
    blobs_reused: int
    optimizer_steps: int
    state_error: str
    def __init__(self, version: _Optional[int] = ..., counters: _Optional[_Union[ReducerCounters, _Mapping]] = ..., blobs_reused: _Optional[int] = ..., optimizer_steps: _Optional[int] = ..., state_error: _Optional[str] = ...) -> None: ...

class ReducerAttachRequest(_message.Message):
    __slots__ = ("addr", "id")
    ADDR_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    addr: str
    id: str
    def __init__(self, addr: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class ReducerAttachEvent(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: int
    def __init__(self, session: _Optional[int] = ...) -> None: ...

class ReducerDescribeRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ReducerTensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class ReducerDescribeResponse(_message.Message):
    __slots__ = ("tensors", "version")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[ReducerTensorSpec]
    version: int
    def __init__(self, tensors: _Optional[_Iterable[_Union[ReducerTensorSpec, _Mapping]]] = ..., version: _Optional[int] = ...) -> None: ...

class ReducerAdmitRequest(_message.Message):
    __slots__ = ("session", "model", "client_id", "seq", "base_version", "base_life")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_LIFE_FIELD_NUMBER: _ClassVar[int]
    session: int
    model: str
    client_id: str
    seq: int
    base_version: int
    base_life: int
    def __init__(self, session: _Optional[int] = ..., model: _Optional[str] = ..., client_id: _Optional[str] = ..., seq: _Optional[int] = ..., base_version: _Optional[int] = ..., base_life: _Optional[int] = ...) -> None: ...

class ReducerAdmitResponse(_message.Message):
    __slots__ = ("weight", "version")
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    weight: float
    version: int
    def __init__(self, weight: _Optional[float] = ..., version: _Optional[int] = ...) -> None: ...

class ReducerGradientID(_message.Message):
    __slots__ = ("client_id", "seq")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    seq: int
    def __init__(self, client_id: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class ReducerReleaseRequest(_message.Message):
    __slots__ = ("session", "model", "ids")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    session: int
    model: str
    ids: _containers.RepeatedCompositeFieldContainer[ReducerGradientID]
    def __init__(self, session: _Optional[int] = ..., model: _Optional[str] = ..., ids: _Optional[_Iterable[_Union[ReducerGradientID, _Mapping]]] = ...) -> None: ...

class ReducerReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class ReducerForwardRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: ReducerForwardHeader
    chunk: _tensor_pb2.Chunk
    def __init__(self, header: _Optional[_Union[ReducerForwardHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.Chunk, _Mapping]] = ...) -> None: ...

class ReducerForwardHeader(_message.Message):
    __slots__ = ("session", "blob", "ids", "weights", "first_admitted_unix_nano")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    FIRST_ADMITTED_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    session: int
    blob: _tensor_pb2.BlobInfo
    ids: _containers.RepeatedCompositeFieldContainer[ReducerGradientID]
    weights: _containers.RepeatedScalarFieldContainer[float]
    first_admitted_unix_nano: int
    def __init__(self, session: _Optional[int] = ..., blob: _Optional[_Union[_tensor_pb2.BlobInfo, _Mapping]] = ..., ids: _Optional[_Iterable[_Union[ReducerGradientID, _Mapping]]] = ..., weights: _Optional[_Iterable[float]] = ..., first_admitted_unix_nano: _Optional[int] = ...) -> None: ...

class ReducerForwardResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...
