"""Self-supervised training: config, distributed setup, checkpoints, metrics and the loop (ARCHITECTURE.md §3.3)."""
