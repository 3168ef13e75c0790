"""The options of `memdpc preprocess` as the command line gives them → the run's config, checked first; the
config's own checks and the report it names."""

from __future__ import annotations

import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.encode import FLOW_ENCODING, FLOW_ENCODING_RGB, RGB_ENCODING, JpegEncoding
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.options import PreprocessConfig, PreprocessOptions, config_from_options, parse_part


def test_the_defaults_are_the_runs():
    cfg = config_from_options("out")
    assert cfg == PreprocessConfig(out="out")
    assert (PreprocessOptions.size, PreprocessOptions.quality) == (DecodeSpec.size, RGB_ENCODING.quality)


def test_options_as_the_command_line_gives_them():
    cfg = config_from_options(
        "out",
        "rgb, flow",
        size=64,
        flow_encoding="rgb",
        third_channel="0",
        part="1/3",
        tvl1={"scales": 3},
        report="r.json",
        workers=2,
    )
    assert cfg.streams == ("rgb", "flow") and cfg.decode == DecodeSpec(size=64) and cfg.part == (1, 3)
    assert cfg.flow_encoding.quality == FLOW_ENCODING_RGB.quality and cfg.third_channel == 0
    assert cfg.tvl1 == TVL1Params(scales=3) and cfg.report == "r.json" and cfg.workers == 2
    assert config_from_options("o", "flow", flow_quality=80).flow_encoding.quality == 80
    assert config_from_options("o", "flow").flow_encoding == FLOW_ENCODING
    assert config_from_options("o", tvl1=TVL1Params(warps=2)).tvl1.warps == 2


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"flow_encoding": "png"}, "--flow-encoding"),
        ({"streams": "rgb,depth"}, "--streams"),
        ({"part": "3/3"}, "--part"),
        ({"workers": 0}, "--workers"),
        ({"tvl1": {"tau": 0.5}}, "tau"),
    ],
)
def test_bad_options_are_one_line_errors_naming_the_option(kw, says):
    kw = {"streams": "rgb", **kw}
    with pytest.raises(UserError, match=says):
        config_from_options("out", kw.pop("streams"), **kw)


def test_defaults_are_valid_and_the_report_is_named_by_part(tmp_path):
    cfg = PreprocessConfig(out=str(tmp_path))
    cfg.validate()
    assert (cfg.streams, cfg.flow_backend, cfg.device, cfg.tvl1) == (("rgb",), "auto", "auto", TVL1Params())
    assert cfg.report_path == tmp_path / "preprocess-report.jsonl"
    assert (
        PreprocessConfig(out=str(tmp_path), part=(2, 4)).report_path
        == tmp_path / "preprocess-report-part2of4.jsonl"
    )
    assert (
        PreprocessConfig(out=str(tmp_path), report="/r.json", part=(2, 4)).report_path.as_posix() == "/r.json"
    )


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"streams": ()}, "--streams must list distinct streams from rgb, flow, not ()"),
        ({"streams": ("rgb", "rgb")}, "--streams must list distinct streams"),
        ({"streams": ("depth",)}, "--streams must list distinct streams"),
        ({"decode": DecodeSpec(size=-1)}, "--size and --square must be ≥ 0"),
        ({"rgb_encoding": JpegEncoding(0)}, "--quality must be between 1 and 100, not 0"),
        ({"flow_encoding": JpegEncoding(101)}, "--flow-quality must be between 1 and 100, not 101"),
        ({"third_channel": 64}, "--third-channel must be 0 or 128, not 64"),
        ({"tvl1": TVL1Params(tau=1.0)}, "TV-L1 option(s) out of range: --tau"),
        ({"flow_backend": "cupy"}, "unknown --flow-backend 'cupy' (choose from auto, "),
        ({"workers": 0}, "--workers must be ≥ 1, not 0"),
        ({"threads": -1}, "--threads must be ≥ 0 (0: one per CPU core), not -1"),
        ({"part": (3, 3)}, "--part I/N needs N ≥ 1 and 0 ≤ I < N, not 3/3"),
    ],
)
def test_each_bad_option_is_refused_with_its_name(kw, message):
    with pytest.raises(UserError) as e:
        PreprocessConfig(out="o", **kw).validate()
    assert str(e.value).startswith(message)


def test_parse_part():
    assert parse_part("1/3") == (1, 3)
    assert parse_part(" 0 / 1 ") == (0, 1)
    for bad in ("3/3", "-1/2", "0/0", "1", "a/b"):
        with pytest.raises(UserError, match="--part"):
            parse_part(bad)
