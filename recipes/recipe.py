"""Settings files and recipes: the paper's experiments, one YAML file per table row (ARCHITECTURE.md §5).

A settings file (``memdpc train --config``) is a YAML or TOML mapping of options. A recipe is a YAML file of
``recipes/`` (shipped with the package; ``memdpc recipes`` lists them) that names a table row of the paper,
the figures to expect and everything that produces them, in sections:

- ``row``: the table and row it reproduces; ``notes``: what differs from the paper or is not known;
- ``expect``: ``{dataset: {metric: value}}``, the paper's figures, per dataset evaluated on (metrics named as
  in the results files: ``top1``, ``R@1``, …);
- ``pretrain``: the dataset pretrained on; every dataset is described once, in ``recipes/datasets.yaml``
  (its layout, ``index`` options and the splits to shard);
- ``preprocess``, ``shard``: the options of ``memdpc preprocess`` and ``memdpc shard`` that go with it;
- ``train``: the settings of ``memdpc train`` (``memdpc train --config NAME`` reads them);
- ``eval``: the evaluation (``task``: retrieve, probe, finetune) and its options (``memdpc eval TASK --config
  NAME`` reads them);
- ``fuse``: for a row of two streams, the two recipes and the result file of each to fuse;
- ``base``: a recipe whose sections this one starts from; its own ``train``, ``preprocess`` and ``shard``
  settings are added to the base's, its other sections replace the base's.

An example recipe runs on the built-in example families instead (``memdpc quickstart --recipe NAME``): its
``quickstart`` section holds the sizes of the quickstart's run (the fields of ``memdpc.quickstart.Profile``),
its ``expect`` the figures per family measured on the held-out draws (seeds :data:`EXAMPLE_SEEDS`), and it has
no ``pretrain``, ``train`` or ``eval`` section.

A recipe is named by its path or its short name (the file name without ``.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "EXAMPLE_SEEDS",
    "Recipe",
    "RecipeFolders",
    "commands",
    "config_ref",
    "eval_settings",
    "example_streams",
    "example_train",
    "flags",
    "load",
    "names",
    "resolve",
    "train_settings",
]

try:
    import tomllib
except ImportError:  # Python 3.10: TOML settings files are refused with a message (_toml_loads)
    tomllib = None

from memdpc.common.errors import UserError
from memdpc.common.settings import setting
from memdpc.common.streams import STREAMS
from memdpc.common.wording import name_list

RECIPE_DIR = Path(__file__).resolve().parent  # the YAML files beside this loader
DATASETS = "datasets"  # recipes/datasets.yaml: the datasets the recipes use; not a recipe
SECTIONS = (
    "row",
    "notes",
    "expect",
    "pretrain",
    "preprocess",
    "shard",
    "train",
    "eval",
    "fuse",
    "quickstart",
    "base",
)
MERGED = ("preprocess", "shard", "train")  # sections a recipe adds to its base's; the others replace them
TASKS = ("retrieve", "probe", "finetune")
# the held-out draws of the example families that an example recipe's figures are measured on
EXAMPLE_SEEDS = (0, 1)


def _toml_loads(path: Path, text: str) -> Any:
    if tomllib is None:
        raise UserError(f"{path}: TOML config files need Python ≥ 3.11; use YAML")
    return tomllib.loads(text)


def read_file(path: str | Path) -> dict[str, Any]:
    """A YAML (.yaml/.yml) or TOML (.toml) file's mapping; UserError naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"{path}: config file not found (nor a recipe of that name: `memdpc recipes` lists them)"
        )
    try:
        text = path.read_text()
        data = _toml_loads(path, text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        raise UserError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'YAML'}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data


def names() -> list[str]:
    """The short names of the recipes shipped with memdpc."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.yaml") if p.stem != DATASETS)


def resolve(name_or_path: str | Path) -> Path:
    """The file a ``--config`` value names: the path itself, else the shipped recipe of that short name."""
    path = Path(name_or_path)
    if path.is_file() or path.suffix or len(path.parts) > 1:
        return path
    shipped = RECIPE_DIR / f"{path}.yaml"
    if shipped.is_file() and path.name != DATASETS:
        return shipped
    raise UserError(
        f"{path}: no such file, nor a recipe of that name ({name_list(names())}: `memdpc recipes` lists them)"
    )


def _named_from(recipe_path: Path, name: Any) -> Path:
    """A recipe that another names (its ``base``, a ``fuse`` entry): a path relative to it, else a recipe's name."""
    beside = recipe_path.parent / str(name)
    return beside if beside.is_file() else resolve(name)


