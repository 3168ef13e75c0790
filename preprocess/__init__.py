"""Offline stages: datasets → video index, decode, RGB frames and TV-L1 flow (``flow/``), example data
(``examples/``)."""
