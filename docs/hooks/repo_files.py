"""MkDocs hook: files of the repository that pages show but that live outside ``docs/``.

``toolfleet bench --plot`` writes its chart to ``bench/results/``; the performance page
shows it from there, so the site always has the chart of the latest committed run and
nothing is copied by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]

SHOWN = {"bench/results/fanout.png": "assets/bench/fanout.png"}
"""Repository path -> its path on the site."""


def on_files(files: Files, config: Any, **_: Any) -> Files:
    """MkDocs event: add each shown file to the site's files."""
    for source, destination in SHOWN.items():
        files.append(File.generated(config, destination, abs_src_path=str(REPO / source)))
    return files
