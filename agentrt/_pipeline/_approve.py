"""Approval before a tool runs, over the `Turn`: which calls wait, how the turn is stored while they
wait, and how it goes on with a human's decisions.

    tool round → gate: the calls that need approval wait; the others run now
               → Phase.APPROVAL: the turn is saved (a checkpoint) with its conversation, the lock
                 released, `ApprovalRequested` ends the stream
    resume     → the conversation locked again, the pending record checked and claimed (taken from
                 the store, so a second resume finds nothing), the approved calls run, denials
                 become tool results, and the round ends as any other

The record lives in the memory's store (`save_pending` / `load_pending` / `take_pending`), keyed by
the conversation, so any worker sharing the store can resume it; a service without memory keeps its
records in this process.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.lowlevel
import orjson
from pydantic import TypeAdapter, ValidationError

from .._approval import Approve, Deny
from .._errors import ApprovalDecisionError, ApprovalPendingError, ConfigurationError
from .._events import ApprovalRequested, PendingCall, ToolExecution, ToolOutcome
from .._messages import (
    AssistantMessage,
    ChatMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    _dumps,
    _loads,
)
from ..memory._memory import complete
from ..memory._store import PendingStore

if TYPE_CHECKING:
    from ._turn import Turn

__all__ = [
    "CLAIMED",
    "EXPIRED",
    "Record",
    "Waiting",
    "claim",
    "gate",
    "pending_on_open",
    "record_of",
    "resolve",
    "store_of",
    "suspend",
]

logger = logging.getLogger("agentrt")

RECORD_VERSION: Final = 1

_now = time.time
"""Wall-clock seconds: expiry is compared across processes and hosts (tests replace it)."""

CLAIMED: Final[ContextVar[bool]] = ContextVar("agentrt_claimed", default=False)
"""Set by a durable turn (`agentrt.durable`) while it runs again a resumed round whose first run died
after it had claimed the pending record (taken it from the store): `claim` takes nothing then."""

EXPIRED: Final = "the approval request expired before anyone decided"
NEW_MESSAGE: Final = "the user sent a new message instead of deciding"


@dataclass(slots=True)
class Waiting:
    """A tool round stopped for approval: the run's id, when it expires (seconds since the epoch),
    the calls that wait (with their position in the round), and the executions of the round's other
    calls, by position (`None` where a call waits)."""

    run_id: str
    expires_at: float | None
    calls: list[tuple[int, PendingCall]]
    done: list[ToolExecution | None]


@dataclass(frozen=True, slots=True)
class Record:
    """A pending turn as its store keeps it."""

    run_id: str
    method: str
    memory_id: Any
    expires_at: float | None
    calls: tuple[PendingCall, ...]
    checkpoint: dict[str, Any]

    def event(self, invocation_id: str, memory_id: Any) -> ApprovalRequested:
        """The record's event; `memory_id` as the method takes it (the record keeps its JSON)."""
        return ApprovalRequested(
            invocation_id, self.run_id, self.method, memory_id, self.calls, self.expires_at
        )

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and _now() >= self.expires_at


# --- declaring ------------------------------------------------------------------------------------


def _rule(turn: Turn, name: str) -> Any:
    approvals = turn.plan.approvals
    assert approvals is not None
    rule = approvals.needs_approval.get(name)
    if rule is None:
        definition = turn.tools.get(name)
        rule = definition.needs_approval if definition is not None else False
    return rule


async def gate(
    turn: Turn, calls: tuple[ToolCall, ...]
) -> tuple[dict[int, PendingCall], dict[int, ToolExecution]]:
    """The calls of a round (just begun) that wait for approval, by position, and the executions of
    those whose approval check raised (refused: never run, the model is told). A call whose
    arguments do not validate does not wait: it fails validation when it runs, without running."""
    loop = turn.loop
    assert loop is not None
    waiting: dict[int, PendingCall] = {}
    refused: dict[int, ToolExecution] = {}
    for position, call in enumerate(calls):
        rule = _rule(turn, call.name)
        if rule is False:
            continue
        definition = turn.tools.get(call.name)
        if definition is None:
            continue  # an unknown tool: reported as such, nothing runs
        try:
            arguments = definition.arguments.model_validate_json(call.arguments or "{}")
        except ValidationError:
            continue  # fails closed where it runs: invalid arguments, reported, nothing runs
        if rule is not True:
            values = {param: getattr(arguments, field) for field, param in definition.fields}
            try:
                needed = rule(values, loop.context(call, loop.rounds))
                if inspect.isawaitable(needed):
                    needed = await needed
                if not isinstance(needed, bool):
                    raise TypeError(f"the approval predicate returned {type(needed).__name__}, not a bool")
            except Exception as error:
                text = (
                    f"Error: tool {call.name!r} was not run: whether it needs approval could not be "
                    f"decided ({type(error).__name__})."
                )
                refused[position] = loop.not_run(call, ToolOutcome.ERROR, text, type(error).__name__)
                continue
            if not needed:
                continue
        data = arguments.model_dump(mode="json", by_alias=True)
        waiting[position] = PendingCall(call.id, call.name, data)
    if waiting:
        _unique_ids(waiting)
    return waiting, refused


