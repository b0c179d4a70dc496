"""Store pull / watch as a weight source. Part of :mod:`rlhub.wsync`."""

from __future__ import annotations

from typing import Any, Optional

from rlhub import errors
from rlhub.store import StoreClient, _new_life
from rlhub.wsync._source import WeightVersion

class StoreSource:
    """Pulls "only if newer" from the model store (``Pull`` with
    ``if_newer_than``) and waits with ``Watch``.

    It follows the model's lives (``follows_lives``; docs/weight-sync.md,
    "Lives"): given ``life``, the life of ``than`` / ``after``, it also
    returns the newest version of another life (the model deleted and
    pushed again), though not newer. ``wait_newer`` asks the hub's watch
    for it; ``get_if_newer`` learns it from the "not modified" answer
    (:meth:`rlhub.StoreClient.pull` with ``life``)."""

    via = "pull"
    follows_lives = True

    def __init__(self, store: Any, model: str):
        """``store`` is a hub address or a :class:`rlhub.StoreClient`."""
        self._own = isinstance(store, str)
        self.store: StoreClient = StoreClient(store) if self._own else store
        self.model = model

    def _wv(self, v: Any) -> Optional[WeightVersion]:
        if v is None:
            return None
        return WeightVersion(v.name, v.version, v.epoch, v.blob, self.via, life=v.life)

    def get_if_newer(self, than: int, life: int = 0) -> Optional[WeightVersion]:
        """The newest version if newer than ``than`` or of another life
        than ``life`` ("not modified": None). A model that does not exist
        yet counts as nothing newer."""
        try:
            return self._wv(self.store.pull(self.model, if_newer_than=than, life=life))
        except errors.NotFound:
            return None

    def wait_newer(self, after: int, timeout: Optional[float] = None, life: int = 0) -> Optional[WeightVersion]:
        """Watches the model until a version newer than ``after``, or of
        another life than ``life``, lands."""
        try:
            for v in self.store.watch(self.model, after=after, timeout=timeout, life=life):
                if v.version > after or _new_life(v.life, life):
                    return self._wv(v)
        except errors.DeadlineExceeded:
            return None
        return None

    def close(self) -> None:
        """Closes the store client if this source opened it."""
        if self._own:
            self.store.close()
