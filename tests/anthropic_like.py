"""`AnthropicLike`, a `MockTransport` server that answers as the Messages API does, and the wire format
it streams.

It checks each request against the rules of the API these tests touch (each rule is Anthropic's
documented or observed 400) and refuses it with Anthropic's own error envelope, so that a request the
real API would refuse fails here too. Shared by tests/test_models_anthropic.py and tests/test_otel.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from agentrt.models import AnthropicChatModel, RetryPolicy

KEY = "sk-ant-api03-like-key-0123456789"


def events(*payloads: dict[str, Any]) -> bytes:
    return b"".join(
        b"event: " + p["type"].encode() + b"\ndata: " + orjson.dumps(p) + b"\n\n" for p in payloads
    )


def start() -> dict[str, Any]:
    message = {"id": "msg_r", "type": "message", "role": "assistant", "model": "claude-test", "content": []}
    return {"type": "message_start", "message": {**message, "usage": {"input_tokens": 7, "output_tokens": 1}}}


def block(index: int, content_block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": content_block}


def delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": fields}


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def end(reason: str = "end_turn", stop_sequence: str | None = None) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": stop_sequence},
            "usage": {"output_tokens": 3},
        },
        {"type": "message_stop"},
    ]


def text_stream(text: str) -> bytes:
    return events(
        start(),
        block(0, {"type": "text", "text": ""}),
        delta(0, type="text_delta", text=text),
        stop(0),
        *end(),
    )


def call_stream(call_id: str, query: str) -> bytes:
    return events(
        start(),
        block(0, {"type": "tool_use", "id": call_id, "name": "lookup", "input": {}}),
        delta(0, type="input_json_delta", partial_json=""),
        delta(0, type="input_json_delta", partial_json=orjson.dumps({"q": query}).decode()),
        stop(0),
        *end("tool_use"),
    )


def _refusal(message: str) -> httpx.Response:
    body = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
        "request_id": "req_r",
    }
    return httpx.Response(400, headers={"content-type": "application/json", "request-id": "req_r"}, json=body)


def _api_refusal(body: dict[str, Any]) -> str | None:
    """What the Messages API says (400 invalid_request_error) about a request body, for the rules it
    enforces that these tests touch; `None` if it takes the body."""
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    if any(b["type"] in ("tool_use", "tool_result") for b in blocks) and not body.get("tools"):
        # anthropics/anthropic-sdk-python#494 (and every Bedrock/Vertex client since)
        return "Requests which include `tool_use` or `tool_result` blocks must define tools."
    for number, message in enumerate(body["messages"]):
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        texts = [p["text"] for p in parts if p["type"] == "text"]
        if texts and len(texts) == len(parts) and not any(t.strip() for t in texts):
            # The API refuses a message whose only content is whitespace text (LibreChat-AI/agents#124
            # checked it against messages.create: [text:' '] and [text:'\n'] alone are refused).
            return f"messages.{number}: text content blocks must contain non-whitespace text"
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        budget = thinking["budget_tokens"]
        if budget < 1024:
            return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        if body["max_tokens"] <= budget:
            return "`max_tokens` must be greater than `thinking.budget_tokens`."
        if body.get("temperature", 1) != 1:
            return "`temperature` may only be set to 1 when thinking is enabled."
    return None


class AnthropicLike:
    """A MockTransport handler: replies in order, after checking each request as the API would."""

    def __init__(self, *replies: bytes) -> None:
        self.replies = list(replies)
        self.sent: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        refusal = _api_refusal(json.loads(request.content))
        if refusal is not None:
            return _refusal(refusal)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=self.replies.pop(0))

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.sent]


def anthropic(server: Callable[[httpx.Request], httpx.Response], **options: Any) -> AnthropicChatModel:
    client = httpx.AsyncClient(transport=httpx.MockTransport(server))
    options.setdefault("retry", RetryPolicy.never())
    return AnthropicChatModel("claude-test", api_key=KEY, client=client, **options)
