"""An ASGI HTTP scope for tests that drive an app by hand (their own `receive` and `send`)."""

from __future__ import annotations

from typing import Any


def post_scope(path: str, headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    """A JSON POST to `path` from 127.0.0.1 (the content type, then `headers`)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), *(headers or [])],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
