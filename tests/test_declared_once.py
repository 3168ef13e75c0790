"""Each option is declared once: the configs (every dataclass field that is a setting) and the command line
(every option of every verb, generated from a setting or typed in a verb's module) are read, and a name declared
in two places fails, unless both are listed below as different settings that share a name. A setting that two
verbs use is one field, nested where it is used (the loader's settings in train and eval, the clip's shape in
train and shard), with each verb's defaults given where it nests it."""

from __future__ import annotations

import dataclasses
import importlib
from os.path import commonprefix
from pathlib import Path

import click

from memdpc.cli import main

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = ("tests", "bench", ".ci", ".venv", ".git", "build")

# Names that settings of different meanings share, each place with what the name means there. A place is a
# config class, or the verb whose module types the option. A name declared in two places not listed here — or a
# third place for one of these — is a second declaration of one setting: give it one home and nest it.
HOMONYMS: dict[str, dict[str, str]] = {
    "backend": {
        "LoaderSettings": "a run's loader",
        "QuickstartOptions": "the loader of every run the quickstart makes",
    },
    "batch_size": {"LoaderSettings": "a run's batch", "LoaderBench": "the benchmark's batch"},
    "config_file": {
        "TrainRun": "a settings file, or a recipe's train section",
        "RecipeEval": "a recipe's eval section",
    },
    "crop_size": {"TrainConfig": "training's crop", "ShowOptions": "the crop show --augment draws"},
    "data": {"QuickstartOptions": "the example family", "RecipeFolders": "the datasets' folder"},
    "device": {
        "LoaderSettings": "where a run computes",
        "LoaderBench": "where DALI decodes in the benchmark",
        "PreprocessOptions": "the flow's devices",
    },
    "dry_run": {"PreprocessRun": "a preprocess run's plan", "TrainRun": "a training run's plan"},
    "epochs": {"TrainConfig": "pretraining's", "FitConfig": "a head's or a finetuning's"},
    "fps": {"ExampleConfig": "the example videos' rate", "PreprocessOptions": "the rate frames are taken at"},
    "frames": {"ExampleConfig": "frames per example video", "ShowOptions": "frames on a contact sheet"},
    "index": {"ShardJob": "the video index", "OopsOptions": "the Oops index with its failure times"},
    "jitter_flow": {"TrainConfig": "training's augmentation", "ShowOptions": "the augmentation show draws"},
    "lr": {"TrainConfig": "pretraining's", "FitConfig": "a head's or a finetuning's"},
    "lr_min": {"TrainConfig": "pretraining's", "FitConfig": "a head's or a finetuning's"},
    "out": {
        "TrainConfig": "the run directory",
        "EvalOutput": "an evaluation's folder",
        "FuseOptions": "the fused results file",
        "LoaderBench": "the benchmark's JSON",
        "PreprocessOptions": "the archives' folder",
        "IndexRun": "the index file",
        "ShardJob": "the shard folder",
        "ShowOut": "the pictures' folder",
        "ReportOut": "the page's folder",
        "QuickstartOptions": "everything the quickstart makes",
        "CompareOptions": "the comparison's JSON",
    },
    "overwrite": {
        "EvalOutput": "results of another checkpoint",
        "FuseOptions": "other results at --out",
        "PreprocessOptions": "archives of other settings",
        "IndexRun": "an index shards were made from",
        "ShardJob": "shards of another plan",
        "TrainRun": "a run started afresh",
    },
    "patience": {"TrainConfig": "pretraining's", "FitConfig": "a head's or a finetuning's"},
    "seed": {
        "TrainConfig": "training's draws and weights",
        "FitConfig": "a head's training",
        "ShardSettings": "the train shuffle",
        "IndexOptions": "the held-out draw",
        "ExampleConfig": "the example videos",
        "ShowOptions": "show --augment's draws",
        "QuickstartOptions": "every stage's",
    },
    "shards": {"LoaderSettings": "the shards a run reads", "ShowOptions": "the shards of eval results shown"},
    "size": {
        "TrainConfig": "the model's input size",
        "EvalData": "the size evaluated at",
        "ExampleConfig": "the example frames' size",
        "LoaderBench": "the benchmark's output size",
        "PreprocessOptions": "the frames' short side",
        "ShowOptions": "the size show --augment draws at",
    },
    "split": {
        "IndexOptions": "the dataset's official split",
        "LoaderBench": "the split benchmarked",
        "ShowOptions": "the split shown",
        "ShardJob": "the split sharded",
    },
    "stream": {
        "LoaderSettings": "the shards' stream",
        "LoaderBench": "the stream benchmarked",
        "ShardJob": "the archives sharded",
        "ConvertOptions": "the weights' stream",
    },
    "strict": {"PreprocessOptions": "exit 1 on a failure", "ShardJob": "stop at the first bad video"},
    "weight_decay": {"TrainConfig": "pretraining's", "FitConfig": "a head's or a finetuning's"},
    "workers": {
        "LoaderBench": "the benchmark's workers",
        "PreprocessOptions": "preprocess's processes",
        "QuickstartOptions": "its processes and loader workers",
    },
}


