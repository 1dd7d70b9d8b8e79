"""What ``toolfleet bench`` reports: targets, tables (rich and Markdown), JSON, a plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

Section = tuple[str, list[str], list[list[str]]]
"""A table: title, column headers, rows of cells."""

FANOUT_LIMITS = {100: 0.65, 500: 1.0}
"""Tool-phase targets (seconds) of a fan-out of ``sleep(0.5 s)``, by N."""
FANOUT_TARGET_SLEEP = 0.5


def _target(tid: str, what: str, value: float, op: str, limit: float, unit: str) -> dict[str, Any]:
    passed = value <= limit if op == "<=" else value >= limit
    return {
        "id": tid,
        "what": what,
        "value": value,
        "op": op,
        "limit": limit,
        "unit": unit,
        "pass": passed,
    }


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets that this report measured, each with PASS (True) or MISS."""
    out: list[dict[str, Any]] = []
    scenarios = report["scenarios"]
    latency = scenarios.get("latency", {})
    if "added" in latency:
        floor = latency["modes"]["celery_noop"]["median"]
        for mode in ("sync", "async"):
            ratio = latency["added"][mode] / floor if floor else math.inf
            out.append(
                _target(
                    f"a.{mode}",
                    f"added latency per call, {mode} / Celery no-op",
                    ratio,
                    "<=",
                    1.2,
                    "x",
                )
            )
    fanout = scenarios.get("fanout", {})
    if fanout.get("seconds") == FANOUT_TARGET_SLEEP:
        for point in fanout["points"]:
            limit = FANOUT_LIMITS.get(point["n"])
            if limit is not None and point["tool_phase"]["count"]:
                out.append(
                    _target(
                        f"b.n{point['n']}.{point['mode']}",
                        f"fan-out tool phase, N = {point['n']}, {point['mode']}",
                        point["tool_phase"]["median"],
                        "<=",
                        limit,
                        "s",
                    )
                )
    dispatch = fanout.get("dispatch")
    if dispatch and dispatch["n"] == 100:
        for mode in ("sync", "async"):
            out.append(
                _target(
                    f"b.dispatch.{mode}",
                    f"publish N = 100 calls, {mode}",
                    dispatch["wall"][mode]["median"] * 1000,
                    "<=",
                    20.0,
                    "ms",
                )
            )
    throughput = scenarios.get("throughput", {})
    if "ratio" in throughput:
        out.append(
            _target(
                "c",
                f"throughput, {throughput['runs']} runs / raw Celery",
                throughput["ratio"],
                ">=",
                0.8,
                "x",
            )
        )
    for mode, memory in scenarios.get("memory", {}).get("modes", {}).items():
        out.append(
            _target(
                f"d.{mode}",
                f"RSS per in-flight call, {mode}",
                memory["kib_per_call"],
                "<=",
                50.0,
                "KiB",
            )
        )
    if "leaks" in report:
        leaked = sum(report["leaks"].values())
        out.append(_target("d.leaks", "leaked subscriptions and futures", leaked, "<=", 0, ""))
    scale = {p["workers"]: p for p in scenarios.get("scale", {}).get("points", [])}
    if 1 in scale and 4 in scale:
        out.append(
            _target("e", "throughput 4 workers / 1 worker", scale[4]["ratio"], ">=", 3.5, "x")
        )
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def _s(seconds: float) -> str:
    return f"{seconds:.3f} s"


