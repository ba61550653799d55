"""The incremental SSE decoder: the SSE parsing rules, chunk boundaries anywhere, any bytes."""

from __future__ import annotations

import re
import tracemalloc
from typing import Any

import depth
import orjson
import pytest
from cassettes import Cassette, load_all, one_byte_parts
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import agentrt
from agentrt import ModelError, ModelResponseError
from agentrt.models._decoders import SSEChunkDecoder
from agentrt.models._sse import SSEDecoder


def decode(*parts: bytes) -> list[tuple[str, bytes]]:
    decoder = SSEDecoder()
    events = []
    for part in parts:
        events += decoder.feed(part)
    return events + decoder.close()


def test_data_lines_and_blank_line_make_an_event() -> None:
    assert decode(b"data: {}\n\n") == [("", b"{}")]
    assert decode(b'data: {"a":1}\n\ndata: [DONE]\n\n') == [("", b'{"a":1}'), ("", b"[DONE]")]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_every_line_end_is_a_line_end(end: bytes) -> None:
    body = b"event: x" + end + b"data: 1" + end + b"data: 2" + end + end + b"data: 3" + end + end
    assert decode(body) == [("x", b"1\n2"), ("", b"3")]


def test_mixed_line_ends_and_cr_lf_split_across_parts() -> None:
    assert decode(b"data: a\r", b"\ndata: b\r\n", b"\r", b"\n") == [("", b"a\nb")]
    assert decode(b"data: a\r", b"\r", b"data: b\n\n") == [("", b"a"), ("", b"b")]
    assert decode(b"data: a\r", b"", b"\n\r\n") == [("", b"a")]


def test_comments_and_unknown_fields_are_ignored() -> None:
    body = b": OPENROUTER PROCESSING\n\nid: 7\nretry: 10\nfoo: bar\ndata: x\n\n"
    assert decode(body) == [("", b"x")]


def test_field_syntax() -> None:
    assert decode(b"data\n\n") == [("", b"")]  # no colon: the whole line is the field name
    assert decode(b"data:\n\n") == [("", b"")]
    assert decode(b"data:x\n\n") == [("", b"x")]
    assert decode(b"data:  x\n\n") == [("", b" x")]  # one space is dropped, not two
    assert decode(b"data: a:b\n\n") == [("", b"a:b")]


def test_an_event_without_data_is_not_dispatched_and_names_reset() -> None:
    assert decode(b"event: ping\n\nevent: error\ndata: {}\n\ndata: 1\n\n") == [("error", b"{}"), ("", b"1")]


def test_byte_order_mark_is_dropped_even_when_split() -> None:
    assert decode(b"\xef\xbb\xbfdata: 1\n\n") == [("", b"1")]
    assert decode(b"\xef", b"\xbb", b"\xbfdata: 1\n\n") == [("", b"1")]
    assert decode(b"\xef\xbb") == []


def test_end_of_stream_dispatches_what_is_pending() -> None:
    assert decode(b"data: 1\n") == [("", b"1")]
    assert decode(b"data: 1") == [("", b"1")]
    assert decode(b"data: 1\n\ndata: 2") == [("", b"1"), ("", b"2")]
    assert decode(b"") == []


def test_utf8_is_passed_through_as_bytes_even_split_mid_character() -> None:
    body = "data: “quoted” ✅\n\n".encode()
    assert decode(*one_byte_parts(body)) == [("", "“quoted” ✅".encode())]


def test_close_resets_the_decoder() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: 1")
    assert decoder.close() == [("", b"1")]
    assert decoder.feed(b"data: 2\n\n") == [("", b"2")]


# --- against a plain reference reading -----------------------------------------------------------

_LINE_END = re.compile(r"\r\n|\r|\n")


def reference(text: str) -> list[tuple[str, bytes]]:
    """Line by line, per the spec; at the end the last line counts and pending data is dispatched."""
    text = text.removeprefix("\ufeff")
    events: list[tuple[str, bytes]] = []
    event, data = "", []
    for line in _LINE_END.split(text):
        if not line:
            if data:
                events.append((event, "\n".join(data).encode()))
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    if data:
        events.append((event, "\n".join(data).encode()))
    return events


SSE_CASSETTES = [c for c in load_all() if "data:" in c.data["response"]["body"]]


@pytest.mark.parametrize("cassette", SSE_CASSETTES, ids=repr)
def test_recorded_streams_decode_like_the_reference(cassette: Cassette) -> None:
    # Includes the Anthropic streams (named events, padded JSON) and Groq's `event: error`.
    assert decode(cassette.body) == reference(cassette.body.decode())
    assert decode(*one_byte_parts(cassette.body)) == reference(cassette.body.decode())


