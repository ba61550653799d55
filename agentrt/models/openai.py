"""OpenAI-compatible Chat Completions (`POST {base_url}/chat/completions`) over httpx.

Works against OpenAI and the servers that copy its wire format: vLLM, llama.cpp's server, Ollama's
`/v1`, OpenRouter, Groq, Anthropic's compatibility endpoint, ... Compatible servers differ, so what a
server supports is declared in `Capabilities` and can be overridden per model.

Streaming and non-streaming responses share one mapping: a non-streaming `choices[].message` is read
as one big `delta`, so `ChatCompletionMapper` turns either into the same chunks (text, thinking,
refusal, tool-call fragments, usage, finish, response id/model). The SSE body is decoded incrementally
on bytes; a JSON body (a non-streaming request, or a server that ignored `stream: true`) is decoded
whole. Which one is chosen depends on the response's content type, then on what was asked for.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final, Literal, Unpack

import orjson

from .._errors import BadRequestError
from .._events import (
    Finish,
    RefusalDelta,
    ResponseMeta,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    Usage,
)
from .._messages import (
    AssistantMessage,
    AudioContent,
    ImageContent,
    PdfContent,
    SystemMessage,
    TextContent,
    ToolResultMessage,
    UserMessage,
    VideoContent,
)
from ._base import ConnectionOptions, HttpChatModel, Server, tool_images_apart
from ._decoders import MalformedPayload, MapperBase, SSEChunkDecoder, finish_reason, json_type
from ._protocol import Capabilities, JsonSchemaFormat, ModelSettings
from ._schema import strict_schema
from ._think import ThinkTagSplitter

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._events import ModelChunk
    from .._messages import ChatMessage
    from ._failures import ErrorContext
    from ._protocol import ModelRequest, ResponseFormat, ToolSpec

__all__ = ["ChatCompletionMapper", "OpenAIChatModel"]

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"

SERVER: Final = Server("openai", DEFAULT_BASE_URL, "OPENAI_BASE_URL", "OPENAI_API_KEY")
"""OpenAI's API, or the compatible server `OPENAI_BASE_URL` names; the key in `OPENAI_API_KEY`."""

DEFAULT_CAPABILITIES: Final = Capabilities(
    json_schema=True,
    json_object=True,
    image_input=True,
    pdf_input=True,
    thinking=True,
    handles_deadline=True,
    provider="openai",
)
"""What current OpenAI chat models accept. Audio input needs an audio model; video has no wire form."""

_NAME_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]")


