"""Dataset readers: a dataset root in its official layout → a list of :class:`VideoRecord`.

Each reader checks what users get wrong (missing split files, unknown classes, listed videos that do not
exist, duplicate ids, empty folders) and raises :class:`UserError` naming the file and line.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from pathlib import Path

from memdpc.common.errors import UserError
from memdpc.common.settings import Checked, setting
from memdpc.common.wording import name_list, plural
from memdpc.preprocess.decode import DecodeError, StderrCapture, read_header
from memdpc.preprocess.video_index import (
    SPLIT_NAMES,
    VIDEO_EXTS,
    VideoRecord,
    check_unique,
    dependants,
    hold_out,
    index_text,
    video_id,
    write_index,
)

__all__ = [
    "IndexOptions",
    "IndexReport",
    "IndexRun",
    "OwnFolders",
    "READERS",
    "UNLABELLED",
    "build_index",
    "folder_passed_over",
    "hold_outs",
    "make_index",
]


def _first_existing(candidates: list[Path], what: str) -> Path:
    for c in candidates:
        if c.exists():
            return c
    raise UserError(f"{candidates[0]}: {what} not found")


def _lines(path: Path) -> list[tuple[int, list[str]]]:
    """Non-empty lines of a text file as (line number, whitespace-split fields)."""
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            out.append((lineno, line.split()))
    return out


def _check_split(split: int) -> None:
    if split not in (1, 2, 3):
        raise UserError(f"split must be 1, 2 or 3, not {split}")


def ucf101(root: Path, split: int = 1) -> list[VideoRecord]:
    """UCF101: ``classInd.txt`` ("id name", 1-based), ``trainlist0N.txt``, ``testlist0N.txt``.

    Split files are looked for in ``root/ucfTrainTestlist`` and then ``root``; videos in ``root/UCF-101``
    and then ``root``.
    """
    _check_split(split)
    lists = _first_existing([root / "ucfTrainTestlist", root], "split folder")
    if not (lists / "classInd.txt").exists():
        lists = root
    videos = root / "UCF-101" if (root / "UCF-101").is_dir() else root
    class_file = _first_existing([lists / "classInd.txt"], "classInd.txt")
    classes: dict[str, int] = {}
    for lineno, fields in _lines(class_file):
        if len(fields) != 2 or not fields[0].isdigit():
            raise UserError(f"{class_file}:{lineno}: expected 'id name', got {' '.join(fields)!r}")
        classes[fields[1]] = int(fields[0]) - 1
    records = []
    for split_name, stem in (("train", "trainlist"), ("test", "testlist")):
        split_file = lists / f"{stem}0{split}.txt"
        if not split_file.exists():
            raise UserError(f"{split_file}: split file not found")
        for lineno, fields in _lines(split_file):
            rel = fields[0]
            cls = rel.split("/")[0]
            if "/" not in rel or cls not in classes:
                raise UserError(f"{split_file}:{lineno}: class '{cls}' is not in {class_file}")
            path = videos / rel
            if not path.is_file():
                raise UserError(f"{split_file}:{lineno}: video {path} does not exist")
            records.append(
                VideoRecord(video_id(Path(rel).name), str(path.resolve()), classes[cls], cls, split_name)
            )
    return _finish(records, lists)


def hmdb51(root: Path, split: int = 1) -> list[VideoRecord]:
    """HMDB51: ``testTrainMulti_7030_splits/<class>_test_splitN.txt`` ("video 1|2|0": train/test/unused).

    Videos are ``root/<class>/<video>``; class ids are the sorted class names, 0-based.
    """
    _check_split(split)
    split_dir = _first_existing([root / "testTrainMulti_7030_splits", root / "splits"], "split folder")
    split_files = sorted(split_dir.glob(f"*_test_split{split}.txt"))
    if not split_files:
        raise UserError(f"{split_dir}: no '*_test_split{split}.txt' split files")
    names = sorted(f.name[: -len(f"_test_split{split}.txt")] for f in split_files)
    classes = {name: i for i, name in enumerate(names)}
    records = []
    for f in split_files:
        cls = f.name[: -len(f"_test_split{split}.txt")]
        for lineno, fields in _lines(f):
            if len(fields) != 2 or fields[1] not in ("0", "1", "2"):
                raise UserError(f"{f}:{lineno}: expected 'video 0|1|2', got {' '.join(fields)!r}")
            if fields[1] == "0":
                continue
            path = root / cls / fields[0]
            if not path.is_file():
                raise UserError(f"{f}:{lineno}: video {path} does not exist")
            split_name = "train" if fields[1] == "1" else "test"
            records.append(
                VideoRecord(video_id(fields[0]), str(path.resolve()), classes[cls], cls, split_name)
            )
    return _finish(records, split_dir)


_K400_SPLITS = {"train": "train", "val": "val", "validate": "val", "validation": "val", "test": "test"}


def kinetics400(root: Path, split: int = 1) -> list[VideoRecord]:
    """Kinetics-400: the official CSVs (``label,youtube_id,time_start,time_end,split``) in ``root`` or
    ``root/annotations``; files ``{youtube_id}_{start:06d}_{end:06d}.mp4`` under ``[split/]label/``.
    """
    ann = root / "annotations" if (root / "annotations").is_dir() else root
    csvs = sorted(ann.glob("*.csv"))
    if not csvs:
        raise UserError(f"{ann}: no Kinetics annotation CSV files")
    rows = []
    for f in csvs:
        with open(f, newline="") as fh:
            reader = csv.DictReader(fh)
            missing = {"label", "youtube_id", "time_start", "time_end", "split"} - set(
                reader.fieldnames or []
            )
            if missing:
                raise UserError(f"{f}:1: missing CSV columns {sorted(missing)}")
            for lineno, row in enumerate(reader, 2):
                rows.append((f, lineno, row))
    labels = sorted({row["label"] for _, _, row in rows if row["label"]})
    classes = {name: i for i, name in enumerate(labels)}
    records = []
    for f, lineno, row in rows:
        split_name = _K400_SPLITS.get(row["split"])
        if split_name is None:
            raise UserError(f"{f}:{lineno}: unknown split '{row['split']}'")
        if not row["label"]:  # the official test CSV has no labels
            continue
        try:
            name = f"{row['youtube_id']}_{int(row['time_start']):06d}_{int(row['time_end']):06d}"
        except ValueError:
            raise UserError(f"{f}:{lineno}: time_start/time_end are not integers") from None
        path = _k400_file(root, row["split"], row["label"], name)
        if path is None:
            raise UserError(
                f"{f}:{lineno}: video {name}.mp4 (class '{row['label']}') does not exist under {root}"
            )
        records.append(
            VideoRecord(video_id(name), str(path.resolve()), classes[row["label"]], row["label"], split_name)
        )
    return _finish(records, ann)


def _k400_file(root: Path, split: str, label: str, name: str) -> Path | None:
    for folder in (label, label.replace(" ", "_")):
        for base in (root / split, root / _K400_SPLITS[split], root):
            for ext in VIDEO_EXTS:
                p = base / folder / f"{name}{ext}"
                if p.is_file():
                    return p
    return None


def oops(root: Path, split: int = 1) -> list[VideoRecord]:
    """Oops: ``annotations/transition_times.json`` (or ``root/transition_times.json``), mapping each video
    name to its annotators' failure times ``t`` (seconds, -1 = not found) and its length ``len``.

    Videos are ``root/{train,val}/<name>.mp4``. The failure time kept is the median of the valid ``t``;
    videos with no valid time are skipped (the protocol of the Oops paper). Labels are -1: Oops labels are
    per time step, derived from ``extra['t']`` at evaluation.
    """
    ann = _first_existing(
        [root / "annotations" / "transition_times.json", root / "transition_times.json"],
        "transition_times.json",
    )
    try:
        times = json.loads(ann.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{ann}:{e.lineno}: not valid JSON ({e.msg})") from None
    records = []
    for split_name in ("train", "val"):
        folder = root / split_name
        if not folder.is_dir():
            continue
        for path in sorted(p for p in folder.iterdir() if p.suffix.lower() in VIDEO_EXTS):
            entry = times.get(path.stem)
            if entry is None:
                continue
            valid = [t for t in entry.get("t", []) if t >= 0]
            if not valid:
                continue
            extra = {"t": statistics.median(valid), "t_all": entry.get("t", []), "len": entry.get("len")}
            records.append(
                VideoRecord(video_id(path.name), str(path.resolve()), -1, "", split_name, extra=extra)
            )
    return _finish(records, root)


def _folder_files(root: Path) -> tuple[list[tuple[str, str, Path, Path]], list[tuple[str, str]]]:
    """The videos of a ``root/[split/]<class>/…`` folder as (split, class, path, its path below the class
    folder), each class folder searched
    through its sub-folders (the class is the top folder), and the files passed over, as (path, why): a video
    not in a class folder, a file in one that is not a video by its extension, a folder beside the split
    folders. Hidden files and folders (a name starting with ".") are left alone; so are the files beside the
    class folders that are not videos (an index written there, a README)."""
    split_dirs = [s for s in ("train", "val", "test") if (root / s).is_dir()]
    bases = [(root / s, s) for s in split_dirs] or [(root, "train")]
    found: list[tuple[str, str, Path, Path]] = []
    passed: list[tuple[str, str]] = []
    if split_dirs:
        beside = [
            p for p in sorted(root.iterdir()) if not p.name.startswith(".") and p.name not in split_dirs
        ]
        passed += [
            (str(p), "a folder beside the split folders train/, val/, test/") for p in beside if p.is_dir()
        ]
        passed += [
            (str(p), "a video beside the split folders") for p in beside if p.suffix.lower() in VIDEO_EXTS
        ]
    for base, split_name in bases:
        for entry in sorted(p for p in base.iterdir() if not p.name.startswith(".")):
            if not entry.is_dir():
                if entry.suffix.lower() in VIDEO_EXTS:
                    passed.append((str(entry), "not in a class folder"))
                continue
            for path in sorted(entry.rglob("*")):
                rel = path.relative_to(entry)
                if any(part.startswith(".") for part in rel.parts) or path.is_dir():
                    continue
                if path.suffix.lower() in VIDEO_EXTS:
                    found.append((split_name, entry.name, path, rel))
                else:
                    passed.append((str(path), "not a video by its extension"))
    return found, passed


def folder(root: Path, split: int = 1) -> list[VideoRecord]:
    """Generic ``root/<class>/<video>``, a class folder's sub-folders included (the class is the top folder); with
    ``root/train`` and ``root/test`` (or ``val``) folders, those are the splits, otherwise every video is
    ``train``. Class ids are the sorted names of the class folders that hold a video, 0-based (an empty folder is
    no class). A video's id is its class and its path below the class folder (``walk__sub__w6``). The files it
    passes over: :func:`folder_passed_over`. Videos found only outside class folders are an error that names the
    layout for them (``unlabelled``).
    """
    found, passed = _folder_files(root)
    loose = [path for path, why in passed if why == "not in a class folder"]
    if not found and loose:
        raise UserError(
            f"{root}: {plural(len(loose), 'video')} found, but not in class sub-folders (e.g. {loose[0]}); "
            "`--layout folder` wants <class>/<video>, `--layout unlabelled` takes videos without classes "
            "(to pretrain on)"
        )
    classes = {name: i for i, name in enumerate(sorted({cls for _, cls, _, _ in found}))}
    records = [
        VideoRecord(
            video_id("__".join((cls, *below.parts))), str(path.resolve()), classes[cls], cls, split_name
        )
        for split_name, cls, path, below in found
    ]
    return _finish(records, root)


def unlabelled(root: Path, split: int = 1) -> list[VideoRecord]:
    """Videos without classes, to pretrain on: every video file under ``root`` (a flat folder or any tree;
    hidden files and folders left alone), each in ``train`` with no label (-1); ``memdpc index
    --val-per-class N`` holds N of them out as ``val`` (for the validation loss). A video's id is its path below
    ``root`` (``trip__day1__clip3``)."""
    paths = sorted(
        p
        for p in root.rglob("*")
        if p.suffix.lower() in VIDEO_EXTS
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    records = [
        VideoRecord(video_id("__".join(p.relative_to(root).parts)), str(p.resolve()), -1, "", "train")
        for p in paths
    ]
    return _finish(records, root)


def folder_passed_over(root: Path) -> list[tuple[str, str]]:
    """The files of a ``folder`` layout that are not indexed, with why (:func:`_folder_files`)."""
    return _folder_files(root)[1]


def _finish(records: list[VideoRecord], source: Path) -> list[VideoRecord]:
    if not records:
        raise UserError(f"{source}: no videos found")
    check_unique(records, source)
    return records


READERS: dict[str, Callable[[Path, int], list[VideoRecord]]] = {
    "ucf101": ucf101,
    "hmdb51": hmdb51,
    "kinetics400": kinetics400,
    "oops": oops,
    "folder": folder,
    "unlabelled": unlabelled,
}
UNLABELLED = "unlabelled"  # the layout of videos without classes (pretraining only)


def build_index(root: str | Path, layout: str, split: int = 1) -> list[VideoRecord]:
    """Read the dataset at ``root`` in ``layout`` (one of :data:`READERS`) for the given split (1–3)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: dataset root is not a folder")
    if layout not in READERS:
        raise UserError(f"unknown layout '{layout}' (choose from {', '.join(READERS)})")
    return READERS[layout](root, split)


