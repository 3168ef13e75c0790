"""Self-supervised training: config, the step, checkpoints and resume, metrics, the kNN monitor and the loop
(ARCHITECTURE.md §3.3); the distributed environment lives in :mod:`memdpc.common.distenv`."""
