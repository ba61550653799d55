"""One plan per method: what its invocations do, decided once when the service is built.

A method's output chain, release policy, moderation, answer tool, output mode, retrieval and input
chain come from several levels (method > class > build); `plan` resolves them once, so that an
invocation reads one object instead of looking its method up in a mapping per concern.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._approval import Approvals
from .._spec import MethodSpec, OutputKind
from ..guardrails._declare import Guardrail, OutputChain
from ..moderation._declare import Moderate
from ..output._modes import AnswerTool
from ..rag._augment import Retrieval

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["Plan", "plan"]


@dataclass(frozen=True, slots=True)
class Plan:
    """What the invocations of one method do (see the module docstring)."""

    spec: MethodSpec
    streams: bool
    """The method streams its text (`TokenStream`, `PartialStream`)."""
    input_chain: tuple[Guardrail, ...] | None
    output_chain: OutputChain | None
    release: str
    """How a stream's text reaches its reader: `plain` (as it comes), `buffer` (held until the
    answer passed), `chunked` or `optimistic` (see `_release`)."""
    moderation: Moderate | None
    retrieval: Retrieval | None
    answer: AnswerTool | None
    """The `final_answer` tool, in tool mode."""
    output_mode: str
    """How a structured answer is asked for: `schema`, `json`, `instructions` or `tool`."""
    approvals: Approvals | None = None
    """How its tool calls wait for approval; `None` when none ever does."""


def plan(runtime: Runtime, spec: MethodSpec) -> Plan:
    """The plan of `spec`'s invocations under `runtime`."""
    name = spec.name
    streams = spec.output_kind in (OutputKind.STREAM, OutputKind.PARTIAL)
    chain = runtime.output_guardrails.get(name)
    moderation = runtime.moderations.get(name)
    release: str
    if streams and chain is not None:
        release = chain.release
    elif streams and moderation is not None and moderation.answer:
        release = "buffer"  # an answer that is moderated too is held until it passed
    else:
        release = "plain"
    return Plan(
        spec=spec,
        streams=streams,
        input_chain=runtime.input_guardrails.get(name),
        output_chain=chain,
        release=release,
        moderation=moderation,
        retrieval=runtime.retrievals.get(name),
        answer=runtime.answer_tools.get(name),
        output_mode=runtime.output_modes.get(name, "instructions"),
        approvals=runtime.approvals.get(name),
    )
