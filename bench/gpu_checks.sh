#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one short run: the GPU benchmarks (flow, training) and the GPU tests.
#
#   bash bench/gpu_checks.sh OUT_DIR [REFERENCE.npz]
#
# Each step has its own time limit, writes its JSON and log under OUT_DIR and does not stop the others.
# CHECKS_ONLY=GLOB runs only the steps whose name matches. The limits add up to 910 s, past one 10-minute device
# call and a session's 15 device minutes: run CHECKS_ONLY='flow*' (370 s) and CHECKS_ONLY='[tg]*' (420 s) as two
# calls on one warm machine, then CHECKS_ONLY=learn (120 s) if time is left; CHECKS_DEVICE=cpu runs the flow
# storage, training and learning steps' very commands
# on the CPU at tiny settings (tests/bench/test_gpu_checks.py), so that a first run on a GPU does not fail on a typo;
# there the steps run without their limits (sized for a GPU; a cold compile cache alone can pass them).
# REFERENCE.npz: the fidelity rows' frames and OpenCV flows (`python3 -m bench.flow_e2e --make-reference
# REFERENCE.npz --fidelity-pairs 16` on a machine with OpenCV contrib), for GPU machines without it.
# Where memdpc is not installed, the checkout itself is put on the path as the package.
# FLOW_EXTRA: options added to the flow steps, e.g. FLOW_EXTRA="--quick --device cpu --backend torch" (with
# TRITON_INTERPRET=1) to check those steps on a CPU machine.
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
    # a glob on purpose:
    # shellcheck disable=SC2053
    [[ $name == ${CHECKS_ONLY:-*} ]] || return 0
    if [ "${CHECKS_DEVICE:-cuda}" = cpu ]; then
        "$@" >"$out/$name.log" 2>&1  # the GPU's limits do not fit a CPU or a cold compile cache: no limit
    else
        timeout "$limit" "$@" >"$out/$name.log" 2>&1
    fi
    echo "$name: exit $?"
}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
ref=()
[ -n "${2:-}" ] && ref=(--reference "$2" --fidelity-pairs 16)
# --- flow (issue 30): the kernels, their fidelity to OpenCV, then end to end at a steady state -------------
flow=(${FLOW_EXTRA:-})
# kernels per batch (16 rendered pairs tiled), roofline, fidelity: about a minute, compiling included
step flow_kernels 100 python3 -m bench.flow_e2e --parts kernels,fidelity "${ref[@]}" --sizes 128,256 \
    --batches 256,512,1024,2048 --torch-batches "" --repeat 2 --out "$out/flow_kernels.json" "${flow[@]}"
# 160 videos (128 to 384 frames, 40,800 pairs) at 256² then 128²: compaction on/off and lagged/waited stop
# checks on the stage's batches of distinct pairs, the steady state end to end with the device's busy
# fraction and CPU cores, the kernels alone on the same pairs, the projection; then one batch in flight
# against two on 12 videos. Results are saved after each size (a step stopped at its limit keeps them).
step flow_steady 210 python3 -m bench.flow_e2e --parts compaction,steady,projection --sizes 128,256 \
    --videos 160 --frames 256 --sequential-videos 12 --out "$out/flow_steady.json" "${flow[@]}"
# the stored flow as the GPU loader decodes it (nvJPEG's hardware decoder): every candidate encoding of the
# storage table, the default (greyscale planes) among them, against the computed TV-L1 codes (issue 47)
if [ "${CHECKS_DEVICE:-cuda}" = cpu ]; then
    storage=(--dali-device cpu --size 64 --storage-videos 2)
else
    storage=(--dali-device gpu)
fi
step flow_storage 60 python3 -m bench.flow --parts storage "${storage[@]}" --out "$out/flow_storage.json"
# --- training at the card's pace (issue 29) ----------------------------------------------------------------------
# Per variant (one process each): the 50-step loss curve against eager's two runs, the profile at batch 16 (before:
# eager; after: the rest) and the in-memory throughput at batch 16, 32, 64 (clips/s, TFLOP/s, share of peak, peak
# memory); the loop with the torch loader. bench/train.py writes its JSON after every variant: a step stopped by
# its limit keeps what it measured. The compiled variants compare their curves with train.json's eager runs.
if [ "${CHECKS_DEVICE:-cuda}" = cpu ]; then
    train=(python3 -m bench.train --device cpu --size 32 --widths 4,8,16,16 --mem-size 16 --batch-sizes 2,3
           --steps 10 --curve-steps 3 --profile-steps 1)
    loaders=(--backends '')
    # the compiler's tracing alone (its autograd and code generation: tests/train/test_step.py); one batch
    # size, one compile (a second size compiles again, for dynamic shapes: that loop is the eager variants')
    compiled=(--compile-backend eager --batch-sizes 2)
else
    train=(python3 -m bench.train --device cuda --batch-sizes 16,32,64 --steps 15 --curve-steps 50 --profile-steps 3)
    loaders=(--backends torch,dali)
    compiled=()
fi
step train 180 "${train[@]}" --profile --variants eager,fast,bf16,graphs,graphs-bf16 "${loaders[@]}" \
    --out "$out/train.json"
step train_compiled 120 "${train[@]}" --profile --variants compile-graphs-bf16,compile-graphs "${compiled[@]}" \
    --backends '' --eager-curves "$out/train.json" --out "$out/train_compiled.json"
# --- the learning scan's largest cell at the card's pace (issue 46) ------------------------------------------------
# synthetic seed 0, 480 videos, 760 steps of the chosen settings: data, training, the evaluations along the way and
# both baselines, paired; its work folder (videos, shards) stays outside OUT_DIR, its table and curves come back.
if [ "${CHECKS_DEVICE:-cuda}" = cpu ]; then
    learn=(--plan smoke)
else
    learn=(--plan scan --only synthetic-s0-chosen-2x-videos)
fi
step learn 120 python3 -m bench.learn "${learn[@]}" --work "$(mktemp -d)" --out "$out/learn"
# ------------------------------------------------------------------------------------------------------------------
step gpu_tests 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/preprocess/flow/test_batched.py \
    tests/preprocess/flow/test_tvl1_triton.py tests/preprocess/flow/test_tvl1_torch.py \
    tests/preprocess/test_encode.py tests/pipeline/test_dali_loader.py \
    tests/train/test_loop_gpu.py tests/train/test_step.py