# the splits each layout can give (Oops: train and val); a missing one is worth a warning, with how to get it
_LAYOUT_SPLITS = {
    "oops": ("train", "val"),
    "kinetics400": ("train", "val"),
    UNLABELLED: ("train", "val"),
}  # K400: its test set has no labels; videos without classes: nothing to test
_EMPTY_HINT = {
    "train": "every video is in another split",
    "val": "use --val-per-class N (held-out videos for train's kNN monitor and --best-by knn)",
    "test": "use --test-per-class N",
}
_FOLDER_HINT = {
    "train": ", or a train/ folder",
    "val": ", or a val/ folder",
    "test": ", or train/ and test/ folders",
}


def index_warnings(records: list[VideoRecord], layout: str) -> list[str]:
    """What a user should know before preprocessing: a split of the layout that is empty (with how to fill
    it), and classes with no video in a split. Unlabelled videos (Oops) have no classes to check."""
    splits = _LAYOUT_SPLITS.get(layout, SPLIT_NAMES)
    present = {r.split for r in records}
    names = sorted({r.label_name for r in records if r.label >= 0})
    out = []
    for split in splits:
        if split not in present:
            hint = _EMPTY_HINT[split] + (_FOLDER_HINT[split] if layout == "folder" else "")
            out.append(f"no '{split}' videos: {hint}")
    for split in (s for s in SPLIT_NAMES if s in present):
        missing = sorted(set(names) - {r.label_name for r in records if r.split == split})
        if missing:
            verb = "has" if len(missing) == 1 else "have"
            out.append(f"{plural(len(missing), 'class')} {verb} no video in '{split}': {name_list(missing)}")
    return out


@dataclass
class IndexReport:
    """What ``memdpc index`` wrote: the index file, its records, the warnings about its splits, the files
    passed over when videos were held out (path, why it would not read; they stay in ``train``), and the files of
    the dataset folder it did not index (path, why; the ``folder`` layout)."""

    path: Path
    records: list[VideoRecord]
    warnings: list[str]
    passed_over: list[tuple[str, str]] = field(default_factory=list)
    not_indexed: list[tuple[str, str]] = field(default_factory=list)


def default_index_path(root: str | os.PathLike, layout: str, split: int) -> Path:
    return Path(root) / f"index_{layout}_split{split}.jsonl"


def _unreadable(rec: VideoRecord) -> str | None:
    """Why ``rec``'s file will not preprocess, as its header and its last frame tell (the header as
    ``memdpc preprocess --dry-run`` reads it: :func:`~memdpc.preprocess.decode.read_header`); None: they read."""
    try:
        read_header(rec.path, end=True)
    except (DecodeError, OSError) as e:
        return str(e).strip() or type(e).__name__
    return None


@dataclass(frozen=True)
class IndexOptions(Checked):
    """Which official split ``memdpc index`` reads and which videos it holds out (:func:`make_index`'s)."""

    split: int = setting(1, "Official split 1–3.", min=1, max=3)
    test_per_class: int = setting(
        0, "Move this many training videos per class to a 'test' split (for a folder without test/).", min=0
    )
    val_per_class: int = setting(
        0,
        "Then move this many training videos per class to a 'val' split (--layout unlabelled: this many in all).",
        min=0,
    )
    seed: int | None = setting(
        None,
        "Draw the held-out videos at random per class with this seed (default: the last ones by id).",
        min=0,
    )


