"""How a structured answer is asked for: the output modes, and the forced "final answer" tool.

A method whose return type has a schema asks for it in one of four ways (`OutputMode`):

- `"schema"`: a JSON-schema response format (structured output), for models that declare
  `Capabilities.json_schema`;
- `"json"`: a JSON mode (`Capabilities.json_object`), with the schema said in the format instructions;
- `"instructions"`: short format instructions appended to the user message, nothing else;
- `"tool"`: a tool named `final_answer` whose parameters are the schema, forced by `tool_choice`, for
  models that follow a tool's parameters better than instructions (as pydantic-ai and instructor do).

`"auto"` (the default) picks the first of schema, tool (where the model declares
`Capabilities.tool_output`), JSON mode and instructions that the model can do.

In tool mode the `final_answer` call's arguments are the answer's text: the model's stream is read
through `AnswerChunks`, which turns that call's argument fragments into text deltas. So everything
after the model (held text, guardrails, partial snapshots, parsing, repair, memory) sees a JSON answer
as it would in JSON mode, and no call of a tool that never runs reaches the conversation. A model that
answers with text instead is read as in instructions mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, get_args

from .._events import Finish, TextDelta, ToolCallDelta
from ..models._protocol import ToolChoice, ToolSpec, aclose_iterator

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from .._events import ModelChunk
    from ..models._protocol import Capabilities
    from ._parsers import TypeParser

__all__ = ["ANSWER_TOOL", "MODES", "AnswerChunks", "AnswerTool", "OutputMode", "answer_tool", "resolve_mode"]

OutputMode = Literal["auto", "schema", "json", "instructions", "tool"]
MODES: Final[tuple[str, ...]] = get_args(OutputMode)

ANSWER_TOOL: Final = "final_answer"
"""The name of the tool that carries the answer in tool mode."""

FINAL_ANSWER_TOOL_PROMPT: Final = (
    f"The tool budget for this request is used up. Call no other tool: give your answer now with "
    f"{ANSWER_TOOL}, as well as you can, with the information you already have."
)
"""What the last request after a tool loop limit says in tool mode (`ToolSettings.on_limit`)."""


def resolve_mode(requested: str, capabilities: Capabilities) -> str:
    """The concrete mode (`schema`, `json`, `instructions` or `tool`) for `requested` on a model with
    `capabilities`. Raises `ValueError` (a sentence to name the method with) when the model cannot
    do what was asked."""
    if requested not in MODES:
        raise ValueError(f"output_mode must be one of {', '.join(map(repr, MODES))}, got {requested!r}")
    if requested == "auto":
        if capabilities.json_schema:
            return "schema"
        if capabilities.tool_output and _can_call(capabilities):
            return "tool"
        if capabilities.json_object:
            return "json"
        return "instructions"
    if requested == "schema" and not capabilities.json_schema:
        raise ValueError("output_mode 'schema' needs a model that declares Capabilities.json_schema")
    if requested == "json" and not capabilities.json_object:
        raise ValueError("output_mode 'json' needs a model that declares Capabilities.json_object")
    if requested == "tool" and not _can_call(capabilities):
        raise ValueError(
            "output_mode 'tool' needs a model that declares Capabilities.tools and can be offered a "
            "tool (tool_choice_auto, tool_choice_named or tool_choice_required)"
        )
    return requested


def _can_call(capabilities: Capabilities) -> bool:
    return capabilities.tools and (
        capabilities.tool_choice_auto or capabilities.tool_choice_named or capabilities.tool_choice_required
    )


@dataclass(frozen=True, slots=True)
class AnswerTool:
    """The `final_answer` tool of one method in tool mode, and how requests force it."""

    spec: ToolSpec
    choice: ToolChoice | None
    """The `tool_choice` of a request that offers the method's other tools too: `"required"`, or
    `None` where the model cannot be made to call some tool."""
    alone: ToolChoice | None
    """The `tool_choice` of a request that offers this tool alone (no other tools, or the last
    request after a loop limit): the tool by name, else `"required"`, else `None`."""

    def instructions(self, choice: ToolChoice | None) -> str | None:
        """What the user message says of the tool: nothing when `choice` forces a call."""
        if choice is not None and choice not in ("auto", "none"):
            return None
        return f"Give your answer by calling the {ANSWER_TOOL} tool; do not answer in text."


def answer_tool(parser: TypeParser, capabilities: Capabilities) -> AnswerTool:
    """The answer tool for `parser`'s type (its parameters: the schema as asked for, wrapped in an
    object when it is not one), forced as far as the model allows."""
    spec = ToolSpec(
        name=ANSWER_TOOL,
        description=(
            f"Give your final answer, a {parser.target}, as this tool's arguments. Call it once, when "
            "you have the answer."
        ),
        parameters=parser.schema,
    )
    required = "required" if capabilities.tool_choice_required else None
    alone = ANSWER_TOOL if capabilities.tool_choice_named else required
    return AnswerTool(spec, required, alone)


class AnswerChunks:
    """A model stream in tool mode, read so that the answer is the `final_answer` call's arguments.

    The first `final_answer` call's argument fragments become text deltas. Text the model writes is
    held until it is known not to be a preamble: dropped once the call starts (and text after it, and
    a second `final_answer` call, are dropped too), released before the response's end when the model
    answered in text instead. Other chunks pass as they are; `answered` says whether the tool was
    called."""

    __slots__ = ("_chunks", "_dropped", "_held", "_index", "_next", "answered")

    def __init__(self, chunks: AsyncIterator[ModelChunk]) -> None:
        self._chunks = chunks
        self._held: list[str] = []  # text not yet known to be the answer
        self._index: int | None = None  # the answer call's index
        self._dropped: set[int] = set()  # indexes of further answer calls
        self._next: ModelChunk | None = None  # a chunk to give after the held text
        self.answered = False

    def __aiter__(self) -> AnswerChunks:
        return self

    async def __anext__(self) -> ModelChunk:
        waiting = self._next
        if waiting is not None:
            self._next = None
            return waiting
        following = self._chunks.__anext__
        while True:
            try:
                chunk = await following()
            except StopAsyncIteration:
                if self._held:  # the model answered in text
                    return TextDelta(self._flush())
                raise
            kind = chunk.__class__
            if kind is TextDelta:
                if not self.answered:
                    self._held.append(chunk.text)  # type: ignore[union-attr]
                continue  # beside the answer call: not the answer
            if kind is ToolCallDelta:
                assert isinstance(chunk, ToolCallDelta)
                if chunk.name == ANSWER_TOOL and not self.answered:
                    self._index = chunk.index
                    self.answered = True
                    self._held.clear()  # a preamble
                if chunk.index == self._index:
                    if chunk.arguments:
                        return TextDelta(chunk.arguments)
                    continue
                if chunk.name == ANSWER_TOOL:
                    self._dropped.add(chunk.index)  # a second answer: the first one stands
                if chunk.index in self._dropped:
                    continue
                return chunk
            if kind is Finish and self._held:
                self._next = chunk
                return TextDelta(self._flush())
            return chunk

    def _flush(self) -> str:
        text = "".join(self._held)
        self._held.clear()
        return text

    async def aclose(self) -> None:
        await aclose_iterator(self._chunks)
