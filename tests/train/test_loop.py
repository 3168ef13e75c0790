"""End-to-end training runs on real shards: a short run learns and records everything, what a run says
at its end and at its start, the options it takes, a run started from given weights, and the learned run
resumed under a file-size limit."""

from __future__ import annotations

import html
import importlib.util
import math
import re
import resource
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from memdpc.cli import EXIT_RESOURCE, main
from memdpc.common.distenv import DistEnv
from memdpc.model import create_model
from memdpc.model.checkpoint import load_model, read_checkpoint
from memdpc.pipeline.clip import ClipSpec
from memdpc.train.bn_stats import data_batchnorm_stats
from memdpc.train.checkpoint import BN_BATCHES, initial_model
from memdpc.train.config import config_from_dict
from memdpc.train.knn import knn_recall
from memdpc.train.metrics import (
    DATA_BN,
    KNN_BASELINE,
    StepValues,
    at_chance,
    chance_summary,
    monitor_summary,
    read_metrics,
)
from memdpc.train.parts import run_loader
from memdpc.train.prepare import val_split_warnings

from ..conftest import files_opened, memdpc_command, reference_weights, run_memdpc, subprocess_env
from .conftest import (
    CLIP,
    LEARNED,
    TINY,
    assert_same_training,
    cli,
    records,
    tb_images,
    tb_scalars,
    tiny,
)


@pytest.fixture(scope="module")
def learned_run(train_shards, tmp_path_factory) -> Path:
    """A 4-epoch MemDPC run at 64 px (in process, one thread), with the kNN monitor at the end."""
    out = tmp_path_factory.mktemp("learned") / "run"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = cli(*TINY, *LEARNED, "--shards", str(train_shards), "--out", str(out), "--epochs", "4")
    finally:
        torch.set_num_threads(before)
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.slow
def test_short_run_lowers_the_loss_and_records_everything(learned_run, train_shards):
    train = records(learned_run, "train")
    per_epoch = [sum(r["loss"] for r in train if r["epoch"] == e) for e in range(4)]
    assert per_epoch[-1] < per_epoch[0] * 0.97, per_epoch
    r = train[-1]
    for key in (
        "loss",
        "top1",
        "top5",
        "loss_f",
        "top1_f",
        "top5_f",
        "content_share",
        "lr",
        "clips_per_s",
        "data_wait",
    ):
        assert key in r
    assert all(0 <= v["content_share"] <= 1 for v in records(learned_run, "val"))
    assert r["lr"] == 1e-3 and r["clips_per_s"] > 0 and 0 <= r["data_wait"] <= 1
    first, knn = records(learned_run, "knn")  # at initialisation and after epoch 4
    assert first["step"] == 0 and knn["step"] == 16
    # the monitor's R@1 is that of the weights it ran on (the initial weights, the epoch's last.pt), recomputed here
    config = config_from_dict(
        dict(
            shards=str(train_shards),
            out="unused",
            backend="torch",
            size=64,
            num_blocks=5,
            block_len=3,
            batch_size=4,
            num_workers=0,
        )
    )
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    loaders = [run_loader(config, env, split, CLIP, train=False) for split in ("train", "test")]
    last, _ = load_model(learned_run / "checkpoints" / "last.pt")
    assert knn["r1"] == knn_recall(last, *loaders, env.device, config.knn_max_batches)
    run_config = config_from_dict(
        dict(
            **{
                **config.to_dict(),
                "arch": "memdpc_r18",
                "widths": [8, 16, 32, 32],
                "mem_size": 32,
                "pred_steps": 2,
            }
        )
    )
    assert first["r1"] == knn_recall(initial_model(run_config), *loaders, env.device, config.knn_max_batches)
    # beside it, once, the baseline the curves also draw: the untrained encoder with the data's BatchNorm statistics
    (baseline,) = records(learned_run, KNN_BASELINE)
    assert (baseline["step"], baseline["baseline"]) == (0, DATA_BN)
    bn = data_batchnorm_stats(initial_model(run_config), loaders[0], env.device, BN_BATCHES)
    assert baseline["r1"] == knn_recall(bn, *loaders, env.device, config.knn_max_batches)
    assert knn["r1"] * 3 == pytest.approx(round(knn["r1"] * 3))  # a recall over the 3 test videos
    assert len(records(learned_run, "val")) == 4
    ckpt = read_checkpoint(learned_run / "checkpoints" / "last.pt")
    assert (ckpt["epoch"], ckpt["step"], ckpt["epoch_step"], ckpt["stream"]) == (4, 16, 0, "rgb")
    assert (learned_run / "checkpoints" / "best.pt").is_file()
    assert "mem_size: 32" in (learned_run / "config.yaml").read_text()
    tb = tb_scalars(learned_run / "tb")
    for kind in ("train", "val", "knn"):
        for key in {k for r in records(learned_run, kind) for k in r} - {"kind", "epoch", "step"}:
            steps, values = zip(*[(r["step"], r[key]) for r in records(learned_run, kind)], strict=True)
            tb_steps, tb_values = zip(*tb[f"{kind}/{key}"], strict=True)
            assert tb_steps == steps and tb_values == pytest.approx(values, rel=1e-6), (kind, key)
    model, _ = load_model(learned_run / "checkpoints" / "best.pt")
    assert model.config["name"] == "memdpc_r18" and model.features(torch.randn(1, 5, 3, 3, 64, 64)).shape == (
        1,
        32,
    )


