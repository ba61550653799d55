"""`Result.turn` is this turn as memory stores it, under every release policy and on awaited calls,
while `Result.messages` is the transcript the model saw (with a rejected answer and its reprompt):
what someone who keeps conversations themselves should save is `turn`, never the rejected text."""

from __future__ import annotations

from typing import Annotated, Any

import pytest

import agentrt
from agentrt import AssistantMessage, MemoryId, Result, TokenStream, UserMessage, tool
from agentrt.guardrails import GuardrailResult, OutputGuardrailRequest, output_guardrails, reprompt, success
from agentrt.testing import CallTool, ScriptedModel


class Lookup:
    @tool("Look something up.")
    async def lookup(self, query: str) -> str:
        return f"found {query}"


def judge(request: OutputGuardrailRequest) -> GuardrailResult:
    return reprompt("rude", "Be polite.") if "RUDE" in request.text else success()


judge.partial_text = True  # type: ignore[attr-defined]


def service(view: str, model: ScriptedModel) -> Any:
    if view == "await":

        class Chat:
            @output_guardrails(judge)
            async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> Result[str]: ...

    else:

        class Chat:  # type: ignore[no-redef]
            @output_guardrails(judge, release=view)  # type: ignore[arg-type]
            async def ask(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...

    return agentrt.build(Chat, model=model, memory=agentrt.memory.window(), tools=[Lookup()])


@pytest.mark.parametrize("view", ["await", "buffer", "chunked", "optimistic"])
async def test_result_turn_is_what_memory_stored_and_messages_what_the_model_saw(view: str) -> None:
    model = ScriptedModel([CallTool("lookup", {"query": "x"}, id="c1")], ["RUDE answer."], ["Polite answer."])
    svc = service(view, model)
    if view == "await":
        result = await svc.ask("c", "q")
    else:
        async with await svc.ask("c", "q") as stream:
            result = await stream.result()

    stored = await agentrt.memory.access(svc).read("c")
    assert result.turn == tuple(stored)
    assert [type(m).__name__ for m in result.turn] == [
        "UserMessage",
        "AssistantMessage",
        "ToolResultMessage",
        "AssistantMessage",
    ]
    assert result.turn[-1] == AssistantMessage(text="Polite answer.")
    assert "RUDE" not in str(result.turn)
    # The transcript has the rejected answer and the reprompt, as the model saw them.
    assert result.messages[-3:] == (
        AssistantMessage(text="RUDE answer."),
        UserMessage.of("Be polite."),
        AssistantMessage(text="Polite answer."),
    )
