#!/usr/bin/env python3
"""Where the time of a CPU training update goes: matmul kernels versus everything else.

    python benchmarks/profile_train.py DATA_DIR                            # transformer_small
    python benchmarks/profile_train.py DATA_DIR --threads 1 --warm-updates 2 --updates 5
    python benchmarks/profile_train.py DATA_DIR --arch transformer_base --json p.json
    python benchmarks/profile_train.py DATA_DIR --write BENCHMARKS.md  # bench:train-profile section
    python benchmarks/profile_train.py --quick                         # tiny synthetic run (tests)

DATA_DIR comes from nmt-preprocess, as for bench_train.py, whose helpers build the inputs, walk
the real batches and measure the machine's fp32 matmul rate. After --warm-updates untimed
updates, the next --updates updates (the library's Trainer.train_step on batches from the real
sampler and collate) run twice: once plainly, timed with perf_counter, and once more, the same
batches, under torch.profiler (CPU, with shapes and FLOPs recorded). The profiler adds a cost
per op, so both wall times are reported; the phases (data, forward, backward, grad norm, Adam)
are timed in both passes.

The self CPU time of every profiled event goes to one category: by the op's own name (matmul
kernels, attention, layer norm, dropout, activation, loss, embedding, optimizer), else, for a
backward node, by the forward op that made it (matched by sequence number: the mask multiply in
dropout's backward counts as dropout), else by the event it runs inside of, else by a generic
kind (elementwise, copies/layout, other). The self time of events that are not aten ops (Python,
the autograd engine) is a category of its own, except inside data loading and the optimizer.

The MFU gap is then split, per plain update: the matmul kernels' share of the wall time, their
rate on the FLOPs they really compute (padded lengths; the profiler's own count of the kernels'
FLOPs is printed as a check) against the measured matmul rate (what the shapes cost), the
padding they compute, and the time outside them. A table gives each matmul shape's rate. FLOPs
come from nmt/training/flops.py (x3 for forward + backward).

Caveat, measured on a 2-core CPU: the profiler's overhead is not spread evenly. Nearly all of
it landed on the loss's two [N, V] passes (log_softmax, exp), listed 3-4x slower than the same
calls timed with plain timers in an unprofiled update; check a surprising op that way before
acting on its share.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import re
import shlex
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    import numpy as np
    from torch.autograd.profiler_util import FunctionEvent

    from nmt.config import ModelConfig
    from nmt.training.loop import Run

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_train  # noqa: E402  (sibling scripts)
import run_all  # noqa: E402

SECTION = "train-profile"
MATMUL = "matmul kernels"
GLUE = "linear glue (bias add/grad, views)"
ATTENTION = "attention (SDPA kernels)"
DATA = "data (collate)"
OPTIMIZER = "optimizer (grad norm, Adam, zero_grad)"
OUTSIDE = "outside aten ops (Python, autograd engine)"
OTHER = "other aten ops"

# Categories an event takes from its own name (checked in this order), and that the ops inside
# it, or the backward of the forward op, inherit.
OWN = [
    (MATMUL, r"^aten::(addmm|mm|bmm|baddbmm|addbmm|_addmm_activation)$"
             r"|^mkldnn::_linear_pointwise$"       # nmt.models.packed's linear layers
             r"|^quantized::linear_dynamic\w*$"),  # --precision int8's linear layers
    (GLUE, r"^aten::(linear|matmul)$"),
    (ATTENTION, r"(?i)scaled_?dot_?product|flash_?attention|efficient_?attention"
                r"|^aten::_?softmax$|^aten::_softmax_backward_data$"),
    ("layer norm", r"(?i)layer_?norm"),
    ("dropout", r"(?i)dropout|^aten::bernoulli"),
    ("activation", r"^aten::(relu|relu_|gelu|gelu_backward|threshold_backward|silu)$"
                   r"|^(Relu|Gelu|Silu)Backward"),
    ("loss", r"SmoothedCrossEntropy|log_softmax|LogSoftmaxBackward|nll_loss"),
    ("embedding, indexing", r"^aten::embedding|^EmbeddingBackward"),
    (OPTIMIZER, r"^Optimizer\.|^aten::_fused_adam|^nmt::(grad_norm|optimizer_step)$"),
    (DATA, r"^nmt::data$"),
]
# Categories of ops with nothing more specific around them, by their own name.
GENERIC = [
    ("embedding, indexing", r"^aten::(index_select|index|index_add_?|gather|scatter_?|"
                            r"scatter_add_?|take|nonzero|masked_select)$"),
    ("elementwise (residual adds, scaling, reductions)",
     r"^aten::(add|mul|div|sub|neg|exp|log|pow|sqrt|rsqrt|where|masked_fill|eq|ne|lt|gt|le|ge"
     r"|bitwise_\w+|logical_\w+|clamp\w*|any|all|sum|mean|isfinite|abs|max|min)_?$"),
    ("copies, layout, allocation",
     r"^aten::(copy_|_to_copy|to|clone|contiguous|cat|stack|view|_unsafe_view|reshape|transpose"
     r"|t|permute|expand|split\w*|slice|select|unsqueeze|squeeze|flatten|as_strided|empty\w*"
     r"|zeros\w*|ones\w*|fill_|zero_|new_\w+|full\w*|detach\w*|alias|lift_fresh|resolve_\w+"
     r"|unbind|narrow|item|_local_scalar_dense)$"),
]
ORDER = [MATMUL, GLUE, ATTENTION, "layer norm", "dropout", "activation", "loss",
         "embedding, indexing", OPTIMIZER, DATA, *[c for c, _ in GENERIC[1:]], OTHER, OUTSIDE]
PHASES = ["data", "forward (model + loss)", "backward", "grad norm/scale", "optimizer step",
          "zero_grad, lr, finite check", "loop"]


# --- timing the phases ----------------------------------------------------------------------------
class Phases:
    """Seconds per named region, also marked for the profiler as ``nmt::NAME``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        import torch

        with torch.profiler.record_function(f"nmt::{name}"):
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[name] += time.perf_counter() - t0

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.span(name):
                return fn(*args, **kwargs)
        return timed

    def take(self) -> dict[str, float]:
        """The seconds so far; starts again from zero."""
        out, self.seconds = dict(self.seconds), defaultdict(float)
        return out


