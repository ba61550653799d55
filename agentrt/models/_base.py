"""What the HTTP adapters share: one `HttpSession`, the model name, capabilities, closing.

`HttpModel` is the part every HTTP adapter has (chat, embedding and moderation models alike): the key
and its environment variable, the session, the name, `aclose` and `async with`. `HttpChatModel` adds
what only a chat model has: default settings, capabilities, streaming.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Self, TypedDict, Unpack

import httpx
from pydantic import SecretStr

from .._errors import ConfigurationError
from ._http import HttpSession
from ._protocol import Capabilities, ModelSettings
from ._retry import RetryPolicy

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import TracebackType

    from ._http import HttpErrorEvent, HttpRequestEvent, HttpResponseEvent

__all__ = ["HttpChatModel", "HttpModel", "SessionOptions"]


class SessionOptions(TypedDict):
    """The options of an adapter's HTTP session, as its `__init__` takes them (see `OpenAIChatModel`)."""

    headers: Mapping[str, str] | None
    timeout: httpx.Timeout | float | None
    retry: RetryPolicy | None
    client: httpx.AsyncClient | None
    on_request: Callable[[HttpRequestEvent], None] | None
    on_response: Callable[[HttpResponseEvent], None] | None
    on_error: Callable[[HttpErrorEvent], None] | None


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
    """The common part of an HTTP model. Subclasses call `_connect_session` from their `__init__`."""

    _model: str
    _session: HttpSession

    def _connect_session(
        self,
        model: str,
        *,
        base_url: str,
        path: str,
        api_key: SecretStr | str | None,
        api_key_variable: str,
        key_header: str | None = None,
        **options: Unpack[SessionOptions],
    ) -> None:
        kind = type(self).__name__
        if not model:
            raise ConfigurationError(f"{kind} needs a model name")
        if api_key is None:
            from_env = os.environ.get(api_key_variable)
            api_key = SecretStr(from_env) if from_env else None
        elif isinstance(api_key, str):
            api_key = SecretStr(api_key)
        api_key = _header_safe(api_key, kind)
        self._model = model
        try:
            self._session = HttpSession(
                base_url,
                path,
                secret=api_key or None,
                headers=options["headers"],
                timeout=options["timeout"],
                retry=options["retry"] or RetryPolicy(),
                client=options["client"],
                on_request=options["on_request"],
                on_response=options["on_response"],
                on_error=options["on_error"],
                key_header=key_header,
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


class HttpChatModel(HttpModel):
    """The common part of an HTTP chat model. Subclasses call `_connect` from their `__init__`."""

    _settings: ModelSettings
    _capabilities: Capabilities
    _streaming: bool

    def _connect(
        self,
        model: str,
        *,
        base_url: str,
        path: str,
        api_key: SecretStr | str | None,
        api_key_variable: str,
        settings: ModelSettings | None,
        capabilities: Capabilities,
        provider: str,
        streaming: bool,
        key_header: str | None = None,
        **options: Unpack[SessionOptions],
    ) -> None:
        """Open the session. The capabilities declare `handles_deadline` whatever the caller's say
        (opening, retries and reads stop at `ModelRequest.deadline`: see `stream_chunks`), and
        `provider` where they name none."""
        self._connect_session(
            model,
            base_url=base_url,
            path=path,
            api_key=api_key,
            api_key_variable=api_key_variable,
            key_header=key_header,
            **options,
        )
        self._settings = settings or ModelSettings()
        if not capabilities.handles_deadline or capabilities.provider is None:
            capabilities = dataclasses.replace(
                capabilities, handles_deadline=True, provider=capabilities.provider or provider
            )
        self._capabilities = capabilities
        self._streaming = streaming

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities
