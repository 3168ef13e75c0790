"""Benchmark (scientific): an example recipe on one's own folders, run as a user runs it.

An example family is rendered at the recipe's sizes into what a user has: a labelled folder (``<class>/<video>``)
and a flat folder of unlabelled videos of another draw, the recipe's pool times as many (all in one folder, no
classes). Then the one command README gives for one's own videos runs on the two, timed from the folders to the
table::

    memdpc quickstart --recipe NAME --videos LABELLED --pool POOL --out RUN

    python -m bench.own_folders [NAME] [--family directions] [--work runs/own-folders]
        [--out bench/results/own-folders-NAME-FAMILY]

Writes ``<out>.json`` and ``<out>.md`` in :mod:`bench.recipe`'s form (MemDPC and both random-init baselines per
stream and metric, with intervals, paired tests and minutes). A killed run resumes (the folders are rendered
once; the quickstart resumes itself).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import subprocess
from pathlib import Path

from rich.console import Console

from bench.recipe import MEMDPC, MINUTES, gather, markdown, run
from memdpc.common.atomic import atomic_path, write_json_atomic
from memdpc.preprocess.examples.families import EXAMPLE_FAMILIES, POOL_SEED
from memdpc.quickstart import profile_from
from memdpc.recipes.recipe import load, resolve

SEED = 0  # the labelled folder's draw; the pool's is SEED + POOL_SEED, as a recipe's quickstart draws it


def render(family: str, out: Path, videos_per_class: int, data: dict, seed: int) -> Path:
    """``memdpc data FAMILY`` into ``out`` (once: a finished folder is kept); returns its folder of classes."""
    done = out / ".rendered"
    if not done.is_file():
        sizes = ["--frames", str(data["frames"]), "--size", str(data["size"])]
        if "num_classes" in data:
            sizes += ["--classes", str(data["num_classes"])]
        command = [MEMDPC, "data", family, str(out), "--videos-per-class", str(videos_per_class), *sizes]
        subprocess.run([*command, "--seed", str(seed)], check=True)
        done.touch()
    return out / "UCF-101"


def flat_pool(classes: Path, pool: Path) -> Path:
    """The videos of a folder of classes, moved into one flat folder under names that tell no class (a digest of
    the name they had, so that a move cut short goes on where it stopped)."""
    pool.mkdir(parents=True, exist_ok=True)
    for video in sorted(classes.rglob("*.avi")):
        video.rename(pool / f"{hashlib.sha256(video.name.encode()).hexdigest()[:16]}.avi")
    return pool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", default="example-flow-pool", help="The example recipe.")
    ap.add_argument("--family", default="directions", choices=sorted(EXAMPLE_FAMILIES))
    ap.add_argument("--work", type=Path, default=Path("runs/own-folders"))
    ap.add_argument("--out", type=Path, default=None, help="Default: bench/results/own-folders-NAME-FAMILY.")
    args = ap.parse_args()
    recipe = load(args.name)
    profile = profile_from(recipe.quickstart, str(resolve(args.name)), args.family)
    per_class = profile.data["videos_per_class"]
    name = resolve(args.name).stem
    work = args.work / f"{name}-{args.family}"
    videos = render(args.family, work / "labelled", per_class, profile.data, SEED)
    drawn = render(args.family, work / "drawn", profile.pool * per_class, profile.data, SEED + POOL_SEED)
    pool = flat_pool(drawn, work / "pool")
    folder = work / "run"
    command = [
        "memdpc",
        "quickstart",
        "--recipe",
        args.name,
        "--videos",
        videos,
        "--pool",
        pool,
        "--out",
        folder,
    ]
    r = {"family": args.family, "seed": SEED, "folder": folder, "command": shlex.join(map(str, command))}
    run(r, Console())
    results = [gather(r)] if (folder / MINUTES).is_file() else []
    out = args.out or Path("bench/results") / f"own-folders-{name}-{args.family}"
    where = f"--videos --pool on the {args.family} family as a labelled folder and a flat folder of unlabelled videos"
    table = markdown(args.name, results, where)
    write_json_atomic(out.with_suffix(".json"), results)
    with atomic_path(out.with_suffix(".md")) as tmp:
        tmp.write_text(table)
    print(table)
    print(json.dumps({"wrote": [str(out.with_suffix(".json")), str(out.with_suffix(".md"))]}))


if __name__ == "__main__":
    main()
