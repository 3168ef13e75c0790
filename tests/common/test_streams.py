"""streams.py: the two input streams and their names, shared by every stage."""

from __future__ import annotations

from memdpc.common.streams import FLOW, RGB, STREAMS


def test_the_streams_and_their_order():
    assert (RGB, FLOW) == ("rgb", "flow")
    assert STREAMS == ("rgb", "flow")  # rgb first: the order the CLI lists and the stages process them
