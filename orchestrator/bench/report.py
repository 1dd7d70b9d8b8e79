"""What ``toolfleet bench`` reports: tables (rich and Markdown), JSON, a plot (the
targets it checks are :mod:`orchestrator.bench.targets`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from orchestrator.bench.targets import FANOUT_LIMITS, FANOUT_TARGET_SLEEP

Section = tuple[str, list[str], list[list[str]]]
"""A table: title, column headers, rows of cells."""


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def _s(seconds: float) -> str:
    return f"{seconds:.3f} s"


def _per_sync(by_mode: dict[str, float]) -> str:
    """Async's figure over sync's."""
    return f"{by_mode['async'] / by_mode['sync']:.2f} x" if by_mode["sync"] > 0 else "-"


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
            "hooks_sync": "local ToolNode + pass-through middleware, invoke",
            "hooks_async": "local ToolNode + pass-through middleware, ainvoke",
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
        rows.append(["toolfleet added per call, async / sync", _per_sync(latency["added"]), "", ""])
        for mode in ("sync", "async"):
            rows.append(
                [f"toolfleet's own share, {mode} (over the pass-through middleware)",
                 _ms(latency["own"][mode]), "", ""]
            )  # fmt: skip
        rows.append(["toolfleet's own share, async / sync", _per_sync(latency["own"]), "", ""])
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
    out.extend(_links_sections(scenarios.get("links", {})))
    out.extend(_cost_sections(scenarios.get("cost", {})))
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
            t.get("why", ""),
        ]
        for t in report["targets"]
    ]
    out.append(("Targets", ["", "target", "measured", "limit", "", "why missed"], rows))
    return out


def _links_sections(links: dict[str, Any]) -> list[Section]:
    if "points" not in links:
        return []
    rows = [
        [
            f"{p['delay_ms']} ms",
            _ms(p["added"]["median"]),
            _s(p["fanout_phase"]["sync"]["median"]),
            _s(p["fanout_phase"]["async"]["median"]),
            f"{p['round_trips']['orchestrator_total']:.2f}",
            f"{p['round_trips']['worker_beyond_delivery']:.2f}",
        ]
        for p in links["points"]
    ]
    title = (
        f"f. Slow links: round-trip delay added between each host and Redis; one echo call "
        f"(sync) and {links['fanout']} x sleep({links['seconds']:g} s)"
    )
    headers = [
        "added delay",
        "added per call",
        "fan-out sync",
        "fan-out async",
        "round trips orchestrator",
        "round trips worker (beyond delivery)",
    ]
    out: list[Section] = [(title, headers, rows)]
    kinds = [
        [f"{p['delay_ms']} ms", side, kind, f"{count:.2f}"]
        for p in links["points"]
        for side in ("orchestrator", "worker")
        for kind, count in p["round_trips"][side].items()
    ]
    kinds += [
        ["0 ms", side, kind, f"{count:.2f}"]
        for key, side in (("prefork", "worker, prefork pool"), ("celery_raw", "raw Celery worker"))
        for kind, count in links.get(key, {}).get("worker", {}).items()
    ]
    out.append(
        (
            "f. Round trips per call, counted by the delay proxies, by Redis commands",
            ["added delay", "side", "commands", "per call"],
            kinds,
        )
    )
    return out


COST_LABELS = {
    "celery_raw": "raw Celery",
    "toolfleet_async": "toolfleet ainvoke",
    "toolfleet_sync": "toolfleet invoke",
    "agent_loop": "LangGraph agent loop alone (local ToolNode), ainvoke",
}
DIY_LABEL = "do-it-yourself agent"
COST_TOP_COMMANDS = 12


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} x"


def _cost_row(label: str, c: dict[str, Any], vs: dict[str, Any] | None) -> list[str]:
    """A contender's row of the per-call table; ``vs`` its numbers against raw Celery's
    (None: not measured at the same K, dashes)."""
    cpu = c["cpu_ms_per_call"]
    return [
        label,
        f"{c['commands_per_call']:.2f}",
        f"{c['bytes_per_call']:.0f}",
        *(f"{cpu[part]:.3f}" for part in ("orchestrator", "workers", "server", "total")),
        f"{c['calls_per_second']:.0f}",
        *(
            (
                f"{vs['commands_difference_per_call']:+.2f}",
                _times(vs["bytes_ratio"]),
                _times(vs["throughput_ratio"]),
                _times(vs["cpu_ratio"]["total"]),
            )
            if vs
            else ("-", "-", "-", "-")
        ),
    ]


def diy_rows(cost: dict[str, Any]) -> list[list[str]]:
    """The per-call table's rows of the do-it-yourself agent: at each level (K), its row,
    toolfleet ainvoke's at that K (the K of the other rows has it already), and toolfleet
    over it (commands a difference; bytes, CPU and calls/s ratios)."""
    rows = []
    versus_raw = cost["versus_raw"]
    for lv in cost.get("levels", []):
        k = lv["runs"]
        same_k = k == cost["runs"]
        if not same_k:
            rows.append(
                _cost_row(f"toolfleet ainvoke, K = {k}", lv["contenders"]["toolfleet_async"], None)
            )
        rows.append(
            _cost_row(
                f"{DIY_LABEL}, K = {k}",
                lv["contenders"]["diy_agent"],
                versus_raw.get("diy_agent") if same_k else None,
            )
        )
        vs = lv["versus_diy"]
        rows.append(
            [
                f"toolfleet ainvoke / {DIY_LABEL}, K = {k}",
                f"{vs['commands_difference_per_call']:+.2f}",
                _times(vs["bytes_ratio"]),
                *(
                    _times(vs["cpu_ratio"][part])
                    for part in ("orchestrator", "workers", "server", "total")
                ),
                _times(vs["throughput_ratio"]),
                "",
                "",
                "",
                "",
            ]
        )
    return rows


def _cost_sections(cost: dict[str, Any]) -> list[Section]:
    if "contenders" not in cost:
        return []
    contenders, versus = cost["contenders"], cost["versus_raw"]
    rows = [
        _cost_row(label, contenders[key], versus.get(key))
        for key, label in COST_LABELS.items()
        if key in contenders  # a report of before the agent loop alone was measured
    ]
    rows += diy_rows(cost)
    title = (
        f"g. Cost per call: {cost['runs']} concurrent runs of {cost['turns']} turns x "
        f"{cost['width']} parallel calls (raw Celery: send_task + get on threads), "
        f"{cost['pool']} pool of {cost['concurrency']} per fleet, "
        f"{contenders['celery_raw']['calls']} calls each in {cost['rounds']} round(s); "
        "CPU in ms per call"
        + (f"; K = {cost['runs']} unless the row says" if cost.get("levels") else "")
    )
    headers = [
        "",
        "cmds/call",
        "bytes/call",
        "CPU orch.",
        "CPU workers",
        "CPU Redis",
        "CPU total",
        "calls/s",
        "cmds vs raw",
        "bytes vs raw",
        "calls/s vs raw",
        "CPU vs raw",
    ]
    out: list[Section] = [(title, headers, rows)]
    idle = cost["idle"]
    by_name = {
        COST_LABELS[key]: contenders[key]["commands_by_name_per_call"]
        for key in ("celery_raw", "toolfleet_async", "toolfleet_sync")  # those with workers
    }
    same_k = [lv for lv in cost.get("levels", []) if lv["runs"] == cost["runs"]]
    if same_k:
        by_name[DIY_LABEL] = same_k[0]["contenders"]["diy_agent"]["commands_by_name_per_call"]
    names: dict[str, float] = {}
    for counts in by_name.values():
        for name, count in list(counts.items())[:COST_TOP_COMMANDS]:
            names[name] = max(names.get(name, 0.0), count)
    toolfleet = by_name[COST_LABELS["toolfleet_async"]]
    order = sorted(names, key=lambda n: (-toolfleet.get(n, 0.0), -names[n], n))
    idle_names = idle["commands_by_name_per_second"]
    rows = [
        [
            name,
            *(f"{counts[name]:.2f}" if name in counts else "-" for counts in by_name.values()),
            f"{idle_names[name]:.2f}" if name in idle_names else "-",
        ]
        for name in order
    ]
    out.append(
        (
            f"g. Redis commands per call by command (the top {COST_TOP_COMMANDS} of each)",
            ["command", *by_name, "idle, per second"],
            rows,
        )
    )
    cpu = idle["cpu_ms_per_second"]
    groups = ("orchestrator", "toolfleet_workers", "raw_workers", "server")
    out.append(
        (
            "g. Idle background, both fleets up and no calls (per second; included above, "
            "not subtracted)",
            [
                "",
                "Redis cmds/s",
                "bytes/s",
                "CPU ms/s orch.",
                "CPU ms/s toolfleet workers",
                "CPU ms/s raw workers",
                "CPU ms/s Redis",
            ],
            [
                [
                    f"idle, {idle['seconds']:.1f} s",
                    f"{idle['commands_per_second']:.1f}",
                    f"{idle['bytes_per_second']:.0f}",
                    *(f"{cpu.get(group, 0.0):.2f}" for group in groups),
                ]
            ],
        )
    )
    return out


_TEXT_COLUMNS = {"why missed", "mode", "target", "error", "side", "commands"}


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
    """The report's tables as Markdown (docs/performance.md shows them)."""
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
