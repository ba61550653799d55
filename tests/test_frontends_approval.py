"""Approval over the frontend protocols of `agentrt.sse.endpoint`: Vercel's `tool-approval-request`
chunks and `approval-responded` tool parts, AG-UI's interrupt outcome and `resume` entries. The
golden chunk sequences, the client request bodies the libraries send (tests/test_frontends_node.py
runs the libraries themselves), and what the server refuses to read from a client: a call it did not
ask about, changed arguments, another conversation's run. Run through httpx's ASGI transport."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import httpx
import pytest
from servers.approval_tools import Desk, Shop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

import agentrt
import agentrt.sse
from agentrt.testing import CallTool, ScriptedModel


def by_thread(request: Request, thread: str | None) -> str:
    return f"{request.headers.get('x-user', 'ada')}:{thread}"


def chunks(text: str) -> list[Any]:
    assert "\r" not in text
    frames = [frame for frame in text.split("\n\n") if frame.startswith("data: ")]
    return [frame[6:] if frame[6:] == "[DONE]" else json.loads(frame[6:]) for frame in frames]


class Setup:
    def __init__(
        self, protocol: str, *after: Any, tool_details: bool = True, model: ScriptedModel | None = None
    ) -> None:
        first = [
            "Checking. ",
            CallTool("refund", {"order": "A"}, id="c1"),
            CallTool("look", {"order": "B"}, id="c2"),
        ]
        self.model = model or ScriptedModel(first, *(after or (["Refunded A."],)))
        self.shop = Shop()
        self.service = agentrt.build(
            Desk, model=self.model, tools=[self.shop], memory=agentrt.memory.window()
        )
        handler = agentrt.sse.endpoint(
            self.service.chat,
            memory_id=by_thread,
            protocol=protocol,
            tool_details=tool_details,  # type: ignore[arg-type]
        )
        app = Starlette(routes=[Route("/chat", handler, methods=["POST"])])
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")

    async def post(self, body: Any, user: str = "ada") -> httpx.Response:
        return await self.http.post("/chat", json=body, headers={"x-user": user})

    async def stream(self, body: Any, user: str = "ada") -> list[Any]:
        response = await self.post(body, user)
        assert response.status_code == 200, response.text
        return chunks(response.text)


def repeating() -> ScriptedModel:
    """A provider that repeats call ids across rounds: the second round's call is `c1~2` on the
    wire, and a resumed stream must name the part the client has."""
    return ScriptedModel(
        [CallTool("look", {"order": "B"}, id="c1")],
        [CallTool("refund", {"order": "A"}, id="c1")],
        ["Refunded A."],
    )


# --- Vercel AI SDK UI message stream ------------------------------------------------------------------

USER = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Refund A"}]}


def vercel(*messages: Any, chat: str = "chat-1") -> dict[str, Any]:
    return {"id": chat, "messages": list(messages), "trigger": "submit-message"}


def answered(message_id: str, approval_id: str, approved: bool, **extra: Any) -> dict[str, Any]:
    """The assistant message as `useChat` has it after `addToolApprovalResponse({id, approved,
    reason})` (the shape ai@7's `Chat` sends back: the part goes to `approval-responded`)."""
    approval = {"id": approval_id, "approved": approved, **extra}
    return {
        "id": message_id,
        "role": "assistant",
        "parts": [
            {"type": "text", "text": "Checking. ", "state": "done"},
            {
                "type": "tool-refund",
                "toolCallId": "c1",
                "state": "approval-responded",
                "input": {"order": "A"},
                "approval": approval,
            },
            {
                "type": "tool-look",
                "toolCallId": "c2",
                "state": "output-available",
                "input": {"order": "B"},
                "output": "B: shipped",
            },
        ],
    }


async def test_vercel_a_gated_call_is_a_tool_approval_request_and_the_answer_continues_the_message() -> None:
    setup = Setup("vercel-ui")
    sent = await setup.stream(vercel(USER))
    message_id = sent[0]["messageId"]
    approval_id = sent[-3]["approvalId"]
    run_id, _, call = approval_id.partition(":")
    assert call == "c1" and len(run_id) == 32
    finish = sent[-2]
    assert finish["messageMetadata"]["attempts"] == 1
    assert sent[:-2] == [
        {"type": "start", "messageId": message_id},
        {"type": "text-start", "id": "text_1"},
        {"type": "text-delta", "id": "text_1", "delta": "Checking. "},
        {"type": "text-end", "id": "text_1"},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "refund"},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"order":"A"}'},
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "refund", "input": {"order": "A"}},
        {"type": "tool-input-start", "toolCallId": "c2", "toolName": "look"},
        {"type": "tool-input-delta", "toolCallId": "c2", "inputTextDelta": '{"order":"B"}'},
        {"type": "tool-input-available", "toolCallId": "c2", "toolName": "look", "input": {"order": "B"}},
        {"type": "tool-output-available", "toolCallId": "c2", "output": "B: shipped"},
        {
            "type": "tool-approval-request",
            "approvalId": approval_id,
            "toolCallId": "c1",
            "approvalDescriptor": {"tool": "refund", "arguments": {"order": "A", "amount": 1.0}},
        },
    ]
    assert finish["type"] == "finish" and finish["finishReason"] == "tool-calls" and sent[-1] == "[DONE]"
    assert setup.shop.refunds == []

    # The client sends the whole chat back; only the approval of the last message is read.
    response = await setup.post(vercel(USER, answered(message_id, approval_id, True)))
    assert response.headers["agentrt-run-id"] == message_id
    resumed = chunks(response.text)
    resumed[-2]["messageMetadata"] = "..."
    assert resumed == [
        {"type": "start", "messageId": message_id},  # the same message goes on
        {"type": "tool-output-available", "toolCallId": "c1", "output": "refunded 1.0 on A"},
        {"type": "text-start", "id": "text_1"},
        {"type": "text-delta", "id": "text_1", "delta": "Refunded A."},
        {"type": "text-end", "id": "text_1"},
        {"type": "finish", "finishReason": "stop", "messageMetadata": "..."},
        "[DONE]",
    ]
    assert setup.shop.refunds == [("A", 1.0)]
    again = await setup.post(vercel(USER, answered(message_id, approval_id, True)))
    assert again.status_code == 404 and setup.shop.refunds == [("A", 1.0)]


