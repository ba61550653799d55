"""Secrets out of error messages, bodies and logs: every secret given by the caller, in any of the
forms it is written in (as it is, escaped by JSON or `repr`, percent-encoded, escaped again), is
replaced by `REDACTED`, with one compiled pattern per endpoint (`secret_forms`, `scrub`); and the
log filter that does it to the records of the loggers an HTTP request goes through (`_KEY_FILTER`)."""

from __future__ import annotations

import logging
import re
import threading
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable

REDACTED: Final = "***"
"""What a secret is replaced with."""


_ESCAPE: Final = r"\\\\{0,7}+"
"""The backslashes of an escape (JSON, `repr`): one, or up to eight where the escape was escaped again
(JSON in JSON, the `repr` of JSON). Possessive: what follows them is not a backslash."""
_PERCENT: Final = "%(?:25){0,3}"
"""A percent sign, percent-encoded again up to three times (a URL in a URL)."""
_SHORT_ESCAPES: Final = {"/": "/", "'": "'", '"': '"', "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
FORM_REACH: Final = 16
"""Characters a UTF-8 byte of a secret takes at most, in any form `scrub` matches (13: eight
backslashes and `u002b` for one ASCII character)."""


def _hex(value: int, digits: int) -> str:
    """`value` in hexadecimal, matched in either case."""
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{value:0{digits}x}")


def _char_forms(char: str) -> list[str]:
    """Patterns of the ways one character of a secret is written, each starting with a literal
    character: its escapes, as JSON and `repr` write them (`\\/`, `\\'`, `\\n`, `\\xNN`, `\\uNNNN`, a
    surrogate pair beyond the BMP, `\\UNNNNNNNN`, the `\\xNN` of each UTF-8 byte in the `repr` of
    bytes); its percent-encoding; itself. Hex digits in either case; every escape possibly escaped
    again (`_ESCAPE`, `_PERCENT`)."""
    code = ord(char)
    utf8 = char.encode("utf-8", "surrogatepass")
    if char == "\\":
        itself = r"\\\\{0,8}"  # itself, or escaped (`\\\\`) up to eight times over
    else:
        itself = re.escape(char)
    escapes = []
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        escapes.append(re.escape(short))
    if code < 0x100:
        escapes.append(f"x{_hex(code, 2)}")
    if code < 0x10000:
        escapes.append(f"u{_hex(code, 4)}")
    else:
        high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
        escapes.append(f"u{_hex(high, 4)}{_ESCAPE}u{_hex(low, 4)}")
        escapes.append(f"U{_hex(code, 8)}")
    if code >= 0x80:
        escapes.append(_ESCAPE.join(f"x{_hex(byte, 2)}" for byte in utf8))
    percent = _PERCENT.join(_hex(byte, 2) for byte in utf8)
    # Escapes first: the regex takes the first form that matches, and a secret's last character
    # written `\\u005c` must not be matched as a `\\` that leaves `u005c` behind.
    return [f"{_ESCAPE}(?:{'|'.join(escapes)})", _PERCENT + percent, itself]


class Forms(tuple[str, ...]):
    """The secrets, longest first, and `pattern`, which matches each in any of its forms."""

    pattern: re.Pattern[str]

    def __new__(cls, secrets: Iterable[str]) -> Forms:
        self = super().__new__(cls, sorted({secret for secret in secrets if secret}, key=len, reverse=True))
        # Each character in any of its forms. The first character's forms are alternatives of the
        # whole pattern, so that each alternative starts with a literal character: the regex engine
        # then skips, without trying a match, every position that holds none of those few characters.
        alternatives = []
        for secret in self:
            rest = "".join(f"(?:{'|'.join(_char_forms(char))})" for char in secret[1:])
            alternatives += [first + rest for first in _char_forms(secret[0])]
        self.pattern = re.compile("|".join(alternatives) or "(?!)")
        return self


def secret_forms(secrets: Iterable[str]) -> tuple[str, ...]:
    """What `scrub` needs to replace `secrets` in any of the forms they are written in: as they are, as
    `repr` writes them in a str or bytes, as JSON writes them (`\\/`, `\\"`, `\\uNNNN` in either case,
    as .NET does for `+`), percent-encoded (with `/` or without, in either case), each character in any
    of its forms, and escaped again (JSON in JSON, the repr of JSON).

    A tuple of the secrets, longest first; the matcher is compiled once, here.
    """
    return Forms(secrets)


def scrub(text: str, forms: tuple[str, ...]) -> str:
    """`text` with every secret of `forms` (from `secret_forms`), in any of its forms, replaced by
    `REDACTED`."""
    if not forms:
        return text
    pattern = forms.pattern if isinstance(forms, Forms) else Forms(forms).pattern
    return pattern.sub(REDACTED, text)


_SCRUBBED_LOGGERS: Final = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
    "hpack.hpack",
    "hpack.table",
    "agentrt.models",
)
"""The loggers an agentrt request goes through (a filter applies to its own logger's records only)."""
_FORMATTER: Final = logging.Formatter()


class _KeyFilter(logging.Filter):
    """Replaces the keys of open sessions in the records of `_SCRUBBED_LOGGERS`; never drops one.

    Installed on those loggers (only) by the first session that sends a request with a key; it stays,
    inert, once no session holds a key. A record's message is formatted (only when a key is held and
    the record was not discarded by its level) and, if it showed a key, replaced by its scrubbed text;
    so are its exception and stack texts.
    """

    def __init__(self) -> None:
        super().__init__()
        # Reentrant: `release` also runs from a garbage collection, which may start inside `hold`.
        # An update it interrupts can only end with a count too high (a key scrubbed for longer).
        self._lock = threading.RLock()
        self._held: dict[str, int] = {}
        self.forms: tuple[str, ...] = ()

    def hold(self, secret: str) -> None:
        with self._lock:
            self._held[secret] = self._held.get(secret, 0) + 1
            self.forms = secret_forms(self._held)
        for name in _SCRUBBED_LOGGERS:
            logging.getLogger(name).addFilter(self)  # a no-op once installed

    def release(self, secret: str) -> None:
        with self._lock:
            count = self._held.get(secret, 0) - 1
            if count > 0:
                self._held[secret] = count
            else:
                self._held.pop(secret, None)
            self.forms = secret_forms(self._held)

    def filter(self, record: logging.LogRecord) -> bool:
        forms = self.forms
        if forms:
            try:
                _scrub_record(record, forms)
            except Exception:  # a record that cannot be formatted: its handler reports it
                pass
        return True


def _scrub_record(record: logging.LogRecord, forms: tuple[str, ...]) -> None:
    message = record.getMessage()
    clean = scrub(message, forms)
    if clean != message:
        record.msg, record.args = clean, ()
    if record.exc_info and record.exc_info[1] is not None:
        text = record.exc_text or _FORMATTER.formatException(record.exc_info)
        clean = scrub(text, forms)
        if clean != text:
            record.exc_info, record.exc_text = None, clean
    if record.stack_info:
        record.stack_info = scrub(record.stack_info, forms)


_KEY_FILTER: Final = _KeyFilter()
