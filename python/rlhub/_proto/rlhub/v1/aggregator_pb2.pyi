from google.protobuf import struct_pb2 as _struct_pb2
from rlhub._proto.rlhub.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LearnerMessage(_message.Message):
    __slots__ = ("hello", "heartbeat", "reply")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    heartbeat: Heartbeat
    reply: LearnerReply
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., reply: _Optional[_Union[LearnerReply, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("learner_id", "resources")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    learner_id: str
    resources: _containers.ScalarMap[str, str]
    def __init__(self, learner_id: _Optional[str] = ..., resources: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LearnerReply(_message.Message):
    __slots__ = ("request_id", "error", "info", "demand")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    error: str
    info: Value
    demand: Demand
    def __init__(self, request_id: _Optional[int] = ..., error: _Optional[str] = ..., info: _Optional[_Union[Value, _Mapping]] = ..., demand: _Optional[_Union[Demand, _Mapping]] = ...) -> None: ...

class Demand(_message.Message):
    __slots__ = ("batch_size", "fields")
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    batch_size: int
    fields: _struct_pb2.Struct
    def __init__(self, batch_size: _Optional[int] = ..., fields: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class AggregatorMessage(_message.Message):
    __slots__ = ("welcome", "start", "demand", "learn", "chunk")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    LEARN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    start: StartTask
    demand: DemandTask
    learn: LearnTask
    chunk: _tensor_pb2.Chunk
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., start: _Optional[_Union[StartTask, _Mapping]] = ..., demand: _Optional[_Union[DemandTask, _Mapping]] = ..., learn: _Optional[_Union[LearnTask, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.Chunk, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("lease_ms",)
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    lease_ms: int
    def __init__(self, lease_ms: _Optional[int] = ...) -> None: ...

class StartTask(_message.Message):
    __slots__ = ("request_id", "task_id", "task_info")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_INFO_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    task_id: str
    task_info: _struct_pb2.Struct
    def __init__(self, request_id: _Optional[int] = ..., task_id: _Optional[str] = ..., task_info: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class DemandTask(_message.Message):
    __slots__ = ("request_id", "task_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    task_id: str
    def __init__(self, request_id: _Optional[int] = ..., task_id: _Optional[str] = ...) -> None: ...

class LearnTask(_message.Message):
    __slots__ = ("request_id", "task_id", "row_start", "rows", "blob")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ROW_START_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    task_id: str
    row_start: int
    rows: int
    blob: _tensor_pb2.BlobInfo
    def __init__(self, request_id: _Optional[int] = ..., task_id: _Optional[str] = ..., row_start: _Optional[int] = ..., rows: _Optional[int] = ..., blob: _Optional[_Union[_tensor_pb2.BlobInfo, _Mapping]] = ...) -> None: ...

class ResourcesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResourcesResponse(_message.Message):
    __slots__ = ("learners", "world_size")
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    learners: _containers.RepeatedCompositeFieldContainer[LearnerInfo]
    world_size: int
    def __init__(self, learners: _Optional[_Iterable[_Union[LearnerInfo, _Mapping]]] = ..., world_size: _Optional[int] = ...) -> None: ...

class LearnerInfo(_message.Message):
    __slots__ = ("learner_id", "resources", "lease_remaining_ms", "started_task", "tasks_done", "tasks_failed")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    LEASE_REMAINING_MS_FIELD_NUMBER: _ClassVar[int]
    STARTED_TASK_FIELD_NUMBER: _ClassVar[int]
    TASKS_DONE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FAILED_FIELD_NUMBER: _ClassVar[int]
    learner_id: str
    resources: _containers.ScalarMap[str, str]
    lease_remaining_ms: int
    started_task: str
    tasks_done: int
    tasks_failed: int
    def __init__(self, learner_id: _Optional[str] = ..., resources: _Optional[_Mapping[str, str]] = ..., lease_remaining_ms: _Optional[int] = ..., started_task: _Optional[str] = ..., tasks_done: _Optional[int] = ..., tasks_failed: _Optional[int] = ...) -> None: ...

class StartRequest(_message.Message):
    __slots__ = ("task_id", "task_info", "merge")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_INFO_FIELD_NUMBER: _ClassVar[int]
    MERGE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    task_info: _struct_pb2.Struct
    merge: MergeOptions
    def __init__(self, task_id: _Optional[str] = ..., task_info: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., merge: _Optional[_Union[MergeOptions, _Mapping]] = ...) -> None: ...

class MergeOptions(_message.Message):
    __slots__ = ("rule", "set_homogeneous_keys", "homogeneous_keys")
    RULE_FIELD_NUMBER: _ClassVar[int]
    SET_HOMOGENEOUS_KEYS_FIELD_NUMBER: _ClassVar[int]
    HOMOGENEOUS_KEYS_FIELD_NUMBER: _ClassVar[int]
    rule: str
    set_homogeneous_keys: bool
    homogeneous_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rule: _Optional[str] = ..., set_homogeneous_keys: _Optional[bool] = ..., homogeneous_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("null_value", "int_value", "float_value", "string_value", "bool_value", "list_value", "map_value")
    NULL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    LIST_VALUE_FIELD_NUMBER: _ClassVar[int]
    MAP_VALUE_FIELD_NUMBER: _ClassVar[int]
    null_value: bool
    int_value: int
    float_value: float
    string_value: str
    bool_value: bool
    list_value: ValueList
    map_value: ValueMap
    def __init__(self, null_value: _Optional[bool] = ..., int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., string_value: _Optional[str] = ..., bool_value: _Optional[bool] = ..., list_value: _Optional[_Union[ValueList, _Mapping]] = ..., map_value: _Optional[_Union[ValueMap, _Mapping]] = ...) -> None: ...

class ValueList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class ValueMap(_message.Message):
    __slots__ = ("fields",)
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.MessageMap[str, Value]
    def __init__(self, fields: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class StartResponse(_message.Message):
    __slots__ = ("task_id", "learners")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    learners: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task_id: _Optional[str] = ..., learners: _Optional[_Iterable[str]] = ...) -> None: ...

class DemandRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class DemandResponse(_message.Message):
    __slots__ = ("demand", "learners", "batch_sizes")
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZES_FIELD_NUMBER: _ClassVar[int]
    demand: Demand
    learners: _containers.RepeatedScalarFieldContainer[str]
    batch_sizes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, demand: _Optional[_Union[Demand, _Mapping]] = ..., learners: _Optional[_Iterable[str]] = ..., batch_sizes: _Optional[_Iterable[int]] = ...) -> None: ...

class LearnRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: LearnHeader
    chunk: _tensor_pb2.Chunk
    def __init__(self, header: _Optional[_Union[LearnHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.Chunk, _Mapping]] = ...) -> None: ...

class LearnHeader(_message.Message):
    __slots__ = ("task_id", "blob")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    blob: _tensor_pb2.BlobInfo
    def __init__(self, task_id: _Optional[str] = ..., blob: _Optional[_Union[_tensor_pb2.BlobInfo, _Mapping]] = ...) -> None: ...

class LearnResponse(_message.Message):
    __slots__ = ("info", "shares", "failed")
    INFO_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    info: Value
    shares: _containers.RepeatedCompositeFieldContainer[Share]
    failed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, info: _Optional[_Union[Value, _Mapping]] = ..., shares: _Optional[_Iterable[_Union[Share, _Mapping]]] = ..., failed: _Optional[_Iterable[str]] = ...) -> None: ...

class Share(_message.Message):
    __slots__ = ("learner_id", "row_start", "rows")
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    ROW_START_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    learner_id: str
    row_start: int
    rows: int
    def __init__(self, learner_id: _Optional[str] = ..., row_start: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("learners", "task_id", "attached_total", "removed_total", "learn_ok", "learn_failed", "resplits")
    LEARNERS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    REMOVED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LEARN_OK_FIELD_NUMBER: _ClassVar[int]
    LEARN_FAILED_FIELD_NUMBER: _ClassVar[int]
    RESPLITS_FIELD_NUMBER: _ClassVar[int]
    learners: _containers.RepeatedCompositeFieldContainer[LearnerInfo]
    task_id: str
    attached_total: int
    removed_total: int
    learn_ok: int
    learn_failed: int
    resplits: int
    def __init__(self, learners: _Optional[_Iterable[_Union[LearnerInfo, _Mapping]]] = ..., task_id: _Optional[str] = ..., attached_total: _Optional[int] = ..., removed_total: _Optional[int] = ..., learn_ok: _Optional[int] = ..., learn_failed: _Optional[int] = ..., resplits: _Optional[int] = ...) -> None: ...
