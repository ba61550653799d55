"""What every protocol's encoder shares (`agentrt.sse`): the `Encoder` base, the chunks of an
event (`chunks_of`), what a client was sent of a run (`Sent`), and the wire ids of tool calls.

An encoder turns each event into the protocol's chunks (JSON objects); the response frames them.
Each holds the state of one response and is not shared. A call that waits for approval is named on
the wire by `"<run id>:<call id>"` (Vercel's `approvalId`, AG-UI's interrupt `id`): the client's
answer names both the stored turn and the call, and the server checks both against what it stored
(see `agentrt.sse.endpoint`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Final

import orjson
from pydantic_core import to_json, to_jsonable_python
from sse_starlette import ServerSentEvent

from .._events import ApprovalRequested, Completed, Reset, TextDelta, ToolCallRequested

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from .._events import Event, Result
    from ..rag._types import Content

Chunk = dict[str, Any]

TOOL_FAILED: Final = "the tool call failed"
TOOL_DENIED: Final = "the tool call was denied"


def approval_id(run_id: str, call_id: str) -> str:
    """The wire id of a call that waits for approval: the stored turn's run id, then the call's id."""
    return f"{run_id}:{call_id}"


def approval_json(approval: ApprovalRequested) -> dict[str, Any]:
    """What a client is told of a turn that stopped for approval (the `approval_required` event's
    data): its run id, each waiting call (id, tool, arguments as validated), when it expires."""
    return {
        "run_id": approval.run_id,
        "calls": [{"id": c.id, "name": c.tool, "arguments": c.arguments} for c in approval.calls],
        "expires_at": approval.expires_at,
    }


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(12).hex()}"


def dumps(data: Any) -> str:
    """JSON text of event data (pydantic-core for what orjson refuses: ints past 64 bits)."""
    try:
        return orjson.dumps(data).decode()
    except TypeError:
        return to_json(data, fallback=str).decode()


class Encoder:
    """One response's protocol state: what each event becomes on the wire."""

    __slots__ = ()

    done_marker = False
    """Whether the stream ends with `data: [DONE]`."""
    headers: Mapping[str, str] = {}
    sep = "\r\n"
    """The line separator (sse-starlette's default; AG-UI's reader splits on `\n\n` only)."""
    replay: Sequence[Chunk] = ()
    """The first of `opened`'s chunks, in a run's log only for a reader from the log's start (a
    resume's replay): the response that started the run reads from after them."""

    def frame(self, chunk: Any) -> ServerSentEvent:
        """A chunk as an SSE event: its JSON as the data (`[DONE]` as it is)."""
        return ServerSentEvent(data=chunk if chunk == DONE else dumps(chunk), sep=self.sep)

    def opened(self) -> list[Chunk]:
        raise NotImplementedError

    def event(self, event: Event) -> Sequence[Any]:
        raise NotImplementedError

    def partial(self, value: Any) -> list[Chunk]:
        raise NotImplementedError

    def completed(self, result: Result[Any], done: Chunk) -> list[Chunk]:
        raise NotImplementedError

    def approval(self, approval: ApprovalRequested) -> list[Any]:
        """The chunks that end a run stopped for a human's approval of tool calls."""
        raise NotImplementedError

    def failed(self, error: Chunk) -> list[Chunk]:
        raise NotImplementedError

    def stopped(self, sent: Sent) -> list[Chunk]:
        """The chunks that end a stopped run, given what the client has (`sent`)."""
        raise NotImplementedError


def chunks_of(
    event: Event,
    encoder: Encoder,
    snapshots: Any,
    result_json: Callable[[Any], dict[str, Any]],
) -> Sequence[Any]:
    """What `event` becomes on the wire through `encoder`; `snapshots` is a `PartialStream`'s (its
    values so far are sent too), or `None`."""
    kind = type(event)
    if kind is Completed:
        result = event.result  # type: ignore[union-attr]
        return encoder.completed(result, result_json(result))
    if kind is ApprovalRequested:
        return encoder.approval(event)  # type: ignore[arg-type]
    chunks = encoder.event(event)
    if snapshots is not None:
        if kind is TextDelta:
            if snapshots.feed(event.text):  # type: ignore[union-attr]
                return [*chunks, *encoder.partial(to_jsonable_python(snapshots.value, fallback=str))]
        elif kind is Reset or kind is ToolCallRequested:
            snapshots.reset()  # the value starts over from the next answer
    return chunks


