"""The main job end to end: every stage runs for real, the summary table is complete, and the default run prints
the tables README shows; the tiny profile on the held-out family and the torch loader."""

import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from memdpc.common.errors import UserError
from memdpc.common.streams import STREAMS
from memdpc.preprocess.datasets import OwnFolders
from memdpc.quickstart import (
    BASELINES,
    BELOW_INIT,
    COLUMNS,
    COMPARED,
    MODEL_NAMES,
    PROFILES,
    VERDICTS,
    _torch_threads,
    _train_config,
    comparison_summary,
    own_commands,
    profile_from,
    training_order,
)

MEMDPC = str(Path(sys.executable).parent / "memdpc")
README = Path(__file__).resolve().parents[1] / "README.md"
# around README's copy of it; the first names the CPU whose kernels wrote it (:func:`cpu_kind`)
MD_START, MD_END = re.compile(r"<!-- quickstart\.md cpu: (?P<cpu>[^>]*?) -->"), "<!-- /quickstart.md -->"


def _run(out: Path, *args: str) -> subprocess.CompletedProcess:
    """The quickstart where torch would take two threads, as on README's 2-core machine: the built-in profiles
    run on one all the same (an example recipe without ``threads`` takes the two); threads that wait for work
    sleep rather than spin, which changes no sum and lets the tests beside it run."""
    return subprocess.run(
        [MEMDPC, "quickstart", "--out", str(out), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
    )


def _check_table(out: Path) -> list[dict]:
    rows = json.loads((out / "quickstart.json").read_text())
    expected = {(m, s) for m in MODEL_NAMES.values() for s in (*STREAMS, "fused")}
    assert {(r["model"], r["stream"]) for r in rows} == expected
    metrics = ["R@1", "R@5", "probe top-1"]
    assert len(metrics) == len(COLUMNS)
    tests = json.loads((out / "shards" / "rgb" / "manifest-test.json").read_text())["num_videos"]
    for r in rows:
        assert r["n"] == tests  # every figure says how many test videos it counts
        for m in metrics:
            assert isinstance(r[m], float) and not math.isnan(r[m]) and 0 <= r[m] <= 100, r
            lo, hi = r[f"{m} 95%"]  # and its interval
            assert 0 <= lo <= r[m] <= hi <= 100, r
    # a MemDPC row says when the trained epoch it evaluates (best.pt: the monitor's best; last.pt: the last) did not
    # beat the untrained encoder on the kNN monitor
    below = set()
    for s in STREAMS:
        knn = [
            r["r1"]
            for r in map(json.loads, (out / "runs" / s / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "knn"
        ]
        evaluated = json.loads((out / "eval" / f"memdpc-{s}" / f"retrieval-{s}.json").read_text())["config"]
        trained = knn[1:]  # none where training ended before the monitor's first pass after step 0
        if (
            trained
            and (max(trained) if evaluated["checkpoint"].endswith("best.pt") else trained[-1]) <= knn[0]
        ):
            below.add(s)
    notes = {r["stream"]: r["note"] for r in rows if r["model"] == MODEL_NAMES["memdpc"]}
    assert {s for s in STREAMS if notes[s].startswith(BELOW_INIT)} == below
    monitored = sum(v["split"] == "val" for v in _index(out / "index.jsonl"))
    assert all(notes[s].endswith(f"; on {monitored} val videos)") for s in below)  # how few it read
    assert bool(notes["fused"]) == bool(below)
    assert all(r["note"] == "" for r in rows if r["model"] != MODEL_NAMES["memdpc"])
    # the pretext task's top-1 and loss on the val videos, before and after training, per stream
    pretext = json.loads((out / "quickstart-pretext.json").read_text())
    assert [r["stream"] for r in pretext] == list(STREAMS) and all(r["split"] == "val" for r in pretext)
    for r in pretext:
        assert all(0 <= r[k] <= 100 for k in ("top-1 before", "top-1 after"))
        assert all(r[k] > 0 for k in ("loss before", "loss after"))
    # MemDPC against each baseline, paired on the same test videos by `memdpc eval compare`
    compared = json.loads((out / "quickstart-compare.json").read_text())
    assert len(compared["comparisons"]) == 2 * 3 * len(COMPARED)
    for c in compared["comparisons"]:
        if c["discordant"] == "0/0":  # right on the same videos: no interval and no test, not "0 to 0"
            assert (c["difference"], c["difference 95%"], c["p"], c["better"]) == (
                0,
                None,
                None,
                VERDICTS[None],
            )
            continue
        lo, hi = c[
            "difference 95%"
        ]  # the exact interval that goes with McNemar's test: it leaves out 0 when p < 0.05
        assert (lo > 0 or hi < 0) == (c["p"] < 0.05) == (c["better"] != VERDICTS[None]), c
        assert lo <= c["difference"] <= hi and 0 < c["p"] <= 1 and c["better"] in VERDICTS.values(), c
    assert (
        compared["summary"].startswith("Pretraining ") and f"same {tests} test videos" in compared["summary"]
    )
    md = (out / "quickstart.md").read_text().splitlines()
    at_pretext = 2 + len(expected) + 2 + 3
    at_compared = at_pretext + 2 + len(pretext) + 3
    assert len(md) == at_compared + 2 + len(compared["comparisons"]) + 2 and all(m in md[0] for m in metrics)
    note = md[2 + len(expected) + 1]
    assert note.startswith(f"{tests} test videos (one video = {100 / tests:.1f} points"), note
    assert "top-1 before" in md[at_pretext] and md[at_compared - 4].startswith("| flow | val |")
    assert "| baseline | stream | metric | difference |" in md[at_compared] and md[-1] == compared["summary"]
    return rows


def cpu_kind() -> str:
    """The CPU as its kernels go: vendor, family and model (another model of one vendor may pick other kernels
    for a training step's convolutions, which then sum in another order)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return platform.processor()
    info = {}
    for line in cpuinfo.read_text().splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    return f"{info.get('vendor_id')} family {info.get('cpu family')} model {info.get('model')}"


def readme_quickstart_md() -> tuple[str, str]:
    """The ``quickstart.md`` README shows as the default run's output (between its two markers), and the CPU
    (:func:`cpu_kind`) that wrote it."""
    text = README.read_text()
    start = MD_START.search(text)
    return text[start.end() : text.index(MD_END)].strip(), start["cpu"]


def untrained_lines(md: str) -> list[str]:
    """The lines of a quickstart.md that no training step made: the baselines' rows and the note on the test
    set (the untrained encoders' features do not depend on the kernels a training step picks)."""
    table, note = md.split("\n\n")[:2]  # the summary table, then the note on the test set
    return [line for line in table.splitlines() if line.startswith(("| model ", "| random init"))] + [note]


@pytest.mark.slow
def test_the_default_quickstart_prints_readmes_tables(tmp_path):
    """README's first command's job, run as a fresh clone runs it: every stage, a complete table, and the very
    tables README shows (a change that moves a figure updates README in the same commit)."""
    out = tmp_path / "qs"
    res = _run(out)
    assert res.returncode == 0, res.stderr[-3000:]
    _check_table(out)
    md, cpu = readme_quickstart_md()
    if cpu == cpu_kind():
        assert (out / "quickstart.md").read_text().strip() == md
    else:  # another CPU's training kernels: the same rows wherever no training step is involved
        assert untrained_lines((out / "quickstart.md").read_text().strip()) == untrained_lines(md)
    # each stage left its real output behind
    assert (out / "shards" / "flow" / "manifest-train.json").is_file()
    assert (out / "runs" / "rgb" / "checkpoints" / "last.pt").is_file()
    # each stream pretrained on the pool with its own settings: flow without per-frame colour jitter (it swamps
    # the example videos' small motions) and with its global shift and gain (the built-in family's global motion
    # does not tell its class: the rule keeps them on), RGB briefly, as README says
    config = {s: yaml.safe_load((out / "runs" / s / "config.yaml").read_text()) for s in STREAMS}
    assert config["flow"]["jitter_flow"] is False and config["flow"]["motion_invariance"] == "on"
    assert config["rgb"]["epochs"] < config["flow"]["epochs"]
    # the kNN monitor reads the labelled draw's held-out training videos (not the test split, not the pool)
    # from the initial weights on; the evaluation reads the last checkpoint
    index = _index(out / "index.jsonl")
    assert {v["split"] for v in index} == {"train", "val", "test"}
    for s in STREAMS:
        assert config[s]["shards"] == str(out / "pool" / "shards")
        assert (config[s]["val_split"], config[s]["knn_shards"]) == ("val", str(out / "shards"))
        knn = [json.loads(line) for line in (out / "runs" / s / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in knn if r["kind"] == "knn"][0] == 0
    evaluated = json.loads((out / "eval" / "memdpc-flow" / "retrieval-flow.json").read_text())
    assert evaluated["config"]["checkpoint"].endswith("runs/flow/checkpoints/last.pt"), evaluated["config"]
    # the first command shows learning: MemDPC's flow beats both baselines in R@1 and probe top-1 (with README's
    # CPU's kernels: another CPU's training sums in another order)
    compared = json.loads((out / "quickstart-compare.json").read_text())["comparisons"]
    flow = [c for c in compared if c["stream"] == "flow"]
    assert len(flow) == 4
    if cpu == cpu_kind():
        assert all(c["better"] == VERDICTS["a"] for c in flow), flow


@pytest.mark.slow
def test_tiny_quickstart_on_the_held_out_photos_and_the_torch_loader_resumes_and_refuses_other_data(tmp_path):
    """The held-out family, on the torch loader with several workers (where DALI is missing, each worker reads
    whole shards): the quickstart writes enough; a re-run resumes, also from a copy of its folder elsewhere; one
    that asks for other data is refused."""
    out = tmp_path / "qs"
    args = ("--tiny", "--workers", "2", "--backend", "torch")
    res = _run(out, *args, "--data", "photos")
    assert res.returncode == 0, res.stderr[-3000:]
    rows = _check_table(out)
    index = _index(out / "index.jsonl")
    assert {v["label_name"] for v in index} == {"CameraPan", "CameraZoom", "CameraRoll"}
    manifest = json.loads((out / "shards" / "rgb" / "manifest-test.json").read_text())
    assert len(manifest["shards"]) >= 2
    # a re-run resumes: nothing is trained again and the table is the same
    metrics = {s: (out / "runs" / s / "metrics.jsonl").read_text() for s in STREAMS}
    again = _run(out, *args, "--data", "photos")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "quickstart.json").read_text()) == rows
    assert {s: (out / "runs" / s / "metrics.jsonl").read_text() for s in STREAMS} == metrics
    # copied elsewhere (the videos' modification times new, their bytes the same): no video is preprocessed and no
    # run trained again there
    moved = tmp_path / "moved"
    shutil.copytree(out, moved, copy_function=shutil.copy)
    archives = {p: p.stat().st_mtime_ns for p in (moved / "frames").rglob("*.tar")}
    there = _run(moved, *args, "--data", "photos")
    assert there.returncode == 0, there.stderr[-3000:]
    assert archives and {p: p.stat().st_mtime_ns for p in (moved / "frames").rglob("*.tar")} == archives
    assert {s: (moved / "runs" / s / "metrics.jsonl").read_text() for s in STREAMS} == metrics
    other = _run(out, *args)  # the synthetic family into the photos run's folder
    assert other.returncode == 2
    assert other.stderr.strip().splitlines()[-1] == (
        f"Error: {out}: holds a quickstart run of --data photos --seed 0 --tiny, not --data synthetic --seed 0 "
        "--tiny; resume it with the same options or choose another --out"
    )


TINY_POOL_RECIPE = """\
row: a tiny pooled run
expect: {synthetic: {R@1: 0, top1: 0}}
quickstart:
  data: {videos_per_class: 5, frames: 24, size: 32, num_classes: 3}
  clip: {num_blocks: 4, block_len: 4, stride: 1}
  window_step: 4
  max_count: 1
  streams: [flow]
  pool: {synthetic: 2, photos: 1, directions: 1}
  checkpoint: last
  threads: 1  # torch's count for the run, as the built-in profiles set it
  train: {size: 32, crop_size: 0, widths: [8, 16, 16, 16], batch_size: 4, epochs: 2, pred_steps: 1,
          mem_size: 64, val_split: val, knn_every: 1, jitter_flow: false}
  probe: {epochs: 30, lr: 0.003, lr_min: 0.0003}
"""


def test_a_recipe_profile_lists_its_streams_in_the_tables_order_and_refuses_others():
    """Both streams in either order are both streams (trained, evaluated and fused); an unknown or repeated
    stream is named."""
    settings = yaml.safe_load(TINY_POOL_RECIPE)["quickstart"]
    for given in (["flow", "rgb"], ["rgb", "flow"]):
        assert profile_from({**settings, "streams": given}, "r", "synthetic").streams == STREAMS
    assert profile_from(settings, "r", "photos").pool == 1
    for bad in (["flow", "flow"], ["depth"], []):
        with pytest.raises(UserError, match=r"r: streams must be some of rgb, flow, each once; got \["):
            profile_from({**settings, "streams": bad}, "r", "synthetic")


def test_a_profile_names_the_stream_that_teaches_another_and_refuses_what_cannot_teach():
    settings = {**yaml.safe_load(TINY_POOL_RECIPE)["quickstart"], "streams": ["rgb", "flow"]}
    assert profile_from(settings, "r", "synthetic").teachers == {}
    taught = profile_from({**settings, "teachers": {"rgb": "flow"}}, "r", "synthetic")
    assert taught.teachers == {"rgb": "flow"}
    assert training_order(taught) == ["flow", "rgb"] and training_order(PROFILES["default"]) == [
        "rgb",
        "flow",
    ]
    out = Path("/qs")
    config = _train_config(out, out / "pool" / "shards", "rgb", taught, 0, 1, "torch")
    assert config.teacher == "/qs/runs/flow/checkpoints/last.pt" and config.out == "/qs/runs/rgb"
    assert _train_config(out, out / "pool" / "shards", "flow", taught, 0, 1, "torch").teacher == ""
    one_stream = {**settings, "streams": ["rgb"]}
    for values in (
        {**settings, "teachers": {"rgb": "rgb"}},
        {**settings, "teachers": {"rgb": "depth"}},
        {**settings, "teachers": {"rgb": "flow", "flow": "rgb"}},
        {**settings, "teachers": ["flow"]},
        {**one_stream, "teachers": {"rgb": "flow"}},
    ):
        with pytest.raises(UserError, match=r"r: teachers must map a trained stream to the other one"):
            profile_from(values, "r", "synthetic")


def test_a_profile_runs_torch_on_its_own_thread_count_and_gives_the_count_back():
    """The built-in profiles pin torch to one thread (their table then does not move with the machine's cores);
    a recipe's ``threads`` is a whole number (0: torch's own count, left as it is), and the count before the run
    comes back after it, also after an error."""
    assert {name: p.threads for name, p in PROFILES.items()} == {"default": 1, "tiny": 1}
    settings = yaml.safe_load(TINY_POOL_RECIPE)["quickstart"]
    assert profile_from(settings, "r", "synthetic").threads == 1
    assert profile_from({k: v for k, v in settings.items() if k != "threads"}, "r", "synthetic").threads == 0
    assert profile_from({**settings, "threads": 2}, "r", "synthetic").threads == 2
    for bad in (-1, 1.5, "two"):
        with pytest.raises(UserError, match=r"r: threads must be a whole number of torch threads"):
            profile_from({**settings, "threads": bad}, "r", "synthetic")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        with _torch_threads(0):
            assert torch.get_num_threads() == 3
        with pytest.raises(RuntimeError), _torch_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError("a stage failed")
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def _index(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_an_example_recipe_pretrains_on_its_pool_and_evaluates_on_the_labelled_draw(tmp_path):
    """An example recipe by path (the shipped one's kind at tiny sizes): MemDPC pretrains on a pool of unlabelled
    videos (another draw, of the size the recipe sets for this family: twice the videos, without a test split),
    the labelled draw alone is evaluated, on the recipe's stream only and from its last checkpoint; a re-run with
    the default's sizes in its folder is refused, and so are mistakes in a recipe and a paper's recipe."""
    recipe = tmp_path / "tiny-pool.yaml"
    recipe.write_text(TINY_POOL_RECIPE)
    out = tmp_path / "qs"
    res = _run(out, "--recipe", str(recipe), "--backend", "torch")
    assert res.returncode == 0, res.stderr[-3000:]
    labelled, pool = _index(out / "index.jsonl"), _index(out / "pool" / "index.jsonl")
    assert {v["split"] for v in labelled} == {"train", "val", "test"} and len(labelled) == 15
    assert {v["split"] for v in pool} == {"train", "val"} and len(pool) == 18  # 30 videos less every third
    same_names = {Path(v["path"]).name: v["path"] for v in labelled}
    twins = [
        (v["path"], same_names[Path(v["path"]).name]) for v in pool if Path(v["path"]).name in same_names
    ]
    assert twins and all(Path(a).read_bytes() != Path(b).read_bytes() for a, b in twins)  # another draw
    config = yaml.safe_load((out / "runs" / "flow" / "config.yaml").read_text())
    assert config["shards"] == str(out / "pool" / "shards") and not (out / "runs" / "rgb").exists()
    rows = json.loads((out / "quickstart.json").read_text())
    assert {(r["model"], r["stream"]) for r in rows} == {(m, "flow") for m in MODEL_NAMES.values()}
    tests = json.loads((out / "shards" / "flow" / "manifest-test.json").read_text())["num_videos"]
    assert all(r["n"] == tests == 6 for r in rows)
    evaluated = json.loads((out / "eval" / "memdpc-flow" / "retrieval-flow.json").read_text())
    assert evaluated["config"]["checkpoint"].endswith("runs/flow/checkpoints/last.pt")
    assert Path(evaluated["config"]["shards"]) == out / "shards"
    compared = json.loads((out / "quickstart-compare.json").read_text())
    assert len(compared["comparisons"]) == 2 * len(COMPARED)
    assert "of the flow stream, paired on the same 6 test videos" in compared["summary"]
    assert "memdpc quickstart --recipe example-flow-pool" in compared["summary"]

    other = _run(out, "--backend", "torch")  # the default's sizes into the recipe's folder
    assert other.returncode == 2
    assert other.stderr.strip().splitlines()[-1] == (
        f"Error: {out}: holds a quickstart run of --data synthetic --seed 0 --recipe {recipe}, not "
        "--data synthetic --seed 0; resume it with the same options or choose another --out"
    )
    (tmp_path / "bad.yaml").write_text(TINY_POOL_RECIPE.replace("pool: {", "pools: {"))
    (tmp_path / "bad-pool.yaml").write_text(TINY_POOL_RECIPE.replace(", directions: 1}", "}"))
    for args, message in (
        (
            ("--tiny", "--recipe", str(recipe)),
            "--tiny and --recipe choose the run's sizes both; give one of them",
        ),
        (("--recipe", "ucf101-r18-flow"), "ucf101-r18-flow.yaml: not an example recipe"),
        (
            ("--recipe", str(tmp_path / "bad.yaml")),
            f"{tmp_path / 'bad.yaml'}: quickstart: unknown setting(s) pools",
        ),
        (
            ("--recipe", str(tmp_path / "bad-pool.yaml")),
            f"{tmp_path / 'bad-pool.yaml'}: quickstart: pool by family must name each of synthetic, photos, directions once",
        ),
    ):
        res = _run(tmp_path / "elsewhere", *args)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert message in res.stderr, res.stderr


def test_the_closing_sentence_names_the_streams_where_pretraining_pays():
    def rows(wins: dict[str, str | None]) -> list[dict]:
        return [
            {"baseline": MODEL_NAMES[b], "stream": s, "metric": m, "better": VERDICTS[v]}
            for b in BASELINES
            for s, v in wins.items()
            for m in ("R@1", "probe top-1")
        ]

    assert comparison_summary(rows({"rgb": "a", "flow": "a"}), 9).startswith(
        "Pretraining beats random init: "
    )
    mixed = comparison_summary(rows({"rgb": None, "flow": "a", "fused": "a"}), 9)
    assert mixed.startswith("Pretraining beats random init on flow and fused, not reliably on rgb: ")
    assert "better than random init in 4 of 6, worse in 0" in mixed and "same 9 test videos" in mixed
    none = comparison_summary(rows({"flow": "b"}), 9)
    assert none.startswith("Pretraining does not reliably beat random init: ") and "worse in 2" in none


def test_a_recipe_chooses_the_fused_retrievals_weights_only_when_it_says_so(tmp_path):
    """``fusion: chosen`` puts --choose-weights on the fused retrieval's command (never the probe's: its results
    hold no training videos); the default fuses with equal weights; another value is refused by name."""
    settings = {**yaml.safe_load(TINY_POOL_RECIPE)["quickstart"], "streams": ["rgb", "flow"]}
    with pytest.raises(UserError, match="r: fusion must be one of equal, chosen"):
        profile_from({**settings, "fusion": "learned"}, "r", "synthetic")
    videos = tmp_path / "videos"
    for name in ("a", "b"):
        (videos / name).mkdir(parents=True)
        for i in range(3):
            (videos / name / f"{name}{i}.avi").write_bytes(b"")
    for fusion, expected in (("equal", []), ("chosen", ["memdpc", "random", "random_bn"])):
        recipe = tmp_path / f"{fusion}.yaml"
        recipe.write_text(
            TINY_POOL_RECIPE.replace("streams: [flow]", f"streams: [rgb, flow]\n  fusion: {fusion}")
        )
        fused = [
            c
            for c in own_commands(recipe, OwnFolders(videos=videos), "w")
            if c.startswith("memdpc eval --fuse")
        ]
        chosen = sorted(
            c.split("/eval/")[1].split("-rgb")[0] for c in fused if c.endswith(" --choose-weights")
        )
        assert len(fused) == 6 and chosen == expected
        assert all("retrieval" in c for c in fused if c.endswith(" --choose-weights"))
