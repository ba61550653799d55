"""Every Python block of the documentation (docs/, in the site's page order) runs as written, in
order, in one namespace; the README's quickstart runs as written, as a program.

The pages leave one name to the reader: `model` ("`model` is any agentrt.ChatModel"). Before each
block that uses `model` without assigning it, the test supplies the next scripted model, and checks
what the blocks sent. The block that starts the local model server (`agentrt.local`) runs in the
end-to-end tier (tests/e2e/test_readme_local.py), where that server is installed; so does the
README's quickstart, against that server.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from served import serve

import agentrt
from agentrt.models import ToolCallDelta
from agentrt.testing import CallTool, ScriptedModel

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def pages() -> list[Path]:
    """The documentation's pages in the order of the site's navigation (mkdocs.yml)."""
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    return [ROOT / "docs" / page for page in re.findall(r"^\s*- (?:[^:\n]+: )?(\S+\.md)$", nav, re.MULTILINE)]


def python_blocks() -> list[str]:
    """The Python blocks of the documentation, page by page in the navigation's order."""
    return [
        block
        for page in pages()
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL)
    ]


def durable(block: str) -> bool:
    """A block of durable turns: a program of its own (DBOS is one per process, and asyncio only),
    run by `test_the_durable_blocks_run_as_written`."""
    return "agentrt.durable" in block


async def run_block(source: str, namespace: dict[str, Any]) -> None:
    code = compile(source, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)
    if result is not None:
        await result


async def run_readme(namespace: dict[str, Any], *, local: bool, models: list[Any] | None = None) -> list[str]:
    """Run the blocks (those that start the local server, or the others); `models` are handed out
    as `model` to the blocks that use it without assigning it."""
    ran = []
    supply = list(models or [])
    for block in python_blocks():
        if ("agentrt.local" in block) != local or durable(block):
            continue
        if supply and re.search(r"\bmodel\b", block) and not re.search(r"^model = ", block, re.MULTILINE):
            namespace["model"] = supply.pop(0)
        await run_block(block, namespace)
        ran.append(block)
    return ran


def readme_models() -> dict[str, ScriptedModel]:
    """The scripted model given as `model` to each block that uses it, in the README's order (the
    end-to-end tier's README test runs the same blocks with these models)."""
    model = ScriptedModel(
        "Order SO-2026-0001 ships tomorrow.",
        '{"origin": "Bern", "destination": "Basel"}',
        ["It ", "ships ", "today."],
        "Hello!",
    )
    budgeted = ScriptedModel("Rayleigh scattering.", ["Once ", "upon ", "a ", "time"])
    remembering = ScriptedModel("Hello Ada.", "Your name is Ada.")
    guarded = ScriptedModel("It is on its way.", "Please wait, it is on its way.")
    redacting = ScriptedModel(["Write to ann@", "example.com.", " Or call us."])
    trips = [
        '{"value": [{"origin": "Bern", "destination": "Basel"}, ',
        '{"origin": "Basel", "destination": "Chur"}]}',
    ]
    typed = ScriptedModel(
        "POSITIVE",
        [ToolCallDelta(0, "call_1", "final_answer", trips[0]), ToolCallDelta(0, None, None, trips[1])],
    )
    tooled = ScriptedModel(["Over ", "SSE."], "Over AG-UI.")  # served over SSE, then to AG-UI
    retrieving = ScriptedModel("Half the adult fare.")
    moderated = ScriptedModel(["You could ", "hide it..."])
    resuming = ScriptedModel(["Once ", "upon ", "a ", "time."])
    traced = ScriptedModel("Traced.")
    approving = ScriptedModel(
        [CallTool("refund", {"order_id": "SO-7", "amount": 250}, id="call_1")], "Refunded 250.00 on SO-7."
    )
    railing = ScriptedModel(  # the MCP block: its stdio server's tool, called once
        [CallTool("rail_next_train", {"origin": "Bern", "destination": "Basel"}, id="call_1")],
        "14:32 from platform 7.",
    )
    return {
        "model": model,
        "typed": typed,
        "tooled": tooled,
        "approving": approving,
        "railing": railing,
        "budgeted": budgeted,
        "remembering": remembering,
        "guarded": guarded,
        "redacting": redacting,
        "retrieving": retrieving,
        "moderated": moderated,
        "resuming": resuming,
        "traced": traced,
    }


