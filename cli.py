"""The ``memdpc`` command line: parses options and calls one library function per command, nothing more.

User errors (:class:`memdpc.errors.UserError`) become a one-line message and exit code 2.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

import click
from click.core import ParameterSource
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from memdpc import __version__, interrupts
from memdpc.errors import UserError
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
from memdpc.pipeline.backends import BACKENDS as LOADER_BACKENDS
from memdpc.pipeline.clip import EVAL_CROPS
from memdpc.pipeline.shard import run_shard
from memdpc.pipeline.shard_plan import SHORT_POLICIES, SPLITS
from memdpc.preprocess.datasets import READERS, make_index
from memdpc.preprocess.examples.families import EXAMPLE_FAMILIES
from memdpc.preprocess.examples.layout import CODECS, ExampleConfig
from memdpc.preprocess.examples.photos import PhotoConfig, make_photos
from memdpc.preprocess.examples.synthetic import SyntheticConfig, make_synthetic
from memdpc.show_options import ShowOptions
from memdpc.streams import FLOW, RGB, STREAMS

console = Console(stderr=True)
# an output folder: click rejects an existing file of that name before any work starts
OUT_DIR = click.Path(path_type=Path, file_okay=False)


class _Group(click.Group):
    """A click group that turns UserError from any command into a one-line usage error (exit 2), and an
    interrupt into what the verb kept and exit code 128 + the signal (130 for SIGINT, 143 for SIGTERM)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as e:
            raise click.UsageError(str(e)) from None
        except KeyboardInterrupt as e:
            stop = interrupts.as_interrupted(e)
            console.print(f"[yellow]interrupted ({stop}):[/yellow] " + escape("; ".join(stop.notes) or "nothing kept"),
                          soft_wrap=True)
            ctx.exit(stop.exit_code)


def _group(**kw):
    return click.group(cls=_Group, **kw)


@_group()
@click.version_option(__version__, prog_name="memdpc")
def main() -> None:
    """memdpc: self-supervised video representation learning with Memory-augmented Dense Predictive Coding."""
    interrupts.install()


# --------------------------------------------------------------------------------------------- index
_INDEX = {name: p.default for name, p in inspect.signature(make_index).parameters.items()}  # library defaults

@main.command("index")
@click.argument("dataset_root", type=click.Path(path_type=Path))
@click.option(
    "--layout",
    type=click.Choice(list(READERS)),
    required=True,
    help="Dataset layout of DATASET_ROOT.",
)
@click.option("--split", type=click.IntRange(1, 3), default=_INDEX["split"], show_default=True,
              help="Official split 1–3.")
@click.option(
    "--test-per-class",
    type=click.IntRange(min=0),
    default=_INDEX["test_per_class"],
    show_default=True,
    help="Move this many training videos per class to a 'test' split (for a folder without test/).",
)
@click.option(
    "--val-per-class",
    type=click.IntRange(min=0),
    default=_INDEX["val_per_class"],
    show_default=True,
    help="Then move this many training videos per class to a 'val' split.",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=None,
    help="Draw the held-out videos at random per class with this seed (default: the last ones by id).",
)
@click.option(
    "--out",
    "out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Index file to write (default: DATASET_ROOT/index_<layout>_split<N>.jsonl).",
)
def index_cmd(dataset_root: Path, layout: str, **kw) -> None:
    """Read a dataset in its official layout and write one video index (JSONL)."""
    from memdpc.preprocess.video_index import summary

    report = make_index(dataset_root, layout, **kw)
    counts = summary(report.records)
    table = Table(title=f"{report.path} — {len(report.records)} videos")
    table.add_column("class")
    for s in counts:
        table.add_column(s, justify="right")
    for name in sorted({n for c in counts.values() for n in c}):
        table.add_row(name or "(none)", *(str(c.get(name, 0)) for c in counts.values()))
    table.add_row("[bold]total", *(f"[bold]{sum(c.values())}" for c in counts.values()))
    Console().print(table)
    for w in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}", soft_wrap=True)
    console.print(
        f"wrote {report.path}; next: memdpc preprocess flow {report.path} --out FRAMES --streams rgb,flow "
        "(FRAMES: a new folder for the frame archives)",
        soft_wrap=True,
    )


# ---------------------------------------------------------------------------------------------- data
@_group()
def data() -> None:
    """Built-in example data."""


main.add_command(data)


def _example_options(defaults: ExampleConfig):
    """The options of an example family's command, showing that family's defaults."""
    def wrap(fn):
        opts = [
            click.argument("out", type=OUT_DIR),
            click.option("--videos-per-class", type=int, default=defaults.videos_per_class, show_default=True,
                         help="Videos per class."),
            click.option("--frames", type=int, default=defaults.frames, show_default=True, help="Frames per video."),
            click.option("--size", type=int, default=defaults.size, show_default=True,
                         help="Frame width and height in pixels."),
            click.option("--classes", "num_classes", type=int, default=defaults.num_classes, show_default=True,
                         help=f"Number of classes (≤ {len(defaults.classes)})."),
            click.option("--fps", type=float, default=defaults.fps, show_default=True,
                         help="Frame rate written in the files."),
            click.option("--codec", type=click.Choice(CODECS), default=defaults.codec, show_default=True,
                         help="Video codec (xvid/mjpg: .avi, mp4v: .mp4)."),
            click.option("--seed", type=int, default=defaults.seed, show_default=True,
                         help="Random seed (same seed, same bytes)."),
        ]
        for opt in reversed(opts):
            fn = opt(fn)
        return fn
    return wrap


