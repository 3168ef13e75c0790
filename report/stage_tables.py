"""The command line's tables of the offline stages' reports: the index ``memdpc index`` wrote, what ``memdpc
preprocess`` did, what ``memdpc shard`` (and the quickstart) wrote, and ``memdpc shard --verify``. The library returns the reports; only the
front ends print them. Kept apart from :mod:`memdpc.report.tables`, whose tables read evaluation results (and
so import torch): a stage's command starts without torch.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from memdpc.common.console import titled_table
from memdpc.common.errors import UserError
from memdpc.common.wording import name_list, plural
from memdpc.pipeline.manifest import VerifyResult
from memdpc.pipeline.shard import ShardReport
from memdpc.pipeline.shard_plan import SKIP_KINDS, UNUSABLE
from memdpc.preprocess.datasets import IndexReport
from memdpc.preprocess.run_report import STATUSES, RunReport
from memdpc.preprocess.video_index import read_index, summary

__all__ = ["print_index_report", "print_preprocess_report", "print_shard_report", "print_verify"]

SKIPPED_LISTED = 20  # skipped videos listed per kind; the manifest's "skipped" lists them all
MAX_FAILURES = 10  # failed videos named one by one after a preprocess run; the report holds them all


def print_index_report(
    report: IndexReport, root: str | os.PathLike, console: Console, errors: Console
) -> None:
    """The index ``memdpc index`` wrote from the dataset at ``root``: its videos per class and split (a table), the
    files it passed over or did not index and the warnings about its splits (on ``errors``), and the next step."""
    counts = summary(report.records)
    table = titled_table(f"{report.path} — {len(report.records)} videos")
    table.add_column("class")
    for s in counts:
        table.add_column(s, justify="right")
    for name in sorted({n for c in counts.values() for n in c}):
        table.add_row(name or "(unlabelled)", *(str(c.get(name, 0)) for c in counts.values()))
    table.add_row("[bold]total", *(f"[bold]{sum(c.values())}" for c in counts.values()))
    console.print(table)
    warnings = []
    if report.passed_over:
        files = name_list([f"{path} ({why})" for path, why in report.passed_over])
        warnings.append(
            f"held out only videos whose files read: passed over {plural(len(report.passed_over), 'file')}, "
            f"left in train, where preprocess reports them: {files}"
        )
    if report.not_indexed:
        by_why: dict[str, list[str]] = {}
        for path, why in report.not_indexed:
            by_why.setdefault(why, []).append(path)
        kinds = "; ".join(
            f"{plural(len(paths), 'file')} {why} ({name_list(paths)})" for why, paths in by_why.items()
        )
        warnings.append(f"not indexed: {plural(len(report.not_indexed), 'file')} of {root}: {kinds}")
    for w in warnings:
        errors.print("[yellow]warning:[/yellow]", escape(w), soft_wrap=True)
    for w in report.warnings:
        errors.print(f"[yellow]warning:[/yellow] {w}", soft_wrap=True)
    errors.print(
        f"wrote {report.path}; next: memdpc preprocess flow {report.path} --out FRAMES --streams rgb,flow "
        "(FRAMES: a new folder for the frame archives)",
        soft_wrap=True,
    )


def print_preprocess_report(
    report: RunReport, index: str | os.PathLike, console: Console, errors: Console
) -> None:
    """What a preprocess run did (a table, the flow backend used), its failed videos (on ``errors``), what
    it wrote and what to run next."""
    cfg, s = report.config, report.summary
    table = titled_table(f"preprocess {','.join(cfg.streams)} → {cfg.out}")
    for col in ("done", "partial", "skipped", "failed", "frames", "frames/s", "seconds"):
        table.add_column(col, justify="right")
    table.add_row(*(str(getattr(s, k)) for k in (*STATUSES, "frames", "frames_per_s", "seconds")))
    console.print(table)
    if report.flow is not None:
        flow = report.flow
        note = f" ({flow['note']})" if flow["note"] else ""
        cv = flow.get("opencv")  # a report written before it was recorded has none
        match = f", OpenCV {cv['version']} (ports tested against {', '.join(cv['tested'])})" if cv else ""
        console.print(f"flow: {flow['backend']} on {', '.join(flow['devices'])}{match}{note}")
    path = cfg.report_path
    failures = report.failures
    for f in failures[:MAX_FAILURES]:
        errors.print(f"[red]failed[/red] {f['id']} ({f['path']}): {f['reason']}", soft_wrap=True)
    if len(failures) > MAX_FAILURES:
        errors.print(f"… and {len(failures) - MAX_FAILURES} more failed videos, see {path}", soft_wrap=True)
    lost = _held_out_losses(failures)
    if lost:
        errors.print(
            "[yellow]warning:[/yellow]",
            escape(
                f"held-out videos failed: {'; '.join(lost)}. A split that `memdpc index --test-per-class` or "
                "`--val-per-class` drew is drawn again by that command once the failed files are out of the "
                f"dataset folder (or with another --seed); then run this command again (finished archives "
                "are kept)"
            ),
            soft_wrap=True,
        )
    noisy = sum("messages" in v for v in report.videos)
    if noisy:
        console.print(
            f'FFmpeg/OpenCV messages about {plural(noisy, "video")}: in {path} (their "messages")',
            soft_wrap=True,
        )
    if report.messages:
        console.print(f'FFmpeg/OpenCV messages of the run: in {path} ("messages")', soft_wrap=True)
    folders = " and ".join(str(Path(cfg.out) / st) for st in cfg.streams)
    kept = f" (and kept those of {plural(s.skipped, 'video')} written before)" if s.skipped else ""
    console.print(
        f"wrote the archives of {plural(s.written, 'video')}{kept} in {folders}; report {path}",
        soft_wrap=True,
    )
    emptied = _emptied_classes(failures, index)
    if emptied:
        console.print(
            f"next: not memdpc shard yet, which would refuse the splits that lost a class: {'; '.join(emptied)}. "
            "Draw a held-out split again (see above), or repair or remove the failed files and index again; "
            "`memdpc shard … --allow-missing-classes` shards without those classes",
            soft_wrap=True,
        )
        return
    after = " (once every --part has finished)" if cfg.part[1] > 1 else ""
    for st in cfg.streams:
        console.print(
            f"next{after}: memdpc shard {cfg.out} --index {index} --stream {st} --out shards",
            soft_wrap=True,
        )


def _emptied_classes(failures: list[dict[str, Any]], index: str | os.PathLike) -> list[str]:
    """The splits in which every video of a class failed, e.g. ``test has no video of class 'Walk' left (its 2
    failed)``: ``memdpc shard`` refuses such a split. Failures of reports written before they recorded their split
    and class are not counted."""
    failed = Counter((f["split"], f["label_name"]) for f in failures if "split" in f and "label_name" in f)
    if not failed:
        return []
    try:
        held = Counter((r.split, r.label_name) for r in read_index(index) if r.label >= 0)
    except UserError:
        return []
    return [
        f"{split} has no video of class '{name}' left (its {plural(n, 'video')} failed)"
        if n > 1
        else f"{split} has no video of class '{name}' left (its one video failed)"
        for (split, name), n in sorted(held.items())
        if failed.get((split, name), 0) >= n
    ]


def _held_out_losses(failures: list[dict[str, Any]]) -> list[str]:
    """Per held-out split (not ``train``) that lost videos in preprocess: which classes lost which videos, e.g.
    ``test lost 1 video of class 'zooming' (zooming__cut)``. Failures of reports written before a failure
    recorded its split count as train's."""
    lost: dict[str, dict[str, list[str]]] = {}
    for f in failures:
        if f.get("split", "train") != "train":
            lost.setdefault(f["split"], {}).setdefault(f.get("label_name", ""), []).append(f["id"])
    return [
        f"{split} lost "
        + ", ".join(
            f"{plural(len(ids), 'video')} of class '{name}' ({name_list(ids, 3)})"
            for name, ids in sorted(classes.items())
        )
        for split, classes in sorted(lost.items())
    ]