def sections(report: dict[str, Any]) -> list[Section]:
    """The report's tables, as plain cells (rendered by :func:`print_tables` or
    :func:`markdown`)."""
    out: list[Section] = []
    scenarios = report["scenarios"]
    latency = scenarios.get("latency", {})
    if "modes" in latency:
        rows = []
        names = {
            "local_sync": "local ToolNode, invoke",
            "local_async": "local ToolNode, ainvoke",
            "toolfleet_sync": "toolfleet, invoke",
            "toolfleet_async": "toolfleet, ainvoke",
            "celery_noop": "raw Celery no-op round trip",
            "celery_echo": "raw Celery tools.echo round trip",
            "redis_rtt": "raw Redis round trip (2 processes)",
        }
        for mode, label in names.items():
            stats = latency["modes"][mode]
            rows.append([label, _ms(stats["median"]), _ms(stats["p99"]), str(stats["count"])])
        for mode in ("sync", "async"):
            rows.append(
                [
                    f"toolfleet added per call, {mode}",
                    _ms(latency["added"][mode]),
                    _ms(latency["added_p99"][mode]),
                    "",
                ]
            )
        out.append(("a. One echo call, whole agent run", ["", "median", "p99", "n"], rows))
    fanout = scenarios.get("fanout", {})
    if "points" in fanout:
        by_n: dict[int, dict[str, Any]] = {}
        for point in fanout["points"]:
            by_n.setdefault(point["n"], {})[point["mode"]] = point["tool_phase"]
        rows = [
            [
                str(n),
                *(
                    cell
                    for mode in ("sync", "async")
                    for cell in (_s(modes[mode]["median"]), _s(modes[mode]["p99"]))
                ),
            ]
            for n, modes in sorted(by_n.items())
        ]
        title = f"b. Fan-out of N x sleep({fanout['seconds']:g} s): tool phase"
        headers = ["N", "sync median", "sync p99", "async median", "async p99"]
        out.append((title, headers, rows))
        rows = [
            [
                str(p["n"]),
                p["mode"],
                _s(p["tool_phase"]["median"] - fanout["seconds"]),
                _s(p["local_echo_phase"]["median"]),
                *(f"{p['cpu'].get(g, 0.0):.2f} s" for g in ("orchestrator", "workers", "server")),
            ]
            for p in sorted(fanout["points"], key=lambda p: (p["n"], p["mode"] != "sync"))
        ]
        headers = [
            "N",
            "mode",
            "over ideal",
            "local ToolNode, N x echo",
            "CPU orchestrator",
            "CPU workers",
            "CPU server",
        ]
        out.append(("b. Fan-out: where the time goes (medians per run)", headers, rows))
        dispatch = fanout.get("dispatch")
        if dispatch:
            rows = [
                [
                    mode,
                    _ms(dispatch["wall"][mode]["median"]),
                    _ms(dispatch["wall"][mode]["p99"]),
                    _ms(dispatch["cpu"][mode]["median"]),
                ]
                for mode in ("sync", "async")
            ]
            out.append(
                (
                    f"b. Dispatch cost: publish N = {dispatch['n']} prepared calls",
                    ["", "wall median", "wall p99", "CPU median"],
                    rows,
                )
            )
    throughput = scenarios.get("throughput", {})
    if "ratio" in throughput:
        labels = {
            "local": "local ToolNode (agent loop only)",
            "toolfleet": "toolfleet, ainvoke",
            "celery_raw": "raw Celery send_task + get",
        }
        rows = [
            [
                label,
                f"{throughput[key]['per_second']:.0f}",
                _ms(throughput[key]["cpu_per_call"]),
                str(throughput[key]["calls"]),
            ]
            for key, label in labels.items()
        ]
        rows.append(["toolfleet / raw Celery", f"{throughput['ratio']:.2f} x", "", ""])
        title = f"c. Throughput, {throughput['runs']} concurrent clients, echo"
        out.append((title, ["", "calls/s", "orchestrator CPU/call", "calls"], rows))
    memory = scenarios.get("memory", {})
    if "modes" in memory:
        rows = [
            [
                mode,
                str(m["peak_in_flight"]),
                f"{m['rss_before_mib']:.1f} MiB",
                f"{m['rss_peak_mib']:.1f} MiB",
                f"{m['kib_per_call']:.1f} KiB",
            ]
            for mode, m in memory["modes"].items()
        ]
        headers = ["", "in flight", "RSS before", "RSS, all in flight", "per call"]
        out.append(("d. Orchestrator memory", headers, rows))
    scale = scenarios.get("scale", {})
    if "points" in scale:
        rows = [
            [
                str(p["workers"]),
                _s(p["tool_phase"]["median"]),
                f"{p['per_second']:.1f}",
                f"{p['ideal_per_second']:.1f}",
                f"{p['ratio']:.2f} x",
            ]
            for p in scale["points"]
        ]
        title = (
            f"e. Scale: {scale['calls']} x sleep({scale['seconds']:g} s), "
            f"threads pool of {scale['concurrency']} per worker"
        )
        out.append((title, ["workers", "tool phase", "calls/s", "ideal", "vs 1 worker"], rows))
    errors = [[name, s["error"]] for name, s in scenarios.items() if "error" in s]
    if errors:
        out.append(("Scenarios that did not finish", ["scenario", "error"], errors))
    rows = [
        [
            t["id"],
            t["what"],
            f"{t['value']:.3g} {t['unit']}".strip(),
            f"{t['op']} {t['limit']:g} {t['unit']}".strip(),
            "PASS" if t["pass"] else "MISS",
        ]
        for t in report["targets"]
    ]
    out.append(("Targets", ["", "target", "measured", "limit", ""], rows))
    return out


