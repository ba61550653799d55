"""The engine of durable turns (`Engine`, one per process): configuration, launch and liveness,
starting, reading and deciding turns. The turn's workflow itself is `_workflow`'s."""

from __future__ import annotations

import logging
import math
import os
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio
from dbos import (
    DBOS,
    DBOSConfig,
    SetWorkflowID,
    WorkflowHandleAsync,
)
from dbos._registrations import DEFAULT_MAX_RECOVERY_ATTEMPTS, get_func_info
from dbos._serialization import DBOSPortableJSON
from dbos._utils import GlobalParams

from .._backend import spawn
from .._errors import ConfigurationError
from ._approvals import Client, approval, decide
from ._failed import FAILED
from ._liveness import Heartbeats
from ._sqlite import SUBSEC_MISSING, SubsecConnection
from ._stream import KEY, DurableStream, checked

if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import TracebackType

    from .._approval import Decision
    from .._events import ApprovalRequested

from ._workflow import (
    _ENDED,
    _HELD,
    _SERVICES,
    _TURN,
    _UNKNOWN_OUTCOME,
    APPLICATION_VERSION,
    _outcome,
    _parts,
    _release_held,
    _turn,
)

__all__ = ["APPLICATION_VERSION", "Client", "Engine"]

_ENGINE: list[Engine] = []
"""The engine of this process (DBOS is one per process)."""