@pytest.mark.slow
def test_each_epoch_shows_clips_of_its_first_batch_in_tensorboard(learned_run):
    per_epoch = read_checkpoint(learned_run / "checkpoints" / "last.pt")["step"] // 4  # 4 epochs
    images = tb_images(learned_run / "tb")
    assert sorted(images) == ["clips/0", "clips/1"]
    assert [step for step, _ in images["clips/0"]] == [e * per_epoch + 1 for e in range(4)]  # each first step
    _, image = images["clips/0"][0]
    assert image.shape[1] >= 480 and image.std() > 10  # 3 frames a row, enlarged; real frames, not blank


@pytest.mark.slow
def test_best_by_knn_keeps_the_best_monitored_epoch_and_stops_early(train_shards, tmp_path, one_thread):
    out = tmp_path / "run"
    res = cli(
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(out),
        "--epochs",
        "8",
        "--lr",
        "0.01",
        "--knn-every",
        "1",
        "--best-by",
        "knn",
        "--early-stop",
        "2",
    )
    assert res.exit_code == 0, res.output
    knn = records(out, "knn")
    assert knn[0]["step"] == 0  # the initial weights' value: logged, not a candidate for best.pt
    best, best_at, stale, stopped = -1.0, None, 0, None
    for epoch, r in enumerate(knn[1:]):  # what the loop must have decided, from what it logged
        best, best_at, stale = (r["r1"], r, 0) if r["r1"] > best else (best, best_at, stale + 1)
        if stale == 2:
            stopped = epoch
            break
    assert stopped is not None and len(knn) == stopped + 2  # no epoch trained after the stop
    assert read_checkpoint(out / "checkpoints" / "best.pt")["step"] == best_at["step"]
    assert read_checkpoint(out / "checkpoints" / "last.pt")["stale"] == 2
    assert "early stop: no new best knn for 2 epochs" in res.output
    first = knn[1]["r1"]  # after epoch 0
    ahead = (
        "no later epoch did better"
        if best_at is knn[1]
        else f"{best - first:.3f} above epoch 0's {first:.3f}"
    )
    assert (
        f"best: {out / 'checkpoints' / 'best.pt'} (epoch {best_at['epoch']}, kNN R@1 {best:.3f}; {ahead})"
        in res.output
    )


def test_the_run_ends_by_naming_what_it_wrote(train_shards, tmp_path, one_thread):
    out = tmp_path / "run"
    res = cli(*TINY, "--shards", str(train_shards), "--out", str(out), "--epochs", "2")
    assert res.exit_code == 0, res.output
    val = records(out, "val")
    best = min(val, key=lambda r: r["loss"])
    ahead = (
        "no later epoch did better"
        if best["epoch"] == 0
        else f"{val[0]['loss'] - best['loss']:.4f} below epoch 0's {val[0]['loss']:.4f}"
    )
    flat = [r for r in val if at_chance(r)]  # tiny and short: it may not have left chance
    warning = [f"warning: {chance_summary(val)}"] if flat else []
    ckpts = out / "checkpoints"
    assert res.output.splitlines()[-5 - len(warning) :] == [
        f"trained {out}: 2 epochs, 8 steps",
        f"best: {ckpts / 'best.pt'} (epoch {best['epoch']}, val loss {best['loss']:.4f}; {ahead})",
        *warning,
        f"last: {ckpts / 'last.pt'}",
        f"metrics: {out / 'metrics.jsonl'}; tensorboard --logdir {out / 'tb'}",
        f"next: memdpc eval retrieve {ckpts / 'best.pt'} --shards {train_shards} --out EVAL_DIR",
    ]
    assert read_checkpoint(ckpts / "best.pt")["best_epoch"] == best["epoch"]
    init = tmp_path / "init" / "checkpoints" / "init.pt"
    res = cli(
        *TINY, "--shards", str(train_shards), "--out", str(tmp_path / "init"), "--init-only", "--seed", "3"
    )
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[-2:] == [
        f"wrote {init} (untrained, seed 3)",
        f"next: memdpc eval retrieve {init} --shards {train_shards} --out EVAL_DIR",
    ]


