#!/usr/bin/env python3
"""Throughput (lines/s) and peak memory (RSS) of nmt-preprocess as the corpus grows.

The training data DATA/train.{src,tgt} is replicated 1x, 10x and 50x into a temporary directory
(Multi30k: 29k, 290k, 1.45M pairs), then the real console command runs on each while a sampler
adds up the RSS of its whole process tree (main process and encoding workers) every 20 ms.

    python benchmarks/bench_preprocess.py MULTI30K            # 1x, 10x, 50x
    python benchmarks/bench_preprocess.py DATA --quick                        # 1x of 2000 lines
    python benchmarks/bench_preprocess.py DATA --write BENCHMARKS.md          # append the table

Memory should stay flat: binarization streams in bounded chunks, and the subword learner sees at
most --subword-sample pairs. The default sample (20,000 pairs) is below the 1x size so that every
scale learns on the same amount of text and the table isolates the streaming part; the learner's
own memory is bounded by the sample size, not by the corpus.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil


def replicate(src: Path, dst: Path, times: int, limit: int | None) -> int:
    """Write ``times`` copies of the first ``limit`` lines of src to dst; returns the lines."""
    with open(src, "rb") as f:
        lines = f.readlines()[:limit] if limit else f.readlines()
    block = b"".join(x if x.endswith(b"\n") else x + b"\n" for x in lines)
    with open(dst, "wb") as f:
        for _ in range(times):
            f.write(block)
    return len(lines) * times


class TreeRss:
    """Samples the summed RSS of a process and all its descendants; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.02):
        self.proc = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            try:
                procs = [self.proc] + self.proc.children(recursive=True)
            except psutil.Error:
                break
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self) -> "TreeRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_once(work: Path, src: str, tgt: str, pairs: int, args) -> dict:
    dest = work / "bin"
    cmd = [sys.executable, "-m", "nmt.cli.preprocess", "-s", src, "-t", tgt,
           "--trainpref", str(work / "train"), "--destdir", str(dest), "--overwrite",
           "--vocab-size", str(args.vocab_size), "--subword", args.subword,
           "--subword-sample", str(args.subword_sample), "-q"]
    if args.joined:
        cmd.append("--joined-dictionary")
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    t0 = time.perf_counter()
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with TreeRss(proc.pid) as rss:
        out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"nmt-preprocess failed ({proc.returncode}): {err.decode()[-2000:]}")
    meta = json.loads((dest / "meta.json").read_text())
    assert meta["splits"]["train"]["input_lines"] == pairs
    return {"pairs": pairs, "wall": wall, "lines_per_s": pairs / wall,
            "peak_rss_mb": rss.peak / 2**20, "cmd": cmd}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path, help="directory with train.SRC and train.TGT")
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--scales", default="1,10,50", help="replication factors")
    ap.add_argument("--quick", action="store_true", help="1x of the first 2000 lines only")
    ap.add_argument("--subword", default="bpe", choices=["bpe", "wordpiece", "none"])
    ap.add_argument("--vocab-size", type=int, default=10000)
    ap.add_argument("--joined", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--subword-sample", type=int, default=20000)
    ap.add_argument("--workers", type=int, default=0, help="0: one per CPU")
    ap.add_argument("--write", type=Path, help="append the results as a section of this file")
    ap.add_argument("--json", type=Path, help="also write the results here (machine-readable)")
    args = ap.parse_args()

    scales = [1] if args.quick else [int(x) for x in args.scales.split(",")]
    limit = 2000 if args.quick else None
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-preprocess-"))
    try:
        for k in scales:
            pairs = 0
            for lang in (args.src, args.tgt):
                pairs = replicate(args.data / f"train.{lang}", tmp / f"train.{lang}", k, limit)
            r = run_once(tmp, args.src, args.tgt, pairs, args)
            r["scale"] = k
            rows.append(r)
            print(f"{k}x: {pairs} pairs in {r['wall']:.1f}s, {r['lines_per_s']:.0f} lines/s, "
                  f"peak RSS {r['peak_rss_mb']:.0f} MiB", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    table = ["| corpus | pairs | wall (s) | pairs/s | peak RSS, process tree (MiB) |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {args.data.name} train x{r['scale']} | {r['pairs']:,} | {r['wall']:.1f} "
                     f"| {r['lines_per_s']:,.0f} | {r['peak_rss_mb']:.0f} |")
    text = "\n".join(table)
    print(text)
    if args.json:
        keep = ("scale", "pairs", "wall", "lines_per_s", "peak_rss_mb")
        args.json.write_text(json.dumps({"corpus": args.data.name, "rows": [
            {k: r[k] for k in keep} for r in rows]}, indent=2) + "\n", encoding="utf-8")
    if args.write:
        cmd = " ".join(["python", "benchmarks/bench_preprocess.py", *sys.argv[1:]])
        one = " ".join(Path(c).name if i == 1 else c for i, c in enumerate(rows[0]["cmd"]))
        section = (f"\n## nmt-preprocess throughput and memory\n\n"
                   f"Measured {datetime.date.today()} on {platform.machine()} with "
                   f"{os.cpu_count()} CPUs, Python {platform.python_version()}.\n\n"
                   f"Command: `{cmd}`\n\nEach run: `{one}` (pairs/s counts the whole command: "
                   f"start-up, sampling, subword learning, binarization).\n\n{text}\n")
        with open(args.write, "a", encoding="utf-8") as f:
            f.write(section)


if __name__ == "__main__":
    main()
