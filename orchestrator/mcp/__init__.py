"""The fleet as an MCP server: its tools offered to any MCP client.

::

    results.py  a call's ToolMessage as an MCP result; progress events as notifications
    fleet.py    the fleet's tools, listed from the registry and called through the same
                dispatch as an agent's calls (CeleryToolMiddleware)
    server.py   the MCP server over any tool source; ``toolfleet mcp`` on stdio

``toolfleet serve``'s ``/mcp`` (streamable HTTP) is :mod:`orchestrator.server.mcp`.
"""