def config_ref(path: Path) -> str:
    """How a printed command names a recipe file for ``--config``: its short name if memdpc ships it, else its
    path (a user's own recipe)."""
    return path.stem if path.resolve().parent == RECIPE_DIR.resolve() else str(path)


def is_recipe(values: dict[str, Any]) -> bool:
    """Whether a settings file's mapping is a recipe (it has sections) rather than plain options."""
    return any(k in SECTIONS for k in values)


@dataclass(frozen=True)
class RecipeFolders:
    """Where the commands ``memdpc recipes NAME`` prints read the datasets and write."""

    data: str = setting(
        "DATA",
        "Folder of the datasets in their official layouts, one sub-folder each (ucf101, hmdb51, k400).",
        flags=("--datasets",),
    )
    work: str = setting("WORK", "Folder for everything the commands write.")


@dataclass(frozen=True)
class Recipe:
    """A recipe with its base's sections merged in."""

    name: str
    path: Path
    row: str
    notes: str
    expect: dict[str, dict[str, float]]
    pretrain: str | None
    preprocess: dict[str, Any] = field(default_factory=dict)
    shard: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)
    fuse: list[dict[str, str]] = field(default_factory=list)
    quickstart: dict[str, Any] = field(default_factory=dict)  # an example recipe's run (module docstring)
    run: str = ""  # the recipe whose training this one evaluates: its run folder's name
    run_path: Path | None = None  # and its file

    @property
    def datasets(self) -> list[str]:
        """The datasets it reads: the pretraining's, then those evaluated on."""
        first = [self.pretrain] if self.pretrain else []
        return first + [d for d in self.expect if d not in first]


def _options(values: Any, where: str) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise UserError(f"{where}: expected a mapping of settings, got {type(values).__name__}")
    return {str(k).replace("-", "_"): v for k, v in values.items()}


def _raw(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict[str, Any], Path | None]:
    """A recipe file's sections over its base's, and the file of the recipe that defines its training."""
    data = read_file(path)
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise UserError(
            f"{path}: unknown section(s) {', '.join(map(str, unknown))}; a recipe has {', '.join(SECTIONS)}"
        )
    run = path if "train" in data else None
    if "base" not in data:
        return data, run
    base_path = _named_from(path, data["base"])
    if base_path.resolve() in seen:
        raise UserError(f"{path}: its bases lead back to {base_path}")
    base, base_run = _raw(base_path, (*seen, path.resolve()))
    merged = {k: v for k, v in base.items() if k != "base"}
    for key, value in data.items():
        if key in MERGED:
            merged[key] = {
                **_options(base.get(key, {}), f"{base_path}: {key}"),
                **_options(value, f"{path}: {key}"),
            }
        elif key != "base":
            merged[key] = value
    return merged, run or base_run


def load(name_or_path: str | Path) -> Recipe:
    """The recipe a ``--config`` value names (see the module docstring); UserError naming the file and the
    problem."""
    path = resolve(name_or_path)
    data, run = _raw(path)
    where = str(path)
    expect = data.get("expect") or {}
    if not isinstance(expect, dict) or not all(isinstance(v, dict) for v in expect.values()):
        raise UserError(f"{where}: expect must map each dataset to its figures, e.g. ucf101: {{top1: 68.2}}")
    evaluation = _options(data.get("eval") or {}, f"{where}: eval")
    if evaluation and evaluation.get("task") not in TASKS:
        raise UserError(f"{where}: eval needs a task, one of {', '.join(TASKS)}")
    fuse = data.get("fuse") or []
    if fuse and (
        len(fuse) != 2 or not all(isinstance(f, dict) and {"recipe", "result"} <= set(f) for f in fuse)
    ):
        raise UserError(f"{where}: fuse lists two results, each as {{recipe: NAME, result: FILE}}")
    quickstart = data.get("quickstart") or {}
    if not isinstance(quickstart, dict):
        raise UserError(
            f"{where}: quickstart: expected a mapping of settings, got {type(quickstart).__name__}"
        )
    if quickstart and (fuse or data.get("pretrain") or data.get("train") or evaluation):
        raise UserError(
            f"{where}: an example recipe (quickstart) has no pretrain, train, eval or fuse section"
        )
    if not fuse and not quickstart and not (data.get("pretrain") and data.get("train") and evaluation):
        raise UserError(
            f"{where}: a recipe needs pretrain, train and eval sections (or fuse, for a fused row; or "
            "quickstart, for the example data)"
        )
    return Recipe(
        name=path.stem,
        path=path,
        row=str(data.get("row", "")),
        notes=str(data.get("notes", "")),
        expect=expect,
        pretrain=data.get("pretrain"),
        preprocess=_options(data.get("preprocess") or {}, f"{where}: preprocess"),
        shard=_options(data.get("shard") or {}, f"{where}: shard"),
        train=_options(data.get("train") or {}, f"{where}: train"),
        eval=evaluation,
        fuse=[{**f, "recipe": _named_from(path, f["recipe"])} for f in fuse],
        quickstart=quickstart,
        run=(run or path).stem,
        run_path=run or path,
    )


