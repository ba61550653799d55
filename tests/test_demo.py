"""`make demo`'s approval and MCP steps on a scripted model (the demo itself runs on the real local
model in `make demo`): the forced tool call waits, nothing is stored, then it runs once on Approve;
the MCP tool is called on the timetable server the demo starts."""

from __future__ import annotations

import anyio
import pytest

from agentrt import ToolResultMessage
from agentrt.testing import CallTool, ScriptedModel
from examples import demo

pytestmark = pytest.mark.anyio


async def test_the_demo_shows_one_approval(capsys: pytest.CaptureFixture[str]) -> None:
    call = CallTool("order_status", {"order_id": "SO-2026-0002"}, id="k1")
    model = ScriptedModel([call], "It ships Friday.")
    await demo.approve(model)
    out = capsys.readouterr().out
    assert "waiting for approval: order_status({'order_id': 'SO-2026-0002'})" in out
    assert "the tool has run 0 time(s); the conversation holds 0 messages" in out
    assert "the tool ran 1 time(s); the conversation now holds 4 messages" in out
    assert "final answer: 'It ships Friday.'" in out
    assert len(model.requests) == 2


async def test_the_demo_ends_after_one_approval_even_if_the_model_calls_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    again = CallTool("order_status", {"order_id": "SO-2026-0002"}, id="k2")
    call = CallTool("order_status", {"order_id": "SO-2026-0002"}, id="k1")
    model = ScriptedModel([call], [again], "Friday.")
    await demo.approve(model)
    out = capsys.readouterr().out
    assert "final answer: 'Friday.'" in out
    assert model.requests[-1].tool_choice == "none"  # the last request asked for an answer


async def test_the_demos_mcp_step_calls_the_timetable_server_over_stdio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    call = CallTool("rail_next_train", {"origin": "Bern", "destination": "Basel"}, id="m1")
    model = ScriptedModel([call], "At 14:32.")
    with anyio.fail_after(60):
        await demo.mcp_tool(model)
    out = capsys.readouterr().out
    assert "the server offers ['rail_next_train']; read-only: True" in out
    # what the server process answered, as the model was sent it
    sent = [m.text for m in model.requests[1].messages if isinstance(m, ToolResultMessage)]
    assert sent == ['{"result":"Bern to Basel: 14:32, platform 7"}']
    assert "tool rail_next_train ran on the server -> " in out
    assert "final answer: 'At 14:32.'" in out
    assert model.requests[0].tool_choice == "rail_next_train"
