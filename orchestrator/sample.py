"""The sample project ``toolfleet demo`` surveys, and the scripted model that surveys it.

The scripted model is also what an agent gets when no model is named
(:func:`orchestrator.agent.chat_model`): one fan-out of tool calls across the workers,
then a summary of their results, with no API key.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from orchestrator.scripted import ScriptedChatModel, tool_calls_message
from tool_workers.contract.errors import ConfigError

DEFAULT_PROMPT = (
    "Survey the project in the workspace: what files it has, what is left TODO, what the "
    "README says, and how many lines of Python it holds. Then summarise."
)

SAMPLE_PROJECT = {
    "README.md": "# inventory\n\nA tiny inventory service: stock levels per warehouse.\n",
    "inventory/__init__.py": '"""Inventory service."""\n',
    "inventory/stock.py": (
        "def level(item, warehouse):\n"
        "    # TODO: read from the database instead of the fixture\n"
        "    return FIXTURE.get((item, warehouse), 0)\n\n"
        "FIXTURE = {('bolt', 'north'): 120, ('nut', 'south'): 80}\n"
    ),
    "inventory/api.py": (
        "from inventory.stock import level\n\n"
        "def get_level(item, warehouse):\n"
        "    # TODO: validate the warehouse name\n"
        "    return {'item': item, 'warehouse': warehouse, 'level': level(item, warehouse)}\n"
    ),
    "notes.txt": "Release checklist:\n- TODO: write the changelog\n- tag the release\n",
}

COUNT_LINES = (
    "import pathlib\n"
    "files = sorted(pathlib.Path('{root}').rglob('*.py'))\n"
    "print(sum(len(f.read_text().splitlines()) for f in files), 'lines in', len(files), 'files')\n"
)


PROJECT_TOOLS_MODULE = "inventory_tools"
"""The sample project's own tools (:data:`PROJECT_TOOLS`), served by a worker of their own
kind in ``toolfleet demo``."""

PROJECT_TOOLS = '''"""The inventory team's own tools: they import the service's code."""

from langchain_core.tools import tool

from inventory.stock import level


@tool
def stock_level(item: str, warehouse: str) -> str:
    """How many of an item a warehouse holds, from the inventory service itself."""
    return f"{level(item, warehouse)} {item} in {warehouse}"
'''


def scripted_model(
    workspace: Path | None = None, *, project_tools: bool = False
) -> ScriptedChatModel:
    """The deterministic demo model: one fan-out of tool calls, then a summary of results.

    Args:
        workspace: The workers' workspace root as the sandbox sees it (the demo's local
            one); ``None`` for a remote fleet, where ``run_python`` counts from ``.``.
        project_tools: Also call the sample project's own tool (``stock_level``), which
            the demo's second kind of worker serves.
    """
    code = COUNT_LINES.format(root=workspace or ".")

    def policy(messages: Sequence[BaseMessage]) -> AIMessage:
        if messages[-1].type == "human":
            calls: list[tuple[str, dict[str, object]]] = [
                ("list_dir", {"path": "."}),
                ("list_dir", {"path": "inventory"}),
                ("grep", {"pattern": "TODO"}),
                ("read_file", {"path": "README.md"}),
                ("run_python", {"code": code}),
                ("sleep", {"seconds": 0.5}),
            ]
            if project_tools:
                calls.append(("stock_level", {"item": "bolt", "warehouse": "north"}))
            return tool_calls_message(
                calls, content="I'll look at the workspace from several angles at once."
            )
        return AIMessage(content=_summarise([m for m in messages if isinstance(m, ToolMessage)]))

    return ScriptedChatModel(policy=policy)


def _summarise(results: list[ToolMessage]) -> str:
    by_tool: dict[str, list[str]] = {}
    for message in results:
        by_tool.setdefault(message.name or "", []).append(str(message.content))
    todos = [line for line in "\n".join(by_tool.get("grep", [])).splitlines() if "TODO" in line]
    readme = "\n".join(by_tool.get("read_file", []))
    readme_line = next((ln.split("\t", 1)[-1] for ln in readme.splitlines() if "tiny" in ln), "")
    counted = next(
        (ln for ln in "\n".join(by_tool.get("run_python", [])).splitlines() if "lines in" in ln),
        "an unknown number of lines",
    )
    lines = [
        f"The workspace is a small Python project; the README says: {readme_line.strip()}",
        f"It holds {counted.strip()}.",
        f"{len(todos)} TODOs are open:",
        *[f"  - {todo.strip()}" for todo in todos],
    ]
    stock = by_tool.get("stock_level")
    if stock:
        lines.append(f"The inventory service reports {stock[0].strip()}.")
    return "\n".join(lines)


def seed_workspace(root: Path, *, overwrite: bool = True) -> None:
    """Write the sample project the demo agent surveys.

    Args:
        root: The workspace directory (created if missing).
        overwrite: Replace files of the same names; if ``False``, refuse instead.

    Raises:
        ConfigError: ``overwrite`` is off and a file of the sample is already there
            (nothing is written then).
    """
    if not overwrite:
        taken = sorted(rel for rel in SAMPLE_PROJECT if (root / rel).exists())
        if taken:
            raise ConfigError(f"{root / taken[0]} already exists; choose an empty directory")
    for relative, text in SAMPLE_PROJECT.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
