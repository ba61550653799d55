"""What the HTTP adapters share: the connection options, the session, the name, capabilities, `stream`.

Every HTTP adapter (chat, embedding and moderation models alike) takes the same connection keywords,
declared once as `ConnectionOptions` and passed on whole (`**connection: Unpack[ConnectionOptions]`);
where each provider's server is unless told otherwise is a `Server`. `HttpModel` turns the two into
an `HttpSession` and has the name, `aclose` and `async with`. `HttpChatModel` adds what only a chat
model has: default settings, capabilities, and `stream`, which sends the adapter's `request_body` and
reads the response with its protocol's decoder over its `_mapper`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence  # noqa: TC003 (ConnectionOptions resolves at run time)
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, Self, TypedDict

import httpx
from pydantic import SecretStr

from .._errors import ConfigurationError
from .._messages import ChatMessage, ImageContent, TextContent, ToolResultMessage, UserMessage
from ._decoders import JSONChunkDecoder, PayloadMapper
from ._http import HttpErrorEvent, HttpRequestEvent, HttpResponseEvent, HttpSession
from ._http_stream import stream_chunks
from ._protocol import Capabilities, ModelSettings
from ._retry import RetryPolicy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from types import TracebackType

    from .._events import ModelChunk
    from ._http import Exchange
    from ._http_stream import ChunkDecoder
    from ._protocol import ModelRequest

__all__ = ["ConnectionOptions", "HttpChatModel", "HttpModel", "Server"]


class ConnectionOptions(TypedDict, total=False):
    """How an HTTP model reaches its server: the keyword arguments every HTTP adapter takes, all
    optional (`OpenAIChatModel`, `OllamaChatModel`, `AnthropicChatModel`, `OpenAIEmbeddingModel`,
    `OllamaEmbeddingModel`, `OpenAIModerationModel`).

    - `base_url`, `api_key`: the server and its key. Each adapter says where they default from (its
      provider's environment variables, then its provider's URL and no key). The key is kept as a
      `SecretStr` and only ever put into one request header (`Authorization`, or Anthropic's
      `x-api-key`); errors, listener events and the HTTP loggers' records never show it.
    - `headers`: extra request headers.
    - `timeout`: the httpx timeout (seconds, or an `httpx.Timeout`).
    - `retry`: the `RetryPolicy` (default `RetryPolicy()`).
    - `client`: your own `httpx.AsyncClient` (not closed by the model); otherwise one pooled client is
      created on first use and closed by `aclose()` / `async with model:`.
    - `on_request`, `on_response`, `on_error`: called with `HttpRequestEvent`, `HttpResponseEvent`,
      `HttpErrorEvent` (the request body and the endpoint, never the key); exceptions are logged.
    """

    base_url: str | None
    api_key: SecretStr | str | None
    headers: Mapping[str, str] | None
    timeout: httpx.Timeout | float | None
    retry: RetryPolicy | None
    client: httpx.AsyncClient | None
    on_request: Callable[[HttpRequestEvent], None] | None
    on_response: Callable[[HttpResponseEvent], None] | None
    on_error: Callable[[HttpErrorEvent], None] | None


_OPTIONS: Final = ConnectionOptions.__optional_keys__


@dataclass(frozen=True, slots=True)
class Server:
    """Where a provider's API is unless the caller says otherwise, and how it takes the key."""

    provider: str
    """The provider's name (`Capabilities.provider` of its chat models, unless they name another)."""
    base_url: str
    """The base URL when neither `base_url=` nor `base_url_variable` names one."""
    base_url_variable: str
    api_key_variable: str
    key_header: str | None = None
    """The header the key goes in as it is (Anthropic's `x-api-key`); `None`: a bearer token."""
    bare_host: bool = False
    """A base URL without a scheme is a host and port (`OLLAMA_HOST=localhost:11434`): `http://` is
    added; otherwise it is refused."""

    def url(self, given: str | None) -> str:
        """The base URL given, or else the one in `base_url_variable`, or else the default."""
        base = given or os.environ.get(self.base_url_variable) or self.base_url
        return f"http://{base}" if self.bare_host and "://" not in base else base

    def key(self, given: SecretStr | str | None, kind: str) -> SecretStr | None:
        """The key given, or else the one in `api_key_variable`; `None` for no key (or a blank one)."""
        if given is None:
            from_env = os.environ.get(self.api_key_variable)
            given = SecretStr(from_env) if from_env else None
        elif isinstance(given, str):
            given = SecretStr(given)
        return _header_safe(given, kind)


