"""``memdpc train``: self-supervised pretraining on one stream's shards."""

from __future__ import annotations

from pathlib import Path

import click

from memdpc.commands.options import config_options
from memdpc.common.console import rich_console
from memdpc.common.errors import UserError
from memdpc.recipes.merge import given_over
from memdpc.train.config import TrainConfig, TrainRun, config_from_dict, read_config_file

__all__ = ["command"]


@click.command("train")
@config_options(TrainRun)
@config_options(TrainConfig, unset=True)
def command(
    config_file: Path | None, init_only: bool, bn_from_data: bool, overwrite: bool, dry_run: bool, **options
) -> None:
    """Self-supervised pretraining on one stream's shards (runs alone, under torchrun or srun).

    Example: memdpc train --stream rgb --shards shards/ --out runs/rgb. A run directory that already holds
    a checkpoint resumes exactly where it stopped, on the shards it was trained on (other shards are refused,
    naming the change; --overwrite starts afresh); --init CHECKPOINT starts a new run from given weights.
    SIGINT (Ctrl-C) and SIGTERM stop it at the next step, with checkpoints/last.pt saved there.
    """
    if config_file:
        ctx = click.get_current_context()
        settings = read_config_file(config_file, options.get("stream"))
        options = given_over(ctx, options, settings, str(config_file), TrainConfig)
    values = {
        k: v for k, v in options.items() if v is not None
    }  # not given here, nor in the file: the default
    config = config_from_dict(values, where=str(config_file or "options"))
    if bn_from_data and not init_only:
        raise UserError(
            "--bn-from-data goes with --init-only (a training run's BatchNorm statistics are the data's)"
        )
    if config.init and "stream" not in values:
        # --stream's default (rgb) would train weights of the other stream with a warning that --stream asked for it
        raise UserError(f"--init {config.init}: say which stream the run trains on (--stream rgb|flow)")
    if overwrite and init_only:
        raise UserError(
            "--overwrite starts a training run afresh; --init-only writes one checkpoint: give one of them"
        )
    if dry_run:
        if init_only:
            raise UserError(
                "--dry-run plans a training run; --init-only writes one checkpoint and needs no plan"
            )
        from memdpc.train.dry_run import plan_run

        plan = plan_run(config, overwrite)
        if plan is not None:  # rank 0
            rich_console().print("\n".join(plan.lines()), markup=False, soft_wrap=True)
        return
    if init_only:
        from memdpc.train.checkpoint import next_command, write_initial_checkpoint

        path = write_initial_checkpoint(config, Path(config.out) / "checkpoints" / "init.pt", bn_from_data)
        what = "the --init weights" if config.init else f"untrained, seed {config.seed}"
        what += ", BatchNorm statistics of the training clips" if bn_from_data else ""
        rich_console(stderr=True).print(
            f"wrote {path} ({what})\nnext: {next_command(path, config.loader.shards)}",
            markup=False,
            soft_wrap=True,
        )
        return
    from memdpc.train.loop import train

    train(config, overwrite)  # ends by naming what it wrote
