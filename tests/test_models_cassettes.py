"""The conformance cassettes replayed byte-exact through the adapters (acceptance item 1).

Each recorded response (status, headers, body bytes) is served by an `httpx.MockTransport`; the
expected text, thinking, refusal, tool calls, usage, finish reason or error are read from the recording
itself (see `cassettes.py`). Streaming cassettes are also replayed split into two parts at every byte
offset and in one-byte parts, and must decode to exactly the same chunks.
"""

from __future__ import annotations

import json
import random
from typing import Any

import depth
import httpx
import pytest
from cassettes import (
    ANTHROPIC,
    ERRORS,
    NOT_APPLICABLE,
    OLLAMA,
    OPENAI,
    SCENARIO_ERRORS,
    Cassette,
    Expected,
    error_details,
    expected_anthropic,
    expected_ollama,
    expected_openai,
    load_all,
    one_byte_parts,
    pick,
    replay,
    split_at,
)

from agentrt import (
    AgentError,
    ModelError,
    ModelRequest,
    RateLimitError,
    TextDelta,
    ThinkingDelta,
    Usage,
    UserMessage,
)
from agentrt.models import (
    AnthropicChatModel,
    ModelChunk,
    ModelResponse,
    OllamaChatModel,
    OpenAIChatModel,
    ResponseAccumulator,
    RetryPolicy,
    complete,
)
from agentrt.models._decoders import NDJSONChunkDecoder, SSEChunkDecoder
from agentrt.models._failures import ErrorContext
from agentrt.models._ndjson import NDJSONDecoder
from agentrt.models._sse import SSEDecoder
from agentrt.models.anthropic import EventStreamDecoder, MessagesMapper
from agentrt.models.ollama import OllamaChatMapper
from agentrt.models.openai import ChatCompletionMapper

REQUEST = ModelRequest(messages=(UserMessage.of("Say this is a test"),))
REPLAYED = OPENAI | OLLAMA | ANTHROPIC
STREAMING = [c for c in pick(REPLAYED) if c.streaming]
SMALL_STREAMING = [c for c in STREAMING if len(c.body) <= 16_384]
LARGE_STREAMING = [c for c in STREAMING if len(c.body) > 16_384]


def test_every_cassette_is_replayed_or_explained() -> None:
    numbers = {c.number for c in load_all()}
    assert len(numbers) == 51
    classified = [OPENAI, OLLAMA, ANTHROPIC, ERRORS, set(NOT_APPLICABLE)]
    assert set().union(*classified) == numbers
    assert sum(len(group) for group in classified) == len(numbers)  # each in exactly one group


def openai_model(cassette: Cassette, client: httpx.AsyncClient, **options: Any) -> OpenAIChatModel:
    url = cassette.url or "https://api.example.com/v1/chat/completions"
    base = url.split("/chat/completions")[0] if "/chat/completions" in url else "https://api.example.com/v1"
    return OpenAIChatModel(
        cassette.request_body.get("model", "model"),
        base_url=base,
        api_key="sk-test-key",
        client=client,
        streaming=cassette.streaming,
        retry=RetryPolicy.never(),
        **options,
    )


def ollama_model(cassette: Cassette, client: httpx.AsyncClient, **options: Any) -> OllamaChatModel:
    url = cassette.url or "http://127.0.0.1:11434/api/chat"
    base = url.split("/api/chat")[0] if "/api/chat" in url else "http://127.0.0.1:11434"
    return OllamaChatModel(
        cassette.request_body.get("model", "model"),
        base_url=base,
        client=client,
        streaming=cassette.streaming,
        retry=RetryPolicy.never(),
        **options,
    )


def anthropic_model(cassette: Cassette, client: httpx.AsyncClient, **options: Any) -> AnthropicChatModel:
    # The recorded URL's query (25's `?beta=true`) stays on the base URL, and so on every request.
    base = (cassette.url or "https://api.anthropic.com/v1/messages").replace("/v1/messages", "")
    return AnthropicChatModel(
        cassette.request_body.get("model", "model"),
        base_url=base,
        api_key="sk-ant-test-key",
        client=client,
        streaming=cassette.streaming,
        retry=RetryPolicy.never(),
        **options,
    )


Adapter = OpenAIChatModel | OllamaChatModel | AnthropicChatModel
ADAPTERS = {"openai": openai_model, "ollama": ollama_model, "anthropic": anthropic_model}


def model_for(cassette: Cassette, client: httpx.AsyncClient) -> Adapter:
    if cassette.number in OLLAMA:
        return ollama_model(cassette, client)
    if cassette.number in ANTHROPIC:
        return anthropic_model(cassette, client)
    return openai_model(cassette, client)


