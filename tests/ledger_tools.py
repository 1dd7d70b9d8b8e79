"""Tools whose side effects are counted outside Redis: each execution appends a line to
the file named by ``TOOLFLEET_TEST_LEDGER``, so a test that makes Redis lose its data
can still tell how many times each call really ran."""

from __future__ import annotations

import os
import time

from langchain_core.tools import tool


def _write(kind: str, tag: str) -> None:
    line = f"{kind} {tag} {os.getpid()}\n"
    # One write of a short line in append mode: lines of concurrent calls never mix.
    with open(os.environ["TOOLFLEET_TEST_LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(line)


@tool
def ledger_charge(seconds: float, tag: str) -> str:
    """A non-idempotent effect: noted in the ledger as it starts, then takes ``seconds``."""
    _write("charge", tag)
    time.sleep(seconds)
    return f"charged {tag}"


@tool
def ledger_touch(seconds: float, tag: str) -> str:
    """An idempotent effect: noted in the ledger as it starts, then takes ``seconds``."""
    _write("touch", tag)
    time.sleep(seconds)
    return f"touched {tag}"