def test_a_validation_loss_at_chance_is_flagged_in_the_epoch_lines_the_summary_and_the_report(
    blank_shards, tmp_path
):
    """Flat grey videos: every target looks alike, so the validation loss is the loss of a uniform guess in
    every epoch, and each place that shows it says so. The summary also names the loader `auto` chose."""
    out = tmp_path / "run"
    args = tiny(shards=str(blank_shards), out=str(out), epochs=2, backend="auto")
    res = subprocess.run(
        memdpc_command("train", *args), env=subprocess_env(), capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    val = records(out, "val")
    # 6 test clips in batches of 4 and 2, each clip's 2 predicted steps on a 1×1 map, one direction
    chance = (math.log(4 * 2) + math.log(2 * 2)) / 2
    assert [r["chance"] for r in val] == [pytest.approx(chance)] * 2
    assert all(abs(r["loss"] - chance) <= 0.01 * chance for r in val)
    note = (
        f"at chance: within 1% of {chance:.4f}, the loss of a uniform guess among the batch's candidates (ln of "
        "their number, summed over directions): nothing learnt"
    )
    lines = res.stderr.splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 2 and all(line.endswith(f" — {note}") for line in epochs)
    assert f"warning: the val loss was {note}, in every epoch (2)" in lines
    dali = importlib.util.find_spec("nvidia.dali") is not None
    assert (
        f"loader: {'dali' if dali else 'torch'} (auto: nvidia-dali is {'' if dali else 'not '}installed)"
        in lines
    )

    res = run_memdpc("report", tmp_path)
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "report" / "index.html").read_text()
    assert (
        f'<p class="missing">run: {html.escape(f"the val loss was {note}, in every epoch (2)")}</p>' in page
    )


def test_train_spells_options_as_the_other_verbs_do(train_shards, tmp_path):
    """--blocks as `memdpc shard` says it (and --workers as eval and quickstart do), the field names still
    accepted: the last spelling given wins, as for one option."""
    res = cli(*TINY, "--shards", str(train_shards), "--out", str(tmp_path / "r"), "--blocks", "4")
    assert res.exit_code == 2 and "clips of 5×3 frames, but the config asks for 4×3" in res.output
    res = cli(
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(tmp_path / "r"),
        "--blocks",
        "4",
        "--num-blocks",
        "5",
        "--workers",
        "1",
        "--epochs",
        "1",
        "--val-split",
        "none",
    )
    assert res.exit_code == 0, res.output
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["num_workers"] == 1


def test_val_split_warnings_are_printed_once_at_the_start(val_shards, tmp_path, one_thread):
    res = cli(
        *TINY,
        "--shards",
        str(val_shards),
        "--out",
        str(tmp_path / "r"),
        "--val-split",
        "val",
        "--knn-every",
        "1",
        "--epochs",
        "1",
    )
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[:2] == [
        f"warning: {w}"
        for w in val_split_warnings(
            config_from_dict(
                dict(shards=str(val_shards), val_split="val", knn_every=1, num_blocks=5, block_len=3)
            )
        )
    ]
    # once; the summary may add its own, of a validation loss at chance (a tiny run on 2 videos)
    assert sum(line.startswith("warning:") and "at chance" not in line for line in lines) == 2