def expected_for(cassette: Cassette) -> Expected:
    if cassette.number in OLLAMA:
        return expected_ollama(cassette)
    if cassette.number in ANTHROPIC:
        return expected_anthropic(cassette)
    return expected_openai(cassette)


def assert_matches(response: ModelResponse, expected: Expected) -> None:
    message = response.message
    assert message.text == (expected.text or None)
    assert (message.thinking or "") == expected.thinking
    assert message.thinking_signature == expected.signature  # byte for byte, as it must go back
    assert (message.refusal or "") == expected.refusal
    calls = [(c.id, c.name, c.parsed_arguments()) for c in message.tool_calls]
    assert calls == [(c["id"], c["name"], c["arguments"]) for c in expected.calls]
    usage = response.usage
    if expected.usage is None:
        assert usage.estimated  # estimated by the fold: the adapter reported nothing
    else:
        assert not usage.estimated
        assert (
            usage.input_tokens,
            usage.output_tokens,
            usage.cached_input_tokens,
            usage.reasoning_tokens,
        ) == expected.usage
    assert response.finish_reason == expected.finish_reason
    assert response.id == expected.id
    assert response.model == expected.model


async def collect(model: Adapter) -> tuple[list[ModelChunk], BaseException | None]:
    chunks: list[ModelChunk] = []
    stream = model.stream(REQUEST)
    try:
        async for chunk in stream:
            chunks.append(chunk)
    except AgentError as exc:
        return chunks, exc
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return chunks, None


# --- whole replays --------------------------------------------------------------------------------


@pytest.mark.parametrize("cassette", pick(REPLAYED), ids=repr)
async def test_cassette_folds_to_the_recorded_answer(cassette: Cassette) -> None:
    expected = expected_for(cassette)
    requests: list[httpx.Request] = []
    async with httpx.AsyncClient(transport=replay(cassette, requests=requests)) as client:
        model = model_for(cassette, client)
        if expected.error is not None:
            chunks, error = await collect(model)
            assert type(error) is expected.error_class()
            assert isinstance(error, ModelError)
            assert expected.error_message() in error.message
            assert error.mid_stream
            assert error.status == 400
            assert error.endpoint == model.endpoint
            # What arrived before the error was delivered, once.
            assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == expected.text
            assert "".join(c.text for c in chunks if isinstance(c, ThinkingDelta)) == expected.thinking
        else:
            assert_matches(await complete(model, REQUEST), expected)
    assert len(requests) == 1
    sent = json.loads(requests[0].content)
    assert sent["stream"] is cassette.streaming
    assert requests[0].url == (cassette.url or requests[0].url)


@pytest.mark.parametrize("cassette", pick(REPLAYED), ids=repr)
async def test_usage_is_reported_only_when_the_server_sent_it(cassette: Cassette) -> None:
    expected = expected_for(cassette)
    async with httpx.AsyncClient(transport=replay(cassette)) as client:
        chunks, _ = await collect(model_for(cassette, client))
    usages = [c for c in chunks if isinstance(c, Usage)]
    if expected.usage is None:
        assert usages == []  # never a made-up zero: the fold estimates instead
    else:
        assert len(usages) == 1


@pytest.mark.parametrize("cassette", pick(ERRORS), ids=repr)
@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
async def test_error_cassette_becomes_a_typed_error(cassette: Cassette, adapter: str) -> None:
    message, request_id = error_details(cassette)
    async with httpx.AsyncClient(transport=replay(cassette)) as client:
        model = ADAPTERS[adapter](cassette, client)
        with pytest.raises(ModelError) as info:
            await complete(model, REQUEST)
    error = info.value
    assert type(error) is SCENARIO_ERRORS[cassette.scenario]
    assert error.status == cassette.status
    assert message in error.message
    assert error.request_id == request_id
    assert error.endpoint == model.endpoint
    assert error.body == cassette.body.decode("utf-8")
    assert not error.mid_stream
    assert str(cassette.status) in str(error)
    if isinstance(error, RateLimitError):
        assert error.retry_after is None  # none of the recorded 429s sent a retry-after


# --- split replays --------------------------------------------------------------------------------


def decode(cassette: Cassette, parts: list[bytes]) -> tuple[list[ModelChunk], str | None]:
    """The chunks (and error) of the adapter's own decoder for the body delivered in `parts`."""
    context = ErrorContext("http://test/")
    decoder: SSEChunkDecoder | NDJSONChunkDecoder | EventStreamDecoder
    if cassette.number in OLLAMA:
        decoder = NDJSONChunkDecoder(OllamaChatMapper(context, None, REQUEST))
    elif cassette.number in ANTHROPIC:
        decoder = EventStreamDecoder(MessagesMapper(context, None))
    else:
        decoder = SSEChunkDecoder(ChatCompletionMapper(context, None))
    chunks: list[ModelChunk] = []
    for part in parts:
        chunks += decoder.feed(part)
        if decoder.done:
            break
    chunks += decoder.close()
    error = decoder.error
    return chunks, None if error is None else f"{type(error).__name__}: {error}"


