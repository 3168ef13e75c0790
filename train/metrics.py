"""Training metrics: a running meter, and a logger writing JSONL + TensorBoard + a rich progress display.

Only rank 0 writes. Each record has ``kind`` (``train``, ``val`` or ``knn``), ``epoch`` and ``step``; train
records carry the loss, contrastive top-1/top-5 (overall and per direction ``_f``/``_b``), the encoder
features' ``content_share`` (:func:`memdpc.model.loss.content_share`; val records too), ``lr``,
``clips_per_s`` (all ranks) and ``data_wait`` (fraction of wall time spent waiting for the loader).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from memdpc.atomic import write_bytes_atomic
from memdpc.progress import progress_bar


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


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Drop records written after ``max_step`` (they will be recomputed by a resumed run)."""
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
        self.path = run_dir / "metrics.jsonl"
        self._file = self._tb = self._progress = None
        self._task = None
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        self._file = open(self.path, "a")  # noqa: SIM115 — closed in close()
        self._tb = SummaryWriter(str(run_dir / "tb"))
        if progress:
            self._progress = progress_bar("{task.fields[info]}", bold=True)
            self._progress.start()

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        kind, step = record["kind"], record["step"]
        for k, v in record.items():
            if k not in ("kind", "step", "epoch") and isinstance(v, int | float):
                self._tb.add_scalar(f"{kind}/{k}", v, step)

    def start_epoch(self, epoch: int, total: int, done: int) -> None:
        if self._progress is None:
            return
        if self._task is not None:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(f"epoch {epoch}", total=total, completed=done, info="")

    def advance(self, info: str | None = None) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, **({"info": info} if info is not None else {}))

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._progress is not None:
            self._progress.console.print(text)
        else:
            Console(stderr=True).print(text)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._file is not None:
            self._file.close()
            self._file = None
