"""``memdpc report DIR``: one static page of what DIR holds, ``DIR/report/index.html`` and its pictures.

DIR is a quickstart folder or any folder of runs, eval results, shards and frame archives (found up to
:data:`DEPTH` folders down). The page holds the results table (the quickstart's summary where there is one,
then every results file), the chain that made each result (:mod:`memdpc.report.chain`: index → frame archives,
with the videos that failed → shards → run → checkpoint → results, each link checked against what is there now),
each run's curves (:func:`memdpc.report.show.run_curves`), sample clips of the shards
and videos of the frame archives (flow in colour, with the colour wheel's legend), retrieval strips and
confusion matrices, each drawn by :mod:`memdpc.report.show`. It needs no server and loads nothing from the
network: plain HTML with its style inline, no script, every picture a file beside it, linked relatively,
so that it opens from the file system (``file://``) and can be copied or archived as a folder. The page is
written last, so it never points at a picture not yet there; a picture that cannot be drawn (e.g. the shards
a result records have moved) is named on the page with the reason instead. Where DIR holds results, the runs,
shards and frame archives shown are those of their chains; other folders found beside them (scratch, older
attempts) are only named, as left out.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from memdpc.common import file_kinds
from memdpc.common.atomic import atomic_path
from memdpc.common.errors import UserError
from memdpc.common.streams import FLOW, STREAMS
from memdpc.common.wording import name_list, plural
from memdpc.eval.results import load_result
from memdpc.eval.scores import CLASSIFIER_KINDS, RETRIEVAL_KINDS
from memdpc.report.chain import AS_RECORDED, Chain, chains
from memdpc.report.show import (
    archive_candidates,
    draw_archive,
    draw_result,
    draw_samples,
    flow_legend,
    has_archives,
    is_archive,
    is_run,
    is_shard_folder,
    results_in,
    run_curves,
)
from memdpc.report.show_options import ShowOptions
from memdpc.report.tables import cell_text, metric_text
from memdpc.train.metrics import chance_summary, monitor_summary, read_metrics

__all__ = ["write_report"]

REPORT_DIR = "report"
PAGE = "index.html"
DEPTH = 3  # folders below DIR searched for runs, results, shards and archives
SAMPLES = 2  # shard samples per stream
VIDEOS = 3  # videos of an archive folder, spread over its ids
METRIC_COLUMNS = ("R@1", "R@5", "R@10", "top1", "top5")
SKIP = {REPORT_DIR, "checkpoints", "tb"}  # folders never searched


@dataclass
class Found:
    """What a folder holds, each list in path order."""

    runs: list[Path] = field(default_factory=list)
    results: list[Path] = field(default_factory=list)
    shards: list[Path] = field(default_factory=list)
    archives: list[Path] = field(default_factory=list)  # folders holding <stream>/<id>.tar

    def __bool__(self) -> bool:
        return bool(self.runs or self.results or self.shards or self.archives)


def find(folder: Path) -> Found:
    """Runs, results files, shard folders and archive folders in ``folder`` and up to :data:`DEPTH` below."""
    found = Found()

    def visit(d: Path, depth: int) -> None:
        if is_shard_folder(d) and not any(d.glob("manifest-*.json")):
            found.shards.append(d)
            return
        if any(has_archives(d / s) for s in STREAMS if (d / s).is_dir()):
            found.archives.append(d)
            return
        if is_run(d):
            found.runs.append(d)
        found.results += results_in(d)
        if depth < DEPTH:
            for sub in sorted(p for p in d.iterdir() if p.is_dir() and p.name not in SKIP):
                visit(sub, depth + 1)

    visit(folder, 0)
    return found


def write_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the page of ``folder`` into ``out`` (default ``folder/report``); return the page's path."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(
            f"{folder}: not a folder; memdpc report takes a folder of runs, eval results, shards or "
            "frame archives, e.g. a quickstart folder"
        )
    out = Path(out) if out is not None else folder / REPORT_DIR
    found = find(folder)
    if not found:
        raise UserError(
            f"{folder}: holds no runs, eval results, shards or frame archives (searched {DEPTH} "
            "folders down); give a quickstart folder or a folder of them"
        )
    page = Page(folder, out)
    made = chains(found.results)
    left_out = _keep_chained(found, made)
    page.summary(found, left_out)
    page.results(found.results, made)
    page.provenance(made)
    page.runs(found.runs)
    page.clips(found.shards, found.archives)
    page.retrieval(found.results)
    page.confusion(found.results)
    path = out / PAGE
    with atomic_path(path) as tmp:
        tmp.write_text(page.html())
    return path


def _keep_chained(found: Found, made: list[Chain]) -> list[Path]:
    """Keep in ``found`` the runs, shard folders and frame archive folders of the chains ``made`` (all of them
    where there is no chain, or one of a result that does not record its shards); return those left out."""
    if not made or not all(c.complete for c in made):
        return []
    keep = set().union(*(c.folders for c in made))
    left = []
    for kind in ("runs", "shards", "archives"):
        paths = getattr(found, kind)
        setattr(found, kind, [p for p in paths if p.resolve() in keep])
        left += [p for p in paths if p.resolve() not in keep]
    return sorted(left)


# ------------------------------------------------------------------------------------------------ page
_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; color: #222; max-width: 1280px; margin: 0 auto; padding: 1em 2em; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; } h3 { font-size: 1em; }
table { border-collapse: collapse; margin: 0.5em 0; } th, td { border: 1px solid #ccc; padding: 2px 8px; }
td.n { text-align: right; font-variant-numeric: tabular-nums; } th { background: #f3f3f3; }
figure { display: inline-block; margin: 0.5em 1em 1em 0; vertical-align: top; }
img { max-width: 100%; border: 1px solid #eee; } figcaption { font-size: 0.85em; color: #555; max-width: 60em; }
figure.wide { display: block; overflow-x: auto; } figure.wide img { max-width: none; }
.note { color: #666; } .missing { color: #a00; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text))


class Page:
    """The page's sections, drawn into ``out`` as they are added."""

    def __init__(self, folder: Path, out: Path) -> None:
        self.folder, self.out = folder, out
        self.parts: list[str] = []
        self.options = ShowOptions(samples=SAMPLES)
        self.legend_shown = False

    def _rel(self, path: Path) -> str:
        return os.path.relpath(path, self.folder)

    def _slug(self, path: Path) -> str:
        return self._rel(path).replace(os.sep, "-").strip(".-") or "top"

    def _figure(self, image: Path, text: str, wide: bool = False) -> str:
        """A picture, linked to itself at full size; ``wide``: shown at its own size, scrolled sideways where it
        is wider than the page (frames that shrunk to the page's width would be too small to see)."""
        src = quote(os.path.relpath(image, self.out).replace(os.sep, "/"))
        return (
            f'<figure{" class=wide" if wide else ""}><a href="{src}"><img src="{src}" alt="{_e(image.name)}"></a>'
            f"<figcaption>{_e(text)}</figcaption></figure>"
        )

    def _draw(self, what: str, draw: Callable[[], list[Path]]) -> list[Path]:
        """Draw, or put on the page why not (the page still gets written)."""
        try:
            return draw()
        except UserError as e:
            self.parts.append(f'<p class="missing">{_e(what)}: not drawn ({_e(e)})</p>')
            return []

    def _name(self, path: Path) -> str:
        """``path`` relative to the page's folder where it is inside it, else in full."""
        resolved, top = path.resolve(), self.folder.resolve()
        return str(resolved.relative_to(top)) if resolved.is_relative_to(top) else str(resolved)

    def summary(self, found: Found, left_out: list[Path]) -> None:
        held = [
            plural(len(found.runs), "run"),
            plural(len(found.results), "results file"),
            plural(len(found.shards), "shard folder"),
            plural(len(found.archives), "frame archive folder"),
        ]
        left = (
            f" Left out, not part of any result's chain: {name_list([self._rel(p) for p in left_out])}."
            if left_out
            else ""
        )
        self.parts.append(
            f"<h1>memdpc report: {_e(self.folder.resolve().name)}</h1>"
            f'<p class="note">{_e(self.folder.resolve())}: {_e(", ".join(held))}.{_e(left)}</p>'
        )

    def provenance(self, made: list[Chain]) -> None:
        """Each chain as a table: one row per link, from the index to the results."""
        if not made:
            return
        self.parts.append(
            '<h2>Provenance</h2><p class="note">How each result was made, from what its files record: the video '
            "index, the frame archives (and the videos that failed), the shards, the run, the checkpoint. "
            "<i>now</i>: whether the file there now is what was recorded (its SHA-256).</p>"
        )
        head = "".join(f"<th>{h}</th>" for h in ("link", "path", "what it holds", "recorded SHA-256", "now"))
        for chain in made:
            title = self._name(chain.checkpoint) if chain.checkpoint else "results that record no checkpoint"
            rows = "".join(
                f"<tr><td>{_e(link.stage)}</td><td>{_e(self._name(link.path) if link.path else '')}</td>"
                f"<td>{_e(link.what)}</td><td><code>{_e(link.digest)}</code></td>"
                f"<td{'' if link.now in ('', AS_RECORDED) else ' class=missing'}>{_e(link.now)}</td></tr>"
                for link in chain.links
            )
            self.parts.append(f"<h3>{_e(title)}</h3><table><tr>{head}</tr>{rows}</table>")

    def results(self, results: list[Path], made: list[Chain]) -> None:
        quickstart = self.folder / file_kinds.QUICKSTART_TABLE
        if not results and not quickstart.is_file():
            return
        self.parts.append("<h2>Results</h2>")
        if quickstart.is_file():
            self.parts.append(_quickstart_tables(self.folder))
        rows = []
        for path in results:
            result = _read(path)
            metrics = result["metrics"]
            cells = "".join(
                f'<td class="n">{_e(metric_text(result, m))}</td>' if m in metrics else "<td></td>"
                for m in METRIC_COLUMNS
            )
            stale = [
                x
                for c in made
                if path.resolve() in {r.resolve() for r in c.results}
                for x in c.not_as_recorded()
            ]
            flag = (
                f"its chain is not as recorded ({'; '.join(dict.fromkeys(stale))}): see Provenance"
                if stale
                else ""
            )
            note = "; ".join(x for x in (result["small_test_set"], flag) if x)
            rows.append(
                f"<tr><td>{_e(self._rel(path))}</td><td>{_e(result['kind'])}</td><td>{_e(result['stream'])}"
                f'</td><td>{_e(result["split"])}</td><td class="n">{result["counts"]["videos"]}</td>{cells}'
                f"<td{' class=missing' if stale else ''}>{_e(note)}</td></tr>"
            )
        if rows:
            head = "".join(
                f"<th>{_e(m)}</th>"
                for m in ("results file", "kind", "stream", "split", "test videos", *METRIC_COLUMNS, "note")
            )
            self.parts.append(
                "<h3>Every results file (percent, with its 95 % interval)</h3>"
                f"<table><tr>{head}</tr>{''.join(rows)}</table>"
                f'<p class="note">n/a: a metric that cannot mean anything (R@k of a gallery of k videos or '
                "fewer, top-k of k classes or fewer).</p>"
            )

    def runs(self, runs: list[Path]) -> None:
        if not runs:
            return
        self.parts.append("<h2>Training</h2>")
        for run in runs:
            drawn = self._draw(
                self._rel(run), lambda run=run: [run_curves(run, self.out / f"{self._slug(run)}-curves.png")]
            )
            self.parts += [
                self._figure(
                    p,
                    f"{self._rel(run)}: loss, pretext accuracy, kNN R@1 and learning rate "
                    "against the step; the dashed line is best.pt, the dotted ones each loss at chance, the dash-dotted ones the kNN R@1 of the baselines",
                )
                for p in drawn
            ]
            records = read_metrics(run)
            monitor, worse = monitor_summary(records)
            if monitor:
                self.parts.append(f"<p>{_e(self._rel(run))}: {_e(monitor)}</p>")
            for warning in (chance_summary(records), worse):
                if warning:
                    self.parts.append(f'<p class="missing">{_e(self._rel(run))}: {_e(warning)}</p>')

    def _legend(self) -> None:
        """The colour wheel's legend, after the first picture of flow."""
        if not self.legend_shown:
            self.legend_shown = True
            self.parts.append(
                self._figure(
                    flow_legend(self.out),
                    "how flow is coloured: direction as hue, speed as "
                    "saturation; each picture states its scale",
                )
            )

    def clips(self, shards: list[Path], archives: list[Path]) -> None:
        if not shards and not archives:
            return
        self.parts.append("<h2>Sample clips</h2>")
        for root in shards:
            for stream in STREAMS:
                splits = sorted(
                    p.stem.removeprefix("manifest-") for p in (root / stream).glob("manifest-*.json")
                )
                if not splits:
                    continue
                split = "train" if "train" in splits else splits[0]
                drawn = self._draw(
                    f"{self._rel(root)} {stream}",
                    lambda r=root, s=stream, sp=split: draw_samples(
                        r, s, sp, self.out / self._slug(r), self.options, legend=False
                    ),
                )
                self.parts += [
                    self._figure(
                        p,
                        f"{self._rel(root)}: a {stream} {split} sample as stored, as the model "
                        "reads it: blocks in rows",
                    )
                    for p in drawn
                ]
                if drawn and stream == FLOW:
                    self._legend()
        for root in archives:
            videos = archive_candidates(root / STREAMS[0]) or archive_candidates(root / STREAMS[1])
            spread = np.linspace(0, len(videos) - 1, min(VIDEOS, len(videos))).astype(int)
            picks = [a for a in sorted({videos[i] for i in spread}) if is_archive(a)]  # only these opened
            for archive in picks:
                drawn = self._draw(
                    self._rel(archive),
                    lambda a=archive, r=root: draw_archive(
                        a, self.out / self._slug(r), self.options, legend=False
                    ),
                )
                self.parts += [
                    self._figure(
                        p,
                        f"{self._rel(archive)}: "
                        f"{'every frame, RGB beside flow' if p.suffix == '.gif' else 'contact sheet'}",
                    )
                    for p in drawn
                ]
                if drawn and (root / FLOW / archive.name).is_file():
                    self._legend()

    def _results_of(self, results: list[Path], kinds: tuple[str, ...]) -> Iterator[tuple[Path, dict]]:
        for path in results:
            result = _read(path)
            if result["kind"] in kinds:
                yield path, result

    def retrieval(self, results: list[Path]) -> None:
        chosen = list(self._results_of(results, RETRIEVAL_KINDS))
        if not chosen:
            return
        self.parts.append(
            '<h2>Retrieval</h2><p class="note">Each row: a test video (query) and its three nearest '
            "training videos, one frame per block of their first window; green: the same class.</p>"
        )
        for path, result in chosen:
            streams = [s for s in STREAMS if s in result["stream"].split("+")]
            drawn = self._draw(
                self._rel(path),
                lambda p=path, s=streams: draw_result(
                    p, self.out / self._slug(p.parent), self.options, streams=s, legend=False
                ),
            )
            for picture in drawn:
                stream = picture.stem.rsplit("-", 1)[-1]
                self.parts.append(
                    self._figure(
                        picture,
                        f"{self._rel(path)} (R@1 {metric_text(result, 'R@1')}): {stream} frames",
                        wide=True,
                    )
                )
                if stream == FLOW:
                    self._legend()

    def confusion(self, results: list[Path]) -> None:
        chosen = list(self._results_of(results, CLASSIFIER_KINDS))
        if not chosen:
            return
        self.parts.append(
            '<h2>Confusion matrices</h2><p class="note">Rows: the true class, normalised per row; '
            "columns: the predicted one.</p>"
        )
        for path, result in chosen:
            drawn = self._draw(
                self._rel(path), lambda p=path: draw_result(p, self.out / self._slug(p.parent), self.options)
            )
            top1 = metric_text(result, "top1")
            self.parts += [self._figure(p, f"{self._rel(path)} (top-1 {top1})") for p in drawn]

    def html(self) -> str:
        body = "\n".join(self.parts)
        return (
            f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="data:,"><title>memdpc report: {_e(self.folder.resolve().name)}</title>'
            f"<style>{_STYLE}</style></head>\n<body>\n{body}\n</body></html>\n"
        )


