"""The SSE side of runs that outlive their connection (`agentrt.runs`): the log side of a run
(`Tee`), the manager's reading of a run whose client hung up (`adopted`), and the response that reads
a log to a client (`response`).

A run's stream is read by the response of the client that started it, as without a manager
(`_response.respond`: no task switch a token); the `Tee` gives each frame its id `{run}:{seq}` and
appends it to the run's log before the response sends it. With `on_disconnect="cancel"` a hang-up
cancels the run as without a manager, and the answer's final frames reach the log only once they were
written to the client (then the turn is stored: see `_response._SETTLE`). With `"detach"` the
hang-up is not the response's to act on: at the next event its stream is handed to the `Runs` manager,
which reads the rest into the log (`adopted`) and stores the turn as an awaited call would.
Resumes (`Last-Event-ID`, on any worker sharing the log) read the log.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio
import anyio.lowlevel
from sse_starlette import EventSourceResponse

from .._stream import PartialStream, TokenStream
from ..runs import RunGone, RunLog, Runs
from ._encoder import DONE, Encoder, Sent, chunks_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from sse_starlette import ServerSentEvent


logger = logging.getLogger("agentrt.sse")

Disconnect = Literal["cancel", "detach"]

MAX_RUN_ID: Final = 200
"""The longest run id a `Last-Event-ID` names (`parse_event_id`): AG-UI's client-named ids too."""

_WAITED: Final = 0.0005
_WRITES_PER_TURN: Final = 3


class Tee:
    """The log side of a run: each frame its id and its place in the run's log, appended before the
    response sends it (`put`); under `"cancel"`, the answer's final frames held back until they were
    written (`hold`, `release`); the log's end, with the protocol's end for a stopped run if the run
    did not end by itself (`finish`).

    `sent` is what the log holds of the run's parts (its stopped end closes them, for the client
    too); `began`, that the response's body began (its start was sent); `gone` says the
    client that started a `"detach"` run hung up (the response hands the stream to the manager at the
    next event); `adopted`, that the manager reads it now."""

    __slots__ = (
        "adopted",
        "append",
        "began",
        "clean",
        "encoder",
        "gone",
        "held",
        "log",
        "policy",
        "prefix",
        "run",
        "runs",
        "sent",
        "seq",
        "stop",
    )

    def __init__(
        self,
        runs: Runs,
        run: str,
        encoder: Encoder,
        policy: Disconnect,
        stop: Callable[[], None],
        sent: Sent | None,
    ) -> None:
        self.runs = runs
        self.log: RunLog = runs.log
        self.append = runs.log.append
        self.run = run
        self.prefix = run + ":"
        self.encoder = encoder
        self.policy = policy
        self.stop = stop
        self.sent = sent
        self.seq = 0
        self.held: list[tuple[Any, bytes]] = []
        self.clean = False
        self.gone = False
        self.adopted = False
        self.began = False

    def put(self, chunks: Sequence[Any]) -> list[bytes]:
        """`chunks` as frames with ids, appended to the log: what the response sends."""
        frame = self.encoder.frame
        append = self.append
        run = self.run
        sent = self.sent
        out = []
        for chunk in chunks:
            event: ServerSentEvent = frame(chunk)
            self.seq = seq = self.seq + 1
            event.id = self.prefix + str(seq)
            data = event.encode()
            append(run, seq, data)
            if sent is not None:
                sent.confirm(chunk)
            out.append(data)
        return out

    def hold(self, chunks: Sequence[Any]) -> list[bytes]:
        """`put`, but not in the log until `release` (the answer's final frames under `"cancel"`: a
        resume must not show an answer that was not stored)."""
        frame = self.encoder.frame
        out = []
        for chunk in chunks:
            event: ServerSentEvent = frame(chunk)
            self.seq += 1
            event.id = self.prefix + str(self.seq)
            data = event.encode()
            self.held.append((chunk, data))
            out.append(data)
        return out

    def release(self) -> None:
        """The held frames were written to the client: into the log."""
        held, self.held = self.held, []
        first = self.seq - len(held)
        for offset, (chunk, data) in enumerate(held, 1):
            self.append(self.run, first + offset, data)
            if self.sent is not None:
                self.sent.confirm(chunk)

    def end_stopped(self) -> list[bytes]:
        """Append the protocol's end for a stopped run (what the log holds of it is its `sent`)."""
        encoder = self.encoder
        self.seq -= len(self.held)  # never written: their ids are given again
        self.held = []
        if self.sent is None:
            self.sent = Sent()
        sent = self.sent
        out = [] if self.seq else self.put(encoder.opened())  # sent with the end
        chunks: list[Any] = list(encoder.stopped(sent))
        if encoder.done_marker and not sent.done:
            chunks.append(DONE)
        self.clean = True
        return out + self.put(chunks)

    async def finish(self) -> None:
        """End the run's log (shielded): with the stopped end first if the run did not end by
        itself; the manager forgets the run."""
        try:
            if not self.clean:
                self.end_stopped()
        finally:
            self.runs.release(self.run, self.stop)
            with anyio.CancelScope(shield=True):
                await self.log.end(self.run)