async def test_vercel_a_denial_is_tool_output_denied_and_its_reason_reaches_the_model() -> None:
    setup = Setup("vercel-ui", ["Not refunded."])
    sent = await setup.stream(vercel(USER))
    message = answered(sent[0]["messageId"], sent[-3]["approvalId"], False, reason="not today")
    resumed = await setup.stream(vercel(USER, message))
    assert resumed[1] == {"type": "tool-output-denied", "toolCallId": "c1"}
    assert setup.shop.refunds == []
    assert setup.model.requests[1].messages[-2].text.endswith("Reason: not today")


async def test_vercel_only_the_decision_is_read_not_the_part_s_input() -> None:
    setup = Setup("vercel-ui")
    sent = await setup.stream(vercel(USER))
    message = answered(sent[0]["messageId"], sent[-3]["approvalId"], True)
    message["parts"][1]["input"] = {"order": "Z", "amount": 1000}  # edited by the client: not read
    await setup.stream(vercel(USER, message))
    assert setup.shop.refunds == [("A", 1.0)]


@pytest.mark.parametrize(
    ("forge", "status", "kind"),
    [
        (lambda run: f"{run}:c2", 400, "approval_decision"),  # a call that was not gated
        (lambda run: f"{run}:c9", 400, "approval_decision"),  # a call nobody made
        (lambda run: "c1", 400, "approval_decision"),  # not an approval id of this server
        (lambda run: f"{'0' * 32}:c1", 404, "approval_not_found"),  # a run that never was
    ],
)
async def test_vercel_an_answer_the_server_did_not_ask_for_is_refused(
    forge: Any, status: int, kind: str
) -> None:
    setup = Setup("vercel-ui")
    sent = await setup.stream(vercel(USER))
    run_id = sent[-3]["approvalId"].partition(":")[0]
    response = await setup.post(vercel(USER, answered(sent[0]["messageId"], forge(run_id), True)))
    assert response.status_code == status
    assert response.json()["error"]["type"] == kind
    assert setup.shop.refunds == [] and len(setup.model.requests) == 1


async def test_vercel_another_conversation_s_run_is_not_found() -> None:
    setup = Setup("vercel-ui")
    sent = await setup.stream(vercel(USER))
    message = answered(sent[0]["messageId"], sent[-3]["approvalId"], True)
    for user, chat in (("eve", "chat-1"), ("ada", "chat-2")):  # another user; another chat of Ada's
        response = await setup.post(vercel(USER, message, chat=chat), user=user)
        assert response.status_code == 404 and response.json()["error"]["type"] == "approval_not_found"
    assert setup.shop.refunds == []
    await setup.stream(vercel(USER, message))
    assert setup.shop.refunds == [("A", 1.0)]


async def test_vercel_a_new_message_while_a_turn_waits_is_a_409() -> None:
    setup = Setup("vercel-ui")
    await setup.stream(vercel(USER))
    response = await setup.post(
        vercel({"id": "u2", "role": "user", "parts": [{"type": "text", "text": "Hi"}]})
    )
    assert response.status_code == 409 and response.json()["error"]["type"] == "approval_pending"


