"""Ollama's native chat API (`POST {base_url}/api/chat`) over httpx.

Ollama streams newline-delimited JSON: one object per line, no `data:` prefix, no `[DONE]`; the last
line has `done: true`, the `done_reason` and the token counts (`prompt_eval_count`, `eval_count`).
Tool calls arrive whole, with `arguments` as a JSON object (re-encoded here to JSON text, as the
chunk protocol carries arguments as text), thinking text in `message.thinking`, images as a list of
base64 strings, structured output as a JSON schema in `format`. A non-streaming response is the same
object as the last line of a stream, and is mapped by the same `OllamaChatMapper`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal, Unpack

import orjson

from .._errors import BadRequestError
from .._events import Finish, ResponseMeta, TextDelta, ThinkingDelta, ToolCallDelta, Usage
from .._messages import (
    AssistantMessage,
    ImageContent,
    SystemMessage,
    TextContent,
    ToolResultMessage,
    UserMessage,
)
from ._base import ConnectionOptions, HttpChatModel, Server, tool_images_apart
from ._decoders import MalformedPayload, MapperBase, NDJSONChunkDecoder, finish_reason, json_type
from ._protocol import (
    Capabilities,
    JsonSchemaFormat,
    ModelSettings,
    _tokens_for_chars,
    request_text_chars,
)
from ._think import ThinkTagSplitter

if TYPE_CHECKING:
    from .._events import ModelChunk
    from .._messages import ChatMessage
    from ._failures import ErrorContext
    from ._protocol import ModelRequest

__all__ = ["OllamaChatMapper", "OllamaChatModel"]

DEFAULT_BASE_URL: Final = "http://localhost:11434"

SERVER: Final = Server("ollama", DEFAULT_BASE_URL, "OLLAMA_HOST", "OLLAMA_API_KEY", bare_host=True)
"""Ollama on this machine, or where `OLLAMA_HOST` says (a URL, or a host and port); the key, for
ollama.com and authenticating proxies, in `OLLAMA_API_KEY`."""

DEFAULT_CAPABILITIES: Final = Capabilities(
    tool_choice_required=False,
    tool_choice_named=False,
    json_schema=True,
    json_object=True,
    image_input=True,
    thinking=True,
    handles_deadline=True,
    provider="ollama",
)
"""What Ollama's API accepts (whether the loaded model can use it is the model's business)."""


class OllamaChatModel(HttpChatModel):
    """A model served by Ollama, through its native `/api/chat` endpoint.

    - `model`: the model name (e.g. `"qwen3:8b"`).
    - `base_url`: defaults to `OLLAMA_HOST` (with `http://` added when it has no scheme), then to
      `http://localhost:11434`. `api_key` (or `OLLAMA_API_KEY`) is sent as a bearer token, for
      ollama.com and authenticating proxies; it is kept as a `SecretStr`.
    - `settings`: default request parameters (`max_tokens` becomes `options.num_predict`).
    - `think`: Ollama's `think` switch (`True`/`False`, or a level such as `"high"`); `None` leaves
      the model's default. `think_tags` reads a leading `<think>…</think>` in content as thinking.
    - `keep_alive`: how long Ollama keeps the model loaded after the request (e.g. `"10m"`, `0`).
    - `streaming`, `capabilities`: as for `OpenAIChatModel`.
    - `headers`, `timeout`, `retry`, `client`, `on_request`, `on_response`, `on_error`: how to reach
      the server, as for every HTTP adapter (see `ConnectionOptions`).

    Ollama cannot force a tool call: a request with `tool_choice` `"required"` or a tool name raises
    `BadRequestError` (`Capabilities.tool_choice_required` is false); `"none"` sends no tools.
    """

    _server = SERVER
    _default_capabilities = DEFAULT_CAPABILITIES
    _path = "/api/chat"
    _stream_type = "ndjson"
    _stream_decoder = NDJSONChunkDecoder

    def __init__(
        self,
        model: str,
        *,
        settings: ModelSettings | None = None,
        capabilities: Capabilities | None = None,
        streaming: bool = True,
        think: bool | Literal["low", "medium", "high"] | None = None,
        think_tags: bool = True,
        keep_alive: str | float | None = None,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        super().__init__(model, connection, settings=settings, capabilities=capabilities, streaming=streaming)
        self._think = think
        self._think_tags = think_tags
        self._keep_alive = keep_alive

    # --- request ---------------------------------------------------------------------------------

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body for `request` (what listeners see)."""
        body: dict[str, Any] = {
            "model": self._model,
            "messages": [
                _message(m)
                for m in tool_images_apart(request.messages, self.capabilities.image_input, _inline)
            ],
            "stream": self._streaming,
        }
        options = _options(self._settings.merge(request.settings))
        if options:
            body["options"] = options
        choice = request.tool_choice
        if request.tools and choice != "none":
            if choice not in (None, "auto"):
                raise BadRequestError(
                    f"Ollama cannot force a tool call (tool_choice={choice!r}); "
                    "Capabilities.tool_choice_required is false for this model"
                )
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": spec.name,
                        "description": spec.description,
                        "parameters": dict(spec.parameters),
                    },
                }
                for spec in request.tools
            ]
        response_format = request.response_format
        if isinstance(response_format, JsonSchemaFormat):
            body["format"] = dict(response_format.schema)
        elif response_format is not None:
            body["format"] = dict(response_format.schema) if response_format.schema else "json"
        if self._think is not None:
            body["think"] = self._think
        if self._keep_alive is not None:
            body["keep_alive"] = self._keep_alive
        return body

    # --- response --------------------------------------------------------------------------------

    def _mapper(self, request: ModelRequest, request_id: str | None) -> OllamaChatMapper:
        return OllamaChatMapper(self._session.context, request_id, request, think_tags=self._think_tags)


