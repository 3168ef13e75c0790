"""``memdpc eval``: retrieval, probes, finetuning, scoring a classifier and Oops on a checkpoint, late fusion
of two results (``eval fuse``, or ``eval --fuse`` as the design card has it) and their paired comparison
(``eval compare``)."""

from __future__ import annotations

import functools
from pathlib import Path

import click
from click.core import ParameterSource

from memdpc.commands.options import OUT_DIR, config_options, stack, take
from memdpc.common import interrupts
from memdpc.common.console import rich_console
from memdpc.common.errors import UserError
from memdpc.eval.data import EvalData
from memdpc.eval.fit import (
    FINETUNE_DROPOUT,
    FINETUNE_FIT,
    OOPS_FIT,
    OOPS_MODES,
    PROBE_DROPOUT,
    PROBE_FIT,
    RETRIEVAL_CHUNK,
    FitConfig,
)
from memdpc.pipeline.clip import EVAL_CROPS
from memdpc.recipes.recipe import eval_settings, resolve

__all__ = ["eval_group"]

_WEIGHTS = click.option(
    "--weights", nargs=2, type=float, default=(1.0, 1.0), show_default=True, help="Weights of A and B."
)


@click.group(invoke_without_command=True)
@click.option(
    "--fuse",
    "fuse_paths",
    nargs=2,
    type=click.Path(path_type=Path),
    default=None,
    metavar="RGB_RESULT FLOW_RESULT",
    help="Late fusion of two results files (same as `eval fuse`).",
)
@click.option(
    "--weights",
    nargs=2,
    type=float,
    default=(1.0, 1.0),
    show_default=True,
    help="With --fuse: weights of the two results.",
)
@click.option(
    "--out",
    "--fuse-out",
    "out",
    type=click.Path(path_type=Path),
    default=None,
    help="With --fuse: results file to write (default: beside the first input).",
)
@click.option("--overwrite", is_flag=True, help="With --fuse: replace other results at --out.")
@click.pass_context
def eval_group(ctx: click.Context, fuse_paths, weights, out, overwrite) -> None:
    """Evaluate a checkpoint (trained or converted): retrieval, probes, finetuning, Oops, scoring a classifier;
    late fusion with --fuse.

    Every subcommand also runs under torchrun (each window is read by one rank; rank 0 writes the results).
    """
    if fuse_paths:
        _fuse(*fuse_paths, out=out, weights=weights, overwrite=overwrite)
    elif out is not None or overwrite:
        raise click.UsageError(
            "--out and --overwrite before the verb go with --fuse; give a verb's own after it, e.g. "
            "memdpc eval retrieve CHECKPOINT --shards SHARDS --out EVAL_DIR"
        )
    elif ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


def _evaluate(task: str, checkpoint: Path, **kw) -> None:
    with interrupts.deferred():  # a signal during the imports (torch, DALI, Triton) is raised after them
        from memdpc.eval.run import evaluate
        from memdpc.report.tables import print_result

    path = evaluate(task, checkpoint, **kw)
    if path is not None:  # rank 0
        print_result(path, rich_console())


def _fuse(result_a: Path, result_b: Path, **kw) -> None:
    with interrupts.deferred():  # a signal during the imports (torch, DALI, Triton) is raised after them
        from memdpc.eval.run import fuse
        from memdpc.report.tables import print_result

    print_result(fuse(result_a, result_b, **kw), rich_console())


_eval_options = stack(  # every task's
    click.argument("checkpoint", type=click.Path(path_type=Path)),
    click.option(
        "--out", type=OUT_DIR, required=True, help="Folder for results JSON/npz, feature caches and plots."
    ),
    config_options(EvalData),
    click.option(
        "--device",
        type=click.Choice(["auto", "cpu", "cuda"]),
        default="auto",
        show_default=True,
        help="Where the model runs.",
    ),
    click.option("--plot", is_flag=True, help="Also write PNG figures."),
    click.option(
        "--overwrite",
        is_flag=True,
        help="Replace results in --out made from another checkpoint (refused otherwise), and start an unfinished "
        "finetuning of other settings over.",
    ),
)
_crops = click.option(
    "--crops",
    type=click.Choice([str(k) for k in EVAL_CROPS]),
    default=str(EVAL_CROPS[0]),
    show_default=True,
    help="Test crops per window.",
)