_TEXT_COLUMNS = {"mode", "target", "error"}


def print_tables(report: dict[str, Any], console: Console) -> None:
    """Print the report's tables with rich."""
    for title, headers, rows in sections(report):
        table = Table(title=title, title_justify="left")
        for i, header in enumerate(headers):
            text = i == 0 or header in _TEXT_COLUMNS
            table.add_column(header, justify="left" if text else "right")
        for row in rows:
            styled = [
                {"PASS": "[green]PASS[/]", "MISS": "[red]MISS[/]"}.get(cell, cell) for cell in row
            ]
            table.add_row(*styled)
        console.print(table)


def markdown(report: dict[str, Any]) -> str:
    """The report's tables as Markdown (the README's Performance section shows them)."""
    lines: list[str] = []
    for title, headers, rows in sections(report):
        lines += [f"**{title}**", "", "| " + " | ".join(headers) + " |"]
        aligns = ["---" if i == 0 or h in _TEXT_COLUMNS else "---:" for i, h in enumerate(headers)]
        lines.append("| " + " | ".join(aligns) + " |")
        lines += [
            "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows
        ]
        lines.append("")
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: Path) -> None:
    """Write the report as JSON (numbers finite, so any JSON parser reads it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def require_matplotlib() -> None:
    """Fail early, before minutes of measuring, when ``--plot`` cannot be honoured.

    Raises:
        RuntimeError: matplotlib is not installed.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install 'toolfleet[bench]'") from exc


def write_plot(report: dict[str, Any], path: Path) -> None:
    """PNG of the fan-out tool phase against N, one line per mode (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fanout = report["scenarios"].get("fanout", {})
    points = [p for p in fanout.get("points", []) if p["tool_phase"]["count"]]
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for mode, color in (("sync", "tab:blue"), ("async", "tab:orange")):
        mine = sorted((p for p in points if p["mode"] == mode), key=lambda p: p["n"])
        ns = [p["n"] for p in mine]
        ax.plot(ns, [p["tool_phase"]["median"] for p in mine], "o-", color=color, label=mode)
        ax.plot(ns, [p["tool_phase"]["p99"] for p in mine], ":", color=color, label=f"{mode} p99")
        floor = [fanout["seconds"] + p["local_echo_phase"]["median"] for p in mine]
        ax.plot(
            ns, floor, "-.", color=color, alpha=0.5, lw=1, label=f"{mode}: ideal + local fan-out"
        )
    seconds = fanout.get("seconds", FANOUT_TARGET_SLEEP)
    ax.axhline(seconds, color="gray", linestyle="--", label=f"ideal ({seconds:g} s)")
    if seconds == FANOUT_TARGET_SLEEP:
        ax.plot(list(FANOUT_LIMITS), list(FANOUT_LIMITS.values()), "rv", label="target (at most)")
    ax.set_xscale("log")
    sizes = sorted({p["n"] for p in points})
    if sizes:
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.minorticks_off()
    ax.set_xlabel("N calls in one AIMessage")
    ax.set_ylabel("tool phase wall time (s)")
    machine = report["machine"]
    ax.set_title(
        f"toolfleet fan-out of N x sleep({seconds:g} s)\n"
        f"{machine['cores']} cores, {machine['ram_gib']:g} GiB, Python {machine['python']}, "
        f"{machine['date']}, load average {machine.get('loadavg_start', 0):g}",
        fontsize=10,
    )
    ax.set_ylim(bottom=0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