class OpenAIChatModel(HttpChatModel):
    """A chat model behind an OpenAI-compatible Chat Completions endpoint.

    - `model`: the model name sent with every request.
    - `base_url`, `api_key`: default to `OPENAI_BASE_URL` and `OPENAI_API_KEY` (then to OpenAI's URL and
      no key, for local servers). The key is kept as a `SecretStr` and only ever put into the
      `Authorization` header.
    - `settings`: default request parameters; a request's own settings win field by field.
    - `capabilities`: what this model and server support (default `DEFAULT_CAPABILITIES`). Set
      `usage_in_stream=False` for servers that reject `stream_options`, `json_schema=False` for servers
      that reject `response_format: json_schema`.
    - `streaming`: `False` sends `stream: false` and maps the JSON response to the same chunks.
    - `system_role`: `"developer"` for models that want system instructions under that role.
    - `max_tokens_field`: `"max_completion_tokens"` for OpenAI's reasoning models.
    - `parallel_tool_calls`: sent with tools when not `None`.
    - `think_tags`: read a leading `<think>…</think>` in the answer as thinking (default on).
    - `json_object_schema`: send the schema inside a `json_object` response format (llama-cpp-python's
      dialect for grammar-constrained JSON); OpenAI itself rejects the extra field.
    - `extra_body`: extra top-level request fields for a server's own parameters (e.g. vLLM's `top_k`).
    - `headers`, `timeout`, `retry`, `client`, `on_request`, `on_response`, `on_error`: how to reach
      the server, as for every HTTP adapter (see `ConnectionOptions`).

    Errors are `agentrt.ModelError` kinds; transport errors and timeouts are translated here.
    """

    _server = SERVER
    _default_capabilities = DEFAULT_CAPABILITIES
    _path = "/chat/completions"
    _stream_type = "text/event-stream"
    _stream_decoder = SSEChunkDecoder

    def __init__(
        self,
        model: str,
        *,
        settings: ModelSettings | None = None,
        capabilities: Capabilities | None = None,
        streaming: bool = True,
        system_role: Literal["system", "developer"] = "system",
        max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens",
        parallel_tool_calls: bool | None = None,
        think_tags: bool = True,
        json_object_schema: bool = False,
        extra_body: Mapping[str, Any] | None = None,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        super().__init__(model, connection, settings=settings, capabilities=capabilities, streaming=streaming)
        self._system_role = system_role
        self._max_tokens_field = max_tokens_field
        self._parallel_tool_calls = parallel_tool_calls
        self._think_tags = think_tags
        self._json_object_schema = json_object_schema
        self._extra_body = dict(extra_body or {})

    # --- request ---------------------------------------------------------------------------------

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body for `request` (what listeners see)."""
        body: dict[str, Any] = {
            "model": self._model,
            "messages": [
                self._message(m) for m in tool_images_apart(request.messages, self.capabilities.image_input)
            ],
        }
        settings = self._settings.merge(request.settings)
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        if settings.max_tokens is not None:
            body[self._max_tokens_field] = settings.max_tokens
        if settings.top_p is not None:
            body["top_p"] = settings.top_p
        if settings.seed is not None:
            body["seed"] = settings.seed
        if settings.stop:
            body["stop"] = list(settings.stop)
        if settings.presence_penalty is not None:
            body["presence_penalty"] = settings.presence_penalty
        if settings.frequency_penalty is not None:
            body["frequency_penalty"] = settings.frequency_penalty
        if request.tools:
            body["tools"] = [_tool(spec) for spec in request.tools]
            if request.tool_choice is not None:
                body["tool_choice"] = _tool_choice(request.tool_choice)
            if self._parallel_tool_calls is not None:
                body["parallel_tool_calls"] = self._parallel_tool_calls
        if request.response_format is not None:
            body["response_format"] = _response_format(request.response_format, self._json_object_schema)
        if self._streaming:
            body["stream"] = True
            if self._capabilities.usage_in_stream:
                body["stream_options"] = {"include_usage": True}
        else:
            body["stream"] = False
        body.update(self._extra_body)
        return body

    def _message(self, message: ChatMessage) -> dict[str, Any]:
        if isinstance(message, UserMessage):
            return _user_message(message)
        if isinstance(message, AssistantMessage):
            return _assistant_message(message)
        if isinstance(message, ToolResultMessage):
            return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.text}
        assert isinstance(message, SystemMessage)
        return {"role": self._system_role, "content": message.text}

    # --- response --------------------------------------------------------------------------------

    def _mapper(self, request: ModelRequest, request_id: str | None) -> ChatCompletionMapper:
        return ChatCompletionMapper(self._session.context, request_id, think_tags=self._think_tags)


# --- request mapping -------------------------------------------------------------------------------


def _user_message(message: UserMessage) -> dict[str, Any]:
    result: dict[str, Any] = {"role": "user"}
    contents = message.contents
    if len(contents) == 1 and isinstance(contents[0], TextContent):
        result["content"] = contents[0].text
    else:
        result["content"] = [_content_part(c) for c in contents]
    if message.name:
        result["name"] = message.name
    return result


def _content_part(content: Any) -> dict[str, Any]:
    if isinstance(content, TextContent):
        return {"type": "text", "text": content.text}
    if isinstance(content, ImageContent):
        image: dict[str, Any] = {"url": content.data_url()}
        if content.detail:
            image["detail"] = content.detail
        return {"type": "image_url", "image_url": image}
    if isinstance(content, AudioContent):
        if content.data is None:
            raise BadRequestError("Chat Completions takes audio as inline data only, not by URL")
        subtype = (content.media_type or "").rpartition("/")[2].lower()
        audio_format = {"mpeg": "mp3", "x-wav": "wav", "wave": "wav"}.get(subtype, subtype)
        return {"type": "input_audio", "input_audio": {"data": content.data, "format": audio_format}}
    if isinstance(content, PdfContent):
        if content.data is None:
            raise BadRequestError("Chat Completions takes PDF files as inline data only, not by URL")
        file = {"filename": content.filename or "document.pdf", "file_data": content.data_url()}
        return {"type": "file", "file": file}
    if isinstance(content, VideoContent):
        raise BadRequestError("Chat Completions has no video input")
    raise BadRequestError(f"cannot send {type(content).__name__} to a Chat Completions endpoint")


def _assistant_message(message: AssistantMessage) -> dict[str, Any]:
    # `content` is left out rather than sent as null when there is no text (a tool-call turn):
    # OpenAI accepts both, and some compatible servers (llama-cpp-python) reject null.
    result: dict[str, Any] = {"role": "assistant"}
    if message.text is not None or not message.tool_calls:
        result["content"] = message.text
    if message.refusal and message.text is None:
        result["refusal"] = message.refusal
    if message.tool_calls:
        result["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments or "{}"},
            }
            for call in message.tool_calls
        ]
    return result


def _tool(spec: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": spec.name, "description": spec.description}
    parameters = dict(spec.parameters)
    if spec.strict:
        strict = strict_schema(parameters)
        if strict is not None:
            parameters = strict
            function["strict"] = True
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def _tool_choice(choice: str) -> Any:
    if choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _response_format(response_format: ResponseFormat, json_object_schema: bool) -> dict[str, Any]:
    if isinstance(response_format, JsonSchemaFormat):
        # Strict whenever the schema allows it (see `_schema`): the server then guarantees the shape.
        strict = strict_schema(response_format.schema)
        schema: dict[str, Any] = {
            "name": _NAME_UNSAFE.sub("_", response_format.name)[:64] or "response",
            "schema": strict if strict is not None else dict(response_format.schema),
        }
        if strict is not None:
            schema["strict"] = True
        return {"type": "json_schema", "json_schema": schema}
    if json_object_schema and response_format.schema is not None:
        return {"type": "json_object", "schema": dict(response_format.schema)}
    return {"type": "json_object"}


# --- response mapping ------------------------------------------------------------------------------


class ChatCompletionMapper(MapperBase):
    """Maps Chat Completions payloads (stream chunks or one whole response) to model chunks.

    Only choice 0 is read (with `n > 1` the others are ignored; usage then counts all of them).
    Reasoning text comes from `reasoning_content` (vLLM, DeepSeek) or `reasoning` (OpenRouter, Groq,
    Ollama); tool-call fragments are keyed by `index`, or by `id` where a server omits the index.
    Unknown fields are ignored. An `error` object in a payload raises (see `error_from_payload`); a
    payload of the wrong shape raises `MalformedPayload` (or whatever reading it raised), which the
    decoder turns into a `ModelResponseError` carrying the payload. Text fields of another type than a
    string (a `reasoning` object, a `refusal` of null) are ignored, but not a tool call's `id` or `name`.
    """

    __slots__ = ("_called", "_finish", "_ids", "_last_index", "_next_index", "_think")

    def __init__(self, context: ErrorContext, request_id: str | None, *, think_tags: bool = True) -> None:
        super().__init__(context, request_id)
        self._think: ThinkTagSplitter | None = ThinkTagSplitter() if think_tags else None
        self._finish: str | None = None
        self._called = False
        self._ids: dict[str, int] = {}
        self._next_index = 0
        self._last_index: int | None = None

    def feed(self, payload: Any, out: list[ModelChunk], *, mid_stream: bool = True) -> None:
        """Append the chunks of one payload to `out`; raises `ModelError` for an error payload and
        `MalformedPayload` (or what reading it raised) for a payload of the wrong shape."""
        # The per-token path: a handful of dict lookups and one TextDelta; the rest is off to the side.
        if payload.__class__ is not dict:
            raise MalformedPayload(f"the payload is {json_type(payload)}, not an object")
        if payload.get("error"):
            raise self.error(payload, mid_stream=mid_stream)
        if not self._meta:
            self._begin(payload, out)
        choices = payload.get("choices")
        if choices:
            choice = choices[0]
            if choice.get("index", 0) != 0:
                choice = next((c for c in choices if c.get("index", 0) == 0), {})
            delta = choice.get("delta")
            if delta is None:
                delta = choice.get("message")
            if delta:
                content = delta.get("content")
                if content and len(delta) == 1 and content.__class__ is str and self._think is None:
                    out.append(TextDelta(content))
                elif content is None and len(delta) == 1 and "tool_calls" in delta:
                    calls = delta["tool_calls"]  # a tool call's fragment: `_delta` would find only it
                    if calls:
                        self._calls(calls, out)
                else:
                    self._delta(delta, content, out)
            raw = choice.get("finish_reason")
            if raw and raw != self._finish:
                self._finished(raw, out)
        elif not mid_stream:
            raise MalformedPayload("the response has no choices")
        usage = payload.get("usage")
        if usage:
            out.append(_usage(usage))

    def _begin(self, payload: dict[str, Any], out: list[ModelChunk]) -> None:
        self._meta = True
        response_id, model = payload.get("id"), payload.get("model")
        out.append(
            ResponseMeta(
                response_id if response_id.__class__ is str else None,
                model if model.__class__ is str else None,
            )
        )

    def _delta(self, delta: dict[str, Any], content: Any, out: list[ModelChunk]) -> None:
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning and reasoning.__class__ is str:
            out.append(ThinkingDelta(reasoning))
        if content:
            if content.__class__ is str:
                think = self._think
                if think is None:
                    out.append(TextDelta(content))
                else:
                    think.feed(content, out)
                    if think.settled:
                        self._think = None
            else:
                self._parts(content, out)
        refusal = delta.get("refusal")
        if refusal and refusal.__class__ is str:
            out.append(RefusalDelta(refusal))
        calls = delta.get("tool_calls")
        if calls:
            self._calls(calls, out)

    def _finished(self, raw: Any, out: list[ModelChunk]) -> None:
        self._finish = raw
        self.finished = True
        self.flush(out)
        raw = str(raw)
        out.append(Finish(finish_reason(raw, called_tools=self._called), raw))

    def _parts(self, parts: list[Any], out: list[ModelChunk]) -> None:
        """Content given as a list of parts (Mistral and others): text, and thinking parts."""
        if parts.__class__ is not list:
            raise MalformedPayload(f"a message's `content` is {json_type(parts)}, not a string or a list")
        for part in parts:
            if part.__class__ is not dict:
                raise MalformedPayload(f"a part of a message's `content` is {json_type(part)}, not an object")
            kind = part.get("type")
            if kind == "text" and part.get("text"):
                out.append(TextDelta(str(part["text"])))
            elif kind in ("thinking", "reasoning"):
                text = part.get("text") or part.get("thinking")
                if isinstance(text, str) and text:
                    out.append(ThinkingDelta(text))

    def _calls(self, calls: list[Any], out: list[ModelChunk]) -> None:
        self._called = True
        for position, call in enumerate(calls):
            # A fragment after the first usually has neither `id` nor `name`: one test each, then.
            call_id = call.get("id")
            if call_id is not None and (call_id.__class__ is not str or not call_id):
                _require_text(call_id, "id")
                call_id = None  # an empty id is no id
            index = call.get("index")
            if index.__class__ is not int:
                index = self._implicit_index(call_id, position)
            self._last_index = index
            if index >= self._next_index:
                self._next_index = index + 1
            function = call.get("function") or {}
            name = function.get("name")
            if name is not None and (name.__class__ is not str or not name):
                _require_text(name, "name")
                name = None
            arguments = function.get("arguments")
            if arguments is None:
                arguments = ""
            elif arguments.__class__ is not str:
                arguments = orjson.dumps(arguments).decode()
            out.append(ToolCallDelta(index, call_id, name, arguments))

    def _implicit_index(self, call_id: str | None, position: int) -> int:
        if call_id is None:
            return self._last_index if self._last_index is not None else position
        index = self._ids.get(call_id)
        if index is None:
            index = self._ids[call_id] = self._next_index
        return index

    def flush(self, out: list[ModelChunk]) -> None:
        """The answer ended: release text held back by the `<think>` splitter."""
        think = self._think
        if think is not None:
            self._think = None
            think.close(out)


def _require_text(value: Any, field: str) -> None:
    """Raise `MalformedPayload` unless a tool call's `field` is a string."""
    if value.__class__ is not str:
        raise MalformedPayload(f"a tool call's `{field}` is {json_type(value)}, not a string")


def _usage(usage: dict[str, Any]) -> Usage:
    prompt = usage.get("prompt_tokens")
    if prompt is None:
        prompt = usage.get("input_tokens")
    completion = usage.get("completion_tokens")
    if completion is None:
        completion = usage.get("output_tokens")
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    cached = prompt_details.get("cached_tokens") if prompt_details else None
    reasoning = completion_details.get("reasoning_tokens") if completion_details else None
    return Usage(int(prompt or 0), int(completion or 0), int(cached or 0), int(reasoning or 0))
