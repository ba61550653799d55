"""A durable turn's approvals seen from outside it: what it waits for, and a human's decisions, as
JSON through DBOS (events and messages of the turn's workflow), for an `Engine` or a `Client`."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import orjson
import sqlalchemy
from dbos import DBOSClient
from dbos._serialization import DBOSPortableJSON

from .._approval import Approve, Deny
from .._errors import ApprovalDecisionError, ApprovalNotFoundError
from .._events import ApprovalRequested, PendingCall
from .._pipeline._approve import check_decided
from ._failed import FAILED, raised
from ._sqlite import SUBSEC_MISSING, SubsecConnection
from ._stream import KEY, DurableStream, checked

if TYPE_CHECKING:
    from .._approval import Decision

__all__ = ["TOPIC", "Client", "approval", "decide", "decisions_of", "waiting_json"]

TOPIC: Final = "agentrt.approval"
"""The topic of a human's decisions (`DBOS.send` / `DBOS.recv`) and the key of the approval a turn
waits for (`DBOS.set_event`: its JSON, or `None` once decided)."""


def waiting_json(approval: ApprovalRequested) -> dict[str, Any]:
    """What a durable turn publishes about the approval it waits for (JSON)."""
    return {
        "invocation_id": approval.invocation_id,
        "run_id": approval.run_id,
        "method": approval.method,
        "memory_id": orjson.loads(orjson.dumps(approval.memory_id, default=str)),
        "calls": [{"id": c.id, "tool": c.tool, "arguments": c.arguments} for c in approval.calls],
        "expires_at": approval.expires_at,
    }


def _decisions_json(decisions: Mapping[str, Decision], waiting: dict[str, Any], where: str) -> dict[str, Any]:
    """The decisions as JSON, checked against the calls that wait: one decision per call,
    `Approve()` (edited arguments a JSON object) or `Deny()` (a reason as text)."""
    if not isinstance(decisions, Mapping):
        raise ApprovalDecisionError(f"{where}: decisions must map pending call ids to Approve() or Deny()")
    check_decided(decisions, {call["id"] for call in waiting["calls"]}, where)
    data: dict[str, Any] = {}
    for call_id, decision in decisions.items():
        if isinstance(decision, Deny):
            if decision.reason is not None and not isinstance(decision.reason, str):
                raise ApprovalDecisionError(f"{where}: the reason to deny call {call_id!r} is not text")
            data[call_id] = {"deny": decision.reason}
        elif isinstance(decision, Approve):
            edited = decision.arguments
            if edited is not None:
                if not isinstance(edited, Mapping):
                    raise ApprovalDecisionError(
                        f"{where}: edited arguments of call {call_id!r} must be a mapping"
                    )
                try:
                    edited = orjson.loads(orjson.dumps(dict(edited)))
                except TypeError as error:
                    raise ApprovalDecisionError(
                        f"{where}: the edited arguments of call {call_id!r} are not JSON: {error}"
                    ) from None
            data[call_id] = {"approve": edited}
        else:
            raise ApprovalDecisionError(
                f"{where}: the decision on call {call_id!r} is {decision!r}, not Approve() or Deny()"
            )
    return data


def decisions_of(data: dict[str, Any]) -> dict[str, Decision]:
    return {
        call_id: Deny(one["deny"]) if "deny" in one else Approve(one["approve"])
        for call_id, one in data.items()
    }


_Status = Callable[[str], Awaitable["str | None"]]
_Event = Callable[[str, str, float], Awaitable[Any]]
_Send = Callable[[str, Any, str, str], Awaitable[None]]


async def approval(status: _Status, event: _Event, turn_id: str, wait: float) -> ApprovalRequested | None:
    if await status(turn_id) is None:
        raise ApprovalNotFoundError(f"agentrt.durable: no durable turn {turn_id!r}")
    waiting = await event(turn_id, TOPIC, wait)
    if waiting is None:
        return None
    calls = tuple(PendingCall(c["id"], c["tool"], c["arguments"]) for c in waiting["calls"])
    return ApprovalRequested(
        waiting["invocation_id"],
        waiting["run_id"],
        waiting["method"],
        waiting["memory_id"],
        calls,
        waiting["expires_at"],
    )


async def decide(
    status: _Status, event: _Event, send: _Send, turn_id: str, decisions: Mapping[str, Decision]
) -> None:
    where = f"agentrt.durable: turn {turn_id!r}"
    state = await status(turn_id)
    if state is None:
        raise ApprovalNotFoundError(f"agentrt.durable: no durable turn {turn_id!r}")
    waiting = await event(turn_id, TOPIC, 0.0)
    if waiting is None or state not in ("PENDING", "ENQUEUED"):
        raise ApprovalNotFoundError(f"{where} does not wait for approval (its state: {state})")
    message = {"run_id": waiting["run_id"], "decisions": _decisions_json(decisions, waiting, where)}
    # The same decisions are sent once however often this is called (a double click). Others are
    # sent too: the turn takes them in order, the first that fits (an edit the tool's schema refuses
    # makes the turn wait again, for the next); those left over are never read.
    digest = hashlib.sha256(orjson.dumps(message, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]
    await send(turn_id, message, TOPIC, f"{turn_id}:{digest}")


class Client:
    """Durable turns seen from a process that runs none (a web front end): the approvals they wait
    for and a human's decisions, on the engine's database (`Engine`'s `database`). Runs no turn and
    recovers none, so it may live beside an `Engine` of another process, or in a process of its own.
    """

    def __init__(self, database: str = "sqlite:///agentrt-turns.sqlite") -> None:
        if database.startswith("sqlite") and SUBSEC_MISSING:  # (see `SUBSEC_MISSING`)
            engine = sqlalchemy.create_engine(database, connect_args={"factory": SubsecConnection})
            self._client = DBOSClient(system_database_engine=engine, serializer=DBOSPortableJSON)
            self._engine: sqlalchemy.Engine | None = engine  # DBOS does not dispose an engine it is given
        else:
            self._client = DBOSClient(system_database_url=database, serializer=DBOSPortableJSON)
            self._engine = None

    async def _status(self, turn_id: str) -> str | None:
        found = await self._client.list_workflows_async(workflow_ids=[turn_id])
        return str(found[0].status) if found else None

    async def _send(self, turn_id: str, message: Any, topic: str, key: str) -> None:
        await self._client.send_async(turn_id, message, topic, idempotency_key=key)

    async def approval(self, turn_id: str, *, wait: float = 0.0) -> ApprovalRequested | None:
        """As `Engine.approval`."""
        return await approval(self._status, self._client.get_event_async, turn_id, wait)

    async def decide(self, turn_id: str, decisions: Mapping[str, Decision]) -> None:
        """As `Engine.decide`."""
        await decide(self._status, self._client.get_event_async, self._send, turn_id, decisions)

    def read(self, turn_id: str, *, offset: int = 0, polling_seconds: float | None = None) -> DurableStream:
        """As `Engine.read`; `polling_seconds`: how often an SQLite database is asked for new text
        (DBOS's default: 1 s)."""
        checked(offset)
        values = self._client.read_stream_async(turn_id, KEY, offset=0, polling_interval_sec=polling_seconds)
        return DurableStream(values, turn_id, offset, lambda: self._failed(turn_id))

    async def _failed(self, turn_id: str) -> None:
        if await self._status(turn_id) in FAILED:
            handle: Any = await self._client.retrieve_workflow_async(turn_id)
            await raised(turn_id, handle.get_result())

    def close(self) -> None:
        self._client.destroy()
        if self._engine is not None:
            self._engine.dispose()  # its connections closed now, not by the collector
