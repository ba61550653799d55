"""An incremental newline-delimited JSON splitter over bytes.

Lines end with `\\n` (a `\\r` before it is JSON whitespace and left to the JSON parser); blank lines are
skipped. Lines are handed over as bytes once complete, so chunk boundaries anywhere (inside a line,
inside a UTF-8 character) change nothing. At the end of the stream an unterminated last line counts as
a line. `feed` and `close` never raise.
"""

from __future__ import annotations

__all__ = ["NDJSONDecoder"]


class NDJSONDecoder:
    """Feed bytes as they arrive; get back the complete non-blank lines, in order."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The non-empty lines completed by `chunk`."""
        buf = self._buf + chunk if self._buf else chunk
        if b"\n" not in buf:
            self._buf = buf
            return []
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        return list(filter(None, lines))

    def close(self) -> list[bytes]:
        """End of stream: the unterminated last line, if it is not empty. Resets the decoder."""
        buf, self._buf = self._buf, b""
        return [buf] if buf else []