def setting_classes() -> list[type]:
    """Every dataclass of the package that declares a setting."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in OUTSIDE or "setting(" not in path.read_text():
            continue
        name = ".".join(["memdpc", *rel.with_suffix("").parts]).removesuffix(".__init__")
        module = importlib.import_module(name)
        found += [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == name
        ]
    return found


def declared(cls: type) -> list[dataclasses.Field]:
    """The settings ``cls`` declares itself (not those it inherits or nests)."""
    own = cls.__dict__.get("__annotations__", {})
    return [f for f in dataclasses.fields(cls) if f.name in own and f.metadata.get("help")]


def commands(group: click.Group = main, path: str = "memdpc"):
    ctx = click.Context(group)
    yield path, group
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            yield from commands(cmd, f"{path} {name}")
        else:
            yield f"{path} {name}", cmd


def declarations(classes: list[type] | None = None, group: click.Group = main) -> dict[str, set[str]]:
    """Every option's name → the places that declare it: config classes, and the verbs that type it (an option
    typed once and used by several verbs, e.g. by one decorator, counts once, at the verbs' common prefix)."""
    places: dict[str, set[str]] = {}
    helps: dict[str, list[str]] = {}
    for cls in setting_classes() if classes is None else classes:
        for f in declared(cls):
            places.setdefault(f.name, set()).add(cls.__name__)
            helps.setdefault(f.name, []).append(f.metadata["help"])
    typed: dict[tuple[str, str], list[str]] = {}
    for path, cmd in commands(group, "memdpc"):
        for p in cmd.params:
            if not isinstance(p, click.Option) or p.name in ("help", "version"):
                continue
            if not any((p.help or "").startswith(h) for h in helps.get(p.name, [])):  # not generated
                typed.setdefault((p.name, p.help or ""), []).append(path)
    for (name, _), paths in typed.items():
        prefix = commonprefix([p.split() for p in paths]) if len(paths) > 1 else paths[0].split()
        places.setdefault(name, set()).add(" ".join(prefix))
    return places


def test_every_setting_is_declared_once_or_is_a_listed_homonym():
    twice = {name: sorted(where) for name, where in declarations().items() if len(where) > 1}
    unlisted = {name: where for name, where in twice.items() if set(where) != set(HOMONYMS.get(name, {}))}
    assert unlisted == {}
    assert sorted(HOMONYMS) == sorted(twice)  # an entry whose name is now declared once goes


def test_no_verb_declares_one_option_twice():
    for path, cmd in commands():
        names = [p.name for p in cmd.params]
        assert len(names) == len(set(names)), path


def test_the_check_sees_a_second_declaration():
    """The loader's workers declared by a second config, or typed again by a verb, is found."""

    @dataclasses.dataclass
    class Again:
        num_workers: int = dataclasses.field(default=2, metadata={"help": "Workers, again."})

    classes = setting_classes()
    found = declarations(classes)
    assert found["num_workers"] == {"LoaderSettings"}  # nested in TrainConfig and EvalData: declared once
    assert found["num_blocks"] == {"ClipShape"}  # train's clip and shard's: one field
    assert declarations([*classes, Again])["num_workers"] == {"LoaderSettings", "Again"}

    @click.group("memdpc")
    def group():
        pass

    @group.command("verb")
    @click.option("--workers", "num_workers", type=int, help="Loader workers, typed again.")
    def verb(num_workers):
        pass

    assert declarations(classes, group)["num_workers"] == {"LoaderSettings", "memdpc verb"}
