"""Offline stages: datasets → video index, decode, RGB frames and TV-L1 flow, synthetic example data."""
