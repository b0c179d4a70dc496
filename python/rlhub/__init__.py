"""rlhub: Python client for the rlhub distributed RL backbone.

The public surface is curated here; everything else is internal.
``rlhub.torchrl``, ``rlhub.ray`` and ``rlhub.tensorboard`` are imported on
demand (the first two need TorchRL or Ray); ``ARSWorker`` is loaded lazily so that
``python -m rlhub.ars_worker`` runs its module once.
"""

from typing import TYPE_CHECKING, Any

from rlhub._version import __version__

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
from rlhub import wsync
from rlhub.wsync import Receiver
from rlhub.grads import GradClient
from rlhub.learner import Demand, LearnTask, Learner
from rlhub.aggregator import AggregatorClient
from rlhub.opthost import OptimizerHost

__all__ = [
    "__version__",
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
    "OptimizerHost",
    "Learner",
    "Demand",
    "LearnTask",
    "AggregatorClient",
]

if TYPE_CHECKING:
    from rlhub.ars_worker import ARSWorker
    from rlhub.torchrl import RlhubWeightUpdater


def __getattr__(name: str) -> Any:
    if name == "ARSWorker":
        from rlhub.ars_worker import ARSWorker

        return ARSWorker
    if name == "RlhubWeightUpdater":  # needs torchrl: imported on first use
        from rlhub.torchrl import RlhubWeightUpdater

        return RlhubWeightUpdater
    if name in ("tensorboard", "torchrl", "ray"):  # submodules, imported on first use
        import importlib

        return importlib.import_module(f"rlhub.{name}")
    raise AttributeError(f"module 'rlhub' has no attribute {name!r}")