def _header_safe(key: SecretStr | None, kind: str) -> SecretStr | None:
    """The key without surrounding whitespace (a trailing newline from a secrets file is common).

    A key with characters an HTTP header cannot carry is refused here, before an HTTP library
    quotes it back in an error message. The message never repeats the key.
    """
    if key is None:
        return None
    value = key.get_secret_value().strip()
    if not value:
        return None
    if not value.isascii() or not value.isprintable() or " " in value:
        raise ConfigurationError(
            f"{kind}: the API key contains characters an HTTP header cannot carry "
            "(spaces, control or non-ASCII characters)"
        )
    return SecretStr(value)


class HttpModel:
    """The common part of an HTTP model: one session to `_path` on its `_server`.

    A subclass names both and passes its `**connection` keywords to `__init__`.
    """

    _server: ClassVar[Server]
    _path: ClassVar[str]
    _model: str
    _session: HttpSession

    def __init__(
        self, model: str, connection: ConnectionOptions, *, headers: Mapping[str, str] | None = None
    ) -> None:
        """Open the session; `headers` are the adapter's own, which the caller's `headers` override."""
        kind = type(self).__name__
        unknown = connection.keys() - _OPTIONS
        if unknown:
            # what Python says of a keyword no parameter takes (the options are one `**` parameter)
            raise TypeError(f"{kind}.__init__() got an unexpected keyword argument {min(unknown)!r}")
        if not model:
            raise ConfigurationError(f"{kind} needs a model name")
        server = self._server
        api_key = server.key(connection.get("api_key"), kind)
        base_url = server.url(connection.get("base_url"))
        headers = {**(headers or {}), **(connection.get("headers") or {})}
        self._model = model
        try:
            self._session = HttpSession(
                base_url,
                self._path,
                secret=api_key,
                headers=headers,
                timeout=connection.get("timeout"),
                retry=connection.get("retry") or RetryPolicy(),
                client=connection.get("client"),
                on_request=connection.get("on_request"),
                on_response=connection.get("on_response"),
                on_error=connection.get("on_error"),
                key_header=server.key_header,
            )
        except (httpx.InvalidURL, ValueError, TypeError) as exc:
            raise ConfigurationError(f"{kind}: invalid base_url {base_url!r}: {exc}") from None

    @property
    def name(self) -> str:
        return self._model

    @property
    def endpoint(self) -> str:
        """The endpoint URL (without credentials or query)."""
        return self._session.endpoint

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self._model!r}, endpoint={self._session.endpoint!r})"

    async def aclose(self) -> None:
        """Close the pooled HTTP client (not a client you passed in). Idempotent."""
        await self._session.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        await self.aclose()


class _StreamDecoder(Protocol):
    """A decoder class for a streamed body (`SSEChunkDecoder`, ...)."""

    def __call__(self, mapper: PayloadMapper, /) -> ChunkDecoder: ...