def instrument(run: Run, phases: Phases) -> None:
    """Time the trainer's own steps (its code unchanged: the bound methods are wrapped on this
    instance) and the forward pass of the model with its loss (module hooks)."""
    trainer = run.trainer
    for attr, name in (("_forward_backward", "forward_backward"),
                       ("_normalise_and_clip", "grad_norm"), ("_apply", "optimizer_step")):
        setattr(trainer, attr, phases.wrap(name, getattr(trainer, attr)))
    trainer.train_step = phases.wrap("train_step", trainer.train_step)
    open_spans: list[contextlib.ExitStack] = []

    def enter(module: Any, args: Any) -> None:
        stack = contextlib.ExitStack()
        stack.enter_context(phases.span("forward"))
        open_spans.append(stack)

    def leave(module: Any, args: Any, output: Any) -> None:
        open_spans.pop().close()

    trainer.wrapped.register_forward_pre_hook(enter)
    trainer.wrapped.register_forward_hook(leave)


def run_updates(run: Run, groups: list, phases: Phases) -> float:
    """Collate and train on each group of sentence ids as nmt-train does; wall seconds."""
    from nmt.data.buckets import collate

    t0 = time.perf_counter()
    for group in groups:
        with phases.span("data"):
            batches = [None if idx is None else collate(run.train_ds, idx) for idx in group]
        run.trainer.train_step(batches)
    return time.perf_counter() - t0


