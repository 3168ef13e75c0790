"""Where a step's time goes (bench/step_profile.py): the kinds of work from CPU op names and CUDA kernel names,
a real CPU profile of a training step, and the arithmetic of a CUDA trace (busy, idle, launches, parts)."""

from __future__ import annotations

import pytest
import torch

from bench.step_profile import KINDS, STEP, analyse, kind_of, record, tables
from memdpc.model import create_model
from memdpc.model.parts import PARTS

# (the op doing the work, then the ops and ranges around it) -> kind, as torch's CPU ops name them
CPU_CHAINS = [
    (["aten::mkldnn_convolution", "aten::_convolution", "aten::convolution", "aten::conv3d"], "conv forward"),
    (
        [
            "aten::convolution_backward",
            "ConvolutionBackward0",
            "autograd::engine::evaluate_function: ConvolutionBackward0",
        ],
        "conv backward (data + weight, one op)",
    ),
    (["aten::copy_", "aten::clone", "aten::contiguous", "aten::convolution_backward"], "layout copies"),
    (["aten::copy_", "aten::clone", "aten::reshape", "memdpc: loss"], "layout copies"),
    (["aten::native_batch_norm", "aten::_batch_norm_impl_index", "aten::batch_norm"], "BatchNorm"),
    (["aten::native_batch_norm_backward", "NativeBatchNormBackward0"], "BatchNorm"),
    (["aten::_log_softmax", "aten::log_softmax", "aten::cross_entropy_loss", "memdpc: loss"], "loss"),
    (["aten::nll_loss_backward", "NllLossBackward0"], "loss"),
    (["aten::mm", "aten::matmul", "memdpc: loss"], "GEMM"),
    (["aten::bmm", "aten::einsum", "memdpc: memory read"], "GEMM"),
    (["aten::add_", "Optimizer.step#Adam.step"], "optimizer"),
    (["aten::sigmoid", "memdpc: aggregation"], "elementwise"),
    (["aten::copy_", "aten::_to_copy", "aten::to"], "elementwise"),  # a dtype cast
    (["memdpc: train step"], "other"),  # Python between ops
    (["autograd::engine::evaluate_function: MulBackward0"], "other"),
]
# CUDA kernels (names as cuDNN, cuBLAS, torch and inductor give them) and the ops around their launch -> kind
CUDA_KERNELS = [
    (
        "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_ndhwckrsc_ndhwc_tilesize128x128x32_warpgroupsize1x1x1_g1",
        ["aten::cudnn_convolution", "aten::_convolution", "aten::convolution", "aten::conv3d"],
        "conv forward",
    ),
    (
        "sm90_xmma_dgrad_implicit_gemm_f32f32_tf32f32_f32_ndhwckrsc_ndhwc_tilesize128x128x32",
        ["aten::convolution_backward", "ConvolutionBackward0"],
        "conv data-grad",
    ),
    (
        "sm90_xmma_wgrad_implicit_gemm_f32f32_tf32f32_f32_ndhwckrsc_ndhwc_tilesize128x128x32",
        ["aten::convolution_backward", "ConvolutionBackward0"],
        "conv weight-grad",
    ),
    ("sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32", [], "conv data-grad"),  # replayed in a CUDA graph
    (
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, "
        "(cudnnKernelDataType_t)2>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, float const*, float*)",
        ["aten::cudnn_convolution", "aten::convolution"],
        "layout copies",
    ),
    (
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
        "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>>",
        ["aten::copy_", "aten::clone", "aten::reshape"],
        "layout copies",
    ),
    (
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
        "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(float)#1}>>",
        ["aten::copy_", "aten::_to_copy", "aten::to"],
        "elementwise",
    ),
    ("triton_poi_fused_clone_3", [], "layout copies"),
    (
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct, float const*)",
        ["aten::cudnn_batch_norm", "aten::_batch_norm_impl_index", "aten::batch_norm"],
        "BatchNorm",
    ),
    ("triton_per_fused__native_batch_norm_legit_functional_relu_4", [], "BatchNorm"),
    (
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous "
        "namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)",
        ["aten::_log_softmax", "aten::log_softmax", "aten::cross_entropy_loss"],
        "loss",
    ),
    ("nvjet_tst_128x64_64x8_2x1_v_bz_coopA_TNT", ["aten::mm", "aten::matmul"], "GEMM"),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off",
        [],
        "GEMM",
    ),
    (
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>",
        ["aten::_fused_adam_", "Optimizer.step#Adam.step"],
        "optimizer",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3>>",
        ["aten::add", "memdpc: aggregation"],
        "elementwise",
    ),
    ("triton_red_fused_mean_sum_7", [], "elementwise"),
    ("Memcpy HtoD (Pageable -> Device)", [], "memcpy"),
    ("some_new_kernel_of_a_later_cudnn", [], "other"),
]


