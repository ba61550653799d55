"""`agentrt.resume`: go on with a turn that stopped for a human's approval."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
import orjson

from ._errors import ApprovalDecisionError, ApprovalNotFoundError
from ._pipeline import Invocation
from ._pipeline._approve import record_of
from ._pipeline._turn import Phase
from ._service import runtime_of
from .memory._memory import DEFAULT_MEMORY_ID
from .memory._store import PendingStore

if TYPE_CHECKING:
    from ._approval import Decision

__all__ = ["reopen", "resume"]


async def resume(
    service: object, run_id: str, decisions: Mapping[str, Decision], /, *, memory_id: Any = DEFAULT_MEMORY_ID
) -> Any:
    """Go on with the turn `run_id` of `service` (an `ApprovalRequested`'s), which waits for a human's
    decision on its tool calls: `decisions` maps each pending call's id to `Approve()`,
    `Approve(arguments={...})` or `Deny(reason)`. Gives what the method gives (its value, its
    `Result`, or its stream), as if the turn had never stopped: the approved calls run once, the model
    is asked again, and the turn is stored whole at its end.

    `memory_id` names the conversation the turn is on (the method's memory id; the default
    conversation for a method without one): a run is found only on its own conversation. Raises
    `ApprovalNotFoundError` for a run that is not pending there (resumed already, replaced, another
    conversation's), `ApprovalDecisionError` for decisions that do not fit its calls (nothing runs,
    it still waits). Time spent waiting does not count against the turn's time budget.
    """
    runtime = runtime_of(service)
    if runtime is None:
        raise TypeError(f"agentrt.resume: {service!r} is not a service made by agentrt.build")
    where = f"{type(service).__qualname__}: resume"
    if not isinstance(run_id, str) or not run_id:
        raise ApprovalNotFoundError(f"{where}: run id {run_id!r} is not a run id")
    if not isinstance(decisions, Mapping):
        raise ApprovalDecisionError(f"{where}: decisions must map pending call ids to Approve() or Deny()")
    method, invocation = await reopen(service, runtime, run_id, decisions, memory_id, where)
    return await method.__agentrt_view__(invocation)


async def reopen(
    service: object, runtime: Any, run_id: str, decisions: Mapping[str, Decision], memory_id: Any, where: str
) -> tuple[Any, Invocation]:
    """The built method and the invocation of the turn `run_id`, which waits for approval on
    conversation `memory_id`, restored from its pending record with `decisions`, its conversation
    locked again and the record checked once more under the lock: what `resume` reads on (and a
    durable turn's next segment, `agentrt.durable`). `ApprovalNotFoundError` for a run not pending
    there; the decisions are checked when the turn goes on (`ApprovalDecisionError`)."""
    memory = runtime.memory
    store: object
    if memory is not None:
        store, key = memory.store, memory.key(memory_id, where)
    else:
        store, key = runtime.pending, f"run:{run_id}"
    not_found = ApprovalNotFoundError(
        f"{where}: no turn waits for approval as run {run_id!r} on conversation {memory_id!r} "
        "(resumed already, replaced by a newer turn, or another conversation's)"
    )
    # A first look, unlocked: the turn's own deadline bounds the wait for its conversation.
    found = await store.load_pending(key) if isinstance(store, PendingStore) else None
    if found is None or found[0] != run_id:
        raise not_found
    record = record_of(found[1])
    if memory is None and _json(record.memory_id) != _json(memory_id):
        raise not_found  # (with memory, the key is the conversation's)
    method = _method(service, record.method)
    if method is None:
        raise ApprovalNotFoundError(
            f"{where}: run {run_id!r} is of {record.method}, which this service has not"
        )
    invocation = Invocation.restore(runtime, method.__agentrt_spec__, record.checkpoint)
    turn = invocation._turn
    if turn.phase is not Phase.APPROVAL or turn.waiting is None or turn.waiting.run_id != run_id:
        raise ApprovalNotFoundError(f"{where}: run {run_id!r} is not a turn waiting for approval")
    turn.decisions = dict(decisions)
    turn.record = found[1]
    if memory is not None:
        if turn.resume_from is not None:
            turn.resume_clock()
        deadline = turn.deadline
        turn.opening = True
        with anyio.CancelScope(deadline=math.inf if deadline is None else deadline) as scope:
            conversation = await memory.open(memory_id, where)
        if scope.cancelled_caught:
            raise turn.exceeded("seconds")  # (while `opening`: the conversation was busy)
        turn.opening = False
        try:
            assert isinstance(store, PendingStore)
            again = await store.load_pending(key)  # locked now: still this run?
            if again is None or again[0] != run_id:
                raise not_found
        except BaseException:
            with anyio.CancelScope(shield=True):
                await conversation.release()
            raise
        turn.conversation = conversation
        turn.record = again[1]
    return method, invocation


def _json(memory_id: Any) -> bytes | None:
    """A memory id as JSON (a tuple as a list, a UUID as text), to compare with a record's."""
    try:
        return orjson.dumps(memory_id)
    except TypeError:
        return None


def _method(service: object, qualname: str) -> Any:
    """The built method whose spec is `qualname`'s, if the service has it."""
    for klass in type(service).__mro__:
        for value in vars(klass).values():
            spec = getattr(value, "__agentrt_spec__", None)
            if spec is not None and spec.qualname == qualname:
                return value
    return None
