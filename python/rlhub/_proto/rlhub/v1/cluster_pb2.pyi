from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

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