@pytest.mark.parametrize(("chain", "kind"), CPU_CHAINS, ids=[c[0][0] + "/" + k for c, k in CPU_CHAINS])
def test_cpu_ops_map_to_their_kind(chain, kind):
    assert kind_of(None, chain) == kind


@pytest.mark.parametrize(
    ("kernel", "chain", "kind"), CUDA_KERNELS, ids=[f"{k[:30]}/{w}" for k, _, w in CUDA_KERNELS]
)
def test_cuda_kernels_map_to_their_kind(kernel, chain, kind):
    assert kind_of(kernel, chain) == kind


def test_a_cpu_training_step_is_told_by_kind_and_by_part():
    """A real step of MemDPC on the CPU: every kind of work a CPU has, every part of the model (the backward
    pass found through the autograd sequence numbers), shares that add up to the step."""
    torch.set_num_threads(1)
    model = create_model("memdpc_r18", widths=(4, 8, 16, 16), input_size=32, mem_size=16, seed=0).train()
    optimizer = torch.optim.Adam(model.parameters())
    clips = torch.randn(2, 8, 3, 5, 32, 32, generator=torch.Generator().manual_seed(0))

    def step():
        out = model(clips)
        optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        optimizer.step()

    step()
    result = analyse(record(step, 2, torch.device("cpu")), "cpu")
    assert result["steps"] == 2 and result["device"] == "cpu"
    assert list(result["by_kind"]) == list(KINDS)
    assert sum(r["share"] for r in result["by_kind"].values()) == pytest.approx(1.0)
    on_cpu = {
        "conv forward",
        "conv backward (data + weight, one op)",
        "BatchNorm",
        "elementwise",
        "GEMM",
        "loss",
        "optimizer",
        "other",
    }
    assert {k for k, r in result["by_kind"].items() if r["ms_per_step"] > 0} >= on_cpu
    assert all(
        result["by_kind"][k]["ms_per_step"] == 0 for k in ("conv data-grad", "conv weight-grad", "memcpy")
    )
    assert list(result["by_part"]) == [*PARTS, "optimizer", "rest"]
    assert all(r["ms_per_step"] > 0 for r in result["by_part"].values())
    assert sum(r["share"] for r in result["by_part"].values()) == pytest.approx(1.0)
    encoder = result["by_part"]["encoder"]["ms_per_step"]
    assert encoder > result["by_kind"]["conv forward"]["ms_per_step"]  # its backward counted too
    assert result["busy_ms"] + result["idle_ms"] == pytest.approx(result["host_issue_ms"])
    assert result["layout_copies_per_step"] == sum(result["layout_copies_by_part"].values())
    # 20 encoder convolutions (R18); per direction 3 GRU gates × (5 + 2) steps and 2 predictor convolutions × 3
    assert result["by_kind"]["conv forward"]["count_per_step"] == 20 + 2 * (3 * 7 + 2 * 3)
    titles = [t.title for t in tables(result, "eager")]
    assert titles == [
        "eager: one step (mean of 2 profiled)",
        "eager: CPU time by kind of work",
        "eager: CPU time by part of the model (backward included)",
    ]


