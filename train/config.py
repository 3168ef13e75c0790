"""The training configuration: one dataclass with the paper's defaults, loadable from YAML or TOML.

Every field is also a ``memdpc train`` option (:mod:`memdpc.commands.options`); the resolved config is written to
``<run dir>/config.yaml`` and compared on every restart, so a run directory always holds one experiment.
This module imports no torch so that the CLI stays fast to start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from memdpc.common.atomic import write_bytes_atomic
from memdpc.common.errors import UserError
from memdpc.common.settings import check, flat, from_flat, setting
from memdpc.model.loss import RELATION_MIN_BATCH
from memdpc.model.names import NEGATIVES, PRETRAIN_NAMES, diff_setting
from memdpc.pipeline.backends import LoaderSettings
from memdpc.pipeline.clip import COLOUR_SPANS, ClipShape
from memdpc.recipes.recipe import train_settings

__all__ = [
    "AUTO_VAL_SPLIT",
    "RESTART_FREE",
    "TrainConfig",
    "TrainRun",
    "config_differences",
    "config_from_dict",
    "read_config_file",
    "write_config",
]

AUTO_VAL_SPLIT = (
    "auto"  # --val-split: the shards' 'val' split where there is one, else 'test' (prepare.resolve_val_split)
)


@dataclass
class TrainConfig:
    """Every setting of a training run, with the paper's defaults; each field is a ``memdpc train`` option
    (with ``--workers`` and ``--blocks`` as the names other verbs use, the field's own still accepted). The
    loader's settings and the clip's shape are nested (:class:`LoaderSettings`, :class:`ClipShape`: the same
    settings as ``memdpc eval``'s and ``memdpc shard``'s); a settings file, a recipe and ``config.yaml`` name
    them as the others, flat."""

    # data
    loader: LoaderSettings = setting(LoaderSettings(), nested=True)
    out: str = setting("", "Run directory (config.yaml, metrics.jsonl, checkpoints/, tb/).")
    val_split: str = setting(
        AUTO_VAL_SPLIT,
        "Shard split for the validation loss (and the kNN monitor): auto = 'val' where the "
        "shards hold one (memdpc index --val-per-class), else 'test'; 'none' to use the training "
        "loss.",
    )
    clips_per_video: int = setting(
        0,
        "Windows of each video an epoch takes, drawn at random among the video's shard windows "
        "anew every epoch (1: the paper's epoch); 0: every window of the shards.",
        min=0,
    )
    jitter_flow: bool = setting(
        True, "Per-frame colour jitter and random grey on flow images too (the paper: yes)."
    )
    colour_per: str = setting(
        "frame",
        "How often the colour jitter and random grey are drawn anew: every frame (the paper), every block, or "
        "once per clip (block, clip: a clip's colours no longer flicker from frame to frame, so colour no longer "
        "tells its blocks apart, and the encoder is not taught to ignore colour within a clip).",
        choices=COLOUR_SPANS,
    )
    flow_shift: float = setting(
        0.0, "Flow: per block, a random global shift of the x and y codes, up to this many codes.", min=0
    )
    flow_gain: float = setting(
        1.0, "Flow: per block, a random gain of the flow codes about 128, up to this factor.", min=1
    )
    flow_reverse: float = setting(
        0.0,
        "Flow: per block, the probability that its codes are mirrored about 128 (its motion run backwards: "
        "a clip's sense of motion, left or right, in or out, no longer tells it apart).",
        min=0,
        max=1,
    )
    motion_invariance: str = setting(
        "on",
        "Whether the flow's global shift, gain and reversal (--flow-shift, --flow-gain, --flow-reverse), which make "
        "the encoder ignore a clip's global motion, apply: on (as given), off, or auto: decided before training "
        "from labelled videos (--knn-shards, else --shards), off where the direction of a video's global motion "
        "tells its class (pans left and right as two classes), on where it does not; the run records what it "
        "decided.",
        choices=("on", "off", "auto"),
    )
    crop_size: int = setting(
        224,
        "The random crop is resized to this, then to --size (the paper: 224); 0 = straight "
        "to --size (for frames much smaller than 224).",
        min=0,
    )
    # model
    arch: str = setting("memdpc_r18", "Model architecture.", choices=PRETRAIN_NAMES)
    frame_diff: bool = setting(
        False,
        "The encoder reads the differences of a block's consecutive frames instead of its frames (the paper: the "
        "frames): what does not change in time, a still background or the colour and texture of what does not "
        "move, no longer reaches it (RGB's shortcut: a clip told apart by its static appearance). The model "
        "keeps it: evaluation reads the checkpoint's inputs the same way.",
    )
    bidirectional: bool = setting(False, "Bidirectional MemDPC (a second, backward aggregator).")
    size: int = setting(128, "Input size in pixels (square).", min=1)
    clip: ClipShape = setting(ClipShape(), nested=True, flags={"num_blocks": ("--blocks", "--num-blocks")})
    pred_steps: int = setting(3, "Future blocks to predict.", min=1)
    mem_size: int = setting(1024, "Memory slots k.", min=1)
    widths: list[int] = setting(
        [64, 128, 256, 256], "Encoder stage widths (comma-separated; tiny CPU nets: 8,16,32,32)."
    )
    global_negatives: bool = setting(
        False, "All-gather targets across ranks so every rank's batch is a negative."
    )
    temperature: float = setting(
        0.0,
        "Score cosine similarities divided by this temperature; 0: raw dot products (the paper).",
        min=0.0,
    )
    negatives: str = setting(
        "all",
        "Targets each prediction is scored against: all of the batch (the paper); those at its own "
        "map position (same_position: the position on the map then tells nothing); every clip's at "
        "its position and step (other_clips); or its own clip's steps at its position (own_clip: "
        "only the order of events tells them apart).",
        choices=NEGATIVES,
    )
    teacher: str = setting(
        "",
        "A pretrained checkpoint of the other stream (e.g. the flow run's checkpoints/last.pt for an RGB run) "
        "that teaches this one: before training its encoder embeds every training video of the same shards, "
        "and each step pulls the batch's similarities under this encoder towards the teacher's (a relation "
        "loss added to the pretext loss). Clips the teacher finds alike, alike motion under flow, become alike "
        "whatever else sets them apart, so RGB's shortcut (a clip told apart by its background and colours) no "
        "longer pays. Empty: none (the paper).",
    )
    teacher_weight: float = setting(
        1.0,
        "With --teacher: the weight of its relation loss beside the pretext loss (1: the two summed).",
        min=0,
    )
    # optimisation
    epochs: int = setting(300, "Epochs to train.", min=1)
    lr: float = setting(1e-3, "Adam learning rate.")
    weight_decay: float = setting(1e-5, "Adam weight decay.")
    schedule: str = setting(
        "plateau",
        "plateau: decay once to --lr-min when the validation loss plateaus; "
        "milestones: multiply by --lr-min/--lr at each of --milestones; constant.",
        choices=("plateau", "milestones", "constant"),
    )
    lr_min: float = setting(1e-4, "Learning rate after the decay.")
    patience: int = setting(10, "Epochs without validation-loss improvement before the plateau decay.", min=0)
    milestones: list[int] = setting([], "Epochs at which the milestone schedule decays (comma-separated).")
    amp: str = setting("none", "Automatic mixed precision.", choices=("none", "bf16", "fp16"))
    compile: bool = setting(
        False,
        "torch.compile the model, forward and backward, as one graph; falls back to eager, with "
        "a warning, where compiling fails.",
    )
    cuda_graphs: bool = setting(
        False,
        "Run each training step as one captured CUDA graph (forward, backward and Adam at the "
        "batch's shape): one launch per step. CUDA, one process; not with --amp fp16.",
    )
    fast: bool = setting(
        True,
        "CUDA speed defaults (channels_last_3d encoder and clips, fused Adam), fp32 numerics kept; "
        "--no-fast for the eager reference. No effect on CPU.",
    )
    seed: int = setting(0, "Random seed (same seed, same weights on CPU).")
    deterministic: bool = setting(
        False, "torch.use_deterministic_algorithms (bit-exact resume on GPU; slower)."
    )
    max_steps: int = setting(0, "Stop after this many optimiser steps in total (0: no limit).", min=0)
    # checkpoints and logging
    ckpt_every_steps: int = setting(
        0, "Also save checkpoints/last.pt every N steps (0: only per epoch).", min=0
    )
    keep_every: int = setting(
        0, "Keep checkpoints/epoch-NNNN.pt every K epochs (0: only last and best).", min=0
    )
    val_max_batches: int = setting(0, "Validation batches per epoch per rank (0: the whole split).", min=0)
    log_every: int = setting(10, "Steps between metric records.", min=1)
    knn_every: int = setting(
        0, "Run the kNN retrieval monitor (train→val, R@1) every E epochs (0: off).", min=0
    )
    knn_max_batches: int = setting(50, "Batches per split that the kNN monitor embeds.", min=1)
    knn_shards: str = setting(
        "",
        "Shard folder whose train and validation splits the kNN monitor reads (default: --shards), e.g. your "
        "labelled videos while pretraining on unlabelled ones.",
    )
    best_by: str = setting(
        "loss",
        "What makes checkpoints/best.pt: the lowest validation loss (training loss without a "
        "validation split), or the highest kNN monitor R@1 (needs --knn-every 1).",
        choices=("loss", "knn"),
    )
    early_stop: int = setting(
        0, "Stop after this many epochs without a new best (by --best-by); 0: never.", min=0
    )
    progress: bool = setting(True, "Show a rich progress display (rank 0).")
    resume: str = setting(
        "", "Checkpoint to resume from (default: <out>/checkpoints/last.pt when it exists)."
    )
    init: str = setting(
        "",
        "Start a new run from this checkpoint's weights (memdpc's own or converted by `memdpc "
        "convert`); its architecture must match, and --stream must be given. A run that resumes "
        "ignores it.",
    )

    def __post_init__(self) -> None:
        check(self)  # each setting's range and choices; then what holds between settings
        if self.pred_steps >= self.clip.num_blocks:
            raise UserError(
                f"pred_steps ({self.pred_steps}) must be smaller than num_blocks ({self.clip.num_blocks})"
            )
        if not (0 < self.lr_min <= self.lr):
            raise UserError(f"lr_min must be in (0, lr={self.lr}], not {self.lr_min}")
        if len(self.widths) != 4 or min(self.widths) < 1:
            raise UserError(f"widths must be 4 positive numbers, not {self.widths}")
        if self.best_by == "knn" and (self.knn_every != 1 or self.val_split == "none"):
            raise UserError(
                "best_by knn needs the kNN monitor every epoch (--knn-every 1) and a validation split"
            )
        if self.cuda_graphs and self.amp == "fp16":
            raise UserError(
                "cuda_graphs does not go with amp fp16 (its loss scaler reads the device every step); "
                "use --amp bf16"
            )
        if self.cuda_graphs and self.teacher:
            raise UserError(
                "cuda_graphs does not go with a teacher (its features change every step); leave one out"
            )
        if self.teacher and self.loader.batch_size < RELATION_MIN_BATCH:
            raise UserError(
                f"a teacher needs batch_size {RELATION_MIN_BATCH} or more (a clip's similarities to two others "
                f"at least), not {self.loader.batch_size}"
            )
        if self.schedule == "milestones" and not self.milestones:
            raise UserError("schedule 'milestones' needs --milestones (e.g. 80,100)")

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``create_model`` for this config."""
        return dict(
            name=self.arch,
            bidirectional=self.bidirectional,
            mem_size=self.mem_size,
            pred_steps=self.pred_steps,
            num_blocks=self.clip.num_blocks,
            block_len=self.clip.block_len,
            input_size=self.size,
            widths=list(self.widths),
            global_negatives=self.global_negatives,
            negatives=self.negatives,
            temperature=self.temperature or None,
            **diff_setting(self.frame_diff),
        )

    def to_dict(self) -> dict[str, Any]:
        """The settings by name, flat (as a settings file and ``config.yaml`` hold them)."""
        return flat(self)


# Fields that may differ when a run restarts: they change how the run is executed or logged, not the
# experiment. Everything else must equal the config recorded in the run directory. ``fast`` is not among them:
# on CUDA it changes the numbers (fused Adam, other convolution kernels for the other layout), so a run resumed
# with the other setting would not continue as the uninterrupted run would (like ``amp`` and ``deterministic``).
RESTART_FREE = frozenset(
    {
        "shards",
        "out",
        "backend",
        "num_workers",
        "epochs",
        "max_steps",
        "compile",
        "cuda_graphs",
        "device",
        "ckpt_every_steps",
        "keep_every",
        "log_every",
        "knn_every",
        "knn_max_batches",
        "knn_shards",
        "progress",
        "resume",
    }
)


def config_from_dict(
    values: dict[str, Any], where: str = "config", base: TrainConfig | None = None
) -> TrainConfig:
    """Build a config from ``values`` over ``base`` (default: the paper's defaults); unknown keys are errors."""
    return from_flat(TrainConfig, values, where, base)


def read_config_file(path: str | Path, stream: str | None = None) -> dict[str, Any]:
    """The settings of a ``--config`` file (YAML or TOML; keys may use - or _): its options, a recipe's ``train``
    section, or an example recipe's training of ``stream``; a recipe shipped with memdpc may be named by its short
    name (:mod:`memdpc.recipes.recipe`)."""
    return train_settings(path, stream)


def write_config(config: TrainConfig, path: Path) -> None:
    """Write a run's settings as YAML (``config.yaml``: flat, the order of the config's fields), atomically."""
    write_bytes_atomic(path, yaml.safe_dump(config.to_dict(), sort_keys=False).encode())


def config_differences(recorded: dict[str, Any], config: TrainConfig) -> list[str]:
    """Settings (outside :data:`RESTART_FREE`) whose value differs between ``recorded`` and ``config``.

    A setting that ``recorded`` lacks (added in a later version) counts as its default, which the run had."""
    now = config.to_dict()
    then = {**TrainConfig().to_dict(), **recorded}
    keys = (set(recorded) | set(now)) - RESTART_FREE
    return [f"{k}: {then.get(k)!r} → {now.get(k)!r}" for k in sorted(keys) if then.get(k) != now.get(k)]


@dataclass(frozen=True)
class TrainRun:
    """How ``memdpc train`` runs besides its :class:`TrainConfig`: a settings file, the baselines' one checkpoint,
    a fresh start, or a rehearsal."""

    config_file: Path | None = setting(
        None,
        "YAML or TOML file of settings, or a recipe (path or short name: `memdpc recipes` lists them; its train "
        "section); options given on the command line override it.",
        flags=("--config",),
    )
    init_only: bool = setting(
        False,
        "Write the model the run starts from (untrained and seeded, or the --init weights) as "
        "<out>/checkpoints/init.pt and stop (random-init baseline).",
    )
    bn_from_data: bool = setting(
        False,
        "With --init-only: BatchNorm statistics of the training split's clips (no weight changes), the fair "
        "random-init baseline of frozen evaluations.",
    )
    overwrite: bool = setting(
        False,
        "Start the run afresh: remove the run directory's checkpoints, metrics and TensorBoard logs (after saying "
        "so) instead of resuming, e.g. when its shards changed since.",
    )
    dry_run: bool = setting(
        False,
        "Print what the run will do (clips and steps per epoch, global batch, schedule, disk, the wall time "
        "estimated from a few timed steps on this device) and write nothing.",
    )
