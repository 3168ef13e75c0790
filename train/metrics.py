"""Training metrics: a running meter, and a logger writing JSONL + TensorBoard + a rich progress display.

Only rank 0 writes. Beside the scalars, TensorBoard gets a few clips of a batch as images once per epoch
(:meth:`MetricsLogger.clips`: as trained on, after augmentation; flow in colour). Each record has ``kind`` (``train``, ``val``,
``knn`` or :data:`KNN_BASELINE`), ``epoch`` and ``step``; train
records carry the loss, contrastive top-1/top-5 (overall and per direction ``_f``/``_b``), the encoder
features' ``content_share`` (:func:`memdpc.model.loss.content_share`; val records too), ``lr``,
``clips_per_s`` (all ranks) and ``data_wait`` (fraction of wall time spent waiting for the loader).

The model's values stay on the device until they are read (:class:`StepValues`): reading a CUDA tensor makes
the host wait for the GPU, and doing that once per step keeps the GPU idle while the host prepares the next.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.tensorboard import SummaryWriter

from memdpc.common import file_kinds
from memdpc.common.atomic import write_bytes_atomic
from memdpc.common.console import rich_console
from memdpc.common.errors import output_faults
from memdpc.common.progress import LogLines, progress_bar
from memdpc.pipeline.augment import AugmentSpec, denormalise
from memdpc.viz.pictures import clip_picture

__all__ = [
    "CHANCE_MARGIN",
    "DATA_BN",
    "KNN_BASELINE",
    "METRICS_NAME",
    "TB_NAME",
    "Meter",
    "MetricsLogger",
    "StepValues",
    "at_chance",
    "chance_note",
    "chance_summary",
    "monitor_summary",
    "read_metrics",
    "truncate_jsonl",
]

METRICS_NAME = file_kinds.RUN_METRICS
"""The run folder's metrics file: one JSON record per line."""
TB_NAME = "tb"  # the run folder's TensorBoard logs
KNN_BASELINE = "knn_baseline"
"""The kind of the record, at step 0, of the kNN monitor's R@1 of a baseline that training must beat besides the
untrained encoder (whose R@1 is the first ``knn`` record's): its ``baseline`` names it."""
DATA_BN = "data_bn"  # that baseline: the untrained encoder with the training clips' BatchNorm statistics
CLIPS_SHOWN = 2  # clips of a batch that :meth:`MetricsLogger.clips` draws
CHANCE_MARGIN = 0.01
"""A loss within this fraction of its chance level (the loss of a uniform guess, a record's ``chance``) is at
chance: the model has learnt nothing the loss can see."""


def at_chance(record: dict[str, Any]) -> bool:
    """Whether a train or val record's loss is within :data:`CHANCE_MARGIN` of its ``chance`` (one candidate:
    chance 0, and a loss of 0 means nothing either; records written before the model gave its chance: never)."""
    chance, loss = record.get("chance"), record.get("loss")
    if not isinstance(chance, int | float) or not isinstance(loss, int | float) or not chance >= 0:
        return False
    return abs(loss - chance) <= CHANCE_MARGIN * chance


def chance_note(chance: float) -> str:
    """What a loss at chance means, for the messages that flag it."""
    return (
        f"at chance: within {CHANCE_MARGIN:.0%} of {chance:.4f}, the loss of a uniform guess among the batch's "
        "candidates (ln of their number, summed over directions): nothing learnt"
    )


def chance_summary(records: list[dict[str, Any]]) -> str | None:
    """The validation epochs of a run's records whose loss was at chance, in words, when any was (the run's
    summary and the report say it)."""
    val = [r for r in records if r["kind"] == "val"]
    flat = [r for r in val if at_chance(r)]
    if not flat:
        return None
    which = f"every epoch ({len(val)})" if len(flat) == len(val) else f"{len(flat)} of {len(val)} epochs"
    return f"the val loss was {chance_note(flat[-1]['chance'])}, in {which}"


def monitor_summary(records: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """What the kNN monitor saw over a run, from its records: a line with its R@1 on the untrained encoder (step
    0), the :data:`DATA_BN` baseline, and the trained epochs' best and last; and a warning where the last is below
    the untrained encoder's, naming the step from which every value stayed below it. (None, None) without a
    monitor or a trained epoch."""
    knn = [r for r in records if r["kind"] == "knn"]
    if len(knn) < 2 or knn[0]["step"] != 0:
        return None, None
    untrained, trained = knn[0]["r1"], knn[1:]
    best = max(trained, key=lambda r: r["r1"])  # the first of equals, as --best-by knn keeps it
    last = trained[-1]
    bn = [r["r1"] for r in records if r["kind"] == KNN_BASELINE and r.get("baseline") == DATA_BN]
    line = (
        f"kNN monitor R@1: untrained {untrained:.3f}"
        + (f", untrained with the data's BatchNorm statistics {bn[0]:.3f}" if bn else "")
        + f"; trained: best {best['r1']:.3f} (epoch {best['epoch']}), last {last['r1']:.3f} (epoch {last['epoch']})"
    )
    if not last["r1"] < untrained:
        return line, None
    since = last
    for r in reversed(trained):
        if not r["r1"] < untrained:
            break
        since = r
    warning = (
        f"the kNN monitor's last R@1 ({last['r1']:.3f}) is below the untrained encoder's ({untrained:.3f}), and has "
        f"been since step {since['step']} (epoch {since['epoch']}): pretraining made the features worse at telling "
        "the validation videos' classes apart (--best-by knn keeps the epoch the monitor liked best)"
    )
    return line, warning


class Meter:
    """Averages the model's scalar outputs over a logging window and times data wait vs total wall time."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, float] = {}
        self.steps = 0
        self.clips = 0
        self.wait = 0.0
        self.start = time.perf_counter()

    def add(self, values: dict[str, float], clips: int, wait: float) -> None:
        for k, v in values.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
        self.steps += 1
        self.clips += clips
        self.wait += wait

    def means(self) -> dict[str, float]:
        return {k: v / max(self.steps, 1) for k, v in self.sums.items()}

    def rates(self, world_size: int) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        return {"clips_per_s": self.clips * world_size / elapsed, "data_wait": min(self.wait / elapsed, 1.0)}


class StepValues:
    """The scalar outputs of the steps since the last :meth:`read`, one float64 row per step on the model's
    device, with each step's clip count and data wait (host numbers) beside them.

    A row holds the exact float64 value of each output, so the host sums over :meth:`read`'s rows, taken in
    step order, equal those of reading every step with ``float()`` bit for bit. ``capacity`` is the most steps
    between two reads (``--log-every``: the loop reads at least that often).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.keys: list[str] = []
        self.rows: torch.Tensor | None = None
        self.host: list[tuple[int, float]] = []

    def add(self, out: dict[str, torch.Tensor], clips: int, wait: float) -> None:
        """Keep one step's scalar outputs on their device (two small kernels, no wait for the device)."""
        scalars = [v.detach() for v in out.values() if v.dim() == 0]
        if self.rows is None:
            self.keys = [k for k, v in out.items() if v.dim() == 0]
            self.rows = torch.empty(
                self.capacity, len(self.keys), dtype=torch.float64, device=scalars[0].device
            )
        self.rows[len(self.host)].copy_(torch.stack(scalars))
        self.host.append((clips, wait))

    def read(self) -> list[tuple[dict[str, float], int, float]]:
        """(values, clips, data wait) of each step since the last read, in step order; one device→host copy."""
        rows = self.rows[: len(self.host)].tolist() if self.host else []
        done = [
            (dict(zip(self.keys, row, strict=True)), clips, wait)
            for row, (clips, wait) in zip(rows, self.host, strict=True)
        ]
        self.host = []
        return done


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Drop records written after ``max_step`` (they will be recomputed by a resumed run; −1 drops all)."""
    if not path.exists():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and _step(ln) <= max_step]
    write_bytes_atomic(path, "".join(ln + "\n" for ln in keep).encode())


def _step(line: str) -> float:
    try:
        return json.loads(line).get("step", math.inf)
    except json.JSONDecodeError:  # a line cut by a kill
        return math.inf


class MetricsLogger:
    """JSONL + TensorBoard + rich progress for rank 0; a silent no-op on other ranks."""

    def __init__(self, run_dir: Path, enabled: bool, progress: bool) -> None:
        self.enabled = enabled
        self.path = run_dir / METRICS_NAME
        self._file = self._tb = self._progress = None
        self._task = None
        if not enabled:
            return
        self._tb_dir = run_dir / TB_NAME
        with output_faults(self.path):
            self._file = open(self.path, "a")  # noqa: SIM115 — closed in close()
        with output_faults(self._tb_dir / "events"):
            self._tb = SummaryWriter(str(self._tb_dir))
        self._excepthook = threading.excepthook
        threading.excepthook = self._writer_thread_failed
        if progress:
            self._progress = progress_bar("{task.fields[info]}", bold=True)
            self._progress.start()

    def log(self, record: dict[str, Any]) -> None:
        """Append ``record`` to the JSONL file and its numbers to TensorBoard; a full disk (or the like) raises
        :class:`~memdpc.common.errors.ResourceFault` (a line it cut is dropped by the resumed run)."""
        if not self.enabled:
            return
        with output_faults(self.path):
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        kind, step = record["kind"], record["step"]
        with output_faults(self._tb_dir / "events"):  # the writer's thread's error comes out here
            for k, v in record.items():
                if k not in ("kind", "step", "epoch") and isinstance(v, int | float):
                    self._tb.add_scalar(f"{kind}/{k}", v, step)

    def clips(self, clips: torch.Tensor, keys: list[str], spec: AugmentSpec, stream: str, step: int) -> None:
        """The first :data:`CLIPS_SHOWN` clips of a batch (normalised (B, N, 3, SL, H, W), on any device) as
        TensorBoard images ``clips/<i>``: blocks in rows, flow in colour, the key in the caption."""
        if not self.enabled:
            return
        frames = denormalise(
            clips[:CLIPS_SHOWN].detach().float().cpu(), spec
        ).numpy()  # (k, F, H, W, 3) uint8
        for i, clip in enumerate(frames):
            title = [f"{keys[i]}: {stream}, step {step}, as trained on (augmented)"]
            with output_faults(self._tb_dir / "events"):
                self._tb.add_image(
                    f"clips/{i}", clip_picture(clip, stream, clips.shape[1], title), step, dataformats="HWC"
                )

    def start_epoch(self, epoch: int, total: int, done: int) -> None:
        if self._progress is None:
            return
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(f"epoch {epoch}", total=total, completed=done, info="")

    def advance(self, info: str | None = None) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, **({"info": info} if info is not None else {}))

    def message(self, text: str, markup: bool = True) -> None:
        """Print a line (or lines) above the progress display; ``markup=False`` for text holding paths."""
        if not self.enabled:
            return
        if isinstance(self._progress, LogLines):  # the epoch's last count before what follows it
            self._progress.settle()
        console = self._progress.console if self._progress is not None else rich_console(stderr=True)
        console.print(text, markup=markup, soft_wrap=True)

    def _writer_thread_failed(self, args: threading.ExceptHookArgs) -> None:
        """TensorBoard's writer thread dies of a full disk (or the like) with a traceback of its own; its error
        comes out at the logger's next write as a ResourceFault, so the thread's traceback is not printed."""
        if not (args.thread is not None and type(args.thread).__name__ == "_AsyncWriterThread"):
            self._excepthook(args)
        elif not isinstance(args.exc_value, OSError):
            self._excepthook(args)

    def close(self) -> None:
        """Stop the display and close the files (all of them, also when one fails: a full disk raises
        :class:`~memdpc.common.errors.ResourceFault` after)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        tb, file, self._tb, self._file = self._tb, self._file, None, None
        try:
            if tb is not None:
                with output_faults(self._tb_dir / "events"):
                    tb.close()
        finally:
            if tb is not None:
                threading.excepthook = self._excepthook
            if file is not None:
                with output_faults(self.path):
                    file.close()


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl`` (a line cut by a kill is left out)."""
    path = run / METRICS_NAME
    records = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "kind" in record and "step" in record:
            records.append(record)
    return records
