from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrimaryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PrimaryResponse(_message.Message):
    __slots__ = ("address", "epoch", "member_id", "self", "cluster")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    SELF_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    address: str
    epoch: int
    member_id: str
    self: bool
    cluster: str
    def __init__(self_, address: _Optional[str] = ..., epoch: _Optional[int] = ..., member_id: _Optional[str] = ..., self: _Optional[bool] = ..., cluster: _Optional[str] = ...) -> None: ...

class ReplicationRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicationResponse(_message.Message):
    __slots__ = ("member_id", "primary", "epoch", "unit", "synced", "followers")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    PRIMARY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    SYNCED_FIELD_NUMBER: _ClassVar[int]
    FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    primary: bool
    epoch: int
    unit: int
    synced: bool
    followers: _containers.RepeatedCompositeFieldContainer[ReplicationFollower]
    def __init__(self, member_id: _Optional[str] = ..., primary: _Optional[bool] = ..., epoch: _Optional[int] = ..., unit: _Optional[int] = ..., synced: _Optional[bool] = ..., followers: _Optional[_Iterable[_Union[ReplicationFollower, _Mapping]]] = ...) -> None: ...

class ReplicationFollower(_message.Message):
    __slots__ = ("member_id", "acked", "lag")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    acked: int
    lag: int
    def __init__(self, member_id: _Optional[str] = ..., acked: _Optional[int] = ..., lag: _Optional[int] = ...) -> None: ...
