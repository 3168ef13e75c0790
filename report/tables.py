"""The command line's tables of results: the metrics of an evaluation result (``memdpc eval``), the comparison
of two (``memdpc eval compare``) and the recipes (``memdpc recipes``). The library returns the results; only
the front ends print them. The offline stages' reports: :mod:`memdpc.report.stage_tables`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from memdpc.common.console import titled_table
from memdpc.common.wording import plural
from memdpc.eval.compare import verdict
from memdpc.eval.results import FILE_ROLES, load_result
from memdpc.recipes.recipe import Recipe

__all__ = [
    "cell_text",
    "counts_text",
    "interval_text",
    "metric_text",
    "print_comparison",
    "print_recipes",
    "print_result",
]


def cell_text(value: Any) -> str:
    """A cell of a table of rows (the quickstart's): an interval ``[lo, hi]`` as ``lo–hi`` (``lo to hi`` where a
    bound is negative), None (a metric that cannot mean anything) as ``n/a``, anything else as it is."""
    if value is None:
        return "n/a"
    if isinstance(value, list | tuple):
        lo, hi = value
        return f"{lo} to {hi}" if min(lo, hi) < 0 else f"{lo}–{hi}"
    return str(value)


def interval_text(lo_hi: list[float] | tuple[float, float]) -> str:
    """An interval of fractions in percent: ``24.6–57.7``."""
    lo, hi = lo_hi
    return f"{100 * lo:.1f}–{100 * hi:.1f}"


def metric_text(result: dict[str, Any], name: str) -> str:
    """A metric of a results file as a reader sees it: ``40.0 [24.6–57.7]`` (percent, its 95 % interval; ``40.0
    [interval n/a]`` where none holds), or ``n/a`` where it cannot mean anything (R@10 of a 9-video gallery)."""
    value = result["metrics"][name]
    if value is None:
        return "n/a"
    lo_hi = result["intervals"].get(name)
    return f"{100 * value:.1f} [{'interval n/a' if lo_hi is None else interval_text(lo_hi)}]"


def counts_text(result: dict[str, Any]) -> str:
    """What a result's metrics count: ``30 test videos of 10 classes (3 in the smallest class), gallery of 40
    videos``; Oops adds its windows and time steps."""
    c = result["counts"]
    text = (
        f"{plural(c['videos'], 'test video')} of {plural(c['classes'], 'class')} ({c['smallest_class']} in the "
        "smallest class)"
    )
    if "gallery" in c:
        text += f", gallery of {plural(c['gallery'], 'video')}"
    if "steps" in c:
        text += f", {plural(c['windows'], 'window')}, {plural(c['steps'], 'time step')}"
    return text


def metrics_table(result: dict[str, Any]) -> Table:
    """A rich table of one result's metrics: the value and its 95 % interval in percent and the interval's
    method; under it what they count and, in yellow, a small test set."""
    table = titled_table(
        f"{result['kind']} · {result['stream']} · {result['dataset']}/{result['split']}",
        caption=counts_text(result),
    )
    for col in ("metric", "value", "95 % interval", "method"):
        table.add_column(col, justify="left" if col in ("metric", "method") else "right")
    for name, value in result["metrics"].items():
        if value is None:
            table.add_row(name, "n/a", "", "")
        elif name not in result["intervals"]:
            table.add_row(name, f"{100 * value:.1f}%", "n/a", "")
        else:
            interval = f"{interval_text(result['intervals'][name])}%"
            table.add_row(name, f"{100 * value:.1f}%", interval, result["methods"][name])
    return table


def print_result(path: str | os.PathLike, console: Console) -> None:
    """The metrics table of the results file ``path``, why a metric is n/a, a small test set, then every file
    the evaluation wrote."""
    path = Path(path)
    result = load_result(path)[0]
    console.print(metrics_table(result))
    for name, why in result["undefined"].items():
        console.print(f"{name} n/a: {why}", markup=False, soft_wrap=True)
    for name, why in (result.get("no_interval") or {}).items():
        console.print(f"{name}: no interval: {why}", markup=False, soft_wrap=True)
    if result["small_test_set"]:
        console.print(f"[yellow]warning:[/] {result['small_test_set']}", soft_wrap=True)
    console.print(f"wrote {path} and {path.with_name(result['arrays'])}", markup=False, soft_wrap=True)
    for role, names in (result.get("files") or {}).items():
        label = FILE_ROLES.get(role, role)
        console.print(
            f"{label}: {' '.join(str(path.parent / n) for n in names)}", markup=False, soft_wrap=True
        )


def print_comparison(
    comparison: dict[str, Any], console: Console, out: str | os.PathLike | None = None
) -> None:
    """``memdpc eval compare``: per metric A, B, A − B and its 95 % interval (percentage points), the test, its
    p-value and the discordant videos (A right and B wrong / the reverse); then one verdict per metric."""
    a, b = comparison["a"]["path"], comparison["b"]["path"]
    table = titled_table(
        f"A − B on the same {plural(comparison['videos'], 'test video')}",
        caption=f"A: {a}\nB: {b}",
    )
    for col in ("metric", "A", "B", "A − B [95 % interval]", "test", "p", "discordant A/B"):
        # a word too long for its column folds onto the next line (80 columns), never cut
        table.add_column(col, justify="left" if col in ("metric", "test") else "right", overflow="fold")
    for name, m in comparison["metrics"].items():
        if "undefined" in m:
            table.add_row(name, "n/a", "n/a", "", "", "", "")
            continue
        interval = (
            "n/a" if m["interval"] is None else "{:+.1f} to {:+.1f}".format(*(100 * x for x in m["interval"]))
        )
        discordant = m.get("discordant")
        table.add_row(
            name,
            f"{100 * m['a']:.1f}",
            f"{100 * m['b']:.1f}",
            f"{100 * m['difference']:+.1f} [{interval}]",
            m["test"] if m["p"] is not None else "none",
            "n/a" if m["p"] is None else f"{m['p']:.2g}",
            f"{discordant['a_only']}/{discordant['b_only']}" if discordant else "",
        )
    console.print(table)
    for name, m in comparison["metrics"].items():
        console.print(verdict(name, m, "A", "B", comparison["videos"]), markup=False, soft_wrap=True)
    if out is not None:
        console.print(f"wrote {out}", markup=False, soft_wrap=True)


def print_recipes(recipes: list[Recipe], console: Console) -> None:
    """One line per recipe: its name, the table row it reproduces, the figures to expect."""
    table = titled_table("memdpc recipes (memdpc recipes NAME prints one's commands)")
    table.add_column("recipe", no_wrap=True)
    table.add_column("row")
    table.add_column("expect")
    for r in recipes:
        expect = "; ".join(
            f"{d} " + (", ".join(f"{m} {v}" for m, v in f.items()) or "-") for d, f in r.expect.items()
        )
        table.add_row(r.name, r.row.split(":")[0], expect)
    console.print(table)
