"""Weight sync for collectors: keep a ``torch.nn.Module`` at the newest version.

    import rlhub.wsync as ws

    src = ws.ShmSource(model="policy")                  # same host, via `rlhub relay`
    # src = ws.PushSource("127.0.0.1:7470", "policy", collector_id="actor-3")
    # src = ws.StoreSource("127.0.0.1:7470", "policy")
    with ws.Receiver(policy_net, src, collector_id="actor-3", hub="127.0.0.1:7470") as r:
        for episode in ...:
            r.poll()            # applies the newest version if newer; no-op otherwise
            ...                 # act with policy_net

Three sources, one interface (``get_if_newer`` / ``wait_newer``), the same as
the Go side's ``wsync.Source`` (docs/weight-sync.md):

* :class:`ShmSource` maps the shared-memory segment a Go ``shm.Writer`` (the
  relay) writes and follows docs/shm-layout.md exactly. By default it leases
  the newest whole slot (the writer leaves it alone while leased) and a
  :class:`Receiver` copies it straight into the module, checking the CRC-32C
  in that pass, then releases it: one copy. Where it cannot lease (it says
  why in ``copy_reason``), or with ``lease=False``, it copies the slot to
  private memory, re-reads the slot's seqlock word and retries when the
  writer came back during the copy, then checks the CRC-32C. It never
  returns a torn version: either the newest whole one or, while that is
  being written, the previous whole one.
* :class:`PushSource` attaches to the hub's (or relay's) push fan-out as a
  collector and reports the version it runs on the same stream;
  :class:`DataPlaneSource` follows the hub's push fan-out on its data plane
  (each version read with ``recv_into`` into reused buffers; the push
  stream against a hub without it).
* :class:`StoreSource` pulls "only if newer" from the model store and
  watches it.

A :class:`Receiver` applies a version only if it is newer than the one the
module runs (so the same version twice is a no-op) or, by default, of another
life (the model deleted and pushed again: docs/weight-sync.md, "Lives"; the
push stream and the store follow lives), checks every name, dtype
and shape first (:class:`rlhub.InvalidArgument`, nothing copied), copies into
the module's parameters and buffers in place under ``torch.no_grad()``, and
reports the version to the hub so lag shows in ``rlhub sync status``.
:mod:`rlhub.torchrl` puts it inside TorchRL collectors (a ``WeightSyncScheme``,
and ``RlhubWeightUpdater`` for the older API, still importable from here).

The package's modules: ``_source`` (:class:`WeightVersion`, :class:`Source`),
``_shm`` (the shared-memory protocol and :class:`ShmSource`), ``_push``
(:class:`PushSource`), ``_storesource`` (:class:`StoreSource`),
``_failover`` (:class:`FailoverSource`), ``_report`` (:func:`report`,
:func:`status`) and ``_receiver`` (torch copies and :class:`Receiver`).
Import the public names from ``rlhub.wsync``; the modules are private.
"""

from __future__ import annotations

from typing import Any

from rlhub._crc32c import crc32c as crc32c  # scripts/bench_python_shm.py reports its backend
from rlhub.wsync._dataplane import DataPlaneSource
from rlhub.wsync._failover import Dialer, FailoverSource
from rlhub.wsync._push import PushSource
from rlhub.wsync._receiver import Receiver
from rlhub.wsync._receiver import _targets as _targets  # rlhub.ray
from rlhub.wsync._receiver import copy_into as copy_into
from rlhub.wsync._report import report, status
from rlhub.wsync._shm import ShmSource
from rlhub.wsync._source import Source, WeightVersion, default_shm_path
from rlhub.wsync._storesource import StoreSource

__all__ = [
    "WeightVersion", "Source", "ShmSource", "PushSource", "DataPlaneSource", "StoreSource", "FailoverSource", "Dialer",
    "Receiver",
    "default_shm_path", "report", "status",
]

# --------------------------------------------------------------------------
# TorchRL: RlhubWeightUpdater lives in rlhub.torchrl (it subclasses torchrl's
# WeightUpdaterBase, so it needs torchrl); the old import path still works.

def __getattr__(name: str) -> Any:
    if name == "RlhubWeightUpdater":
        from rlhub.torchrl import RlhubWeightUpdater

        return RlhubWeightUpdater
    raise AttributeError(f"module 'rlhub.wsync' has no attribute {name!r}")
