"""Output parsing: how a method's declared return type shapes the request and reads the answer."""

from __future__ import annotations

from ._modes import ANSWER_TOOL, OutputMode
from ._parsers import NoneParser, OutputParser, TextParser, TypeParser, extract_json, parser_for

__all__ = [
    "ANSWER_TOOL",
    "NoneParser",
    "OutputMode",
    "OutputParser",
    "TextParser",
    "TypeParser",
    "extract_json",
    "parser_for",
]
