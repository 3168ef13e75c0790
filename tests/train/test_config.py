from __future__ import annotations

from dataclasses import fields

import pytest
from click.testing import CliRunner

from memdpc.cli import main
from memdpc.common.errors import UserError
from memdpc.common.settings import options_of
from memdpc.train.config import (
    RESTART_FREE,
    TrainConfig,
    config_differences,
    config_from_dict,
    read_config_file,
)


def test_defaults_are_the_papers():
    c = TrainConfig()
    assert (c.arch, c.size, c.clip.num_blocks, c.clip.block_len, c.pred_steps, c.mem_size) == (
        "memdpc_r18",
        128,
        8,
        5,
        3,
        1024,
    )
    assert (c.lr, c.weight_decay, c.loader.batch_size, c.schedule, c.lr_min) == (
        1e-3,
        1e-5,
        16,
        "plateau",
        1e-4,
    )
    assert c.widths == [64, 128, 256, 256] and not c.global_negatives and c.amp == "none"
    assert (c.negatives, c.best_by, c.early_stop) == ("all", "loss", 0)
    assert c.colour_per == "frame"  # the paper's per-frame colour jitter and grey


def test_an_augmentation_span_not_offered_is_a_usage_error_through_the_cli(tmp_path):
    res = CliRunner().invoke(
        main, ["train", "--colour-per", "video", "--shards", "s", "--out", str(tmp_path)]
    )
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.output.splitlines()[-1] == (
        "Error: Invalid value for '--colour-per': 'video' is not one of 'frame', 'block', 'clip'."
    )
    assert list(tmp_path.iterdir()) == []


def test_yaml_and_toml_give_the_same_config(tmp_path):
    (tmp_path / "c.yaml").write_text("stream: flow\nlr: 0.01\nwidths: [8, 16, 32, 32]\nbidirectional: true\n")
    (tmp_path / "c.toml").write_text(
        'stream = "flow"\nlr = 0.01\nwidths = [8, 16, 32, 32]\nbidirectional = true\n'
    )
    a = config_from_dict(read_config_file(tmp_path / "c.yaml"))
    b = config_from_dict(read_config_file(tmp_path / "c.toml"))
    assert a == b
    assert (a.loader.stream, a.lr, a.widths, a.bidirectional, a.loader.batch_size) == (
        "flow",
        0.01,
        [8, 16, 32, 32],
        True,
        16,
    )


def test_option_strings_are_coerced():
    c = config_from_dict(
        {"milestones": "80,100", "schedule": "milestones", "bidirectional": "true", "epochs": "7"}
    )
    assert (c.milestones, c.bidirectional, c.epochs) == ([80, 100], True, 7)


@pytest.mark.parametrize(
    "text, message",
    [
        ("lrr: 0.1\n", "unknown setting(s) lrr"),
        ("epochs: 1.5\n", "epochs must be int"),
        ("stream: depth\n", "stream must be one of rgb, flow"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("lr: [\n", "not valid YAML"),
        ("pred_steps: 8\n", "pred_steps (8) must be smaller than num_blocks (8)"),
        ("schedule: milestones\n", "needs --milestones"),
        ("crop_size: -1\n", "crop_size must be ≥ 0, not -1"),
        ("negatives: none\n", "negatives must be one of all, same_position"),
        ("best_by: knn\nknn_every: 2\n", "best_by knn needs the kNN monitor every epoch (--knn-every 1)"),
        ("best_by: knn\nknn_every: 1\nval_split: none\n", "and a validation split"),
        ("early_stop: -1\n", "early_stop must be ≥ 0"),
        ("clips_per_video: -1\n", "clips_per_video must be ≥ 0, not -1"),
        ("num_blocks: 0\n", "num_blocks must be ≥ 1, not 0"),
        ("batch_size: 0\n", "batch_size must be ≥ 1, not 0"),
    ],
)
def test_bad_config_files_name_the_file_and_problem(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        config_from_dict(read_config_file(path), where=str(path))
    assert message in str(e.value)
    assert str(e.value).startswith(str(path))


def test_missing_config_file(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        read_config_file(tmp_path / "nope.toml")


def test_differences_ignore_settings_free_to_change_on_restart():
    recorded = config_from_dict(dict(shards="/a", out="/r")).to_dict()
    assert (
        config_differences(recorded, config_from_dict(dict(shards="/b", out="/r", epochs=5, num_workers=8)))
        == []
    )
    diff = config_differences(recorded, config_from_dict(dict(shards="/a", out="/r", lr=0.01)))
    assert diff == ["lr: 0.001 → 0.01"]
    assert "lr" not in RESTART_FREE and "seed" not in RESTART_FREE


def test_a_setting_newer_than_the_recorded_run_counts_as_its_default():
    recorded = config_from_dict(dict(shards="/a", out="/r")).to_dict()
    del recorded["jitter_flow"]  # a run directory written before the setting existed
    assert config_differences(recorded, config_from_dict(dict(shards="/a", out="/r"))) == []
    assert config_differences(recorded, config_from_dict(dict(shards="/a", out="/r", jitter_flow=False))) == [
        "jitter_flow: True → False"
    ]


def test_every_field_is_an_option_with_help_and_nested_settings_are_named_flat():
    assert all(f.metadata.get("help") or f.metadata.get("nested") for f in fields(TrainConfig))
    by_name = {f.name: meta for f, meta, _ in options_of(TrainConfig)}
    assert by_name["amp"]["choices"] == ("none", "bf16", "fp16")
    assert by_name["num_blocks"]["flags"] == ("--blocks", "--num-blocks")  # the clip's setting, train's flags
    assert {"shards", "num_workers", "num_blocks", "block_len"} <= set(TrainConfig().to_dict())
