"""Durable turns (preview, issue 28): a turn that survives the worker running it, on DBOS Transact.

Opt-in, with the extra `agentrt[durable]` (the `dbos` package), and **asyncio only**: DBOS's async
workflows need a running asyncio loop (under trio they fail with "no running event loop"). Everything
else in agentrt keeps running on asyncio and trio; importing this module without `dbos` raises
`ImportError`.

A turn runs as one DBOS workflow whose steps are the segments of the turn between its checkpoints
(`Invocation.checkpoint` / `Invocation.restore`): prepare | model request (and response, answer) |
tool round | ... | commit. DBOS records each step's result (a checkpoint, as JSON) once it completes;
a recovered turn replays the recorded steps and goes on from the last one, so a completed tool round
is never run again. Each call of a tool not safe to run again (not declared `@tool(idempotent=True)`,
nor with an `idempotentHint`/`readOnlyHint` annotation) is recorded when it starts and when it
finishes: in a tool round whose worker died inside it, a call that finished is not run again (its
result stands), one that never started runs, and one that started and never finished is reported to
the model as failed with `OutcomeUnknownError` (under the tool failure policy), not run; safe calls
run again. The commit stores the turn once, even when run again (`ChatMemoryStore.commit`'s
`turn`). A tool approval waits durably: the turn's workflow waits for a human's decisions
(`Engine.decide`, from any worker) across restarts of every worker. A streamed turn
(`Engine.stream`) writes its text to its workflow's DBOS stream, which readers in any process read
(`DurableStream`); a segment whose worker died after showing text is retracted explicitly.

    engine = Engine("sqlite:///turns.sqlite", executor_id="worker-1")
    engine.register("shop", shop)           # every worker registers its services by the same names
    async with engine:                      # launched in the app's loop: this executor's turns resume
        answer = await engine.call("shop", "ask", turn_id="t-1", question="Refund order A1")
        engine.adopt(["worker-0"])          # a dead worker's pending turns continue here
        await engine.decide("t-2", {"call-1": Approve()})  # a turn that waits for approval goes on

See `Engine` for what is not supported yet.
"""

from __future__ import annotations

from ..tools._run import OutcomeUnknownError
from ._approvals import Client
from ._engine import Engine
from ._failed import TurnFailedError
from ._stream import DurableStream

__all__ = ["Client", "DurableStream", "Engine", "OutcomeUnknownError", "TurnFailedError"]

# Tracebacks name where they are imported from (they pickle by it).
OutcomeUnknownError.__module__ = TurnFailedError.__module__ = __name__