def example_streams(recipe: Recipe) -> list[str]:
    """The streams an example recipe trains (its ``quickstart`` section's ``streams``, default both)."""
    return list(recipe.quickstart.get("streams", STREAMS))


def example_train(recipe: Recipe, stream: str | None = None) -> dict[str, Any]:
    """An example recipe's training settings for one of its streams, on any shards: its ``quickstart``
    section's ``train`` with the stream's own (``stream_train``) over them, the clip's blocks, and the stream.
    ``stream`` None: the recipe's one stream (UserError where it trains both)."""
    where, q = recipe.path, recipe.quickstart
    streams = example_streams(recipe)
    if stream is None:
        if len(streams) != 1:
            raise UserError(f"{where}: trains the {' and '.join(streams)} streams: say which (--stream)")
        stream = streams[0]
    if stream not in streams:
        raise UserError(f"{where}: trains the {' and '.join(streams)} stream only, not {stream}")
    clip = {k: v for k, v in (q.get("clip") or {}).items() if k in ("num_blocks", "block_len")}
    per_stream = (q.get("stream_train") or {}).get(stream, {})
    return {
        **_options(q.get("train") or {}, f"{where}: quickstart: train"),
        **per_stream,
        **clip,
        "stream": stream,
    }


def train_settings(name_or_path: str | Path, stream: str | None = None) -> dict[str, Any]:
    """What ``memdpc train --config`` reads: a plain settings file's options, a recipe's ``train`` section, or
    an example recipe's training settings for ``stream`` (:func:`example_train`)."""
    path = resolve(name_or_path)
    values = read_file(path)
    if not is_recipe(values):
        return _options(values, str(path))
    recipe = load(path)
    if recipe.quickstart:
        return example_train(recipe, stream)
    if not recipe.train:
        raise UserError(
            f"{path}: this recipe trains nothing (it fuses the results of "
            f"{' and '.join(config_ref(f['recipe']) for f in recipe.fuse) or 'other recipes'})"
        )
    return recipe.train


def eval_settings(name_or_path: str | Path, task: str) -> dict[str, Any]:
    """What ``memdpc eval TASK --config`` reads: the recipe's ``eval`` options, without ``task``; UserError when
    the recipe evaluates otherwise."""
    path = resolve(name_or_path)
    if not is_recipe(read_file(path)):
        raise UserError(
            f"{path}: memdpc eval --config takes a recipe (`memdpc recipes` lists them; a recipe of "
            "your own starts from one with base:), not a file of plain options"
        )
    recipe = load(path)
    if recipe.quickstart:  # an example recipe's evaluations: retrieval, and its linear probe
        if task not in ("retrieve", "probe"):
            raise UserError(f"{recipe.path}: an example recipe evaluates by retrieve and probe, not {task}")
        return (
            dict(recipe.quickstart.get("probe", {})) if task == "probe" else {}
        )  # the linear head: the default
    if recipe.eval.get("task") != task:
        how = f"memdpc eval {recipe.eval['task']}" if recipe.eval else "no evaluation of its own"
        raise UserError(f"{recipe.path}: this recipe's evaluation is {how}, not memdpc eval {task}")
    return {k: v for k, v in recipe.eval.items() if k != "task"}


def datasets() -> dict[str, dict[str, Any]]:
    """The datasets recipes use (``recipes/datasets.yaml``): {name: {layout, index, splits}}."""
    return read_file(RECIPE_DIR / f"{DATASETS}.yaml")


