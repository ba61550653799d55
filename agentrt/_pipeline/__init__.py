"""The pipeline: one invocation as stages over an explicit turn state (see `invocation.py`)."""

from __future__ import annotations

from ._runtime import Listener, Runtime, SystemMessageProvider, ToolProvider, ToolRequest
from .invocation import READY, Invocation, StopAtBoundary

__all__ = [
    "READY",
    "Invocation",
    "Listener",
    "Runtime",
    "StopAtBoundary",
    "SystemMessageProvider",
    "ToolProvider",
    "ToolRequest",
]
