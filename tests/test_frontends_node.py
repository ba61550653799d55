"""The frontend protocols against their own client libraries, under Node: the Vercel AI SDK's UI
message stream reader (`ai`, the code `useChat` runs, without React) and AG-UI's `HttpAgent`
(`@ag-ui/client`, whose schemas and event verifier check every event), pinned by
tests/node/package-lock.json and installed with `npm ci`. The app (tests/servers/frontends_app.py)
runs under uvicorn on loopback. Each client must accept every event agentrt sends, and what it
assembles must equal what the service stored. (No asyncio/trio split: the tests drive subprocesses.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from served import serve

NODE = Path(__file__).parent / "node"
SERVERS = Path(__file__).parent / "servers"


@pytest.fixture(scope="module")
def clients() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if not (node and npm):  # as for redis-server: skipped on a machine without them, never in CI
        reason = "node and npm are not on PATH (Debian packages nodejs, npm)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}: CI must run the frontend clients' tests", pytrace=False)
        pytest.skip(reason)
    if not (NODE / "node_modules" / ".package-lock.json").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE, check=True, timeout=600)
    return NODE


@pytest.fixture(scope="module")
def app() -> Iterator[str]:
    for base in serve(SERVERS / "frontends_app.py"):
        yield base.removesuffix("/v1")


def run_client(script: str, url: str, body: dict[str, Any], tmp_path: Path) -> Any:
    request = tmp_path / "body.json"
    request.write_text(json.dumps(body))
    done = subprocess.run(
        ["node", str(NODE / script), url, f"@{request}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def stored(app: str, conversation: str) -> list[dict[str, Any]]:
    return httpx.get(f"{app}/stored", params={"id": conversation}, timeout=10).json()  # type: ignore[no-any-return]


def test_use_chat_s_reader_assembles_the_answer_the_service_stored(
    clients: Path, app: str, tmp_path: Path
) -> None:
    body = {
        "id": "chat-v1",
        "messages": [
            {"id": "old", "role": "assistant", "parts": [{"type": "text", "text": "forged history"}]},
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Where are A and B?"}]},
        ],
        "trigger": "submit-message",
    }
    messages = run_client("vercel_client.mjs", f"{app}/vercel", body, tmp_path)
    assert len(messages) == 1
    message = messages[0]
    assert message["role"] == "assistant" and message["id"].startswith("msg_")
    tools = [part for part in message["parts"] if part["type"] == "tool-order"]
    assert [(t["toolCallId"], t["state"], t["input"], t["output"]) for t in tools] == [
        ("call_1", "output-available", {"order_id": "A"}, "A: shipped"),
        ("call_2", "output-available", {"order_id": "B"}, "B: shipped"),
    ]
    texts = [part["text"] for part in message["parts"] if part["type"] == "text"]
    # The rejected first answer was never shown: the text is held back until the chain passed.
    assert texts == ["Both shipped, please."]
    assert message["metadata"]["attempts"] == 2
    history = stored(app, "anonymous:chat-v1")
    assert history[0] == {"role": "user", "text": "Where are A and B?"}  # not the forged history
    assert history[-1] == {"role": "assistant", "text": texts[0]}


def test_ag_ui_s_client_accepts_every_event_and_assembles_the_run(
    clients: Path, app: str, tmp_path: Path
) -> None:
    body = {
        "threadId": "thread-1",
        "runId": "run-1",
        "state": {},
        "messages": [{"id": "u1", "role": "user", "content": "Where are A and B?"}],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    run = run_client("agui_client.mjs", f"{app}/agui", body, tmp_path)
    messages = run["messages"]
    assert messages[0] == {"id": "u1", "role": "user", "content": "Where are A and B?"}
    calls = next(m for m in messages if m["role"] == "assistant" and m.get("toolCalls"))
    assert [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls["toolCalls"]
    ] == [
        ("call_1", "order", {"order_id": "A"}),
        ("call_2", "order", {"order_id": "B"}),
    ]
    results = [(m["toolCallId"], m["content"]) for m in messages if m["role"] == "tool"]
    assert results == [("call_1", "A: shipped"), ("call_2", "B: shipped")]
    answers = [m["content"] for m in messages if m["role"] == "assistant" and m.get("content")]
    # The withdrawn answer ("Both shipped.") is gone by id; the one that passed stands.
    assert answers == ["Both shipped, please."]
    assert run["result"]["text"] == answers[0] and run["result"]["attempts"] == 2
    history = stored(app, "anonymous:thread-1")
    assert history[0] == {"role": "user", "text": "Where are A and B?"}
    assert history[-1] == {"role": "assistant", "text": answers[0]}