# ------------------------------------------------------------------------------------------- commands
def flags(options: dict[str, Any]) -> str:
    """Options as command-line flags: ``--key value``, ``--key`` for true, ``--no-key`` for false, lists joined by commas."""
    out = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append(f"--no-{flag[2:]}")
        else:
            out.append(f"{flag} {','.join(map(str, value)) if isinstance(value, list) else value}")
    return " ".join(out)


def checkpoint(recipe: Recipe, work: str) -> str:
    """The checkpoint a recipe's evaluation reads: its training run's best.pt, or the untrained init.pt of a
    random-init row."""
    if recipe.eval.get("random_init"):
        return f"{work}/runs/{recipe.name}/checkpoints/init.pt"
    return f"{work}/runs/{recipe.run}/checkpoints/best.pt"


def result(recipe: Recipe, dataset: str, work: str, file: str) -> str:
    return f"{work}/eval/{recipe.name}/{dataset}/{file}"


def commands(
    recipe: Recipe, data: str = "DATA", work: str = "WORK", seeds: tuple[int, ...] = EXAMPLE_SEEDS
) -> list[str]:
    """The commands that reproduce the recipe's row, from the datasets in ``data/<dataset>`` (their official
    layouts) to its results in ``work``, with comments: what to expect, what each dataset needs; an example
    recipe's runs on the draws ``seeds`` of each family."""
    lines = [f"# {recipe.name}: {recipe.row}"]
    lines += [
        f"# expect on {d}: " + (", ".join(f"{m} {v}" for m, v in figures.items()) or "no figure in the paper")
        for d, figures in recipe.expect.items()
    ]
    if recipe.notes:
        lines.append(f"# note: {' '.join(recipe.notes.split())}")
    if recipe.quickstart:
        return lines + [
            f"memdpc quickstart --recipe {config_ref(recipe.path)} --data {family} --seed {seed} "
            f"--out {work}/{recipe.name}/{family}-s{seed}"
            for family in recipe.expect
            for seed in seeds
        ]
    if recipe.fuse:
        first, second = (load(f["recipe"]) for f in recipe.fuse)
        lines.append(f"# first run the recipes {first.name} and {second.name} (memdpc recipes NAME), then:")
        for d in recipe.expect:
            a, b = (result(load(f["recipe"]), d, work, f["result"]) for f in recipe.fuse)
            lines.append(f"memdpc eval fuse {a} {b} --out {result(recipe, d, work, 'fused.json')}")
        return lines
    known = datasets()
    streams = str(recipe.preprocess.get("streams", "rgb"))
    verb = "frames" if streams == "rgb" else "flow"
    for d in recipe.datasets:
        if d not in known:
            raise UserError(f"{recipe.path}: dataset {d!r} is not described in {RECIPE_DIR / DATASETS}.yaml")
        spec, root = known[d], f"{work}/{d}"
        lines.append(f"# {d}: {' '.join(str(spec['layout']).split())}")
        lines.append(f"memdpc index {data}/{d} {flags(spec['index'])} --out {root}/index.jsonl")
        lines.append(
            f"memdpc preprocess {verb} {root}/index.jsonl --out {root}/frames "
            f"{flags(recipe.preprocess)}".rstrip()
        )
        for split in spec["splits"]:
            for stream in streams.split(","):
                lines.append(
                    f"memdpc shard {root}/frames --index {root}/index.jsonl --stream {stream} --split "
                    f"{split} --out {root}/shards {flags(recipe.shard)}".rstrip()
                )
    shards = f"{work}/{recipe.pretrain}/shards"
    if recipe.eval.get("random_init"):
        lines.append(
            f"memdpc train --config {config_ref(recipe.path)} --shards {shards} --out "
            f"{work}/runs/{recipe.name} --init-only"
        )
    else:
        if recipe.run != recipe.name:
            lines.append(
                f"# the pretraining of {recipe.run} (it finishes at once where that run is complete)"
            )
        lines.append(
            f"memdpc train --config {config_ref(recipe.run_path)} --shards {shards} --out "
            f"{work}/runs/{recipe.run}"
        )
    for d in recipe.expect:
        lines.append(
            f"memdpc eval {recipe.eval['task']} {checkpoint(recipe, work)} --config {config_ref(recipe.path)} "
            f"--shards {work}/{d}/shards --out {work}/eval/{recipe.name}/{d}"
        )
    return lines