def _wrote_example(root: Path, cfg: ExampleConfig) -> None:
    Console().print(f"wrote {cfg.num_classes} classes × {cfg.videos_per_class} videos to {root}")
    Console().print(f"next: memdpc index {root} --layout ucf101")


@data.command("synthetic")
@_example_options(SyntheticConfig())
def data_synthetic(out: Path, **kw) -> None:
    """Write the built-in motion-class dataset to OUT in the UCF101 layout."""
    cfg = SyntheticConfig(**kw)
    _wrote_example(make_synthetic(out, cfg), cfg)


@data.command("photos")
@_example_options(PhotoConfig())
def data_photos(out: Path, **kw) -> None:
    """Write the held-out family (camera and object motions over photographs) to OUT in the UCF101 layout."""
    cfg = PhotoConfig(**kw)
    _wrote_example(make_photos(out, cfg), cfg)


# ---------------------------------------------------------------------------------------- preprocess
@_group()
def preprocess() -> None:
    """Decode videos once into per-video archives of RGB frames and/or TV-L1 flow."""


main.add_command(preprocess)

_TVL1_OPTIONS = [  # (option, field, type, help); defaults are OpenCV's CPU DualTVL1 defaults
    ("--tau", "tau", float, "TV-L1 time step (≤ 0.25)."),
    ("--lambda", "lambda_", float, "TV-L1 data-term weight (smaller: smoother flow)."),
    ("--theta", "theta", float, "TV-L1 coupling weight."),
    ("--scales", "scales", int, "Pyramid levels."),
    ("--scale-step", "scale_step", float, "Pyramid down-scaling factor."),
    ("--warps", "warps", int, "Warpings per pyramid level."),
    ("--epsilon", "epsilon", float, "Stopping threshold."),
    ("--inner-iterations", "inner_iterations", int, "Inner iterations per warp."),
    ("--outer-iterations", "outer_iterations", int, "Outer iterations per warp."),
    ("--median-filtering", "median_filtering", int, "Median filter size on the flow (1 = off, 3, 5)."),
]


def _preprocess_options(default_streams: str):
    from memdpc.preprocess.decode import DecodeSpec
    from memdpc.preprocess.encode import (
        DEFAULT_FLOW_ENCODING,
        FLOW_ENCODING,
        FLOW_ENCODING_RGB,
        FLOW_ENCODINGS,
        RGB_ENCODING,
    )
    from memdpc.preprocess.flow.backends import AUTO, BACKENDS
    from memdpc.preprocess.flow.tvl1_params import TVL1Params
    from memdpc.preprocess.job import PreprocessConfig

    defaults, config = TVL1Params(), PreprocessConfig(out="")
    decode = DecodeSpec()
    opts = [
        click.argument("index", type=click.Path(path_type=Path)),
        click.option(
            "--out",
            type=OUT_DIR,
            required=True,
            help="Output root: writes OUT/rgb/<id>.tar and/or OUT/flow/<id>.tar.",
        ),
        click.option(
            "--streams",
            default=default_streams,
            show_default=True,
            help="Streams from one decode: rgb, flow or rgb,flow.",
        ),
        click.option(
            "--size",
            type=int,
            default=decode.size,
            show_default=True,
            help="Resize the short side to this, keeping the aspect ratio (0: keep the size).",
        ),
        click.option(
            "--square",
            type=int,
            default=decode.square,
            show_default=True,
            help="Resize to SQUARE×SQUARE instead (the paper's 256×256; 0: off).",
        ),
        click.option(
            "--fps",
            type=float,
            default=decode.fps,
            show_default=True,
            help="Resample to this frame rate (0: the native rate).",
        ),
        click.option(
            "--quality",
            type=int,
            default=RGB_ENCODING.quality,
            show_default=True,
            help="RGB JPEG quality 1–100.",
        ),
        click.option(
            "--flow-encoding",
            type=click.Choice(FLOW_ENCODINGS),
            default=DEFAULT_FLOW_ENCODING,
            show_default=True,
            help="Flow JPEG: ycc = standard 4:4:4 (any decoder), rgb = no colour transform (smaller, more exact).",
        ),
        click.option(
            "--flow-quality",
            type=int,
            default=None,
            help=f"Flow JPEG quality 1–100 (default: {FLOW_ENCODING.quality} for ycc, {FLOW_ENCODING_RGB.quality} for rgb).",
        ),
        click.option(
            "--third-channel",
            type=click.Choice(["128", "0"]),
            default=str(config.third_channel),
            show_default=True,
            help="Constant third channel of flow images (128 = zero flow after the mapping).",
        ),
        click.option(
            "--flow-backend",
            type=click.Choice([AUTO, *sorted(BACKENDS)]),
            default=config.flow_backend,
            show_default=True,
            help="TV-L1 implementation: opencv or native (CPU, one video per worker; native: OpenCV's flow "
            "bit for bit, compiled, faster) or a GPU one, fed batches from many videos at once; auto: the "
            "fastest GPU one where CUDA is available, else native (else opencv, with a note).",
        ),
        click.option(
            "--device",
            default=config.device,
            show_default=True,
            help="Flow device(s): cpu, cuda (every visible GPU), cuda:0,2 (those GPUs; one process each), "
            "or auto.",
        ),
        click.option(
            "--workers",
            type=int,
            default=config.workers,
            show_default=True,
            help="Local worker processes of the per-video (opencv, native) path, one thread each.",
        ),
        click.option(
            "--threads",
            type=int,
            default=config.threads,
            show_default=True,
            help="Decode threads and encode threads per device of the batched (GPU) path "
            "(0: the CPU cores divided among the devices).",
        ),
        click.option(
            "--dask", default=None, help="Run on the Dask cluster at this scheduler address instead."
        ),
        click.option(
            "--part",
            default="{}/{}".format(*config.part),
            show_default=True,
            help="Take videos I, I+N, I+2N, … of the index (0 ≤ I < N), e.g. $SLURM_ARRAY_TASK_ID/N.",
        ),
        click.option("--strict", is_flag=True, help="Exit with status 1 if any video failed."),
        click.option(
            "--keep-partial",
            is_flag=True,
            help="Keep the frames of a video that decodes only partway (default: a failure).",
        ),
        click.option(
            "--overwrite",
            is_flag=True,
            help="Rewrite archives in OUT made with other settings or from another source file "
            "(default: refuse them).",
        ),
        click.option(
            "--report",
            type=click.Path(path_type=Path),
            default=None,
            help="Run report JSON (default: OUT/preprocess-report[-partIofN].json).",
        ),
        click.option(
            "--dry-run",
            is_flag=True,
            help="Print what the run will do (videos, frames, disk, and the time from a short timed warm-up) "
            "and write nothing.",
        ),
    ]
    opts += [
        click.option(o, f, type=t, default=getattr(defaults, f), show_default=True, help=h)
        for o, f, t, h in _TVL1_OPTIONS
    ]

    def wrap(fn):
        for opt in reversed(opts):
            fn = opt(fn)
        return fn

    return wrap


