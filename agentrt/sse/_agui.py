"""AG-UI 1.0 (`protocol="ag-ui"`): `RUN_STARTED`, `TEXT_MESSAGE_*`, `REASONING_MESSAGE_*`,
`TOOL_CALL_*`, `STATE_SNAPSHOT` (a structured answer's value so far), `MESSAGES_SNAPSHOT` (after a
`Reset`, and before `RUN_ERROR`: the withdrawn text is gone by id), `RUN_FINISHED` (with its outcome:
`success`, `cancelled`, or `interrupt` with one interrupt per call that waits for a human) or
`RUN_ERROR`.

Its request is `RunAgentInput`: the last message, the user's, fills the method's message parameter,
`forwardedProps` its other parameters; `resume` entries answer a stopped turn's interrupts
(`AgUIWire`).
"""

from __future__ import annotations

import typing
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .._approval import Approve, Deny
from .._errors import ConfigurationError
from .._events import Reset, Retrieved, TextDelta, ThinkingDelta, ToolCallRequested, ToolExecuted, ToolOutcome
from . import _runs
from ._encoder import TOOL_DENIED, TOOL_FAILED, Chunk, Encoder, Sent, ToolIds, approval_id, source_document
from ._errors import Refused, from_log, invalid, refusal
from ._wire import Asked, Body, Resumption, Undecidable, Unreadable, Wire, decide, message_param

if typing.TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from .. import _approval
    from .._events import ApprovalRequested, Event, Result
    from ..rag._types import Content

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


def _sources(contents: Sequence[Content]) -> list[Chunk]:
    """Retrieved contents as AG-UI's `sources` (`sourceId`, `title`, `filename`; no text)."""
    parts = [source_document(index, content) for index, content in enumerate(contents)]
    return [{k: v for k, v in part.items() if k not in ("type", "mediaType")} for part in parts]


class AgUI(Encoder):
    """AG-UI 1.0 events (`RUN_STARTED` ... `RUN_FINISHED` / `RUN_ERROR`)."""

    headers: Mapping[str, str] = {"x-accel-buffering": "no"}
    sep = "\n"

    __slots__ = (
        "_assistant",
        "_count",
        "_ended",
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
        self._ids = ToolIds()
        self._ended = False
        """Whether the run's `RUN_FINISHED` was made: the client takes nothing after it but
        `RUN_ERROR` (a turn that could not be stored)."""

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
                content = TOOL_DENIED if execution.outcome is ToolOutcome.DENIED else TOOL_FAILED
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
            return [{"type": "CUSTOM", "name": "sources", "value": _sources(event.contents)}]
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
        finished["result"] = {**done, "sources": _sources(result.sources)}
        finished["outcome"] = {"type": "success"}
        out.append(finished)
        self._ended = True
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
        self._ended = True
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
                elif tilde and suffix.isdigit() and base in wanted:  # made unique (`ToolIds.new`)
                    wires[base] = wire
        self._ids.resume(used, wires)

    def failed(self, error: Chunk) -> list[Chunk]:
        # An error voids the answer (nothing is stored): its text is withdrawn before RUN_ERROR,
        # as a reset withdraws it. Tool calls and their results stand: they ran. After RUN_FINISHED
        # (the turn's commit failed) the client takes no snapshot: the text stays, as it does on
        # the other protocols, and RUN_ERROR says it was not kept.
        out: list[Chunk] = []
        if not self._ended:
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


class _Input(BaseModel):
    """AG-UI's `RunAgentInput`, what the endpoint reads of it (the rest is ignored)."""

    model_config = ConfigDict(extra="ignore")

    # the protocol's names; at most what a resume's Last-Event-ID takes (`_runs.parse_event_id`).
    # The run id is a response header (`agentrt-run-id`) and a Last-Event-ID's first part too:
    # visible ASCII only (no CR LF, nothing past latin-1, no space a header would trim).
    threadId: str = Field(min_length=1, max_length=_runs.MAX_RUN_ID)
    runId: str = Field(min_length=1, max_length=_runs.MAX_RUN_ID, pattern=r"^[!-~]+$")
    messages: list[dict[str, Any]] = Field(min_length=1)
    forwardedProps: dict[str, Any] = Field(default_factory=dict)
    resume: list[Any] | None = None
    """AG-UI 1.0's answers to the interrupts of the run this one continues (`ResumeEntry`)."""


def _text(body: _Input) -> str:
    last = body.messages[-1]
    where = ("messages", len(body.messages) - 1)
    if last.get("role") != "user":
        raise Unreadable((*where, "role"), "the last message must be the user's")
    content = last.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        ]
        if texts:
            return "".join(texts)
    raise Unreadable((*where, "content"), "the user's message has no text")


