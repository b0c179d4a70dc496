"""The attach loop a long-lived client stream shares: the Python learner
(``rlhub.Learner``) and the optimizer host (``rlhub.OptimizerHost``) each
hold one stream to the hub, serve on it until it breaks, and attach again.

Contract:
1. ``run()`` serves on the calling thread until ``stop()``: it calls
   ``_session()`` and, after any break, waits ``backoff`` seconds and calls
   it again.
2. A break whose code is permanent (:func:`rlhub.errors.is_permanent`:
   the request or the caller's identity is refused; a subclass may add
   its own, ``_permanent``) is not retried:
   ``run()`` raises it as the named exception, and ``error`` holds it.
3. ``start()`` (or ``with``) serves on a background thread this object
   owns; ``stop()`` cancels the stream in flight (``_call``) and joins the
   thread. A permanent break ends that thread the same way (``error``).
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Iterator, Optional, Tuple, TypeVar

import grpc

from rlhub import errors


_M = TypeVar("_M")


def outbox(first: _M) -> "Tuple[queue.Queue[Optional[_M]], Iterator[_M]]":
    """A session's outgoing messages: a queue whose first message is
    ``first``, and the request iterator a stream call reads from it; putting
    None ends the requests (the client's half-close)."""
    out: "queue.Queue[Optional[_M]]" = queue.Queue()
    out.put(first)

    def requests() -> Iterator[_M]:
        while True:
            m = out.get()
            if m is None:
                return
            yield m

    return out, requests()


class AttachLoop:
    """Base of an object serving one stream with re-attaches.

    Subclasses call ``_init_loop`` in ``__init__``, implement
    ``_session()`` (one attach: returns or raises when the stream ends) and
    keep the call in flight in ``_call`` (under ``_mu``) so that ``stop()``
    can cancel it.
    """

    _what: str  # "learner l1", "optimizer host pol": names the loop in logs and errors
    _log: logging.Logger
    backoff: float

    def _init_loop(self, what: str, thread_name: str, log: logging.Logger, backoff: float) -> None:
        self._what, self._thread_name, self._log, self.backoff = what, thread_name, log, backoff
        self._stop = threading.Event()
        self._mu = threading.Lock()  # guards _call, _thread
        self._call: Optional[Any] = None
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[errors.RlhubError] = None
        """The permanent refusal that ended serving, or None."""

    def _session(self) -> None:
        raise NotImplementedError

    def _permanent(self, e: BaseException) -> bool:
        """Whether a break ends serving instead of re-attaching."""
        return errors.is_permanent(e)

    def start(self) -> Any:
        """Serves on a background thread owned by this object."""
        with self._mu:
            if self._thread is not None:
                raise RuntimeError(f"{self._what} already started")
            self._thread = threading.Thread(target=self._serve_loop, name=self._thread_name, daemon=True)
            self._thread.start()
        return self

    def _serve_loop(self) -> None:
        try:
            self.run()
        except errors.RlhubError:
            pass  # kept in self.error, logged by run

    def stop(self, timeout: Optional[float] = 30.0) -> None:
        """Ends serving (a hook or step in progress finishes first) and joins
        the serving thread. Safe to call twice."""
        self._stop.set()
        with self._mu:
            call, th = self._call, self._thread
        if call is not None:
            call.cancel()
        if th is not None and th is not threading.current_thread():
            th.join(timeout)
            if th.is_alive():
                raise TimeoutError(f"{self._what}: serving thread did not end in {timeout}s")

    def run(self) -> None:
        """Attaches and serves until ``stop()``, re-attaching after each
        break but a permanent one, which it raises."""
        while not self._stop.is_set():
            try:
                self._session()
            except Exception as e:  # noqa: BLE001 - any break: log and re-attach, unless permanent
                if self._stop.is_set():
                    break
                if self._permanent(e):
                    err = errors.from_rpc_error(e) if isinstance(e, grpc.RpcError) else e
                    assert isinstance(err, errors.RlhubError)
                    self.error = err
                    self._log.error("%s: refused (%s); not re-attaching: a retry cannot change it",
                                    self._what, err)
                    raise err from e
                self._log.warning("%s: detached (%s); re-attaching in %.1fs", self._what, e, self.backoff)
            self._stop.wait(self.backoff)

    def __enter__(self) -> Any:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self.stop()
