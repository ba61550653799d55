"""The frontends' streaming protocols, as adapters over one invocation's events (`agentrt.sse`).

- `VercelUI`: the Vercel AI SDK's UI message stream, v1 (what `useChat` reads, AI SDK 5 to 7): `start`,
  `text-*` and `reasoning-*` parts, `data-value` (a structured answer's value so far), `tool-input-*`
  and `tool-output-*` parts keyed by the model's tool-call ids (`tool-output-denied` for a call a
  human denied), `tool-approval-request` (a call that waits for a human: the turn stopped),
  `finish`, `error`, `abort`, then `[DONE]`. It cannot withdraw text: a method whose stream may reset
  (a `chunked` output guardrail, a structured answer that may be repaired) has its text sent whole at
  the end.
- `AgUI`: AG-UI 1.0 events: `RUN_STARTED`, `TEXT_MESSAGE_*`, `REASONING_MESSAGE_*`, `TOOL_CALL_*`,
  `STATE_SNAPSHOT` (a structured answer's value so far), `MESSAGES_SNAPSHOT` (after a `Reset`, and
  before `RUN_ERROR`: the withdrawn text is gone by id), `RUN_FINISHED` (with its outcome: `success`,
  `cancelled`, or `interrupt` with one interrupt per call that waits for a human) or `RUN_ERROR`.

A call that waits for approval is named on the wire by `"<run id>:<call id>"` (Vercel's `approvalId`,
AG-UI's interrupt `id`): the client's answer names both the stored turn and the call, and the server
checks both against what it stored (see `agentrt.sse.endpoint`).

An encoder turns each event into the protocol's chunks (JSON objects); the endpoint frames them. Each
holds the state of one response and is not shared.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import orjson
from pydantic_core import to_json, to_jsonable_python
from sse_starlette import ServerSentEvent

from ._events import (
    ApprovalRequested,
    Completed,
    FinishReason,
    Reset,
    Retrieved,
    TextDelta,
    ThinkingDelta,
    ToolCallRequested,
    ToolExecuted,
    ToolOutcome,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from ._events import Event, Result
    from .rag._types import Content

__all__ = ["PROTOCOLS", "AgUI", "Encoder", "VercelUI", "approval_id", "approval_json"]

PROTOCOLS: Final = ("agentrt", "vercel-ui", "ag-ui")

Chunk = dict[str, Any]

_FINISH: Final[dict[FinishReason | None, str]] = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.TOOL_CALLS: "tool-calls",
    FinishReason.CONTENT_FILTER: "content-filter",
    FinishReason.OTHER: "other",
    None: "stop",
}

_TOOL_FAILED: Final = "the tool call failed"
_TOOL_DENIED: Final = "the tool call was denied"

APPROVAL_REASON: Final = "tool_approval"
"""An AG-UI interrupt's `reason` for a tool call that waits for a human."""

APPROVAL_RESPONSE: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string", "description": "why it was denied (the model is told)"},
        "arguments": {"type": "object", "description": "run it with these arguments instead"},
    },
    "required": ["approved"],
    "additionalProperties": False,
}
"""The JSON schema of an AG-UI resume entry's `payload` for a tool approval (its `responseSchema`)."""


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


def _arguments(text: str) -> Any:
    """A tool call's arguments as JSON, or the text the model wrote when it is not JSON."""
    try:
        return orjson.loads(text) if text.strip() else {}
    except orjson.JSONDecodeError:
        return text


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


class _ToolIds:
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


def _source_document(index: int, content: Content) -> Chunk:
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


def _agui_sources(contents: Sequence[Content]) -> list[Chunk]:
    """Retrieved contents as AG-UI's `sources` (`sourceId`, `title`, `filename`; no text)."""
    parts = [_source_document(index, content) for index, content in enumerate(contents)]
    return [{k: v for k, v in part.items() if k not in ("type", "mediaType")} for part in parts]


def rebuilt(message_id: str, message: Mapping[str, Any]) -> list[Chunk]:
    """The UI message stream chunks that make the Vercel AI SDK's client build a client's assistant
    `message` (a UIMessage as JSON) from nothing: `start` (with its metadata), then each part as
    the stream made it: text and reasoning (`-start`, `-delta`, `-end` unless it is still
    streaming), sources, files, data parts, step starts, and tool parts (their input, the approval
    asked and its answer, their output, denial or error). A part of another kind, or malformed, is
    left out, as is provider metadata (this module's streams send none)."""
    start: Chunk = {"type": "start", "messageId": message_id}
    if message.get("metadata") is not None:
        start["messageMetadata"] = message["metadata"]
    out = [start]
    parts = message.get("parts")
    for number, part in enumerate(parts if isinstance(parts, list) else ()):
        if isinstance(part, dict) and isinstance(part.get("type"), str):
            out += _rebuilt_part(f"part_{number}", part)
    return out


