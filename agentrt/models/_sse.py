"""An incremental Server-Sent Events decoder over bytes.

The decoder follows the SSE parsing rules (WHATWG HTML, "event stream interpretation"): lines end with
`\\r\\n`, `\\n` or a lone `\\r`; lines starting with `:` are comments; `data:` lines of one event are
joined with `\\n`; a blank line dispatches the event; an event without data is not dispatched; a leading
byte-order mark is dropped. It works on bytes and never decodes text itself: a data payload is handed
over whole (as bytes) once its event is complete, so a chunk boundary inside a line, inside a UTF-8
character or between `\\r` and `\\n` changes nothing.

One deliberate difference from the spec: at the end of the stream, a pending event (one whose closing
blank line never came) is dispatched instead of dropped, and an unterminated last line counts as a line.
A client of a model endpoint would rather see a truncated JSON payload fail to parse (a typed error)
than lose the last event silently.

`feed` and `close` never raise: any byte sequence decodes to some list of events.
"""

from __future__ import annotations

from typing import Final

__all__ = ["SSEDecoder", "SSEEvent"]

SSEEvent = tuple[str, bytes]
"""`(event type, data)`; the type is `""` when the event named none (the spec's "message")."""

_BOM: Final = b"\xef\xbb\xbf"


class SSEDecoder:
    """Feed bytes as they arrive; get back the events they complete, in order."""

    __slots__ = ("_buf", "_data", "_event", "_more", "_skip_lf", "_started", "idle")

    def __init__(self) -> None:
        self._buf = b""
        """The start of an unterminated line (never holds a line end)."""
        self._more: list[bytes] = []
        """The reads that continued that line without ending it: joined once, when it ends."""
        self._data: list[bytes] = []
        self._event = ""
        self._skip_lf = False
        self._started = False
        self.idle = False
        """Between events: nothing buffered or pending (a caller may then take a whole event itself)."""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events completed by `chunk` (often none or one)."""
        events: list[SSEEvent] = []
        if not chunk:
            return events
        if self._skip_lf:
            # The previous chunk ended in "\r": a "\n" starting this one belongs to the same line end.
            self._skip_lf = False
            if chunk[0] == 10:
                chunk = chunk[1:]
                if not chunk:
                    return events
        if self._buf and self._started and 10 not in chunk and 13 not in chunk:
            self._hold(chunk)
            return events
        if self._more:
            chunk = self._end_held_line(chunk, events)
            if not chunk:
                self.idle = not (self._data or self._event or self._skip_lf)
                return events
        buf = self._buf + chunk if self._buf else chunk
        if not self._started:
            if len(buf) < 3 and _BOM.startswith(buf):
                self._buf = buf
                return events
            self._started = True
            if buf.startswith(_BOM):
                buf = buf[3:]
        if 13 in buf:
            self._buf = self._lines(buf, events)
        else:
            self._buf = self._newlines(buf, events)
        self.idle = not (self._buf or self._data or self._event or self._skip_lf)
        return events

    def feed_plain(self, chunk: bytes) -> list[bytes] | None:
        """The data of the events `chunk` completes, when all of them are plain; else `None`.

        Plain: each event is one `data: ...` line and nothing else, with `\n` line ends, and the
        decoder holds no more than an unterminated rest. That is nearly every read of a model
        stream, and splitting on blank lines decodes it with the same result as `feed`, in a
        fraction of the work. On `None` the decoder is unchanged and `feed` takes the chunk.

        Same result means the same events at the same read: the bytes after the last blank line
        are kept only when they complete no event and `feed` would keep them too (the start of
        the next `data: ` line). A read whose last event is followed by anything else, such as a
        comment or an extra blank line, goes to `feed`.
        """
        if self._data or self._event or self._skip_lf or 13 in chunk:
            return None
        if not self._started:
            # The stream's first read: plain too when it starts with a data line (so no BOM).
            if self._buf or not chunk.startswith(b"data: "):
                return None
            self._started = True
        if self._buf and 10 not in chunk:
            self._hold(chunk)
            return []
        if self._more:
            return None  # a long line ends: `feed` copies it once
        buf = self._buf + chunk if self._buf else chunk
        if not buf.startswith(b"data: "):
            return None
        # Split between events, at "\n\ndata: ": every piece is then one event's data, except
        # that the last piece is either a complete event ending in "\n\n" (perhaps followed by the
        # first bytes of the next "data: ", cut by the read) or an unfinished one.
        payloads = buf[6:].split(b"\n\ndata: ")
        last = payloads[-1]
        if last.endswith(b"\n\n"):
            payloads[-1] = last[:-2]  # not plain if a "\n" remains in it: see below
            rest = b""
        elif 10 not in last:
            # An unfinished line, kept as `feed` keeps it. It follows the last line end of the read
            # (there is one), so it is no longer than the read: what is kept never grows past a read.
            payloads.pop()
            rest = b"data: " + last
        else:
            end = last.find(b"\n\n")
            if end < 0:
                # An event cut after a complete line: `feed` takes the read and keeps the line's data,
                # so that no byte is scanned twice (an event of many lines would be, at every read).
                return None
            else:
                rest = last[end + 2 :]
                if not b"data: ".startswith(rest):
                    # After the blank line something else than the next "data: ": a comment, an
                    # extra blank line, another field. Unusual; `feed` takes the read.
                    return None
                payloads[-1] = last[:end]
        for payload in payloads:
            if 10 in payload:
                return None
        self._buf = rest
        self.idle = not rest
        return payloads

    def close(self) -> list[SSEEvent]:
        """End of stream: the events still pending (see the module docstring). Resets the decoder."""
        events: list[SSEEvent] = []
        if self._buf and self._started:
            for line in b"".join((self._buf, *self._more)).splitlines():
                self._line(line, events)
        if self._data:
            data = self._data
            events.append((self._event, data[0] if len(data) == 1 else b"\n".join(data)))
        self._buf = b""
        self._more = []
        self._data = []
        self._event = ""
        self._skip_lf = self._started = self.idle = False
        return events

    def _hold(self, chunk: bytes) -> None:
        """Keep a read that ends no line, without copying or rescanning what is held already: one
        long event arriving in small reads then costs its length, not its length times its reads."""
        self._more.append(chunk)
        self.idle = False

    def _end_held_line(self, chunk: bytes, events: list[SSEEvent]) -> bytes:
        """The line held in pieces ends in `chunk` (which has a line end): decode it, a data line's
        value copied once from its pieces, and return what follows its line end in `chunk`."""
        lf, cr = chunk.find(b"\n"), chunk.find(b"\r")
        end = lf if cr < 0 or 0 <= lf < cr else cr
        head, more = self._buf, self._more
        self._buf, self._more = b"", []
        if len(head) > 5 and head.startswith(b"data:"):
            self._data.append(b"".join((head[6 if head[5] == 32 else 5 :], *more, chunk[:end])))
        else:
            self._line(b"".join((head, *more, chunk[:end])), events)
        if chunk[end] == 13:
            if end + 1 == len(chunk):
                self._skip_lf = True
            elif chunk[end + 1] == 10:
                end += 1
        return chunk[end + 1 :]

    def _newlines(self, buf: bytes, events: list[SSEEvent]) -> bytes:
        """Line by line, "\\n" line ends only (what nearly every server sends). Returns the rest."""
        data = self._data
        find = buf.find
        startswith = buf.startswith
        start = 0
        while True:
            end = find(b"\n", start)
            if end < 0:
                break
            if end == start:
                if data:
                    events.append((self._event, data[0] if len(data) == 1 else b"\n".join(data)))
                    data.clear()
                self._event = ""
            elif startswith(b"data:", start):
                value = start + 5
                if buf[value] == 32:  # one optional space after the colon
                    value += 1
                data.append(buf[value:end])
            else:
                self._field(buf[start:end], events)
            start = end + 1
        return buf[start:] if start else buf

    def _lines(self, buf: bytes, events: list[SSEEvent]) -> bytes:
        """Line by line, any mix of line ends. Returns the unterminated rest."""
        lines = buf.splitlines(keepends=True)
        rest = b""
        last = lines[-1]
        if last[-1] not in (10, 13):
            rest = lines.pop()
        elif last[-1] == 13:
            self._skip_lf = True
        for line in lines:
            if line[-1] == 10:
                line = line[:-2] if line[-2:-1] == b"\r" else line[:-1]
            else:
                line = line[:-1]
            self._line(line, events)
        return rest

    def _line(self, line: bytes, events: list[SSEEvent]) -> None:
        if not line:
            if self._data:
                data = self._data
                events.append((self._event, data[0] if len(data) == 1 else b"\n".join(data)))
                data.clear()
            self._event = ""
        else:
            self._field(line, events)

    def _field(self, line: bytes, events: list[SSEEvent]) -> None:
        if line[0] == 58:  # ":" starts a comment
            return
        colon = line.find(b":")
        if colon < 0:
            name, value = line, b""
        else:
            name, value = line[:colon], line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        # "id" and "retry" matter to reconnecting browsers, not to one model response; others are ignored.
