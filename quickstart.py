"""``memdpc quickstart``: the main job end to end on the built-in data, with the same library calls a user
makes by hand (docs/quickstart.md has each step's command-line equivalent).

synthetic videos → index → preprocess rgb + flow → shards → train rgb, train flow → retrieval and linear
probe of the MemDPC encoders and of randomly initialised ones → late fusion → one table (JSON + Markdown), with
every figure's 95 % interval and the number of test videos, MemDPC paired against each baseline on the same
test videos (``memdpc eval compare``), and one page of everything it made (``report/index.html``).
Every step resumes: re-running the command after a kill finishes the job without redoing finished work.
An example recipe (``--recipe``) sets the run's sizes instead: it may train one stream only, pretrain on a pool
of unlabelled videos of the family (another draw, several times the labelled one) and evaluate the last
checkpoint.

The table says where the kNN monitor, which chooses each MemDPC checkpoint, found no trained epoch better than
the untrained encoder (its value at step 0); beside it, the pretext task's own score on the ``val`` videos
before and after training tells whether the self-supervised task was learnt at all.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.rule import Rule
from rich.table import Table

from memdpc.common import file_kinds
from memdpc.common.atomic import atomic_path, write_json_atomic
from memdpc.common.console import rich_console, titled_table
from memdpc.common.errors import UserError
from memdpc.common.settings import flat
from memdpc.common.streams import STREAMS
from memdpc.eval.compare import compare_results, winner
from memdpc.eval.run import evaluate, fuse
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.shard import run_shard
from memdpc.pipeline.shard_plan import ShardSettings
from memdpc.preprocess.datasets import UNLABELLED, OwnFolders, build_index, hold_outs, make_index
from memdpc.preprocess.examples.families import EXAMPLE_FAMILIES, POOL_SEED
from memdpc.preprocess.run import preprocess
from memdpc.preprocess.video_index import hold_out, read_index, write_index
from memdpc.recipes.quickstart_options import QuickstartOptions
from memdpc.recipes.recipe import config_ref, flags
from memdpc.recipes.recipe import load as load_recipe
from memdpc.report.page import write_report
from memdpc.report.stage_tables import print_shard_report
from memdpc.report.tables import cell_text, print_result
from memdpc.train.checkpoint import write_initial_checkpoint
from memdpc.train.config import TrainConfig, config_from_dict
from memdpc.train.loop import train
from memdpc.train.metrics import read_metrics
from memdpc.train.pretext import pretext_scores

__all__ = [
    "BASELINES",
    "COLUMNS",
    "COMPARED",
    "MODEL_NAMES",
    "PROFILES",
    "VERDICTS",
    "column",
    "own_commands",
    "profile_from",
    "quickstart",
    "training_order",
]

MODELS = ("random", "random_bn", "memdpc")
MODEL_NAMES = {"random": "random init", "random_bn": "random init, data BN", "memdpc": "MemDPC"}
COLUMNS = (("retrieval", "R@1"), ("retrieval", "R@5"), ("probe-linear", "top1"))
COMPARED = (
    ("retrieval", "R@1"),
    ("probe-linear", "top1"),
)  # MemDPC against each baseline, per stream and fused
BASELINES = ("random", "random_bn")
VERDICTS = {"a": "MemDPC", "b": "baseline", None: "neither"}  # which is better at p < 0.05 (column "better")
INTERVAL = " 95%"  # the tables' column of the interval of the column before it (its name + this)
BELOW_INIT = (
    "no epoch beat the untrained encoder"  # a MemDPC row's note: the kNN monitor's best ≤ its step-0 value
)


# validation on held-out training videos: the kNN monitor every epoch chooses best.pt, which the evaluation reads,
# and training stops after 5 epochs without a better one
CHOOSE_BY_KNN = dict(val_split="val", knn_every=1, best_by="knn", early_stop=5)


@dataclass(frozen=True)
class Profile:
    """Sizes of one quickstart run: data, clip geometry, model and optimisation; one for every family.

    The default is a small configuration for a CPU-only machine (README, "The quickstart", has its run time
    and results), the flow recipe's at a quickstart's size: 24 labelled videos per class of 48 frames at 64²
    (a third of each class to test on, one training video per class held out as ``val``) and a pool of three
    times as many videos of another draw to pretrain on; clips of 8 blocks × 5 consecutive frames (stride 1
    instead of the paper's 3, because the example videos are short), a 2D3D-ResNet18 with a quarter of the
    channels (16, 32, 64, 64) at 32², memory 1024, and TV-L1 with 3 pyramid scales and 3 warps instead of
    OpenCV's 5 and 5 (64² frames need no deeper pyramid). The crop is resized straight to the training size
    (going through 224 first would only upsample 64² frames, and slows loading). The loss is the flow recipe's
    (cosine over 0.1, negatives at the target's own position and step); flow trains 20 epochs with its global
    shift and gain where the labelled videos' global motion does not tell their class
    (``motion_invariance: auto``), and without the per-frame colour jitter (``jitter_flow=False``; the paper
    jitters both streams): the example objects move only a few codes off the zero-flow 128, while brightness
    jitter moves that 128 by far more, differently in every frame. RGB, which does not pay at this size
    (docs/pretraining.md), trains 2 epochs. The last checkpoint is evaluated; the kNN monitor reads the
    labelled ``val`` videos every 5 epochs. The sizes were chosen by the minutes they take and on the built-in
    family; the held-out draws of the recipe check the settings (docs/pretraining.md).
    Validation reads one batch per epoch (the whole split would cost a large part of the training time).
    Shards hold ``max_count`` clips each, so that every loader worker has shards of its own (the torch
    loader gives each worker whole shards).
    Torch runs on one thread (``threads``): a network this small trains no faster on two, whose hand-offs cost
    what the second core gives (README, "The quickstart", has both run times), and one count sums in one order,
    so that the table does not move with the machine's number of cores.
    """

    data: dict[
        str, Any
    ]  # the example family's sizes (ExampleConfig fields); each family keeps its other defaults
    clip: ClipSpec
    window_step: int
    max_count: int
    train: dict[str, Any] = field(default_factory=dict)
    stream_train: dict[str, dict[str, Any]] = field(default_factory=dict)  # per stream, over ``train``
    # stream -> the stream whose run teaches it (``memdpc train --teacher`` with that run's evaluated checkpoint);
    # a teacher's stream trains first
    teachers: dict[str, str] = field(default_factory=dict)
    val_per_class: int = (
        1  # training videos per class held out for the kNN monitor (memdpc index --val-per-class)
    )
    tvl1: dict[str, Any] = field(default_factory=lambda: {"scales": 3, "warps": 3})
    # the probe sees ~100 windows: full-batch steps at lr 1e-3 would leave it untrained (lr_min: FitConfig's lr/10,
    # written out as the exact 3e-4)
    probe: dict[str, Any] = field(default_factory=lambda: {"epochs": 300, "lr": 3e-3, "lr_min": 3e-4})
    streams: tuple[str, ...] = STREAMS  # those trained and evaluated; both are also fused
    # > 0: MemDPC pretrains on a pool of unlabelled videos of the family, this many times the labelled draw's
    # (another draw, seed + POOL_SEED), instead of the labelled draw's training videos
    pool: int = 0
    checkpoint: str = "best"  # the MemDPC checkpoint evaluated: best.pt (as training chose it) or last.pt
    # the fused retrieval's weights: equal (the paper's mean), or chosen on the training videos (eval fuse
    # --choose-weights); the fused probe's are equal either way
    fusion: str = "equal"
    # torch's threads for the run (training, features, probes); 0: torch's own count, one per core
    threads: int = 0

    def chooses_weights(self, kind: str) -> bool:
        """Whether the fusion of results of ``kind`` has its weights chosen on the training videos."""
        return kind == "retrieval" and self.fusion == "chosen"


CHECKPOINTS = ("best", "last")
FUSIONS = ("equal", "chosen")


def profile_from(values: dict[str, Any], where: str, family: str) -> Profile:
    """The profile a recipe's ``quickstart`` section describes for the example family ``family``
    (:class:`Profile`'s fields; ``clip`` as :class:`ClipSpec`'s; ``pool`` one number or one per family);
    UserError naming ``where`` and the problem."""
    known = set(Profile.__dataclass_fields__)
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(
            f"{where}: unknown setting(s) {', '.join(unknown)}; it has {', '.join(sorted(known))}"
        )
    given = list(values.get("streams", STREAMS))
    if not given or not set(given) <= set(STREAMS) or len(set(given)) != len(given):
        raise UserError(f"{where}: streams must be some of {', '.join(STREAMS)}, each once; got {given}")
    streams = tuple(s for s in STREAMS if s in given)  # in the tables' order: both streams are STREAMS
    if values.get("checkpoint", "best") not in CHECKPOINTS:
        raise UserError(f"{where}: checkpoint must be one of {', '.join(CHECKPOINTS)}")
    if values.get("fusion", "equal") not in FUSIONS:
        raise UserError(f"{where}: fusion must be one of {', '.join(FUSIONS)}")
    pool = values.get("pool", 0)
    if isinstance(pool, dict):
        if set(pool) != set(EXAMPLE_FAMILIES):
            raise UserError(f"{where}: pool by family must name each of {', '.join(EXAMPLE_FAMILIES)} once")
        pool = pool[family]
    if not isinstance(pool, int) or pool < 0:
        raise UserError(f"{where}: pool must be a whole number of times the labelled videos (0: no pool)")
    teachers = values.get("teachers") or {}
    if not isinstance(teachers, dict) or any(
        s not in streams or t not in streams or s == t or t in teachers for s, t in teachers.items()
    ):
        raise UserError(
            f"{where}: teachers must map a trained stream to the other one, whose run teaches it (rgb: flow)"
        )
    threads = values.get("threads", 0)
    if not isinstance(threads, int) or threads < 0:
        raise UserError(f"{where}: threads must be a whole number of torch threads (0: one per core)")
    try:
        clip = ClipSpec(**values.get("clip", {}))
        return Profile(**{**values, "clip": clip, "streams": streams, "pool": pool})
    except (TypeError, ValueError) as e:
        raise UserError(f"{where}: {e}") from None


PROFILES = {
    "default": Profile(
        data=dict(videos_per_class=24, frames=48, size=64),
        clip=ClipSpec(num_blocks=8, block_len=5, stride=1),
        window_step=4,
        max_count=4,
        pool=3,
        checkpoint="last",
        threads=1,
        train=dict(
            size=32,
            crop_size=0,
            widths=[16, 32, 64, 64],
            batch_size=16,
            epochs=20,
            schedule="constant",
            val_split="val",
            val_max_batches=1,
            knn_every=5,
            knn_max_batches=50,
            temperature=0.1,
            negatives="other_clips",
        ),
        stream_train={
            "rgb": dict(epochs=2),
            "flow": dict(jitter_flow=False, flow_shift=10, flow_gain=1.5, motion_invariance="auto"),
        },
    ),
    "tiny": Profile(
        data=dict(videos_per_class=5, frames=24, size=32, num_classes=3),
        clip=ClipSpec(num_blocks=4, block_len=4, stride=1),
        window_step=4,
        max_count=1,
        threads=1,
        train=dict(
            size=32,
            crop_size=0,
            widths=[8, 16, 16, 16],
            batch_size=4,
            epochs=2,
            pred_steps=1,
            mem_size=64,
            log_every=1,  # a few steps an epoch: every one of them on the curves
            **CHOOSE_BY_KNN,
        ),
        stream_train={"rgb": dict(epochs=3), "flow": dict(jitter_flow=False)},  # RGB longer, like the default
        probe={"epochs": 30, "lr": 3e-3, "lr_min": 3e-4},
    ),
}


def _options(settings: dict[str, Any]) -> str:
    return " ".join(f"--{k}" if v is True else f"--{k} {v}" for k, v in settings.items() if v is not False)


def _check_same_run(out: Path, settings: dict[str, Any]) -> None:
    """Record what a run in ``out`` was started with; a re-run (which resumes) must ask for the same."""
    path = out / file_kinds.QUICKSTART_RECORD
    if path.exists():
        before = json.loads(path.read_text())
        if before != settings:
            raise UserError(
                f"{out}: holds a quickstart run of {_options(before)}, not {_options(settings)}; resume "
                "it with the same options or choose another --out"
            )
    else:
        write_json_atomic(path, settings)


RULE_WIDTH = (
    100  # columns of a step's rule at most: a file's or a pipe's console is far wider (common/console.py)
)


def _step(console: Console, text: str) -> None:
    console.print(Rule(f"[bold]{text}"), width=min(console.width, RULE_WIDTH))


def _draw(out: Path, p: Profile, family: str, seed: int, sizes: dict[str, Any], test: bool = True) -> Path:
    """A draw of the example family ``family`` in ``out/data`` and its index (with ``val`` held out of the
    training videos; without the ``test`` split where ``test`` is false)."""
    config, make = EXAMPLE_FAMILIES[family]
    root = make(out / "data", config(**sizes, seed=seed))
    records = hold_out(build_index(root, "ucf101", 1), p.val_per_class)
    index = out / "index.jsonl"
    write_index([r for r in records if test or r.split != "test"], index)
    return index


def _data(out: Path, p: Profile, family: str, seed: int, console: Console) -> Path:
    _step(console, f"1/6 example data ({family}) and index")
    return _draw(out, p, family, seed, p.data)


def _pool(out: Path, p: Profile, family: str, seed: int, console: Console) -> Path:
    """The pool's videos (:attr:`Profile.pool`) and index, without the test split a family's layout holds
    (pretraining reads ``train``, its monitor ``val``)."""
    _step(
        console,
        f"1/6 the pool: {p.pool} times as many unlabelled videos to pretrain on ({family}, seed {seed})",
    )
    labelled = EXAMPLE_FAMILIES[family][0](**p.data).videos_per_class
    return _draw(out, p, family, seed, {**p.data, "videos_per_class": p.pool * labelled}, test=False)


def _own(out: Path, folder: Path, layout: str, seed: int, console: Console, of: str = "") -> Path:
    """The index of a folder of the user's (``layout``: labelled ``folder`` or ``unlabelled``), with the hold-outs
    a run of its own evaluates on (:func:`~memdpc.preprocess.datasets.hold_outs`)."""
    _step(console, f"1/6 your videos{of}: {folder}")
    report = make_index(folder, layout, hold_outs(folder, layout, seed), out=out / "index.jsonl")
    splits = Counter(r.split for r in report.records)
    console.print(
        f"{len(report.records)} videos: " + ", ".join(f"{n} {s}" for s, n in sorted(splits.items())),
        markup=False,
    )
    return report.path


def _frames(out: Path, index: Path, p: Profile, workers: int, console: Console, of: str = "") -> Path:
    kinds = " and ".join({"rgb": "RGB frames", "flow": "TV-L1 flow"}[s] for s in p.streams)
    _step(console, f"2/6 preprocess{of}: {kinds}")
    preprocess(index, out / "frames", ",".join(p.streams), size=p.data["size"], tvl1=p.tvl1, workers=workers)
    return out / "frames"


def _shards(
    out: Path,
    frames: Path,
    index: Path,
    p: Profile,
    seed: int,
    console: Console,
    splits: tuple[str, ...] = ("train", "val", "test"),
    of: str = "",
) -> Path:
    _step(console, f"3/6 shard{of}")
    for stream in p.streams:
        for split in splits:
            report = run_shard(
                frames,
                index,
                stream,
                out / "shards",
                split,
                ShardSettings(clip=p.clip, window_step=p.window_step, max_count=p.max_count, seed=seed),
                console=console,
            )
            print_shard_report(report, console)
    return out / "shards"


def _train_config(
    out: Path,
    shards: Path,
    stream: str,
    p: Profile,
    seed: int,
    workers: int,
    backend: str,
    monitor: Path | None = None,
):
    """A stream's training on ``shards``; ``monitor``: the labelled shards the kNN monitor reads instead (where
    ``shards`` are unlabelled videos); taught by its teacher stream's run where the profile names one."""
    teacher = p.teachers.get(stream)
    return config_from_dict(
        dict(
            stream=stream,
            shards=str(shards),
            knn_shards=str(monitor or ""),
            out=str(_run_dir(out, stream)),
            seed=seed,
            num_blocks=p.clip.num_blocks,
            block_len=p.clip.block_len,
            num_workers=workers,
            backend=backend,
            teacher=str(_evaluated(_run_dir(out, teacher), p)) if teacher else "",
            **{**p.train, **p.stream_train.get(stream, {})},
        )
    )


def training_order(p: Profile) -> list[str]:
    """The profile's streams in the order they train: a teacher's before the stream it teaches."""
    return sorted(p.streams, key=lambda s: s in p.teachers)


def _run_dir(out: Path, stream: str) -> Path:
    """The folder of a stream's MemDPC run."""
    return out / "runs" / stream


def _evaluated(run: Path, p: Profile) -> Path:
    """The checkpoint of a MemDPC run that the quickstart evaluates."""
    return run / "checkpoints" / f"{p.checkpoint}.pt"


def _checkpoints(configs: dict[str, TrainConfig], p: Profile, console: Console) -> dict:
    _step(console, "4/6 self-supervised training, one run per stream")
    ckpts = {}
    for stream in training_order(p):
        config = configs[stream]
        ckpts["memdpc", stream] = _evaluated(train(config), p)
        random_run = Path(config.out).with_name(f"random-{stream}")
        ckpts["random", stream] = write_initial_checkpoint(config, random_run / "checkpoints" / "init.pt")
        ckpts["random_bn", stream] = write_initial_checkpoint(
            config, random_run.with_name(f"random-bn-{stream}") / "checkpoints" / "init.pt", bn_from_data=True
        )
    return ckpts


def _evaluate(
    out: Path, shards: Path, ckpts: dict, p: Profile, workers: int, backend: str, console: Console
) -> dict:
    fused = p.streams == STREAMS
    _step(
        console,
        "5/6 evaluation: retrieval and linear probe, per stream" + (", then late fusion" if fused else ""),
    )
    results: dict[tuple[str, str, str], Path] = {}

    def shown(path: Path) -> Path:
        print_result(path, console)
        return path

    for model in MODELS:
        for stream in p.streams:
            folder = out / "eval" / f"{model}-{stream}"
            # the folder holds this run's results only; a rerun rewrites the baselines' init.pt (with
            # --bn-from-data its statistics follow --workers), so its results may be replaced
            common = dict(shards=shards, out=folder, num_workers=workers, backend=backend, overwrite=True)
            results[model, stream, "retrieval"] = shown(evaluate("retrieve", ckpts[model, stream], **common))
            results[model, stream, "probe-linear"] = shown(
                evaluate("probe", ckpts[model, stream], head="linear", fit=p.probe, **common)
            )
        for kind in ("retrieval", "probe-linear") if fused else ():
            results[model, "fused", kind] = shown(
                fuse(
                    results[model, "rgb", kind],
                    results[model, "flow", kind],
                    out=out / "eval" / f"{model}-fused" / f"{kind}.json",
                    choose_weights=p.chooses_weights(kind),
                    overwrite=True,
                )
            )
    return results


def _result(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def _streams(results: dict) -> list[str]:
    """The rows' streams a run's results hold, in the tables' order (each stream, then fused)."""
    return [s for s in (*STREAMS, "fused") if ("memdpc", s, COLUMNS[0][0]) in results]


def column(kind: str, metric: str) -> str:
    """The summary table's name of a metric of a kind of result."""
    return "probe top-1" if kind.startswith("probe") else metric


def _percent(x: float) -> float:
    return round(100 * x, 1)


def knn_monitor(run: Path, checkpoint: str = "best") -> dict[str, Any]:
    """The kNN monitor's R@1 on the initial weights (step 0) and at the trained epoch whose checkpoint is
    evaluated: the best (the first highest, as training chooses best.pt) or the last; from the run's
    ``metrics.jsonl``; empty where it holds no trained epoch's."""
    knn = [r for r in read_metrics(run) if r["kind"] == "knn"]
    trained = [r for r in knn if r["step"] > 0]
    if not trained:  # no monitor, or a run stopped before its first epoch's
        return {}
    if checkpoint == "best":
        best = max(trained, key=lambda r: r["r1"])  # max keeps the first of equals
    else:
        best = trained[-1]
    return {
        "initial": knn[0]["r1"],
        "best": best["r1"],
        "epoch": best["epoch"],
        "checkpoint": checkpoint,
        "beat_init": best["r1"] > knn[0]["r1"],
    }


def _notes(monitors: dict[str, dict[str, Any]], videos: int) -> dict[tuple[str, str], str]:
    """What the MemDPC rows must say: where no trained epoch beat the untrained encoder on the kNN monitor, and
    on how many ``val`` videos (``videos``) the monitor said so (a few videos' R@1 moves in large steps)."""
    notes = {}
    for stream, m in monitors.items():
        if m and not m["beat_init"]:
            notes["memdpc", stream] = (
                f"{BELOW_INIT} (kNN R@1 {m['initial']:.3f} untrained, {m['best']:.3f} at "
                f"the {m['checkpoint']} epoch, {m['epoch']}: the row's; on {videos} val videos)"
            )
    below = [s for s in STREAMS if ("memdpc", s) in notes]
    if below and len(monitors) == len(STREAMS):  # a fused row
        notes["memdpc", "fused"] = f"its {' and '.join(below)} part: {BELOW_INIT}"
    return notes


def summary_table(results: dict, notes: dict[tuple[str, str], str] | None = None) -> list[dict[str, Any]]:
    """One row per (model, stream): ``n`` (test videos), R@1, R@5 and linear-probe top-1 in percent, each with
    its 95 % interval (``[lo, hi]``, the column's name + :data:`INTERVAL`), and a note ("" or what the row's numbers are
    not: :data:`BELOW_INIT`)."""
    rows = []
    for model in MODELS:
        for stream in _streams(results):
            row: dict[str, Any] = {"model": MODEL_NAMES[model], "stream": stream}
            row["n"] = _result(results[model, stream, COLUMNS[0][0]])["counts"]["videos"]
            for kind, metric in COLUMNS:
                result = _result(results[model, stream, kind])
                name = column(kind, metric)
                row[name] = _percent(result["metrics"][metric])
                row[name + INTERVAL] = [_percent(x) for x in result["intervals"][metric]]
            row["note"] = (notes or {}).get((model, stream), "")
            rows.append(row)
    return rows


def comparison_table(results: dict) -> list[dict[str, Any]]:
    """MemDPC against each baseline (:data:`COMPARED`, per stream and fused), paired on the same test videos by
    :func:`memdpc.eval.compare.compare_results`: the difference in points, its 95 % interval, the test's
    p-value, the discordant videos (MemDPC right and the baseline wrong / the reverse) and which is better
    (:data:`VERDICTS`)."""
    rows = []
    for baseline in BASELINES:
        for stream in _streams(results):
            for kind, metric in COMPARED:
                pair = (results["memdpc", stream, kind], results[baseline, stream, kind])
                m = compare_results(*pair)["metrics"][metric]
                rows.append(
                    {
                        "baseline": MODEL_NAMES[baseline],
                        "stream": stream,
                        "metric": column(kind, metric),
                        "difference": _percent(m["difference"]),
                        "difference" + INTERVAL: m["interval"] and [_percent(x) for x in m["interval"]],
                        "p": None if m["p"] is None else float(f"{m['p']:.2g}"),
                        "discordant": f"{m['discordant']['a_only']}/{m['discordant']['b_only']}",
                        "better": VERDICTS[winner(m)],
                    }
                )
    return rows


SCAN = (  # the quickstart's last words: one run at one size says little; where pretraining pays, and how much
    "What pretraining on a pool of unlabelled videos gains at a larger size, on held-out draws of every family: "
    "memdpc quickstart --recipe example-flow-pool (docs/pretraining.md)."
)


def _which_streams(rows: list[dict[str, Any]]) -> str:
    streams = list(dict.fromkeys(r["stream"] for r in rows))
    return "per stream and fused" if "fused" in streams else f"of the {' and '.join(streams)} stream"


def comparison_summary(rows: list[dict[str, Any]], videos: int) -> str:
    """The sentence that answers "does pretraining beat random init?" from :func:`comparison_table`, then where
    the scan of when it does is (:data:`SCAN`)."""
    counts = []
    for baseline in BASELINES:
        mine = [r for r in rows if r["baseline"] == MODEL_NAMES[baseline]]
        better = sum(r["better"] == VERDICTS["a"] for r in mine)
        worse = sum(r["better"] == VERDICTS["b"] for r in mine)
        counts.append(f"better than {MODEL_NAMES[baseline]} in {better} of {len(mine)}, worse in {worse}")
    streams = list(dict.fromkeys(r["stream"] for r in rows))
    pays = [s for s in streams if all(r["better"] == VERDICTS["a"] for r in rows if r["stream"] == s)]
    if len(pays) == len(streams):
        head = "Pretraining beats random init"
    elif pays:
        others = [s for s in streams if s not in pays]
        head = (
            f"Pretraining beats random init on {' and '.join(pays)}, not reliably on {' and '.join(others)}"
        )
    else:
        head = "Pretraining does not reliably beat random init"
    return (
        f"{head}: MemDPC is {'; '.join(counts)} (R@1 and probe top-1, {_which_streams(rows)}, paired on the same "
        f"{videos} test videos; McNemar's exact test at p < 0.05, not corrected for {len(rows)} tests). {SCAN}"
    )


def pretext_table(ckpts: dict, configs: dict[str, TrainConfig]) -> list[dict[str, Any]]:
    """Per stream: the pretext task's top-1 (percent) and loss on the ``val`` videos, from the initial weights
    (those training started from) and from the MemDPC checkpoint the table evaluates."""
    rows = []
    for stream, config in configs.items():
        before, after = (
            pretext_scores(ckpts[m, stream], config, config.val_split) for m in ("random", "memdpc")
        )
        rows.append(
            {
                "stream": stream,
                "split": config.val_split,
                "top-1 before": round(100 * before["top1"], 1),
                "top-1 after": round(100 * after["top1"], 1),
                "loss before": round(before["loss"], 3),
                "loss after": round(after["loss"], 3),
            }
        )
    return rows


def sample_note(results: dict) -> str:
    """How many videos the percentages count, so that a reader can tell a difference from noise, and a small
    test set."""
    result = _result(results["random", _streams(results)[0], "retrieval"])
    videos, gallery = result["counts"]["videos"], result["counts"]["gallery"]
    small = f"; {result['small_test_set']}" if result["small_test_set"] else ""
    return (
        f"{videos} test videos (one video = {100 / videos:.1f} points{small}), each retrieving among {gallery} "
        "train videos; the probes are scored on the same test videos; 95 % intervals: Wilson."
    )


def _markdown_table(rows: list[dict[str, Any]]) -> list[str]:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return lines + ["| " + " | ".join(cell_text(r[c]) for c in cols) + " |" for r in rows]


def _markdown(
    rows: list[dict[str, Any]],
    note: str,
    pretext: list[dict[str, Any]],
    compared: list[dict[str, Any]],
    summary: str,
) -> str:
    return (
        "\n".join(
            [
                *_markdown_table(rows),
                "",
                note,
                "",
                f"{file_kinds.QUICKSTART_PRETEXT_TITLE}:",
                "",
                *_markdown_table(pretext),
                "",
                f"{file_kinds.QUICKSTART_COMPARE_TITLE}:",
                "",
                *_markdown_table(compared),
                "",
                summary,
            ]
        )
        + "\n"
    )


_LEFT = ("model", "stream", "split", "note", "baseline", "metric", "better")  # columns of words


def _rich_table(rows: list[dict[str, Any]], title: str, caption: str | None = None) -> Table:
    """The rows for a terminal: a value and its interval in one cell, "23.3 [11.8–40.9]" (which wraps between
    the two, so that a table fits 80 columns)."""
    table = titled_table(title, caption=caption)
    cols = [c for c in rows[0] if not c.endswith(INTERVAL)]
    for c in cols:  # a word too long for its column folds onto the next line, never cut
        table.add_column(c, justify="left" if c in _LEFT else "right", overflow="fold")
    for r in rows:
        table.add_row(
            *(
                f"{cell_text(r[c])} [{cell_text(r[c + INTERVAL])}]" if c + INTERVAL in r else cell_text(r[c])
                for c in cols
            )
        )
    return table


def _write(
    out: Path,
    rows: list[dict[str, Any]],
    note: str,
    pretext: list[dict[str, Any]],
    compared: list[dict[str, Any]],
    console: Console,
) -> None:
    _step(console, "6/6 summary")
    table, pretext_path, compare_path, markdown = (
        out / n
        for n in (
            file_kinds.QUICKSTART_TABLE,
            file_kinds.QUICKSTART_PRETEXT,
            file_kinds.QUICKSTART_COMPARE,
            file_kinds.QUICKSTART_MARKDOWN,
        )
    )
    summary = comparison_summary(compared, rows[0]["n"])
    write_json_atomic(table, rows)
    write_json_atomic(pretext_path, pretext)
    write_json_atomic(compare_path, {"comparisons": compared, "summary": summary})
    with atomic_path(markdown) as tmp:
        tmp.write_text(_markdown(rows, note, pretext, compared, summary))
    rich_console().print(_rich_table(rows, "memdpc quickstart (percent, 95 % intervals)", note))
    rich_console().print(_rich_table(pretext, file_kinds.QUICKSTART_PRETEXT_TITLE + " (top-1 in percent)"))
    rich_console().print(_rich_table(compared, file_kinds.QUICKSTART_COMPARE_TITLE + " (points)", summary))
    console.print(f"wrote {table}, {pretext_path}, {compare_path} and {markdown}")


def quickstart(
    out: str | Path = QuickstartOptions.out,
    tiny: bool = QuickstartOptions.tiny,
    workers: int = QuickstartOptions.workers,
    backend: str = QuickstartOptions.backend,
    seed: int = QuickstartOptions.seed,
    data: str = QuickstartOptions.data,
    recipe: str | Path | None = QuickstartOptions.recipe,
    console: Console | None = None,
    own: OwnFolders = OwnFolders(),
) -> list[dict[str, Any]]:
    """Run the whole job in ``out`` on the example family ``data``, with the sizes of the default profile, the
    tiny one or an example recipe's (``recipe``: a shipped recipe's name or a file with a ``quickstart``
    section); return the summary rows (also written as JSON and Markdown).

    ``own.videos``: a folder of the user's labelled videos (``<class>/<video>``) instead of the example family,
    with a third of its smallest class held out to test on where it has no test split; ``own.pool``: a folder of
    the user's unlabelled videos that MemDPC pretrains on instead of the labelled training videos (the recipe's
    ``pool`` of the example family otherwise), while the kNN monitor reads the labelled ones."""
    videos, pool = own.videos, own.pool
    if data not in EXAMPLE_FAMILIES:
        raise UserError(f"unknown example data {data!r}; choose one of {', '.join(EXAMPLE_FAMILIES)}")
    if recipe is not None and tiny:
        raise UserError("--tiny and --recipe choose the run's sizes both; give one of them")
    console = console or rich_console(stderr=True)
    out = Path(out)
    p = _recipe_profile(recipe, data) if recipe is not None else PROFILES["tiny" if tiny else "default"]
    record: dict[str, Any] = {"data": data, "seed": seed, "tiny": tiny}
    if videos is not None:
        record = {"videos": str(Path(videos).resolve()), "pool": pool and str(Path(pool).resolve()), **record}
        del record["data"]
    _check_same_run(out, {**record, "recipe": str(recipe)} if recipe is not None else record)
    with _torch_threads(p.threads):
        return _run(out, p, data, seed, workers, backend, own, console)


@contextmanager
def _torch_threads(threads: int) -> Iterator[None]:
    """Torch on ``threads`` threads inside the block (0: as it is), its count before restored after."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run(
    out: Path, p: Profile, data: str, seed: int, workers: int, backend: str, own: OwnFolders, console: Console
) -> list[dict[str, Any]]:
    """The job of :func:`quickstart`, its options checked."""
    videos, pool = own.videos, own.pool
    if videos is None:
        index = _data(out, p, data, seed, console)
    else:
        index = _own(out, Path(videos), "folder", seed, console)
    frames = _frames(out, index, p, workers, console)
    shards = _shards(out, frames, index, p, seed, console)
    pretrain = shards
    of = " (the pool)"
    if pool is not None:
        pool_index = _own(out / "pool", Path(pool), UNLABELLED, seed, console, of)
        pool_frames = _frames(out / "pool", pool_index, p, workers, console, of)
        pretrain = _shards(out / "pool", pool_frames, pool_index, p, seed, console, ("train", "val"), of)
    elif p.pool and videos is not None:
        console.print(
            "note: the recipe pretrains on a pool of unlabelled videos; without --pool, on your labelled "
            "videos' training split",
            markup=False,
        )
    elif p.pool:
        pool_seed = seed + POOL_SEED
        pool_index = _pool(out / "pool", p, data, pool_seed, console)
        pool_frames = _frames(out / "pool", pool_index, p, workers, console, of)
        pretrain = _shards(out / "pool", pool_frames, pool_index, p, pool_seed, console, ("train", "val"), of)
    monitor = shards if pretrain != shards else None  # the labelled videos: the pool's labels are not used
    configs = {s: _train_config(out, pretrain, s, p, seed, workers, backend, monitor) for s in p.streams}
    ckpts = _checkpoints(configs, p, console)
    results = _evaluate(out, shards, ckpts, p, workers, backend, console)
    monitors = {s: knn_monitor(Path(c.out), p.checkpoint) for s, c in configs.items()}
    # the kNN monitor's queries: the labelled val videos
    monitored = sum(v.split == "val" for v in read_index(index))
    rows = summary_table(results, _notes(monitors, monitored))
    _write(out, rows, sample_note(results), pretext_table(ckpts, configs), comparison_table(results), console)
    _report(out, console)
    return rows


def own_commands(recipe: str | Path, own: OwnFolders, work: str) -> list[str]:
    """The verbs ``memdpc quickstart --recipe RECIPE --videos VIDEOS [--pool POOL]`` runs (``own``), one command a step,
    with the recipe's sizes and the hold-outs of the folders as they are now: the labelled folder indexed,
    preprocessed and sharded, the pool (if any) likewise, each stream pretrained and both random-init
    baselines written, all three evaluated on the labelled videos, then paired against each other (and the
    streams fused, where the recipe has both)."""
    videos, pool = own.videos, own.pool
    r = load_recipe(recipe)
    p = _recipe_profile(recipe, next(iter(EXAMPLE_FAMILIES)))
    ref = config_ref(r.path)
    lines = [
        f"# {ref} on your own videos: {videos} (labelled: <class>/<video>)"
        + (f", pretrained on {pool}" if pool else "")
    ]
    if r.notes:
        lines.append(f"# note: {' '.join(r.notes.split())}")
    shard = flags(
        {
            "blocks": p.clip.num_blocks,
            "block_len": p.clip.block_len,
            "clip_stride": p.clip.stride,
            "window_step": p.window_step,
            "max_count": p.max_count,
        }
    )
    streams = ",".join(p.streams)

    def prepare(folder: str | Path, layout: str, root: str, splits: tuple[str, ...]) -> list[str]:
        held = {k: v for k, v in flat(hold_outs(folder, layout)).items() if v and k != "split"}
        out = [
            f"memdpc index {folder} --layout {layout} {flags(held)} --out {root}/index.jsonl",
            f"memdpc preprocess flow {root}/index.jsonl --out {root}/frames --streams {streams} "
            f"--size {p.data['size']} {flags(p.tvl1)}",
        ]
        return out + [
            f"memdpc shard {root}/frames --index {root}/index.jsonl --stream {s} --split {split} "
            f"--out {root}/shards {shard}"
            for s in p.streams
            for split in splits
        ]

    lines += prepare(videos, "folder", work, ("train", "val", "test"))
    pretrain, monitor = f"{work}/shards", ""
    if pool is not None:
        lines += prepare(pool, UNLABELLED, f"{work}/pool", ("train", "val"))
        pretrain, monitor = f"{work}/pool/shards", f" --knn-shards {work}/shards"
    ckpts = {}
    for s in p.streams:
        train = f"memdpc train --config {ref} --stream {s} --shards {pretrain}"
        lines.append(f"{train} --out {work}/runs/{s}{monitor}")
        lines.append(f"{train} --out {work}/runs/random-{s} --init-only")
        lines.append(f"{train} --out {work}/runs/random-bn-{s} --init-only --bn-from-data")
        ckpts |= {
            ("memdpc", s): f"{work}/runs/{s}/checkpoints/{p.checkpoint}.pt",
            ("random", s): f"{work}/runs/random-{s}/checkpoints/init.pt",
            ("random_bn", s): f"{work}/runs/random-bn-{s}/checkpoints/init.pt",
        }
    results = {}
    for (model, s), ckpt in ckpts.items():
        for task, kind in (("retrieve", "retrieval"), ("probe", "probe-linear")):
            folder = f"{work}/eval/{model}-{s}"
            lines.append(f"memdpc eval {task} {ckpt} --config {ref} --shards {work}/shards --out {folder}")
            results[model, s, kind] = f"{folder}/{kind}-{s}.json"
    streams_compared = list(p.streams)
    if p.streams == STREAMS:
        lines += _fuse_lines(results, p, work)
        streams_compared.append("fused")
    lines += [
        f"memdpc eval compare {results['memdpc', s, kind]} {results[baseline, s, kind]}"
        for baseline in BASELINES
        for s in streams_compared
        for kind in ("retrieval", "probe-linear")
    ]
    return lines


def _fuse_lines(results: dict, p: Profile, work: str) -> list[str]:
    """The fusions of each model's two streams, as verbs; adds their results to ``results``."""
    lines = []
    for model in MODELS:
        for kind in ("retrieval", "probe-linear"):
            fused = f"{work}/eval/{model}-fused/{kind}.json"
            chosen = " --choose-weights" if p.chooses_weights(kind) else ""
            lines.append(
                f"memdpc eval --fuse {results[model, 'rgb', kind]} {results[model, 'flow', kind]} "
                f"--out {fused}{chosen}"
            )
            results[model, "fused", kind] = fused
    return lines


def _recipe_profile(recipe: str | Path, family: str) -> Profile:
    """The profile of an example recipe (a recipe with a ``quickstart`` section) for the family ``family``."""
    r = load_recipe(recipe)
    if not r.quickstart:
        raise UserError(
            f"{r.path}: not an example recipe (it has no quickstart section); memdpc recipes {r.name} prints its "
            "commands"
        )
    return profile_from(r.quickstart, f"{r.path}: quickstart", family)


def _report(out: Path, console: Console) -> Path:
    """The page of the whole run (``memdpc report``): the table, curves, sample clips, retrieval strips."""
    page = write_report(out)
    console.print(
        f"report: {page} (open it in a browser; `memdpc report {out}` writes it again)",
        markup=False,
        soft_wrap=True,
    )
    return page