def _rebuilt_part(part_id: str, part: dict[str, Any]) -> list[Chunk]:
    kind: str = part["type"]
    if kind in ("text", "reasoning"):
        text = part.get("text")
        if not isinstance(text, str):
            return []
        if isinstance(part.get("id"), str):  # a reasoning part keeps its id
            part_id = part["id"]
        out: list[Chunk] = [
            {"type": f"{kind}-start", "id": part_id},
            {"type": f"{kind}-delta", "id": part_id, "delta": text},
        ]
        if part.get("state") != "streaming":
            out.append({"type": f"{kind}-end", "id": part_id})
        return out
    if kind == "step-start":
        return [{"type": "start-step"}]
    if kind == "source-document" or kind == "source-url" or kind == "file" or kind.startswith("data-"):
        fields = _PART_FIELDS.get(kind, ("id", "data"))
        chunk = {"type": kind, **{key: part[key] for key in fields if part.get(key) is not None}}
        return [chunk] if all(key in chunk for key in _PART_REQUIRED.get(kind, ("data",))) else []
    call = part.get("toolCallId")
    if not kind.startswith("tool-") or not isinstance(call, str):
        return []
    if part.get("state") == "input-streaming":
        out = [{"type": "tool-input-start", "toolCallId": call, "toolName": kind[5:]}]
        if isinstance(part.get("rawInput"), str):
            out.append({"type": "tool-input-delta", "toolCallId": call, "inputTextDelta": part["rawInput"]})
        return out
    out = [
        {"type": "tool-input-available", "toolCallId": call, "toolName": kind[5:], "input": part.get("input")}
    ]
    approval = part.get("approval")
    if isinstance(approval, dict) and isinstance(approval.get("id"), str):
        asked: Chunk = {"type": "tool-approval-request", "approvalId": approval["id"], "toolCallId": call}
        if "descriptor" in approval:
            asked["approvalDescriptor"] = approval["descriptor"]
        out.append(asked)
        if isinstance(approval.get("approved"), bool):
            answered: Chunk = {
                "type": "tool-approval-response",
                "approvalId": approval["id"],
                "approved": approval["approved"],
            }
            if isinstance(approval.get("reason"), str):
                answered["reason"] = approval["reason"]
            out.append(answered)
    state = part.get("state")
    if state == "output-available":
        out.append({"type": "tool-output-available", "toolCallId": call, "output": part.get("output")})
    elif state == "output-denied":
        out.append({"type": "tool-output-denied", "toolCallId": call})
    elif state == "output-error" and isinstance(part.get("errorText"), str):
        out.append({"type": "tool-output-error", "toolCallId": call, "errorText": part["errorText"]})
    return out


_PART_FIELDS: Final = {
    "source-document": ("sourceId", "mediaType", "title", "filename"),
    "source-url": ("sourceId", "url", "title"),
    "file": ("mediaType", "url"),
}
_PART_REQUIRED: Final = {
    "source-document": ("sourceId", "mediaType", "title"),
    "source-url": ("sourceId", "url"),
    "file": ("mediaType", "url"),
}