def usage() -> tuple[float, float, int]:
    """(user CPU seconds, system CPU seconds, minor page faults) of this process so far."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_minflt


def usage_per_update(before: tuple, after: tuple, wall: float, n: int) -> dict[str, float]:
    """CPU time over wall time (below --threads: the process waited for a core, or idled),
    system time and minor page faults per update between two :func:`usage` snapshots."""
    user, system, faults = (b - a for a, b in zip(before, after))
    return {"cpu_over_wall": (user + system) / wall, "sys_ms": 1e3 * system / n,
            "page_faults": faults / n}


def phase_ms(seconds: dict[str, float], wall: float, n: int) -> dict[str, float]:
    """Milliseconds per update of each phase; backward = forward_backward - forward."""
    s = defaultdict(float, seconds)
    step_rest = s["train_step"] - s["forward_backward"] - s["grad_norm"] - s["optimizer_step"]
    parts = [s["data"], s["forward"], s["forward_backward"] - s["forward"], s["grad_norm"],
             s["optimizer_step"], step_rest, wall - s["data"] - s["train_step"]]
    return {name: 1e3 * v / n for name, v in zip(PHASES, parts)}


# --- FLOPs ----------------------------------------------------------------------------------------
def split_forward_flops(cfg: ModelConfig, src: np.ndarray, tgt: np.ndarray,
                        vocab: int) -> tuple[float, float]:
    """Forward FLOPs as (projections + FFN + output layer, attention scores and values).

    Per sentence, forward_flops is a sum of terms linear in the lengths (every projection, the
    FFN, the output layer) and terms quadratic in them (q k^T and the weighted sum of values).
    Doubling every length doubles the first and quadruples the second, so two evaluations
    separate them without restating the formula.
    """
    import numpy as np

    from nmt.training.flops import forward_flops

    src, tgt = np.asarray(src, dtype=np.float64), np.asarray(tgt, dtype=np.float64)
    one = forward_flops(cfg, src, tgt, vocab)
    attention = (forward_flops(cfg, 2 * src, 2 * tgt, vocab) - 2 * one) / 2
    return one - attention, attention


def update_flops(run: Run, groups: list) -> dict[str, float]:
    """Training FLOPs (x3) of these updates: useful (real lengths) and executed (the padded
    batch shapes; the output layer and the loss run on real target tokens only)."""
    import numpy as np

    from nmt.data.buckets import PAD, collate

    cfg, vocab = run.model_cfg, len(run.data.tgt_codec.dictionary)
    out = defaultdict(float)
    for group in groups:
        total, ntok = bench_train.group_flops(run, group)
        out["useful_total"] += total
        out["tokens"] += ntok
        for idx in group:
            if idx is None:
                continue
            b = collate(run.train_ds, idx)
            s, t = b.src_tokens.ne(PAD).sum(1).numpy(), b.target.ne(PAD).sum(1).numpy()
            lin, att = split_forward_flops(cfg, s, t, vocab)
            out["useful_linear"] += 3 * lin
            out["useful_attention"] += 3 * att
            padded_s = np.full(len(s), b.src_tokens.shape[1])
            padded_t = np.full(len(t), b.target.shape[1])
            plin, patt = split_forward_flops(cfg, padded_s, padded_t, 0)
            output_layer = lin - split_forward_flops(cfg, s, t, 0)[0]
            out["executed_linear"] += 3 * (plin + output_layer)
            out["executed_attention"] += 3 * patt
    return dict(out)


# --- attributing the profile ----------------------------------------------------------------------
def own_category(name: str) -> str | None:
    for category, pattern in OWN:
        if re.search(pattern, name):
            return category
    return None


def generic_category(name: str) -> str:
    for category, pattern in GENERIC:
        if re.match(pattern, name):
            return category
    return OTHER


def is_op(name: str) -> bool:
    return name.startswith(("aten::", "mkldnn::", "quantized::"))


class Attribution:
    """Categories of the events of one profile (``prof.events()``, parents linked)."""

    def __init__(self, events: list[FunctionEvent]) -> None:
        self.events = list(events)
        self.memo: dict[int, str | None] = {}
        self.in_backward: dict[int, bool] = {}
        # The forward op that made each autograd node: the last one (in time) that recorded
        # the node's sequence number.
        self.forward_of: dict[int, Any] = {}
        for e in sorted(self.events, key=lambda e: e.time_range.start):
            if e.sequence_nr >= 0 and not self.backward(e):
                self.forward_of[e.sequence_nr] = e

    def backward(self, e: FunctionEvent) -> bool:
        """Inside the autograd engine's evaluation of a backward node."""
        key = id(e)
        if key not in self.in_backward:
            parent = e.cpu_parent
            self.in_backward[key] = (e.name.startswith("autograd::engine::evaluate_function")
                                     or (parent is not None and self.backward(parent)))
        return self.in_backward[key]

    def context(self, e: FunctionEvent) -> str | None:
        """The category ``e`` has or inherits (None: nothing specific)."""
        key = id(e)
        if key in self.memo:
            return self.memo[key]
        cat = own_category(e.name)
        if cat is None and not is_op(e.name) and e.sequence_nr >= 0 and self.backward(e):
            fwd = self.forward_of.get(e.sequence_nr)
            cat = self.context(fwd) if fwd is not None else None
            cat = GLUE if cat == MATMUL else cat    # a matmul's backward node: around its kernels
        if cat is None and e.cpu_parent is not None:
            cat = self.context(e.cpu_parent)
            cat = GLUE if cat == MATMUL else cat    # inside a kernel: allocations and the like
        self.memo[key] = cat
        return cat

    def category(self, e: FunctionEvent) -> str:
        """Where the self time of ``e`` goes."""
        cat = self.context(e)
        if is_op(e.name):
            return cat or generic_category(e.name)
        return cat if cat in (DATA, OPTIMIZER) else OUTSIDE

    def totals(self, model_dims: set[int]) -> dict[str, dict]:
        """Self seconds per category; [seconds, calls] per (op, category); [seconds, calls,
        FLOPs] of the matmul kernels per (op, shape), dimensions not in ``model_dims`` as n."""
        per_cat: dict[str, float] = defaultdict(float)
        per_op: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
        per_shape: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0, 0])
        for e in self.events:
            seconds = e.self_cpu_time_total / 1e6
            cat = self.category(e)
            per_cat[cat] += seconds
            if is_op(e.name):
                row = per_op[(e.name, cat)]
                row[0] += seconds
                row[1] += 1
            if cat == MATMUL and own_category(e.name) == MATMUL:
                row = per_shape[(e.name, matmul_shape(e.input_shapes, model_dims))]
                row[0] += seconds
                row[1] += 1
                row[2] += e.flops or 0
        return {"categories": dict(per_cat), "ops": dict(per_op), "shapes": dict(per_shape)}


