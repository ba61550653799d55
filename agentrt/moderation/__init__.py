"""Moderation: `@moderate` judges a method's user message (and, if asked, its answer) with a
`ModerationModel`, concurrently with the model call.

A flag cancels the model call at once (its stream is closed), raises `ModerationError` with the
flagged categories, and stores nothing; no text of a moderated call reaches a reader before the
verdict. `OpenAIModerationModel` talks to OpenAI-compatible `/v1/moderations` endpoints.
"""

from __future__ import annotations

from ._declare import Moderate, moderate
from ._types import Moderation, ModerationModel
from .openai import OpenAIModerationModel

__all__ = ["Moderate", "Moderation", "ModerationModel", "OpenAIModerationModel", "moderate"]
