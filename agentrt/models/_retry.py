"""Retrying a model request before its response started: the policy, and its tenacity machinery.

Only failures that happen before a response was accepted are retried: failures to connect (and a
pooled connection the server dropped before answering), and the statuses 408, 409, 429, 5xx and 529,
unless the server says `x-should-retry: false` or the 429 is an exhausted quota (`insufficient_quota`).
A read timeout is not retried: the model may still be generating, at the user's expense. A
`retry-after` (or `retry-after-ms`) header is honoured on those statuses only, so a `retry-after` on a
successful response never delays anything. Once a 2xx response is accepted, its chunks may already be
in the caller's hands, so nothing after that point is retried: a repeat could duplicate text. Sleeps use
`anyio.sleep`, so virtual clocks apply on asyncio and trio.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import tenacity

from .._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._errors import ModelError

__all__ = ["RetryPolicy", "Retryable"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How failed requests are retried before a response started.

    - `max_attempts`: attempts in all, the first included (`1` disables retries).
    - `initial_delay`, `max_delay`: exponential backoff (`initial_delay * 2**(retry - 1)`), each wait capped
      at `max_delay` and scaled by a random factor in `[1 - jitter, 1]`.
    - `max_total_wait`: the sum of all waits of one request never exceeds this; a retry that would
      exceed it is not made.
    - `max_retry_after`: a server asking (with `retry-after`) for a longer wait than this is not retried;
      a shorter request is honoured exactly, instead of the backoff.
    """

    max_attempts: int = 3
    initial_delay: float = 0.5
    max_delay: float = 8.0
    jitter: float = 0.25
    max_total_wait: float = 60.0
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(f"RetryPolicy.max_attempts must be at least 1, got {self.max_attempts}")
        for name in ("initial_delay", "max_delay", "max_total_wait", "max_retry_after"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"RetryPolicy.{name} must not be negative")
        if not 0 <= self.jitter <= 1:
            raise ConfigurationError(f"RetryPolicy.jitter must be between 0 and 1, got {self.jitter}")

    @classmethod
    def never(cls) -> RetryPolicy:
        """A policy that makes one attempt only."""
        return cls(max_attempts=1)

    @staticmethod
    def retries_status(status: int) -> bool:
        """Whether a response with this status is worth another attempt."""
        return status in (408, 409, 429) or status >= 500

    def backoff(self, retry: int) -> float:
        """The wait before retry number `retry` (1 for the first retry) when the server named none."""
        base = min(self.max_delay, self.initial_delay * 2.0 ** min(retry - 1, 60))
        return base * (1 - self.jitter * random.random())

    def retrying(
        self, before_sleep: Callable[[tenacity.RetryCallState], None], deadline: float | None = None
    ) -> tenacity.AsyncRetrying:
        """A fresh tenacity controller for one request (tenacity keeps per-call state on it).

        With a `deadline` (on the async backend's clock), a retry whose wait would end past it is not
        made: the failure is raised at once instead of sleeping into a call that cannot finish.
        """
        stop = self._stop
        if deadline is not None:

            def stop(state: tenacity.RetryCallState) -> bool:
                return self._stop(state) or anyio.current_time() + state.upcoming_sleep >= deadline

        return tenacity.AsyncRetrying(
            sleep=anyio.sleep,
            stop=stop,
            wait=self._wait,
            retry=tenacity.retry_if_exception_type(Retryable),
            before_sleep=before_sleep,
            reraise=True,
        )

    def _wait(self, state: tenacity.RetryCallState) -> float:
        failure = state.outcome.exception() if state.outcome is not None else None
        if isinstance(failure, Retryable) and failure.retry_after is not None:
            return float(failure.retry_after)
        return self.backoff(state.attempt_number)

    def _stop(self, state: tenacity.RetryCallState) -> bool:
        if state.attempt_number >= self.max_attempts:
            return True
        failure = state.outcome.exception() if state.outcome is not None else None
        if isinstance(failure, Retryable) and (failure.retry_after or 0) > self.max_retry_after:
            return True
        return state.idle_for + state.upcoming_sleep > self.max_total_wait


class Retryable(Exception):
    """Carries a retryable failure through tenacity; the caller raises `error` when retries end."""

    def __init__(self, error: ModelError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after
