"""Checks before training starts: the shards fit ``--stream`` and the clip geometry, the run directory holds
this config (or none) and no live run holds it (:func:`hold_run_dir`), which checkpoint, if any, the run resumes
from, and whether the validation split can measure much; what the run records of its shards; what
``--overwrite`` removes; and the loaders of the run's splits."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from memdpc.common import file_kinds
from memdpc.common.errors import UserError, output_faults
from memdpc.common.streams import STREAMS
from memdpc.common.wording import name_list, plural
from memdpc.pipeline.augment import AugmentSpec
from memdpc.pipeline.clip import ClipSpec
from memdpc.pipeline.loader import make_loader
from memdpc.pipeline.manifest import manifest_path
from memdpc.pipeline.provenance import split_record
from memdpc.pipeline.sample import LABEL, decode_label, parse_key
from memdpc.pipeline.shard_set import ShardSet, ShardSplit, open_split
from memdpc.pipeline.wds_index import read_index, split_name
from memdpc.train.config import AUTO_VAL_SPLIT, TrainConfig, config_differences
from memdpc.train.metrics import METRICS_NAME, TB_NAME

__all__ = [
    "CONFIG_NAME",
    "augment_spec",
    "check_run_dir",
    "check_shards",
    "hold_run_dir",
    "clear_run",
    "overwritten",
    "recorded_setting",
    "monitor_on_labels",
    "monitored",
    "resolve_val_split",
    "shard_records",
    "split_loader",
    "val_split_warnings",
]

CONFIG_NAME = file_kinds.RUN_CONFIG


def monitored(config: TrainConfig) -> TrainConfig:
    """The config whose shards the kNN monitor reads: ``--knn-shards`` where given."""
    if not config.knn_shards:
        return config
    return dataclasses.replace(config, loader=dataclasses.replace(config.loader, shards=config.knn_shards))


def _stream_split(config: TrainConfig, split: str) -> ShardSplit:
    shards = ShardSet(Path(config.loader.shards), config.loader.stream)
    if not shards.has(split):
        others = [s for s in STREAMS if s != shards.stream and ShardSet(shards.root, s).has(split)]
        if others:
            raise UserError(
                f"{shards.root}: holds {others[0]} shards, not {shards.stream} shards "
                f"(--stream {shards.stream}); pass --stream {others[0]} or the {shards.stream} shards"
            )
    found = shards.split(split)
    clip = found.clip
    if (clip.num_blocks, clip.block_len) != (config.clip.num_blocks, config.clip.block_len):
        raise UserError(
            f"{found.path}: clips of {clip.num_blocks}×{clip.block_len} frames, but the config asks "
            f"for {config.clip.num_blocks}×{config.clip.block_len}"
        )
    return found


def check_shards(config: TrainConfig) -> dict[str, ShardSplit]:
    """The shards of the training (and validation, and the kNN monitor's) split by role, each read once;
    UserError for wrong-stream or missing shards."""
    config = resolve_val_split(config)
    if not config.loader.shards:
        raise UserError("no shard folder given: pass --shards DIR (written by `memdpc shard`)")
    manifests = {"train": _stream_split(config, config.loader.train_split)}
    if config.val_split != "none":
        if not manifest_path(config.loader.shards, config.loader.stream, config.val_split).is_file():
            raise UserError(
                f"{manifest_path(config.loader.shards, config.loader.stream, config.val_split)}: no validation "
                "shards; shard that split or pass --val-split none (the plateau then watches the "
                "training loss)"
            )
        manifests["val"] = _stream_split(config, config.val_split)
        if config.knn_every and config.knn_shards:  # the monitor's, of other shards
            for role, split in (("knn_train", config.loader.train_split), ("knn_val", config.val_split)):
                manifests[role] = _stream_split(monitored(config), split)
    return manifests


def monitor_on_labels(
    config: TrainConfig, manifests: dict[str, ShardSplit]
) -> tuple[TrainConfig, str | None]:
    """The kNN monitor scores classes: over an unlabelled split (``memdpc index --layout unlabelled``) it is
    switched off, and the returned note says so (``--best-by knn`` is then a UserError: nothing to choose by)."""
    roles = ("knn_train", "knn_val") if "knn_train" in manifests else ("train", "val")
    unlabelled = [role for role in roles if role in manifests and not manifests[role].classes]
    if not config.knn_every or not unlabelled:
        return config, None
    splits = " and ".join(
        config.val_split if r.endswith("val") else config.loader.train_split for r in unlabelled
    )
    many = len(unlabelled) > 1
    shards = monitored(config).loader.shards
    why = f"the {splits} split{'s' if many else ''} of {shards} {'are' if many else 'is'} unlabelled"
    if config.best_by == "knn":
        raise UserError(
            f"--best-by knn needs the kNN monitor, which scores classes, but {why}: choose by loss"
        )
    return dataclasses.replace(config, knn_every=0), f"the kNN monitor is off: {why} (it scores classes)"


def shard_records(config: TrainConfig) -> dict[str, dict[str, Any]]:
    """What the run records of the shards it reads, per role (``train``, and ``val`` unless ``--val-split
    none``): :func:`memdpc.pipeline.provenance.split_record`. Its checkpoints keep it, and a resume compares it."""
    config = resolve_val_split(config)
    roles = {"train": config.loader.train_split, "val": config.val_split}
    return {
        role: split_record(config.loader.shards, config.loader.stream, split)
        for role, split in roles.items()
        if split != "none"
    }


def videos_by_class(
    shard_dir: str | Path, stream: str, split: str, until: set[int] | None = None
) -> dict[int, set[str]]:
    """{label: ids of the split's videos of that class}, from the shards' DALI indexes (the keys name the videos)
    and one label member per video. With ``until``, reading stops once every one of those labels was seen."""
    found: dict[int, set[str]] = {}
    seen: set[str] = set()
    for tar, idx in open_split(shard_dir, stream, split).shards:
        if not tar.is_file() or not idx.is_file():
            raise UserError(f"{tar if not tar.is_file() else idx}: missing; shard that split again")
        with open(tar, "rb") as f:
            for members in read_index(idx):
                name = next((n for n in members if split_name(n)[1] == LABEL), None)
                if name is None:
                    raise UserError(f"{idx}: a sample without a .{LABEL} member; shard that split again")
                video = parse_key(split_name(name)[0])[0]
                if video in seen:
                    continue
                seen.add(video)
                offset, size = members[name]
                f.seek(offset)
                found.setdefault(decode_label(f.read(size)), set()).add(video)
                if until is not None and until <= found.keys():
                    return found
    return found


FEW_VAL_VIDEOS = 10  # below this, one video moves the kNN R@1 by more than 10 points


def recorded_setting(config: TrainConfig, key: str, fresh: bool) -> Any:
    """What the run directory's ``config.yaml`` records for ``key`` (None: no such file, or ``fresh``, or a
    file that does not read, which check_run_dir names)."""
    recorded = Path(config.out) / CONFIG_NAME if config.out and not fresh else None
    if recorded is None or not recorded.is_file():
        return None
    try:
        return (yaml.safe_load(recorded.read_text()) or {}).get(key)
    except yaml.YAMLError:
        return None


def resolve_val_split(config: TrainConfig, fresh: bool = False) -> TrainConfig:
    """``--val-split auto`` made concrete: what the run directory's config recorded (a resume keeps validating
    on the split it started with, even if a ``val`` split was sharded since; not when the run starts ``fresh``,
    as with ``--overwrite``), else the shards' ``val`` split of the stream where there is one (videos held out of
    training by ``memdpc index --val-per-class``), else ``test`` (the reference validates on it)."""
    if config.val_split != AUTO_VAL_SPLIT:
        return config
    split = recorded_setting(config, "val_split", fresh)
    if split and split != AUTO_VAL_SPLIT:
        return dataclasses.replace(config, val_split=split)
    split = "val" if manifest_path(config.loader.shards, config.loader.stream, "val").is_file() else "test"
    return dataclasses.replace(config, val_split=split)


def val_split_warnings(config: TrainConfig) -> list[str]:
    """What makes the validation split a poor measure, each with its counts: classes of the training split it
    has no video of, and fewer than :data:`FEW_VAL_VIDEOS` videos (a kNN R@1 over two videos is 0, 0.5 or 1)."""
    config = resolve_val_split(config)
    if config.val_split == "none":
        return []
    if config.knn_every:
        config = monitored(config)  # the monitor's shards are what its R@1 rests on
    classes = open_split(config.loader.shards, config.loader.stream, config.loader.train_split).classes
    train = videos_by_class(
        config.loader.shards, config.loader.stream, config.loader.train_split, until=set(range(len(classes)))
    )
    val = videos_by_class(config.loader.shards, config.loader.stream, config.val_split)
    where = manifest_path(config.loader.shards, config.loader.stream, config.val_split)
    use = "the kNN monitor's R@1" if config.knn_every else "the validation loss"
    if config.best_by == "knn" or not config.knn_every:
        use += ", which chooses best.pt,"
    warnings = []
    missing = sorted(set(train) - set(val))
    if missing:
        names = name_list([(classes[k] if k < len(classes) else "") or str(k) for k in missing])
        warnings.append(
            f"{where}: the {config.val_split} split holds no video of {len(missing)} of the "
            f"{len(train)} classes of the {config.loader.train_split} split ({names}); {use} leaves them out"
        )
    videos = sum(len(v) for v in val.values())
    if videos < FEW_VAL_VIDEOS:
        warnings.append(
            f"{where}: the {config.val_split} split holds only {plural(videos, 'video')}, each {100 / max(videos, 1):.0f} % "
            f"of it; {use} rests on them alone (hold out more videos, e.g. memdpc index … "
            "--val-per-class 2, and shard that split again)"
        )
    return warnings


def check_run_dir(config: TrainConfig, overwrite: bool = False) -> Path | None:
    """Refuse a run directory that records another config; return the checkpoint to resume from, if any. With
    ``overwrite`` the run starts afresh whatever the directory holds (nothing to resume; see :func:`clear_run`)."""
    if not config.out:
        raise UserError("no run directory given: pass --out RUN_DIR")
    run_dir = Path(config.out)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir}: exists and is not a directory")
    if overwrite:
        if config.resume:
            raise UserError(
                f"--overwrite starts {run_dir} afresh; --resume {config.resume} goes on from a checkpoint: "
                "give one of them"
            )
        return None
    recorded = run_dir / CONFIG_NAME
    if recorded.is_file():
        try:
            previous = yaml.safe_load(recorded.read_text()) or {}
        except yaml.YAMLError as e:
            raise UserError(f"{recorded}: unreadable ({e})") from None
        diff = config_differences(previous, config)
        if diff:
            raise UserError(
                f"{recorded}: this run directory holds a different config ({'; '.join(diff)}); "
                "choose another --out, or repeat its settings to resume it"
            )
    if config.resume:
        return Path(config.resume)
    last = run_dir / "checkpoints" / "last.pt"
    return last if last.is_file() else None


LOCK_NAME = "train.lock"  # in the run directory: held by the run that trains there
ORPHANS_WAIT = 30.0  # seconds: how long the loader workers of a killed run may keep its lock (they check for
# their parent every 5 s)


class RunLock:
    """The run directory's lock, held (an exclusive ``flock`` on ``train.lock``) while a run trains there. The
    kernel lets go of it when the process ends, however it ends, so a lock a killed run left is free to take;
    the file says which process on which host holds it. ``took_over``: the run whose lock was taken over (its
    process, host and start, in words), else None; ``note``: what to say about the lock (taken over, or a file
    system without locks), else None."""

    def __init__(self, path: Path, file, created: bool, took_over: str | None, note: str | None) -> None:
        self.path, self._file, self._created = path, file, created
        self.took_over, self.note = took_over, note

    def release(self) -> None:
        """Let go: the file is emptied first (a later run then has no one to name), and a run folder this run
        created and left holding nothing else (a refused start) is removed."""
        if self._file is None:
            return
        with contextlib.suppress(OSError):
            self._file.truncate(0)
        self._file.close()  # releases the flock
        self._file = None
        if self._created and [p.name for p in self.path.parent.iterdir()] == [LOCK_NAME]:
            self.path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()


def _who(text: str) -> dict[str, Any] | None:
    """The ``pid``, ``host`` and ``started`` a lock file's text records (None: nobody)."""
    try:
        who = json.loads(text)
        return who if {"pid", "host", "started"} <= set(who) else None
    except (ValueError, TypeError):
        return None


