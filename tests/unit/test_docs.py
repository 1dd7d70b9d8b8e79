"""The README is a front page, and the documentation site's generated reference is whole.

``docs/hooks/settings_reference.py`` turns the markers of ``docs/configuration.md`` into
tables when MkDocs builds the site; these tests render the page the same way (no MkDocs
needed) and check every field of the settings and policy models is there. The README
stays a front page: small, with every link into ``docs/`` pointing at a file.
(``.ci/run`` builds the whole site with ``mkdocs build --strict``; the Python blocks of
every page run in ``tests/integration/test_readme.py``.)
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from tool_workers.contract.settings import Settings, ToolPolicies, ToolPolicy

REPO = Path(__file__).resolve().parents[2]
HOOK = REPO / "docs" / "hooks" / "settings_reference.py"
README_MAX_BYTES = 12_000
"""The front page's budget: 12 KB, counted in bytes."""

_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@functools.cache
def load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("settings_reference", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def configuration_page() -> str:
    """docs/configuration.md as the site shows it: its markers replaced by the tables."""
    source = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    return str(load_hook().render(source))


def rows(page: str) -> dict[str, str]:
    """The generated tables' rows, by the name in their first cell."""
    found = {}
    for line in page.splitlines():
        match = re.match(r"\| `(?P<name>[A-Za-z_]+)` \|", line)
        if match:
            found[match["name"]] = line
    return found


def test_given_the_mkdocs_config_then_it_runs_the_hook() -> None:
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert "docs/hooks/settings_reference.py" in config


def test_given_the_configuration_page_then_no_marker_is_left(configuration_page: str) -> None:
    hook = load_hook()
    source = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert hook.SETTINGS_MARKER in source and hook.POLICY_MARKER in source
    assert hook.SETTINGS_MARKER not in configuration_page
    assert hook.POLICY_MARKER not in configuration_page


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_given_a_setting_then_the_page_has_its_variable_type_default_and_description(
    name: str, configuration_page: str
) -> None:
    hook = load_hook()
    field = Settings.model_fields[name]
    variable = f"TOOLFLEET_{name.upper()}"
    row = rows(configuration_page).get(variable)
    assert row is not None, f"{variable} is not in the configuration reference"
    description = hook.field_docs(Settings).get(name)
    assert description, f"Settings.{name} has no docstring to show"
    cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]]
    assert cells[1].startswith(hook.type_text(field.annotation)), cells[1]
    assert cells[2] == hook.default_text(field), cells[2]
    # The description is the field's docstring (its first words, backticks aside).
    shown = cells[3].replace("`", "")
    opening = " ".join(description.replace("`", "").split()[:5])
    assert shown.startswith(opening), (shown, opening)


@pytest.mark.parametrize("name", list(ToolPolicy.model_fields))
def test_given_a_policy_key_then_the_page_has_it(name: str, configuration_page: str) -> None:
    hook = load_hook()
    row = rows(configuration_page).get(name)
    assert row is not None, f"policy key {name} is not in the configuration reference"
    shown = hook.POLICY_DEFAULTS.get(name) or hook.default_text(
        ToolPolicy.model_fields[name], toml=True
    )
    assert shown in row


def test_given_a_tool_without_a_queue_then_the_table_says_its_tool_queue(
    configuration_page: str,
) -> None:
    # The model's default ("tools") is what [defaults] would give; a tool with no queue
    # of its own is routed by tool, as the page's text says.
    row = rows(configuration_page)["queue"]
    assert "tool queue" in row.split(" | ")[2], row
    assert ToolPolicies().explicit_queue("anything") is None


def test_given_the_site_then_diagrams_need_no_script_from_elsewhere() -> None:
    # Material draws mermaid with a script from a CDN: a page read without the internet
    # would show the diagram's source. Diagrams are text.
    pages = [REPO / "mkdocs.yml", *sorted((REPO / "docs").rglob("*.md"))]
    assert [p.name for p in pages if "mermaid" in p.read_text(encoding="utf-8")] == []


def test_given_a_reference_table_then_its_names_are_never_broken_across_lines() -> None:
    css = (REPO / "docs" / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert "stylesheets/extra.css" in (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert "td:first-child code" in css and "white-space: nowrap" in css


def test_given_the_readme_then_it_is_a_front_page_within_its_budget() -> None:
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/"


def test_given_the_readme_then_every_relative_link_resolves_to_a_file() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    targets = [m["target"] for m in _LINK.finditer(text)]
    relative = [t for t in targets if "://" not in t and not t.startswith("#")]
    assert any(t.startswith("docs/") for t in relative), targets
    for target in relative:
        path = REPO / target.split("#", 1)[0]
        assert path.is_file(), f"README.md links to {target}, which is not a file"