_VALUE = st.text(st.characters(exclude_characters="\r\n", exclude_categories=("Cs",)), max_size=12)
_LINE = st.one_of(
    _VALUE.map(lambda v: f"data:{v}"),
    _VALUE.map(lambda v: f"data: {v}"),
    _VALUE.map(lambda v: f"event: {v}"),
    _VALUE.map(lambda v: f":{v}"),
    _VALUE.map(lambda v: f"id: {v}"),
    st.sampled_from(["", "", "data", "event", "retry: 5", "data: [DONE]"]),
    _VALUE,
)
_STREAM = st.tuples(
    st.booleans(),
    st.lists(st.tuples(_LINE, st.sampled_from(["\n", "\r\n", "\r"])), max_size=30),
    _LINE,
).map(lambda t: ("\ufeff" if t[0] else "") + "".join(a + b for a, b in t[1]) + t[2])


@settings(max_examples=300, deadline=None)
@given(text=_STREAM, data=st.data())
def test_generated_streams_decode_like_the_reference_however_split(text: str, data: st.DataObject) -> None:
    body = text.encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=8)))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    assert decode(*parts) == reference(text)


@settings(max_examples=500, deadline=None)
@given(body=st.binary(max_size=400), data=st.data())
def test_any_bytes_decode_without_error_and_independently_of_splits(body: bytes, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=8)))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    whole = decode(body)
    assert decode(*parts) == whole
    assert decode(*one_byte_parts(body)) == whole
    for _event, payload in whole:
        assert isinstance(payload, bytes)


def read_fast_path_first(decoder: SSEDecoder, part: bytes) -> list[tuple[str, bytes]]:
    """One network read the way a model stream takes it: `feed_plain` where it applies, else `feed`."""
    plain = decoder.feed_plain(part)
    if plain is None:
        return decoder.feed(part)
    return [("", data) for data in plain]


def assert_fast_path_reads_like_the_full_decoder(parts: list[bytes]) -> None:
    """Read by read: the same events at the same read, the same `idle`, the same end of stream."""
    full, fast = SSEDecoder(), SSEDecoder()
    for i, part in enumerate(parts):
        expected = full.feed(part)
        assert read_fast_path_first(fast, part) == expected, f"read {i} of {parts!r}"
        assert fast.idle == full.idle, f"idle after read {i} of {parts!r}"
    assert fast.close() == full.close(), parts


EVENT = b'data: {"choices":[{"delta":{"content":" tok"}}]}\n\n'
PAYLOAD = b'{"choices":[{"delta":{"content":" tok"}}]}'


@pytest.mark.parametrize(
    "tail",
    [
        b"\n",  # "\n\n\n": an extra blank line
        b"\n\n",
        b": keep-alive\n\n",
        b": keep-alive\n",
        b":\n\n",
        b": keep-alive\n\ndata: {",  # and the start of the next event
        b"id: 7\n\n",
        b"retry: 5\n",
        b"event: ping\n\n",
    ],
)
def test_the_fast_path_emits_an_event_at_the_read_that_completes_it(tail: bytes) -> None:
    # One event a second, each followed by a comment or a blank line: each token must come out at
    # its own read, not one read (one second) later.
    decoder = SSEDecoder()
    decoder.feed(EVENT)
    assert read_fast_path_first(decoder, EVENT + tail) == [("", PAYLOAD)]
    assert_fast_path_reads_like_the_full_decoder([EVENT, EVENT + tail, EVENT + tail, EVENT])


def test_the_fast_path_emits_like_the_full_decoder_after_a_keep_alive() -> None:
    # The exact reads from the review: the full decoder emits the second event at the second read.
    full, fast = SSEDecoder(), SSEDecoder()
    full.feed(EVENT)
    fast.feed(EVENT)
    assert full.feed(EVENT + b"\n") == [("", PAYLOAD)]
    assert fast.feed_plain(EVENT + b"\n") in (None, [PAYLOAD])
    full, fast = SSEDecoder(), SSEDecoder()
    full.feed(EVENT)
    fast.feed(EVENT)
    assert full.feed(EVENT + b": keep-alive\n\n") == [("", PAYLOAD)]
    assert fast.feed_plain(EVENT + b": keep-alive\n\n") in (None, [PAYLOAD])