def _unique_ids(waiting: dict[int, PendingCall]) -> None:
    """A decision names one call: calls that share an id (some servers repeat them) wait as
    `id`, `id#2`, `id#3`, ... in the response's order."""
    seen: dict[str, int] = {}
    for position, pending in sorted(waiting.items()):
        count = seen[pending.id] = seen.get(pending.id, 0) + 1
        if count > 1:
            waiting[position] = replace(pending, id=f"{pending.id}#{count}")


# --- the store ------------------------------------------------------------------------------------


def check_store(turn: Turn) -> None:
    """`ConfigurationError` when the turn could not wait: its memory's store keeps no pending
    turns (possible only with tools from a tool provider: `build` refuses the others)."""
    conversation = turn.conversation
    store = conversation.memory.store if conversation is not None else None
    if store is not None and not isinstance(store, PendingStore):
        raise ConfigurationError(
            f"{turn.spec.qualname}: a tool call needs approval, but memory store {store!r} "
            "keeps no pending turns (save_pending, load_pending, take_pending: see "
            "agentrt.memory.PendingStore)"
        )


def store_of(turn: Turn) -> tuple[PendingStore, str, str | None]:
    """Where the turn's pending record lives: the conversation's store and key (and the lock's
    owner), or this process's store of a service without memory."""
    conversation = turn.conversation
    if conversation is not None:
        store = conversation.memory.store
        if not isinstance(store, PendingStore):
            raise ConfigurationError(
                f"{turn.spec.qualname}: a tool call needs approval, but memory store {store!r} keeps no "
                "pending turns (save_pending, load_pending, take_pending: see agentrt.memory.PendingStore)"
            )
        return store, conversation.key, conversation.owner
    pending = turn.runtime.pending
    if pending is None:
        raise ConfigurationError(f"{turn.spec.qualname}: this service keeps no pending approvals")
    waiting = turn.waiting
    assert waiting is not None
    return pending, f"run:{waiting.run_id}", None


def encode(record: Record) -> bytes:
    return _dumps(
        {
            "version": RECORD_VERSION,
            "run": record.run_id,
            "method": record.method,
            "memory_id": record.memory_id,
            "expires_at": record.expires_at,
            "calls": [{"id": c.id, "tool": c.tool, "arguments": c.arguments} for c in record.calls],
            "checkpoint": record.checkpoint,
        }
    )


def record_of(data: bytes) -> Record:
    """A stored record; `ValueError` for one this version cannot read."""
    raw = _loads(data)
    if not isinstance(raw, dict) or raw.get("version") != RECORD_VERSION:
        raise ValueError("a pending approval record of another version")
    calls = tuple(PendingCall(str(c["id"]), str(c["tool"]), dict(c["arguments"])) for c in raw["calls"])
    expires = raw["expires_at"]
    return Record(str(raw["run"]), str(raw["method"]), raw["memory_id"], expires, calls, raw["checkpoint"])


async def suspend(turn: Turn) -> ApprovalRequested:
    """Store the waiting turn with its conversation and release the conversation. A cancellation
    that arrives meanwhile leaves nothing stored."""
    from . import _checkpoint  # (which saves `Waiting`)

    waiting = turn.waiting
    assert waiting is not None
    turn.at_boundary = True
    try:
        checkpoint = _checkpoint.dump(turn)
    finally:
        turn.at_boundary = False
    calls = tuple(call for _, call in waiting.calls)
    record = Record(
        waiting.run_id, turn.spec.qualname, checkpoint["memory_id"], waiting.expires_at, calls, checkpoint
    )
    store, key, owner = store_of(turn)
    data = encode(record)
    try:
        await complete(store.save_pending(key, waiting.run_id, data, owner=owner))
        await anyio.lowlevel.checkpoint_if_cancelled()  # cancelled meanwhile: not stored after all
    except BaseException:
        # Cancelled once the write was done (or it failed): take it back, so nothing is stored.
        with anyio.CancelScope(shield=True):
            try:
                await complete(store.take_pending(key, waiting.run_id, owner=owner))
            except Exception:
                logger.warning("could not take back pending run %r", waiting.run_id, exc_info=True)
        raise
    conversation = turn.conversation
    if conversation is not None:
        with anyio.CancelScope(shield=True):
            await conversation.release()
    return replace(record.event(turn.id, turn.memory_id), partial=turn.partial())


