"""The eval fit settings: one home for each task's defaults, lr_min following lr, the CLI showing them."""

from __future__ import annotations

from click.testing import CliRunner

from memdpc.cli import main
from memdpc.eval.fit import FINETUNE_FIT, OOPS_FIT, PROBE_FIT, FitConfig, fit_config


def test_lr_min_follows_lr_unless_given():
    assert FitConfig().lr_min == 1e-4 and FitConfig(lr=1e-2).lr_min == 1e-3
    assert FitConfig(lr=1e-2, lr_min=5e-4).lr_min == 5e-4
    assert fit_config(PROBE_FIT, lr=2e-3, epochs=None).lr_min == 2e-3 / 10
    assert fit_config(PROBE_FIT, lr=2e-3, epochs=None).epochs == PROBE_FIT.epochs
    assert fit_config(FINETUNE_FIT, lr=3e-3, lr_min=3e-4).lr_min == 3e-4


def test_the_command_line_shows_the_library_defaults():
    for verb, fit in (("probe", PROBE_FIT), ("finetune", FINETUNE_FIT), ("oops", OOPS_FIT)):
        out = CliRunner().invoke(main, ["eval", verb, "--help"], terminal_width=200).output
        assert f"[default: {fit.epochs}; x>=1]" in out and f"[default: {fit.lr}]" in out


def test_train_takes_workers_and_the_old_num_workers():
    out = CliRunner().invoke(main, ["train", "--help"], terminal_width=200).output
    assert "--workers, --num-workers" in out
