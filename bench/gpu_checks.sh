#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one short run: the GPU benchmarks (flow, training) and the GPU tests.
#
#   bash bench/gpu_checks.sh OUT_DIR [REFERENCE.npz]
#
# Each step has its own time limit, writes its JSON and log under OUT_DIR and does not stop the others.
# REFERENCE.npz: the fidelity rows' frames and OpenCV flows (`python bench/flow_e2e.py --make-reference
# REFERENCE.npz --fidelity-pairs 16` on a machine with OpenCV contrib), for GPU machines without it.
# Where memdpc is not installed, the checkout itself is put on the path as the package.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/gpu_checks.sh OUT_DIR [REFERENCE.npz]}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if ! python3 -c "import memdpc" 2>/dev/null; then
    pkg=$(mktemp -d)
    ln -s "$PWD" "$pkg/memdpc"
    export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"
fi
step() {  # step NAME SECONDS COMMAND…: run with a limit, log to OUT_DIR/NAME.log, report the exit status
    local name=$1 limit=$2
    shift 2
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "$name: exit $?"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
ref=()
[ -n "${2:-}" ] && ref=(--reference "$2" --fidelity-pairs 16)
step flow_e2e 300 python3 bench/flow_e2e.py "${ref[@]}" --batches 128,256,512,1024 --videos 96 --frames 100 \
    --out "$out/flow_e2e.json"
step train 240 python3 bench/train.py --device cuda --backends torch,dali --out "$out/train.json"
step gpu_tests 180 python3 -m pytest -m gpu -q -p no:cacheprovider tests/preprocess/flow/test_batched.py \
    tests/preprocess/flow/test_tvl1_triton.py tests/preprocess/flow/test_tvl1_torch.py \
    tests/train/test_loop.py