def matmul_shape(shapes: list, model_dims: set[int]) -> str:
    """``n x 512 @ 512 x 2048`` for the two matrix operands of mm/addmm/bmm (the bias of
    addmm dropped); sizes that are not a model dimension (tokens, sentences) read n."""
    mats = [s for s in shapes if isinstance(s, (list, tuple)) and len(s) >= 2][-2:]
    return " @ ".join(" x ".join(str(d) if d in model_dims else "n" for d in m) for m in mats)


# --- the run --------------------------------------------------------------------------------------
def build_run(args: argparse.Namespace, save_dir: str) -> Run:
    """The training run of nmt-train on the data set (no validation or checkpoint is used)."""
    from nmt.training.loop import Run, TrainConfig

    if args.quick and not args.data_dir:
        data, data_dir = bench_train.quick_data(), "synthetic"
    else:
        from nmt.data.datadir import DataDir

        data, data_dir = DataDir.open(args.data_dir), args.data_dir
    updates = args.warm_updates + 2 * args.updates
    cfg = TrainConfig(arch=args.arch, max_tokens=args.max_tokens, max_update=updates,
                      warmup=10 if args.quick else 4000, save_dir=save_dir, resume=False,
                      device="cpu", log_interval=max(1, updates))
    return Run(cfg, data, data_dir)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up, the plain pass and the profiled pass over the same updates; raw numbers."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    peak = bench_train.matmul_rate(args.threads, n=256 if args.quick else 1024,
                                   seconds=0.2 if args.quick else 2.0)
    with tempfile.TemporaryDirectory() as tmp:
        run = build_run(args, tmp)
        phases = Phases()
        instrument(run, phases)
        groups = bench_train.update_groups(run)
        run_updates(run, [next(groups) for _ in range(args.warm_updates)], phases)
        timed = [next(groups) for _ in range(args.updates)]
        phases.take()
        before = usage()
        plain_wall = run_updates(run, timed, phases)
        plain_os = usage_per_update(before, usage(), plain_wall, args.updates)
        plain = phase_ms(phases.take(), plain_wall, args.updates)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                     with_flops=True) as prof:
            before = usage()
            prof_wall = run_updates(run, timed, phases)
            prof_os = usage_per_update(before, usage(), prof_wall, args.updates)
        profiled = phase_ms(phases.take(), prof_wall, args.updates)
        dims = {d for p in run.model.parameters() for d in p.shape}
        totals = Attribution(prof.events()).totals(dims)
        flops = update_flops(run, timed)
        params = sum(p.numel() for p in run.model.parameters())
    n = args.updates
    return {"peak": peak, "plain_wall": plain_wall, "prof_wall": prof_wall, "plain": plain,
            "profiled": profiled, "os": {"plain": plain_os, "profiled": prof_os},
            "flops": {k: v / n for k, v in flops.items()},
            "categories": {c: 1e3 * s / n for c, s in totals["categories"].items()},
            "ops": [(name, cat, 1e3 * s / n, calls / n)
                    for (name, cat), (s, calls) in totals["ops"].items()],
            "shapes": [(name, shape, 1e3 * s / n, calls / n, fl / n)
                       for (name, shape), (s, calls, fl) in totals["shapes"].items()],
            "params": params, "torch": torch.__version__}