class _ResumeEntry(BaseModel):
    """AG-UI's `ResumeEntry`, what the endpoint reads of it."""

    model_config = ConfigDict(extra="ignore", strict=True)

    interruptId: str  # the protocol's names
    status: Literal["resolved", "cancelled"]
    payload: Any = None


class _Answer(BaseModel):
    """A resolved tool approval's payload (`APPROVAL_RESPONSE`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    approved: bool
    reason: str | None = None
    arguments: dict[str, Any] | None = None


def _resumption(entries: list[Any]) -> Resumption:
    """The decisions of an AG-UI run's `resume` entries: `resolved` with a payload `{"approved":
    true, "arguments"?: {...}}` approves (with an edit), `{"approved": false, "reason"?: ...}`
    denies; `cancelled` denies."""
    decisions: dict[str, _approval.Decision] = {}
    run: list[str] = []
    for number, raw in enumerate(entries):
        where: tuple[str | int, ...] = ("resume", number)
        try:
            entry = _ResumeEntry.model_validate(raw)
        except ValidationError as error:
            raise Undecidable.of(error, where) from None
        decision: _approval.Decision
        if entry.status == "cancelled":
            decision = Deny()
        elif entry.payload is None:
            raise Undecidable(
                (*where, "payload"), "a resolved approval carries a payload {approved, reason?, arguments?}"
            )
        else:
            try:
                answer = _Answer.model_validate(entry.payload)
            except ValidationError as error:
                raise Undecidable.of(error, (*where, "payload")) from None
            if answer.approved:
                decision = Approve(arguments=answer.arguments)
            elif answer.arguments is not None:
                raise Undecidable((*where, "payload", "arguments"), "a denied call runs with no arguments")
            else:
                decision = Deny(answer.reason)
        decide(decisions, run, entry.interruptId, decision, (*where, "interruptId"))
    return Resumption(run[0], decisions)


class AgUIWire(Wire):
    """AG-UI: the user's message from `RunAgentInput`'s messages, the method's other parameters from
    its `forwardedProps`; a response is the run the client names (`runId`)."""

    __slots__ = ()

    name = "ag-ui"

    def body_of(self, message: str | None) -> Body:
        settings = self.settings
        spec = settings.spec
        if settings.runs is not None and spec.memory_param is None:
            raise ConfigurationError(
                f"{spec.qualname}: an AG-UI client names its runs (runId), and a method without a "
                "memory id has no conversation owner to check a resume or a stop against: any client "
                "naming a run id could read or stop it. Give the method a memory id (and endpoint a "
                "memory_id resolver) to keep its runs"
            )
        message = message_param(spec, message)
        return Body(spec, settings.request_budget, message=message, extra="ignore")

    def read(self, raw: bytes) -> Asked:
        envelope = _Input.model_validate_json(raw or b"{}")
        thread, run_id = envelope.threadId, envelope.runId
        if envelope.resume:
            resuming = _resumption(envelope.resume)
            return Asked(thread=thread, run_id=run_id, resuming=resuming, envelope=envelope)
        text = _text(envelope)
        try:
            validated = self.body.model.model_validate(envelope.forwardedProps)
        except ValidationError as error:
            raise Refused(invalid(error, ("forwardedProps",))) from None
        return self.body.asked(validated, text, thread=thread, run_id=run_id, envelope=envelope)

    async def encoder(self, asked: Asked) -> tuple[Encoder, str]:
        settings = self.settings
        thread, run_id = asked.thread, asked.run_id
        assert thread is not None
        assert run_id is not None
        encoder = AgUI(
            thread,
            run_id,
            asked.envelope.messages,
            thinking=settings.thinking,
            tool_details=settings.tool_details,
            structured=settings.structured,
        )
        if asked.resuming is not None:
            encoder.resume(asked.resuming.decisions)
        runs = settings.runs
        if runs is not None and await from_log(settings.spec, runs.log.find(run_id)) is not None:
            # The client names its runs, and a run's log (its ids) is kept after it ended.
            raise Refused(
                refusal(409, "run_exists", "a run with this id was started already; name a new one")
            )
        return encoder, run_id

    def blank(self) -> Encoder:
        return AgUI("thread", "run", [], thinking=False, tool_details=False, structured=False)
