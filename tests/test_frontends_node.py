"""The frontend protocols against their own client libraries, under Node: the Vercel AI SDK's UI
message stream reader (`ai`, the code `useChat` runs, without React) and AG-UI's `HttpAgent`
(`@ag-ui/client`, whose schemas and event verifier check every event), pinned by
tests/node/package-lock.json and installed with `npm ci`. The app (tests/servers/frontends_app.py)
runs under uvicorn on loopback. Each client must accept every event agentrt sends, and what it
assembles must equal what the service stored. (No asyncio/trio split: the tests drive subprocesses.)"""

from __future__ import annotations

import fcntl
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import pytest
from asgi_scope import post_scope
from served import serve

from agentrt import MemoryId, TokenStream

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
    # One `npm ci` at a time (a lock on tests/node itself): pytest-xdist's workers, or two runs,
    # share the folder; one that waited finds the clients installed.
    folder = os.open(NODE, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        if not (NODE / "node_modules" / ".package-lock.json").exists():
            subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE, check=True, timeout=600)
    finally:
        os.close(folder)  # and with it the lock
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
    return httpx.get(f"{app}/stored", params={"id": conversation}, timeout=60).json()  # type: ignore[no-any-return]


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
    # The retrieved source, as the reader keeps it (ids and titles, never the text).
    sources = [part for part in message["parts"] if part["type"] == "source-document"]
    assert [(s["sourceId"], s["title"], s["filename"]) for s in sources] == [
        ("shipping#0", "shipping.md", "shipping.md")
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
    # The retrieved source, as a CUSTOM event the client accepts and hands to its subscribers.
    assert run["custom"] == [
        {
            "name": "sources",
            "value": [{"sourceId": "shipping#0", "title": "shipping.md", "filename": "shipping.md"}],
        }
    ]
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


def run_failing_client(script: str, url: str, body: dict[str, Any], tmp_path: Path) -> tuple[int, str]:
    """Run a client that is to see the run fail: its exit status and error output."""
    request = tmp_path / "body.json"
    request.write_text(json.dumps(body))
    done = subprocess.run(
        ["node", str(NODE / script), url, f"@{request}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stderr


def test_an_answer_refused_after_its_first_sentences_is_gone_from_the_ag_ui_client(
    clients: Path, app: str, tmp_path: Path
) -> None:
    body = {
        "threadId": "thread-refused",
        "runId": "run-refused",
        "state": {},
        "messages": [{"id": "u1", "role": "user", "content": "How do I reach you?"}],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    status, errors = run_failing_client("agui_client.mjs", f"{app}/agui/refusing", body, tmp_path)
    assert status == 4, errors  # a valid stream that ends with RUN_ERROR
    assert "the answer was refused by an output guardrail [code output_refused]" in errors
    [partial] = [line for line in errors.splitlines() if line.startswith("partial: ")]
    messages = json.loads(partial.removeprefix("partial: "))["messages"]
    # The client was sent "Call me at 555-0100. " before the refusal; what it keeps has none of it.
    assert "555-0100" not in partial
    assert messages[0] == body["messages"][0]  # type: ignore[index]
    assert [m for m in messages[1:] if m["role"] != "reasoning" or m["content"]] == []
    assert stored(app, "anonymous:thread-refused") == []


def test_an_answer_refused_after_its_first_sentences_never_reaches_use_chat_s_reader(
    clients: Path, app: str, tmp_path: Path
) -> None:
    body = {
        "id": "chat-refused",
        "messages": [
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "How do I reach you?"}]}
        ],
        "trigger": "submit-message",
    }
    status, errors = run_failing_client("vercel_client.mjs", f"{app}/vercel/refusing", body, tmp_path)
    assert status == 4, errors  # the server's error chunk
    assert "errorText: the answer was refused by an output guardrail" in errors
    # Text is held back under `chunked` on this protocol (it cannot withdraw): none was sent.
    assert "555-0100" not in errors
    assert stored(app, "anonymous:chat-refused") == []


# --- runs that outlive their connection: useChat's resume (GET {api}/{chat id}/stream) ------------------


def resume_clients(app: str, runs: list[tuple[str, str, float, str]], tmp_path: Path) -> list[Any]:
    """Run vercel_resume.mjs for every `(chat, question, cut, mode)`, all at once in one process
    (`--batch`): each one's report."""
    argv = [
        [f"{app}/runs/vercel", chat, question, str(cut), mode, f"{app}/open?ticket={chat}"]
        for chat, question, cut, mode in runs
    ]
    batch = tmp_path / "resume-runs.json"
    batch.write_text(json.dumps(argv))
    results = run_node(str(NODE / "vercel_resume.mjs"), "--batch", str(batch))
    assert len(results) == len(runs)
    reports = []
    for (chat, _, cut, mode), result in zip(runs, results, strict=True):
        assert result["status"] == 0, f"{chat} (cut after {cut} events, {mode}): {result['stderr']}"
        reports.append(json.loads(result["stdout"]))
    return reports


HELD_CHUNKS = 12
"""The events a "Hold" run sends before its answer waits (start, source, reasoning, text, the look-up)."""


@pytest.mark.parametrize("mode", ["drop", "reload"])
def test_use_chat_resumes_a_detached_run_cut_at_any_event_and_assembles_what_memory_stored(
    clients: Path, app: str, mode: str, tmp_path: Path
) -> None:
    # The first response is cut after `cut` events (".5": half of the next one), as a dropped
    # connection fails in a browser; the run goes on (detach) and waits until the resume reads it.
    # `drop`: the same Chat resumes (resumeStream); `reload`: a new Chat, as useChat({resume: true})
    # on a reloaded page. Either way the SDK asks GET /runs/vercel/{chat}/stream and rebuilds the
    # message from the replay's first `start`.
    cuts = [0, 0.5, 1, 3.5, 6, 8.5, HELD_CHUNKS - 1, HELD_CHUNKS - 0.5]
    runs = [
        (f"chat-{mode}-{index}", f"Hold chat-{mode}-{index}", cut, mode) for index, cut in enumerate(cuts)
    ]
    for (chat, _, cut, _), report in zip(runs, resume_clients(app, runs, tmp_path), strict=True):
        where = f"cut after {cut} events"
        assert report["cutStatus"] == "error" and report["errors"] == ["network error"], where
        assert report["chunks"] == int(cut), where
        assert [
            (method, url.rsplit("/runs/", 1)[1], status) for method, url, status in report["requests"]
        ] == [
            ("POST", "vercel", 200),
            ("GET", f"vercel/{chat}/stream", 200),
        ], where
        final = report["final"]
        assert [m["role"] for m in final] == ["user", "assistant"], where
        message = final[1]
        assert message["id"].startswith("msg_"), where
        cut_message = report["cut"][1:] if mode == "drop" else []
        if cut_message:  # the message the drop left is the one the resume completed
            assert cut_message[0]["id"] == message["id"], where
        parts = [(p["type"], p.get("text", p.get("output"))) for p in message["parts"]]
        # Every part once, whole, in order (a replay from the start, never appended to the cut).
        assert parts == [
            ("source-document", None),
            ("reasoning", "Plan. "),
            ("text", "Checking. "),
            ("tool-order", "A: shipped"),
            ("reasoning", "Known. "),
            ("text", "It shipped on time."),
        ], where
        assert all(p.get("state") in (None, "done", "output-available") for p in message["parts"]), where
        history = stored(app, f"anonymous:{chat}")
        assert [(m["role"], m["text"]) for m in history] == [
            ("user", f"Hold {chat}"),
            ("assistant", "Checking. "),
            ("tool", "A: shipped"),
            ("assistant", "It shipped on time."),
        ], where


def test_use_chat_s_resume_of_a_chat_without_an_active_run_gets_204_and_the_chat_stays_ready(
    clients: Path, app: str, tmp_path: Path
) -> None:
    # A chat whose run ended (its turn is in memory), and one that never ran.
    body = {
        "id": "chat-ended",
        "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Where are A and B?"}]}],
        "trigger": "submit-message",
    }
    [answered] = run_client("vercel_client.mjs", f"{app}/runs/vercel", body, tmp_path)
    ended, never = resume_clients(
        app, [("chat-ended", "-", 0, "none"), ("chat-never", "-", 0, "none")], tmp_path
    )
    for chat, report in (("chat-ended", ended), ("chat-never", never)):
        assert [(m, u.rsplit("/runs/", 1)[1], s) for m, u, s in report["requests"]] == [
            ("GET", f"vercel/{chat}/stream", 204)
        ]
        assert (report["status"], report["error"], report["errors"], report["final"]) == (
            "ready",
            None,
            [],
            [],
        )
    assert stored(app, "anonymous:chat-ended")[-1] == {"role": "assistant", "text": "Both shipped."}
    assert [p["text"] for p in answered["parts"] if p["type"] == "text"] == ["Both shipped."]