def _reads_recipe(task: str):
    """A ``--config RECIPE`` option: the recipe's ``eval`` options fill those the command line does not give."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(**kw):
            name = kw.pop("config_file")
            if name is not None:
                kw.update(_recipe_options(click.get_current_context(), task, name))
            return fn(**kw)

        return click.option(
            "--config",
            "config_file",
            default=None,
            metavar="RECIPE",
            help="A recipe (path or short name; `memdpc recipes` lists them) whose eval options are taken where the "
            "command line gives none.",
        )(run)

    return wrap


def _recipe_options(ctx: click.Context, task: str, name: str) -> dict:
    params = {
        p.name: p for p in ctx.command.params if isinstance(p, click.Option) and p.name != "config_file"
    }
    params |= {o.lstrip("-").replace("-", "_"): p for p in params.values() for o in p.opts}
    out = {}
    for key, value in eval_settings(name, task).items():
        if key not in params:
            raise UserError(
                f"{resolve(name)}: eval: memdpc eval {task} has no option --{key.replace('_', '-')}"
            )
        p = params[key]
        if ctx.get_parameter_source(p.name) is ParameterSource.DEFAULT:
            try:
                out[p.name] = p.type_cast_value(
                    ctx, str(value) if isinstance(p.type, click.Choice) else value
                )
            except click.BadParameter as e:
                raise UserError(f"{resolve(name)}: eval: {key}: {e.message}") from None
    return out


def _fit(kw: dict, batch_size: int | None = None) -> dict:
    fit = take(FitConfig, kw)
    if batch_size is not None:
        fit["batch_size"] = batch_size
    return fit


@eval_group.command("retrieve")
@_reads_recipe("retrieve")
@_eval_options
@click.option(
    "--chunk",
    type=click.IntRange(min=1),
    default=RETRIEVAL_CHUNK,
    show_default=True,
    help="Queries per similarity block (memory: chunk × gallery).",
)
def eval_retrieve(checkpoint: Path, **kw) -> None:
    """Nearest-neighbour retrieval: test videos query train videos; R@1/5/10/20/50."""
    _evaluate("retrieve", checkpoint, **kw)


@eval_group.command("probe")
@_reads_recipe("probe")
@_eval_options
@click.option("--linear/--mlp", "linear", default=True, show_default=True, help="Linear or MLP head.")
@_crops
@click.option(
    "--dropout", type=float, default=PROBE_DROPOUT, show_default=True, help="Dropout before the head."
)
@config_options(FitConfig, defaults=PROBE_FIT)
def eval_probe(checkpoint: Path, linear: bool, crops: str, **kw) -> None:
    """Linear / MLP probe on frozen, cached features; video-level top-1/top-5."""
    fit = _fit(kw)
    _evaluate("probe", checkpoint, head="linear" if linear else "mlp", crops=int(crops), fit=fit, **kw)


@eval_group.command("finetune")
@_reads_recipe("finetune")
@_eval_options
@_crops
@click.option(
    "--dropout",
    type=float,
    default=FINETUNE_DROPOUT,
    show_default=True,
    help="Dropout before the last layer.",
)
@click.option(
    "--label-fraction",
    type=float,
    default=1.0,
    show_default=True,
    help="Train on this seeded, stratified fraction of the train videos (e.g. 0.1).",
)
@click.option("--random-init", is_flag=True, help="Same architecture, random weights (baseline).")
@config_options(FitConfig, defaults=FINETUNE_FIT)
def eval_finetune(checkpoint: Path, crops: str, **kw) -> None:
    """End-to-end finetuning (Adam 1e-3, wd 1e-3, dropout 0.9, plateau decay); resumable."""
    fit = _fit(kw, kw["batch_size"])
    _evaluate("finetune", checkpoint, crops=int(crops), fit=fit, **kw)


@eval_group.command("classify")
@_eval_options
@_crops
def eval_classify(checkpoint: Path, crops: str, **kw) -> None:
    """Score a finetuned classifier as it is (e.g. a converted reference LC checkpoint); video-level top-1/top-5."""
    _evaluate("classify", checkpoint, crops=int(crops), **kw)


@eval_group.command("oops")
@_eval_options
@click.option(
    "--index",
    type=click.Path(path_type=Path),
    required=True,
    help="Oops video index (JSONL from `memdpc index --layout oops`) with the failure times.",
)
@click.option(
    "--mode",
    type=click.Choice(OOPS_MODES),
    default=OOPS_MODES[0],
    show_default=True,
    help="Train only the linear layer, or the whole network.",
)
@config_options(FitConfig, defaults=OOPS_FIT)
def eval_oops(checkpoint: Path, **kw) -> None:
    """Unintentional actions: per time step z_t ⊕ ẑ_t → intentional / transitional / unintentional."""
    fit = _fit(kw, kw["batch_size"] if kw["mode"] == "finetune" else None)
    _evaluate("oops", checkpoint, fit=fit, **kw)


@eval_group.command("fuse")
@click.argument("result_a", type=click.Path(path_type=Path))
@click.argument("result_b", type=click.Path(path_type=Path))
@_WEIGHTS
@click.option(
    "--out",
    "--fuse-out",
    "out",
    type=click.Path(path_type=Path),
    default=None,
    help="Results file to write (default: beside A).",
)
@click.option("--overwrite", is_flag=True, help="Replace other results at --out.")
def eval_fuse(result_a: Path, result_b: Path, weights, out: Path | None, overwrite: bool) -> None:
    """Late fusion of two results (RGB and flow): mean probabilities or summed similarities."""
    _fuse(result_a, result_b, out=out, weights=weights, overwrite=overwrite)


@eval_group.command("compare")
@click.argument("result_a", type=click.Path(path_type=Path))
@click.argument("result_b", type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the comparison as JSON here.",
)
def eval_compare(result_a: Path, result_b: Path, out: Path | None) -> None:
    """Does A beat B on the same test videos? Per metric: A − B, its 95 % interval and a paired test
    (McNemar for top-k and R@k, paired bootstrap otherwise); refused when they are not on the same videos."""
    with interrupts.deferred():  # a signal during the imports (torch) is raised after them
        from memdpc.eval.compare import write_comparison
        from memdpc.report.tables import print_comparison

    print_comparison(write_comparison(result_a, result_b, out), rich_console(), out)