# --- resuming -------------------------------------------------------------------------------------


def check_decided(decisions: Mapping[Any, object], pending: set[str], where: str) -> None:
    """`ApprovalDecisionError` unless `decisions` are keyed by the pending calls' ids, one each."""
    if not all(isinstance(key, str) for key in decisions):
        raise ApprovalDecisionError(f"{where}: decisions are keyed by the pending calls' ids (strings)")
    unknown = sorted(set(decisions) - pending)
    if unknown:
        raise ApprovalDecisionError(f"{where}: decisions name calls that are not pending: {unknown}")
    missing = sorted(pending - set(decisions))
    if missing:
        raise ApprovalDecisionError(
            f"{where}: no decision for pending call(s) {missing}; decide on every one"
        )


def resolve(turn: Turn) -> tuple[list[tuple[int, ToolCall]], dict[int, ToolExecution]]:
    """Check the resumed turn's decisions against its waiting calls: the approved calls (with any
    edited arguments) by position, and the denied ones' executions. `ApprovalDecisionError` for
    decisions that do not fit (nothing is recorded then); an expired approval denies every call."""
    waiting, decisions = turn.waiting, turn.decisions
    assert waiting is not None
    assert decisions is not None
    response = turn.response
    loop = turn.loop
    assert response is not None
    assert loop is not None
    calls = response.message.tool_calls
    where = turn.spec.qualname
    expired = waiting.expires_at is not None and _now() >= waiting.expires_at
    if expired:
        decisions = {pending.id: Deny(EXPIRED) for _, pending in waiting.calls}
    check_decided(decisions, {pending.id for _, pending in waiting.calls}, where)
    approved: list[tuple[int, ToolCall]] = []
    denied: list[tuple[int, ToolCall, str]] = []
    for position, pending in waiting.calls:
        decision = decisions[pending.id]
        call = calls[position]
        if isinstance(decision, Deny):
            reason = decision.reason
            if reason is not None and not isinstance(reason, str):
                raise ApprovalDecisionError(f"{where}: the reason to deny call {pending.id!r} is not text")
            text = f"The user denied this call of {call.name!r}; it was not run."
            denied.append((position, call, f"{text} Reason: {reason}" if reason else text))
        elif isinstance(decision, Approve):
            if turn.tools.get(call.name) is None:
                raise ApprovalDecisionError(
                    f"{where}: call {pending.id!r} is of tool {call.name!r}, which this service no longer "
                    "has: it cannot run; deny it"
                )
            if decision.arguments is not None:
                call = _edited(turn, call, decision.arguments)
            approved.append((position, call))
        else:
            raise ApprovalDecisionError(
                f"{where}: the decision on call {pending.id!r} is {decision!r}, not Approve() or Deny()"
            )
    if any(calls[position] is not call for position, call in approved):
        _rewrite_calls(turn, dict(approved))
    executions = {
        position: loop.not_run(call, ToolOutcome.DENIED, text, None) for position, call, text in denied
    }
    return approved, executions


def _edited(turn: Turn, call: ToolCall, arguments: Mapping[str, Any]) -> ToolCall:
    """The call with edited arguments, validated against its tool's schema."""
    where = turn.spec.qualname
    definition = turn.tools.get(call.name)
    if definition is None:  # pragma: no cover - a waiting call's tool is known
        raise ApprovalDecisionError(f"{where}: call {call.id!r} names no tool of this turn")
    if not isinstance(arguments, Mapping):
        raise ApprovalDecisionError(f"{where}: edited arguments of call {call.id!r} must be a mapping")
    try:
        # As JSON, as the model's arguments are: what JSON cannot carry (an object) is refused here,
        # before anything is claimed, and so is NaN (null in JSON), not when the tool is called.
        validated = definition.arguments.model_validate_json(orjson.dumps(dict(arguments)))
    except TypeError as error:
        raise ApprovalDecisionError(
            f"{where}: the edited arguments of call {call.id!r} ({call.name}) are not JSON: {error}"
        ) from None
    except ValidationError as error:
        detail = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}"
            for e in error.errors(include_url=False, include_input=False)
        )
        raise ApprovalDecisionError(
            f"{where}: the edited arguments of call {call.id!r} ({call.name}) do not validate: {detail}"
        ) from None
    return call.model_copy(update={"arguments": validated.model_dump_json(by_alias=True)})


def _rewrite_calls(turn: Turn, edited: Mapping[int, ToolCall]) -> None:
    """The response's calls as they run (edited): what the exchange stores and the model is sent."""
    response = turn.response
    assert response is not None
    message = response.message
    calls = tuple(edited.get(position, call) for position, call in enumerate(message.tool_calls))
    rewritten = message.model_copy(update={"tool_calls": calls})
    turn.response = replace(response, message=rewritten)
    since = turn.since_sent
    if since and since[-1] == message:  # (a restored turn's is an equal copy)
        since[-1] = rewritten