def test_metrics_are_read_only_every_log_every_steps(train_shards, tmp_path, one_thread, monkeypatch):
    """2 epochs of 4 steps, a record every 3: the device's values come to the host only at steps 3, 4 (the
    epoch's end), 6 and 8, each step once, and the records hold the same means as reading every step would."""
    reads, read = [], StepValues.read

    def counted(self):
        done = read(self)
        reads.append([values["loss"] for values, _, _ in done])
        return done

    monkeypatch.setattr(StepValues, "read", counted)
    out = tmp_path / "run"
    res = cli(
        *TINY,
        "--shards",
        str(train_shards),
        "--out",
        str(out),
        "--epochs",
        "2",
        "--log-every",
        "3",
        "--val-split",
        "none",
    )
    assert res.exit_code == 0, res.output
    assert [len(r) for r in reads if r] == [3, 1, 2, 2]
    train = records(out, "train")
    assert [r["step"] for r in train] == [3, 6]
    losses = [loss for r in reads for loss in r]
    assert train[0]["loss"] == sum(losses[:3]) / 3 and train[1]["loss"] == sum(losses[4:6]) / 2
    assert read_checkpoint(out / "checkpoints" / "last.pt")["epoch_loss"] == [
        losses[4] + losses[5] + losses[6] + losses[7],
        4,
    ]


def test_deterministic_reruns_are_bit_identical(train_shards, tmp_path, one_thread):
    """--deterministic: two runs of one command train the very same weights, optimiser state and RNG states."""
    for name in ("a", "b"):
        res = cli(
            *TINY,
            "--shards",
            str(train_shards),
            "--out",
            str(tmp_path / name),
            "--epochs",
            "1",
            "--val-split",
            "none",
            "--deterministic",
        )
        assert res.exit_code == 0, res.output
    assert_same_training(tmp_path / "a", tmp_path / "b")


@pytest.mark.parametrize(("jitter", "crop_size"), [(True, 224), (False, 0)])
def test_augmentation_settings_reach_the_loader(train_shards, jitter, crop_size):
    config = config_from_dict(
        dict(
            shards=str(train_shards),
            out="unused",
            backend="torch",
            size=32,
            num_blocks=5,
            block_len=3,
            pred_steps=2,
            jitter_flow=jitter,
            crop_size=crop_size,
        )
    )
    env = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    spec = run_loader(config, env, "train", ClipSpec(5, 3, stride=1), train=True).plan.spec
    assert spec.jitter_flow is jitter and spec.colour_on("flow") is jitter
    assert spec.crop_size == (crop_size or None)


@pytest.mark.slow
def test_mismatched_checkpoints_and_run_dirs_are_refused(learned_run, train_shards, tmp_path):
    last = learned_run / "checkpoints" / "last.pt"
    res = cli(*TINY, "--shards", str(train_shards), "--out", str(tmp_path / "a"), "--resume", str(last))
    assert res.exit_code == 2 and f"{last}: checkpoint is of another architecture" in res.output
    res = cli(
        *TINY,
        *LEARNED,
        "--shards",
        str(train_shards),
        "--out",
        str(tmp_path / "b"),
        "--resume",
        str(last),
        "--stream",
        "flow",
    )
    assert res.exit_code == 2 and f"{last}: checkpoint was trained on the rgb stream, not flow" in res.output
    res = cli(*TINY, *LEARNED, "--shards", str(train_shards), "--out", str(learned_run), "--lr", "0.01")
    assert res.exit_code == 2
    assert "config.yaml: this run directory holds a different config (lr: 0.001 → 0.01)" in res.output
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x00" * 64)
    res = cli(*TINY, "--shards", str(train_shards), "--out", str(tmp_path / "c"), "--resume", str(junk))
    assert res.exit_code == 2 and "junk.pt: not a readable checkpoint" in res.output
    res = CliRunner().invoke(
        main,
        [
            "train",
            *TINY,
            *LEARNED,
            "--shards",
            str(train_shards),
            "--out",
            str(tmp_path / "d"),
            "--init-only",
        ],
    )
    assert res.exit_code == 0, res.output
    init = tmp_path / "d" / "checkpoints" / "init.pt"
    res = cli(
        *TINY, *LEARNED, "--shards", str(train_shards), "--out", str(tmp_path / "e"), "--resume", str(init)
    )
    assert res.exit_code == 2 and f"{init}: holds weights only" in res.output


def _convert(tmp_path: Path, name: str, stream: str = "rgb", **kw) -> tuple[Path, dict[str, torch.Tensor]]:
    """A checkpoint in the reference layout (built without convert.py), converted with `memdpc convert`."""
    weights, ref = reference_weights(name, seed=5, widths=(4, 8, 16, 16), **kw)
    torch.save(
        {"epoch": 99, "state_dict": ref, "best_acc": 0.5, "optimizer": {}, "iteration": 10},
        tmp_path / f"{name}.pth.tar",
    )
    res = CliRunner().invoke(
        main, ["convert", str(tmp_path / f"{name}.pth.tar"), str(tmp_path / f"{name}.pt"), "--stream", stream]
    )
    assert res.exit_code == 0, res.output
    return tmp_path / f"{name}.pt", weights