async def test_vercel_the_arguments_to_decide_on_are_sent_without_tool_details() -> None:
    setup = Setup("vercel-ui", tool_details=False)
    sent = await setup.stream(vercel(USER))
    assert sent[-3]["approvalDescriptor"] == {"tool": "refund", "arguments": {"order": "A", "amount": 1.0}}
    assert all(chunk.get("input") in (None, {}) for chunk in sent[:-1])  # the parts' inputs: none


async def test_vercel_a_call_id_repeated_across_rounds_keeps_the_client_s_part_id() -> None:
    setup = Setup("vercel-ui", model=repeating())
    sent = await setup.stream(vercel(USER))
    request = sent[-3]
    assert request["toolCallId"] == "c1~2" and request["approvalId"].endswith(":c1")
    message = {
        "id": sent[0]["messageId"],
        "role": "assistant",
        "parts": [
            {
                "type": "tool-look",
                "toolCallId": "c1",
                "state": "output-available",
                "input": {},
                "output": "B",
            },
            {
                "type": "tool-refund",
                "toolCallId": "c1~2",
                "state": "approval-responded",
                "input": {"order": "A"},
                "approval": {"id": request["approvalId"], "approved": True},
            },
        ],
    }
    resumed = await setup.stream(vercel(USER, message))
    assert resumed[1] == {
        "type": "tool-output-available",
        "toolCallId": "c1~2",
        "output": "refunded 1.0 on A",
    }


# --- AG-UI ----------------------------------------------------------------------------------------------


def agui(
    run: str, messages: list[Any], resume: list[Any] | None = None, thread: str = "t1"
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "threadId": thread,
        "runId": run,
        "messages": messages,
        "state": {},
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    if resume is not None:
        body["resume"] = resume
    return body


ASKED = [{"id": "u1", "role": "user", "content": "Refund A"}]


async def test_ag_ui_a_gated_call_ends_the_run_with_an_interrupt_and_resume_continues_it() -> None:
    setup = Setup("ag-ui")
    sent = await setup.stream(agui("r1", ASKED))
    finished = sent[-1]
    interrupt = dict(finished["outcome"]["interrupts"][0])
    expires = interrupt.pop("expiresAt")
    assert expires.endswith("Z") and datetime.fromisoformat(expires).timestamp() > 0
    assert interrupt["id"].endswith(":c1")
    assert interrupt == {
        "id": interrupt["id"],
        "reason": "tool_approval",
        "message": "Allow the call of refund?",
        "toolCallId": "c1",
        "responseSchema": agentrt.sse._agui.APPROVAL_RESPONSE,
        "metadata": {"tool": "refund", "arguments": {"order": "A", "amount": 1.0}},
    }
    assert finished == {
        "type": "RUN_FINISHED",
        "threadId": "t1",
        "runId": "r1",
        "outcome": {"type": "interrupt", "interrupts": [{**interrupt, "expiresAt": expires}]},
    }
    assert [c["type"] for c in sent] == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        *["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END"] * 2,
        "TOOL_CALL_RESULT",  # the ungated call
        "RUN_FINISHED",
    ]
    assert setup.shop.refunds == []

    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
    resumed = await setup.stream(agui("r2", ASKED, resume))
    assert resumed[0] == {"type": "RUN_STARTED", "threadId": "t1", "runId": "r2"}
    assert resumed[1]["type"] == "TOOL_CALL_RESULT" and resumed[1]["toolCallId"] == "c1"
    assert resumed[1]["content"] == "refunded 1.0 on A"
    assert resumed[-1]["outcome"] == {"type": "success"} and resumed[-1]["result"]["text"] == "Refunded A."
    assert setup.shop.refunds == [("A", 1.0)]


@pytest.mark.parametrize(
    ("entry", "refunds", "told"),
    [
        (
            {"status": "resolved", "payload": {"approved": True, "arguments": {"order": "A", "amount": 3}}},
            [("A", 3.0)],
            "refunded 3.0 on A",
        ),
        ({"status": "resolved", "payload": {"approved": False, "reason": "no"}}, [], "Reason: no"),
        ({"status": "cancelled"}, [], "it was not run."),
    ],
)
async def test_ag_ui_an_answer_approves_with_an_edit_denies_or_cancels(
    entry: dict[str, Any], refunds: list[Any], told: str
) -> None:
    setup = Setup("ag-ui", ["Done."])
    [interrupt] = (await setup.stream(agui("r1", ASKED)))[-1]["outcome"]["interrupts"]
    resumed = await setup.stream(agui("r2", ASKED, [{"interruptId": interrupt["id"], **entry}]))
    assert resumed[-1]["type"] == "RUN_FINISHED"
    assert setup.shop.refunds == refunds
    assert setup.model.requests[1].messages[-2].text.endswith(told)