def _run_preprocess(index: Path, dry_run: bool, **kw) -> None:
    from memdpc.preprocess.run import preprocess as run
    from memdpc.report_tables import print_preprocess_report

    tvl1 = {f: kw.pop(f) for _, f, _, _ in _TVL1_OPTIONS}
    kw["third_channel"] = int(kw["third_channel"])
    kw["report"] = str(kw["report"]) if kw["report"] else None
    if dry_run:
        from memdpc.preprocess.plan import plan

        Console().print("\n".join(plan(index, tvl1=tvl1, **kw).lines()), markup=False, soft_wrap=True)
        return
    report = run(index, tvl1=tvl1, **kw)
    print_preprocess_report(report, index, Console(), console)
    if report["failures"] and kw["strict"]:
        raise SystemExit(1)


@preprocess.command("frames")
@_preprocess_options(RGB)
def preprocess_frames(index: Path, **kw) -> None:
    """RGB JPEG frames of every video in INDEX (a video index JSONL from `memdpc index`)."""
    _run_preprocess(index, **kw)


@preprocess.command("flow")
@_preprocess_options(FLOW)
def preprocess_flow(index: Path, **kw) -> None:
    """TV-L1 flow images of every video in INDEX, computed from the video (n frames → n − 1 flows)."""
    _run_preprocess(index, **kw)


# --------------------------------------------------------------------------------------------- shard
_SHARD = {name: p.default for name, p in inspect.signature(run_shard).parameters.items()}  # the library's defaults


@main.command("shard")
@click.argument("archive_root", type=click.Path(path_type=Path), required=False)
@click.option("--index", "index", type=click.Path(path_type=Path), help="Video index (JSONL) of the videos.")
@click.option("--stream", type=click.Choice(STREAMS), help="Which archives to shard.")
@click.option("--out", "out", type=OUT_DIR, help="Shard folder (gets <stream>/ inside).")
@click.option(
    "--split",
    type=click.Choice(SPLITS),
    default="train",
    show_default=True,
    help="Videos to shard; train/all: train windows, shuffled; test/val: eval windows (0, 59, 118, …).",
)
@click.option(
    "--window-step",
    type=click.IntRange(min=1),
    default=_SHARD["window_step"],
    show_default=True,
    help="Train windows start every N source frames (UCF101-length videos give 3–4 windows).",
)
@click.option(
    "--short",
    type=click.Choice(SHORT_POLICIES),
    default=_SHARD["short"],
    show_default=True,
    help="Videos shorter than one window: pad with the last frame, or drop them (as the reference code).",
)
@click.option(
    "--max-count",
    type=click.IntRange(min=1),
    default=_SHARD["max_count"],
    show_default=True,
    help="Most samples per shard.",
)
@click.option(
    "--max-size",
    type=click.IntRange(min=1),
    default=_SHARD["max_size"],
    show_default=True,
    help="Most bytes per shard (a larger single sample gets a shard of its own).",
)
@click.option("--seed", type=int, default=_SHARD["seed"], show_default=True, help="Seed of the train shuffle.")
@click.option("--blocks", "num_blocks", type=click.IntRange(min=1), default=_SHARD["clip"].num_blocks,
              show_default=True, help="Blocks per sample.")
