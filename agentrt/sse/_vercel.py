"""The Vercel AI SDK's UI message stream, v1 (`protocol="vercel-ui"`: what `useChat` reads, AI SDK 5
to 7): `start`, `text-*` and `reasoning-*` parts, `data-value` (a structured answer's value so far),
`tool-input-*` and `tool-output-*` parts keyed by the model's tool-call ids (`tool-output-denied` for
a call a human denied), `tool-approval-request` (a call that waits for a human: the turn stopped),
`finish`, `error`, `abort`, then `[DONE]`. It cannot withdraw text: a method whose stream may reset
(a `chunked` output guardrail, a structured answer that may be repaired) has its text sent whole at
the end.

Its request is `useChat`'s (`{id, messages, trigger}`): the last message, the user's, fills the
method's message parameter; an assistant message with `approval-responded` tool parts resumes a
turn (`VercelWire`).
"""

from __future__ import annotations

import re
import typing
from typing import Any, Final, Literal

import orjson
from pydantic import Field

from .._approval import Approve, Deny
from .._errors import ConfigurationError
from .._events import (
    FinishReason,
    Reset,
    Retrieved,
    TextDelta,
    ThinkingDelta,
    ToolCallRequested,
    ToolExecuted,
    ToolOutcome,
)
from ._encoder import TOOL_FAILED, Chunk, Encoder, Sent, ToolIds, approval_id, new_id, source_document
from ._wire import Asked, Body, Resumption, Undecidable, Unreadable, Wire, decide, message_param

if typing.TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from .. import _approval
    from .._events import ApprovalRequested, Event, Result

_FINISH: Final[dict[FinishReason | None, str]] = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.TOOL_CALLS: "tool-calls",
    FinishReason.CONTENT_FILTER: "content-filter",
    FinishReason.OTHER: "other",
    None: "stop",
}


def _arguments(text: str) -> Any:
    """A tool call's arguments as JSON, or the text the model wrote when it is not JSON."""
    try:
        return orjson.loads(text) if text.strip() else {}
    except orjson.JSONDecodeError:
        return text


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
        self._ids = ToolIds()
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
                return [{"type": "tool-output-error", "toolCallId": wire, "errorText": TOOL_FAILED}]
            output = execution.result if self.details else None
            return [{"type": "tool-output-available", "toolCallId": wire, "output": output}]
        if kind is Retrieved:
            assert isinstance(event, Retrieved)
            return [source_document(index, content) for index, content in enumerate(event.contents)]
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


_ENVELOPE: Final[dict[str, Any]] = {
    "v_id": (str, Field(alias="id")),
    "v_messages": (list[dict[str, Any]], Field(alias="messages", min_length=1)),
    "v_trigger": (Literal["submit-message", "regenerate-message"], Field("submit-message", alias="trigger")),
}


def _text(body: Any) -> str:
    if body.v_trigger != "submit-message":
        raise Unreadable(("trigger",), "regenerating a message is not supported: submit a new one")
    last = body.v_messages[-1]
    if last.get("role") != "user":
        raise Unreadable(
            ("messages", len(body.v_messages) - 1, "role"), "the last message must be the user's"
        )
    parts = last.get("parts")
    texts = [
        part["text"]
        for part in (parts if isinstance(parts, list) else ())
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    ]
    if not texts:
        raise Unreadable(
            ("messages", len(body.v_messages) - 1, "parts"), "the user's message has no text part"
        )
    return "".join(texts)


_MESSAGE_ID: Final = re.compile(r"[\w.:~-]{1,256}", re.ASCII)
"""A client's message id the resumed stream goes on with (and names its run by)."""


def _resumption(body: Any) -> Resumption | None:
    """The answers of a `useChat` request after `addToolApprovalResponse`: its last message is the
    assistant's, with tool parts in state `approval-responded` (`approval: {id, approved, reason?}`).
    Only those are read: the parts' input (arguments) is not, the decisions approve or deny what
    the server stored. `None` for a request that answers nothing."""
    if body.v_trigger != "submit-message":
        return None
    index = len(body.v_messages) - 1
    last = body.v_messages[index]
    parts = last.get("parts")
    if last.get("role") != "assistant" or not isinstance(parts, list):
        return None
    decisions: dict[str, _approval.Decision] = {}
    run: list[str] = []
    used: list[str] = []
    wires: dict[str, str] = {}
    for number, part in enumerate(parts):
        if not isinstance(part, dict):
            continue
        wire = part.get("toolCallId")
        if isinstance(wire, str):
            used.append(wire)
        if part.get("state") != "approval-responded":
            continue
        where = ("messages", index, "parts", number, "approval")
        approval = part.get("approval")
        if (
            not isinstance(approval, dict)
            or not isinstance(approval.get("id"), str)
            or not isinstance(approval.get("approved"), bool)
        ):
            raise Undecidable(where, "an approval-responded part carries approval {id, approved, reason?}")
        reason = approval.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise Undecidable((*where, "reason"), "the reason is not text")
        decision = Approve() if approval["approved"] else Deny(reason)  # no edits over this protocol
        call_id = decide(decisions, run, approval["id"], decision, where)
        if isinstance(wire, str):
            wires[call_id] = wire
    if not run:
        return None
    message_id = last.get("id")
    if not (isinstance(message_id, str) and _MESSAGE_ID.fullmatch(message_id)):
        message_id = None  # (it goes into a response header too)
    return Resumption(run[0], decisions, tuple(used), tuple(wires.items()), message_id)


class VercelWire(Wire):
    """The Vercel UI message stream: the user's message from `useChat`'s request, the method's
    other parameters from its other fields; a response is a run named by its message id (a resumed
    turn's stream continues the client's message)."""

    __slots__ = ()

    name = "vercel-ui"

    def body_of(self, message: str | None) -> Body:
        settings = self.settings
        spec = settings.spec
        if settings.release == "optimistic":
            raise ConfigurationError(
                f"{spec.qualname}: the Vercel UI message stream cannot withdraw text, and the method's "
                "output guardrails release it optimistically (before they passed); use "
                "release='buffer' or 'chunked'"
            )
        message = message_param(spec, message)
        body = Body(spec, settings.request_budget, message=message, envelope=_ENVELOPE, extra="ignore")
        return body

    def read(self, raw: bytes) -> Asked:
        envelope: Any = self.body.model.model_validate_json(raw or b"{}")
        resuming = _resumption(envelope)
        if resuming is not None:
            return Asked(thread=envelope.v_id, resuming=resuming, envelope=envelope)
        return self.body.asked(envelope, _text(envelope), thread=envelope.v_id, envelope=envelope)

    async def encoder(self, asked: Asked) -> tuple[Encoder, str]:
        settings = self.settings
        runs = settings.runs
        resuming = asked.resuming
        if resuming is not None and resuming.message_id is not None:
            message_id = resuming.message_id  # the resumed stream continues the client's message
            # In a run manager it is a run of its own: the message's first run keeps its log.
            run_id = new_id("run") if runs is not None else message_id
        else:
            # The answer's message id, unguessable: it names the run.
            run_id = message_id = new_id("msg")
        encoder = VercelUI(
            message_id,
            thinking=settings.thinking,
            tool_details=settings.tool_details,
            hold=settings.release == "chunked",
            structured=settings.structured,
        )
        if resuming is not None:
            encoder.resume(resuming.used, dict(resuming.wires))
            if runs is not None:  # a resume replays the message from its start
                encoder.replaying(asked.envelope.v_messages[-1])
        return encoder, run_id

    def blank(self) -> Encoder:
        return VercelUI("msg", thinking=False, tool_details=False, hold=False, structured=False)
