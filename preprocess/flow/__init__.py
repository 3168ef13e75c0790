"""TV-L1 optical flow: its parameters, the four implementations (OpenCV's, native, the torch port, the Triton
kernels), the backends registry and code mapping (``backends``), and the batched stage that keeps a GPU busy
(``batched``). ARCHITECTURE.md §4."""
