from rlhub._proto.rlhub.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StorePushRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: StorePushHeader
    chunk: _tensor_pb2.Chunk
    def __init__(self, header: _Optional[_Union[StorePushHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.Chunk, _Mapping]] = ...) -> None: ...

class StorePushHeader(_message.Message):
    __slots__ = ("blob", "expect", "expect_any")
    BLOB_FIELD_NUMBER: _ClassVar[int]
    EXPECT_FIELD_NUMBER: _ClassVar[int]
    EXPECT_ANY_FIELD_NUMBER: _ClassVar[int]
    blob: _tensor_pb2.BlobInfo
    expect: int
    expect_any: bool
    def __init__(self, blob: _Optional[_Union[_tensor_pb2.BlobInfo, _Mapping]] = ..., expect: _Optional[int] = ..., expect_any: _Optional[bool] = ...) -> None: ...

class StorePushResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: StoreModelInfo
    def __init__(self, info: _Optional[_Union[StoreModelInfo, _Mapping]] = ...) -> None: ...

class StorePullRequest(_message.Message):
    __slots__ = ("model", "version", "if_newer_than", "chunk_bytes")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    IF_NEWER_THAN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    model: str
    version: int
    if_newer_than: int
    chunk_bytes: int
    def __init__(self, model: _Optional[str] = ..., version: _Optional[int] = ..., if_newer_than: _Optional[int] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class StorePullResponse(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: StorePullHeader
    chunk: _tensor_pb2.Chunk
    def __init__(self, header: _Optional[_Union[StorePullHeader, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.Chunk, _Mapping]] = ...) -> None: ...

class StorePullHeader(_message.Message):
    __slots__ = ("blob", "not_modified", "skipped", "metadata", "created_unix_nano")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BLOB_FIELD_NUMBER: _ClassVar[int]
    NOT_MODIFIED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    blob: _tensor_pb2.BlobInfo
    not_modified: bool
    skipped: int
    metadata: _containers.ScalarMap[str, str]
    created_unix_nano: int
    def __init__(self, blob: _Optional[_Union[_tensor_pb2.BlobInfo, _Mapping]] = ..., not_modified: _Optional[bool] = ..., skipped: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., created_unix_nano: _Optional[int] = ...) -> None: ...

class StoreWatchRequest(_message.Message):
    __slots__ = ("model", "after", "chunk_bytes", "follow_lives", "life")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_LIVES_FIELD_NUMBER: _ClassVar[int]
    LIFE_FIELD_NUMBER: _ClassVar[int]
    model: str
    after: int
    chunk_bytes: int
    follow_lives: bool
    life: int
    def __init__(self, model: _Optional[str] = ..., after: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., follow_lives: _Optional[bool] = ..., life: _Optional[int] = ...) -> None: ...

class StoreListRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class StoreListResponse(_message.Message):
    __slots__ = ("models", "next_page_token")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[StoreModelInfo]
    next_page_token: str
    def __init__(self, models: _Optional[_Iterable[_Union[StoreModelInfo, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StoreModelInfo(_message.Message):
    __slots__ = ("name", "version", "epoch", "bytes", "created_unix_nano", "retained", "owner")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NANO_FIELD_NUMBER: _ClassVar[int]
    RETAINED_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    epoch: int
    bytes: int
    created_unix_nano: int
    retained: _containers.RepeatedScalarFieldContainer[int]
    owner: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., epoch: _Optional[int] = ..., bytes: _Optional[int] = ..., created_unix_nano: _Optional[int] = ..., retained: _Optional[_Iterable[int]] = ..., owner: _Optional[str] = ...) -> None: ...

class StoreDeleteRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class StoreDeleteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