@pytest.mark.parametrize(
    ("entries", "status", "kind"),
    [
        (lambda i: [{"interruptId": i, "status": "resolved"}], 400, "approval_decision"),  # no payload
        (
            lambda i: [{"interruptId": i, "status": "resolved", "payload": {"approve": True}}],
            400,
            "approval_decision",
        ),
        (
            lambda i: [
                {"interruptId": i.replace(":c1", ":c2"), "status": "resolved", "payload": {"approved": True}}
            ],
            400,
            "approval_decision",
        ),
        (lambda i: [{"interruptId": i, "status": "cancelled"}] * 2, 400, "approval_decision"),
        (lambda i: [{"interruptId": "0" * 32 + ":c1", "status": "cancelled"}], 404, "approval_not_found"),
        (lambda i: ["yes"], 400, "approval_decision"),
    ],
)
async def test_ag_ui_an_answer_the_server_did_not_ask_for_is_refused(
    entries: Any, status: int, kind: str
) -> None:
    setup = Setup("ag-ui")
    [interrupt] = (await setup.stream(agui("r1", ASKED)))[-1]["outcome"]["interrupts"]
    response = await setup.post(agui("r2", ASKED, entries(interrupt["id"])))
    assert response.status_code == status, response.text
    assert response.json()["error"]["type"] == kind
    assert setup.shop.refunds == [] and len(setup.model.requests) == 1


async def test_ag_ui_another_conversation_s_run_is_not_found() -> None:
    setup = Setup("ag-ui")
    [interrupt] = (await setup.stream(agui("r1", ASKED)))[-1]["outcome"]["interrupts"]
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
    other = await setup.post(agui("r2", ASKED, resume, thread="t2"))
    assert other.status_code == 404 and other.json()["error"]["type"] == "approval_not_found"
    eve = await setup.post(agui("r2", ASKED, resume), user="eve")
    assert eve.status_code == 404
    assert setup.shop.refunds == []


async def test_ag_ui_a_denied_call_without_tool_details_says_so() -> None:
    setup = Setup("ag-ui", ["Not refunded."], tool_details=False)
    [interrupt] = (await setup.stream(agui("r1", ASKED)))[-1]["outcome"]["interrupts"]
    assert interrupt["metadata"]["arguments"] == {"order": "A", "amount": 1.0}  # to decide on
    resumed = await setup.stream(agui("r2", ASKED, [{"interruptId": interrupt["id"], "status": "cancelled"}]))
    assert resumed[1]["content"] == "the tool call was denied"


async def test_ag_ui_a_call_id_repeated_across_rounds_keeps_the_client_s_tool_call_id() -> None:
    setup = Setup("ag-ui", model=repeating())
    [interrupt] = (await setup.stream(agui("r1", ASKED)))[-1]["outcome"]["interrupts"]
    assert interrupt["toolCallId"] == "c1~2" and interrupt["id"].endswith(":c1")
    # The messages the client has after the first run (as AG-UI's client assembles them).
    messages = [
        *ASKED,
        {
            "id": "r1-m1",
            "role": "assistant",
            "content": "",
            "toolCalls": [{"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}],
        },
        {"id": "r1-t2", "role": "tool", "toolCallId": "c1", "content": "B: shipped"},
        {
            "id": "r1-m3",
            "role": "assistant",
            "content": "",
            "toolCalls": [
                {"id": "c1~2", "type": "function", "function": {"name": "refund", "arguments": "{}"}}
            ],
        },
    ]
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
    resumed = await setup.stream(agui("r2", messages, resume))
    assert resumed[1]["type"] == "TOOL_CALL_RESULT" and resumed[1]["toolCallId"] == "c1~2"


async def test_vercel_a_message_id_unfit_for_a_header_is_not_taken() -> None:
    setup = Setup("vercel-ui")
    sent = await setup.stream(vercel(USER))
    message = answered("evil\r\nset-cookie: x=1", sent[-3]["approvalId"], True)
    response = await setup.post(vercel(USER, message))
    assert response.status_code == 200 and "set-cookie" not in response.headers
    resumed = chunks(response.text)
    # A message id of the server's own instead, as for a new answer.
    assert resumed[0]["messageId"].startswith("msg_")
    assert resumed[0]["messageId"] == response.headers["agentrt-run-id"] != sent[0]["messageId"]
    assert setup.shop.refunds == [("A", 1.0)]