async def test_every_readme_block_runs_as_written(
    monkeypatch: pytest.MonkeyPatch, capsys: Any, tmp_path: Path
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-readme-test")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    namespace: dict[str, Any] = {"__name__": "readme"}
    monkeypatch.chdir(tmp_path)  # the memory block writes chat.db
    scripted = readme_models()
    model = scripted["model"]
    typed = scripted["typed"]
    tooled = scripted["tooled"]
    approving = scripted["approving"]
    railing = scripted["railing"]
    budgeted = scripted["budgeted"]
    remembering = scripted["remembering"]
    guarded = scripted["guarded"]
    retrieving = scripted["retrieving"]
    moderated = scripted["moderated"]
    models = list(scripted.values())
    ran = await run_readme(namespace, local=False, models=models)

    # all but the local-server block and the durable programs
    assert len(ran) == len(python_blocks()) - 1 - len([b for b in python_blocks() if durable(b)])
    assert model.requests[0].messages[-1] == agentrt.UserMessage.of("Where is order SO-2026-0001?")
    ticket = namespace["ticket"]
    assert isinstance(ticket, BaseModel) and ticket.model_dump() == {"origin": "Bern", "destination": "Basel"}
    assert isinstance(namespace["result"], agentrt.Result) and namespace["result"].value == "Hello!"
    assert namespace["answer"] == "Rayleigh scattering."
    assert budgeted.requests[0].settings == agentrt.ModelSettings(temperature=0)
    assert isinstance(namespace["stream"], agentrt.TokenStream)
    await namespace["stream"].aclose()
    output = capsys.readouterr().out
    # The FastAPI app of "Serving over SSE" serves the quickstart's stream as written, to the users
    # its dependency signs in (and the frontends' routes likewise).
    transport = httpx.ASGITransport(app=namespace["app"])
    signed_in = {"authorization": "Bearer s3cr3t-7"}
    agui_body = {
        "threadId": "t1",
        "runId": "r1",
        "messages": [{"id": "u1", "role": "user", "content": "Hey"}],
    }
    async with httpx.AsyncClient(transport=transport, base_url="http://readme") as client:
        anonymous = await client.post("/chat", json={"question": "Hi"}, headers={"x-user": "user-7"})
        served = await client.post("/chat", json={"question": "Hi"}, headers=signed_in)
        anonymous_agui = await client.post("/agent", json=agui_body)
        stop = await client.post("/agent/stop", json={"runId": "r1"})
        agui = await client.post("/agent", json=agui_body, headers=signed_in)
    assert anonymous.status_code == anonymous_agui.status_code == stop.status_code == 401
    assert anonymous.headers["www-authenticate"] == "Bearer"
    assert served.status_code == 200
    assert [line for line in served.text.splitlines() if line.startswith("data: ")][:2] == [
        'data: {"text":"Over "}',
        'data: {"text":"SSE."}',
    ]
    assert agui.status_code == 200 and '"delta":"Over AG-UI."' in agui.text
    assert [r.messages[-1] for r in tooled.requests] == [
        agentrt.UserMessage.of("Hi"),
        agentrt.UserMessage.of("Hey"),
    ]
    assert namespace["mood"] is namespace["Sentiment"].POSITIVE
    assert "1 trip(s) so far\n2 trip(s) so far\n" in output
    assert typed.requests[1].tool_choice == "final_answer"
    assert "[('refund', {'order_id': 'SO-7', 'amount': 250.0})]\nRefunded 250.00 on SO-7.\n" in output
    assert namespace["refunds"].refunded == [("SO-7", 250.0)]
    assert len(approving.requests) == 2  # asked, stopped, resumed: the model asked again once
    assert "['rail_next_train'] True\n14:32 from platform 7.\n" in output
    assert railing.requests[1].messages[-1].text == '{"result":"Bern to Basel: 14:32, platform 7"}'
    assert "It ships today." in output
    assert "Your name is Ada." in output
    assert "Please wait, it is on its way." in output
    assert "Write to [email]. Or call us." in output
    assert "ann@" not in output
    # Retrieval: the dog document was injected, and is the source
    sent = retrieving.requests[0].messages[-1].text
    assert sent.startswith("How much does my dog pay?\n\nAnswer using the following information:\n")
    assert "Dogs on a lead" in sent and "Bicycles" not in sent
    assert "pets.md\n" in output
    # Moderation: refused, the model stream closed, nothing shown
    assert "refused: ('illicit',)" in output
    assert moderated.streams[0].closed
    assert "Traced.\n" in output
    # Resumable runs: the resume got the events after the second id, exactly, and the turn is stored
    assert "after event 2 came 3 True\n" in output
    assert await agentrt.memory.access(namespace["narrator"]).read("ada") == [
        agentrt.UserMessage.of("A story?"),
        agentrt.AssistantMessage(text="Once upon a time."),
    ]
    assert guarded.requests[1].messages[-2:] == (
        agentrt.AssistantMessage(text="It is on its way."),
        agentrt.UserMessage.of("Answer politely."),
    )
    assert remembering.requests[1].messages == (
        agentrt.UserMessage.of("Hi, I am Ada."),
        agentrt.AssistantMessage(text="Hello Ada."),
        agentrt.UserMessage.of("What is my name?"),
    )
    assert [m.role for m in namespace["history"]] == ["user", "assistant", "user", "assistant"]
    assert await namespace["conversations"].read("ada") == []
    system = model.requests[0].messages[0]
    assert system == agentrt.SystemMessage(text="You are a support assistant for Acme.")
    assert all(stream.closed for stream in model.streams)
    for name in ("model", "support"):
        value = namespace.get(name)
        if hasattr(value, "aclose"):
            await value.aclose()


def run_program(block: str, directory: Path) -> subprocess.CompletedProcess[str]:
    """Run `block` as a program in `directory`: its own event loop, its model from the environment
    (here the echo server's)."""
    script = directory / "program.py"
    script.write_text(block)
    for base in serve(ROOT / "tests" / "servers" / "openai_app.py"):
        env = {
            **os.environ,
            "OPENAI_BASE_URL": base,
            "OPENAI_API_KEY": "test-key",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        env.pop("OPENAI_MODEL", None)
        ran = subprocess.run(
            [sys.executable, str(script)],
            env=env,
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert ran.returncode == 0, ran.stderr
    return ran


def readme_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_the_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    quickstart, _ = readme_blocks()  # (and the durable turn's: below)
    ran = run_program(quickstart, tmp_path)
    assert ran.stdout.splitlines() == [
        "You said: Where is order SO-2026-0001?",
        "Ticket(origin='echo origin', destination='echo destination')",
        "You said: And the other one?",
    ]


def test_the_durable_blocks_run_as_written(tmp_path: Path) -> None:
    """The README's durable turn and the durable guide's worker, each a program of its own (in a
    directory of its own: the databases they make)."""
    _, readme = readme_blocks()
    (guide,) = [block for block in python_blocks() if durable(block)]
    assert durable(readme)
    (tmp_path / "readme").mkdir()
    (tmp_path / "guide").mkdir()
    assert run_program(readme, tmp_path / "readme").stdout.splitlines() == ["You said: Refund A1"]
    guide_ran = run_program(guide, tmp_path / "guide")
    assert guide_ran.stdout.splitlines() == ["You said: Refund A1 True", "You said: Hi"]
    assert (tmp_path / "guide" / "turns.sqlite").exists() and (tmp_path / "guide" / "chat.db").exists()
