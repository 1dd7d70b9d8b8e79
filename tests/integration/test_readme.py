"""Every Python code block of README.md and of the docs (docs/**/*.md) runs, as written,
against a real fleet.

A block that opens with a ``# <path>.py`` comment is a file: it is written there, in a
project directory the workers import from. Every other block is executed, with only
what cannot exist here swapped for what does: a real provider's model
(``model="provider:name"``, or the free name ``model``) becomes a scripted model, and the
HTTP service's address and token become those of a ``toolfleet serve`` started for the
test. A block defining a ``graph`` it does not run (a graph file for ``toolfleet serve
--config``) gets one turn run. A block a page marks
``<!-- readme-test: not runnable (why) -->`` on the line before it is skipped by name,
and the list of such blocks must stay the one below. Blocks are named
``<page>:<line>`` (``README.md:48``, ``docs/quickstart.md:60``).

The fleet: one worker serving the built-in toolset plus the pages' own tool modules,
with the shipped policy file, on a workspace seeded with the demo's sample project.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.pregel import Pregel
from pydantic import Field

from orchestrator import ScriptedChatModel
from orchestrator.cli.demo import seed_workspace
from orchestrator.dispatch.fleet import close_all
from orchestrator.local import WorkerProcess, settings_env
from orchestrator.scripted import tool_calls_message
from tests.support.fleet import REPO, fleet_settings
from tests.support.serving import ServerProcess, start_server
from tool_workers.contract.settings import Settings

pytestmark = pytest.mark.timeout(180)

PAGES = (REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")))
"""The README and every page of the documentation site."""
NOT_RUNNABLE: set[str] = set()
"""Blocks (``<page>:<line>``) a page marks not runnable here (keep this empty or tiny)."""

_BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```", re.M | re.S)
_MARK = re.compile(r"<!-- readme-test: not runnable \((?P<why>[^)]+)\) -->\s*$")
_FILE = re.compile(r"\A# (?P<path>[\w./-]+\.py)\n")
_PROVIDERS = (
    "openai",
    "anthropic",
    "azure_openai",
    "google_genai",
    "google_vertexai",
    "bedrock",
    "bedrock_converse",
    "ollama",
    "mistralai",
    "groq",
    "fireworks",
)
_PROVIDER_MODEL = re.compile(rf"""["'](?:{"|".join(_PROVIDERS)}):[\w.\-]+["']""")
"""A provider's model spec as a string literal (``"openai:gpt-4o-mini"``)."""


@dataclass(frozen=True)
class Block:
    """One ``python`` code block of a page."""

    page: str
    line: int
    code: str
    not_runnable: str | None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def file(self) -> str | None:
        match = _FILE.match(self.code)
        return match["path"] if match else None


def page_blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    page = path.relative_to(REPO).as_posix()
    blocks = []
    for match in _BLOCK.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(page, line, match["code"], mark["why"] if mark else None))
    return blocks


def readme_blocks() -> list[Block]:
    return [block for path in PAGES for block in page_blocks(path)]


BLOCKS = readme_blocks()


class ReadmeModel(ScriptedChatModel):
    """The scripted model standing in for a real provider: it lists the workspace (and
    writes /notes.md with Deep Agents' ``write_file`` when asked to), then answers; it
    records what it was bound to and every conversation it saw."""

    bound: dict[str, set[str]] = Field(default_factory=dict)
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ReadmeModel:
        for tool in tools:
            function = convert_to_openai_tool(tool)["function"]
            self.bound[function["name"]] = set(function["parameters"].get("properties", {}))
        return self

    def _next(self, messages: Sequence[BaseMessage]) -> AIMessage:
        self.seen.append(list(messages))
        if any(isinstance(m, ToolMessage) for m in messages):
            return AIMessage(content="done")
        calls: list[tuple[str, dict[str, Any]]] = [("list_dir", {"path": "."})]
        if "/notes.md" in str(messages[-1].content):
            # As Deep Agents' prompt has a model write a file: its own write_file's arguments.
            calls.append(("write_file", {"file_path": "/notes.md", "content": "X: notes\n"}))
        return tool_calls_message(calls)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The user's project directory: the pages' file blocks are written here."""
    root = tmp_path_factory.mktemp("readme-project")
    for block in BLOCKS:
        if block.file is not None:
            path = root / block.file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code, encoding="utf-8")
    return root


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


@pytest.fixture(scope="module")
def readme_fleet(
    redis_url: str, project: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    """A worker serving the built-in toolset and the pages' tool modules."""
    workdir = tmp_path_factory.mktemp("readme-fleet")
    modules = ("tool_workers.builtin", *(_module(b.file) for b in BLOCKS if b.file))
    settings = fleet_settings(
        redis_url, workdir, tool_modules=modules, config=REPO / "config" / "toolfleet.toml"
    )
    seed_workspace(settings.workspace_root)
    worker = WorkerProcess(
        settings,
        pool="threads",
        concurrency=4,
        queues=("tools", "sandbox"),
        log_file=workdir / "worker.log",
        extra_env={"PYTHONPATH": f"{project}:{REPO}"},
    )
    worker.start()
    try:
        worker.wait_ready()
        yield settings
    finally:
        worker.stop()
        close_all()