@pytest.mark.exhaustive
@pytest.mark.parametrize("cassette", SMALL_STREAMING, ids=repr)
def test_stream_split_in_two_at_every_offset_decodes_the_same(cassette: Cassette) -> None:
    body = cassette.body
    whole = decode(cassette, [body])
    assert whole[0]
    for offset in depth.offsets(body):
        assert decode(cassette, split_at(body, offset)) == whole, offset


@pytest.mark.exhaustive
@pytest.mark.parametrize("cassette", LARGE_STREAMING, ids=repr)
def test_large_stream_split_in_two_at_every_offset_frames_the_same(cassette: Cassette) -> None:
    # The payloads a split body frames into are exactly the same at every offset; the mapper only ever
    # sees framed payloads, so its chunks are the same too (checked at each line boundary below).
    body = cassette.body
    framer = NDJSONDecoder if cassette.number in OLLAMA else SSEDecoder
    first = framer()
    whole = first.feed(body) + first.close()
    for offset in depth.offsets(body):
        decoder = framer()
        framed = decoder.feed(body[:offset])
        framed += decoder.feed(body[offset:])
        framed += decoder.close()
        assert framed == whole, offset


@pytest.mark.parametrize("cassette", LARGE_STREAMING, ids=repr)
def test_large_stream_split_around_every_line_end_decodes_the_same(cassette: Cassette) -> None:
    body = cassette.body
    whole = decode(cassette, [body])
    ends = [i for i, byte in enumerate(body) if byte in b"\r\n"]
    offsets = sorted({min(len(body), end + d) for end in ends for d in (0, 1)})
    for offset in offsets:
        assert decode(cassette, split_at(body, offset)) == whole, offset


@pytest.mark.parametrize("cassette", STREAMING, ids=repr)
def test_stream_read_one_event_or_line_at_a_time_decodes_the_same(cassette: Cassette) -> None:
    # How a server that flushes every token arrives; the SSE decoder takes a shortcut for it.
    body = cassette.body
    separator = b"\n" if cassette.number in OLLAMA else b"\n\n"
    pieces = body.split(separator)
    parts = [piece + separator for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
    assert b"".join(parts) == body
    assert decode(cassette, parts) == decode(cassette, [body])


@pytest.mark.parametrize("cassette", STREAMING, ids=repr)
async def test_stream_in_one_byte_parts_through_the_adapter(cassette: Cassette) -> None:
    async with httpx.AsyncClient(transport=replay(cassette)) as client:
        whole = await collect(model_for(cassette, client))
    async with httpx.AsyncClient(transport=replay(cassette, parts=one_byte_parts(cassette.body))) as client:
        single = await collect(model_for(cassette, client))
    assert chunks_and_error(single) == chunks_and_error(whole)


@pytest.mark.parametrize("cassette", STREAMING, ids=repr)
async def test_stream_split_at_random_offsets_through_the_adapter(cassette: Cassette) -> None:
    body = cassette.body
    async with httpx.AsyncClient(transport=replay(cassette)) as client:
        whole = chunks_and_error(await collect(model_for(cassette, client)))
    rng = random.Random(cassette.number)
    for _ in range(8):
        cuts = sorted(rng.sample(range(1, len(body)), 5))
        parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        async with httpx.AsyncClient(transport=replay(cassette, parts=parts)) as client:
            assert chunks_and_error(await collect(model_for(cassette, client))) == whole, cuts


def chunks_and_error(result: tuple[list[ModelChunk], BaseException | None]) -> tuple[Any, ...]:
    chunks, error = result
    return tuple(chunks), None if error is None else (type(error), str(error))


def test_the_fold_of_split_chunks_is_the_fold_of_whole_chunks() -> None:
    # Same chunks in, same response out: the accumulator is what the pipeline folds with.
    for cassette in SMALL_STREAMING:
        chunks, _ = decode(cassette, one_byte_parts(cassette.body))
        folded, whole = ResponseAccumulator(), ResponseAccumulator()
        for chunk in chunks:
            folded.add(chunk)
        for chunk in decode(cassette, [cassette.body])[0]:
            whole.add(chunk)
        assert folded.build(REQUEST) == whole.build(REQUEST)
