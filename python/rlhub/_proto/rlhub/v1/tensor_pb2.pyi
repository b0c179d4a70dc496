from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class BlobInfo(_message.Message):
    __slots__ = ("model", "version", "epoch", "total_bytes", "chunk_bytes", "life")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    LIFE_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    epoch: int
    total_bytes: int
    chunk_bytes: int
    life: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., epoch: _Optional[int] = ..., total_bytes: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., life: _Optional[int] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...