def _holder(who: dict[str, Any] | None) -> str | None:
    """``process 123 on host, since 2024-…``: who holds a lock, in words (None: nobody)."""
    return f"process {who['pid']} on {who['host']}, since {who['started']}" if who else None


def _ended(who: dict[str, Any] | None) -> bool:
    """Whether the recorded holder was a process of this host that has ended."""
    if not who or who["host"] != socket.gethostname():
        return False
    try:
        os.kill(int(who["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):
        return False
    return False


def _lock_after_orphans(file) -> bool:
    """Take the lock a run that has ended still holds through its forked loader workers (they share its
    ``flock``, and outlive a killed run by the few seconds they take to see their parent gone); False when they
    keep it past :data:`ORPHANS_WAIT`."""
    deadline = time.monotonic() + ORPHANS_WAIT
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            continue
    return False


def hold_run_dir(config: TrainConfig) -> RunLock:
    """Take the lock of ``config.out`` (creating the folder): one writer per run folder. UserError naming the
    process and host of a live run that holds it; a lock that a killed run left is taken over (``took_over``),
    once the loader workers it forked, which share its lock, have ended too.
    On a file system without locks the run goes on, with a ``note`` saying so."""
    run_dir = Path(config.out)
    created = not run_dir.exists()
    path = run_dir / LOCK_NAME
    with output_faults(path):
        run_dir.mkdir(parents=True, exist_ok=True)
        file = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+")
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        who = _who(file.read())
        ended = _ended(who)
        if not (ended and _lock_after_orphans(file)):
            file.close()
            held = _holder(who) or "a process that has not said which yet"
            if ended:
                held += ", ended, but processes it started still hold the lock"
            raise UserError(
                f"{run_dir}: another training run is writing there ({held}); wait for it to end, or give "
                "another --out"
            ) from None
        file.seek(0)
    except OSError as e:  # ENOLCK, EOPNOTSUPP: a file system without locks
        note = (
            f"{path}: no lock on this file system ({e.strerror}): nothing keeps a second run out of {run_dir}"
        )
        return RunLock(path, file, created, None, note)
    took_over = _holder(_who(file.read()))
    with output_faults(path):
        file.seek(0)
        file.truncate()
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        file.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}) + "\n")
        file.flush()
    note = f"took over {path} from {took_over}, which ended without letting go of it" if took_over else None
    return RunLock(path, file, created, took_over, note)


