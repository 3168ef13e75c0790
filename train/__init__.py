"""Self-supervised training: config, distributed setup, checkpoints, metrics and the loop (DESIGN 2.6)."""
