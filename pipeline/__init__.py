"""Data pipeline: clip geometry, shards, DALI and torch loaders, augmentation spec."""
