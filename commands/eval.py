"""``memdpc eval``: retrieval, probes, finetuning, scoring a classifier and Oops on a checkpoint, late fusion
of two results (``eval fuse``, or ``eval --fuse`` as the design card has it) and their paired comparison
(``eval compare``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from memdpc.commands.options import config_options, stack, take
from memdpc.common import interrupts
from memdpc.common.console import rich_console
from memdpc.common.settings import flat, from_flat, names_of
from memdpc.eval.data import EvalData
from memdpc.eval.fit import FINETUNE_FIT, OOPS_FIT, PROBE_FIT, FitConfig
from memdpc.eval.options import (
    CompareOptions,
    Crops,
    EvalOutput,
    FinetuneOptions,
    FuseFiles,
    FuseOptions,
    OopsOptions,
    ProbeOptions,
    RecipeEval,
    RetrieveOptions,
)
from memdpc.recipes.merge import given_over
from memdpc.recipes.recipe import eval_settings, resolve

__all__ = ["command"]


@click.group("eval", invoke_without_command=True)
@config_options(FuseFiles)
@config_options(FuseOptions)
@click.pass_context
def command(ctx: click.Context, fuse_paths, **fuse) -> None:
    """Evaluate a checkpoint (trained or converted): retrieval, probes, finetuning, Oops, scoring a classifier;
    late fusion with --fuse.

    Every subcommand also runs under torchrun (each window is read by one rank; rank 0 writes the results).
    """
    if fuse_paths:
        _fuse(*fuse_paths, **fuse)
    elif fuse["out"] is not None or fuse["overwrite"]:
        raise click.UsageError(
            "--out and --overwrite before the verb go with --fuse; give a verb's own after it, e.g. "
            "memdpc eval retrieve CHECKPOINT --shards SHARDS --out EVAL_DIR"
        )
    elif ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


def _fuse(result_a: Path, result_b: Path, **fuse) -> None:
    with interrupts.deferred():  # a signal during the imports (torch, DALI, Triton) is raised after them
        from memdpc.eval.run import fuse as run_fuse
        from memdpc.report.tables import print_result

    print_result(
        run_fuse(result_a, result_b, **flat(from_flat(FuseOptions, fuse, "options"))), rich_console()
    )


def _task(task: str, *own: tuple[type, Any], recipe: bool = True):
    """The command of one evaluation task: CHECKPOINT, the data's and the output's settings, then the task's own
    (each class with its defaults); with ``recipe``, ``--config RECIPE`` fills what the command line leaves out
    (:func:`memdpc.recipes.merge.given_over`). It evaluates and prints the results' table."""
    configs = (EvalData, EvalOutput, *(config for config, _ in own))

    def run_task(**kw: Any) -> None:
        name = kw.pop("config_file", None)
        if name is not None:
            where = f"{resolve(name)}: eval"
            kw = given_over(click.get_current_context(), kw, eval_settings(name, task), where, *configs)
        checkpoint = kw.pop("checkpoint")
        options = {k: kw.pop(k) for k in names_of(EvalData) if k in kw} | flat(
            from_flat(EvalOutput, take(EvalOutput, kw))
        )
        fit = take(FitConfig, kw)
        for config, _ in own:
            if config is not FitConfig:
                options |= flat(from_flat(config, take(config, kw), "options"))
        if "linear" in options:  # the probe's --linear/--mlp
            options["head"] = "linear" if options.pop("linear") else "mlp"
        with interrupts.deferred():  # a signal during the imports (torch, DALI, Triton) is raised after them
            from memdpc.eval.run import evaluate
            from memdpc.report.tables import print_result

        path = evaluate(task, checkpoint, fit=fit or None, **options)
        if path is not None:  # rank 0
            print_result(path, rich_console())

    decorators = [click.argument("checkpoint", type=click.Path(path_type=Path))]
    if recipe:
        decorators.insert(
            0,
            config_options(RecipeEval),
        )
    decorators += [config_options(EvalData), config_options(EvalOutput)]
    decorators += [config_options(config, defaults=defaults) for config, defaults in own]

    def register(fn):
        run_task.__doc__ = fn.__doc__
        return command.command(task)(stack(*decorators)(run_task))

    return register


@_task("retrieve", (RetrieveOptions, None))
def eval_retrieve() -> None:
    """Nearest-neighbour retrieval: test videos query train videos; R@1/5/10/20/50."""


@_task("probe", (ProbeOptions, None), (FitConfig, PROBE_FIT))
def eval_probe() -> None:
    """Linear / MLP probe on frozen, cached features; video-level top-1/top-5."""


@_task("finetune", (FinetuneOptions, None), (FitConfig, FINETUNE_FIT))
def eval_finetune() -> None:
    """End-to-end finetuning (Adam 1e-3, wd 1e-3, dropout 0.9, plateau decay); resumable."""


@_task("classify", (Crops, None), recipe=False)
def eval_classify() -> None:
    """Score a finetuned classifier as it is (e.g. a converted reference LC checkpoint); video-level top-1/top-5."""


@_task("oops", (OopsOptions, None), (FitConfig, OOPS_FIT), recipe=False)
def eval_oops() -> None:
    """Unintentional actions: per time step z_t ⊕ ẑ_t → intentional / transitional / unintentional."""


@command.command("fuse")
@click.argument("result_a", type=click.Path(path_type=Path))
@click.argument("result_b", type=click.Path(path_type=Path))
@config_options(FuseOptions)
def eval_fuse(result_a: Path, result_b: Path, **fuse) -> None:
    """Late fusion of two results (RGB and flow): mean probabilities or summed similarities."""
    _fuse(result_a, result_b, **fuse)


@command.command("compare")
@click.argument("result_a", type=click.Path(path_type=Path))
@click.argument("result_b", type=click.Path(path_type=Path))
@config_options(CompareOptions)
def eval_compare(result_a: Path, result_b: Path, out: Path | None) -> None:
    """Does A beat B on the same test videos? Per metric: A − B, its 95 % interval and a paired test
    (McNemar for top-k and R@k, paired bootstrap otherwise); refused when they are not on the same videos."""
    with interrupts.deferred():  # a signal during the imports (torch) is raised after them
        from memdpc.eval.compare import write_comparison
        from memdpc.report.tables import print_comparison

    print_comparison(write_comparison(result_a, result_b, out), rich_console(), out)