def adopt(
    tee: Tee,
    stream: TokenStream | PartialStream[Any],
    run: Any,
    result_json: Callable[[Any], dict[str, Any]],
    error_json: Callable[[BaseException], dict[str, Any]],
) -> bool:
    """Hand a `"detach"` run's stream to its manager (its client hung up): it reads the rest into
    the log. `run` is the endpoint's run (`scope`, `stopped`): a stop reaches the manager's reading.
    False if the run was stopped or the manager is closed (the response then ends it as a stopped
    one)."""

    async def adopted() -> None:
        snapshots = stream.snapshots if isinstance(stream, PartialStream) else None
        encoder = tee.encoder
        try:
            # Stopped while it was handed over: its stream is not read (its events may all come
            # without a checkpoint, where a cancelled scope would not stop it); `finish` ends the log.
            if not run.stopped:
                with anyio.CancelScope() as scope:
                    run.scope = scope
                    try:
                        async for event in stream.events():
                            tee.put(chunks_of(event, encoder, snapshots, result_json))
                    except Exception as error:
                        logger.exception("agentrt.sse: the stream failed")
                        tee.put(encoder.failed(error_json(error)))
                    if encoder.done_marker:
                        tee.put([DONE])
                    tee.clean = True
                if run.scope is scope:
                    run.scope = None
        finally:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            await tee.finish()

    if run.stopped:  # the response's stop ends it
        return False
    try:
        tee.runs.start(tee.run, adopted, tee.stop)
    except RuntimeError:
        return False
    tee.adopted = True
    # From here a stop is the manager's reading's, which may not have begun: it sets `run.stopped`
    # only (see `adopted`), and no longer cancels the response, which is ending and must not close
    # the stream or end the log the manager has now.
    run.scope = None
    return True


class Detaching:
    """A `"detach"` run's `receive` for its first client's response: the client's hang-up is not
    the response's to act on (sse-starlette would cancel it, and with it the run); it marks the run's
    `Tee` gone instead, and the response hands the stream to the manager at the next event."""

    __slots__ = ("receive", "tee")

    def __init__(self, receive: Callable[[], Any], tee: Tee) -> None:
        self.receive = receive
        self.tee = tee

    async def __call__(self) -> Any:
        message = await self.receive()
        if message["type"] == "http.disconnect":
            self.tee.gone = True
            await anyio.sleep_forever()  # the response ends at the next event
        return message


def response(
    log: RunLog,
    run: str,
    after: int,
    encoder: Encoder,
    *,
    ping: float | None,
    headers: dict[str, str],
    send_timeout: float | None,
) -> EventSourceResponse:
    """The response that reads `run`'s log after `after` to its end (a resume)."""

    async def frames() -> AsyncIterator[bytes]:
        written = 0
        resumed = 0.0
        clock = time.perf_counter
        batches = getattr(log, "read_batches", None)
        reading = batches(run, after) if batches is not None else _one_by_one(log.read(run, after))
        try:
            # A batch is every frame there was when the reader woke: one write, not one each.
            async for _, batch in reading:
                if clock() - resumed > _WAITED:
                    written = 0
                if written == _WRITES_PER_TURN:
                    await anyio.lowlevel.checkpoint()
                    written = 0
                written += 1
                yield batch[0] if len(batch) == 1 else b"".join(batch)
                resumed = clock()
        except RunGone as gone:
            failed: list[Any] = encoder.failed({"type": f"run_{gone.reason}", "message": str(gone)})
            if encoder.done_marker:
                failed = [*failed, DONE]
            for chunk in failed:
                yield encoder.frame(chunk).encode()
        except Exception:  # the log itself failed (Redis down): the client resumes later
            logger.exception("agentrt.sse: reading run %r from its log failed", run)
            for frame in _unavailable(encoder):
                yield frame
        finally:
            aclose = getattr(reading, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
        await anyio.lowlevel.checkpoint()  # the response's end is one more write: the loop's turn first

    return EventSourceResponse(
        frames(),
        ping=ping,
        headers={**encoder.headers, **headers},
        send_timeout=send_timeout,
        sep=encoder.sep,
    )


def _unavailable(encoder: Encoder) -> list[bytes]:
    """The frames that end a response whose log could not be read: the protocol's error
    `runs_unavailable` (and Vercel's `[DONE]`)."""
    failed: list[Any] = encoder.failed(
        {"type": "runs_unavailable", "message": "the run log could not be read; resume later"}
    )
    if encoder.done_marker:
        failed.append(DONE)
    return [encoder.frame(chunk).encode() for chunk in failed]


async def _one_by_one(reading: AsyncIterator[tuple[int, bytes]]) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A log's `read` as batches of one frame (a log without `read_batches`)."""
    try:
        async for seq, frame in reading:
            yield seq, [frame]
    finally:
        aclose = getattr(reading, "aclose", None)
        if aclose is not None:
            await aclose()


def parse_event_id(value: str) -> tuple[str, int] | None:
    """A `Last-Event-ID` of a logged run (`{run}:{seq}`), or `None` if it is not one."""
    run, colon, seq = value.strip().rpartition(":")
    # ASCII digits only: str.isdigit() also takes "²" (a latin-1 header byte), which int() refuses.
    if (
        not colon
        or not run
        or not (seq.isascii() and seq.isdigit())
        or len(seq) > 18
        or len(run) > MAX_RUN_ID
    ):
        return None
    return run, int(seq)