def _read(path: Path) -> dict[str, Any]:
    """A results file's JSON alone (its arrays may be large); one written before the scores (schema 1) is read
    with its arrays, which its scores are computed from."""
    result = json.loads(path.read_text())
    return result if "intervals" in result else load_result(path)[0]


def _html_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    cols = list(rows[0])
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{_e(cell_text(r[c]))}</td>'
            if isinstance(r[c], int | float | list) or r[c] is None
            else f"<td>{_e(r[c])}</td>"
            for c in cols
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _quickstart_tables(folder: Path) -> str:
    """The quickstart's table, the line under it in its Markdown (what one video is worth), its pretext table
    and MemDPC's comparison with each baseline."""
    rows = json.loads((folder / file_kinds.QUICKSTART_TABLE).read_text())
    if not rows:
        return ""
    markdown = folder / file_kinds.QUICKSTART_MARKDOWN
    lines = markdown.read_text().splitlines() if markdown.is_file() else []
    note = next((line for line in lines if line.strip() and not line.startswith("|")), "")
    html = (
        "<h3>The quickstart's table (percent, 95 % intervals)</h3>"
        f'{_html_table(rows)}<p class="note">{_e(note)}</p>'
    )
    pretext = folder / file_kinds.QUICKSTART_PRETEXT
    if pretext.is_file():
        html += f"<h3>{_e(file_kinds.QUICKSTART_PRETEXT_TITLE)} (top-1 in percent)</h3>" + _html_table(
            json.loads(pretext.read_text())
        )
    compared = folder / file_kinds.QUICKSTART_COMPARE
    if compared.is_file():
        comparison = json.loads(compared.read_text())
        html += (
            f"<h3>{_e(file_kinds.QUICKSTART_COMPARE_TITLE)} (percentage points)</h3>"
            f"{_html_table(comparison['comparisons'])}<p>{_e(comparison['summary'])}</p>"
        )
    return html
