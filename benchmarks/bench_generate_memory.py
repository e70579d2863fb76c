#!/usr/bin/env python3
"""Peak memory (RSS) of `nmt-generate -i FILE` as the input grows: flat, since the file is
read a chunk (--buffer-size lines) at a time.

The input's first --lines lines (default: all) are replicated 1x, 10x and 100x into a temporary
file, then the real console command translates each into --output while a sampler adds up the
RSS of its process tree every 20 ms. Greedy (--beam 1) by default, to keep it quick.

    python benchmarks/bench_generate_memory.py CKPT --input MULTI30K/test_2016_flickr.en
    python benchmarks/bench_generate_memory.py CKPT --input FILE --quick      # 1x, 2x of 100 lines
    python benchmarks/bench_generate_memory.py CKPT --input FILE --json r.json --write B.md

Prints a markdown table; --json writes the figures, --write appends a section to a file.
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
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_preprocess import TreeRss, replicate  # noqa: E402


def run_once(ckpt: Path, src: Path, out: Path, lines: int, args) -> dict:
    cmd = [sys.executable, "-m", "nmt.cli.generate", str(ckpt), "-i", str(src), "-o", str(out),
           "--beam", str(args.beam), "--threads", str(args.threads), "-q"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    t0 = time.perf_counter()
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    with TreeRss(proc.pid) as rss:
        _, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"nmt-generate failed ({proc.returncode}): {err.decode()[-2000:]}")
    with open(out, "rb") as f:
        got = sum(1 for _ in f)
    if got != lines:
        raise SystemExit(f"nmt-generate wrote {got} lines for {lines} input lines")
    return {"lines": lines, "input_mb": src.stat().st_size / 2**20, "wall": wall,
            "lines_per_s": lines / wall, "peak_rss_mb": rss.peak / 2**20, "cmd": cmd}


def table(rows: list[dict], name: str) -> str:
    text = ["| input | lines | input (MiB) | wall (s) | lines/s | peak RSS (MiB) |",
            "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        text.append(f"| {name} x{r['scale']} | {r['lines']:,} | {r['input_mb']:.1f} | "
                    f"{r['wall']:.1f} | {r['lines_per_s']:,.0f} | {r['peak_rss_mb']:.0f} |")
    return "\n".join(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--input", type=Path, required=True, help="raw source sentences")
    ap.add_argument("--lines", type=int, default=None, help="1x: the first N lines [all]")
    ap.add_argument("--scales", default="1,10,100", help="replication factors")
    ap.add_argument("--quick", action="store_true", help="1x and 2x of the first 100 lines")
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--write", type=Path, help="append the results as a section of this file")
    args = ap.parse_args()

    scales = [1, 2] if args.quick else [int(x) for x in args.scales.split(",")]
    limit = 100 if args.quick else args.lines
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-generate-memory-"))
    try:
        for k in scales:
            lines = replicate(args.input, tmp / "input", k, limit)
            r = run_once(args.checkpoint, tmp / "input", tmp / "output", lines, args)
            r["scale"] = k
            rows.append(r)
            print(f"{k}x: {lines} lines in {r['wall']:.1f}s, peak RSS "
                  f"{r['peak_rss_mb']:.0f} MiB", file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = table(rows, args.input.name)
    print(text)
    if args.json:
        keep = ("scale", "lines", "input_mb", "wall", "lines_per_s", "peak_rss_mb")
        args.json.write_text(json.dumps({"input": args.input.name, "beam": args.beam,
                                         "threads": args.threads,
                                         "rows": [{k: r[k] for k in keep} for r in rows]},
                                        indent=2) + "\n", encoding="utf-8")
    if args.write:
        cmd = " ".join(["python", "benchmarks/bench_generate_memory.py", *sys.argv[1:]])
        with open(args.write, "a", encoding="utf-8") as f:
            f.write(f"\n## nmt-generate memory as the input grows\n\nMeasured "
                    f"{datetime.date.today()} on {platform.machine()} with {os.cpu_count()} "
                    f"CPUs, Python {platform.python_version()}.\n\nCommand: `{cmd}`\n\n"
                    f"{text}\n")


if __name__ == "__main__":
    main()
