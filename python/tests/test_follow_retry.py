"""The one back-off loop of calls that follow a cluster's primary
(``_channel.retry_following``), used by unary calls on a cluster target and
by ``AggregatorClient.learn``: what is tried again, how often, and what is
raised when the tries or the deadline run out."""

from __future__ import annotations

import time
from typing import List

import grpc
import pytest

from rlhub import _channel


class _Err(grpc.RpcError):
    def __init__(self, n: int) -> None:
        super().__init__(f"attempt {n}")
        self.n = n

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


class _GaveUp(Exception):
    pass


def _run(fail_times: int, how, deadline: float = 60.0) -> List[float]:
    """Runs retry_following over an attempt that fails ``fail_times``
    times; returns the seconds left each attempt was given."""
    lefts: List[float] = []

    def attempt(left: float) -> str:
        lefts.append(left)
        if len(lefts) <= fail_times:
            raise _Err(len(lefts))
        return "ok"

    assert _channel.retry_following(time.monotonic() + deadline, attempt, how, lambda e: _GaveUp(str(e))) == "ok"
    return lefts


def test_retried_until_it_answers_within_the_attempts():
    lefts = _run(3, lambda e: True)
    assert len(lefts) == 4
    assert all(0 < a <= 60.0 for a in lefts) and lefts == sorted(lefts, reverse=True)  # one shrinking budget


def test_an_error_not_to_retry_is_raised_at_once():
    with pytest.raises(_Err) as ei:
        _run(1, lambda e: None)
    assert ei.value.n == 1


@pytest.mark.parametrize("how", [True, False], ids=["after-backoff", "at-once"])
def test_the_attempts_run_out_into_give_up(how):
    n = []

    def attempt(left: float) -> str:
        n.append(1)
        raise _Err(len(n))

    with pytest.raises(_GaveUp) as ei:
        _channel.retry_following(time.monotonic() + 60, attempt, lambda e: how, lambda e: _GaveUp(str(e)))
    assert len(n) == _channel.MAX_FOLLOW_ATTEMPTS
    assert isinstance(ei.value.__cause__, _Err) and ei.value.__cause__.n == _channel.MAX_FOLLOW_ATTEMPTS


def test_no_attempt_starts_after_the_deadline():
    """A budget smaller than the first back-off: one attempt, then give_up
    (the back-off would end after the deadline)."""
    n = []

    def attempt(left: float) -> str:
        n.append(left)
        raise _Err(len(n))

    with pytest.raises(_GaveUp):
        _channel.retry_following(time.monotonic() + _channel._BACKOFF0 / 2, attempt, lambda e: True,
                                 lambda e: _GaveUp(str(e)))
    assert len(n) == 1


def test_give_up_may_hand_back_the_error_itself():
    def attempt(left: float) -> str:
        raise _Err(1)

    with pytest.raises(_Err):
        _channel.retry_following(time.monotonic() + 60, attempt, lambda e: False, lambda e: e)
