"""Reports and status (the WeightSync Report and Status RPCs). Part of :mod:`rlhub.wsync`."""

from __future__ import annotations

from typing import Any, List

import grpc

from rlhub import errors
from rlhub._proto.rlhub.v1 import sync_pb2, sync_pb2_grpc
from rlhub.store import channel as _channel

def report(hub: Any, collector_id: str, model: str, version: int, via: str, timeout: float = 10.0) -> None:
    """Reports the version a collector runs with the ``Report`` RPC.

    ``hub`` is an address or a ``grpc.Channel``."""
    errors.check_version("version", version)
    ch = _channel(hub) if isinstance(hub, str) else hub
    try:
        sync_pb2_grpc.WeightSyncStub(ch).Report(sync_pb2.SyncReportRequest(reports=[sync_pb2.CollectorReport(
            collector_id=collector_id, model=model, version=version, via=via)]), timeout=timeout)
    except grpc.RpcError as e:
        raise errors.from_rpc_error(e) from None
    finally:
        if isinstance(hub, str):
            ch.close()


def status(hub: Any, model: str = "", timeout: float = 10.0) -> List[sync_pb2.ModelSyncStatus]:
    """The hub's lag picture (``WeightSync.Status``) for ``model`` ("" = all)."""
    ch = _channel(hub) if isinstance(hub, str) else hub
    try:
        resp = sync_pb2_grpc.WeightSyncStub(ch).Status(sync_pb2.SyncStatusRequest(model=model), timeout=timeout)
    except grpc.RpcError as e:
        raise errors.from_rpc_error(e) from None
    finally:
        if isinstance(hub, str):
            ch.close()
    return list(resp.models)