@dataclass(frozen=True)
class IndexRun(Checked):
    """How ``memdpc index`` reads a folder and where it writes (:func:`make_index`'s ``layout``, ``out`` and
    ``overwrite``)."""

    layout: str = setting(MISSING, "Dataset layout of DATASET_ROOT.", choices=tuple(READERS), required=True)
    out: Path | None = setting(
        None,
        "Index file to write (default: DATASET_ROOT/index_<layout>_split<N>.jsonl).",
        path={"dir_okay": False},
    )
    overwrite: bool = setting(
        False, "Write over an index that shards were made from (default: refuse it, naming them)."
    )


@dataclass(frozen=True)
class OwnFolders(Checked):
    """A user's own videos for an example recipe's run (``memdpc quickstart``, ``memdpc recipes``): labelled ones
    to evaluate on, and unlabelled ones to pretrain on."""

    videos: Path | None = setting(
        None,
        "Your labelled videos (<class>/<video>) instead of example data: a third of the smallest class is held out "
        "to test on where the folder has no test/.",
        path={"exists": True, "file_okay": False},
    )
    pool: Path | None = setting(
        None,
        "With --videos: your unlabelled videos (any tree), which MemDPC pretrains on instead of the labelled ones.",
        path={"exists": True, "file_okay": False},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pool is not None and self.videos is None:
            raise UserError("--pool is pretrained on, and --videos evaluated on: give --videos too")


POOL_VAL = 10  # an unlabelled folder's videos held out for the validation loss, at most (a tenth of them)


def hold_outs(root: str | os.PathLike, layout: str, seed: int | None = None) -> IndexOptions:
    """The hold-outs of a folder that a run of its own (``memdpc quickstart --videos``) evaluates on: a labelled
    folder (``folder``) gives a third of its smallest class to ``test`` (none where it has a test split) and one
    video a class to ``val`` (the kNN monitor's); an unlabelled one (:data:`UNLABELLED`) a tenth of its videos,
    1 to :data:`POOL_VAL`, to ``val`` (the validation loss)."""
    records = build_index(root, layout)
    if layout == UNLABELLED:
        return IndexOptions(val_per_class=max(1, min(POOL_VAL, len(records) // 10)), seed=seed)
    if any(r.split == "test" for r in records):
        return IndexOptions(val_per_class=1, seed=seed)
    smallest = min(Counter(r.label for r in records).values())
    return IndexOptions(test_per_class=max(1, smallest // 3), val_per_class=1, seed=seed)


def make_index(
    root: str | os.PathLike,
    layout: str,
    options: IndexOptions = IndexOptions(),
    *,
    out: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> IndexReport:
    """``memdpc index``: read the dataset (``options``: which split, which videos to hold out), hold videos out
    (:func:`~memdpc.preprocess.video_index.hold_out`) among those whose files read (:func:`_unreadable`), write
    the index (default :func:`default_index_path`) and say what is missing from its splits, which files the
    hold-out passed over and which it did not index. An index there already that shards were made from
    (:func:`~memdpc.preprocess.video_index.dependants`) is not written over with other records unless
    ``overwrite``: UserError naming them."""
    split, test_per_class = options.split, options.test_per_class
    if layout == UNLABELLED and test_per_class:
        raise UserError(
            f"{root}: --layout {UNLABELLED} has no classes to test on; --test-per-class is for a labelled folder "
            "(--val-per-class N holds N videos out for the validation loss)"
        )
    records = build_index(root, layout, split)
    if test_per_class and any(r.split == "test" for r in records):
        raise UserError(
            f"{root}: already holds a test split (the {layout} layout's); --test-per-class would add "
            "training videos to it: leave it out (--val-per-class holds videos out for validation)"
        )
    passed_over: list[tuple[str, str]] = []

    def check(rec: VideoRecord) -> str | None:
        why = _unreadable(rec)
        if why is not None:
            passed_over.append((rec.path, why))
        return why

    with StderrCapture():  # FFmpeg's complaints about a broken file: the reason recorded says enough
        records = hold_out(records, options.val_per_class, test_per_class, seed=options.seed, check=check)
    path = Path(out) if out is not None else default_index_path(root, layout, split)
    _check_dependants(path, records, overwrite)
    write_index(records, path)
    not_indexed = folder_passed_over(Path(root)) if layout == "folder" else []
    return IndexReport(path, records, index_warnings(records, layout), passed_over, not_indexed)


def _check_dependants(path: Path, records: list[VideoRecord], overwrite: bool) -> None:
    """Refuse to write other records over an index that shards were made from, naming them."""
    if overwrite or not path.is_file():
        return
    with contextlib.suppress(OSError, UnicodeDecodeError):
        if path.read_text() == index_text(records):
            return  # the same index again: nothing that was made from it changes
    made = dependants(path)
    if made:
        names = name_list([f"{m.parent.name}/{m.name}" for m in made], 4)
        folders = name_list(sorted({str(m.parent.parent) for m in made}))
        raise UserError(
            f"{path}: the shards {names} in {folders} were made from this index (and what was trained or evaluated "
            "on them); another index over it would no longer describe them: give another --out, or add --overwrite "
            "(then shard those splits again with --overwrite)"
        )
