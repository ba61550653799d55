"""The workflow of a durable turn: a DBOS workflow of segments between checkpoints (`Engine` runs it).

The workflow body (`_turn`) is only a loop over recorded data: each step `agentrt.segment` restores
the turn from the checkpoint the previous step returned, runs it to the next stopping boundary
(`_STOPS`) and returns the new checkpoint, or the result at the turn's end. Replay returns recorded
checkpoints, so nothing in the pipeline needs to be deterministic (clocks, random ids, guardrails).

DBOS writes nothing when a step starts: a step that started in a worker that died runs again, and
looks like a first run. So each call of a tool not safe to run again is recorded from inside the
segment (`_Journal`, events of the workflow): "started" before it runs, its outcome after. Before a
tool round the workflow records a tiny step `agentrt.intent` that returns a fresh token this process
remembers (`_FRESH`); replayed, its token is unknown here, so when the round's own step then runs, a
previous run died inside the round, and the journal is read: a call recorded finished is not run
again (its outcome stands), one recorded started only fails with `OutcomeUnknownError`, one never
started runs. (A first run reads nothing: it only writes.)

An approval: the segment that reaches `Phase.APPROVAL` stops there; the next runs agentrt's suspend
and returns {"waiting": ...}; the body publishes it (`DBOS.set_event`) and waits for a message
(`_decision`); the segment after it, behind an intent step, goes on from the pending record with the
decisions (`_resumed`), or returns {"refused": ...} and the body waits again.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Final

import anyio
import orjson
from dbos import (
    DBOS,
    PortableWorkflowError,
    WorkflowHandleAsync,
    WorkflowStatusString,
)

from .._errors import ApprovalDecisionError, ApprovalNotFoundError, ConfigurationError
from .._events import Started, ToolOutcome
from .._methods import starter
from .._pipeline import Invocation, StopAtBoundary
from .._pipeline._approve import CLAIMED, EXPIRED
from .._pipeline._checkpoint import VERSION, _revalue, _value
from .._pipeline._finish import COMMIT_ONCE
from .._pipeline._runtime import notify
from .._pipeline._turn import Phase
from .._resume import reopen
from ..memory._memory import LEASE_OWNER
from ..tools._run import JOURNAL
from ._approvals import TOPIC, decisions_of, waiting_json
from ._failed import raised, rebuilt
from ._stream import KEY, fold

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._messages import ToolCall
    from ..memory._memory import Conversation

__all__ = ["APPLICATION_VERSION"]

APPLICATION_VERSION: Final = f"agentrt-turn-{VERSION}"
"""The DBOS application version of every engine: pinned, so that a deploy (or a dbos upgrade) does not
strand the turns in flight (DBOS recovers only workflows of its own version; its default is a hash
of the workflows' source). A turn's checkpoints carry their own version."""

_STOPS: Final = frozenset({Phase.REQUEST, Phase.TOOLS, Phase.APPROVAL, Phase.COMMIT})
"""The boundaries a segment ends at: before each side effect (a model request, a tool round, the
commit) and where a turn would wait for a human."""

_TOOLS: Final = Phase.TOOLS.value

_TURN: Final = "agentrt.turn"
"""The workflow's name (recorded with each turn)."""

_ENDED: Final = [
    WorkflowStatusString.SUCCESS.value,
    WorkflowStatusString.ERROR.value,
    WorkflowStatusString.CANCELLED.value,
    WorkflowStatusString.MAX_RECOVERY_ATTEMPTS_EXCEEDED.value,
]
"""The statuses of a turn that ended (`Engine.prune`)."""

_FOREVER: Final = 366 * 86400.0
"""How long one wait for a decision on an approval without expiry lasts (then it waits again)."""

_SERVICES: dict[str, object] = {}
"""The services of this process's engine, by the name turns record."""

_FRESH: set[str] = set()
"""Tokens of the intent steps this process ran (not replayed): see the module docstring."""

_UNKNOWN_OUTCOME: list[str] = ["error"]
"""This process's engine's `unknown_outcome` policy."""

_HELD: dict[str, Conversation] = {}
"""The conversations of this process's turns between two of their segments: still locked (for the
turn's owner, `LEASE_OWNER`), so that no other turn on it commits in between; the next segment
takes it over, the workflow's end releases one left."""

_RUNNING: set[str] = set()
"""The turns that ran a segment in this process (until their workflow ends here): a segment of
another one is its first here, of a turn recovered from another process (or a crashed run)."""


class _Stop(StopAtBoundary):
    """Raised by the boundary callback once the turn is saved there: ends a segment (not a failure
    of the turn: listeners see none)."""


def _parts(service_name: str, method: str) -> tuple[Any, Any]:
    from .._service import runtime_of

    service = _SERVICES.get(service_name)
    if service is None:
        raise ConfigurationError(f"agentrt.durable: no service registered as {service_name!r}")
    runtime = runtime_of(service)
    spec = getattr(getattr(service, method, None), "__agentrt_spec__", None)
    if runtime is None or spec is None:
        raise ConfigurationError(
            f"agentrt.durable: {service_name!r} has no method {method!r} built by agentrt"
        )
    return runtime, spec


class _AskUnknown(StopAtBoundary):
    """Raised before a tool round runs any call, under `unknown_outcome="approval"`: calls of it
    started in a worker that died before they finished; a human decides whether they run again."""

    def __init__(self, calls: list[tuple[str, ToolCall]]) -> None:
        super().__init__("calls of unknown outcome wait for a human's decision")
        self.calls = calls


class _Journal:
    """The calls of a segment's tools not safe to run again, recorded one by one (`CallJournal`) as
    events of the turn's workflow (written from inside the segment's step, which DBOS allows; a step
    cannot run steps of its own): "started" before the call, its outcome after. `uncertain`: a run
    of this segment died before (see `_intent`), so the records are read first; otherwise there
    are none yet (one write per call before, one after, no read).

    `rerun`: a human's decisions on calls of unknown outcome, by key (`{"approve": ...}`: run it
    again, `{"deny": reason}`: it is not run, the model is told why); `ask`: without a decision,
    such a call stops the round before any call runs (`_AskUnknown`) instead of failing with
    `OutcomeUnknownError`."""

    __slots__ = ("ask", "rerun", "uncertain")

    def __init__(self, uncertain: bool, rerun: dict[str, Any] | None = None, ask: bool = False) -> None:
        self.uncertain = uncertain
        self.rerun = rerun or {}
        self.ask = ask

    async def _known(self, name: str) -> Any:
        return await DBOS.get_event_async(DBOS.workflow_id or "", name, timeout_seconds=0)

    def _undecided(self, key: str, known: str) -> bool:
        """Whether a call recorded started (`known`) and never finished is of unknown outcome to
        this run: no human decided on it since that start (an approved call is recorded started
        again under its decision's number, `started:N`: one killed inside is asked about again)."""
        decision = self.rerun.get(key)
        return decision is None or decision["ask"] <= _started_under(known)

    async def settle(self, calls: Sequence[tuple[str, ToolCall]]) -> None:
        if not (self.uncertain and self.ask):
            return
        unknown = []
        for key, call in calls:
            known = await self._known(f"agentrt.call:{key}")
            if isinstance(known, str) and self._undecided(key, known):
                unknown.append((key, call))
        if unknown:
            raise _AskUnknown(unknown)

    async def before(self, key: str) -> dict[str, Any] | bool:
        name = f"agentrt.call:{key}"
        if self.uncertain:
            known = await self._known(name)
            if isinstance(known, dict):
                return known
            if known is not None:
                if self._undecided(key, known):
                    return True  # started, never finished
                decision = self.rerun[key]
                if "deny" in decision:
                    outcome = _not_again(decision["tool"], decision["deny"])
                    await DBOS.set_event_async(name, outcome)
                    return outcome
                # approved: it runs again, recorded as started under this decision
                await DBOS.set_event_async(name, f"started:{decision['ask']}")
                return False
        await DBOS.set_event_async(name, "started")
        return False

    async def after(self, key: str, outcome: dict[str, Any]) -> None:
        await DBOS.set_event_async(f"agentrt.call:{key}", outcome)


def _started_under(known: str) -> int:
    """The number of the human's decision a call recorded started ran under (0: none, its first)."""
    return int(known.partition(":")[2] or 0)


def _not_again(tool: str, reason: str | None) -> dict[str, Any]:
    """The recorded outcome of a call of unknown outcome that a human chose not to run again."""
    text = (
        f"The user chose not to run this call of {tool!r} again; "
        "whether its first run took effect is unknown."
    )
    return {
        "result": text if reason is None else f"{text} Reason: {reason}",
        "outcome": ToolOutcome.DENIED.value,
        "error_kind": "OutcomeUnknownError",
        "images": [],
    }


async def _release_held(workflow: str) -> None:
    """Release the conversation a turn of this process kept locked between two segments, if any."""
    held = _HELD.pop(workflow, None)
    if held is not None:
        with anyio.CancelScope(shield=True):
            await held.release()


async def _intent() -> str:
    token = os.urandom(8).hex()
    _FRESH.add(token)
    return token


async def _segment(
    service_name: str,
    method: str,
    arguments: dict[str, Any],
    checkpoint: dict[str, Any] | None,
    uncertain: bool,
    decided: dict[str, Any] | None = None,
    streamed: int | None = None,
    rerun: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One step of a durable turn: from `checkpoint` (None: the start) to the next stopping boundary.
    Returns {"checkpoint": ...} there, {"waiting": ...} where the turn stopped for approval (agentrt's
    own: its pending record stored, the conversation released), or the result at the turn's end
    ({"text", "value", "parsed"}). With `uncertain`, calls of the turn's tool round not safe to run
    again are reported as of unknown outcome instead of run.

    With `decided` (a human's decisions on the approval `checkpoint` stopped at), the turn goes on
    from its pending record as `agentrt.resume` does; {"refused": why} for decisions that do not fit
    (nothing ran, the turn waits again).

    `streamed`: the segment's number in a streamed turn, whose text goes to the workflow's stream
    (`_stream`): the number first (a second run of the segment shows it again), then the tokens."""
    runtime, spec = _parts(service_name, method)
    workflow = DBOS.workflow_id or ""
    claimed = False
    if decided is not None:
        assert checkpoint is not None
        await _release_held(workflow)  # (none: the turn released it when it stopped for approval)
        try:
            # (A round run again on a human's decisions (`rerun`) died in a run past its claim.)
            invocation, uncertain, claimed = await _resumed(
                runtime, spec, service_name, checkpoint, decided, uncertain or rerun is not None
            )
        except ApprovalDecisionError as error:
            return {"refused": str(error)}
        skip = 1
    elif checkpoint is None:
        invocation = starter(spec, runtime)(spec.bind((), arguments))
        skip = 0
    else:
        invocation = Invocation.restore(runtime, spec, checkpoint)
        skip = 1  # a restored turn meets the boundary it was saved at first: that one is this step's
        held = _HELD.pop(workflow, None)
        if held is not None:  # the previous segment's, still locked: the turn goes on with it
            held.claim()
            invocation._turn.conversation = held
        if runtime.listeners and (DBOS.workflow_id or "") not in _RUNNING:
            # Recovered here: a new run of the turn (as a resumed approval is), which listeners see
            # start; the segments of one run restore the turn silently.
            turn = invocation._turn
            model = runtime.model
            started = Started(invocation.id, spec.qualname, turn.memory_id, model.name, runtime.provider)
            notify(runtime.listeners, started)
    _RUNNING.add(DBOS.workflow_id or "")
    saved: list[dict[str, Any]] = []

    def boundary(phase: Phase) -> None:
        nonlocal skip
        if skip:
            skip -= 1
            return
        if phase in _STOPS:
            if phase is Phase.APPROVAL and runtime.memory is None:
                raise ConfigurationError(
                    f"{spec.qualname}: a durable turn waits for approval only on a service with memory "
                    "(its pending record lives in the memory's store, which every worker shares)"
                )
            saved.append(invocation.checkpoint())
            turn = invocation._turn
            if turn.conversation is not None and turn.conversation.held:
                # Kept locked for the next segment (the invocation releases only what it has).
                _HELD[workflow], turn.conversation = turn.conversation, None
            raise _Stop

    invocation.on_boundary(boundary)
    journal = JOURNAL.set(_Journal(uncertain or rerun is not None, rerun, _UNKNOWN_OUTCOME[0] == "approval"))
    once = COMMIT_ONCE.set(True)
    taken = CLAIMED.set(claimed)
    try:
        if streamed is None:
            result = await invocation.result()
        else:
            await DBOS.write_stream_async(KEY, {"segment": streamed})
            result = await fold(invocation._turn, invocation.events())
    except _Stop:
        return {"checkpoint": saved[0]}
    except _AskUnknown as ask:
        turn = invocation._turn
        return {
            "unknown": {
                "invocation_id": turn.id,
                "run_id": f"unknown:{workflow}:{turn.round}",
                "method": spec.qualname,
                "memory_id": orjson.loads(orjson.dumps(turn.memory_id, default=str)),
                "calls": [
                    {
                        "id": call.id,
                        "tool": call.name,
                        "arguments": orjson.loads(call.arguments or "{}"),
                        "key": key,
                    }
                    for key, call in ask.calls
                ],
                "expires_at": None,
            }
        }
    except ApprovalDecisionError as error:
        return {"refused": str(error)}
    finally:
        CLAIMED.reset(taken)
        COMMIT_ONCE.reset(once)
        JOURNAL.reset(journal)
    if result.approval is not None:
        return {"waiting": waiting_json(result.approval)}
    turn = invocation._turn
    return {"text": result.text, "value": _value(turn), "parsed": turn.parsed}


async def _resumed(
    runtime: Any,
    spec: Any,
    service_name: str,
    checkpoint: dict[str, Any],
    decided: dict[str, Any],
    uncertain: bool,
) -> tuple[Invocation, bool, bool]:
    """The invocation of a turn that waited for approval, with the decisions: restored from its
    pending record by `agentrt.resume`'s own code (the record checked, the conversation locked), and
    whether its round's unsafe calls are of unknown outcome and its record was claimed already.

    The record is claimed (taken from the store) before any approved call runs: found still pending,
    no call of the round ran before, whatever `uncertain` says. Not found while `uncertain` (the
    previous run of this step died in it), that run claimed it: the turn is restored from the
    workflow's own checkpoint at the approval, and goes on without claiming it again."""
    decisions = decisions_of(decided["decisions"])
    run_id = str(decided["run_id"])
    memory_id = Invocation.restore(runtime, spec, checkpoint)._turn.memory_id
    where = f"{spec.qualname}: durable turn"
    try:
        method, invocation = await reopen(
            _SERVICES[service_name], runtime, run_id, decisions, memory_id, where
        )
    except ApprovalNotFoundError:
        if not uncertain:
            raise  # taken by someone else (`agentrt.resume`, a new turn denying it): the turn ends
        invocation = Invocation.restore(runtime, spec, checkpoint)
        invocation._turn.decisions = decisions
        return invocation, True, True
    if method.__agentrt_spec__ is not spec:
        raise ApprovalNotFoundError(f"{where}: run {run_id!r} is of another method")
    return invocation, False, False


async def _decision(waiting: dict[str, Any], streamed: bool) -> dict[str, Any]:
    """Wait, durably, for a human's decisions on the approval `waiting` (published for `approval`
    and `decide` until the turn has gone past it): a restart of every worker replays up to here and
    waits again. Past the approval's expiry, every call is denied as expired. A streamed turn's
    readers stop here (once it is published: a reader that decides at once finds it)."""
    await DBOS.set_event_async(TOPIC, waiting)
    if streamed:
        await DBOS.write_stream_async(KEY, {"approval": waiting["run_id"]})
    expires = waiting["expires_at"]
    while True:
        left = _FOREVER if expires is None else max(0.0, expires - time.time())
        message = await DBOS.recv_async(topic=TOPIC, timeout_seconds=left)
        if message is None:
            if expires is None:
                continue
            decisions = {call["id"]: {"deny": EXPIRED} for call in waiting["calls"]}
            break
        if message.get("run_id") == waiting["run_id"]:
            decisions = message["decisions"]
            break
        # (another decision sent on an earlier approval of the turn, after its first: not this one's)
    return {"run_id": waiting["run_id"], "decisions": decisions}


@DBOS.workflow(name=_TURN)
async def _turn(
    service_name: str, method: str, arguments: dict[str, Any], streamed: bool = False
) -> dict[str, Any]:
    workflow = DBOS.workflow_id or ""
    # The conversation's lock is the turn's (its steps run in this task, with this context): a
    # worker that recovers the turn takes over the lock its dead worker held, at once.
    owner = LEASE_OWNER.set(f"agentrt.turn:{workflow}")
    try:
        return await _segments(service_name, method, arguments, streamed)
    finally:
        LEASE_OWNER.reset(owner)
        _RUNNING.discard(workflow)
        await _release_held(workflow)


async def _segments(
    service_name: str, method: str, arguments: dict[str, Any], streamed: bool
) -> dict[str, Any]:
    checkpoint: dict[str, Any] | None = None
    waiting: dict[str, Any] = {}
    decided: dict[str, Any] | None = None
    rerun: dict[str, Any] | None = None  # decisions on calls of unknown outcome, by journal key
    asks = 0  # the questions on calls of unknown outcome so far: each is numbered (see `_Journal`)
    segments = 0
    while True:
        uncertain = False
        if decided is not None or (checkpoint is not None and checkpoint.get("phase") == _TOOLS):
            token = await DBOS.run_step_async({"name": "agentrt.intent"}, _intent)
            uncertain = token not in _FRESH
            _FRESH.discard(token)
        try:
            out = await DBOS.run_step_async(
                {"name": "agentrt.segment", "retries_allowed": False},
                _segment,
                service_name,
                method,
                arguments,
                checkpoint,
                uncertain,
                decided,
                segments if streamed else None,
                rerun,
            )
            segments += 1
        except PortableWorkflowError as error:
            # The step's recorded error, replayed (its worker died before the turn recorded it):
            # the turn fails with it as agentrt's error, not as DBOS's JSON of it.
            raise rebuilt(DBOS.workflow_id or "", error.name, error.message) from None
        if (decided is not None or rerun is not None) and "refused" not in out and "unknown" not in out:
            # Past the approval (only now: decisions sent while refused ones were read are taken).
            await DBOS.set_event_async(TOPIC, None)
        resumed, decided, rerun = decided, None, None
        if "checkpoint" in out:
            checkpoint = out["checkpoint"]
            continue
        if "unknown" in out:  # calls of unknown outcome: a human decides, then the round runs again
            asks += 1
            # Its own run id: a round asked about again (killed in a call run again) is a new
            # approval, whose decisions are not taken for a double click of the last one's.
            waiting = {**out["unknown"], "run_id": f"{out['unknown']['run_id']}:{asks}"}
            got = await _decision(waiting, streamed)
            # Decided (nothing refuses these decisions): no longer published, so that a worker that
            # recovers the round killed in a call run again publishes only its own question.
            await DBOS.set_event_async(TOPIC, None)
            rerun = {
                call["key"]: {**got["decisions"][call["id"]], "tool": call["tool"], "ask": asks}
                for call in waiting["calls"]
            }
            decided = resumed  # (a round resumed from an approval runs again as one)
            continue
        if "waiting" in out:
            waiting = out["waiting"]
        elif "refused" not in out:  # (refused decisions: nothing ran, the turn waits again)
            return {"service": service_name, "method": method, **out}
        decided = await _decision(waiting, streamed)


async def _outcome(handle: WorkflowHandleAsync[dict[str, Any]]) -> Any:
    """The value of the turn `handle` names, or its error as agentrt's (see `_failed`)."""
    recorded = await raised(handle.get_workflow_id(), handle.get_result())
    _, spec = _parts(recorded["service"], recorded["method"])
    return _revalue(spec, recorded["value"], recorded["text"], recorded["parsed"])
