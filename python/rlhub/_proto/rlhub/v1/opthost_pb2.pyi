from rlhub._proto.rlhub.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HostMessage(_message.Message):
    __slots__ = ("hello", "result", "chunk")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    hello: HostHello
    result: HostResult
    chunk: _tensor_pb2.Chunk
    def __init__(self, hello: _Optional[_Union[HostHello, _Mapping]] = ..., result: _Optional[_Union[HostResult, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.Chunk, _Mapping]] = ...) -> None: ...

class HostHello(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class HostResult(_message.Message):
    __slots__ = ("step_id", "error", "params")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    error: str
    params: _tensor_pb2.BlobInfo
    def __init__(self, step_id: _Optional[int] = ..., error: _Optional[str] = ..., params: _Optional[_Union[_tensor_pb2.BlobInfo, _Mapping]] = ...) -> None: ...

class PrimaryMessage(_message.Message):
    __slots__ = ("welcome", "step", "chunk")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    welcome: HostWelcome
    step: HostStep
    chunk: _tensor_pb2.Chunk
    def __init__(self, welcome: _Optional[_Union[HostWelcome, _Mapping]] = ..., step: _Optional[_Union[HostStep, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.Chunk, _Mapping]] = ...) -> None: ...

class HostWelcome(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class HostStep(_message.Message):
    __slots__ = ("step_id", "version", "grad", "steps")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GRAD_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    version: int
    grad: _tensor_pb2.BlobInfo
    steps: int
    def __init__(self, step_id: _Optional[int] = ..., version: _Optional[int] = ..., grad: _Optional[_Union[_tensor_pb2.BlobInfo, _Mapping]] = ..., steps: _Optional[int] = ...) -> None: ...
