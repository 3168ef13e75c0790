"""The TV-L1 parameters, shared by every flow backend (OpenCV, the torch port, the Triton kernels).

One :class:`TVL1Params` holds OpenCV contrib's ``DualTVL1OpticalFlow`` parameters with its defaults; it is
what the CLI options fill, what the run records (``to_dict``: the ``tvl1`` of the run report and of
``meta.json``) and what :meth:`TVL1Params.to_opencv` turns into the OpenCV object. :func:`level_sizes` is the
pyramid OpenCV builds for a frame size, which the ports of its algorithm build alike, and
:meth:`TVL1Params.flow_scale` the factor by which this OpenCV scales the flow carried to a finer level.

The ports follow OpenCV 5 to the bit; :data:`TESTED_OPENCV` lists the releases their tests compared against.
Between those releases one operation changed: OpenCV 5.0 multiplies a float image by a scalar in double, 5.1
rounds the scalar to float first (``cv::multiply``), which changes the flow wherever ``1 / scale_step`` is not
a float (0.7, 0.6, 0.75; not the default 0.8 nor 0.5). :func:`opencv_scales_in_float` asks the installed
OpenCV which it does, so each port follows the OpenCV it runs beside.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from memdpc.common.errors import UserError
from memdpc.common.settings import setting

__all__ = ["TESTED_OPENCV", "TVL1Params", "level_sizes", "opencv_record", "opencv_scales_in_float"]

TESTED_OPENCV = ("5.0.0", "5.1.0")  # the OpenCV releases the ports' flows were tested against, bit for bit


def opencv_record() -> dict[str, Any]:
    """The run report's word on the OpenCV whose flow the backends reproduce: the installed version, those
    the ports were tested against bit for bit, and a note where the installed one is not among them."""
    tested = ", ".join(TESTED_OPENCV)
    untested = cv2.__version__ not in TESTED_OPENCV
    note = f"OpenCV {cv2.__version__} is not among those the flow ports were tested against ({tested})"
    return {"version": cv2.__version__, "tested": list(TESTED_OPENCV), "note": note if untested else None}


@functools.cache
def opencv_scales_in_float() -> bool:
    """Whether the installed OpenCV multiplies a float32 image by a scalar in float (5.1) rather than in
    double (5.0), found by asking it once on values where the two differ."""
    x = np.linspace(1.0, 9.0, 64, dtype=np.float32).reshape(8, 8)
    s = 1.0 / 0.7
    ours = cv2.multiply(x, (s, s, s, s))
    return not np.array_equal(ours, (x.astype(np.float64) * s).astype(np.float32))


@dataclass(frozen=True)
class TVL1Params:
    """TV-L1 parameters; the defaults are OpenCV's CPU ``DualTVL1OpticalFlow_create()`` defaults.

    ``lambda_`` is OpenCV's ``lambda`` and ``scales`` its ``nscales`` (pyramid levels).
    """

    tau: float = setting(0.25, "TV-L1 time step (≤ 0.25).")
    lambda_: float = setting(0.15, "TV-L1 data-term weight (smaller: smoother flow).")
    theta: float = setting(0.3, "TV-L1 coupling weight.")
    scales: int = setting(5, "Pyramid levels.")
    scale_step: float = setting(0.8, "Pyramid down-scaling factor.")
    warps: int = setting(5, "Warpings per pyramid level.")
    epsilon: float = setting(0.01, "Stopping threshold.")
    inner_iterations: int = setting(30, "Inner iterations per warp.")
    outer_iterations: int = setting(10, "Outer iterations per warp.")
    median_filtering: int = setting(5, "Median filter size on the flow (1 = off, 3, 5).")
    gamma: float = 0.0  # OpenCV's illumination term, off (not an option)

    def validate(self) -> None:
        """Refuse values out of range, naming the CLI options (UserError)."""
        checks = {
            "tau": 0 < self.tau <= 0.25 + 1e-9,  # the primal-dual scheme converges for tau <= 1/4
            "lambda": self.lambda_ > 0,
            "theta": self.theta > 0,
            "scales": self.scales >= 1,
            "scale-step": 0 < self.scale_step < 1,
            "warps": self.warps >= 1,
            "epsilon": self.epsilon > 0,
            "inner-iterations": self.inner_iterations >= 1,
            "outer-iterations": self.outer_iterations >= 1,
            "median-filtering": self.median_filtering in (1, 3, 5),
            "gamma": self.gamma >= 0,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise UserError(
                f"TV-L1 option(s) out of range: {', '.join('--' + b for b in bad)} (need 0 < tau ≤ 0.25, "
                "lambda/theta/epsilon > 0, scales/warps/iterations ≥ 1, 0 < scale-step < 1, median 1/3/5)"
            )

    def flow_scale(self) -> float:
        """The factor OpenCV multiplies the flow by when it carries it to the next finer level: ``1 /
        scale_step`` in double, or rounded to float where the installed OpenCV does that (as a double that
        a float holds exactly, so ``float32(flow · factor)`` computed in double is the float product)."""
        step = 1.0 / self.scale_step
        return float(np.float32(step)) if opencv_scales_in_float() else step

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_opencv(self) -> cv2.optflow.DualTVL1OpticalFlow:
        """The equivalent OpenCV object (``cv2.optflow.DualTVL1OpticalFlow``)."""
        return cv2.optflow.DualTVL1OpticalFlow_create(
            self.tau,
            self.lambda_,
            self.theta,
            self.scales,
            self.warps,
            self.epsilon,
            self.inner_iterations,
            self.outer_iterations,
            self.scale_step,
            self.gamma,
            self.median_filtering,
            False,
        )


MIN_LEVEL_SIZE = 16  # OpenCV stops the pyramid before a level with a side < 16 px


def level_sizes(height: int, width: int, params: TVL1Params) -> list[tuple[int, int]]:
    """Pyramid level sizes (H, W), finest first, as OpenCV computes them (round(size · scale_step))."""
    sizes = [(height, width)]
    for _ in range(1, params.scales):
        h, w = sizes[-1]
        nh, nw = round(h * params.scale_step), round(w * params.scale_step)
        if nh < MIN_LEVEL_SIZE or nw < MIN_LEVEL_SIZE:
            break
        sizes.append((nh, nw))
    return sizes