def mfu_split(m: dict[str, Any]) -> dict[str, float]:
    """The plain update's wall time split by what its matmul kernels do (fractions of it).

    MFU = matmul share x kernel efficiency x useful/executed + attention credit, where the
    kernel time comes from the profile and the wall time from the plain pass.
    """
    f, peak = m["flops"], m["peak"]
    wall = sum(m["plain"].values()) / 1e3                      # seconds per plain update
    kernel = m["categories"].get(MATMUL, 0.0) / 1e3
    attn = m["categories"].get(ATTENTION, 0.0) / 1e3
    kernel_rate = f["executed_linear"] / kernel if kernel else 0.0
    eff = kernel_rate / peak
    useful_share = f["useful_linear"] / f["executed_linear"] if f["executed_linear"] else 0.0
    counted = sum(row[4] for row in m["shapes"])              # the profiler's own FLOP count
    return {
        "mfu": f["useful_total"] / wall / peak,
        "matmul_kernel_gflops": kernel_rate / 1e9,
        "matmul_kernel_gflops_useful": f["useful_linear"] / kernel / 1e9 if kernel else 0.0,
        "profiler_flops_over_analytic": counted / f["executed_linear"] if counted else 0.0,
        "matmul_peak_gflops": peak / 1e9,
        "kernel_efficiency": eff,
        "padding_useful_fraction": useful_share,
        "attention_kernel_gflops": f["executed_attention"] / attn / 1e9 if attn else 0.0,
        "share_matmul_at_peak_useful": kernel / wall * eff * useful_share,
        "share_matmul_padding": kernel / wall * eff * (1 - useful_share),
        "share_matmul_below_peak": kernel / wall * (1 - eff),
        "share_outside_matmul": 1 - kernel / wall,
        "attention_credit": f["useful_attention"] / wall / peak,
    }


