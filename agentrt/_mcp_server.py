"""What every MCP server of `agentrt.mcp` takes (`StdioServer`, `HTTPServer`): the options common to
both, checked when the server is made, its label, and what each kind supplies (its default name, its
transport)."""

from __future__ import annotations

import re
import typing
from collections.abc import Collection
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final, Literal

from ._errors import ConfigurationError
from .tools._declare import NeedsApproval as _NeedsApproval
from .tools._declare import check_needs_approval

if typing.TYPE_CHECKING:
    from contextlib import AsyncExitStack

_NAME: Final = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

_Approval = _NeedsApproval | Literal["destructive"]


@dataclass(frozen=True)
class _Server:
    """What every server takes (keyword arguments).

    - `name`: how errors and logs name the server (default: the command's or the URL host's name).
    - `prefix`: put before each of its tool names as the model sees them (`"files_"`: `files_read`),
      so that two servers' tools cannot clash; a clash is an error when the servers connect.
    - `exclude`: tools of the server (its own names) not to offer.
    - `needs_approval`: `"destructive"` (the default: tools not marked read-only or non-destructive
      wait for approval), `True`, `False` or a predicate `(arguments, context) -> bool`, for every
      tool of the server. The build's `Approvals(needs_approval={name: ...})` overrides it by tool.
    - `timeout`: seconds per tool call (`ToolSettings.timeout` when `None`).
    - `connect_timeout`: seconds to connect and read the tool list.
    - `reconnect`: after the server died, connect again at the next call (else it stays an error).
    - `mode`: the SDK's protocol negotiation: `"auto"` (the newest both speak), `"legacy"` (the
      initialize handshake) or a protocol version.
    """

    _: KW_ONLY
    name: str | None = None
    prefix: str = ""
    exclude: Collection[str] = ()
    needs_approval: _Approval = "destructive"
    timeout: float | None = None
    connect_timeout: float = 30.0
    reconnect: bool = True
    mode: str = "auto"

    def __post_init__(self) -> None:
        where = f"MCP server {self.label!r}"
        if self.needs_approval != "destructive":
            check_needs_approval(self.needs_approval, where)
        if self.prefix and not _NAME.match(self.prefix):
            raise ConfigurationError(f"{where}: prefix {self.prefix!r} must match [a-zA-Z0-9_-]")
        if isinstance(self.exclude, str):
            raise ConfigurationError(f"{where}: exclude is a collection of tool names, not one string")
        for name in ("timeout", "connect_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigurationError(f"{where}: {name} must be positive, got {value!r}")

    @property
    def label(self) -> str:
        return self.name or self._default_name()

    def _default_name(self) -> str:
        raise NotImplementedError

    def _transport(self, stack: AsyncExitStack) -> Any:
        raise NotImplementedError
