#!/usr/bin/env python3
"""A large nmt-generate run killed with SIGKILL and resumed: wall time, peak RSS of each part,
and whether the finished file is byte-identical to an uninterrupted run.

The input is the first --lines lines of --input replicated --times times (default: Multi30k's
1,000-line test set x 1000 = 1M lines). The real console command translates it into --output;
when the journal (OUT.nmt-progress.json) says --kill-at of the lines are done, the process
gets SIGKILL; the same command is run again and resumes. The uninterrupted output needs no
second run: nmt translates each line the same whatever its batch or chunk (tests/
test_translator.py), so the uninterrupted file is the 1x translation repeated --times times;
that 1x translation is made by the same command on the 1x file.

    python benchmarks/bench_generate_resume.py CKPT --input MULTI30K/test_2016_flickr.en
    python benchmarks/bench_generate_resume.py CKPT --input FILE --quick     # 100 lines x 30

Prints a markdown table; --json writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_preprocess import TreeRss, replicate  # noqa: E402


def command(ckpt: Path, src: Path, out: Path, args) -> list[str]:
    return [sys.executable, "-m", "nmt.cli.generate", str(ckpt), "-i", str(src), "-o", str(out),
            "--beam", str(args.beam), "--threads", str(args.threads),
            "--buffer-size", str(args.buffer_size)]


def run(cmd: list[str], threads: int, kill_when=None) -> dict:
    """Run ``cmd``; with ``kill_when`` (a function returning True when it is time), SIGKILL
    the process then. Returns wall time, peak RSS, return code and stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    proc = psutil.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    with TreeRss(proc.pid) as rss:
        if kill_when is not None:
            while proc.poll() is None and not kill_when():
                time.sleep(0.2)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
    return {"wall": time.perf_counter() - t0, "peak_rss_mb": rss.peak / 2**20,
            "returncode": proc.returncode, "stderr": err.decode(errors="replace")}


def lines_done(journal: Path) -> int:
    try:
        return json.loads(journal.read_text(encoding="utf-8"))["input_lines"]
    except (OSError, ValueError, KeyError):
        return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("--input", type=Path, required=True, help="raw source sentences")
    ap.add_argument("--lines", type=int, default=None, help="the first N lines [all]")
    ap.add_argument("--times", type=int, default=1000, help="replications [1000]")
    ap.add_argument("--kill-at", type=float, default=0.4,
                    help="SIGKILL when this share of the lines is done [0.4]")
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--buffer-size", type=int, default=10000)
    ap.add_argument("--quick", action="store_true", help="100 lines x 30, --buffer-size 500")
    ap.add_argument("--work-dir", type=Path, help="keep the files here [a temporary dir]")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    if args.quick:
        args.lines, args.times, args.buffer_size = 100, 30, 500

    tmp = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-generate-resume-"))
    tmp.mkdir(parents=True, exist_ok=True)
    one, big = tmp / "one.txt", tmp / "big.txt"
    n_one = replicate(args.input, one, 1, args.lines)
    total = replicate(args.input, big, args.times, args.lines)
    ref_out, out = tmp / "one.out", tmp / "big.out"
    r = run(command(args.checkpoint, one, ref_out, args), args.threads)
    if r["returncode"] != 0:
        raise SystemExit(f"nmt-generate failed on the 1x input: {r['stderr'][-2000:]}")

    cmd = command(args.checkpoint, big, out, args)
    journal = out.with_name(out.name + ".nmt-progress.json")
    target = int(args.kill_at * total)
    killed = run(cmd, args.threads, lambda: lines_done(journal) >= target)
    at = lines_done(journal)
    if killed["returncode"] != -signal.SIGKILL or out.exists():
        raise SystemExit(f"the run was not killed mid-way (exit {killed['returncode']})")
    resumed = run(cmd, args.threads)
    if resumed["returncode"] != 0:
        raise SystemExit(f"the resumed run failed: {resumed['stderr'][-2000:]}")
    said = f"after input line {at}" in resumed["stderr"]
    if not said:
        raise SystemExit(f"the second run did not say it resumed after line {at}")
    identical = out.read_bytes() == ref_out.read_bytes() * args.times
    result = {"lines": total, "input_mb": big.stat().st_size / 2**20, "killed_after": at,
              "killed": {k: killed[k] for k in ("wall", "peak_rss_mb")},
              "resumed": {k: resumed[k] for k in ("wall", "peak_rss_mb")},
              "identical": identical, "resume_logged": said, "command": cmd,
              "reference_lines": n_one}
    print(f"| lines | input (MiB) | killed after | first part (s) | its peak RSS (MiB) | "
          f"resumed part (s) | its peak RSS (MiB) | lines/s | byte-identical |\n"
          f"|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
          f"| {total:,} | {result['input_mb']:.1f} | {at:,} | {killed['wall']:.0f} | "
          f"{killed['peak_rss_mb']:.0f} | {resumed['wall']:.0f} | {resumed['peak_rss_mb']:.0f} | "
          f"{total / (killed['wall'] + resumed['wall']):,.0f} | {'yes' if identical else 'NO'} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if not identical:
        raise SystemExit("the resumed output differs from the uninterrupted one")


if __name__ == "__main__":
    main()
