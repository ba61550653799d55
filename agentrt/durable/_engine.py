"""The engine of durable turns: a turn as a DBOS workflow of segments between checkpoints.

The workflow body (`_turn`) is only a loop over recorded data: each step `agentrt.segment` restores
the turn from the checkpoint the previous step returned, runs it to the next stopping boundary
(`_STOPS`) and returns the new checkpoint, or the result at the turn's end. Replay returns recorded
checkpoints, so nothing in the pipeline needs to be deterministic (clocks, random ids, guardrails).

DBOS writes nothing when a step starts: a step that started in a worker that died runs again, and
looks like a first run. Before a tool round the workflow records a tiny step `agentrt.intent` that
returns a fresh token this process remembers (`_FRESH`); replayed, its token is unknown here, so when
the round's own step then runs, a previous run died inside the round: the round runs with
`OUTCOME_UNKNOWN` set, and its calls not safe to run again fail with `OutcomeUnknownError`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import time
from typing import TYPE_CHECKING, Any, Final

from dbos import DBOS, DBOSConfig, SetWorkflowID, WorkflowHandleAsync
from dbos._serialization import DBOSPortableJSON

from .._errors import ConfigurationError
from .._options import CallOptions
from .._pipeline import Invocation
from .._pipeline._checkpoint import VERSION, _revalue, _value
from .._pipeline._finish import COMMIT_ONCE
from .._pipeline._turn import Phase
from ..tools._run import OUTCOME_UNKNOWN

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["APPLICATION_VERSION", "Engine"]

_SUBSEC_MISSING: Final = sys.version_info >= (3, 12) and sqlite3.sqlite_version_info < (3, 42)
"""DBOS's SQLite schema and queries on Python 3.12+ read the time as `unixepoch('subsec')`, a modifier
SQLite has from 3.42 on; an older library (Debian 12's 3.40) gives NULL and every launch fails on a
NOT NULL column. On such a library each DBOS connection gets its own `unixepoch` (below)."""


def _unixepoch(value: object) -> float | int | None:
    """`unixepoch(x)` for one argument: the time in seconds with its fraction for `'subsec'` (what
    SQLite 3.42 gives), otherwise what SQLite's own function gives."""
    if value == "subsec":
        return time.time()
    with sqlite3.connect(":memory:") as builtin:
        row = builtin.execute("SELECT unixepoch(?)", (value,)).fetchone()
    return row[0] if row else None


class _SubsecConnection(sqlite3.Connection):
    """A connection whose one-argument `unixepoch` knows `'subsec'` (an application-defined function
    overrides SQLite's built-in one of the same name and arity)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.create_function("unixepoch", 1, _unixepoch)


APPLICATION_VERSION: Final = f"agentrt-turn-{VERSION}"
"""The DBOS application version of every engine: pinned, so that a deploy (or a dbos upgrade) does not
strand the turns in flight (DBOS recovers only workflows of its own version; its default is a hash
of the workflows' source). A turn's checkpoints carry their own version."""

_STOPS: Final = frozenset({Phase.REQUEST, Phase.TOOLS, Phase.APPROVAL, Phase.COMMIT})
"""The boundaries a segment ends at: before each side effect (a model request, a tool round, the
commit) and where a turn would wait for a human."""

_TOOLS: Final = Phase.TOOLS.value

_SERVICES: dict[str, object] = {}
"""The services of this process's engine, by the name turns record."""

_FRESH: set[str] = set()
"""Tokens of the intent steps this process ran (not replayed): see the module docstring."""

_ENGINE: list[Engine] = []
"""The engine of this process (DBOS is one per process)."""


class _Stop(Exception):
    """Raised by the boundary callback once the turn is saved there: ends a segment."""


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


def _start(runtime: Any, spec: Any, arguments: dict[str, Any]) -> Invocation:
    """A new invocation of the method, with its options laid as a call of the built method would."""
    bound = spec.bind((), arguments)
    options = CallOptions(runtime.budget, runtime.settings, runtime.max_repairs)
    if spec.options is not None:
        options = spec.options.over(options)
    if spec.option_params:
        own = spec.call_options(bound)
        if own is not None:
            options = own.over(options)
    return Invocation(
        runtime,
        spec,
        bound,
        settings=options.settings,
        budget=options.final_budget(),
        max_repairs=options.max_repairs,
    )


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
) -> dict[str, Any]:
    """One step of a durable turn: from `checkpoint` (None: the start) to the next stopping boundary.
    Returns {"checkpoint": ...} there, or the result at the turn's end ({"text", "value",
    "parsed"}). With `uncertain`, calls of the turn's tool round not safe to run again are reported
    as of unknown outcome instead of run."""
    runtime, spec = _parts(service_name, method)
    if checkpoint is None:
        invocation = _start(runtime, spec, arguments)
        skip = 0
    else:
        invocation = Invocation.restore(runtime, spec, checkpoint)
        skip = 1  # a restored turn meets the boundary it was saved at first: that one is this step's
    saved: list[dict[str, Any]] = []

    def boundary(phase: Phase) -> None:
        nonlocal skip
        if skip:
            skip -= 1
            return
        if phase in _STOPS:
            if phase is Phase.APPROVAL:
                raise ConfigurationError(
                    f"{spec.qualname}: a durable turn cannot wait for an approval yet (agentrt.durable)"
                )
            saved.append(invocation.checkpoint())
            raise _Stop

    invocation.on_boundary(boundary)
    unknown = OUTCOME_UNKNOWN.set(uncertain)
    once = COMMIT_ONCE.set(True)
    try:
        result = await invocation.result()
    except _Stop:
        return {"checkpoint": saved[0]}
    finally:
        COMMIT_ONCE.reset(once)
        OUTCOME_UNKNOWN.reset(unknown)
    turn = invocation._turn
    return {"text": result.text, "value": _value(turn), "parsed": turn.parsed}


@DBOS.workflow(name="agentrt.turn")
async def _turn(service_name: str, method: str, arguments: dict[str, Any]) -> dict[str, Any]:
    checkpoint: dict[str, Any] | None = None
    while True:
        uncertain = False
        if checkpoint is not None and checkpoint.get("phase") == _TOOLS:
            token = await DBOS.run_step_async({"name": "agentrt.intent"}, _intent)
            uncertain = token not in _FRESH
            _FRESH.discard(token)
        out = await DBOS.run_step_async(
            {"name": "agentrt.segment", "retries_allowed": False},
            _segment,
            service_name,
            method,
            arguments,
            checkpoint,
            uncertain,
        )
        if "checkpoint" not in out:
            return {"service": service_name, "method": method, **out}
        checkpoint = out["checkpoint"]


def _value_of(recorded: dict[str, Any]) -> Any:
    _, spec = _parts(recorded["service"], recorded["method"])
    return _revalue(spec, recorded["value"], recorded["text"], recorded["parsed"])


class Engine:
    """The durable-execution engine of this process (DBOS Transact; one per process).

    - `database`: DBOS's system database, where turns are recorded: an SQLite URL
      (`sqlite:///path`, the default; processes of one host) or a Postgres URL
      (`postgresql://user:password@host:port/database`; several hosts; made if missing).
    - `executor_id`: this worker's name, stable across its restarts: at `launch` the pending turns
      recorded under it resume here (DBOS's default: `DBOS__VMID`, else "local").
    - `polling_seconds`: how often SQLite is polled for notifications (DBOS's default: 1 s).

    Register each built service under a name (`register`), the same on every worker, then `launch`
    inside the application's asyncio loop (or `async with engine:`), then `call`. The turn's id is
    its workflow id: a call with the id of a turn already started does not run it again, it returns
    its result. Arguments are recorded as JSON, so they must be JSON values.

    Not yet (issue 28): streaming methods (a durable turn is awaited; its text arrives whole);
    approvals (a turn that would wait for one fails with `ConfigurationError`); per-call intents (a
    round of several calls killed between them reports all its unsafe calls unknown); keeping the
    conversation's lock between segments (another turn on it may commit in between); liveness
    (`adopt` is called by the application for executors it knows are dead); retention of finished
    turns. A turn that failed is recorded with its error's name and message only (JSON).
    """

    def __init__(
        self,
        database: str = "sqlite:///agentrt-turns.sqlite",
        *,
        executor_id: str | None = None,
        polling_seconds: float | None = None,
        name: str = "agentrt",
    ) -> None:
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
        if database.startswith("sqlite") and _SUBSEC_MISSING:
            config["db_engine_kwargs"] = {"connect_args": {"factory": _SubsecConnection}}
        if polling_seconds is not None:
            config["notification_listener_polling_interval_sec"] = polling_seconds
        DBOS(config=config)
        _ENGINE.append(self)
        self._launched = False

    def register(self, name: str, service: object) -> None:
        """Name a service built by `agentrt.build` for the turns that run on it; the name is recorded
        with each turn, so a recovering worker finds the same service under it."""
        if _ENGINE[:1] != [self]:
            raise ConfigurationError("agentrt.durable: this engine was closed")
        _SERVICES[name] = service

    def launch(self) -> None:
        """Start the engine, in the running asyncio loop (recovered turns run on it): the pending
        turns of this executor (a crashed run of this worker) resume."""
        DBOS.launch()
        self._launched = True

    async def call(
        self, service: str, method: str, /, *, turn_id: str | None = None, **arguments: Any
    ) -> Any:
        """Run `method` of the service registered as `service` as a durable turn, and return what
        awaiting the method returns (its value). `turn_id` names the turn (default: a random id):
        a turn started again with the same id is not run twice, its recorded result is returned."""
        handle = await self._start(service, method, turn_id, arguments)
        return _value_of(await handle.get_result())

    async def start(
        self, service: str, method: str, /, *, turn_id: str | None = None, **arguments: Any
    ) -> str:
        """Start `method` as a durable turn and return its id at once (`result` waits for it)."""
        handle = await self._start(service, method, turn_id, arguments)
        return handle.get_workflow_id()

    async def _start(
        self, service: str, method: str, turn_id: str | None, arguments: dict[str, Any]
    ) -> WorkflowHandleAsync[dict[str, Any]]:
        _parts(service, method)  # a name that is not registered fails here, not in the workflow
        with SetWorkflowID(turn_id or os.urandom(16).hex()):
            return await DBOS.start_workflow_async(_turn, service, method, arguments)

    async def result(self, turn_id: str) -> Any:
        """Wait for the turn `turn_id` (run by any worker) and return its value."""
        handle: WorkflowHandleAsync[dict[str, Any]] = await DBOS.retrieve_workflow_async(turn_id)
        return _value_of(await handle.get_result())

    async def status(self, turn_id: str) -> str | None:
        """The turn's DBOS status (PENDING, ENQUEUED, SUCCESS, ERROR, ...), `None` for an unknown id."""
        status = await DBOS.get_workflow_status_async(turn_id)
        return None if status is None else str(status.status)

    def adopt(self, executor_ids: list[str]) -> list[str]:
        """Resume here the pending turns of other executors, known to be dead (their ids). Safe to
        call from several workers: only turns still pending on those executors are taken.

        (DBOS's recovery call, private in dbos 3.x: the dbos version is pinned below 4.)"""
        handles = DBOS._recover_pending_workflows(executor_ids)
        return [handle.get_workflow_id() for handle in handles]

    def close(self) -> None:
        """Stop the engine (DBOS's threads and connections); a new `Engine` may then be made."""
        if _ENGINE[:1] == [self]:
            _ENGINE.clear()
            _SERVICES.clear()
            DBOS.destroy(destroy_registry=False)

    async def __aenter__(self) -> Engine:
        self.launch()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


logging.getLogger("dbos").setLevel(logging.WARNING)