class VercelUI(Encoder):
    """The Vercel AI SDK UI message stream (`x-vercel-ai-ui-message-stream: v1`)."""

    done_marker = True
    headers: Mapping[str, str] = {"x-vercel-ai-ui-message-stream": "v1", "x-accel-buffering": "no"}
    sep = "\n"

    __slots__ = (
        "_hold",
        "_ids",
        "_parts",
        "_reasoning",
        "_structured",
        "_text",
        "details",
        "message_id",
        "replay",
    )

    def __init__(
        self, message_id: str, *, thinking: bool, tool_details: bool, hold: bool, structured: bool
    ) -> None:
        self.message_id = message_id
        self.details = tool_details
        self._hold = hold
        self._structured = structured
        self._reasoning: str | None = None if thinking else ""  # "": never sent
        self._text: str | None = None
        self._parts = 0
        self._ids = _ToolIds()
        self.replay: Sequence[Chunk] = ()

    def opened(self) -> list[Chunk]:
        return [*self.replay, {"type": "start", "messageId": self.message_id}]

    def _close(self, out: list[Chunk]) -> None:
        if self._text:
            out.append({"type": "text-end", "id": self._text})
            self._text = None
        if self._reasoning:
            out.append({"type": "reasoning-end", "id": self._reasoning})
            self._reasoning = None

    def _part(self, kind: str) -> str:
        self._parts += 1
        return f"{kind}_{self._parts}"

    def event(self, event: Event) -> list[Chunk]:
        kind = type(event)
        if kind is TextDelta:
            if self._hold or self._structured:
                return []
            text = self._text
            if text is not None:
                return [{"type": "text-delta", "id": text, "delta": event.text}]  # type: ignore[union-attr]
            out: list[Chunk] = []
            if self._reasoning:
                out.append({"type": "reasoning-end", "id": self._reasoning})
                self._reasoning = None
            self._text = text = self._part("text")
            out.append({"type": "text-start", "id": text})
            out.append({"type": "text-delta", "id": text, "delta": event.text})  # type: ignore[union-attr]
            return out
        if kind is ThinkingDelta:
            if self._reasoning == "" or self._hold:
                return []
            out = []
            if self._reasoning is None:
                if self._text:
                    out.append({"type": "text-end", "id": self._text})
                    self._text = None
                self._reasoning = self._part("reasoning")
                out.append({"type": "reasoning-start", "id": self._reasoning})
            out.append({"type": "reasoning-delta", "id": self._reasoning, "delta": event.text})  # type: ignore[union-attr]
            return out
        if kind is ToolCallRequested:
            assert isinstance(event, ToolCallRequested)
            out = []
            self._close(out)
            call = event.call
            wire = self._ids.new(event.round, call.id)
            arguments = call.arguments if self.details else "{}"
            out.append({"type": "tool-input-start", "toolCallId": wire, "toolName": call.name})
            out.append({"type": "tool-input-delta", "toolCallId": wire, "inputTextDelta": arguments})
            out.append(
                {
                    "type": "tool-input-available",
                    "toolCallId": wire,
                    "toolName": call.name,
                    "input": _arguments(arguments),
                }
            )
            return out
        if kind is ToolExecuted:
            assert isinstance(event, ToolExecuted)
            execution = event.execution
            wire = self._ids.of(execution.round, execution.call_id)
            if execution.outcome is not ToolOutcome.SUCCESS:
                if execution.outcome is ToolOutcome.DENIED:
                    return [{"type": "tool-output-denied", "toolCallId": wire}]
                return [{"type": "tool-output-error", "toolCallId": wire, "errorText": _TOOL_FAILED}]
            output = execution.result if self.details else None
            return [{"type": "tool-output-available", "toolCallId": wire, "output": output}]
        if kind is Retrieved:
            assert isinstance(event, Retrieved)
            return [_source_document(index, content) for index, content in enumerate(event.contents)]
        if kind is Reset and not self._hold:
            # Only a structured answer's repair resets here (text is held otherwise): its value
            # parts are replaced by the next ones.
            return []
        return []

    def partial(self, value: Any) -> list[Chunk]:
        return [{"type": "data-value", "id": "value", "data": value}]

    def completed(self, result: Result[Any], done: Chunk) -> list[Chunk]:
        out: list[Chunk] = []
        self._close(out)
        if self._hold:  # the answer that passed, whole
            if result.thinking and self._reasoning is None:
                part = self._part("reasoning")
                out.append({"type": "reasoning-start", "id": part})
                out.append({"type": "reasoning-delta", "id": part, "delta": result.thinking})
                out.append({"type": "reasoning-end", "id": part})
            if result.text and not self._structured:
                part = self._part("text")
                out.append({"type": "text-start", "id": part})
                out.append({"type": "text-delta", "id": part, "delta": result.text})
                out.append({"type": "text-end", "id": part})
        if self._structured:
            out.append({"type": "data-value", "id": "value", "data": done["value"]})
        metadata = {key: done[key] for key in ("usage", "attempts", "invocation_id")}
        out.append(
            {"type": "finish", "finishReason": _FINISH[result.finish_reason], "messageMetadata": metadata}
        )
        return out

    def approval(self, approval: ApprovalRequested) -> list[Chunk]:
        # The SDK's own approval flow: a `tool-approval-request` per waiting call (its part goes to
        # `approval-requested`), then the message finishes; the client's next request carries the
        # answers (`approval-responded` parts) and the resumed stream continues this message. Held
        # text (before the calls) is not released: no guardrail judged it.
        out: list[Chunk] = []
        self._close(out)
        for call in approval.calls:
            out.append(
                {
                    "type": "tool-approval-request",
                    "approvalId": approval_id(approval.run_id, call.id),
                    "toolCallId": self._ids.latest(call.id),
                    # What a human decides on: the arguments as validated (whatever `tool_details`
                    # says of the part's input), as the SDK's opaque descriptor.
                    "approvalDescriptor": {"tool": call.tool, "arguments": call.arguments},
                }
            )
        finish: Chunk = {"type": "finish", "finishReason": "tool-calls"}
        partial = approval.partial
        if partial is not None:
            usage = partial.usage
            finish["messageMetadata"] = {
                "usage": {
                    "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens,
                    "total_tokens": usage.total_tokens,
                    "estimated": usage.estimated,
                },
                "attempts": partial.attempts,
                "invocation_id": partial.invocation_id,
            }
        out.append(finish)
        return out

    def resume(self, used: Iterable[str], wires: Mapping[str, str]) -> None:
        """This stream continues a message whose tool parts have ids `used`; `wires` maps each
        resumed call's id to its part's."""
        self._ids.resume(used, wires)

    def replaying(self, message: Mapping[str, Any]) -> None:
        """This stream, the run of an approval's answer, continues the client's assistant `message`
        (as the answer's request carried it): its run's log begins with the chunks that rebuild it
        (see `rebuilt`). The SDK's resume (`useChat({resume: true})`) replays a run from its first
        `start` and starts the message again there: the answer's run alone would leave it without
        the parts before the answer (the call the answer approved among them). The message is the
        client's own, and a resume is its conversation owner's only: what the client had is what
        it gets back, even when the runs that made it have expired."""
        self.replay = rebuilt(self.message_id, message)

    def failed(self, error: Chunk) -> list[Chunk]:
        out: list[Chunk] = []
        self._close(out)
        out.append({"type": "error", "errorText": error["message"]})
        return out

    def stopped(self, sent: Sent) -> list[Chunk]:
        # `abort` leaves open parts as they are (the client marks them streaming): no `-end` that
        # could name a part the client never got.
        return [] if sent.ended or sent.done else [{"type": "abort", "reason": "stopped"}]


