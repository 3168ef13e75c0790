"""Where a training step's time goes, read from a ``torch.profiler`` trace (bench/train.py --profile).

:func:`record` runs a few steps under the profiler and returns its Chrome trace; :func:`analyse` reads it:

- per step: the host's time to issue the step; on CUDA the device's busy time (the union of its kernels,
  copies and fills), its idle time within the steps' span, kernels and launches (launch calls, a CUDA graph's
  one) per step. On a CPU the device is the host itself: busy is the time inside torch ops, idle the time
  outside them (Python, the framework);
- time by kind of work (:data:`KINDS`), by :data:`RULES` matched against each piece of work: a CUDA kernel's
  name and the ops enclosing its launch, or on a CPU the op itself and the ops enclosing it (each op's own
  time, without its children's). Work no rule names is ``other``; its largest names are listed so that the
  rules can be extended;
- time by model part (:data:`memdpc.model.parts.PARTS`, the optimiser, the rest): the forward pass by the
  part ranges enclosing it, the backward pass by the autograd sequence number that links a backward op to
  the forward op that made it.

The number of layout copies per step (kind ``layout copies``: on a CPU each clone or .contiguous() that copies,
on CUDA each such kernel) is the check that the step keeps its tensors in one layout.
"""

from __future__ import annotations

import bisect
import json
import re
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.table import Table
from torch.profiler import ProfilerActivity, profile, record_function

from memdpc.model.parts import PARTS, PREFIX

STEP = "memdpc: train step"  # the range around each profiled step


@dataclass(frozen=True)
class Rule:
    """Work is of ``kind`` when ``kernel`` (a regular expression; CUDA kernels only) is found in its kernel's
    name and ``op`` is found in the name of its op or of any op or range enclosing it; a pattern left out
    matches anything. The first rule of :data:`RULES` that matches decides."""

    kind: str
    kernel: str | None = None
    op: str | None = None


KINDS = (
    "conv forward",
    "conv data-grad",
    "conv weight-grad",
    "conv backward (data + weight, one op)",
    "BatchNorm",
    "elementwise",
    "layout copies",
    "GEMM",
    "loss",
    "optimizer",
    "memcpy",
    "other",
)
_CONV_BACKWARD = r"aten::convolution_backward|ConvolutionBackward|cudnn_convolution_backward"
RULES = (
    Rule("memcpy", kernel=r"^(Memcpy|Memset|\[memcpy\]|\[memset\])"),
    # cuDNN's and torch's own layout changes, compiled code's lone copies, then every copy for a clone or contiguous
    Rule(
        "layout copies",
        kernel=r"nchwToNhwc|nhwcToNchw|ncdhwToNdhwc|ndhwcToNcdhw|[Tt]ranspose|convert.*[Ff]ormat",
    ),
    Rule("layout copies", kernel=r"^triton_\w+_fused_clone_\d+$"),
    Rule("layout copies", op=r"^aten::(clone|contiguous)$"),
    Rule("conv data-grad", kernel=r"dgrad"),
    Rule("conv weight-grad", kernel=r"wgrad"),
    Rule("conv backward (data + weight, one op)", op=_CONV_BACKWARD),
    Rule("conv forward", op=r"^aten::(_?convolution|cudnn_convolution|mkldnn_convolution|conv[123]d)$"),
    Rule("conv forward", kernel=r"fprop|implicit_convolve|convolve"),
    Rule("BatchNorm", op=r"batch_norm|BatchNorm"),
    Rule("BatchNorm", kernel=r"batch_norm|bn_fw|bn_bw|welford"),
    Rule("optimizer", op=r"^Optimizer\.(step|zero_grad)#|_fused_adam|^aten::_foreach_"),
    Rule("optimizer", kernel=r"[Aa]dam|multi_tensor_apply"),
    Rule("loss", op=r"^aten::(cross_entropy_loss|_?log_softmax|_log_softmax_backward_data|nll_loss\w*)$"),
    Rule("loss", kernel=r"log_softmax|nll_loss|cross_entropy"),
    Rule("GEMM", op=r"^aten::(mm|bmm|addmm|baddbmm|matmul|einsum|linear)$"),
    Rule("GEMM", kernel=r"gemm|gemv|nvjet|cublas|cutlass|xmma"),
    Rule("elementwise", op=r"^aten::"),  # pointwise, reductions, softmax, pooling, concatenation, dtype casts
    Rule("elementwise", kernel=r"elementwise|reduce|triton_|softmax|pool|cat|fill|copy"),
)
_COMPILED_RULES = [(r.kind, r.kernel and re.compile(r.kernel), r.op and re.compile(r.op)) for r in RULES]
# the host calls that put work on a CUDA device: a kernel launch (runtime or driver API), a graph's, a copy's
LAUNCHES = re.compile(r"^(cudaLaunch\w*|cuLaunch\w*|cudaGraphLaunch|cudaMemcpy\w*Async|cudaMemsetAsync)$")
_HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
_DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
BACKWARD = "autograd::engine::evaluate_function: "
OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)#")
OTHER_SHOWN = 12  # the largest names of work no rule named, kept in the result