INIT = tiny(arch="memdpc_r18", mem_size=16, bidirectional=True, val_split="none")


@pytest.mark.slow
def test_init_starts_a_new_run_from_converted_weights(train_shards, tmp_path, one_thread):
    """The first step starts from the converted weights: undoing Adam's first update (its moments are in the
    checkpoint) gives them back, where the run's own seeded initialisation is far from them."""
    init, weights = _convert(tmp_path, "memdpc_r18", mem_size=16)
    run = tmp_path / "run"
    res = cli(
        *INIT, "--shards", str(train_shards), "--out", str(run), "--init", str(init), "--max-steps", "1"
    )
    assert res.exit_code == 0, res.output
    ckpt = read_checkpoint(run / "checkpoints" / "last.pt")
    assert (ckpt["origin"], ckpt["step"], ckpt["config"]["init"]) == ("train", 1, str(init))
    model = create_model(**ckpt["model_config"])
    lr, (beta1, beta2), eps = ckpt["config"]["lr"], (0.9, 0.999), 1e-8
    state = ckpt["optimizer"]["state"]
    for i, (name, _) in enumerate(model.named_parameters()):
        after = ckpt["model"][name]
        step = (
            lr * (state[i]["exp_avg"] / (1 - beta1)) / ((state[i]["exp_avg_sq"] / (1 - beta2)).sqrt() + eps)
            if i in state
            else 0
        )
        torch.testing.assert_close(after + step, weights[name], atol=1e-6, rtol=0, msg=name)
    seeded = create_model(**ckpt["model_config"]).state_dict()
    assert all(
        not torch.allclose(seeded[k], weights[k], atol=1e-2) for k in ("memory", "backbone.conv1.weight")
    )
    # a run that resumes continues from its own checkpoint, not from --init
    res = cli(
        *INIT, "--shards", str(train_shards), "--out", str(run), "--init", str(init), "--max-steps", "2"
    )
    assert res.exit_code == 0 and "resuming" in res.output, res.output
    assert read_checkpoint(run / "checkpoints" / "last.pt")["step"] == 2


def test_init_checkpoints_that_cannot_start_the_run_are_one_line_errors(train_shards, tmp_path):
    dpc, _ = _convert(tmp_path, "dpc_r18")
    clf, _ = _convert(tmp_path, "classifier_r18", num_classes=3)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(dpc.read_bytes()[:2048])
    for path, text in (
        (dpc, "checkpoint is of another architecture: name 'dpc_r18' (this run: 'memdpc_r18')"),
        (clf, "holds a finetuned classifier (classifier_r18), not a pretrained MemDPC/DPC model"),
        (cut, "not a readable checkpoint"),
    ):
        res = cli(*INIT, "--shards", str(train_shards), "--out", str(tmp_path / "run"), "--init", str(path))
        assert res.exit_code == 2 and f"{path}: {text}" in res.output and "Traceback" not in res.output, (
            res.output
        )
        assert not (tmp_path / "run").exists()
    assert INIT[:2] == ["--stream", "rgb"]  # without it, the default stream would be taken as asked for
    flow, _ = _convert(tmp_path, "memdpc_r18", stream="flow", mem_size=16)
    res = cli(*INIT[2:], "--shards", str(train_shards), "--out", str(tmp_path / "run"), "--init", str(flow))
    assert res.exit_code == 2 and f"--init {flow}: say which stream the run trains on" in res.output, (
        res.output
    )
    assert not (tmp_path / "run").exists()
    res = cli(
        *INIT,
        "--arch",
        "dpc_r18",
        "--shards",
        str(train_shards),
        "--out",
        str(tmp_path / "run"),
        "--resume",
        str(dpc),
    )
    assert res.exit_code == 2 and f"{dpc}: holds weights only" in res.output, res.output