@click.option("--block-len", type=click.IntRange(min=1), default=_SHARD["clip"].block_len, show_default=True,
              help="Frames per block.")
@click.option("--clip-stride", "stride", type=click.IntRange(min=1), default=_SHARD["clip"].stride,
              show_default=True,
              help="Source frames between the frames of a sample (a sample spans blocks × block-len × stride).")
@click.option("--strict", is_flag=True, help="Stop at the first bad video (default: skip and report it).")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Rewrite the split's shards in --out made with other options or from archives changed since "
    "(default: refuse).",
)
@click.option(
    "--verify",
    "verify",
    type=click.Path(path_type=Path),
    default=None,
    help="Instead of sharding: re-read every shard in DIR and check it against its manifest and index.",
)
def shard_cmd(archive_root: Path | None, verify: Path | None, **kw) -> None:
    """Cut per-video frame archives into WebDataset shards of 40-frame samples, with DALI indexes."""
    from memdpc.pipeline.clip import ClipSpec
    from memdpc.pipeline.manifest import verify_shards
    from memdpc.report_tables import print_shard_report, print_verify

    if verify is not None:
        if not print_verify(verify_shards(verify), Console()):
            raise SystemExit(1)
        return
    missing = [f"--{o}" for o in ("index", "stream", "out") if not kw[o]]
    missing = ["ARCHIVE_ROOT"] * (archive_root is None) + missing
    if missing:
        raise click.UsageError(f"missing {', '.join(missing)} (or give --verify DIR)")
    index, stream, out, split = kw.pop("index"), kw.pop("stream"), kw.pop("out"), kw.pop("split")
    kw["clip"] = ClipSpec(kw.pop("num_blocks"), kw.pop("block_len"), kw.pop("stride"))
    console = Console()
    print_shard_report(
        run_shard(archive_root, index, stream, out, split, console=console, **kw), console, next_step=True
    )


# --------------------------------------------------------------------------------------------- train
# the names other verbs use (eval, quickstart, preprocess, bench: --workers; shard: --blocks); the field's own
# name still works
_TRAIN_ALIASES = {"num_workers": "--workers", "num_blocks": "--blocks"}


def _train_options(fn):
    """One option per training-config field (memdpc.train.config), default None = "not given here"."""
    from memdpc.train.config import option_specs

    for spec in reversed(option_specs()):
        flag = "--" + spec.name.replace("_", "-")
        default = ",".join(map(str, spec.default)) if isinstance(spec.default, list) else spec.default
        text = f"{spec.help} [default: {default if default != '' else 'none'}]"
        if spec.kind == "bool":
            fn = click.option(f"{flag}/--no-{flag[2:]}", spec.name, default=None, help=text)(fn)
        else:
            kind = click.Choice(spec.choices) if spec.choices else {"int": int, "float": float}.get(spec.kind, str)
            flags = (_TRAIN_ALIASES[spec.name], flag) if spec.name in _TRAIN_ALIASES else (flag,)
            fn = click.option(*flags, spec.name, type=kind, default=None, help=text)(fn)
    return click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
                        help="YAML or TOML file of settings, or a recipe (path or short name: `memdpc recipes` "
                             "lists them; its train section); options given on the command line override it.")(fn)


@main.command("train")
@_train_options
@click.option("--init-only", is_flag=True,
              help="Write the model the run starts from (untrained and seeded, or the --init weights) as "
                   "<out>/checkpoints/init.pt and stop (random-init baseline).")
@click.option("--bn-from-data", is_flag=True,
              help="With --init-only: BatchNorm statistics of the training split's clips (no weight changes), "
                   "the fair random-init baseline of frozen evaluations.")
@click.option("--dry-run", is_flag=True,
              help="Print what the run will do (clips and steps per epoch, global batch, schedule, disk, the wall "
                   "time estimated from a few timed steps on this device) and write nothing.")
