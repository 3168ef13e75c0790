"""The developers' benchmarks, outside the installed package: run from the checkout as ``python -m bench.NAME``
(README.md here lists them); each prints a table and writes JSON under ``bench/results/``."""
