"""Messages: one discriminated union, one JSON round trip for every kind and content."""

from __future__ import annotations

import orjson
import pydantic
import pytest

from agentrt import (
    AssistantMessage,
    AudioContent,
    ImageContent,
    PdfContent,
    SystemMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    VideoContent,
    messages_from_json,
    messages_to_json,
)
from agentrt._messages import message_from_json

CONVERSATION = [
    SystemMessage(text="Be brief."),
    UserMessage(
        contents=(
            TextContent(text="What is on these?"),
            ImageContent.from_url("https://example.com/cat.png", detail="low"),
            ImageContent.from_bytes(b"\x89PNG\r\n", "image/png"),
            AudioContent.from_bytes(b"RIFF", "audio/wav"),
            VideoContent.from_url("https://example.com/v.mp4"),
            PdfContent.from_bytes(b"%PDF-1.7", "application/pdf", filename="a.pdf"),
        ),
        name="ada",
    ),
    AssistantMessage(
        text=None,
        thinking="Look it up.",
        thinking_signature="sig",
        tool_calls=(ToolCall(id="call_1", name="lookup", arguments='{"q": "cat"}'),),
    ),
    ToolResultMessage(tool_call_id="call_1", tool_name="lookup", text="a cat"),
    AssistantMessage(text="A cat.", refusal=None),
]


async def test_json_round_trip_of_every_message_and_content_kind() -> None:
    data = messages_to_json(CONVERSATION)

    assert isinstance(data, bytes)
    assert messages_from_json(data) == CONVERSATION
    roles = [m["role"] for m in orjson.loads(data)]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    kinds = [c["kind"] for c in orjson.loads(data)[1]["contents"]]
    assert kinds == ["text", "image", "image", "audio", "video", "pdf"]


async def test_media_content_needs_exactly_one_source_and_a_type_for_inline_data() -> None:
    with pytest.raises(pydantic.ValidationError, match="exactly one of"):
        ImageContent()
    with pytest.raises(pydantic.ValidationError, match="exactly one of"):
        ImageContent(url="https://x", data="AAAA", media_type="image/png")
    with pytest.raises(pydantic.ValidationError, match="needs a `media_type`"):
        AudioContent(data="AAAA")


async def test_data_url_and_inline_bytes() -> None:
    image = ImageContent.from_bytes(b"\x00\x01", "image/png")
    assert image.data_url() == "data:image/png;base64,AAE="
    assert ImageContent.from_url("https://x/y.png").data_url() == "https://x/y.png"


async def test_messages_are_immutable_and_reject_unknown_fields() -> None:
    message = SystemMessage(text="x")
    with pytest.raises(pydantic.ValidationError):
        message.text = "y"  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        messages_from_json(b'[{"role": "system", "text": "x", "extra": 1}]')
    with pytest.raises(pydantic.ValidationError):
        messages_from_json(b'[{"role": "robot", "text": "x"}]')


async def test_user_message_helpers_and_tool_call_arguments() -> None:
    image = ImageContent.from_url("https://x/y.png")
    message = UserMessage.of("first", image, "second")

    assert message.contents == (TextContent(text="first"), image, TextContent(text="second"))
    assert message.text == "first\nsecond"
    assert ToolCall(id="1", name="f", arguments='{"a": [1, 2]}').parsed_arguments() == {"a": [1, 2]}
    assert ToolCall(id="1", name="f", arguments="").parsed_arguments() == {}


# --- JSON that is not UTF-8 ---------------------------------------------------------------------------------


def test_bytes_that_are_not_utf8_are_a_json_error_as_before() -> None:
    with pytest.raises(orjson.JSONDecodeError):
        message_from_json(b'{"role": "user", "contents": [\xff]}')