class AgUI(Encoder):
    """AG-UI 1.0 events (`RUN_STARTED` ... `RUN_FINISHED` / `RUN_ERROR`)."""

    headers: Mapping[str, str] = {"x-accel-buffering": "no"}
    sep = "\n"

    __slots__ = (
        "_assistant",
        "_count",
        "_ids",
        "_messages",
        "_pieces",
        "_reasoning",
        "_since_reset",
        "_structured",
        "_text",
        "_thinking",
        "details",
        "input_messages",
        "run_id",
        "thread_id",
    )

    def __init__(
        self,
        thread_id: str,
        run_id: str,
        input_messages: list[Any],
        *,
        thinking: bool,
        tool_details: bool,
        structured: bool,
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.input_messages = input_messages
        self.details = tool_details
        self._thinking = thinking
        self._structured = structured
        self._text: str | None = None
        """The open text message's id."""
        self._reasoning: str | None = None
        self._assistant: Chunk | None = None
        """The assistant message of the response under way (as the client assembles it)."""
        self._messages: list[Chunk] = []
        """This run's messages so far, as the client has them (for a messages snapshot)."""
        self._pieces: dict[str, list[str]] = {}
        """The text of each message so far, by id, in pieces (joined for a snapshot only)."""
        self._since_reset: list[Chunk] = []
        """Text and reasoning messages released since the last reset (what a reset withdraws)."""
        self._count = 0
        self._ids = _ToolIds()

    def _id(self, kind: str) -> str:
        self._count += 1
        return f"{self.run_id}-{kind}{self._count}"

    def opened(self) -> list[Chunk]:
        return [{"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id}]

    def _close(self, out: list[Chunk]) -> None:
        if self._text is not None:
            out.append({"type": "TEXT_MESSAGE_END", "messageId": self._text})
            self._text = None
        if self._reasoning is not None:
            out.append({"type": "REASONING_MESSAGE_END", "messageId": self._reasoning})
            self._reasoning = None

    def _assistant_message(self) -> Chunk:
        message = self._assistant
        if message is None:
            message = self._assistant = {"id": self._id("m"), "role": "assistant", "content": ""}
            self._messages.append(message)
        return message

    def event(self, event: Event) -> list[Chunk]:
        kind = type(event)
        if kind is TextDelta:
            if self._structured:
                return []
            delta: str = event.text  # type: ignore[union-attr]
            if self._text is not None:
                self._pieces[self._text].append(delta)
                return [{"type": "TEXT_MESSAGE_CONTENT", "messageId": self._text, "delta": delta}]
            out: list[Chunk] = []
            self._close(out)
            message = self._assistant_message()
            self._text = message["id"]
            self._pieces.setdefault(self._text, []).append(delta)
            self._since_reset.append(message)
            out.append({"type": "TEXT_MESSAGE_START", "messageId": self._text, "role": "assistant"})
            out.append({"type": "TEXT_MESSAGE_CONTENT", "messageId": self._text, "delta": delta})
            return out
        if kind is ThinkingDelta:
            if not self._thinking:
                return []
            delta = event.text  # type: ignore[union-attr]
            out = []
            if self._reasoning is None:
                if self._text is not None:
                    out.append({"type": "TEXT_MESSAGE_END", "messageId": self._text})
                    self._text = None
                reasoning = {"id": self._id("r"), "role": "reasoning", "content": ""}
                self._messages.append(reasoning)
                self._since_reset.append(reasoning)
                self._reasoning = reasoning["id"]
                self._pieces[self._reasoning] = []
                out.append(
                    {"type": "REASONING_MESSAGE_START", "messageId": self._reasoning, "role": "reasoning"}
                )
            self._pieces[self._reasoning].append(delta)
            out.append({"type": "REASONING_MESSAGE_CONTENT", "messageId": self._reasoning, "delta": delta})
            return out
        if kind is ToolCallRequested:
            assert isinstance(event, ToolCallRequested)
            out = []
            self._close(out)
            call = event.call
            wire = self._ids.new(event.round, call.id)
            message = self._assistant_message()
            arguments = call.arguments if self.details else ""
            message.setdefault("toolCalls", []).append(
                {"id": wire, "type": "function", "function": {"name": call.name, "arguments": arguments}}
            )
            start = {"type": "TOOL_CALL_START", "toolCallId": wire, "toolCallName": call.name}
            start["parentMessageId"] = message["id"]
            out.append(start)
            if arguments:
                out.append({"type": "TOOL_CALL_ARGS", "toolCallId": wire, "delta": arguments})
            out.append({"type": "TOOL_CALL_END", "toolCallId": wire})
            return out
        if kind is ToolExecuted:
            assert isinstance(event, ToolExecuted)
            execution = event.execution
            wire = self._ids.of(execution.round, execution.call_id)
            if self.details:
                content = execution.result
            elif execution.outcome is ToolOutcome.SUCCESS:
                content = "done"
            else:
                content = _TOOL_DENIED if execution.outcome is ToolOutcome.DENIED else _TOOL_FAILED
            message = {
                "id": self._id("t"),
                "role": "tool",
                "toolCallId": wire,
                "content": content,
            }
            self._messages.append(message)
            self._assistant = None  # what the model says next is a new assistant message
            return [
                {
                    "type": "TOOL_CALL_RESULT",
                    "messageId": message["id"],
                    "toolCallId": wire,
                    "content": content,
                    "role": "tool",
                }
            ]
        if kind is Retrieved:  # AG-UI has no event for sources: a CUSTOM one, without the text
            assert isinstance(event, Retrieved)
            return [{"type": "CUSTOM", "name": "sources", "value": _agui_sources(event.contents)}]
        if kind is Reset:
            out = []
            self._withdraw(out)
            return out
        return []

    def _withdraw(self, out: list[Chunk]) -> None:
        """Close what is open and withdraw the text and reasoning released since the last reset
        (a `MESSAGES_SNAPSHOT` without them, by id): a client keeps what it was sent otherwise."""
        self._close(out)
        withdrawn = self._since_reset
        self._since_reset = []
        if self._structured or not withdrawn:
            return
        emptied: list[Chunk] = []
        for message in withdrawn:
            if message["role"] == "reasoning":
                emptied.append(message)
            if message.get("toolCalls"):
                self._pieces.pop(message["id"], None)  # its tool calls stand; its text is withdrawn
            else:
                self._messages.remove(message)
                if message is self._assistant:
                    self._assistant = None
        pieces = self._pieces
        messages = [
            {**m, "content": "".join(pieces[m["id"]])} if m["id"] in pieces else m for m in self._messages
        ]
        if emptied and not any(m["role"] == "reasoning" for m in messages):
            # A client keeps its reasoning messages when a snapshot has none: withdrawn
            # reasoning is sent emptied, so that it is replaced rather than kept.
            messages.extend({**m, "content": ""} for m in emptied)
        out.append({"type": "MESSAGES_SNAPSHOT", "messages": [*self.input_messages, *messages]})

    def partial(self, value: Any) -> list[Chunk]:
        return [{"type": "STATE_SNAPSHOT", "snapshot": value}]

    def completed(self, result: Result[Any], done: Chunk) -> list[Chunk]:
        out: list[Chunk] = []
        self._close(out)
        if self._structured:
            out.append({"type": "STATE_SNAPSHOT", "snapshot": done["value"]})
        finished: Chunk = {"type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id}
        # The sources as the `sources` CUSTOM event has them: never the documents' text.
        finished["result"] = {**done, "sources": _agui_sources(result.sources)}
        finished["outcome"] = {"type": "success"}
        out.append(finished)
        return out

    def approval(self, approval: ApprovalRequested) -> list[Chunk]:
        # AG-UI 1.0's interrupt outcome: one interrupt per waiting call, bound to its tool call; the
        # next run answers each in its input's `resume` (see `APPROVAL_RESPONSE`).
        out: list[Chunk] = []
        self._close(out)
        expires = approval.expires_at
        interrupts: list[Chunk] = []
        for call in approval.calls:
            interrupt: Chunk = {
                "id": approval_id(approval.run_id, call.id),
                "reason": APPROVAL_REASON,
                "message": f"Allow the call of {call.tool}?",
                "toolCallId": self._ids.latest(call.id),
                "responseSchema": APPROVAL_RESPONSE,
                "metadata": {"tool": call.tool, "arguments": call.arguments},
            }
            if expires is not None:
                moment = datetime.fromtimestamp(expires, UTC).isoformat(timespec="milliseconds")
                interrupt["expiresAt"] = moment.replace("+00:00", "Z")
            interrupts.append(interrupt)
        out.append(
            {
                "type": "RUN_FINISHED",
                "threadId": self.thread_id,
                "runId": self.run_id,
                "outcome": {"type": "interrupt", "interrupts": interrupts},
            }
        )
        return out

    def resume(self, call_ids: Iterable[str]) -> None:
        """This run resumes a turn whose waiting calls are `call_ids`: the tool calls of the input's
        messages are the client's, and each resumed call's is the latest of its id there."""
        used: list[str] = []
        wires: dict[str, str] = {}
        wanted = set(call_ids)
        for message in self.input_messages:
            calls = message.get("toolCalls") if isinstance(message, dict) else None
            for call in calls if isinstance(calls, list) else ():
                wire = call.get("id") if isinstance(call, dict) else None
                if not isinstance(wire, str):
                    continue
                used.append(wire)
                base, tilde, suffix = wire.rpartition("~")
                if wire in wanted:
                    wires[wire] = wire
                elif tilde and suffix.isdigit() and base in wanted:  # made unique (`_ToolIds.new`)
                    wires[base] = wire
        self._ids.resume(used, wires)

    def failed(self, error: Chunk) -> list[Chunk]:
        # An error voids the answer (nothing is stored): its text is withdrawn before RUN_ERROR,
        # as a reset withdraws it. Tool calls and their results stand: they ran.
        out: list[Chunk] = []
        self._withdraw(out)
        out.append({"type": "RUN_ERROR", "message": error["message"], "code": error["type"]})
        return out

    def stopped(self, sent: Sent) -> list[Chunk]:
        if sent.ended:
            return []
        if sent.uncertain or not sent.begun:  # RUN_ERROR may come first, or with parts open
            return [{"type": "RUN_ERROR", "message": "the run was stopped", "code": "stopped"}]
        out: list[Chunk] = []
        for part, closer in reversed(sent.open.items()):
            key = "toolCallId" if closer == "TOOL_CALL_END" else "messageId"
            out.append({"type": closer, key: part})
        out.append(
            {
                "type": "RUN_FINISHED",
                "threadId": self.thread_id,
                "runId": self.run_id,
                "outcome": {"type": "cancelled"},
            }
        )
        return out