def test_the_fast_path_takes_the_common_reads() -> None:
    # It must keep doing its job: whole plain events, several at once, and a cut inside one.
    decoder = SSEDecoder()
    decoder.feed(b"data: {}\n\n")
    assert decoder.feed_plain(EVENT) == [PAYLOAD]
    assert decoder.feed_plain(EVENT + EVENT + EVENT[:20]) == [PAYLOAD, PAYLOAD]
    assert not decoder.idle
    assert decoder.feed_plain(EVENT[20:] + b"data: [DONE]\n\n") == [PAYLOAD, b"[DONE]"]


@pytest.mark.parametrize("cut", range(1, 7))
def test_a_read_cut_inside_the_next_data_prefix_emits_the_event_before_it(cut: int) -> None:
    # "...}\n\nda" | "ta: {...}\n\n": the first event is complete at the first read (1024-byte reads
    # cut there about once in 55 events), and the fast path still takes both reads.
    decoder = SSEDecoder()
    decoder.feed(b"data: {}\n\n")
    assert decoder.feed_plain(EVENT + EVENT[:cut]) == [PAYLOAD]
    assert decoder.idle is False
    assert decoder.feed_plain(EVENT[cut:]) == [PAYLOAD]
    assert_fast_path_reads_like_the_full_decoder([EVENT, EVENT + EVENT[:cut], EVENT[cut:]])


# Lines of every kind a server sends, plain JSON events most often (so that the fast path is taken).
_PLAIN_EVENT = st.sampled_from([b"data: {}\n\n", EVENT, b'data: {"a": "data: x"}\n\n', b"data: [DONE]\n\n"])
_FIELD_LINE = st.one_of(
    st.sampled_from(
        [
            b"",  # a blank line
            b"",
            b": keep-alive",
            b":",
            b": OPENROUTER PROCESSING",
            b"data: {}",
            b"data:{}",  # no space after the colon
            b"data:",
            b"data: ",
            b"data:  x",
            b"data",
            b"data: data: x",
            b"event: error",
            b"event:message",
            b"event:",
            b"id: 3",
            b"id:4",
            b"retry: 5",
            b"retry:10",
            b"foo: bar",
            b"\xef\xbb\xbfdata: 1",  # a byte-order mark not at the start is part of the line
        ]
    ),
    st.binary(max_size=8).filter(lambda b: b"\r" not in b and b"\n" not in b).map(lambda b: b"data: " + b),
)
_LINE_END_BYTES = st.sampled_from([b"\n", b"\n", b"\n", b"\r\n", b"\r"])
_BLOCK = st.one_of(
    _PLAIN_EVENT,
    _PLAIN_EVENT,
    st.tuples(_FIELD_LINE, _LINE_END_BYTES).map(b"".join),
    # Multi-line data, with any line end.
    st.tuples(st.lists(_FIELD_LINE, min_size=1, max_size=3), _LINE_END_BYTES).map(
        lambda t: t[1].join([*t[0], b"", b""])
    ),
)


@pytest.mark.exhaustive
@settings(max_examples=depth.examples(3000), deadline=None)
@given(
    bom=st.booleans(),
    blocks=st.lists(_BLOCK, max_size=16),
    tail=st.binary(max_size=3),
    data=st.data(),
)
def test_the_plain_fast_path_reads_like_the_full_decoder(
    bom: bool, blocks: list[bytes], tail: bytes, data: st.DataObject
) -> None:
    body = (b"\xef\xbb\xbf" if bom else b"") + b"".join(blocks) + tail
    # Reads cut anywhere, and at block boundaries (where a server's flushes fall) more often than chance.
    boundaries = [len(b"".join(blocks[:i])) + (3 if bom else 0) for i in range(len(blocks) + 1)]
    cuts = data.draw(st.lists(st.one_of(st.integers(0, len(body)), st.sampled_from(boundaries)), max_size=12))
    offsets = sorted(set(cuts))
    parts = [body[a:b] for a, b in zip([0, *offsets], [*offsets, len(body)], strict=True)]
    assert_fast_path_reads_like_the_full_decoder(parts)


@pytest.mark.exhaustive
@settings(max_examples=depth.examples(1000), deadline=None)
@given(body=st.binary(max_size=200), data=st.data())
def test_the_plain_fast_path_reads_any_bytes_like_the_full_decoder(body: bytes, data: st.DataObject) -> None:
    body = b"data: {}\n\n" + body  # started, so that the fast path is tried from the second read on
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(body)), max_size=8))))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    assert_fast_path_reads_like_the_full_decoder(parts)


