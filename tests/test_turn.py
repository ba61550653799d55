"""The turn state: what the commit stage receives is the user's own message and the whole exchange.

A recorder around `_finish.commit` keeps what the pipeline passed to it, and the store is read back,
so these tests fail if the stored message were the augmented one (with format instructions) or if
part of the exchange (tool calls, tool results) went missing.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import agentrt
from agentrt import AssistantMessage, Capabilities, ToolResultMessage, UserMessage, tool
from agentrt._pipeline import _finish
from agentrt._pipeline._turn import Turn
from agentrt.testing import CallTool, ScriptedModel


class Ticket(BaseModel):
    origin: str
    destination: str


class Tickets:
    async def extract(self, text: str) -> Ticket: ...

    async def ask(self, question: str) -> str: ...


class Stations:
    @tool("Normalise a station name.")
    async def station(self, name: str) -> str:
        return name.title()


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the pipeline handed the commit stage, recorded before the real commit runs."""
    recorded: list[dict[str, Any]] = []
    original = _finish.commit

    async def record(turn: Turn) -> None:
        recorded.append({"user": turn.user, "outgoing": turn.outgoing, "exchange": list(turn.exchange)})
        await original(turn)

    monkeypatch.setattr(_finish, "commit", record)
    return recorded


async def test_the_stored_message_is_the_user_s_not_the_one_with_format_instructions(
    commits: list[dict[str, Any]],
) -> None:
    # A model without structured output gets format instructions appended to the outgoing message.
    model = ScriptedModel('{"origin": "Bern", "destination": "Basel"}', capabilities=Capabilities())
    service = agentrt.build(Tickets, model=model, memory=agentrt.memory.window())

    ticket = await service.extract("Bern to Basel")

    assert ticket == Ticket(origin="Bern", destination="Basel")
    sent = model.requests[0].messages[-1]
    assert isinstance(sent, UserMessage) and sent.text.startswith("Bern to Basel\n") and "JSON" in sent.text
    [commit] = commits
    assert commit["user"] == UserMessage.of("Bern to Basel")
    assert commit["outgoing"] == sent
    stored = await agentrt.memory.access(service).read()
    assert stored == [
        UserMessage.of("Bern to Basel"),
        AssistantMessage(text='{"origin": "Bern", "destination": "Basel"}'),
    ]


async def test_the_whole_exchange_reaches_the_commit(commits: list[dict[str, Any]]) -> None:
    model = ScriptedModel(
        [
            "Checking.",
            CallTool("station", {"name": "bern"}, id="c1"),
            CallTool("station", {"name": "basel"}, id="c2"),
        ],
        "Bern to Basel.",
    )
    service = agentrt.build(Tickets, model=model, tools=[Stations()], memory=agentrt.memory.window())

    assert await service.ask("bern to basel?") == "Bern to Basel."

    [commit] = commits
    assert commit["user"] == UserMessage.of("bern to basel?")
    exchange = commit["exchange"]
    assert [type(m) for m in exchange] == [
        AssistantMessage,
        ToolResultMessage,
        ToolResultMessage,
        AssistantMessage,
    ]
    assert [c.id for c in exchange[0].tool_calls] == ["c1", "c2"]
    assert [(m.tool_call_id, m.text) for m in exchange[1:3]] == [("c1", "Bern"), ("c2", "Basel")]
    assert exchange[3].text == "Bern to Basel."
    # The exchange is exactly what followed the user's message in the last request, plus the answer.
    assert tuple(exchange[:3]) == model.requests[1].messages[-3:]
    assert await agentrt.memory.access(service).read() == [UserMessage.of("bern to basel?"), *exchange]


async def test_nothing_is_committed_when_the_call_fails(commits: list[dict[str, Any]]) -> None:
    model = ScriptedModel("not json", "nor this", capabilities=Capabilities())  # the answer, its repair
    service = agentrt.build(Tickets, model=model, memory=agentrt.memory.window())

    with pytest.raises(agentrt.OutputParsingError):
        await service.extract("Bern to Basel")
    assert commits == []
    assert await agentrt.memory.access(service).read() == []