def summarise(args: argparse.Namespace, m: dict[str, Any]) -> dict[str, Any]:
    """The JSON result: per-update milliseconds, shares and rates."""
    n = args.updates
    cats = {c: round(m["categories"].get(c, 0.0), 3) for c in ORDER}
    prof_ms = 1e3 * m["prof_wall"] / n
    ops = sorted(m["ops"], key=lambda r: -r[2])
    shapes = sorted(m["shapes"], key=lambda r: -r[2])
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": run_all.machine_line(run_all.machine_info(args.threads, "cpu")),
        "command": command_line(args), "torch": m["torch"], "arch": args.arch,
        "params": m["params"], "max_tokens": args.max_tokens, "threads": args.threads,
        "updates": n, "warm_updates": args.warm_updates,
        "plain_ms_per_update": round(1e3 * m["plain_wall"] / n, 3),
        "profiled_ms_per_update": round(prof_ms, 3),
        "tgt_tokens_per_update": m["flops"]["tokens"],
        "os_plain": {k: round(v, 3) for k, v in m["os"]["plain"].items()},
        "os_profiled": {k: round(v, 3) for k, v in m["os"]["profiled"].items()},
        "phases_plain_ms": {k: round(v, 3) for k, v in m["plain"].items()},
        "phases_profiled_ms": {k: round(v, 3) for k, v in m["profiled"].items()},
        "categories_ms": cats,
        "unattributed_ms": round(prof_ms - sum(m["categories"].values()), 3),
        "top_ops": [{"op": name, "category": cat, "ms": round(ms, 3), "calls": round(calls, 2)}
                    for name, cat, ms, calls in ops[:20]],
        "matmul_shapes": [{"op": name, "shape": shape, "ms": round(ms, 3),
                           "calls": round(calls, 2),
                           "gflops": round(fl / ms / 1e6, 2) if ms else 0.0}
                          for name, shape, ms, calls, fl in shapes[:12]],
        "flops_per_update": {k: v for k, v in m["flops"].items() if k != "tokens"},
        "mfu_split": {k: round(v, 4) for k, v in mfu_split(m).items()},
    }


def command_line(args: argparse.Namespace) -> str:
    """The command as run, the data directory relative to the working directory."""
    data = args.data_dir
    argv = [os.path.relpath(a) if data and a == data else a for a in args.argv]
    return "python benchmarks/profile_train.py " + shlex.join(argv)


# --- output ---------------------------------------------------------------------------------------
def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def phase_table(r: dict[str, Any]) -> list[str]:
    plain, prof = r["phases_plain_ms"], r["phases_profiled_ms"]
    wp, wq = r["plain_ms_per_update"], r["profiled_ms_per_update"]
    lines = ["| phase | ms/update (plain) | % | ms/update (profiled) | % |",
             "|---|---:|---:|---:|---:|"]
    for k in PHASES:
        lines.append(f"| {k} | {plain[k]:.1f} | {pct(plain[k], wp)} | {prof[k]:.1f} | "
                     f"{pct(prof[k], wq)} |")
    lines.append(f"| **update** | **{wp:.1f}** | 100% | **{wq:.1f}** | 100% |")
    return lines


