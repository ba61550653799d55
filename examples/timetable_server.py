"""An MCP server for `make demo`'s MCP step, written with the official SDK's server API: one
read-only tool over stdio. The demo starts it as `python examples/timetable_server.py`.
"""

from __future__ import annotations

from mcp.server import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("timetable", log_level="WARNING")

DEPARTURES = {("bern", "basel"): "14:32, platform 7", ("basel", "bern"): "15:04, platform 9"}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def next_train(origin: str, destination: str) -> str:
    """The next direct train between two Swiss stations."""
    found = DEPARTURES.get((origin.strip().lower(), destination.strip().lower()))
    return (
        f"{origin} to {destination}: {found}" if found else f"no direct train from {origin} to {destination}"
    )


if __name__ == "__main__":
    server.run()