def overwritten(run_dir: Path) -> list[Path]:
    """What ``--overwrite`` removes from a run directory: its checkpoints, metrics and TensorBoard logs."""
    found = [*sorted((run_dir / "checkpoints").glob("*.pt")), run_dir / METRICS_NAME, run_dir / TB_NAME]
    return [p for p in found if p.exists()]


def clear_run(run_dir: Path, say: Callable[[str], None]) -> None:
    """Remove what :func:`overwritten` names, after saying what, in one line, through ``say``."""
    paths = overwritten(run_dir)
    if not paths:
        return
    names = name_list([p.relative_to(run_dir).as_posix() for p in paths])
    say(f"--overwrite: removing {names} from {run_dir} to start the run afresh")
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def augment_spec(config: TrainConfig) -> AugmentSpec:
    """The augmentation a run of ``config`` trains with (``memdpc show --augment`` draws it too); the flow's
    global motion left as it is where ``--motion-invariance`` is off."""
    moved = config.motion_invariance != "off"
    return AugmentSpec(
        jitter_flow=config.jitter_flow,
        colour_per=config.colour_per,
        crop_size=config.crop_size or None,
        flow_shift=config.flow_shift if moved else 0.0,
        flow_gain=config.flow_gain if moved else 1.0,
        flow_reverse=config.flow_reverse if moved else 0.0,
    )


def split_loader(
    config: TrainConfig,
    split: str,
    clip: ClipSpec,
    train: bool,
    rank: int = 0,
    world_size: int = 1,
    device: str = "cpu",
):
    """A loader of one split of the run's shards, augmented as ``config`` says; training drops the last partial
    batch, so every rank takes equal steps, and takes ``--clips-per-video`` windows of each video per epoch."""
    spec = augment_spec(config)
    return make_loader(
        config.loader.shards,
        config.loader.stream,
        split,
        train=train,
        batch_size=config.loader.batch_size,
        backend=config.loader.backend,
        size=config.size,
        spec=spec,
        rank=rank,
        world_size=world_size,
        seed=config.seed,
        num_workers=config.loader.num_workers,
        device=device,
        clip=clip,
        drop_last=train,
        clips_per_video=config.clips_per_video if train else 0,
    )
