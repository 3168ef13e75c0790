"""preprocess/flow/tvl1_params.py: the TV-L1 parameters every flow backend shares, OpenCV's defaults, the OpenCV
object they make and their validation."""

from __future__ import annotations

import dataclasses

import cv2
import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.preprocess.flow.tvl1_params import (
    TESTED_OPENCV,
    TVL1Params,
    opencv_record,
    opencv_scales_in_float,
)

GETTERS = {  # field → OpenCV getter of DualTVL1OpticalFlow
    "tau": "getTau",
    "lambda_": "getLambda",
    "theta": "getTheta",
    "scales": "getScalesNumber",
    "scale_step": "getScaleStep",
    "warps": "getWarpingsNumber",
    "epsilon": "getEpsilon",
    "inner_iterations": "getInnerIterations",
    "outer_iterations": "getOuterIterations",
    "median_filtering": "getMedianFiltering",
    "gamma": "getGamma",
}


def _opencv_values(tv) -> dict:
    return {f: getattr(tv, g)() for f, g in GETTERS.items()}


def test_every_field_has_a_getter():
    assert set(GETTERS) == {f.name for f in dataclasses.fields(TVL1Params)}


def test_defaults_equal_opencvs():
    assert _opencv_values(cv2.optflow.DualTVL1OpticalFlow_create()) == pytest.approx(TVL1Params().to_dict())


def test_to_opencv_carries_every_field():
    params = TVL1Params(
        tau=0.2,
        lambda_=0.1,
        theta=0.4,
        scales=3,
        scale_step=0.6,
        warps=2,
        epsilon=0.02,
        inner_iterations=7,
        outer_iterations=4,
        median_filtering=3,
        gamma=0.1,
    )
    tv = params.to_opencv()
    assert isinstance(tv, cv2.optflow.DualTVL1OpticalFlow)
    assert _opencv_values(tv) == pytest.approx(params.to_dict())
    assert tv.getUseInitialFlow() is False


@pytest.mark.parametrize("scale_step", [0.7, 0.6, 0.75, 0.8, 0.5])
def test_flow_scale_is_the_factor_the_installed_opencv_multiplies_by(scale_step):
    """``cv::multiply`` by 1 / scale_step, as OpenCV's TV-L1 scales the flow it carries to a finer level: in
    double (OpenCV 5.0) or in float (5.1); the factor reproduces it bit for bit where the products differ."""
    flow = np.random.default_rng(3).normal(0, 4, (40, 50)).astype(np.float32)
    inv = 1.0 / scale_step
    theirs = cv2.multiply(flow, (inv, inv, inv, inv))
    factor = TVL1Params(scale_step=scale_step).flow_scale()
    ours = (flow.astype(np.float64) * factor).astype(np.float32)
    assert ours.tobytes() == theirs.tobytes(), f"OpenCV {cv2.__version__}"
    in_float = (flow * np.float32(inv)).tobytes() == theirs.tobytes()
    in_double = (flow.astype(np.float64) * inv).astype(np.float32).tobytes() == theirs.tobytes()
    if scale_step in (0.7, 0.6, 0.75):  # 1 / scale_step is no float: the two ways differ, OpenCV takes one
        assert in_float != in_double and opencv_scales_in_float() == in_float
    else:
        assert in_float and in_double


def test_the_report_names_the_installed_opencv_and_those_tested():
    assert TESTED_OPENCV == ("5.0.0", "5.1.0")
    record = opencv_record()
    assert record["version"] == cv2.__version__ and record["tested"] == list(TESTED_OPENCV)
    if cv2.__version__ in TESTED_OPENCV:
        assert record["note"] is None
    else:
        assert record["note"].startswith(f"OpenCV {cv2.__version__} is not among")


def test_to_dict_holds_every_field_by_name():
    assert TVL1Params(warps=2).to_dict() == {
        "tau": 0.25,
        "lambda_": 0.15,
        "theta": 0.3,
        "scales": 5,
        "scale_step": 0.8,
        "warps": 2,
        "epsilon": 0.01,
        "inner_iterations": 30,
        "outer_iterations": 10,
        "median_filtering": 5,
        "gamma": 0.0,
    }


def test_defaults_and_edge_values_are_valid():
    TVL1Params().validate()
    TVL1Params(tau=0.25, median_filtering=1, gamma=0.0, scales=1, warps=1).validate()


@pytest.mark.parametrize(
    "bad, option",
    [
        ({"tau": 0.3}, "--tau"),
        ({"tau": 0.0}, "--tau"),
        ({"lambda_": 0.0}, "--lambda"),
        ({"theta": -1.0}, "--theta"),
        ({"scales": 0}, "--scales"),
        ({"scale_step": 1.0}, "--scale-step"),
        ({"warps": 0}, "--warps"),
        ({"epsilon": 0.0}, "--epsilon"),
        ({"inner_iterations": 0}, "--inner-iterations"),
        ({"outer_iterations": 0}, "--outer-iterations"),
        ({"median_filtering": 4}, "--median-filtering"),
        ({"gamma": -0.1}, "--gamma"),
    ],
)
def test_each_value_out_of_range_is_a_one_line_error_naming_its_option(bad, option):
    with pytest.raises(UserError) as e:
        TVL1Params(**bad).validate()
    msg = str(e.value)
    assert msg.startswith(f"TV-L1 option(s) out of range: {option} (need ") and "\n" not in msg


def test_every_bad_option_is_named():
    with pytest.raises(UserError, match=r"out of range: --tau, --scales, --median-filtering \(need"):
        TVL1Params(tau=1.0, scales=0, median_filtering=2).validate()
