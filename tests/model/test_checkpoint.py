from __future__ import annotations

import resource
import signal

import pytest
import torch

from memdpc import __version__
from memdpc.common.errors import ResourceFault, UserError
from memdpc.model import checkpoint as mc
from memdpc.model import create_model

TINY = dict(
    widths=(4, 8, 16, 16), num_blocks=5, block_len=3, pred_steps=2, input_size=32, bidirectional=False
)
CLIPS = torch.randn(2, 5, 3, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def _save(model, path, stream="rgb", origin="train", **extra):
    mc.write_checkpoint(mc.serialize(mc.build_checkpoint(model, stream, origin, **extra)), path)
    return path


def test_every_origin_round_trips_to_the_same_model(tmp_path):
    model = create_model("memdpc_r18", seed=1, mem_size=8, **TINY).eval()
    clf = create_model("classifier_r18", seed=1, num_classes=3, widths=(4, 8, 16, 16)).eval()
    for origin, m, extra in (
        ("train", model, {"step": 3, "config": {"size": 32}}),
        ("init", model, {"step": 0}),
        ("converted", clf, {"input_size": 112, "source": "lc.pth.tar", "epoch": 7}),
    ):
        loaded, ckpt = mc.load_model(_save(m, tmp_path / f"{origin}.pt", origin=origin, **extra))
        assert (ckpt["format"], ckpt["memdpc_version"], ckpt["origin"]) == (mc.FORMAT, __version__, origin)
        assert not loaded.training and loaded.config == m.config
        assert torch.equal(
            loaded(CLIPS) if origin == "converted" else loaded.features(CLIPS),
            m(CLIPS) if origin == "converted" else m.features(CLIPS),
        )
    assert mc.read_checkpoint(tmp_path / "train.pt")["input_size"] == 32  # from the model config
    assert mc.read_checkpoint(tmp_path / "converted.pt")["input_size"] == 112
    assert mc.read_checkpoint(tmp_path / "converted.pt")["source"] == "lc.pth.tar"


def test_files_of_earlier_versions_still_load(tmp_path):
    """A training checkpoint as version 0.1.0 wrote it (no origin, no input size), and a converted file of
    that version (no format at all)."""
    model = create_model("dpc_r18", seed=0, **TINY)
    torch.save(
        {
            "format": "memdpc-train-1",
            "memdpc_version": "0.1.0",
            "model": model.state_dict(),
            "model_config": model.config,
            "stream": "flow",
            "optimizer": {},
            "epoch": 1,
            "step": 4,
            "config": {"size": 48},
        },
        tmp_path / "old.pt",
    )
    ckpt = mc.read_checkpoint(tmp_path / "old.pt")
    assert (ckpt["origin"], ckpt["stream"], ckpt["input_size"]) == ("train", "flow", 48)
    torch.save(
        {
            "model": model.state_dict(),
            "model_config": model.config,
            "stream": None,
            "epoch": 3,
            "converted_from": "dpc.pth.tar",
        },
        tmp_path / "conv.pt",
    )
    loaded, ckpt = mc.load_model(tmp_path / "conv.pt")
    assert (ckpt["origin"], ckpt["source"], ckpt["input_size"]) == ("converted", "dpc.pth.tar", None)
    assert torch.equal(loaded.features(CLIPS), model.eval().features(CLIPS))


def _refusal(path) -> str:
    with pytest.raises(UserError) as e:
        mc.read_checkpoint(path)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_foreign_missing_and_truncated_files_are_refused(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint\x00\xff" * 8)
    assert _refusal(tmp_path / "junk.pt").startswith(
        f"{tmp_path / 'junk.pt'}: not a readable checkpoint (not a PyTorch "
        "file: damaged, or a file of another kind); copy it again"
    )
    torch.save({"epoch": 1, "state_dict": {}}, tmp_path / "ref.pth.tar")
    with pytest.raises(
        UserError, match=r"ref.pth.tar: not a memdpc checkpoint .*import .* with `memdpc convert`"
    ):
        mc.read_checkpoint(tmp_path / "ref.pth.tar")
    with pytest.raises(UserError, match="nope.pt: checkpoint not found"):
        mc.read_checkpoint(tmp_path / "nope.pt")
    whole = _save(create_model("dpc_r18", seed=0, **TINY), tmp_path / "whole.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(whole[: len(whole) // 2])
    assert _refusal(tmp_path / "cut.pt") == (
        f"{tmp_path / 'cut.pt'}: not a readable checkpoint (truncated or damaged: "
        "its zip directory is missing); copy it again from where it came from"
    )
    torch.save({"w": torch.zeros(4000)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    (tmp_path / "legacy-cut.pt").write_bytes((tmp_path / "legacy.pt").read_bytes()[:5000])
    assert _refusal(tmp_path / "legacy-cut.pt").startswith(
        f"{tmp_path / 'legacy-cut.pt'}: not a readable checkpoint (truncated or damaged: RuntimeError: unexpected EOF"
    )


def test_a_run_folder_and_its_other_files_given_as_a_checkpoint_name_its_checkpoints(tmp_path):
    """As `memdpc train` leaves a run folder: checkpoints/last.pt and best.pt, config.yaml, metrics.jsonl."""
    run = tmp_path / "runs" / "rgb"
    model = create_model("dpc_r18", seed=0, **TINY)
    (run / "checkpoints").mkdir(parents=True)
    for name in ("last.pt", "best.pt"):
        _save(model, run / "checkpoints" / name)
    (run / "config.yaml").write_text("stream: rgb\nshards: shards\nout: runs/rgb\n")
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 5.2}\n')
    best = run / "checkpoints" / "best.pt"
    assert _refusal(run) == (
        f"{run} is a run folder: give one of its checkpoints, e.g. {best} (it holds best.pt, last.pt)"
    )
    assert (
        _refusal(run / "checkpoints")
        == f"{run / 'checkpoints'} is a folder: give one of its checkpoints, e.g. {best}"
    )
    assert _refusal(run / "metrics.jsonl") == (
        f"{run / 'metrics.jsonl'}: not a memdpc checkpoint (it looks like a "
        f"run's metrics); give a checkpoint, e.g. {best}"
    )
    assert _refusal(run / "config.yaml") == (
        f"{run / 'config.yaml'}: not a memdpc checkpoint (it looks like a run "
        f"config); give a checkpoint, e.g. {best}"
    )
    best.unlink()
    assert _refusal(best) == f"{best}: checkpoint not found ({run / 'checkpoints'} holds last.pt)"
    (tmp_path / "folder").mkdir()
    assert _refusal(tmp_path / "folder") == f"{tmp_path / 'folder'} is a folder, not a checkpoint file"


def test_stream_of_a_trained_checkpoint_is_a_fact_of_a_converted_one_a_claim():
    trained = {"stream": "rgb", "origin": "train"}
    assert mc.resolve_stream(trained, "t.pt", None) == ("rgb", None)
    assert mc.resolve_stream(trained, "t.pt", "rgb") == ("rgb", None)
    with pytest.raises(UserError, match="t.pt: checkpoint was trained on the rgb stream, not flow"):
        mc.resolve_stream(trained, "t.pt", "flow")
    stream, warning = mc.resolve_stream({"stream": "rgb", "origin": "converted"}, "c.pt", "flow")
    assert stream == "flow" and "c.pt: converted as rgb weights; used on the flow stream" in warning
    unknown = {"stream": None, "origin": "converted"}
    assert mc.resolve_stream(unknown, "u.pt", "flow") == ("flow", None)
    with pytest.raises(UserError, match="u.pt: the checkpoint does not record its stream; pass --stream"):
        mc.resolve_stream(unknown, "u.pt", None)


def test_classifiers_and_pretrained_models_are_told_apart():
    clf = {"model_config": create_model("classifier_r18", num_classes=3, widths=(4, 8, 16, 16)).config}
    pre = {"model_config": create_model("dpc_r18", **TINY).config}
    mc.require_classifier(clf, "c.pt")
    mc.require_pretrained(pre, "p.pt")
    with pytest.raises(
        UserError, match=r"c.pt: holds a finetuned classifier \(classifier_r18\).*eval classify"
    ):
        mc.require_pretrained(clf, "c.pt")
    with pytest.raises(UserError, match="p.pt: holds a pretrained dpc_r18 model, not a finetuned classifier"):
        mc.require_classifier(pre, "p.pt")


def test_checkpoints_of_another_architecture_are_refused(tmp_path):
    model = create_model("dpc_r18", seed=0, **TINY)
    ckpt = {"model_config": model.config}
    other = create_model("memdpc_r18", seed=0, mem_size=8, **TINY)
    with pytest.raises(UserError, match=r"another architecture: .*name .dpc_r18. \(this run: .memdpc_r18.\)"):
        mc.check_compatible(ckpt, tmp_path / "c.pt", other.config)
    mc.check_compatible(ckpt, tmp_path / "c.pt", {**model.config, "seed": 7})  # the seed is no architecture
    longer = create_model("dpc_r18", seed=0, **{**TINY, "pred_steps": 1})
    mc.check_compatible(ckpt, tmp_path / "c.pt", longer.config, mc.WEIGHT_KEYS)  # same weights
    with pytest.raises(UserError, match="pred_steps 2 .this run: 1."):
        mc.check_compatible(ckpt, tmp_path / "c.pt", longer.config)


def test_disk_full_leaves_the_previous_checkpoint_valid(tmp_path):
    """A real write failure (file-size limit, EFBIG) while the bigger second checkpoint is written."""
    path = _save(create_model("dpc_r18", seed=0, **TINY), tmp_path / "last.pt")
    before = path.read_bytes()
    big = mc.serialize(
        mc.build_checkpoint(create_model("memdpc_r18", seed=0, mem_size=4096, **TINY), "rgb", "train")
    )
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 1000, old_limit[1]))
    try:
        with pytest.raises(ResourceFault, match=r"file-size limit reached in .*, writing last\.pt"):
            mc.write_checkpoint(big, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left
    assert mc.read_checkpoint(path)["stream"] == "rgb"