def train_cmd(config_file: Path | None, init_only: bool, bn_from_data: bool, dry_run: bool, **options) -> None:
    """Self-supervised pretraining on one stream's shards (runs alone, under torchrun or srun).

    Example: memdpc train --stream rgb --shards shards/ --out runs/rgb. A run directory that already holds
    a checkpoint resumes exactly where it stopped; --init CHECKPOINT starts a new run from given weights.
    SIGINT (Ctrl-C) and SIGTERM stop it at the next step, with checkpoints/last.pt saved there.
    """
    from memdpc.train.config import config_from_dict, read_config_file

    values = read_config_file(config_file) if config_file else {}
    values.update({k: v for k, v in options.items() if v is not None})
    config = config_from_dict(values, where=str(config_file or "options"))
    if bn_from_data and not init_only:
        raise UserError("--bn-from-data goes with --init-only (a training run's BatchNorm statistics are the data's)")
    if config.init and "stream" not in values:
        # --stream's default (rgb) would train weights of the other stream with a warning that --stream asked for it
        raise UserError(f"--init {config.init}: say which stream the run trains on (--stream rgb|flow)")
    if dry_run:
        if init_only:
            raise UserError("--dry-run plans a training run; --init-only writes one checkpoint and needs no plan")
        from memdpc.train.dry_run import plan_run

        plan = plan_run(config)
        if plan is not None:  # rank 0
            Console().print("\n".join(plan.lines()), markup=False, soft_wrap=True)
        return
    if init_only:
        from memdpc.train.checkpoint import next_command, write_initial_checkpoint

        path = write_initial_checkpoint(config, Path(config.out) / "checkpoints" / "init.pt", bn_from_data)
        what = "the --init weights" if config.init else f"untrained, seed {config.seed}"
        what += ", BatchNorm statistics of the training clips" if bn_from_data else ""
        Console(stderr=True).print(f"wrote {path} ({what})\nnext: {next_command(path, config.shards)}",
                                   markup=False, soft_wrap=True)
        return
    from memdpc.train.loop import train

    train(config)  # ends by naming what it wrote


# ------------------------------------------------------------------------------------------- recipes
@main.command("recipes")
@click.argument("name", required=False)
@click.option("--datasets", "data", default="DATA", show_default=True,
              help="Folder of the datasets in their official layouts, one sub-folder each (ucf101, hmdb51, k400).")
@click.option("--work", default="WORK", show_default=True, help="Folder for everything the commands write.")
def recipes_cmd(name: str | None, data: str, work: str) -> None:
    """The paper's experiments, one recipe per table row: list them, or print the commands of recipe NAME (a short
    name or a path), from the datasets to the figures to expect."""
    from memdpc.recipe import commands, load, names
    from memdpc.report_tables import print_recipes

    if name is not None:
        Console().print("\n".join(commands(load(name), data, work)), markup=False, soft_wrap=True)
    else:
        print_recipes([load(n) for n in names()], Console())


# ------------------------------------------------------------------------------------------- convert
@main.command("convert")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option(
    "--to",
    "to",
    type=click.Choice(["memdpc", "reference"]),
    default="memdpc",
    show_default=True,
    help="memdpc: import a reference MemDPC/DPC/classifier file; reference: export back to its layout.",
)
@click.option(
    "--stream",
    type=click.Choice(STREAMS),
    default=None,
    help="Stream the weights were trained on, recorded in the imported checkpoint (evaluation needs it).",
)
@click.option(
    "--size",
    "input_size",
    type=click.IntRange(min=1),
    default=None,
    help="Input size the weights were trained at, recorded as evaluation's default (unknown: 128).",
)
def convert_cmd(checkpoint: Path, out: Path, to: str, stream: str | None, input_size: int | None) -> None:
    """Convert CHECKPOINT between the reference implementation's layout and memdpc's; write OUT."""
    from memdpc.model.convert import convert_file

    report = convert_file(checkpoint, out, to=to, stream=stream, input_size=input_size)
    table = Table(title=f"{checkpoint} -> {out} ({report.kind}, {report.config['name']})")
    table.add_column("keys")
    table.add_column("count", justify="right")
    table.add_column("names")
    for label, keys in (
        ("unused (in the source, not used)", report.unused),
        ("missing (left at initial values)", report.missing),
    ):
        table.add_row(label, str(len(keys)), "\n".join(keys) or "-")
    Console().print(table)
    if to == "memdpc":
        verb = "classify" if report.kind == "classifier" else "retrieve"
        stream_opt = "" if stream else " --stream rgb|flow"
        Console().print(f"next: memdpc eval {verb} {out} --shards SHARDS --out EVAL_DIR{stream_opt}", markup=False,
                        soft_wrap=True)


# ---------------------------------------------------------------------------------------------- eval
@_group(invoke_without_command=True)
@click.option("--fuse", "fuse_paths", nargs=2, type=click.Path(path_type=Path), default=None,
              metavar="RGB_RESULT FLOW_RESULT", help="Late fusion of two results files (same as `eval fuse`).")
@click.option("--weights", nargs=2, type=float, default=(1.0, 1.0), show_default=True,
              help="With --fuse: weights of the two results.")
@click.option("--out", "--fuse-out", "out", type=click.Path(path_type=Path), default=None,
              help="With --fuse: results file to write (default: beside the first input).")
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
        raise click.UsageError("--out and --overwrite before the verb go with --fuse; give a verb's own after it, e.g. "
                               "memdpc eval retrieve CHECKPOINT --shards SHARDS --out EVAL_DIR")
    elif ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


main.add_command(eval_group, "eval")


