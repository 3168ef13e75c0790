"""The options of `memdpc preprocess` as the command line gives them → the run's config, checked first."""

from __future__ import annotations

import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.decode import DecodeSpec
from memdpc.preprocess.encode import FLOW_ENCODING, FLOW_ENCODING_RGB, RGB_ENCODING
from memdpc.preprocess.flow.tvl1_params import TVL1Params
from memdpc.preprocess.job import PreprocessConfig
from memdpc.preprocess.options import PreprocessOptions, config_from_options


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