def cut_and_resume(app: str, body: dict[str, Any], cut: int) -> tuple[bytes, bytes]:
    """POST `body` to /runs/agui and read `cut` events, then drop the connection (the run goes on:
    detach); resume it with the last event's id (`Last-Event-ID`) and open its gate once the resume
    answered (the run is still going). What was read, and what the resume sent."""
    read, events, last = b"", 0, f"{body['runId']}:0"
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{app}/runs/agui", json=body) as response:
            pending = b""
            for data in response.iter_raw():
                pending += data
                while events < cut and b"\n\n" in pending:
                    block, pending = pending.split(b"\n\n", 1)
                    read += block + b"\n\n"
                    if b"data:" in block:
                        events += 1
                        last = next(
                            row[4:].strip().decode() for row in block.split(b"\n") if row.startswith(b"id:")
                        )
                if events == cut:
                    break  # the connection is closed as the stream is left
        with http.stream("GET", f"{app}/runs/agui/resume", headers={"last-event-id": last}) as resumed:
            assert resumed.status_code == 200
            http.post(f"{app}/open", params={"ticket": body["threadId"]})
            rest = resumed.read()
    return read, rest


def test_ag_ui_s_client_accepts_a_run_cut_and_resumed_by_its_id(
    clients: Path, app: str, tmp_path: Path
) -> None:
    cuts = [1, 4, 7, HELD_CHUNKS]  # a run of 12 events before it waits, 21 in all
    bodies, requests = [], []
    for cut in cuts:
        thread = f"t-agui-cut-{cut}"
        body = {**AGUI_BODY, "threadId": thread, "runId": f"r-agui-cut-{cut}"}
        body["messages"] = [{"id": "u1", "role": "user", "content": f"Hold {thread}"}]
        read, rest = cut_and_resume(app, body, cut)
        assembled = read + rest
        ids = [row[4:].strip().decode() for row in assembled.split(b"\n") if row.startswith(b"id:")]
        assert ids == [f"r-agui-cut-{cut}:{n}" for n in range(1, len(ids) + 1)]  # each once, in order
        assert len(ids) == 21
        bodies.append(assembled)
        requests.append(body)
    # The client's own pipeline (schemas, verifier, reducer) reads each assembled stream as one run.
    accepted = replay("agui_client.mjs", requests, bodies, tmp_path)
    for cut, body, (status, errors) in zip(cuts, requests, accepted, strict=True):
        assert status == 0, f"cut after {cut} events: {errors}"
        history = stored(app, f"anonymous:{body['threadId']}")
        assert [(m["role"], m["text"]) for m in history] == [
            ("user", f"Hold {body['threadId']}"),
            ("assistant", "Checking. "),
            ("tool", "A: shipped"),
            ("assistant", "It shipped on time."),
        ]


