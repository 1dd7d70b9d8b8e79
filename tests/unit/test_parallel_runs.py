"""The README's test command runs in several processes: what a module fixture starts (a
server pair, a fleet) must still start once per test file, as in one process."""

from __future__ import annotations

import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support.fleet import REPO

MODULE = """
import time
from pathlib import Path

import pytest

@pytest.fixture(scope="module")
def started():
    with open(Path(__file__).parent / "setups.txt", "a") as out:
        out.write(__name__ + "\\n")
    return True

@pytest.mark.parametrize("n", range(4))
def test_uses_it(started, n):
    time.sleep(0.2)  # long enough for every worker to be asking for work
"""


def _distribution_options() -> list[str]:
    """The xdist options of pyproject.toml's addopts (``-n``, ``--dist``)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    words = shlex.split(config["tool"]["pytest"]["ini_options"]["addopts"])
    kept: list[str] = []
    for i, word in enumerate(words):
        if word in ("-n", "--dist"):
            kept += [word, words[i + 1]]
        elif word.startswith(("--dist=", "--numprocesses=")):
            kept.append(word)
    return kept


def test_each_module_fixture_starts_once_under_the_readmes_command(tmp_path: Path) -> None:
    options = _distribution_options()
    assert "-n" in options, options  # the command is parallel: the point of this test
    for name in ("alpha", "beta", "gamma"):
        (tmp_path / f"test_{name}.py").write_text(MODULE)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            *options,
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    setups = sorted((tmp_path / "setups.txt").read_text().split())
    assert setups == ["test_alpha", "test_beta", "test_gamma"], result.stdout