def kind_of(kernel: str | None, chain: Sequence[str]) -> str:
    """The kind of a piece of work: a CUDA kernel's name (None on a CPU) and the names of the op that did
    or launched it and of every op or range around that one (innermost first)."""
    for kind, kernel_re, op_re in _COMPILED_RULES:
        if kernel_re is not None and (kernel is None or not kernel_re.search(kernel)):
            continue
        if op_re is not None and not any(op_re.search(name) for name in chain):
            continue
        return kind
    return "other"


# ------------------------------------------------------------------------------------------------ recording
def record(step: Callable[[], Any], steps: int, device: torch.device) -> dict[str, Any]:
    """``steps`` calls of ``step`` (warmed up by the caller) under the profiler, each in a :data:`STEP` range,
    with one wait for the device at the end; the Chrome trace, as a dict."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            with record_function(STEP):
                step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return json.loads(path.read_text())


# ------------------------------------------------------------------------------------------------ reading
@dataclass
class _Event:
    name: str
    cat: str
    ts: float  # µs
    dur: float
    args: dict[str, Any]
    parent: _Event | None = None
    child_time: float = 0.0
    part: str | None = None

    @property
    def end(self) -> float:
        return self.ts + self.dur

    def chain(self) -> list[_Event]:
        """This event and the host events enclosing it, innermost first."""
        out, e = [], self
        while e is not None:
            out.append(e)
            e = e.parent
        return out


def _host_events(trace: dict[str, Any]) -> list[_Event]:
    """The host's events (ops, ranges, CUDA API calls), each with its enclosing event on its thread."""
    threads: dict[tuple[Any, Any], list[_Event]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in _HOST_CATS:
            threads[(e["pid"], e["tid"])].append(
                _Event(e["name"], e["cat"], float(e["ts"]), float(e.get("dur", 0)), e.get("args", {}))
            )
    out = []
    for events in threads.values():
        events.sort(key=lambda ev: (ev.ts, -ev.dur))
        stack: list[_Event] = []
        for ev in events:
            while stack and stack[-1].end < ev.end:
                stack.pop()
            if stack:
                ev.parent = stack[-1]
                stack[-1].child_time += ev.dur
            stack.append(ev)
        out += events
    return out


def _assign_parts(events: list[_Event]) -> None:
    """Each host event's part: the innermost part range or optimiser range around it; in the backward pass,
    the part of the forward op with the same autograd sequence number."""
    forward: dict[int, str] = {}  # autograd sequence number -> the part of the forward op that has it
    for ev in events:
        ev.part = _own_part(ev)
    for ev in events:
        seq = ev.args.get("Sequence number")
        if ev.cat == "cpu_op" and seq is not None and ev.part is not None and not _in_backward(ev):
            forward.setdefault(seq, ev.part)
    for ev in events:
        if ev.part is None:
            node = next((e for e in ev.chain() if e.name.startswith(BACKWARD)), None)
            if node is not None:
                ev.part = forward.get(node.args.get("Sequence number"))


def _own_part(ev: _Event) -> str | None:
    for e in ev.chain():
        if e.name.startswith(PREFIX) and e.name[len(PREFIX) :] in PARTS:
            return e.name[len(PREFIX) :]
        if OPTIMIZER.match(e.name):
            return "optimizer"
    return None


def _in_backward(ev: _Event) -> bool:
    return any(e.name.startswith(BACKWARD) for e in ev.chain())


class _Windows:
    """The steps' host time windows: an event belongs to the steps when it starts inside one (the backward
    pass of a CUDA step runs on a thread of its own, inside the step's time)."""

    def __init__(self, steps: list[_Event]) -> None:
        self.starts = sorted(s.ts for s in steps)
        self.ends = [s.end for s in sorted(steps, key=lambda s: s.ts)]

    def __contains__(self, ev: _Event) -> bool:
        i = bisect.bisect_right(self.starts, ev.ts) - 1
        return i >= 0 and ev.ts <= self.ends[i]


def _union(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


@dataclass
class _Work:
    """A piece of device work: its time, kind, part, and whether it is counted (a kernel, a copy or fill; on a CPU
    the outermost op of its kind)."""

    name: str
    us: float
    kind: str
    part: str
    counts: bool


def analyse(trace: dict[str, Any], device: str) -> dict[str, Any]:
    """The profile of the :data:`STEP` ranges in ``trace`` (from :func:`record`) on ``device`` ("cpu" or
    "cuda"): per-step times and counts, and time by kind and by part (module docstring). Times in ms."""
    events = _host_events(trace)
    steps = [ev for ev in events if ev.name == STEP]
    if not steps:
        raise ValueError(f"the trace holds no {STEP!r} range")
    _assign_parts(events)
    n = len(steps)
    issue = sum(s.dur for s in steps) / n
    inside = _Windows(steps)
    if device == "cuda":
        work, summary = _device_work(trace, [ev for ev in events if ev in inside], n)
    else:
        work, summary = _cpu_work([ev for ev in events if ev in inside], n)
    by_kind: Counter[str] = Counter()
    by_part: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    copies: Counter[str] = Counter()
    other: Counter[str] = Counter()
    for w in work:
        by_kind[w.kind] += w.us
        by_part[w.part] += w.us
        counts[w.kind] += w.counts
        copies[w.part] += w.counts and w.kind == "layout copies"
        if w.kind == "other":
            other[w.name] += w.us
    total = sum(by_kind.values()) or 1.0
    parts = (*PARTS, "optimizer", "rest")
    return {
        "device": device,
        "steps": n,
        "host_issue_ms": issue / 1e3,
        **summary,
        "layout_copies_per_step": counts["layout copies"] / n,
        "layout_copies_by_part": {p: copies[p] / n for p in parts if copies[p]},
        "by_kind": {
            k: {
                "ms_per_step": by_kind[k] / n / 1e3,
                "share": by_kind[k] / total,
                "count_per_step": counts[k] / n,
            }
            for k in KINDS
        },
        "by_part": {p: {"ms_per_step": by_part[p] / n / 1e3, "share": by_part[p] / total} for p in parts},
        "other_names": {name: us / n / 1e3 for name, us in other.most_common(OTHER_SHOWN)},
    }


def _cpu_work(events: list[_Event], n: int) -> tuple[list[_Work], dict[str, float]]:
    """On a CPU: every host event's own time in the steps (the steps' own time too: Python between ops). An op
    is counted where no op of its kind encloses it (a clone, not the copy inside it)."""
    kinds = {id(ev): kind_of(None, [e.name for e in ev.chain()]) for ev in events}
    work = []
    in_ops = 0.0
    ops = 0
    for ev in events:
        own = max(ev.dur - ev.child_time, 0.0)
        kind = kinds[id(ev)]
        outermost = ev.parent is None or ev.parent.cat != "cpu_op" or kinds[id(ev.parent)] != kind
        work.append(_Work(ev.name, own, kind, ev.part or "rest", ev.cat == "cpu_op" and outermost))
        if ev.cat == "cpu_op":
            in_ops += own
            ops += ev.parent is None or ev.parent.cat != "cpu_op"  # ops called from Python or the engine
    span = sum(ev.dur for ev in events if ev.name == STEP) / n
    return work, {
        "span_ms": span / 1e3,
        "busy_ms": in_ops / n / 1e3,
        "idle_ms": span / 1e3 - in_ops / n / 1e3,
        "idle_share": 1 - in_ops / n / span,
        "ops_per_step": ops / n,
    }


def _device_work(trace: dict[str, Any], events: list[_Event], n: int) -> tuple[list[_Work], dict[str, float]]:
    """On CUDA: every kernel, copy and fill launched in the steps, found by its launch call; one whose launch is
    not in the trace (a CUDA graph's kernels may carry none) counts where it starts after the first step did."""
    start = min(ev.ts for ev in events if ev.name == STEP)
    launches = {ev.args.get("correlation"): ev for ev in events if ev.cat in ("cuda_runtime", "cuda_driver")}
    host_calls = {
        e["args"].get("correlation")
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and "args" in e
    }
    work, spans = [], []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") not in _DEVICE_CATS:
            continue
        correlation = e.get("args", {}).get("correlation")
        launch = launches.get(correlation)
        if launch is None and (correlation in host_calls or float(e["ts"]) < start):
            continue  # launched outside the steps
        names = (
            [x.name for x in launch.chain()[1:]] if launch is not None else []
        )  # the ops around the launch
        kind = "memcpy" if e["cat"] != "kernel" else kind_of(e["name"], names)
        part = launch.part if launch is not None and launch.part else "rest"
        work.append(_Work(e["name"], float(e["dur"]), kind, part, True))
        spans.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    if not spans:
        raise ValueError("the trace holds no device work inside the steps (was the CUDA activity recorded?)")
    busy = _union(spans)
    span = max(b for _, b in spans) - min(a for a, _ in spans)
    calls = sum(1 for ev in launches.values() if LAUNCHES.match(ev.name))
    return work, {
        "span_ms": span / n / 1e3,
        "busy_ms": busy / n / 1e3,
        "idle_ms": (span - busy) / n / 1e3,
        "idle_share": 1 - busy / span if span else 0.0,
        "kernels_per_step": len(spans) / n,
        "launches_per_step": calls / n,
    }


# ------------------------------------------------------------------------------------------------ tables
def _table(title: str) -> Table:
    return Table(title=title, min_width=len(title))  # the title on one line, as tests and readers look for it


def tables(result: dict[str, Any], title: str) -> list[Table]:
    """The profile as three tables: the step, time by kind, time by part."""
    cuda = result["device"] == "cuda"
    step = _table(f"{title}: one step (mean of {result['steps']} profiled)")
    step.add_column("what", justify="left")
    step.add_column("per step", justify="right")
    if cuda:
        rows = [
            ("host time to issue the step", f"{result['host_issue_ms']:.2f} ms"),
            ("GPU span (first kernel to last, per step)", f"{result['span_ms']:.2f} ms"),
            ("GPU busy", f"{result['busy_ms']:.2f} ms"),
            ("GPU idle within the span", f"{result['idle_ms']:.2f} ms ({result['idle_share']:.1%})"),
            ("kernels", f"{result['kernels_per_step']:.0f}"),
            ("launch calls", f"{result['launches_per_step']:.0f}"),
        ]
    else:
        rows = [
            ("host time per step (the CPU is the device)", f"{result['host_issue_ms']:.2f} ms"),
            ("inside torch ops (busy)", f"{result['busy_ms']:.2f} ms"),
            (
                "outside them: Python, framework (idle)",
                f"{result['idle_ms']:.2f} ms ({result['idle_share']:.1%})",
            ),
            ("ops called", f"{result['ops_per_step']:.0f}"),
        ]
    where_copied = ", ".join(f"{p} {c:g}" for p, c in result["layout_copies_by_part"].items())
    rows.append(
        (
            "layout copies",
            f"{result['layout_copies_per_step']:g}" + (f" ({where_copied})" if where_copied else ""),
        )
    )
    for row in rows:
        step.add_row(*row)
    where = "GPU time" if cuda else "CPU time"
    kinds = _table(f"{title}: {where} by kind of work")
    for col in ("kind", "ms per step", "share", "count per step"):
        kinds.add_column(col, justify="left" if col == "kind" else "right")
    for kind, r in result["by_kind"].items():
        kinds.add_row(kind, f"{r['ms_per_step']:.3f}", f"{r['share']:.1%}", f"{r['count_per_step']:g}")
    parts = _table(f"{title}: {where} by part of the model (backward included)")
    for col in ("part", "ms per step", "share"):
        parts.add_column(col, justify="left" if col == "part" else "right")
    for name, r in result["by_part"].items():
        parts.add_row(name, f"{r['ms_per_step']:.3f}", f"{r['share']:.1%}")
    return [step, kinds, parts]
