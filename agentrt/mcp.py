"""Tools from MCP servers (the Model Context Protocol), on the official `mcp` SDK: `agentrt[mcp]`.

    files = StdioServer("python", ["-m", "files_server"], prefix="files_")
    tickets = HTTPServer("https://mcp.example.com/mcp", headers={"Authorization": "Bearer ..."})
    servers = MCPTools(files, tickets)
    support = agentrt.build(Support, model=model, tools=[servers])  # or tool_provider=servers

    async with servers:              # connects (a stdio server: starts its process), lists the tools
        await support.ask("...")     # each invocation offers the servers' current tools
                                     # leaving: every connection closed, every process stopped

Each server's connection lives in its own task of the `async with`'s task group (the SDK's transports
hold task groups of their own, entered and left in that task); calls are sent from the invocation's
tool round, so they run in parallel, under its deadline, and a cancelled call sends MCP's cancellation.

- A server's tool list is read when it connects and again after it says `tools/list_changed` (at the
  next invocation); its schemas go to the model as the server gave them.
- A server that dies fails the calls in flight with `MCPServerError`; the next call (or invocation)
  starts it again, unless its `reconnect` is off.
- A tool the server does not mark read-only (`readOnlyHint`) or harmless (`destructiveHint: false`)
  is destructive, as the MCP specification says: its calls wait for a human's approval unless the
  server's `needs_approval` (or the build's `Approvals`) says otherwise.
"""

from __future__ import annotations

import logging
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, Final, TextIO
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx2
import mcp_types
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import Tool

from ._errors import AgentError, ConfigurationError
from ._mcp_convert import as_text, return_value, schema_refusal, tool_definition
from ._mcp_link import Link, stderr
from ._mcp_server import _NAME, _Server
from .tools._declare import ToolDefinition, ToolSource

if typing.TYPE_CHECKING:
    from contextlib import AsyncExitStack

    from ._pipeline import ToolRequest

__all__ = ["HTTPServer", "MCPServerError", "MCPTool", "MCPToolError", "MCPTools", "StdioServer"]

logger = logging.getLogger("agentrt.mcp")

_MAX_PAGES: Final = 100


class MCPServerError(AgentError):
    """An MCP server could not be reached, or its connection closed (the process died, the HTTP
    server went away) during a call. `server` names it; the next call connects again unless its
    `reconnect` is off."""

    def __init__(self, message: str, *, server: str) -> None:
        super().__init__(message)
        self.server = server


class MCPToolError(AgentError):
    """An MCP server answered a tool call with an error (an `isError` result, or a protocol error).
    The model is told as for any failing tool: the tool and this type, and the server's text only
    with `ToolSettings(error_detail=True)`."""

    def __init__(self, message: str, *, server: str, tool: str) -> None:
        super().__init__(message)
        self.server = server
        self.tool = tool


@dataclass(frozen=True)
class StdioServer(_Server):
    """An MCP server this process starts and talks to over its stdin and stdout: `command` with
    `args`, in `cwd`, with `env` over the SDK's default environment (the server's stderr goes to
    `errlog`, a file, by default this process's stderr). It is stopped when the connection closes."""

    command: str
    args: Sequence[str] = ()
    _: KW_ONLY
    env: Mapping[str, str] | None = None
    cwd: str | os.PathLike[str] | None = None
    errlog: TextIO | None = None

    def _default_name(self) -> str:
        return os.path.basename(self.command)

    def _transport(self, stack: AsyncExitStack) -> Any:
        parameters = StdioServerParameters(
            command=self.command,
            args=list(self.args),
            env=dict(self.env) if self.env is not None else None,
            cwd=self.cwd,
        )
        return stdio_client(parameters, errlog=self.errlog or stderr())


@dataclass(frozen=True)
class HTTPServer(_Server):
    """An MCP server at `url` over Streamable HTTP; `headers` go with every request (e.g. for
    authorization), `http_timeout` bounds connecting and writing (reads may wait 300 s: a server
    may hold a response stream open)."""

    url: str
    _: KW_ONLY
    headers: Mapping[str, str] | None = None
    http_timeout: float = 30.0

    def _default_name(self) -> str:
        return urlsplit(self.url).hostname or self.url

    def _transport(self, stack: AsyncExitStack) -> Any:
        timeout = httpx2.Timeout(self.http_timeout, read=300.0)
        http = httpx2.AsyncClient(headers=dict(self.headers or {}), timeout=timeout)
        stack.push_async_callback(http.aclose)
        return streamable_http_client(self.url, http_client=http)


@dataclass(frozen=True, slots=True)
class MCPTool:
    """One tool of an MCP server, as offered to the model."""

    name: str
    """The name the model sees (the server's `prefix` and the tool's own name)."""
    server: str
    """The server's `name`."""
    remote_name: str
    """The tool's name on its server."""
    description: str
    parameters: Mapping[str, Any]
    """Its input JSON schema, as the server gave it."""
    annotations: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """Its annotations, as the server gave them (`readOnlyHint`, `destructiveHint`, ...)."""

    @property
    def read_only(self) -> bool:
        """The server says the tool changes nothing (`readOnlyHint`)."""
        return self.annotations.get("readOnlyHint") is True

    @property
    def destructive(self) -> bool:
        """The tool may change or delete things: not read-only, and the server does not say
        `destructiveHint: false` (the MCP specification's default)."""
        return not self.read_only and self.annotations.get("destructiveHint") is not False


