"""WeightVersion, the Source protocol and the conventional segment path. Part of :mod:`rlhub.wsync`."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Protocol

from rlhub.tensors import load_bytes

@dataclasses.dataclass
class WeightVersion:
    """One whole version of a model as a source delivered it.

    ``blob`` is its safetensors bytes. A :class:`ShmSource` reuses two private
    buffers, so its versions' blobs stay valid only until the second
    ``get_if_newer``/``wait_newer`` call after the one that returned them
    (copy, or apply with a :class:`Receiver`, to keep them longer); a leasing
    one's blob is a read-only view of the shared memory, whole until the
    source returns a newer version or closes (or its ``release()``). Other
    sources' blobs are the caller's.

    ``crc``, when not None, is a CRC-32C the blob has not been checked
    against yet: a leasing :class:`ShmSource` leaves the check to the one
    pass that copies the version into a module (:func:`copy_into` with
    ``crc=``, as :class:`Receiver` does), instead of reading the slot twice.
    :meth:`verify` checks it in place; :meth:`tensors` does so first.

    ``life`` is the version's life (docs/weight-sync.md, "Lives"; 0:
    unknown, as from shared memory or a hub that predates lives): a model
    deleted and pushed again from version 1 has another.
    """

    model: str
    version: int
    epoch: int
    blob: Any
    via: str
    crc: Optional[int] = None
    life: int = 0

    def verify(self) -> None:
        """Checks a pending CRC-32C (``crc``) over ``blob`` in place:
        :class:`rlhub.InvalidArgument` when it differs. Once it passed
        ``crc`` is None."""
        if self.crc is None:
            return
        from rlhub import errors
        from rlhub._crc32c import crc32c

        got = crc32c(self.blob)
        if got != self.crc:
            raise errors.InvalidArgument(
                f"model {self.model!r} v{self.version}: CRC-32C {got:08x}, the writer stored {self.crc:08x}")
        self.crc = None

    def tensors(self, framework: str = "numpy") -> Dict[str, Any]:
        """The state dict (numpy views over ``blob``, or torch tensors),
        after checking a pending CRC (:meth:`verify`)."""
        self.verify()
        return load_bytes(self.blob, framework=framework)


class Source(Protocol):
    """Where a receiver gets versions (the Go ``wsync.Source``).

    A source that follows the model's lives (the Go ``wsync.LifeSource``)
    has ``follows_lives`` true and takes ``life=`` in both methods: the
    life of ``than`` / ``after`` (0: unknown). It then also returns the
    newest version when that is of another life, though not newer: the
    model deleted and pushed again (docs/weight-sync.md, "Lives").
    :class:`StoreSource`, :class:`PushSource` and :class:`FailoverSource`
    do; a :class:`Receiver` passes its :attr:`Receiver.life` to them.
    """

    @property
    def via(self) -> str:
        """How versions arrive (``shm``, ``push``, ``pull`` …: the lag
        table's ``via``); a class attribute or a property."""

    def get_if_newer(self, than: int) -> Optional[WeightVersion]:
        """The newest version if newer than ``than``, else None (never blocks)."""

    def wait_newer(self, after: int, timeout: Optional[float] = None) -> Optional[WeightVersion]:
        """Blocks until a version newer than ``after`` exists (None on timeout)."""

    def close(self) -> None:
        """Releases the source. Safe to call twice."""


def default_shm_path(model: str) -> str:
    """The conventional segment of a model on this host (as ``rlhub relay``)."""
    return "/dev/shm/rlhub-" + model.replace("/", "_")
