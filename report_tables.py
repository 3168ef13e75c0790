"""The command line's tables of the library's reports: what ``memdpc shard`` (and the quickstart) wrote,
``memdpc shard --verify``, and the metrics of an evaluation result (``memdpc eval``). The library returns the
reports; only the front ends print them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from memdpc.eval.results import FILE_ROLES, load_result
from memdpc.pipeline.manifest import VerifyResult
from memdpc.pipeline.shard import ShardReport


def print_shard_report(r: ShardReport, console: Console) -> None:
    """One table row for the shards written (or kept), then every skipped video and why."""
    table = Table(title=str(r.manifest))
    for col in ("videos", "samples", "shards", "GB", "samples/s", "short", "skipped"):
        table.add_column(col, justify="right")
    table.add_row(
        str(r.videos),
        str(r.samples),
        f"{r.shards} ({r.kept} kept)" if r.kept else str(r.shards),
        f"{r.bytes / 1e9:.3f}",
        f"{r.samples / max(r.seconds, 1e-9):.1f}",
        str(r.short),
        str(len(r.skipped)),
    )
    console.print(table)
    for s in r.skipped:
        console.print(f"[yellow]skipped[/] {s['video_id']}: {s['reason']}")


def print_verify(results: list[VerifyResult], console: Console) -> bool:
    """Print one table row per manifest and every problem; return True when all shards check out."""
    table = Table(title="shard verification")
    for col in ("manifest", "shards", "samples", "GB", "status"):
        table.add_column(col, justify="left" if col == "manifest" else "right")
    for r in results:
        status = "[green]ok" if not r.problems else f"[red]{len(r.problems)} problems"
        table.add_row(str(r.manifest), str(r.shards), str(r.samples), f"{r.bytes / 1e9:.3f}", status)
    console.print(table)
    for r in results:
        for p in r.problems:
            console.print(f"[red]{r.manifest.parent.name}/{p}")
    return not any(r.problems for r in results)


def metrics_table(result: dict[str, Any]) -> Table:
    """A rich table of one result's metrics (percentages for values in [0, 1])."""
    table = Table(title=f"{result['kind']} · {result['stream']} · {result['dataset']}/{result['split']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in result["metrics"].items():
        shown = f"{100 * value:.2f}%" if isinstance(value, float) and 0.0 <= value <= 1.0 else str(value)
        table.add_row(name, shown)
    return table


def print_result(path: str | os.PathLike, console: Console) -> None:
    """The metrics table of the results file ``path``, then every file the evaluation wrote."""
    path = Path(path)
    result = load_result(path)[0]
    console.print(metrics_table(result))
    console.print(f"wrote {path} and {path.with_name(result['arrays'])}", markup=False, soft_wrap=True)
    for role, names in (result.get("files") or {}).items():
        label = FILE_ROLES.get(role, role)
        console.print(f"{label}: {' '.join(str(path.parent / n) for n in names)}", markup=False, soft_wrap=True)