def print_shard_report(r: ShardReport, console: Console, next_step: bool = False) -> None:
    """One table row for the shards written (or kept); the skipped videos counted by why (failed in
    preprocess, archive not written yet, unusable archive) and listed; the warnings; then what was written and,
    with ``next_step``, the command that goes on from here."""
    table = titled_table(str(r.manifest))
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
    by_kind: dict[str, list[dict[str, str]]] = {}
    for s in r.skipped:
        by_kind.setdefault(s.get("kind", UNUSABLE), []).append(s)
    if by_kind:
        counts = "; ".join(f"{len(v)} {SKIP_KINDS[k]}" for k, v in sorted(by_kind.items()))
        console.print(f"[yellow]skipped {plural(len(r.skipped), 'video')}:[/] {counts}", soft_wrap=True)
    for kind, skipped in sorted(by_kind.items()):
        for s in skipped[:SKIPPED_LISTED]:
            console.print(f"[yellow]skipped[/] {s['video_id']}: {s['reason']}", soft_wrap=True)
        if len(skipped) > SKIPPED_LISTED:
            console.print(
                f"[yellow]skipped[/] … and {len(skipped) - SKIPPED_LISTED} more {SKIP_KINDS[kind]} "
                f"(all listed under 'skipped' in {r.manifest})",
                soft_wrap=True,
            )
    for w in r.warnings:
        console.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
    console.print(
        f"wrote {r.manifest} ({plural(r.samples, 'sample')} of {plural(r.videos, 'video')} in "
        f"{plural(r.shards, 'shard')})",
        soft_wrap=True,
    )
    if next_step and r.next_step:
        console.print(f"next: {r.next_step}", soft_wrap=True)


def print_verify(results: list[VerifyResult], console: Console) -> bool:
    """Print one table row per manifest and every problem; return True when all shards check out."""
    table = titled_table("shard verification")
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
