"""The incremental SSE decoder: the SSE parsing rules, chunk boundaries anywhere, any bytes."""

from __future__ import annotations

import re

import pytest
from cassettes import Cassette, load_all, one_byte_parts
from hypothesis import given, settings
from hypothesis import strategies as st

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


def decode_plain_first(*parts: bytes) -> list[bytes]:
    """Like a model stream reads: `feed_plain` where it applies, `feed` otherwise."""
    decoder = SSEDecoder()
    data: list[bytes] = []
    for part in parts:
        plain = decoder.feed_plain(part)
        if plain is None:
            data += [d for _, d in decoder.feed(part)]
        else:
            data += plain
    return data + [d for _, d in decoder.close()]


_lines = st.sampled_from(
    [
        b"data: {}",
        b'data: {"a": 1}',
        b"data:x",
        b"data: ",
        b"data: data: x",
        b": ping",
        b"event: error",
        b"data: [DONE]",
        b"id: 3",
    ]
)


@settings(max_examples=1000, deadline=None)
@given(
    events=st.lists(st.lists(_lines, min_size=1, max_size=3), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    crlf=st.booleans(),
)
def test_the_plain_fast_path_decodes_like_the_full_decoder(
    events: list[list[bytes]], cuts: list[int], crlf: bool
) -> None:
    end = b"\r\n" if crlf else b"\n"
    body = b"".join(end.join(lines) + end + end for lines in events)
    offsets = sorted({min(c, len(body)) for c in cuts})
    parts = [body[a:b] for a, b in zip([0, *offsets], [*offsets, len(body)], strict=True)]

    assert decode_plain_first(*parts) == [d for _, d in decode(*parts)]
