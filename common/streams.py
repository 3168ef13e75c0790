"""The input streams: the frames of a video (``rgb``) and its TV-L1 optical flow (``flow``).

Every stage names them the same way: the archive folders ``<root>/<stream>/``, the shard folders, the
training ``--stream`` and the eval results.
"""

__all__ = ["FLOW", "RGB", "STREAMS"]

RGB = "rgb"
FLOW = "flow"
STREAMS = (RGB, FLOW)