@pytest.fixture(scope="module")
def readme_server(
    readme_fleet: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """`toolfleet serve` with its default (scripted) model, as the HTTP service page starts
    it."""
    server = start_server(
        readme_fleet, tmp_path_factory.mktemp("readme-server"), "readme", model=None
    )
    yield server
    server.stop()


@pytest.fixture
def fleet_env(readme_fleet: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """This process's environment pointed at the fleet, as a user's shell would be."""
    for name in [n for n in os.environ if n.startswith("TOOLFLEET_")]:
        monkeypatch.delenv(name)
    for name, value in settings_env(readme_fleet).items():
        monkeypatch.setenv(name, value)
    return readme_fleet


def test_every_block_is_runnable_or_marked_with_its_reason() -> None:
    """Given the README and the docs, then their Python blocks are there, and only the
    blocks listed in NOT_RUNNABLE carry the not-runnable mark (with a reason)."""
    pages = {b.page for b in BLOCKS}
    assert "README.md" in pages and any(page.startswith("docs/") for page in pages), pages
    assert len(BLOCKS) >= 4
    assert {b.name for b in BLOCKS if b.not_runnable} == NOT_RUNNABLE


def test_no_python_block_escapes_the_walk() -> None:
    """Given every page, then each ```python fence starts a line (an indented one, in a
    list or an admonition, would not be run), and no two pages write the same file."""
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        fences = re.findall(r"^[ \t>]*```python\b", text, re.M)
        assert len(fences) == len(page_blocks(path)), f"{path}: an indented python block"
    files = [b.file for b in BLOCKS if b.file is not None]
    assert len(files) == len(set(files)), files


def test_readme_tool_modules_are_served(readme_fleet: Settings) -> None:
    """Given the pages' tool module blocks, then the worker serves their tools."""
    from orchestrator import discover_tools, dispatcher_for

    names = {t.name for t in discover_tools(dispatcher=dispatcher_for(settings=readme_fleet))}
    assert "fetch_page" in names and "read_file" in names


@pytest.mark.parametrize(
    "block",
    [b for b in BLOCKS if b.file is None and b.not_runnable is None],
    ids=lambda b: b.name,
)
def test_readme_block_runs(
    block: Block,
    fleet_env: Settings,
    readme_server: ServerProcess,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Given a block of the README or the docs, when it runs with the scripted model and
    the loopback service, then it raises nothing, and every tool call the model made
    succeeded."""
    model = ReadmeModel()
    (token,) = readme_server.settings.api_tokens
    code = _PROVIDER_MODEL.sub("model", block.code)
    code = code.replace("http://127.0.0.1:8123", readme_server.url)
    code = code.replace('api_key="s3cret"', f"api_key={token!r}")
    code = code.replace('"Bearer s3cret"', repr(f"Bearer {token}"))

    namespace: dict[str, Any] = {"model": model, "__name__": "readme"}
    exec(compile(code, block.name, "exec"), namespace)
    if not model.seen and isinstance(namespace.get("graph"), Pregel):
        # A graph file (served by `toolfleet serve --config`): run one turn of its graph.
        namespace["graph"].invoke({"messages": [("user", "Survey the workspace.")]})

    printed = capsys.readouterr().out
    own = namespace["model"]
    if own is not model and isinstance(own, ScriptedChatModel):
        # The block brings its own script (the docs' no-API-key example): all of it ran,
        # and the tool results it printed are no errors.
        assert own.calls == len(own.script), printed
        assert "ToolMessage" in printed and "status='error'" not in printed, printed
        return
    results = [m for seen in model.seen for m in seen if isinstance(m, ToolMessage)]
    assert all(m.status != "error" for m in results), results
    if "get_client(" in block.code:  # the HTTP client: the service's model ran the turn
        assert "messages in the thread" in printed, printed
    else:
        assert model.seen, "the block never called the model"
        assert {m.name for m in results} >= {"list_dir"}, results