DONE: Final = "[DONE]"
"""The Vercel stream's last data (a chunk of its own)."""


class Sent:
    """What the client was sent of a run, chunk by chunk as each send returned: the parts still
    open (in order), whether the run's last chunk went out, and whether a send was cut short (the
    client may or may not have that chunk). A stop's last chunks are made from this, not from the
    encoder's state, which runs ahead of the sends."""

    __slots__ = ("begun", "done", "ended", "open", "pending", "uncertain")

    OPENS: Final = {
        "TEXT_MESSAGE_START": "TEXT_MESSAGE_END",
        "REASONING_MESSAGE_START": "REASONING_MESSAGE_END",
        "TOOL_CALL_START": "TOOL_CALL_END",
    }
    CLOSES: Final = frozenset(OPENS.values())
    ENDS: Final = frozenset({"RUN_FINISHED", "RUN_ERROR", "finish", "error"})

    def __init__(self) -> None:
        self.open: dict[str, str] = {}
        """The id of each open part -> the type that closes it."""
        self.begun = False
        """Whether the run's first chunk went out (AG-UI's `RUN_STARTED`)."""
        self.ended = False
        self.done = False
        """Whether `[DONE]` went out."""
        self.uncertain = False
        self.pending: tuple[bytes, Any] | None = None
        """The chunk handed to the server to send, encoded, until its send returned."""

    def confirm(self, chunk: Any) -> None:
        """`chunk` reached the client."""
        if chunk == DONE:
            self.done = True
            return
        kind = chunk.get("type") if type(chunk) is dict else None
        if kind in self.OPENS:
            self.open[chunk.get("messageId") or chunk["toolCallId"]] = self.OPENS[kind]
        elif kind in self.CLOSES:
            self.open.pop(chunk.get("messageId") or chunk["toolCallId"], None)
        elif kind in self.ENDS:
            self.ended = True
        elif kind == "RUN_STARTED" or kind == "start":
            self.begun = True

    def unsure(self, chunk: Any) -> None:
        """A send of `chunk` was cut short: whether the client has it is unknown."""
        kind = chunk.get("type") if type(chunk) is dict else None
        if kind in self.OPENS or kind in self.CLOSES or kind in self.ENDS or kind == "RUN_STARTED":
            self.uncertain = True


class ToolIds:
    """The wire id of each tool call: the model's, made unique in the run (a provider may repeat
    ids across rounds, and agentrt's own fallback ids restart at `call_0` in each response). A
    resumed turn's stream starts with the ids its client already has (`resume`)."""

    __slots__ = ("_by_call", "_latest", "_used")

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._by_call: dict[tuple[int, str], str] = {}
        self._latest: dict[str, str] = {}
        """Each call id's latest wire id (a waiting call's; a resumed call's, from the client)."""

    def new(self, round_: int, call_id: str) -> str:
        wire = call_id
        suffix = 1
        while wire in self._used:
            suffix += 1
            wire = f"{call_id}~{suffix}"
        self._used.add(wire)
        self._by_call[(round_, call_id)] = wire
        self._latest[call_id] = wire
        return wire

    def of(self, round_: int, call_id: str) -> str:
        wire = self._by_call.get((round_, call_id))
        return wire if wire is not None else self._latest.get(call_id, call_id)

    def latest(self, call_id: str) -> str:
        return self._latest.get(call_id, call_id)

    def resume(self, used: Iterable[str], wires: Mapping[str, str]) -> None:
        """A resumed turn: the wire ids the client has (taken), and the resumed calls' own."""
        self._used.update(used)
        self._latest.update(wires)


def source_document(index: int, content: Content) -> Chunk:
    """A retrieved content as a Vercel `source-document` part: its id, a title (the metadata's
    `title`, else its `source`, else the id), and the `source` as the file name; never its text."""
    metadata = content.metadata
    source_id = content.id or f"source_{index + 1}"
    title = metadata.get("title") or metadata.get("source") or source_id
    part: Chunk = {
        "type": "source-document",
        "sourceId": source_id,
        "mediaType": "text/plain",
        "title": str(title),
    }
    source = metadata.get("source")
    if isinstance(source, str):
        part["filename"] = source
    return part