# --- request mapping -------------------------------------------------------------------------------


def _options(settings: ModelSettings) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if settings.temperature is not None:
        options["temperature"] = settings.temperature
    if settings.max_tokens is not None:
        options["num_predict"] = settings.max_tokens
    if settings.top_p is not None:
        options["top_p"] = settings.top_p
    if settings.seed is not None:
        options["seed"] = settings.seed
    if settings.stop:
        options["stop"] = list(settings.stop)
    if settings.presence_penalty is not None:
        options["presence_penalty"] = settings.presence_penalty
    if settings.frequency_penalty is not None:
        options["frequency_penalty"] = settings.frequency_penalty
    return options


def _message(message: ChatMessage) -> dict[str, Any]:
    if isinstance(message, UserMessage):
        return _user_message(message)
    if isinstance(message, AssistantMessage):
        result: dict[str, Any] = {"role": "assistant", "content": message.text or ""}
        if message.thinking:
            result["thinking"] = message.thinking
        if message.tool_calls:
            result["tool_calls"] = [
                {"id": call.id, "function": {"name": call.name, "arguments": _arguments(call.arguments)}}
                for call in message.tool_calls
            ]
        return result
    if isinstance(message, ToolResultMessage):
        return {
            "role": "tool",
            "content": message.text,
            "tool_name": message.tool_name,
            "tool_call_id": message.tool_call_id,
        }
    assert isinstance(message, SystemMessage)
    return {"role": "system", "content": message.text}


def _user_message(message: UserMessage) -> dict[str, Any]:
    texts: list[str] = []
    images: list[str] = []
    for content in message.contents:
        if isinstance(content, TextContent):
            texts.append(content.text)
        elif isinstance(content, ImageContent):
            images.append(_image_data(content))
        else:
            raise BadRequestError(f"Ollama's chat API takes text and images, not {type(content).__name__}")
    result: dict[str, Any] = {"role": "user", "content": "\n".join(texts)}
    if images:
        result["images"] = images
    return result


def _inline(image: ImageContent) -> bool:
    """Whether Ollama can take `image`: inline data, or a base64 `data:` URL (not one by URL)."""
    return _base64(image) is not None


def _base64(image: ImageContent) -> str | None:
    if image.data is not None:
        return image.data
    url = image.url or ""
    if url.startswith("data:") and ";base64," in url:
        return url.partition(";base64,")[2]
    return None


