"""rlhub: Python client for the rlhub distributed RL backbone.

The public surface is curated here; everything else is internal.
"""

from rlhub.errors import (
    RlhubError,
    InvalidArgument,
    NotFound,
    StaleVersion,
    AlreadyExists,
    QueueFull,
    Unauthenticated,
    PermissionDenied,
    Unavailable,
    Aborted,
    DeadlineExceeded,
    from_rpc_error,
)
from rlhub._channel import Security, configure
from rlhub.tensors import load_bytes, save_bytes
from rlhub.store import StoreClient, ModelVersion, ModelInfo
from rlhub.ars_worker import ARSWorker
from rlhub import wsync
from rlhub.wsync import Receiver, RlhubWeightUpdater
from rlhub.grads import GradClient
from rlhub.learner import Demand, LearnTask, Learner
from rlhub.aggregator import AggregatorClient

__all__ = [
    "RlhubError",
    "InvalidArgument",
    "NotFound",
    "StaleVersion",
    "AlreadyExists",
    "QueueFull",
    "Unauthenticated",
    "PermissionDenied",
    "Unavailable",
    "Aborted",
    "DeadlineExceeded",
    "from_rpc_error",
    "Security",
    "configure",
    "load_bytes",
    "save_bytes",
    "StoreClient",
    "ModelVersion",
    "ModelInfo",
    "ARSWorker",
    "wsync",
    "Receiver",
    "RlhubWeightUpdater",
    "GradClient",
    "Learner",
    "Demand",
    "LearnTask",
    "AggregatorClient",
]