def category_table(r: dict[str, Any]) -> list[str]:
    wall = r["profiled_ms_per_update"]
    lines = ["| category (profiled pass) | ms/update | % of update |", "|---|---:|---:|"]
    for cat, ms in sorted(r["categories_ms"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| {cat} | {ms:.1f} | {pct(ms, wall)} |")
    gap = r["unattributed_ms"]
    lines.append(f"| not in any profiled event (loop) | {gap:.1f} | {pct(gap, wall)} |")
    lines.append(f"| **update (profiled wall)** | **{wall:.1f}** | 100% |")
    return lines


def mfu_lines(r: dict[str, Any]) -> list[str]:
    s = r["mfu_split"]
    return [
        f"Matmul kernels run at **{s['matmul_kernel_gflops']:.1f} GFLOP/s** on the FLOPs they "
        f"compute (analytic count on the padded shapes; the profiler counts "
        f"{s['profiler_flops_over_analytic']:.3f}x that) against {s['matmul_peak_gflops']:.1f} "
        f"GFLOP/s measured for 1024x1024 in the same run: {s['kernel_efficiency']:.1%} of the "
        f"rate; {s['matmul_kernel_gflops_useful']:.1f} GFLOP/s counting real tokens only "
        f"({s['padding_useful_fraction']:.1%} of their FLOPs). Attention kernels (fused, "
        f"forward + backward): {s['attention_kernel_gflops']:.1f} GFLOP/s.",
        "",
        "| plain update's wall time | share |", "|---|---:|",
        f"| matmul kernels, useful FLOPs at the measured rate | "
        f"{s['share_matmul_at_peak_useful']:.1%} |",
        f"| matmul kernels below the measured rate (shapes) | {s['share_matmul_below_peak']:.1%} |",
        f"| matmul kernels on padding | {s['share_matmul_padding']:.1%} |",
        f"| outside matmul kernels | {s['share_outside_matmul']:.1%} |",
        f"| **MFU** (= first row + attention FLOPs credited, {s['attention_credit']:.1%}) | "
        f"**{s['mfu']:.1%}** |",
    ]


def shape_table(r: dict[str, Any]) -> list[str]:
    peak = r["mfu_split"]["matmul_peak_gflops"]
    lines = ["| matmul kernel (n: tokens or sentences) | calls/update | ms/update | GFLOP/s | "
             "% of measured rate |", "|---|---:|---:|---:|---:|"]
    for o in r["matmul_shapes"]:
        lines.append(f"| `{o['op']}` {o['shape']} | {o['calls']:g} | {o['ms']:.1f} | "
                     f"{o['gflops']:.1f} | {pct(o['gflops'], peak)} |")
    return lines


def top_table(r: dict[str, Any]) -> list[str]:
    wall = r["profiled_ms_per_update"]
    lines = ["| op (top 20 by self time) | category | calls/update | ms/update | % |",
             "|---|---|---:|---:|---:|"]
    for o in r["top_ops"]:
        lines.append(f"| `{o['op']}` | {o['category']} | {o['calls']:g} | {o['ms']:.1f} | "
                     f"{pct(o['ms'], wall)} |")
    return lines


def render(r: dict[str, Any]) -> str:
    overhead = r["profiled_ms_per_update"] - r["plain_ms_per_update"]
    head = (f"{r['machine']} Command: `{r['command']}`\n\n"
            f"{r['arch']} ({r['params'] / 1e6:.1f}M parameters), max tokens {r['max_tokens']}, "
            f"{r['tgt_tokens_per_update']:.0f} target tokens/update: {r['updates']} updates "
            f"after {r['warm_updates']} warm-up ones, timed plainly "
            f"({r['plain_ms_per_update']:.1f} ms/update) and again under torch.profiler "
            f"({r['profiled_ms_per_update']:.1f} ms/update, "
            f"+{pct(overhead, r['plain_ms_per_update'])} profiler overhead). Plain pass: "
            f"CPU time / wall {r['os_plain']['cpu_over_wall']:.2f} with {r['threads']} "
            f"thread(s) (lower: the process waited for a core), "
            f"{r['os_plain']['sys_ms']:.1f} ms system time and "
            f"{r['os_plain']['page_faults']:.0f} minor page faults per update.")
    parts = [head, "\n".join(phase_table(r)), "\n".join(category_table(r)),
             "\n".join(mfu_lines(r)), "\n".join(shape_table(r)), "\n".join(top_table(r)),
             "Self CPU time of each profiled event, by its own op name, the op it runs in or "
             "(backward) the forward op of its autograd node; `outside aten ops` is Python and "
             "the autograd engine. FLOPs: nmt/training/flops.py, x3 for forward + backward."]
    return "\n\n".join(parts) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data_dir", nargs="?", help="a directory made by nmt-preprocess")
    ap.add_argument("--arch", default="transformer_small")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warm-updates", type=int, default=3, help="untimed updates first")
    ap.add_argument("--updates", type=int, default=10,
                    help="updates timed plainly, then profiled (the same batches)")
    ap.add_argument("--json", metavar="FILE", help="write the raw numbers here")
    ap.add_argument("--write", metavar="FILE",
                    help=f"(re)write the bench:{SECTION} section of this markdown file")
    ap.add_argument("--quick", action="store_true",
                    help="tiny synthetic data and model (for tests)")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if not args.quick and not args.data_dir:
        ap.error("DATA_DIR is required unless --quick")
    if args.warm_updates < 0 or args.updates < 1:
        ap.error("--warm-updates must be >= 0 and --updates >= 1")
    if args.quick:
        args.arch, args.max_tokens = "transformer_tiny", 300
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    from nmt.cli.console import setup_logging
    from nmt.perf import keep_freed_memory

    keep_freed_memory()                          # as nmt-train does
    torch.set_num_threads(args.threads)
    setup_logging(quiet=True)
    result = summarise(args, measure(args))
    text = render(result)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.write:
        run_all.write_sections(Path(args.write), {SECTION: text})
    return 0


if __name__ == "__main__":
    sys.exit(main())