# --- one server -----------------------------------------------------------------------------------


class _State:
    """A server's connection (the current link), its tools, and whether their list is stale."""

    def __init__(self, server: _Server, owner: MCPTools) -> None:
        self.server = server
        self.owner = owner
        self.link: Link | None = None
        self.tools: dict[str, tuple[MCPTool, ToolDefinition]] = {}
        self.stale = False
        self.lock = anyio.Lock()

    def changed(self) -> None:
        self.stale = True
        callback = self.owner.on_change
        if callback is not None:
            try:
                callback(self.server.label)
            except Exception:
                logger.exception("MCPTools on_change raised")

    def _error(self, message: str) -> MCPServerError:
        return MCPServerError(f"MCP server {self.server.label!r}: {message}", server=self.server.label)

    async def ready(self) -> Client:
        """The connected client: connects (again) when there is no live link, and reads the tool
        list again when it is stale."""
        link = self.link
        if link is not None and not link.closed and not self.stale:
            assert link.client is not None
            return link.client
        async with self.lock:
            link = self.link
            if link is None or link.closed:
                if link is not None:
                    link.close()  # (its task leaves the client, if it has not yet)
                    if not self.server.reconnect:
                        raise self._error("the connection closed, and reconnect is off")
                link = await self._connect()
            client = link.client
            if client is None:  # pragma: no cover - closed meanwhile
                raise self._error("the connection closed")
            if self.stale:
                self.stale = False
                try:
                    await self._list(client)
                except BaseException:
                    self.stale = True
                    raise
            return client

    async def _connect(self) -> Link:
        group = self.owner._group
        if group is None:
            raise self._error("not connected: use the MCPTools in `async with` first")
        link = Link(self)
        await group.start(link.serve)
        if link.error is not None or link.client is None:
            error = link.error
            raise self._error(f"could not connect: {error!r}") from error
        self.link = link
        try:
            await self._list(link.client)
        except BaseException:
            link.close()
            raise
        self.stale = False
        return link

    async def _list(self, client: Client) -> None:
        """Read the tool list (every page) and define its tools."""
        server = self.server
        found: list[Tool] = []
        cursor: str | None = None
        try:
            with anyio.fail_after(server.connect_timeout):
                for _ in range(_MAX_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    found.extend(page.tools)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except (MCPError, TimeoutError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            if self.link is not None:
                self.link.close()
            raise self._error(f"could not list its tools: {exc!r}") from exc
        tools = {}
        for remote in found:
            if remote.name in server.exclude:
                continue
            name = server.prefix + remote.name
            if name in tools:
                raise ConfigurationError(f"MCP server {server.label!r} lists two tools named {name!r}")
            tools[name] = self._define(name, remote)
        self.tools = tools

    def _define(self, name: str, remote: Tool) -> tuple[MCPTool, ToolDefinition]:
        server = self.server
        where = f"MCP server {server.label!r}, tool {remote.name!r}"
        if not _NAME.match(name):
            raise ConfigurationError(
                f"{where}: model providers refuse the name {name!r} (it must match [a-zA-Z0-9_-]{{1,64}}); "
                "leave it out with exclude=[...]"
            )
        schema = remote.input_schema
        refused = schema_refusal(schema)
        if refused is not None:
            raise ConfigurationError(f"{where}: {refused}; leave it out with exclude=[...]")
        annotations: dict[str, Any] = {}
        if remote.annotations is not None:
            annotations = remote.annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
        info = MCPTool(
            name=name,
            server=server.label,
            remote_name=remote.name,
            description=remote.description or remote.title or remote.name,
            parameters=MappingProxyType(schema),
            annotations=MappingProxyType(annotations),
        )

        async def call(arguments: dict[str, Any]) -> Any:
            return await self.call(info, arguments)

        definition = tool_definition(
            info, schema, annotations, call, needs_approval=server.needs_approval, timeout=server.timeout
        )
        return info, definition

    async def call(self, tool: MCPTool, arguments: dict[str, Any]) -> Any:
        """Call `tool`: its structured content when it has some, else its contents as text."""
        client = await self.ready()
        link = self.link
        try:
            result = await client.call_tool(tool.remote_name, arguments)
        except MCPError as exc:
            if exc.error.code == mcp_types.CONNECTION_CLOSED or exc.error.message == "Session terminated":
                if link is not None:
                    link.close()
                raise self._error(f"the connection closed during a call of {tool.name!r}") from exc
            raise MCPToolError(
                f"MCP server {self.server.label!r}, tool {tool.remote_name!r}: {exc.error.message}",
                server=self.server.label,
                tool=tool.name,
            ) from exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            if link is not None:
                link.close()
            raise self._error(f"the connection closed during a call of {tool.name!r}") from exc
        except (RuntimeError, ValueError) as exc:  # e.g. structured content that breaks its schema
            raise MCPToolError(
                f"MCP server {self.server.label!r}, tool {tool.remote_name!r}: {exc}",
                server=self.server.label,
                tool=tool.name,
            ) from exc
        if result.is_error:
            raise MCPToolError(as_text(result) or "the tool failed", server=self.server.label, tool=tool.name)
        return return_value(result)


# --- the source -----------------------------------------------------------------------------------


def _raise_first(exc: BaseException) -> None:
    """Out of a task group's errors, raise the first `MCPServerError` or `ConfigurationError`, as one
    server's own error would be raised (returns when there is none)."""
    if isinstance(exc, BaseExceptionGroup):
        errors = exc.split((MCPServerError, ConfigurationError))[0]
        if errors is not None:
            first: BaseException = errors
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from None


class MCPTools(ToolSource):
    """The tools of one or more MCP servers, for `build(..., tools=[...])` or as a `tool_provider`.

    Use it in `async with` (or an application's lifespan): entering connects every server and reads
    their tool lists (raising `MCPServerError` naming a server that cannot be reached, and
    `ConfigurationError` for two tools of the same name or a tool a model provider would refuse);
    leaving closes every connection and stops every process it started. Invocations outside it fail
    with `MCPServerError`.

    `on_change(server)` is called when a server says its tool list changed; the list is read again
    at the next invocation.
    """

    def __init__(self, *servers: StdioServer | HTTPServer, on_change: Callable[[str], object] | None = None):
        if not servers:
            raise ConfigurationError("MCPTools: give at least one server")
        labels = [server.label for server in servers]
        for server in servers:
            if not isinstance(server, _Server):
                raise ConfigurationError(f"MCPTools: {server!r} is not a StdioServer or an HTTPServer")
            if labels.count(server.label) > 1:
                raise ConfigurationError(f"MCPTools: two servers are named {server.label!r}; name them")
        self.on_change = on_change
        self._states = [_State(server, self) for server in servers]
        self._group: anyio.abc.TaskGroup | None = None
        self._entered = False
        self._offered: tuple[tuple[tuple[str, ToolDefinition], ...], list[ToolDefinition]] | None = None

    def __repr__(self) -> str:
        return f"MCPTools({', '.join(repr(s.server.label) for s in self._states)})"

    @property
    def tools(self) -> Mapping[str, MCPTool]:
        """The tools offered now, by the name the model sees."""
        return MappingProxyType(
            {name: info for state in self._states for name, (info, _) in state.tools.items()}
        )

    async def __aenter__(self) -> MCPTools:
        if self._entered:
            raise RuntimeError("MCPTools is already entered; use one `async with` at a time")
        self._entered = True
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        try:
            async with anyio.create_task_group() as connecting:
                for state in self._states:
                    connecting.start_soon(state.ready)
            self._definitions()
        except BaseException as exc:
            await self._close()
            _raise_first(exc)
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        """Close every link and wait until their tasks left (processes stopped). An exception of the
        body goes on as it is, not in an exception group."""
        group = self._group
        self._group = None
        self._entered = False
        for state in self._states:
            if state.link is not None:
                state.link.close()
            state.link = None
            state.tools = {}
            state.stale = False
        self._offered = None
        assert group is not None
        await group.__aexit__(None, None, None)

    def _definitions(self) -> list[ToolDefinition]:
        """Every server's tool definitions; `ConfigurationError` when two servers' tools clash."""
        current = tuple((name, d) for state in self._states for name, (_, d) in state.tools.items())
        offered = self._offered
        if offered is not None and offered[0] == current:
            return offered[1]
        owners: dict[str, str] = {}
        for state in self._states:
            for name in state.tools:
                other = owners.setdefault(name, state.server.label)
                if other != state.server.label:
                    raise ConfigurationError(
                        f"MCP servers {other!r} and {state.server.label!r} both offer a tool named "
                        f"{name!r}: give one of them a prefix"
                    )
        definitions = [d for _, d in current]
        self._offered = (current, definitions)
        return definitions

    async def __call__(self, request: ToolRequest | None = None) -> list[ToolDefinition]:
        """The servers' current tools (connecting again to a server that died, reading a changed
        list again)."""
        if self._group is None:
            raise MCPServerError(
                f"{self!r} is not connected: enter it with `async with` first",
                server=self._states[0].server.label,
            )
        behind = [s for s in self._states if s.link is None or s.link.closed or s.stale]
        if len(behind) == 1:
            await behind[0].ready()
        elif behind:
            # At once: each dead server may take its `connect_timeout`, which must not add up.
            try:
                async with anyio.create_task_group() as connecting:
                    for state in behind:
                        connecting.start_soon(state.ready)
            except BaseException as exc:
                _raise_first(exc)
                raise
        return self._definitions()