class Engine:
    """The durable-execution engine of this process (DBOS Transact; one per process).

    - `database`: DBOS's system database, where turns are recorded: an SQLite URL
      (`sqlite:///path`, the default; processes of one host) or a Postgres URL
      (`postgresql://user:password@host:port/database`; several hosts; made if missing).
    - `executor_id`: this worker's name, stable across its restarts: at `launch` the pending turns
      recorded under it resume here (DBOS's default: `DBOS__VMID`, else "local").
    - `polling_seconds`: how often SQLite is polled for notifications (DBOS's default: 1 s).
    - `max_recoveries`: how often one turn may be recovered (after its worker died, by this worker
      at `launch` or `adopt`): past it, the turn is given up (DBOS's `max_recovery_attempts`, its
      status MAX_RECOVERY_ATTEMPTS_EXCEEDED), and reading it raises `TurnFailedError`. It stops a
      turn that kills every worker running it (out of memory, say) from doing so forever. An int
      >= 0 (DBOS's default: 100), `None` for no limit; the recovering worker's own applies.
    - `retention_seconds`: how long a finished turn's records (its steps, events and messages in
      the engine's database, not the conversation in memory) are kept after it ended (successful,
      failed or given up); `None` (the default): for ever. They are deleted by `prune`, which
      `async with engine:` runs once at the start; call it on a schedule in a long-lived worker.
      A turn started again with the id of one deleted runs again.
    - `unknown_outcome`: what a turn does with a call of a tool not safe to run again that started
      in a worker that died before it finished: `"error"` (the default) tells the model it failed
      with `OutcomeUnknownError` (under the tool failure policy, which may raise or give a text of
      yours); `"approval"` asks a human before the round runs any call, as an approval the turn
      waits for (`approval`, `decide`): `Approve()` runs the call again (as it was: edited
      arguments are not taken), `Deny(reason)` does not, and the model is told so.
    - `adopt_after`: seconds without a heartbeat after which an executor's pending turns are
      adopted by a live engine (see `_liveness`): each engine then beats from its loop every
      quarter of it, and one live worker takes over the turns of each that stopped (a crash, a loop
      wedged that long). Every worker should set it; `None` (the default): no heartbeat, adoption
      is the application's (`adopt`).

    Register each built service under a name (`register`), the same on every worker, then `launch`
    inside the application's asyncio loop (or `async with engine:`), then `call`. The turn's id is
    its workflow id: a call with the id of a turn already started does not run it again, it returns
    its result. Arguments are recorded as JSON, so they must be JSON values.

    A tool call that needs approval stops the turn as agentrt does without durability (the pending
    record in the memory's store, so `agentrt.resume`'s checks apply; a service without memory
    cannot wait durably: `register` refuses it with `ConfigurationError`); the workflow then waits
    in `DBOS.recv` until the approval expires (its calls then count as denied), across restarts of
    every worker.
    `approval(turn_id)` gives what it waits for, `decide(turn_id, decisions)` sends a human's
    decisions from any worker (`Client`: from a process that runs no turns); the turn goes on as
    `agentrt.resume` would, on whichever worker runs it. `call` returns once the turn has ended,
    approval included: start a turn that may wait with `start`, then wait with `result`.

    `stream` starts a turn whose text is streamed through the workflow's DBOS stream, and `read`
    attaches a reader to one (`DurableStream`: a worker that dies part way through an answer
    leaves it retracted, explicitly, before the new run's text).

    Not yet (issue 28): one step per tool call (a call's record is written from inside its round's step:
    the intent is per round, the record per call; a round killed inside runs again its safe calls that
    had finished); pruning on a schedule of the engine's own (`prune` runs at the start, then when called).

    The service's listeners see one turn, as without durability: `Started` once (and once per
    resumed approval, as with `agentrt.resume`; a turn recovered by another worker starts again
    there), no failure where a segment ends, one `FailedEvent` for a turn that fails.

    A turn that failed raises its error as it fails; read again from its record (`call` with its
    id, `result`, on any worker) it raises the same class if that is one of agentrt's public errors
    (with the recorded message only: errors are recorded as JSON, their type's name and message;
    other attributes such as `partial` are `None`, and a note says so), else `TurnFailedError`,
    which names the original type and message. Nothing is unpickled.
    """

    def __init__(
        self,
        database: str = "sqlite:///agentrt-turns.sqlite",
        *,
        executor_id: str | None = None,
        polling_seconds: float | None = None,
        max_recoveries: int | None = DEFAULT_MAX_RECOVERY_ATTEMPTS,
        retention_seconds: float | None = None,
        adopt_after: float | None = None,
        unknown_outcome: Literal["error", "approval"] = "error",
        name: str = "agentrt",
    ) -> None:
        if max_recoveries is not None and (
            isinstance(max_recoveries, bool) or not isinstance(max_recoveries, int) or max_recoveries < 0
        ):
            raise ValueError(
                f"agentrt.durable.Engine: max_recoveries must be an int >= 0 or None, got {max_recoveries!r}"
            )
        if retention_seconds is not None and (
            isinstance(retention_seconds, bool)
            or not isinstance(retention_seconds, int | float)
            or not 0 <= retention_seconds < math.inf
        ):
            raise ValueError(
                "agentrt.durable.Engine: retention_seconds must be a finite number of seconds >= 0 "
                f"or None, got {retention_seconds!r}"
            )
        if adopt_after is not None and (
            isinstance(adopt_after, bool)
            or not isinstance(adopt_after, int | float)
            or not 0 < adopt_after < math.inf
        ):
            raise ValueError(
                "agentrt.durable.Engine: adopt_after must be a finite number of seconds > 0 or None, "
                f"got {adopt_after!r}"
            )
        if unknown_outcome not in ("error", "approval"):
            raise ValueError(
                "agentrt.durable.Engine: unknown_outcome must be 'error' or 'approval', "
                f"got {unknown_outcome!r}"
            )
        if _ENGINE:
            raise ConfigurationError(
                "agentrt.durable: one Engine per process (DBOS is a process-wide singleton)"
            )
        config: DBOSConfig = {
            "name": name,
            "system_database_url": database,
            "application_version": APPLICATION_VERSION,
            "log_level": "WARNING",
            "serializer": DBOSPortableJSON,
        }
        if executor_id is not None:
            config["executor_id"] = executor_id
        if database.startswith("sqlite") and SUBSEC_MISSING:
            config["db_engine_kwargs"] = {"connect_args": {"factory": SubsecConnection}}
        if polling_seconds is not None:
            config["notification_listener_polling_interval_sec"] = polling_seconds
        DBOS(config=config)
        # The turn workflow's registration (made at import) carries the limit that recovery reads.
        info = get_func_info(_turn)
        assert info is not None
        info.max_recovery_attempts = max_recoveries
        _ENGINE.append(self)
        _UNKNOWN_OUTCOME[0] = unknown_outcome
        self._launched = False
        self._polling = polling_seconds
        self.max_recoveries: Final = max_recoveries
        self.retention_seconds: Final = retention_seconds
        self.adopt_after: Final = adopt_after
        self._database = database
        self._stopping: anyio.Event | None = None  # set: the heartbeat task ends

    def register(self, name: str, service: object) -> None:
        """Name a service built by `agentrt.build` for the turns that run on it; the name is recorded
        with each turn, so a recovering worker finds the same service under it.

        A service without memory whose tool calls may wait for approval (its own tools', or
        declared approvals) is refused (`ConfigurationError`): its pending turns would live in this
        process alone. (Approvals only from a tool provider's tools: a turn that meets one fails.)"""
        from .._service import runtime_of

        if _ENGINE[:1] != [self]:
            raise ConfigurationError("agentrt.durable: this engine was closed")
        runtime = runtime_of(service)
        if runtime is None:
            raise ConfigurationError(
                f"agentrt.durable: {name!r} is not a service built by agentrt.build "
                f"(a {type(service).__name__})"
            )
        if runtime.memory is None and runtime.approvals:
            own = any(tool.needs_approval is not False for tool in runtime.tools.values())
            if own or runtime.tool_provider is None:
                raise ConfigurationError(
                    f"agentrt.durable: service {name!r} ({type(service).__name__}) has no memory, but its "
                    "tool calls may wait for approval: a durable turn waits only on a service with memory "
                    "(its pending record lives in the memory's store, which every worker shares)"
                )
        _SERVICES[name] = service

    def launch(self) -> None:
        """Start the engine, in the running asyncio loop (recovered turns run on it): the pending
        turns of this executor (a crashed run of this worker) resume."""
        DBOS.launch()
        self._launched = True
        if self.adopt_after is not None:
            heartbeats = Heartbeats(self._database, GlobalParams.executor_id)
            # Before a turn starts here: a worker dead before its first beat would never be adopted.
            heartbeats.beat()
            self._stopping = anyio.Event()
            spawn(self._beat, heartbeats, self.adopt_after, self._stopping)

    async def _beat(self, heartbeats: Heartbeats, after: float, stopping: anyio.Event) -> None:
        """Beat every quarter of `adopt_after` from this loop, and adopt the pending turns of the
        executors that stopped beating (see `_liveness`), until `stopping` is set."""
        try:
            while True:
                with anyio.move_on_after(after / 4):
                    await stopping.wait()
                if stopping.is_set():
                    return
                await self._beat_once(heartbeats, after)
        finally:
            heartbeats.close()

    async def _beat_once(self, heartbeats: Heartbeats, after: float) -> None:
        try:
            await anyio.to_thread.run_sync(heartbeats.beat)
            for executor in await anyio.to_thread.run_sync(heartbeats.stale, after):
                if await anyio.to_thread.run_sync(heartbeats.forget, executor, after):
                    adopted = self.adopt([executor])
                    _logger.warning(
                        "agentrt.durable: executor %r stopped beating; %d pending turn(s) adopted here",
                        executor,
                        len(adopted),
                    )
        except Exception:
            _logger.warning("agentrt.durable: the heartbeat failed; trying again", exc_info=True)

    async def call(
        self, service: str, method: str, /, *, turn_id: str | None = None, **arguments: Any
    ) -> Any:
        """Run `method` of the service registered as `service` as a durable turn, and return what
        awaiting the method returns (its value). `turn_id` names the turn (default: a random id):
        a turn started again with the same id is not run twice, its recorded result is returned."""
        handle = await self._start(service, method, turn_id, arguments)
        return await _outcome(handle)

    async def start(
        self, service: str, method: str, /, *, turn_id: str | None = None, **arguments: Any
    ) -> str:
        """Start `method` as a durable turn and return its id at once (`result` waits for it)."""
        handle = await self._start(service, method, turn_id, arguments)
        return handle.get_workflow_id()

    async def stream(
        self, service: str, method: str, /, *, turn_id: str | None = None, **arguments: Any
    ) -> DurableStream:
        """Start `method` as a durable turn whose text is streamed, and read it: its tokens as the
        turn releases them, from whichever worker runs it (see `DurableStream`; `read` attaches
        another reader, `result` gives the value). A turn started again with the same id is not run
        twice: its stream is read from the start."""
        handle = await self._start(service, method, turn_id, arguments, streamed=True)
        return self.read(handle.get_workflow_id())

    def read(self, turn_id: str, *, offset: int = 0) -> DurableStream:
        """The text of the streamed turn `turn_id` (run by any worker), from `offset` (0: the
        start; a `DurableStream`'s `offset` where it stopped: to read on after an approval, or
        where a reader left off). It raises the turn's error, as `result` does, if it failed."""
        checked(offset)
        values = DBOS.read_stream_async(turn_id, KEY, offset=0, polling_interval_sec=self._polling)
        return DurableStream(values, turn_id, offset, lambda: _failed(turn_id))

    async def _start(
        self,
        service: str,
        method: str,
        turn_id: str | None,
        arguments: dict[str, Any],
        *,
        streamed: bool = False,
    ) -> WorkflowHandleAsync[dict[str, Any]]:
        _parts(service, method)  # a name that is not registered fails here, not in the workflow
        with SetWorkflowID(turn_id or os.urandom(16).hex()):
            return await DBOS.start_workflow_async(_turn, service, method, arguments, streamed)

    async def result(self, turn_id: str) -> Any:
        """Wait for the turn `turn_id` (run by any worker) and return its value."""
        handle: WorkflowHandleAsync[dict[str, Any]] = await DBOS.retrieve_workflow_async(turn_id)
        return await _outcome(handle)

    async def status(self, turn_id: str) -> str | None:
        """The turn's DBOS status (PENDING, ENQUEUED, SUCCESS, ERROR, ...), `None` for an unknown id."""
        status = await DBOS.get_workflow_status_async(turn_id)
        return None if status is None else str(status.status)

    async def approval(self, turn_id: str, *, wait: float = 0.0) -> ApprovalRequested | None:
        """The approval the turn `turn_id` waits for (its run id, its calls, when it expires), or
        `None` when it waits for none; with `wait`, up to that many seconds for a turn that has not
        yet waited for one to do so. `ApprovalNotFoundError` for an unknown turn."""
        return await approval(_status, DBOS.get_event_async, turn_id, wait)

    async def decide(self, turn_id: str, decisions: Mapping[str, Decision]) -> None:
        """Send a human's decisions to the turn `turn_id`, which waits for approval (on any worker):
        one per pending call id, `Approve()`, `Approve(arguments={...})` or `Deny(reason)`, as for
        `agentrt.resume`. The same decisions are sent once, however often this is called (a double
        click). Raises `ApprovalNotFoundError` for an unknown turn or one that waits for no approval,
        `ApprovalDecisionError` for decisions that do not fit its calls. An edit the tool's schema
        refuses is refused by the turn itself (nothing runs), which then takes the next decisions
        sent; the first decisions that fit win (any sent after them are not read)."""
        await decide(_status, DBOS.get_event_async, _send, turn_id, decisions)

    async def prune(self) -> list[str]:
        """Delete the records of the turns that ended more than `retention_seconds` ago (on any
        worker) and return their ids; nothing without a retention. Turns still running or waiting
        are never touched."""
        if self.retention_seconds is None:
            return []
        before = datetime.fromtimestamp(time.time() - self.retention_seconds, tz=UTC)
        ended = await DBOS.list_workflows_async(
            name=_TURN,
            status=_ENDED,
            completed_before=before.isoformat(),
            load_input=False,
            load_output=False,
        )
        ids = [status.workflow_id for status in ended]
        if ids:
            await DBOS.delete_workflows_async(ids)
        return ids

    def adopt(self, executor_ids: list[str]) -> list[str]:
        """Resume here the pending turns of other executors, known to be dead (their ids). Safe to
        call from several workers: only turns still pending on those executors are taken.

        (DBOS's recovery call, private in dbos 3.x: the dbos version is pinned below 4.)"""
        handles = DBOS._recover_pending_workflows(executor_ids)
        return [handle.get_workflow_id() for handle in handles]

    def close(self) -> None:
        """Stop the engine (DBOS's threads and connections); a new `Engine` may then be made."""
        if self._stopping is not None:
            self._stopping.set()  # the heartbeat task ends (its row stays: another worker adopts
            self._stopping = None  # what is left pending here)
        if _ENGINE[:1] == [self]:
            _ENGINE.clear()
            _SERVICES.clear()
            DBOS.destroy(destroy_registry=False)

    async def __aenter__(self) -> Engine:
        self.launch()
        await self.prune()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for workflow in list(_HELD):  # turns stopped between two segments: their locks given back
            await _release_held(workflow)
        self.close()


async def _status(turn_id: str) -> str | None:
    status = await DBOS.get_workflow_status_async(turn_id)
    return None if status is None else str(status.status)


async def _failed(turn_id: str) -> None:
    """Raise the error of the turn `turn_id` if it failed (the end of its `DurableStream`)."""
    if await _status(turn_id) in FAILED:
        await _outcome(await DBOS.retrieve_workflow_async(turn_id))


async def _send(turn_id: str, message: Any, topic: str, key: str) -> None:
    await DBOS.send_async(turn_id, message, topic, idempotency_key=key)


logging.getLogger("dbos").setLevel(logging.WARNING)
_logger = logging.getLogger("agentrt.durable")