def _reads(body: bytes, size: int) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


_LONG = 256 * 1024
_LONG_EVENTS = {
    # One long data line (a big tool-call argument or text delta), with each kind of line end.
    "one line": b"data: " + b"x" * _LONG + b"\n\n",
    "one line, CRLF": b"data: " + b"x" * _LONG + b"\r\n\r\n",
    "one line, CR": b"data: " + b"x" * _LONG + b"\r\r",
    # Many data lines of one event.
    "many lines": b"".join(b"data: " + b"y" * 1000 + b"\n" for _ in range(_LONG // 1000)) + b"\n",
}


@pytest.mark.parametrize("shape", list(_LONG_EVENTS))
@pytest.mark.parametrize("fast_path", [True, False], ids=["feed_plain first", "feed"])
def test_a_long_event_in_small_reads_is_copied_a_bounded_number_of_times(shape: str, fast_path: bool) -> None:
    # Linear, not quadratic: the bytes a read allocates (copies of what is held) are counted. Holding
    # the event so far and copying or rescanning it at every read made 1 MB in 1 KB reads cost a
    # second of the event loop; the whole event may be copied a few times, once it is complete.
    body = _LONG_EVENTS[shape]
    decoder = SSEDecoder()
    decoder.feed(b"data: {}\n\n")
    events: list[tuple[str, bytes]] = []
    allocated: list[int] = []
    tracemalloc.start()
    try:
        for part in _reads(body, 1024):
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            events += read_fast_path_first(decoder, part) if fast_path else decoder.feed(part)
            allocated.append(tracemalloc.get_traced_memory()[1] - before)
    finally:
        tracemalloc.stop()
    data = b"\n".join([b"y" * 1000] * (_LONG // 1000)) if shape == "many lines" else b"x" * _LONG
    assert events == [("", data)]
    assert max(allocated[:-1]) < 16 * 1024, "a read that completes nothing copies what is held"
    assert sum(allocated) < 6 * len(body)


# --- SSEChunkDecoder's one-event shortcut reads like the full decoder ---------------------------------------


# It reads a bare `\r` line end like the full SSE decoder, however the stream is split.
class Recorder:
    """A mapper that keeps what it is given: JSON objects are chunks, anything else is malformed."""

    finished = False

    def __init__(self) -> None:
        self.trail: list[tuple[str, Any]] = []

    def feed(self, payload: Any, out: list[Any], *, mid_stream: bool = True) -> None:
        if payload.__class__ is not dict:
            raise ValueError("not an object")
        out.append(payload)

    def flush(self, out: list[Any]) -> None:
        pass

    def error(self, payload: Any, *, mid_stream: bool) -> ModelError:
        self.trail.append(("error", payload))
        return agentrt.ServerError("error event")

    def unreadable(
        self, what: str, *, mid_stream: bool, data: bytes | None = None, cause: BaseException | None = None
    ) -> ModelError:
        self.trail.append(("unreadable", data))
        return ModelResponseError(what)


def chunk_decoder_reads(parts: list[bytes]) -> tuple[list[list[Any]], list[tuple[str, Any]]]:
    """What `SSEChunkDecoder` gives at each read (reading stops once it is done), and how it ended."""
    recorder = Recorder()
    decoder = SSEChunkDecoder(recorder)
    reads = []
    for part in parts:
        reads.append(decoder.feed(part))
        if decoder.done:
            break
    else:
        reads.append(decoder.close())
    end = [("done", None)] if decoder.error is None else recorder.trail
    return reads, end


def reference_reads(parts: list[bytes]) -> tuple[list[list[Any]], list[tuple[str, Any]]]:
    """The same, from the full SSE decoder's events and the chunk decoder's documented rules: JSON
    objects of unnamed (or `message`) events are chunks, `[DONE]` ends the stream, an `error` event
    fails it, other named events are skipped; a stream that ends otherwise is incomplete."""
    sse = SSEDecoder()
    reads: list[list[Any]] = []

    def take(events: list[tuple[str, bytes]]) -> tuple[str, Any] | None:
        out: list[Any] = []
        reads.append(out)
        for event, data in events:
            if event not in ("", "message"):
                if event == "error":
                    try:
                        payload = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        payload = None
                    return ("error", payload if payload is not None else data.decode("utf-8", "replace"))
                continue
            if data.startswith(b"[DONE]"):
                return ("done", None)
            try:
                payload = orjson.loads(data)
            except orjson.JSONDecodeError:
                return ("unreadable", data)
            if not isinstance(payload, dict):
                return ("unreadable", data)
            out.append(payload)
        return None

    for part in parts:
        end = take(sse.feed(part))
        if end is not None:
            return reads, [end]
    end = take(sse.close())
    return reads, [end or ("unreadable", None)]


def test_the_chunk_decoder_reads_a_bare_cr_line_end_like_the_sse_decoder() -> None:
    parts = [
        b'data: {"a":0}\n\n',
        b'data: {"a":1}\r: keep-alive\n\n',
        b'data: {"a":2}\n\n',
        b"data: [DONE]\n\n",
    ]
    expected = ([[{"a": 0}], [{"a": 1}], [{"a": 2}], []], [("done", None)])
    assert reference_reads(parts) == expected
    assert chunk_decoder_reads(parts) == expected
    for read in (
        b'data: {"a":1}\r\r',
        b'data: {"a":1}\r\n\r\n',
        b'data: {"a":1}\n\r',
        b'data: {"a":1}\r\n\n',
    ):
        parts = [b'data: {"a":0}\n\n', read, b'data: {"a":2}\n\n', b"data: [DONE]\n\n"]
        assert chunk_decoder_reads(parts) == reference_reads(parts), read


_JSON_DATA = st.one_of(
    st.sampled_from(
        [b"{}", b'{"a":1}', b'{"a":"data: x\\r\\n"}', b'{"choices":[{"delta":{"content":" tok"}}]}']
    ),
    st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 9), max_size=2).map(orjson.dumps),
)


_FIELD_LINE = st.one_of(
    _JSON_DATA.map(lambda data: b"data: " + data),
    _JSON_DATA.map(lambda data: b"data:" + data),
    st.sampled_from(
        [
            b"",
            b"",
            b": keep-alive",
            b":",
            b"event: ping",
            b"event: message",
            b"event: error",
            b"id: 7",
            b"retry: 5",
            b"data: [DONE]",
            b"data: 7",
            b"data: {",
            b"data",
        ]
    ),
)


_LINES = st.lists(st.tuples(_FIELD_LINE, _LINE_END_BYTES).map(b"".join), min_size=1, max_size=3).map(b"".join)


_EVENT = st.one_of(
    _JSON_DATA.map(lambda data: b"data: " + data + b"\n\n"),  # the common event, most often
    _JSON_DATA.map(lambda data: b"data: " + data + b"\n\n"),
    st.tuples(_FIELD_LINE, _LINE_END_BYTES).map(b"".join),
    # Lines with any line ends, then a blank line.
    st.tuples(_LINES, _LINE_END_BYTES).map(b"".join),
    # A data line ended by a bare "\r", another line, a blank line: `data: {...}\r: keep-alive\n\n`.
    st.tuples(_JSON_DATA, _FIELD_LINE).map(lambda t: b"data: " + t[0] + b"\r" + t[1] + b"\n\n"),
)


@pytest.mark.exhaustive
@settings(max_examples=depth.examples(2000), deadline=None)
@given(events=st.lists(_EVENT, max_size=12), done=st.booleans(), data=st.data())
@example(events=[b'data: {"a":0}\n\n', b'data: {"a":1}\r: keep-alive\n\n'], done=True, data=None)
def test_the_chunk_decoder_reads_like_the_sse_decoder_however_split(
    events: list[bytes], done: bool, data: st.DataObject | None
) -> None:
    body = b"".join(events) + (b"data: [DONE]\n\n" if done else b"")
    # Reads cut anywhere, and at event boundaries (where servers flush) more often than chance.
    boundaries = [len(b"".join(events[:i])) for i in range(len(events) + 1)]
    if data is None:
        cuts = boundaries
    else:
        cuts = data.draw(
            st.lists(st.one_of(st.integers(0, len(body)), st.sampled_from(boundaries)), max_size=12)
        )
    offsets = sorted(set(cuts) - {0, len(body)})
    parts = [body[a:b] for a, b in zip([0, *offsets], [*offsets, len(body)], strict=True)]
    assert chunk_decoder_reads(parts) == reference_reads(parts), parts


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=120), data=st.data())
def test_the_chunk_decoder_reads_any_bytes_like_the_sse_decoder(body: bytes, data: st.DataObject) -> None:
    body = b'data: {"a":0}\n\n' + body  # started, so that the shortcut can be taken from the second read
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(body) - 1), max_size=8))))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    assert chunk_decoder_reads(parts) == reference_reads(parts), parts