class HttpChatModel(HttpModel):
    """The common part of an HTTP chat model: settings, capabilities and `stream`.

    A subclass adds `request_body` (the JSON body of a request), `_mapper` (what reads the response's
    payloads), and the decoder of its streamed body, `_stream_decoder`, with its content type.
    """

    _stream_type: ClassVar[str]
    """What the content type of a streamed body contains (`"text/event-stream"`, `"ndjson"`)."""
    _stream_decoder: ClassVar[_StreamDecoder]
    _default_capabilities: ClassVar[Capabilities]
    """The capabilities of a model built without its own."""
    _settings: ModelSettings
    _capabilities: Capabilities
    _streaming: bool

    def __init__(
        self,
        model: str,
        connection: ConnectionOptions,
        *,
        settings: ModelSettings | None,
        capabilities: Capabilities | None,
        streaming: bool,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Open the session. The capabilities (`_default_capabilities` when `None`) declare
        `handles_deadline` whatever the caller's say (opening, retries and reads stop at
        `ModelRequest.deadline`: see `stream_chunks`), and the server's `provider` where they name
        none."""
        super().__init__(model, connection, headers=headers)
        self._settings = settings or ModelSettings()
        capabilities = capabilities or self._default_capabilities
        if not capabilities.handles_deadline or capabilities.provider is None:
            capabilities = dataclasses.replace(
                capabilities, handles_deadline=True, provider=capabilities.provider or self._server.provider
            )
        self._capabilities = capabilities
        self._streaming = streaming

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelChunk]:
        """The response's chunks as they arrive. Closing the iterator closes the HTTP response."""
        return stream_chunks(
            self._session,
            partial(self.request_body, request),
            partial(self._decoder, request),
            request.deadline,
        )

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body for `request` (what listeners see)."""
        raise NotImplementedError

    def _mapper(self, request: ModelRequest, request_id: str | None) -> PayloadMapper:
        """What reads the payloads of the response to `request`."""
        raise NotImplementedError

    def _decoder(self, request: ModelRequest, exchange: Exchange) -> ChunkDecoder:
        """The decoder the response's content type calls for; a body of neither kind is read as
        what was asked for."""
        content_type = exchange.response.headers.get("content-type", "")
        mapper = self._mapper(request, exchange.request_id)
        if self._stream_type in content_type:
            return self._stream_decoder(mapper)
        if "json" in content_type or not self._streaming:
            return JSONChunkDecoder(mapper)
        return self._stream_decoder(mapper)


def tool_images_apart(
    messages: Sequence[ChatMessage],
    image_input: bool,
    takes: Callable[[ImageContent], bool] | None = None,
) -> Sequence[ChatMessage]:
    """`messages` for an API whose tool results carry text only (Chat Completions, Ollama): each run
    of tool results that returned images is followed by one user message with those images, when
    the model takes image input; otherwise the images are named in their results' text. `takes`
    says which images the API can carry at all (Ollama: inline ones, not by URL); the others are
    named too (a stored result must not make every later request of its conversation fail).
    `messages` themselves when no tool result holds an image (the common case: one pass, nothing
    built)."""
    if not any(type(m) is ToolResultMessage and m.images for m in messages):
        return messages
    out: list[ChatMessage] = []
    pending: list[TextContent | ImageContent] = []
    for message in messages:
        if type(message) is ToolResultMessage:
            if message.images:
                shown: list[ImageContent] = []
                unshown: list[ImageContent] = []
                for image in message.images:
                    (shown if image_input and (takes is None or takes(image)) else unshown).append(image)
                if shown:
                    count = len(shown)
                    pending.append(
                        TextContent(
                            text=f"The tool call {message.tool_call_id} ({message.tool_name}) returned "
                            f"{count} image{'s' if count > 1 else ''}:"
                        )
                    )
                    pending.extend(shown)
                text = message.text
                if unshown:
                    named = " ".join(
                        f"[image {image.media_type or 'by URL'}, not shown]" for image in unshown
                    )
                    text = f"{text}\n{named}" if text else named
                message = message.model_copy(update={"images": (), "text": text})
            out.append(message)
            continue
        if pending:
            out.append(UserMessage(contents=tuple(pending)))
            pending = []
        out.append(message)
    if pending:
        out.append(UserMessage(contents=tuple(pending)))
    return out