def _image_data(image: ImageContent) -> str:
    data = _base64(image)
    if data is None:
        raise BadRequestError("Ollama takes images as inline data (base64), not by URL")
    return data


def _arguments(arguments: str) -> Any:
    try:
        return orjson.loads(arguments) if arguments.strip() else {}
    except orjson.JSONDecodeError:
        raise BadRequestError(f"tool call arguments are not valid JSON: {arguments[:200]!r}") from None


# --- response mapping ------------------------------------------------------------------------------


class OllamaChatMapper(MapperBase):
    """Maps `/api/chat` objects (stream lines or one whole response) to model chunks.

    Each tool call arrives whole and gets the next index. `done_reason: "stop"` after tool calls
    becomes `TOOL_CALLS`. When Ollama omits `prompt_eval_count` (a fully cached prompt), the input
    tokens are estimated and the usage marked `estimated`; without `eval_count` no usage is reported.
    An object of the wrong shape raises `MalformedPayload` (or whatever reading it raised), which the
    decoder turns into a `ModelResponseError` carrying the object.
    """

    __slots__ = ("_calls", "_request", "_think")

    def __init__(
        self,
        context: ErrorContext,
        request_id: str | None,
        request: ModelRequest,
        *,
        think_tags: bool = True,
    ) -> None:
        super().__init__(context, request_id)
        self._request = request
        self._think: ThinkTagSplitter | None = ThinkTagSplitter() if think_tags else None
        self._calls = 0

    def feed(self, payload: Any, out: list[ModelChunk], *, mid_stream: bool = True) -> None:
        """Append the chunks of one object to `out`; raises `ModelError` for an error object and
        `MalformedPayload` (or what reading it raised) for an object of the wrong shape."""
        if payload.__class__ is not dict:
            raise MalformedPayload(f"the payload is {json_type(payload)}, not an object")
        if payload.get("error"):
            raise self.error(payload, mid_stream=mid_stream)
        if not mid_stream and not payload.get("done"):
            raise MalformedPayload("the response is not complete (no `done: true`)")
        if not self._meta:
            self._meta = True
            model = payload.get("model")
            out.append(ResponseMeta(None, model if model.__class__ is str else None))
        message = payload.get("message")
        if message:
            thinking = message.get("thinking")
            if thinking and thinking.__class__ is str:
                out.append(ThinkingDelta(thinking))
            content = message.get("content")
            if content and content.__class__ is str:
                think = self._think
                if think is None:
                    out.append(TextDelta(content))
                else:
                    think.feed(content, out)
                    if think.settled:
                        self._think = None
            calls = message.get("tool_calls")
            if calls:
                for call in calls:
                    function = call.get("function") or {}
                    arguments = function.get("arguments")
                    if arguments is None:
                        arguments = "{}"
                    elif arguments.__class__ is not str:
                        arguments = orjson.dumps(arguments).decode()
                    call_id = call.get("id")
                    if call_id is not None and call_id.__class__ is not str:
                        raise MalformedPayload(f"a tool call's `id` is {json_type(call_id)}, not a string")
                    name = function.get("name")
                    if name is not None and name.__class__ is not str:
                        raise MalformedPayload(f"a tool call's `name` is {json_type(name)}, not a string")
                    out.append(ToolCallDelta(self._calls, call_id or None, name or None, arguments))
                    self._calls += 1
        if payload.get("done"):
            self.finished = True
            self.flush(out)
            usage = self._usage(payload)
            if usage is not None:
                out.append(usage)
            raw = str(payload.get("done_reason") or "stop")
            out.append(Finish(finish_reason(raw, called_tools=self._calls > 0), raw))

    def _usage(self, payload: dict[str, Any]) -> Usage | None:
        output = payload.get("eval_count")
        if output is None:
            return None
        prompt = payload.get("prompt_eval_count")
        if prompt is None:
            estimate = _tokens_for_chars(request_text_chars(self._request.messages))
            return Usage(estimate, int(output), estimated=True)
        return Usage(int(prompt), int(output))

    def flush(self, out: list[ModelChunk]) -> None:
        """The answer ended: release text held back by the `<think>` splitter."""
        think = self._think
        if think is not None:
            self._think = None
            think.close(out)
