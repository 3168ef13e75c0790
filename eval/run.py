"""The entry points behind ``memdpc eval …``: process-group setup and the task; they return the results file
(the command line prints its table, :func:`memdpc.report.tables.print_result`).

Every task runs alone or under ``torchrun`` (each rank reads its own shards; rank 0 gathers, scores and
writes the results).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from memdpc.common import distenv as dd
from memdpc.common import file_kinds, interrupts
from memdpc.common.errors import ResourceFault, UserError
from memdpc.common.settings import from_flat, names_of
from memdpc.eval.classify import run_classify
from memdpc.eval.data import EvalData
from memdpc.eval.finetune import run_finetune
from memdpc.eval.fit import FINETUNE_FIT, OOPS_FIT, PROBE_FIT, fit_config
from memdpc.eval.fusion import fuse_results
from memdpc.eval.oops import run_oops
from memdpc.eval.outputs import Outputs
from memdpc.eval.pretrained import default_size
from memdpc.eval.probe import run_probe
from memdpc.eval.results import save_result
from memdpc.eval.retrieval import run_retrieval
from memdpc.model.checkpoint import open_checkpoint

__all__ = ["evaluate", "fuse"]


RUNNERS = {
    "retrieve": run_retrieval,
    "probe": run_probe,
    "finetune": run_finetune,
    "classify": run_classify,
    "oops": run_oops,
}


def _runner(task: str):
    if task not in RUNNERS:
        raise UserError(f"unknown evaluation task {task!r}; choose one of {', '.join(RUNNERS)}")
    return RUNNERS[task]


def evaluate(
    task: str,
    checkpoint: str | os.PathLike,
    *,
    out: str | os.PathLike,
    fit: dict[str, Any] | None = None,
    overwrite: bool = False,
    **options: Any,
) -> Path | None:
    """Run one evaluation task (``retrieve``, ``probe``, ``finetune``, ``oops``, ``classify``); rank 0 writes
    its results file, which lists every file the task wrote (:mod:`memdpc.eval.outputs`).

    ``options``: :class:`EvalData`'s settings by name (``shards``, ``stream``, ``size``, ``batch_size``,
    ``device``, …), then the task's own (e.g. ``crops``, ``head``). ``size`` None (the default) takes the size
    the checkpoint was trained at (128 when unknown). ``fit`` overrides :class:`FitConfig` fields for the tasks
    that train a head. Results in ``out`` of another checkpoint are refused unless ``overwrite`` (which also
    starts an unfinished finetuning of other settings over). An interrupt says what was kept (feature caches,
    the finetune state and its epoch) before it propagates, and so does a
    :class:`~memdpc.common.errors.ResourceFault` (a full disk: every file is written atomically, so none is
    half-written).
    Returns the results path on rank 0, None elsewhere.
    """
    runner = _runner(task)
    ckpt = open_checkpoint(checkpoint)  # read once, handed down to the task, its model and its results
    given = {k: options.pop(k) for k in names_of(EvalData) if k in options}
    if given.get("size") is None:
        given["size"] = default_size(ckpt.content)
    data = from_flat(EvalData, given, "evaluate")
    task_kw = options
    if fit is not None:  # a network trained end to end takes the loader's batch; a head, its own
        whole = task == "finetune" or (task == "oops" and task_kw.get("mode") == "finetune")
        base = {"finetune": FINETUNE_FIT, "oops": OOPS_FIT}.get(task, PROBE_FIT)
        if whole:
            base = replace(base, batch_size=data.loader.batch_size)
        task_kw["fit"] = fit_config(base, **fit)
    outputs = Outputs(Path(out), ckpt, overwrite)
    env = dd.setup(
        data.loader.device
    )  # ``out`` appears with the first file written (a refused checkpoint leaves none)
    finished = False
    try:
        path = runner(ckpt, data, outputs, env, **task_kw)
        finished = True
    except KeyboardInterrupt as e:
        stop = interrupts.as_interrupted(e)
        for note in outputs.kept():
            stop.keep(note)
        raise stop from None
    except ResourceFault as fault:  # a full disk (atomic writes: nothing half-written), a worker killed
        for note in outputs.kept(fault.remedy):
            fault.keep(note)
        raise
    finally:
        dd.cleanup(env, finished)
    return path


def fuse(
    result_a: str | os.PathLike,
    result_b: str | os.PathLike,
    out: str | os.PathLike | None = None,
    weights: tuple[float, float] = (1.0, 1.0),
    overwrite: bool = False,
    choose_weights: bool = False,
) -> Path:
    """Late fusion of two results files (see :mod:`memdpc.eval.fusion`); writes the result and returns its path.
    ``choose_weights``: retrieval's weights chosen on the training videos instead of ``weights``.

    ``out`` may hold the same fusion (the same inputs and weights: written again); other results there are
    refused unless ``overwrite``, and an input never is ``out``."""
    result, arrays = fuse_results(result_a, result_b, weights, choose=choose_weights)
    out = (
        Path(out)
        if out is not None
        else Path(result_a).with_name(f"{result['kind']}-{result['stream']}.json")
    )
    if out.resolve() in {Path(p).resolve() for p in (result_a, result_b)}:
        raise UserError(f"{out}: is one of the results being fused; give another --out")
    if out.exists() and not overwrite and _recorded_config(out) != result["config"]:
        raise UserError(
            f"{out}: holds other results ({file_kinds.describe(out)}, not this fusion of "
            f"{result_a} and {result_b}); add --overwrite to replace them, or give another --out"
        )
    return save_result(out, result, arrays)


def _recorded_config(path: Path) -> Any:
    """The ``config`` a results file records (None for anything else)."""
    try:
        return json.loads(path.read_text()).get("config")
    except (OSError, ValueError, AttributeError):
        return None