# --- approval: the clients' own flows (tests/servers/approval_app.py) ----------------------------------


@pytest.fixture(scope="module")
def approval_app() -> Iterator[str]:
    for base in serve(SERVERS / "approval_app.py"):
        yield base.removesuffix("/v1")


def run_node(*args: str) -> Any:
    done = subprocess.run(["node", *args], capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def refunds(app: str) -> list[list[Any]]:
    """The refund tool's side-effect counter: every refund that ran, in order."""
    return httpx.get(f"{app}/refunds", timeout=60).json()  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("decision", "state", "told"),
    [
        ({"approved": True}, "output-available", "refunded 1.0 on A"),
        ({"approved": False, "reason": "not today"}, "output-denied", "it was not run. Reason: not today"),
    ],
)
def test_use_chat_s_approval_flow_resumes_the_turn_with_the_answer_add_tool_approval_response_sends(
    clients: Path, approval_app: str, decision: dict[str, Any], state: str, told: str
) -> None:
    chat = f"chat-approval-{state}"
    before = refunds(approval_app)
    run = run_node(
        str(NODE / "vercel_approval.mjs"),
        f"{approval_app}/vercel",
        chat,
        "Refund A",
        json.dumps({"refund": decision}),
    )
    # The first response: the refund's part waits for approval, the look-up ran.
    asked = run["first"][-1]
    parts = {part["type"]: part for part in asked["parts"]}
    approval = parts["tool-refund"]["approval"]
    assert parts["tool-refund"]["state"] == "approval-requested"
    assert approval["id"].endswith(":call_1")
    assert approval["descriptor"] == {"tool": "refund", "arguments": {"order": "A", "amount": 1}}
    assert parts["tool-look"]["state"] == "output-available"
    # The SDK sent the answer itself (sendAutomaticallyWhen), in the shape the endpoint reads.
    assert len(run["requests"]) == 2
    answer = run["requests"][1]
    assert answer["trigger"] == "submit-message" and answer["messageId"] == asked["id"]
    sent = next(p for p in answer["messages"][-1]["parts"] if p["type"] == "tool-refund")
    assert sent["state"] == "approval-responded"
    assert {k: v for k, v in sent["approval"].items() if k != "descriptor"} == {
        "id": approval["id"],
        **decision,
    }
    # The resumed stream continued the same message: one user message, one assistant message.
    final = run["final"]
    assert [m["role"] for m in final] == ["user", "assistant"] and final[1]["id"] == asked["id"]
    parts = {part["type"]: part for part in final[1]["parts"] if part["type"].startswith("tool-")}
    assert parts["tool-refund"]["state"] == state
    texts = [part["text"] for part in final[1]["parts"] if part["type"] == "text"]
    assert texts[0] == "Checking. " and told in texts[-1]
    ran = refunds(approval_app)[len(before) :]
    assert ran == ([["A", 1.0]] if decision["approved"] else [])  # once, or never
    history = stored(approval_app, f"anonymous:{chat}")
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "tool", "assistant"]
    assert history[-1]["text"] == texts[-1]