async def claim(turn: Turn) -> None:
    """Take the turn's record from the store, so that no other resume finds it: `ApprovalNotFound
    Error` when someone took it first."""
    from .._errors import ApprovalNotFoundError

    if CLAIMED.get():
        return
    waiting = turn.waiting
    assert waiting is not None
    store, key, owner = store_of(turn)
    try:
        taken = await complete(store.take_pending(key, waiting.run_id, owner=owner))
        await anyio.lowlevel.checkpoint_if_cancelled()  # cancelled meanwhile: nothing ran, so undo
    except BaseException:
        # Cancelled once the take was done (or it failed): nothing ran, so put the record back
        # (the conversation is still locked: nobody else took it meanwhile).
        record = turn.record
        if record is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await complete(store.save_pending(key, waiting.run_id, record, owner=owner))
                except Exception:
                    logger.warning("could not put back pending run %r", waiting.run_id, exc_info=True)
        raise
    if taken is None:
        raise ApprovalNotFoundError(
            f"{turn.spec.qualname}: run {waiting.run_id!r} is no longer pending (resumed by someone else)"
        )


# --- a new turn on a conversation with a pending one ----------------------------------------------

_MESSAGES: TypeAdapter[list[ChatMessage]] | None = None


def _messages_adapter() -> TypeAdapter[list[ChatMessage]]:
    global _MESSAGES
    if _MESSAGES is None:
        _MESSAGES = TypeAdapter(list[ChatMessage])
    return _MESSAGES


def denied_turn(record: Record, reason: str) -> list[ChatMessage]:
    """What a pending turn stores when its calls are denied without resuming it: the user's message,
    the exchange so far, the response that asked for the calls, and each call's result (the ones that
    ran, and a denial for each waiting one)."""
    saved = record.checkpoint
    adapter = _messages_adapter()
    user = adapter.validate_python([saved["user"]])[0]
    exchange = adapter.validate_python(saved["exchange"])
    message = adapter.validate_python([saved["response"]["message"]])[0]
    if not isinstance(user, UserMessage) or not isinstance(message, AssistantMessage):
        raise ValueError("a pending record without its user message or response")
    done = saved["waiting"]["done"]
    results: list[ChatMessage] = []
    for position, call in enumerate(message.tool_calls):
        execution = done[position]
        if execution is None:
            text = f"The user denied this call of {call.name!r}; it was not run. Reason: {reason}"
            results.append(
                ToolResultMessage(tool_call_id=call.id, tool_name=call.name, text=text, is_error=True)
            )
        else:
            results.append(
                ToolResultMessage(
                    tool_call_id=call.id,
                    tool_name=call.name,
                    text=str(execution["result"]),
                    is_error=execution["outcome"] != ToolOutcome.SUCCESS.value,
                    images=execution.get("images") or (),  # (as JSON: validated into ImageContent)
                )
            )
    return [user, *exchange, message, *results]


async def pending_on_open(turn: Turn) -> None:
    """A new turn opened a conversation: if a turn on it waits for approval, refuse (the default
    policy), or deny its calls, store it so, and go on (`while_pending="deny"`, or it expired)."""
    conversation = turn.conversation
    assert conversation is not None
    store = conversation.memory.store
    assert isinstance(store, PendingStore)  # (`Runtime.gates`)
    found = await store.load_pending(conversation.key)
    if found is None:
        return
    run_id, data = found
    record = record_of(data)
    approvals = turn.plan.approvals or turn.runtime.while_pending
    policy = approvals.while_pending if approvals is not None else "refuse"
    expired = record.expired
    if policy == "refuse" and not expired:
        raise ApprovalPendingError(
            f"{turn.spec.qualname}: conversation {turn.memory_id!r} has a turn waiting for approval "
            f"(run {run_id!r}, {record.method}); resume it first with agentrt.resume(...)",
            approval=record.event(str(record.checkpoint.get("id", "")), turn.memory_id),
        )
    messages = denied_turn(record, EXPIRED if expired else NEW_MESSAGE)
    taken = await complete(store.take_pending(conversation.key, run_id, owner=conversation.owner))
    if taken is not None:
        await conversation.commit(messages)


def new_waiting(turn: Turn, waiting: Mapping[int, PendingCall], done: list[ToolExecution | None]) -> Waiting:
    """The state of a round stopped for approval."""
    approvals = turn.plan.approvals
    assert approvals is not None
    expires = approvals.expires_after
    return Waiting(
        run_id=os.urandom(16).hex(),
        expires_at=_now() + expires if expires is not None else None,
        calls=sorted(waiting.items()),
        done=done,
    )
