#!/usr/bin/env python3
"""Training throughput of nmt-train: target tokens/s, updates/s, MFU and peak RSS.

    python benchmarks/bench_train.py DATA_DIR                      # M30K-small: 1000 updates
    python benchmarks/bench_train.py DATA_DIR --updates 20         # a short profile run
    python benchmarks/bench_train.py --quick                       # tiny synthetic run (tests)
    python benchmarks/bench_train.py DATA_DIR --write BENCHMARKS.md

DATA_DIR comes from nmt-preprocess (the reference: Multi30k en->de, one joined sentencepiece
BPE vocabulary of 8000). The run is the library's real training loop (the same code as
nmt-train, validation and checkpointing included), timed over the whole run.

MFU = achieved FLOP/s / the fp32 matmul rate this script measures on the same machine with the
same threads. Achieved FLOP/s counts the Transformer's matmuls on the real (unpadded) lengths
of the batches trained on (nmt.training.flops), times 3 for forward + backward.
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


def matmul_rate(threads: int, n: int = 1024, seconds: float = 2.0) -> float:
    """Best fp32 FLOP/s of square n x n matmuls over a few repeats."""
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(n, n)
    b = torch.randn(n, n)
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


def trained_flops(run, updates: int) -> tuple[float, int]:
    """FLOPs and target tokens of the first ``updates`` updates (deterministic batches)."""
    import numpy as np

    from nmt.training.flops import train_flops

    total, ntok, done, epoch = 0.0, 0, 0, 1
    uf = run.cfg.update_freq
    while done < updates:
        shard = run.sampler.shard_batches(epoch)
        for start in range(0, len(shard), uf):
            idx = [b for b in shard[start:start + uf] if b is not None]
            if idx:
                cat = np.concatenate(idx)
                s = run.train_ds.src_sizes[cat] + 1
                t = run.train_ds.tgt_sizes[cat] + 1
                total += train_flops(run.model_cfg, s, t, run.tgt_vocab)
                ntok += int(t.sum())
            done += 1
            if done >= updates:
                break
        epoch += 1
    return total, ntok


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
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--updates", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=4000)
    ap.add_argument("--save-dir", default=None, help="keep checkpoints here (default: temp)")
    ap.add_argument("--quick", action="store_true", help="tiny synthetic run, for tests")
    ap.add_argument("--write", metavar="FILE", help="append a markdown row to FILE")
    args = ap.parse_args()
    if not args.quick and not args.data_dir:
        ap.error("DATA_DIR is required unless --quick")

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from nmt.cli.common import setup_logging
    from nmt.training.loop import Run, TrainConfig

    setup_logging(quiet=True)
    if args.quick:
        data, data_dir = quick_data(), "synthetic"
        args.arch, args.max_tokens, args.updates, args.warmup = "transformer_tiny", 300, 8, 10
    else:
        from nmt.data.datadir import DataDir
        data, data_dir = DataDir.open(args.data_dir), args.data_dir

    peak = matmul_rate(args.threads, n=256 if args.quick else 1024,
                       seconds=0.2 if args.quick else 2.0)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = TrainConfig(arch=args.arch, max_tokens=args.max_tokens, max_update=args.updates,
                          warmup=args.warmup, save_dir=args.save_dir or tmp, resume=False,
                          device="cpu", log_interval=max(1, args.updates // 10))
        run = Run(cfg, data, data_dir)
        t0 = time.perf_counter()
        run.run()
        seconds = time.perf_counter() - t0
        flops, ntok = trained_flops(run, run.trainer.num_updates)
    achieved = flops / seconds
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
        "torch": torch.__version__, "arch": args.arch, "max_tokens": args.max_tokens,
        "updates": run.trainer.num_updates, "threads": args.threads,
        "seconds": round(seconds, 2),
        "tgt_tokens_per_s": round(ntok / seconds, 1),
        "updates_per_s": round(run.trainer.num_updates / seconds, 4),
        "achieved_gflops": round(achieved / 1e9, 2),
        "matmul_peak_gflops": round(peak / 1e9, 2),
        "mfu": round(achieved / peak, 4),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 3),
    }
    print(json.dumps(result))
    if args.write:
        line = (f"| {result['date']} | {args.arch} | {args.max_tokens} | {result['updates']} | "
                f"{args.threads} | {result['seconds']} | {result['tgt_tokens_per_s']} | "
                f"{result['updates_per_s']} | {result['mfu']:.1%} | {result['peak_rss_gb']} |\n")
        with open(args.write, "a", encoding="utf-8") as f:
            f.write(line)


if __name__ == "__main__":
    sys.exit(main())
