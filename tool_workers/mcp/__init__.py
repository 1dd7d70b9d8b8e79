"""MCP servers' tools served by workers (``TOOLFLEET_MCP_SERVERS``).

::

    servers.py      the setting: the ``mcpServers`` JSON (a path or inline)
    connections.py  one process's sessions with its servers, restarted when they end
    tools.py        each server's tools as LangChain tools; annotations as policy defaults
    lifecycle.py    sessions start in each pool process and stop with it
"""