def _evaluate(task: str, checkpoint: Path, **kw) -> None:
    with interrupts.deferred():  # a signal during the imports (torch, DALI, Triton) is raised after them
        from memdpc.eval.run import evaluate
        from memdpc.report_tables import print_result

    path = evaluate(task, checkpoint, **kw)
    if path is not None:  # rank 0
        print_result(path, Console())


def _fuse(result_a: Path, result_b: Path, **kw) -> None:
    with interrupts.deferred():  # a signal during the imports (torch, DALI, Triton) is raised after them
        from memdpc.eval.run import fuse
        from memdpc.report_tables import print_result

    print_result(fuse(result_a, result_b, **kw), Console())


def _eval_options(fn):
    """Options shared by every `memdpc eval` task."""
    opts = [
        click.argument("checkpoint", type=click.Path(path_type=Path)),
        click.option("--shards", type=click.Path(path_type=Path), required=True,
                     help="Shard folder (holding <stream>/manifest-<split>.json)."),
        click.option("--out", type=OUT_DIR, required=True,
                     help="Folder for results JSON/npz, feature caches and plots."),
        click.option("--stream", type=click.Choice(STREAMS), default=None,
                     help="Stream to evaluate (default: the checkpoint's; another one is refused, except "
                          "for a converted checkpoint, with a warning)."),
        click.option("--dataset", default=None, help="Dataset name in the results (default: the shard folder's)."),
        click.option("--train-split", default=EvalData.train_split, show_default=True, help="Split to train on / the gallery."),
        click.option("--test-split", default=EvalData.test_split, show_default=True, help="Split to test / the queries."),
        click.option("--size", type=int, default=None, help="Input size (default: the checkpoint's training size)."),
        click.option("--batch-size", type=click.IntRange(min=1), default=EvalData.batch_size, show_default=True,
                     help="Clips per batch (per rank)."),
        click.option("--backend", type=click.Choice(LOADER_BACKENDS), default=EvalData.backend, show_default=True,
                     help="Loader backend."),
        click.option("--workers", "--num-workers", "num_workers", type=click.IntRange(min=0), default=None,
                     help="Loader workers (torch) / threads (DALI)."),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                     help="Where the model runs."),
        click.option("--plot", is_flag=True, help="Also write PNG figures."),
        click.option("--overwrite", is_flag=True,
                     help="Replace results in --out made from another checkpoint (refused otherwise), and start "
                          "an unfinished finetuning of other settings over."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _reads_recipe(task: str):
    """A ``--config RECIPE`` option: the recipe's ``eval`` options fill those the command line does not give."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(**kw):
            name = kw.pop("config_file")
            if name is not None:
                kw.update(_recipe_options(click.get_current_context(), task, name))
            return fn(**kw)

        return click.option("--config", "config_file", default=None, metavar="RECIPE",
                            help="A recipe (path or short name; `memdpc recipes` lists them) whose eval options "
                                 "are taken where the command line gives none.")(run)
    return wrap


def _recipe_options(ctx: click.Context, task: str, name: str) -> dict:
    from memdpc.recipe import eval_settings, resolve

    params = {p.name: p for p in ctx.command.params if isinstance(p, click.Option) and p.name != "config_file"}
    params |= {o.lstrip("-").replace("-", "_"): p for p in params.values() for o in p.opts}
    out = {}
    for key, value in eval_settings(name, task).items():
        if key not in params:
            raise UserError(f"{resolve(name)}: eval: memdpc eval {task} has no option --{key.replace('_', '-')}")
        p = params[key]
        if ctx.get_parameter_source(p.name) is ParameterSource.DEFAULT:
            try:
                out[p.name] = p.type_cast_value(ctx, str(value) if isinstance(p.type, click.Choice) else value)
            except click.BadParameter as e:
                raise UserError(f"{resolve(name)}: eval: {key}: {e.message}") from None
    return out


def _fit_options(defaults: FitConfig):
    """The training options of an eval task that fits a head or a network, showing the task's defaults."""
    def wrap(fn):
        opts = [
            click.option("--epochs", type=click.IntRange(min=1), default=defaults.epochs, show_default=True,
                         help="Epochs."),
            click.option("--lr", type=float, default=defaults.lr, show_default=True, help="Adam learning rate."),
            click.option("--lr-min", type=float, default=None,
                         help="Learning rate after the plateau decay [default: lr / 10]."),
            click.option("--weight-decay", type=float, default=defaults.weight_decay, show_default=True,
                         help="Adam weight decay."),
            click.option("--patience", type=click.IntRange(min=0), default=defaults.patience, show_default=True,
                         help="Epochs without training-loss improvement before the lr decays ×0.1 (once)."),
            click.option("--seed", type=int, default=defaults.seed, show_default=True, help="Random seed."),
        ]
        for opt in reversed(opts):
            fn = opt(fn)
        return fn
    return wrap


def _fit(kw: dict, batch_size: int | None = None) -> dict:
    fit = {k: kw.pop(k) for k in ("epochs", "lr", "lr_min", "weight_decay", "patience", "seed")}
    if batch_size is not None:
        fit["batch_size"] = batch_size
    return fit


@eval_group.command("retrieve")
@_reads_recipe("retrieve")
@_eval_options
@click.option("--chunk", type=click.IntRange(min=1), default=RETRIEVAL_CHUNK, show_default=True,
              help="Queries per similarity block (memory: chunk × gallery).")
def eval_retrieve(checkpoint: Path, **kw) -> None:
    """Nearest-neighbour retrieval: test videos query train videos; R@1/5/10/20/50."""
    _evaluate("retrieve", checkpoint, **kw)


@eval_group.command("probe")
@_reads_recipe("probe")
@_eval_options
@click.option("--linear/--mlp", "linear", default=True, show_default=True, help="Linear or MLP head.")
@click.option("--crops", type=click.Choice([str(k) for k in EVAL_CROPS]), default=str(EVAL_CROPS[0]), show_default=True,
              help="Test crops per window.")
@click.option("--dropout", type=float, default=PROBE_DROPOUT, show_default=True, help="Dropout before the head.")
@_fit_options(PROBE_FIT)
def eval_probe(checkpoint: Path, linear: bool, crops: str, **kw) -> None:
    """Linear / MLP probe on frozen, cached features; video-level top-1/top-5."""
    fit = _fit(kw)
    _evaluate("probe", checkpoint, head="linear" if linear else "mlp", crops=int(crops), fit=fit, **kw)


@eval_group.command("finetune")
@_reads_recipe("finetune")
@_eval_options
@click.option("--crops", type=click.Choice([str(k) for k in EVAL_CROPS]), default=str(EVAL_CROPS[0]), show_default=True,
              help="Test crops per window.")
@click.option("--dropout", type=float, default=FINETUNE_DROPOUT, show_default=True, help="Dropout before the last layer.")
@click.option("--label-fraction", type=float, default=1.0, show_default=True,
              help="Train on this seeded, stratified fraction of the train videos (e.g. 0.1).")
@click.option("--random-init", is_flag=True, help="Same architecture, random weights (baseline).")
@_fit_options(FINETUNE_FIT)
def eval_finetune(checkpoint: Path, crops: str, **kw) -> None:
    """End-to-end finetuning (Adam 1e-3, wd 1e-3, dropout 0.9, plateau decay); resumable."""
    fit = _fit(kw, kw["batch_size"])
    _evaluate("finetune", checkpoint, crops=int(crops), fit=fit, **kw)


@eval_group.command("classify")
@_eval_options
@click.option("--crops", type=click.Choice([str(k) for k in EVAL_CROPS]), default=str(EVAL_CROPS[0]), show_default=True,
              help="Test crops per window.")
def eval_classify(checkpoint: Path, crops: str, **kw) -> None:
    """Score a finetuned classifier as it is (e.g. a converted reference LC checkpoint); video-level top-1/top-5."""
    _evaluate("classify", checkpoint, crops=int(crops), **kw)


@eval_group.command("oops")
@_eval_options
@click.option("--index", type=click.Path(path_type=Path), required=True,
              help="Oops video index (JSONL from `memdpc index --layout oops`) with the failure times.")
@click.option("--mode", type=click.Choice(OOPS_MODES), default=OOPS_MODES[0], show_default=True,
              help="Train only the linear layer, or the whole network.")
@_fit_options(OOPS_FIT)
def eval_oops(checkpoint: Path, **kw) -> None:
    """Unintentional actions: per time step z_t ⊕ ẑ_t → intentional / transitional / unintentional."""
    fit = _fit(kw, kw["batch_size"] if kw["mode"] == "finetune" else None)
    _evaluate("oops", checkpoint, fit=fit, **kw)


@eval_group.command("fuse")
@click.argument("result_a", type=click.Path(path_type=Path))
@click.argument("result_b", type=click.Path(path_type=Path))
@click.option("--weights", nargs=2, type=float, default=(1.0, 1.0), show_default=True, help="Weights of A and B.")
@click.option("--out", "--fuse-out", "out", type=click.Path(path_type=Path), default=None,
              help="Results file to write (default: beside A).")
@click.option("--overwrite", is_flag=True, help="Replace other results at --out.")
def eval_fuse(result_a: Path, result_b: Path, weights, out: Path | None, overwrite: bool) -> None:
    """Late fusion of two results (RGB and flow): mean probabilities or summed similarities."""
    _fuse(result_a, result_b, out=out, weights=weights, overwrite=overwrite)


# ---------------------------------------------------------------------------------------- quickstart
@main.command("quickstart")
@click.option("--out", type=OUT_DIR, default=Path("quickstart"), show_default=True,
              help="Folder for everything the run makes (data, frames, shards, runs, eval, the table).")
@click.option("--tiny", is_flag=True, help="A reduced run (3 classes, 32² frames, 2–3 epochs) for CI and smoke tests.")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Preprocessing processes and loader workers.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed of every stage.")
@click.option("--data", type=click.Choice(EXAMPLE_FAMILIES), default=next(iter(EXAMPLE_FAMILIES)), show_default=True,
              help="Example family: the built-in synthetic motions, or the held-out photos (needs memdpc[photos]).")
@click.option("--backend", type=click.Choice(LOADER_BACKENDS), default="auto", show_default=True,
              help="Loader backend for training and evaluation (auto: DALI where installed).")
def quickstart_cmd(out: Path, tiny: bool, workers: int, seed: int, data: str, backend: str) -> None:
    """The main job end to end on example data: data, preprocess, shard, train rgb and flow, evaluate
    MemDPC against random init (retrieval, linear probe, late fusion) and print one table."""
    from memdpc.quickstart import quickstart

    quickstart(out, tiny=tiny, workers=workers, seed=seed, data=data, backend=backend)


# ---------------------------------------------------------------------------------------------- show
_SHOW = ShowOptions()


@main.command("show")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--out", type=OUT_DIR, required=True, help="Folder for the pictures (PNG, GIF).")
@click.option("--samples", type=click.IntRange(min=1), default=_SHOW.samples, show_default=True,
              help="Videos of a folder of frame archives; samples of a shard or split.")
@click.option("--frames", type=click.IntRange(min=1), default=_SHOW.frames, show_default=True,
              help="Frames on a video's contact sheet.")
@click.option("--split", default=_SHOW.split, help="A shard folder's split [default: train, else the first].")
@click.option("--augment", is_flag=True, help="Shard samples after the training augmentation (torch loader).")
@click.option("--size", type=click.IntRange(min=1), default=_SHOW.size, show_default=True,
              help="With --augment: the training size, as `memdpc train --size`.")
@click.option("--crop-size", type=click.IntRange(min=0), default=_SHOW.crop_size, show_default=True,
              help="With --augment: as `memdpc train --crop-size` (0: straight to --size).")
@click.option("--jitter-flow/--no-jitter-flow", default=_SHOW.jitter_flow, show_default=True,
              help="With --augment: colour jitter on flow too, as `memdpc train`.")
@click.option("--seed", type=int, default=_SHOW.seed, show_default=True, help="With --augment: the random draws.")
@click.option("--max-flow", type=float, default=_SHOW.max_flow,
              help="Flow speed in pixels drawn in full colour [default: each picture's own scale].")
@click.option("--shards", type=click.Path(path_type=Path), default=_SHOW.shards,
              help="Eval results: the shard folder they were evaluated on [default: the one they record].")
def show_cmd(path: Path, out: Path, **kw) -> None:
    """Pictures of PATH: a frame archive or folder of them (contact sheet + GIF, flow in colour), a shard or shard
    folder (samples as the model reads them), a run folder (curves) or an eval folder (retrieval strips,
    confusion matrices)."""
    from memdpc.show import show

    for written in show(path, out, ShowOptions(**kw)):
        Console().print(f"wrote {written}", markup=False, soft_wrap=True)
    console.print("next: open them in an image viewer, or `memdpc report FOLDER` for one page of a whole run "
                  "(e.g. a quickstart folder)", markup=False, soft_wrap=True)


@main.command("report")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--out", type=OUT_DIR, default=None,
              help="Folder for the page (index.html) and its pictures [default: FOLDER/report].")
