"""Who may serve a tool name: one kind of worker per name.

A tool's *source* is the kind of worker that offers it: :data:`MODULE` for a tool of a
Python tool module (the operator's own code: a tool of an existing name in another
module is that tool's next release, and rolls in as another version), ``mcp:<server>``
for one an MCP server lists (its names are the server's, not the operator's). A name
is served by one source:

- the built-in toolset's names (:data:`BUILTIN_NAMES`) belong to modules, whoever
  starts first: an MCP server's ``run_python`` never takes the built-in's calls;
- any other name belongs to the source a live worker serves it with: a worker of
  another source offering it is refused at its start (the names listed in
  ``TOOLFLEET_REGISTRY_SHARED_NAMES`` excepted: the operator lets several sources
  serve them, as versions of one tool);
- should two sources be live at once all the same (they started together), orchestrators
  route the name to modules' workers, else to the lexically first MCP server's.

Workers check at their start (:func:`refusal`); orchestrators drop offers of any other
source (:func:`owner`). A worker from before sources were published offers ``""``: any.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

MODULE = "module"
"""The source of a tool from a Python tool module (``TOOLFLEET_TOOL_MODULES``)."""

BUILTIN_NAMES = frozenset(
    {"echo", "grep", "list_dir", "read_file", "run_python", "sleep", "write_file"}
)
"""The built-in toolset's tool names (``tool_workers.builtin``; a test pins them)."""


def mcp_source(server: str) -> str:
    """The source of a tool the MCP server named ``server`` lists."""
    return f"mcp:{server}"


def owner(name: str, sources: Iterable[str]) -> str | None:
    """The source that serves ``name``, of those offering it (``None``: none says)."""
    known = {source for source in sources if source}
    if not known:
        return None
    if name in BUILTIN_NAMES or MODULE in known:
        return MODULE
    return min(known)


def refusal(
    name: str, source: str, live: Iterable[str], shared: Collection[str] = ()
) -> str | None:
    """Why a worker of ``source`` may not serve ``name`` while live workers serve it with
    the sources ``live``; ``None``: it may.

    Args:
        name: The tool's name.
        source: The source the starting worker offers it from.
        live: Sources live workers serve ``name`` with.
        shared: Names several sources may serve (``TOOLFLEET_REGISTRY_SHARED_NAMES``).
    """
    if not source or name in shared:
        return None
    allow = "list it in TOOLFLEET_REGISTRY_SHARED_NAMES to let both serve it"
    if name in BUILTIN_NAMES and source != MODULE:
        return (
            f"tool name {name!r} of {source} is a built-in tool's name; rename the tool or {allow}"
        )
    others = sorted({s for s in live if s and s != source})
    if others:  # first come, first served
        return (
            f"tool name {name!r} of {source} is already served by {others[0]}; rename the "
            f"tool or {allow}"
        )
    return None