@pytest.mark.slow
def test_full_disk_while_saving_keeps_the_previous_checkpoint(
    learned_run, train_shards, tmp_path, one_thread
):
    """Resume a copy of the learned run for one more epoch under a real file-size limit (EFBIG)."""
    run = tmp_path / "run"
    shutil.copytree(learned_run, run)
    last = run / "checkpoints" / "last.pt"
    before = {p.name: p.read_bytes() for p in last.parent.iterdir()}
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before["last.pt"]) // 2, old_limit[1]))
    try:
        res = cli(*TINY, *LEARNED, "--shards", str(train_shards), "--out", str(run), "--epochs", "5")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert res.exit_code == EXIT_RESOURCE, res.output
    assert re.search(
        rf"stopped: file-size limit reached in {re.escape(str(last.parent))}, writing (best|last)\.pt "
        r"\([^)]* free there now\); "
        rf"kept {re.escape(str(last))} \(epoch 4, step \d+\); raise the limit \(ulimit -f\), then the same "
        "command resumes",
        res.output,
    ), res.output
    assert {p.name: p.read_bytes() for p in last.parent.iterdir()} == before  # no temporary left either


@pytest.mark.slow
def test_a_run_whose_monitor_ends_below_the_untrained_encoder_says_so_and_one_that_rises_does_not(
    direction_shards, tmp_path
):
    """The same tiny run twice on the directions family, whose classes are the clips' global motion, with the
    flow's global motion shifted at random: at the paper's rate its monitor rises; at a rate thirty times
    higher the features are wrecked and the monitor ends below the untrained encoder's. Only that run's closing
    lines, `memdpc show RUN` and the report page warn, naming the step it fell below."""
    common = [
        "train", "--stream", "flow", "--shards", str(direction_shards), "--widths", "8,16,16,16", "--size", "32",
        "--crop-size", "0", "--batch-size", "4", "--epochs", "4", "--blocks", "4", "--block-len", "4",
        "--pred-steps", "1", "--mem-size", "64", "--no-jitter-flow", "--knn-every", "1", "--flow-shift", "40",
        "--flow-gain", "2", "--temperature", "0.1", "--negatives", "other_clips", "--no-progress",
    ]  # fmt: skip
    for lr, falls in (("0.001", False), ("0.03", True)):
        run = tmp_path / f"lr{lr}"
        res = run_memdpc(*common, "--out", str(run), "--lr", lr)
        assert res.returncode == 0, res.stderr[-3000:]
        knn = [r["r1"] for r in records(run, "knn")]
        assert (knn[-1] < knn[0]) == falls, knn  # what the run is an example of
        line, worse = monitor_summary(read_metrics(run))
        assert line.startswith(
            f"kNN monitor R@1: untrained {knn[0]:.3f}, untrained with the data's BatchNorm"
        )
        assert line in res.stderr.splitlines()
        warned = [x for x in res.stderr.splitlines() if x.startswith("warning: the kNN monitor's last R@1")]
        assert warned == ([f"warning: {worse}"] if falls else []), res.stderr
        shown = run_memdpc("show", str(run), "--out", str(tmp_path / f"show{lr}"))
        assert shown.returncode == 0, shown.stderr
        assert ("warning: the kNN monitor's last R@1" in shown.stderr) == falls
    assert "since step" in worse and "pretraining made the features worse" in worse
    res = run_memdpc("report", str(tmp_path))
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "report" / "index.html").read_text()
    assert page.count("kNN monitor R@1: untrained") == 2
    assert page.count(f'class="missing">lr0.03: {html.escape(worse)}') == 1 and "lr0.001: the kNN" not in page


def test_a_training_start_reads_each_manifest_once_and_a_resume_its_checkpoint_once(
    val_shards, tmp_path, one_thread
):
    """Training consults a split's manifest from several places (its clips, classes, shards, provenance, the
    monitor) and reads the file once; a resume reads its checkpoint once. Shards copied here: a manifest is read
    once per process, and this test's are new to it."""
    shards, run = tmp_path / "shards", tmp_path / "run"
    shutil.copytree(val_shards, shards)
    args = tiny(val_split="val", knn_every=1, max_steps=1, epochs=1)
    res, opened = files_opened(lambda: cli(*args, "--shards", str(shards), "--out", str(run)))
    assert res.exit_code == 0, res.output
    read = Counter(p.resolve() for p in opened if p.name.startswith("manifest-") or p.name == "last.pt")
    rgb = (shards / "rgb").resolve()
    assert read == {rgb / "manifest-train.json": 1, rgb / "manifest-val.json": 1}, read
    res, opened = files_opened(
        lambda: cli(
            *args[:-2], "--epochs", "2", "--max-steps", "2", "--shards", str(shards), "--out", str(run)
        )
    )
    assert res.exit_code == 0 and "resum" in res.output.lower(), res.output
    assert [p.name for p in opened if p.suffix == ".pt"].count("last.pt") == 1