def report_cmd(folder: Path, out: Path | None) -> None:
    """One static page of what FOLDER holds (a quickstart folder, or a folder of runs, eval results, shards and
    frame archives): results table, curves, sample clips, retrieval strips; it opens from the file system."""
    from memdpc.report_page import write_report

    page = write_report(folder, out)
    Console().print(f"wrote {page} and its pictures in {page.parent}", markup=False, soft_wrap=True)
    console.print(f"next: open {page.resolve().as_uri()} in a browser", markup=False, soft_wrap=True)


# --------------------------------------------------------------------------------------------- bench
@_group()
def bench() -> None:
    """Benchmarks: each prints a table and writes JSON."""


main.add_command(bench)


@bench.command("loader")
@click.argument("shards", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--stream", type=click.Choice(STREAMS), default=RGB, show_default=True, help="Stream.")
@click.option("--split", default="train", show_default=True, help="Split whose shards are read.")
@click.option("--size", type=int, default=128, show_default=True, help="Output clip size (full augmentation).")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Clips per batch.")
@click.option("--batches", type=int, default=8, show_default=True, help="Timed batches per run (after 1 warm-up).")
@click.option("--repeat", type=int, default=2, show_default=True, help="Alternating runs per loader (best counts).")
@click.option("--workers", type=int, default=2, show_default=True, help="DataLoader workers / DALI threads.")
@click.option("--device", default="cpu", show_default=True, help="cpu, or cuda for DALI mixed decode.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("bench/results/loader.json"),
              show_default=True, help="JSON result file.")
def bench_loader_cmd(shards: Path, **kw) -> None:
    """DALI vs the torch loader on SHARDS: clips/s and CPU-ms per clip, with full augmentation and with none."""
    from memdpc.bench.loader import LoaderBench, bench_loader

    bench_loader(LoaderBench(shards=shards, **kw))


if __name__ == "__main__":
    main()
