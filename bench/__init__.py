"""Benchmarks: each prints a table and writes JSON; `memdpc bench loader` runs bench/loader.py."""
