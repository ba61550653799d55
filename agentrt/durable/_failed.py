"""A failed durable turn read back: DBOS records its error as JSON (its type's name and its message,
never pickled), and here it becomes an agentrt error again.

The name of one of agentrt's public errors (those `agentrt` exports) gives that class, made without
its `__init__`: its message is the recorded one (`str()` as the original's), its other attributes
(`partial`, `status`, `tool`, ...) are their defaults or `None`, not recorded; a note says so. Any
other name (a user's or a library's exception, a bug) gives `TurnFailedError`, which names it.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Final, TypeVar

from dbos import PortableWorkflowError, WorkflowStatusString
from dbos import error as dbos_errors

import agentrt

from .._errors import AgentError

if TYPE_CHECKING:
    from collections.abc import Awaitable

__all__ = ["FAILED", "TurnFailedError", "raised", "rebuilt"]

T = TypeVar("T")

FAILED: Final = frozenset(
    {
        WorkflowStatusString.ERROR.value,
        WorkflowStatusString.MAX_RECOVERY_ATTEMPTS_EXCEEDED.value,
        WorkflowStatusString.CANCELLED.value,
    }
)
"""The statuses of a turn that failed (its error raised, given up, or cancelled through DBOS)."""


class TurnFailedError(AgentError):
    """A durable turn failed, with an error that is not one of agentrt's public errors (a tool's or
    a guardrail's own exception, a bug), or it was given up (recovered more than the engine's
    `max_recoveries` times), and it is read from the engine's records, not from the run that raised
    it: `turn_id`, the original error's type name `error_type` and its message `error_message`
    (the original itself was not kept: errors are recorded as JSON)."""

    def __init__(self, message: str, *, turn_id: str, error_type: str, error_message: str) -> None:
        super().__init__(message)
        self.turn_id = turn_id
        self.error_type = error_type
        self.error_message = error_message

    @classmethod
    def of(cls, turn_id: str, error_type: str, error_message: str) -> TurnFailedError:
        return cls(
            f"{_prefix(turn_id)}{error_type}: {error_message}",
            turn_id=turn_id,
            error_type=error_type,
            error_message=error_message,
        )


def _prefix(turn_id: str) -> str:
    return f"durable turn {turn_id!r} failed with "


def _public() -> dict[str, type[AgentError]]:
    found: dict[str, type[AgentError]] = {}
    for name in agentrt.__all__:
        value = getattr(agentrt, name, None)
        if isinstance(value, type) and issubclass(value, AgentError):
            found[name] = value
    return found


_PUBLIC: Final = _public()
"""agentrt's public errors by name (its top-level exports)."""

_ABSENT: Final = (inspect.Parameter.empty,)


def _fields(cls: type[AgentError]) -> dict[str, object]:
    """The attributes `cls.__init__` sets from its parameters other than the message (by the
    parameters' names, as every agentrt error does), each with its default, `None` without one."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return {
        p.name: None if p.default in _ABSENT else p.default
        for p in parameters
        if p.name != "message" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def rebuilt(turn_id: str, name: str, message: str) -> AgentError:
    """The error the turn `turn_id` failed with, from its recorded type name and message."""
    if name == TurnFailedError.__name__ and message.startswith(_prefix(turn_id)):
        # Raised by the turn's own workflow (a failed step read back while it replayed): unwrapped.
        name, _, message = message[len(_prefix(turn_id)) :].partition(": ")
    cls = _PUBLIC.get(name)
    if cls is None:
        return TurnFailedError.of(turn_id, name, message)
    error = cls.__new__(cls)
    error.args = (message,)
    for field, default in _fields(cls).items():
        setattr(error, field, default)
    if isinstance(error, agentrt.ModelError):
        error.message = message  # its `str()` adds status and endpoint, which the message has already
    error.add_note(
        f"agentrt.durable: read from the records of turn {turn_id!r}, which keep the error's type "
        "and message only (its other attributes are not recorded)"
    )
    return error


async def raised(turn_id: str, result: Awaitable[T]) -> T:
    """`result` (a DBOS handle's `get_result()` of the turn `turn_id`), its error raised as
    agentrt's: read from its record (JSON, never unpickled), or the turn given up."""
    try:
        return await result
    except PortableWorkflowError as error:
        raise rebuilt(turn_id, error.name, error.message) from None
    except dbos_errors.DBOSAwaitedWorkflowMaxRecoveryAttemptsExceeded:
        message = "given up: its workers died in it more often than max_recoveries lets it be recovered"
        raise TurnFailedError.of(turn_id, "MaxRecoveriesExceeded", message) from None
    except dbos_errors.DBOSAwaitedWorkflowCancelledError:
        message = "cancelled (through DBOS: `DBOS.cancel_workflow`) before it ended"
        raise TurnFailedError.of(turn_id, "Cancelled", message) from None
