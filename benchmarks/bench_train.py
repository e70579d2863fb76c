#!/usr/bin/env python3
"""Training throughput of nmt-train: target tokens/s, updates/s, MFU and peak RSS.

    python benchmarks/bench_train.py DATA_DIR                      # M30K-small: 1000 updates
    python benchmarks/bench_train.py DATA_DIR --updates 20         # a short profile run
    python benchmarks/bench_train.py --quick                       # tiny synthetic run (tests)
    python benchmarks/bench_train.py DATA_DIR --write BENCHMARKS.md
    python benchmarks/bench_train.py DATA_DIR --warm-updates 5 --updates 30 --json r.json
    python benchmarks/bench_train.py DATA_DIR --device cuda --precision bf16 --warm-updates 20
    python benchmarks/bench_train.py DATA_DIR --warm-updates 0 --updates 40 --save-interval-updates 10 \
        --average-last 2 --valid-bleu        # the whole run: saves, validations, its end

With --warm-updates K the script times only --updates updates that follow K untimed ones, calling
the trainer directly (no validation, no checkpoint inside the timed window): the steady-state
speed, without start-up, allocator warm-up or the final save.

DATA_DIR comes from nmt-preprocess (the reference: Multi30k en->de, one joined sentencepiece
BPE vocabulary of 8000). The run is the library's real training loop (the same code as
nmt-train, validation and checkpointing included), timed over the whole run.

MFU = achieved FLOP/s / the matmul rate this script measures on the same machine with the
same threads (fp32 1024x1024 on a CPU; on a GPU, 8192x8192 in the training precision, e.g. bf16,
timed with CUDA events). Achieved FLOP/s counts the Transformer's matmuls on the real (unpadded)
lengths of the batches trained on (nmt.training.flops), times 3 for forward + backward.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import tempfile
import time


def matmul_rate(threads: int, n: int = 1024, seconds: float = 2.0, device: str = "cpu",
                precision: str = "fp32") -> float:
    """Best FLOP/s of square n x n matmuls over a few repeats (the machine's practical limit);
    on a CUDA device, :func:`cuda_matmul_rate`."""
    import torch

    torch.set_num_threads(threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    if torch.device(device).type == "cuda":
        return cuda_matmul_rate(n, seconds, torch.device(device), dtype)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = 0.0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        for _ in range(5):
            a @ b
        dt = time.perf_counter() - t
        best = max(best, 5 * 2 * n ** 3 / dt)
    return best


def cuda_matmul_rate(n: int, seconds: float, device, dtype) -> float:
    """Best FLOP/s of n x n torch.matmul on a CUDA device, each repeat timed with CUDA events.

    The operands and the output are allocated once (no allocator work in the timed loop) and
    freed afterwards, so that they do not count in the training's peak GPU memory.
    """
    import torch

    reps = 10
    with torch.cuda.device(device):           # the events and matmuls on this device's stream
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        for _ in range(3):                    # cuBLAS handle, kernel selection, clocks up
            torch.matmul(a, b, out=out)
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        best = 0.0
        end = time.perf_counter() + seconds
        while True:
            start.record()
            for _ in range(reps):
                torch.matmul(a, b, out=out)
            stop.record()
            stop.synchronize()
            ms = start.elapsed_time(stop)
            if ms > 0:
                best = max(best, reps * 2 * n ** 3 / (ms / 1e3))
            if time.perf_counter() >= end:
                break
        del a, b, out
        torch.cuda.empty_cache()
    return best


def update_groups(run):
    """The run's updates in training order: lists of sentence-index arrays (None: padding)."""
    epoch, uf = 1, run.cfg.update_freq
    while True:
        shard = run.sampler.shard_batches(epoch)
        for start in range(0, len(shard), uf):
            yield shard[start:start + uf]
        epoch += 1


def timed_updates(run, warm: int, timed: int) -> tuple[float, float, int]:
    """(seconds, FLOPs, target tokens) of ``timed`` updates after ``warm`` untimed ones.

    Calls the trainer as the training loop does (collate included in the time), without
    validation or checkpoints.
    """
    import torch

    from nmt.data.buckets import collate

    cuda = run.device.type == "cuda"
    flops, ntok, t0 = 0.0, 0, time.perf_counter()
    for i, group in enumerate(update_groups(run)):
        if i == warm + timed:
            break
        if i == warm:
            if cuda:
                torch.cuda.synchronize(run.device)
            t0 = time.perf_counter()
        if i >= warm:
            f, n = group_flops(run, group)
            flops += f
            ntok += n
        batches = [None if b is None else collate(run.train_ds, b) for b in group]
        stats = run.trainer.train_step(batches)
        if i == warm + timed - 1:
            float(stats.loss)                   # wait for the device before stopping the clock
    if cuda:
        torch.cuda.synchronize(run.device)
    return time.perf_counter() - t0, flops, ntok


def group_flops(run, group) -> tuple[float, int]:
    """Training FLOPs and target tokens of one update's micro-batches (lists of sentence ids;
    None = a rank with nothing left), counted on the real lengths plus eos."""
    import numpy as np

    from nmt.training.flops import train_flops

    idx = [b for b in group if b is not None]
    if not idx:
        return 0.0, 0
    cat = np.concatenate(idx)
    s = run.train_ds.src_sizes[cat] + 1
    t = run.train_ds.tgt_sizes[cat] + 1
    return train_flops(run.model_cfg, s, t, len(run.data.tgt_codec.dictionary)), int(t.sum())


def trained_flops(run, updates: int) -> tuple[float, int]:
    """FLOPs and target tokens of the first ``updates`` updates (deterministic batches)."""
    total, ntok, done, epoch = 0.0, 0, 0, 1
    uf = run.cfg.update_freq
    while done < updates:
        shard = run.sampler.shard_batches(epoch)
        for start in range(0, len(shard), uf):
            f, n = group_flops(run, shard[start:start + uf])
            total += f
            ntok += n
            done += 1
            if done >= updates:
                break
        epoch += 1
    return total, ntok


def weights_digest(model) -> str:
    """SHA-256 of the model's parameters and buffers, bytes in state-dict order: two runs that
    trained bit for bit alike have the same digest."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def quick_data():
    """A small synthetic data set with the DataDir interface (no files, no downloads)."""
    import numpy as np

    from nmt.data.codec import whitespace_codec
    from nmt.data.dictionary import Dictionary

    class Split:
        def __init__(self, src, tgt):
            self._s, self._t = src, tgt
            self.src_sizes = np.array([len(x) for x in src])
            self.tgt_sizes = np.array([len(x) for x in tgt])

        def __len__(self):
            return len(self._s)

        def src(self, i):
            return self._s[i]

        def tgt(self, i):
            return self._t[i]

    class Data:
        src_lang, tgt_lang, joined = "xx", "yy", True
        splits = ["train", "valid"]

        def __init__(self):
            d = Dictionary([f"w{i}" for i in range(60)])
            self.src_codec = self.tgt_codec = whitespace_codec(d)
            rng = np.random.default_rng(0)
            src = [rng.integers(4, len(d), size=int(rng.integers(3, 20))) for _ in range(300)]
            self._split = Split(src, [x[::-1].copy() for x in src])

        def load_split(self, name):
            return self._split

    return Data()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data_dir", nargs="?")
    ap.add_argument("--arch", default="transformer_small")
    ap.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                    help="as nmt-train -o: change a hyperparameter of --arch (repeatable)")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--updates", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=4000, help="learning-rate warm-up updates")
    ap.add_argument("--warm-updates", type=int, default=0,
                    help="untimed updates before timing --updates of them (0: time the whole run)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                    help="training precision (bf16/fp16 need CUDA); also the matmul rate's")
    ap.add_argument("--dropout-masks", default="torch", choices=["torch", "fast"],
                    help="as nmt-train --dropout-masks")
    ap.add_argument("--loss-chunk", type=int, default=0, help="as nmt-train --loss-chunk")
    ap.add_argument("--save-interval-updates", type=int, default=0,
                    help="as nmt-train (with --warm-updates 0: checkpoints, validations)")
    ap.add_argument("--average-last", type=int, default=0, help="as nmt-train (the end of a run)")
    ap.add_argument("--valid-bleu", action="store_true", help="as nmt-train")
    ap.add_argument("--json", metavar="FILE", help="also write the result here")
    ap.add_argument("--save-dir", default=None, help="keep checkpoints here (default: temp)")
    ap.add_argument("--quick", action="store_true", help="tiny synthetic run, for tests")
    ap.add_argument("--write", metavar="FILE", help="append a markdown row to FILE")
    args = ap.parse_args()
    from nmt.perf import keep_freed_memory
    keep_freed_memory()  # as nmt-train / nmt-generate do
    if not args.quick and not args.data_dir:
        ap.error("DATA_DIR is required unless --quick")
    if args.warm_updates < 0 or args.updates < 1:
        ap.error("--warm-updates must be >= 0 and --updates >= 1")

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from nmt.cli.console import setup_logging
    from nmt.training.loop import Run, TrainConfig

    setup_logging(quiet=True)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is available")
    if args.quick and not args.data_dir:
        data, data_dir = quick_data(), "synthetic"
        args.arch, args.max_tokens, args.updates, args.warmup = "transformer_tiny", 300, 8, 10
    else:
        from nmt.data.datadir import DataDir
        data, data_dir = DataDir.open(args.data_dir), args.data_dir

    cuda = args.device.startswith("cuda")
    matmul_n = 256 if args.quick else 8192 if cuda else 1024
    peak = matmul_rate(args.threads, n=matmul_n, seconds=0.2 if args.quick else 2.0,
                       device=args.device, precision=args.precision)
    if cuda:                                    # the training's own peak, not the matmul's
        torch.cuda.reset_peak_memory_stats(torch.device(args.device))
    with tempfile.TemporaryDirectory() as tmp:
        total = args.warm_updates + args.updates
        # Options only when given: bench_versions.py runs versions that lack them.
        given = {k: v for k, v in (
            ("dropout_masks", None if args.dropout_masks == "torch" else args.dropout_masks),
            ("loss_chunk", args.loss_chunk),
            ("save_interval_updates", args.save_interval_updates),
            ("average_last", args.average_last), ("valid_bleu", args.valid_bleu)) if v}
        from nmt.config import parse_overrides
        cfg = TrainConfig(arch=args.arch, overrides=parse_overrides(args.override),
                          max_tokens=args.max_tokens, max_update=total,
                          warmup=args.warmup, save_dir=args.save_dir or tmp, resume=False,
                          device=args.device, precision=args.precision,
                          log_interval=max(1, total // 10), **given)
        run = Run(cfg, data, data_dir)
        if args.warm_updates:
            seconds, flops, ntok = timed_updates(run, args.warm_updates, args.updates)
            timed = args.updates
            if args.save_dir:                   # e.g. a checkpoint for the generation benchmark
                run.save(None)
        else:
            t0 = time.perf_counter()
            run.run()
            seconds = time.perf_counter() - t0
            timed = run.trainer.num_updates
            flops, ntok = trained_flops(run, timed)
    achieved = flops / seconds
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
        "torch": torch.__version__, "arch": args.arch, "overrides": args.override,
        "max_tokens": args.max_tokens,
        "params": sum(p.numel() for p in run.model.parameters()),
        "updates": timed, "warm_updates": args.warm_updates, "threads": args.threads,
        "device": args.device, "precision": args.precision, "dropout_masks": args.dropout_masks,
        "loss_chunk": args.loss_chunk,
        "gpu": torch.cuda.get_device_name(run.device) if cuda else None,
        "seconds": round(seconds, 2),
        "tgt_tokens_per_s": round(ntok / seconds, 1),
        "updates_per_s": round(timed / seconds, 4),
        "achieved_gflops": round(achieved / 1e9, 2),
        "matmul_peak_gflops": round(peak / 1e9, 2),
        "mfu": round(achieved / peak, 4),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 3),
        "gpu_max_gb": (round(torch.cuda.max_memory_allocated(run.device) / 2 ** 30, 3)
                       if cuda else None),
        "weights_sha256": weights_digest(run.model),
    }
    if cuda:
        result["matmul_n"] = matmul_n
        result["cuda"] = torch.version.cuda
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(json.dumps(result, indent=2) + "\n")
    if args.write:
        line = (f"| {result['date']} | {args.arch} | {args.max_tokens} | {result['updates']} | "
                f"{args.threads} | {result['seconds']} | {result['tgt_tokens_per_s']} | "
                f"{result['updates_per_s']} | {result['mfu']:.1%} | {result['peak_rss_gb']} |\n")
        with open(args.write, "a", encoding="utf-8") as f:
            f.write(line)


if __name__ == "__main__":
    sys.exit(main())