def _cuda_trace() -> dict:
    """Two steps as the profiler's Chrome trace holds them on CUDA (the fields analyse reads): the host thread
    launches a convolution (whose cuDNN call converts the layout first), a clone and Adam; the autograd thread
    the convolution's backward; one copy from the host. Times in µs."""
    events = []

    def event(cat, name, ts, dur, tid, **args):
        events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 1 if cat not in ("kernel", "gpu_memcpy") else 0,
                "tid": tid,
                "ts": ts,
                "dur": dur,
                "args": args,
            }
        )

    corr = iter(range(1, 100))
    for i, t0 in enumerate((1000.0, 2000.0)):
        event("user_annotation", STEP, t0, 500, 1)
        event("user_annotation", "memdpc: encoder", t0 + 10, 100, 1)
        event("cpu_op", "aten::conv3d", t0 + 20, 80, 1)
        event("cpu_op", "aten::convolution", t0 + 21, 78, 1, **{"Sequence number": 7 + 10 * i})
        event("cpu_op", "aten::cudnn_convolution", t0 + 22, 70, 1)
        for dt, kernel, dur in (
            (30, "void cudnn::nchwToNhwcKernel<float>", 20),
            (40, "sm90_xmma_fprop_f32", 100),
        ):
            c = next(corr)
            event("cuda_runtime", "cudaLaunchKernel", t0 + dt, 5, 1, correlation=c)
            event("kernel", kernel, t0 + dt + 10, dur, 7, correlation=c)
        event("user_annotation", "memdpc: loss", t0 + 120, 40, 1)
        event("cpu_op", "aten::reshape", t0 + 121, 30, 1)
        event("cpu_op", "aten::clone", t0 + 122, 25, 1)
        event("cpu_op", "aten::copy_", t0 + 123, 20, 1)
        c = next(corr)
        event("cuda_runtime", "cudaLaunchKernel", t0 + 124, 5, 1, correlation=c)
        event("kernel", "direct_copy_kernel_cuda", t0 + 200, 20, 7, correlation=c)  # GPU still busy before
        # the backward, on autograd's thread (tid 2): its node carries the forward op's sequence number
        event(
            "cpu_op",
            "autograd::engine::evaluate_function: ConvolutionBackward0",
            t0 + 170,
            100,
            2,
            **{"Sequence number": 7 + 10 * i},
        )
        event("cpu_op", "aten::convolution_backward", t0 + 175, 90, 2)
        for dt, kernel in ((180, "sm90_xmma_dgrad_f32"), (190, "sm90_xmma_wgrad_f32")):
            c = next(corr)
            event("cuda_runtime", "cudaLaunchKernel", t0 + dt, 5, 2, correlation=c)
            event("kernel", kernel, t0 + dt + 50, 40, 7, correlation=c)  # 230-270 and 240-280: overlapping
        event("user_annotation", "Optimizer.step#Adam.step", t0 + 300, 50, 1)
        c = next(corr)
        event("cuda_runtime", "cuLaunchKernel", t0 + 310, 5, 1, correlation=c)
        event("kernel", "multi_tensor_apply_kernel<FusedAdamMathFunctor>", t0 + 320, 30, 7, correlation=c)
        c = next(corr)
        event("cuda_runtime", "cudaMemcpyAsync", t0 + 400, 5, 1, correlation=c)
        event("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t0 + 410, 10, 7, correlation=c)
    c = next(corr)  # work launched outside the steps is not theirs
    event("cuda_runtime", "cudaLaunchKernel", 3000, 5, 1, correlation=c)
    event("kernel", "void at::native::vectorized_elementwise_kernel<add>", 3010, 1000, 7, correlation=c)
    # a kernel whose launch the trace lacks (as a CUDA graph's may), during step 2: the steps' work, of no part
    event("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn", 2450, 20, 7, correlation=999)
    return {"traceEvents": events}


def test_a_cuda_trace_gives_busy_idle_launches_kinds_and_parts():
    result = analyse(_cuda_trace(), "cuda")
    # per step: kernels at +40..60 and +50..150, +200..220, +230..270 and +240..280, +320..350, a copy +410..420;
    # and one GEMM at 2450..2470
    assert result["steps"] == 2 and result["kernels_per_step"] == 7.5 and result["launches_per_step"] == 7
    assert result["busy_ms"] == pytest.approx((110 + 20 + 50 + 30 + 10 + 10) / 1e3)
    assert result["span_ms"] == pytest.approx(
        (1000 + 430) / 2 / 1e3
    )  # first kernel of step 1 to the last of 2
    assert result["idle_ms"] == pytest.approx(result["span_ms"] - result["busy_ms"])
    assert result["host_issue_ms"] == pytest.approx(0.5)
    kinds = {k: r["ms_per_step"] * 1e3 for k, r in result["by_kind"].items() if r["ms_per_step"]}
    assert kinds == pytest.approx(
        {
            "layout copies": 40,
            "conv forward": 100,
            "conv data-grad": 40,
            "conv weight-grad": 40,
            "optimizer": 30,
            "memcpy": 10,
            "GEMM": 10,
        }
    )
    assert result["layout_copies_per_step"] == 2 and result["layout_copies_by_part"] == {
        "encoder": 1,
        "loss": 1,
    }
    parts = {p: r["ms_per_step"] * 1e3 for p, r in result["by_part"].items() if r["ms_per_step"]}
    assert parts == pytest.approx({"encoder": 200, "loss": 20, "optimizer": 30, "rest": 20})
    assert sum(r["share"] for r in result["by_kind"].values()) == pytest.approx(1.0)