@pytest.mark.parametrize(
    ("response", "ran", "told"),
    [
        (
            {"status": "resolved", "payload": {"approved": True, "arguments": {"order": "A", "amount": 2}}},
            [["A", 2.0]],
            "refunded 2.0 on A",
        ),
        ({"status": "resolved", "payload": {"approved": False, "reason": "no"}}, [], "Reason: no"),
        ({"status": "cancelled"}, [], "it was not run."),
    ],
)
def test_ag_ui_s_client_ends_a_run_with_an_interrupt_and_resumes_it(
    clients: Path, approval_app: str, tmp_path: Path, response: dict[str, Any], ran: list[Any], told: str
) -> None:
    thread = f"thread-approval-{response['status']}-{len(ran)}"
    body = {
        "threadId": thread,
        "runId": "run-1",
        "state": {},
        "messages": [{"id": "u1", "role": "user", "content": "Refund A"}],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    request = tmp_path / "body.json"
    request.write_text(json.dumps(body))
    before = refunds(approval_app)
    run = run_node(
        str(NODE / "agui_approval.mjs"),
        f"{approval_app}/agui",
        f"@{request}",
        json.dumps({"refund": response}),
    )
    [interrupt] = run["first"]["interrupts"]
    assert interrupt["reason"] == "tool_approval" and interrupt["toolCallId"] == "call_1"
    assert interrupt["metadata"] == {"tool": "refund", "arguments": {"order": "A", "amount": 1}}
    assert run["resume"] == [{"interruptId": interrupt["id"], **response}]
    second = run["second"]
    assert second["outcome"] == {"type": "success"} and second["pendingInterrupts"] == []
    assert told in second["result"]["text"]
    results = [(m["toolCallId"], m["content"]) for m in second["messages"] if m["role"] == "tool"]
    assert [call for call, _ in results] == ["call_2", "call_1"]  # each call has its one result
    assert refunds(approval_app)[len(before) :] == ran
    history = stored(approval_app, f"anonymous:{thread}")
    assert history[-1] == {"role": "assistant", "text": second["result"]["text"]}


def approval_resume_clients(
    app: str, runs: list[tuple[str, str, list[dict[str, Any]], float, str]], tmp_path: Path
) -> list[Any]:
    """Run vercel_approval_resume.mjs for every `(chat, question, decisions, cut, mode)`, all at once
    in one process (`--batch`): each one's report."""
    argv = [
        [
            f"{app}/runs/vercel",
            chat,
            question,
            json.dumps(decisions),
            str(cut),
            mode,
            f"{app}/open?ticket={chat}",
        ]
        for chat, question, decisions, cut, mode in runs
    ]
    batch = tmp_path / "approval-runs.json"
    batch.write_text(json.dumps(argv))
    results = run_node(str(NODE / "vercel_approval_resume.mjs"), "--batch", str(batch))
    assert len(results) == len(runs)
    reports = []
    for (chat, _, _, cut, mode), result in zip(runs, results, strict=True):
        assert result["status"] == 0, f"{chat} (cut after {cut} events, {mode}): {result['stderr']}"
        reports.append(json.loads(result["stdout"]))
    return reports


def as_assembled(message: dict[str, Any]) -> Any:
    """An assistant message's parts, with each approval's id (`<pending run>:<call>`) as its call's."""
    parts = json.loads(json.dumps(message["parts"]))
    for part in parts:
        if "approval" in part:
            part["approval"]["id"] = part["approval"]["id"].rsplit(":", 1)[1]
    return parts


APPROVED = {"refund": {"approved": True}}


@pytest.mark.parametrize(
    ("twice", "cuts"),
    [
        # the continuation: start, the refund's output, "Then C. " (3 events), the look-up (4),
        # then it waits until the resume reads it
        (False, [0, 0.5, 1, 1.5, 2, 3.5, 5, 7.5, 8, 8.5]),
        # a second approval (a denial) in the first continuation: the second one is cut
        (True, [0, 1, 2, 4.5, 8.5]),
    ],
    ids=["one-approval", "two-approvals"],
)
@pytest.mark.parametrize("mode", ["drop", "reload"])
def test_use_chat_resumes_an_approval_s_continuation_cut_at_any_event_into_the_uncut_message(
    clients: Path, approval_app: str, twice: bool, cuts: list[float], mode: str, tmp_path: Path
) -> None:
    # The answer to an approval continues the assistant's message in a run of its own; the client
    # drops during it and resumes (GET /runs/vercel/{chat}/stream): the SDK replays the resumed
    # stream from its first `start`, resetting the message. It must end with the message a client
    # that never dropped has, and the conversation stored as it is without a drop.
    decisions = [APPROVED, {"refund": {"approved": False, "reason": "not C"}}] if twice else [APPROVED]
    suffix = " twice" if twice else ""
    key = f"{'two' if twice else 'one'}-{mode}"
    before = refunds(approval_app)
    runs = [(f"ar-{key}-uncut", f"Hold ar-{key}-uncut{suffix}", decisions, -1.0, mode)]
    runs += [
        (f"ar-{key}-{i:05}", f"Hold ar-{key}-{i:05}{suffix}", decisions, cut, mode)
        for i, cut in enumerate(cuts)
    ]
    reference, *reports = approval_resume_clients(approval_app, runs, tmp_path)
    assert reference["status"] == "ready" and reference["errors"] == []
    [_, uncut] = reference["final"]
    expected = as_assembled(uncut)
    # The uncut message: every round's parts, each approval's answer, the held answer at the end.
    assert [(p["type"], p.get("state")) for p in expected] == [
        ("text", "done"),
        ("tool-refund", "output-available"),
        ("tool-look", "output-available"),
        ("text", "done"),
        *(
            [("tool-refund", "output-denied"), ("text", "done"), ("tool-look", "output-available")]
            if twice
            else [("tool-look", "output-available")]
        ),
        ("text", "done"),
    ]
    assert expected[1]["approval"]["approved"] is True
    reference_history = stored(approval_app, f"anonymous:{runs[0][0]}")
    for (chat, _, _, cut, _), report in zip(runs[1:], reports, strict=True):
        where = f"{chat}: cut after {cut} events ({mode})"
        assert report["cutStatus"] == "error" and report["errors"] == ["network error"], where
        assert report["chunks"] == int(cut), where
        assert [(m, u.rsplit("/runs/", 1)[1], s) for m, u, s in report["requests"]] == [
            *[("POST", "vercel", 200)] * (len(decisions) + 1),
            ("GET", f"vercel/{chat}/stream", 200),
        ], where
        assert (report["status"], report["error"]) == ("ready", None), where
        [user, message] = report["final"]
        assert user["parts"] == [{"type": "text", "text": f"Hold {chat}{suffix}"}], where
        assert message["id"] == report["first"][1]["id"], where  # the message the first response began
        assert as_assembled(message) == expected, where
        assert message["metadata"].keys() == uncut["metadata"].keys(), where
        history = stored(approval_app, f"anonymous:{chat}")
        assert [(m["role"], m["text"].replace(chat, "*")) for m in history] == [
            (m["role"], m["text"].replace(runs[0][0], "*")) for m in reference_history
        ], where
    ran = refunds(approval_app)[len(before) :]
    assert sorted(ran) == [["A", 1.0]] * len(runs)  # each chat's refund once; C's was denied


def test_the_chunks_that_rebuild_a_message_give_use_chat_s_reader_the_message_it_had(
    clients: Path, tmp_path: Path
) -> None:
    # What a continuation's log begins with (a resume's replay starts the message again): the
    # client's message, rebuilt part by part. A message with a part of each kind the SDK builds
    # from a stream, in each state: read by the SDK, rebuilt, read again, it is the same message.
    from agentrt.sse._encoder import DONE
    from agentrt.sse._vercel import VercelUI, rebuilt

    def call(call: str, tool: str, *after: dict[str, Any]) -> list[dict[str, Any]]:
        available = {
            "type": "tool-input-available",
            "toolCallId": call,
            "toolName": tool,
            "input": {"o": call},
        }
        return [available, *after]

    def asked(call: str, approval: str, *answer: Any, **extra: Any) -> list[dict[str, Any]]:
        request = {"type": "tool-approval-request", "approvalId": approval, "toolCallId": call, **extra}
        if not answer:
            return [request]
        response = {"type": "tool-approval-response", "approvalId": approval, "approved": answer[0]}
        return [request, response | ({"reason": answer[1]} if len(answer) > 1 else {})]

    stream: list[Any] = [
        {"type": "start", "messageId": "m1", "messageMetadata": {"attempts": 1}},
        {"type": "start-step"},
        {"type": "reasoning-start", "id": "r"},
        {"type": "reasoning-delta", "id": "r", "delta": "Plan. "},
        {"type": "reasoning-end", "id": "r"},
        {"type": "text-start", "id": "t"},
        {"type": "text-delta", "id": "t", "delta": "Checking. "},
        {"type": "text-end", "id": "t"},
        {"type": "source-url", "sourceId": "s1", "url": "https://example.com/a", "title": "A"},
        {
            "type": "source-document",
            "sourceId": "s2",
            "mediaType": "text/markdown",
            "title": "S",
            "filename": "s.md",
        },
        {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AAAA"},
        {"type": "data-value", "id": "value", "data": {"k": [1, 2]}},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "refund"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"o": "c1"}'},
        *call("c1", "refund", *asked("c1", "p1:c1", True, descriptor={"tool": "refund"})),
        {"type": "tool-output-available", "toolCallId": "c1", "output": "refunded"},
        *call("c2", "refund", *asked("c2", "p1:c2", False, "not B")),
        {"type": "tool-output-denied", "toolCallId": "c2"},
        *call("c3", "look", {"type": "tool-output-error", "toolCallId": "c3", "errorText": "it failed"}),
        {"type": "start-step"},
        *call("c4", "refund", *asked("c4", "p2:c4", True)),  # approval-responded
        *call("c5", "refund", *asked("c5", "p2:c5")),  # approval-requested
        *call("c6", "look"),  # input-available
        {"type": "tool-input-start", "toolCallId": "c7", "toolName": "look"},
        {"type": "tool-input-delta", "toolCallId": "c7", "inputTextDelta": '{"o": "c'},  # input-streaming
        {"type": "text-start", "id": "t2"},
        {"type": "text-delta", "id": "t2", "delta": "Then"},  # still streaming
        {"type": "finish"},
        DONE,
    ]
    encoder = VercelUI("m1", thinking=True, tool_details=True, hold=False, structured=False)

    def body(chunks: list[Any]) -> bytes:
        return b"".join(encoder.frame(chunk).encode() for chunk in chunks)

    request = {"id": "chat", "messages": [], "trigger": "submit-message"}
    outputs: list[str] = []
    [(status, errors)] = replay("vercel_client.mjs", request, [body(stream)], tmp_path, outputs)
    assert status == 0, errors
    [message] = json.loads(outputs[0])
    states = [(p["type"], p.get("state")) for p in message["parts"]]
    assert states == [
        ("step-start", None),
        ("reasoning", "done"),
        ("text", "done"),
        ("source-url", None),
        ("source-document", None),
        ("file", None),
        ("data-value", None),
        ("tool-refund", "output-available"),
        ("tool-refund", "output-denied"),
        ("tool-look", "output-error"),
        ("step-start", None),
        ("tool-refund", "approval-responded"),
        ("tool-refund", "approval-requested"),
        ("tool-look", "input-available"),
        ("tool-look", "input-streaming"),
        ("text", "streaming"),
    ]
    again: list[str] = []
    [(status, errors)] = replay(
        "vercel_client.mjs",
        request,
        [body([*rebuilt("m1", message), {"type": "finish"}, DONE])],
        tmp_path,
        again,
    )
    assert status == 0, errors
    assert json.loads(again[0]) == [message]


# --- a stop at every point of a stream, checked by the clients -----------------------------------------


class Desk:
    async def plain(self, conversation: Annotated[str, MemoryId], question: str) -> TokenStream: ...


def replay(
    script: str,
    request: dict[str, Any] | list[dict[str, Any]],
    bodies: list[bytes],
    tmp_path: Path,
    outputs: list[str] | None = None,
) -> list[tuple[int, str]]:
    """Run a client against each of `bodies`, served as they are by a throwaway HTTP server (one
    client process reads them one after another: `--batch`; `request` is what each run sends, or one
    per body): each run's exit status and error output (and its output appended to `outputs`, if
    given)."""

    class Canned(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            body = bodies[int(self.path.strip("/"))]
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        requests = request if isinstance(request, list) else [request] * len(bodies)
        base = f"http://127.0.0.1:{server.server_address[1]}"
        runs = tmp_path / "runs.json"
        runs.write_text(json.dumps([{"url": f"{base}/{i}", "body": sent} for i, sent in enumerate(requests)]))
        done = subprocess.run(
            ["node", str(NODE / script), "--batch", str(runs)],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        results = json.loads(done.stdout)
        assert len(results) == len(bodies)
        if outputs is not None:
            outputs += [result["stdout"] for result in results]
        return [(result["status"], result["stderr"]) for result in results]
    finally:
        server.shutdown()
        server.server_close()


async def stopped_at(protocol: str, cut: int, written: bool) -> tuple[bytes, int]:
    """The body of a run stopped while the server sends its `cut`-th body chunk (the client reads
    no further; `written`: the chunk reached it before the send stalled), and the stop's status."""
    import anyio
    from starlette.applications import Starlette
    from starlette.routing import Route

    sys.path.insert(0, str(SERVERS))
    from frontends_app import Orders, user_and_thread

    import agentrt
    import agentrt.sse
    from agentrt import ThinkingDelta
    from agentrt.testing import CallTool, Hang, ScriptedModel

    model = ScriptedModel(
        [ThinkingDelta("Plan. "), "Checking.", CallTool("order", {"order_id": "A"}, id="c1")],
        [ThinkingDelta("Known. "), "It ", "shipped", Hang()],
    )
    svc = agentrt.build(Desk, model=model, tools=[Orders()], memory=agentrt.memory.window())
    handler = agentrt.sse.endpoint(
        svc.plain, memory_id=user_and_thread, protocol=protocol, thinking=True, tool_details=True, ping=None
    )
    app = Starlette(
        routes=[Route("/chat", handler, methods=["POST"]), Route("/stop", handler.stop, methods=["POST"])]
    )
    body = VERCEL_BODY if protocol == "vercel-ui" else AGUI_BODY
    incoming = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    out: list[bytes] = []
    headers: dict[bytes, bytes] = {}
    stalled = anyio.Event()
    chunks = 0

    async def receive() -> Any:
        if incoming:
            return incoming.pop()
        await anyio.sleep_forever()

    async def send(message: Any) -> None:
        nonlocal chunks
        if message["type"] == "http.response.start":
            headers.update(message["headers"])
            return
        data = message.get("body", b"")
        if not stalled.is_set() and data:
            chunks += 1
            if chunks == cut:
                if written:
                    out.append(data)
                stalled.set()
                await anyio.sleep_forever()  # the client stopped reading: this send never returns
        out.append(data)

    import httpx

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http_client:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                group.start_soon(app, post_scope("/chat"), receive, send)
                await stalled.wait()
                run_id = headers[b"agentrt-run-id"].decode()
                thread = body.get("id") or body.get("threadId")
                stop = await http_client.post("/stop", json={"runId": run_id, "threadId": thread})
    assert model.streams[-1].closed
    return b"".join(out), stop.status_code


VERCEL_BODY = {
    "id": "chat-s",
    "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Where is A?"}]}],
    "trigger": "submit-message",
}
AGUI_BODY = {
    "threadId": "t-s",
    "runId": "r-s",
    "state": {},
    "messages": [{"id": "u1", "role": "user", "content": "Where is A?"}],
    "tools": [],
    "context": [],
    "forwardedProps": {},
}


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("protocol", ["vercel-ui", "ag-ui"])
def test_a_stop_at_any_chunk_leaves_a_stream_the_client_accepts(
    clients: Path, tmp_path: Path, protocol: str, backend: str
) -> None:
    import anyio

    script, request = (
        ("vercel_client.mjs", VERCEL_BODY) if protocol == "vercel-ui" else ("agui_client.mjs", AGUI_BODY)
    )
    # Every chunk of the stream until it hangs (the first answer's thinking, text and tool call,
    # the second's start), cut before and after it was written.
    cuts = [(cut, written) for cut in range(1, 13) for written in (False, True)]
    bodies = []
    for cut, written in cuts:
        body, status = anyio.run(stopped_at, protocol, cut, written, backend=backend)
        assert status == 202
        ends = body.count(b'"abort"') + body.count(b"RUN_FINISHED") + body.count(b"RUN_ERROR")
        assert ends == 1, body.decode()  # one end, whatever was sent before
        bodies.append(body)
    for (cut, written), body, (status, errors) in zip(
        cuts, bodies, replay(script, request, bodies, tmp_path), strict=True
    ):
        # agui_client.mjs exits 4 for a valid stream that ends with RUN_ERROR (what a stop sends
        # when the client may not have a part's start or end); 2 and 3 are invalid events.
        accepted = (0, 4) if b'"RUN_ERROR","message":"the run was stopped"' in body else (0,)
        assert status in accepted, f"cut at chunk {cut} (written={written}):\n{body.decode()}\n{errors}"
