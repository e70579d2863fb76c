#!/usr/bin/env python3
"""Decoding speed of several versions of nmt, side by side in one run (a change, measured).

    python benchmarks/bench_versions.py CKPT --input test.en --versions a1ac3fc,HEAD \\
        [--beam 4] [--threads 2] [--rounds 3] [--batch-size 64] [--limit N] [--json out.json]

Each version (a git revision of this repository, checked out with ``git worktree`` under
``--work``, or a directory holding an ``nmt`` package) translates the same input with the same
checkpoint in a child process of its own (``PYTHONPATH`` = that tree): bench_ct2.py's nmt
child, which decodes through ``Translator`` as ``nmt-generate`` does, a warm-up on 16
sentences, then one timed pass over the input. The
versions take turns, ``--rounds`` times, in an order that rotates every round, so a drift of
the machine favours none; the table gives the median sentences/s of each, its ratio to the
first version, and whether its output is identical to the first version's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def checkout(version: str, work: Path) -> Path:
    """A source tree of ``version``: a directory as it is, else a worktree of that revision."""
    if Path(version, "nmt").is_dir():
        return Path(version).resolve()
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", version],
                         capture_output=True, text=True)
    if rev.returncode != 0:
        raise SystemExit(f"bench_versions.py: error: {version}: not a directory with an nmt "
                         f"package nor a git revision of {REPO}")
    tree = work / rev.stdout.strip()
    if not (tree / "nmt").is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-f",
                        str(tree), rev.stdout.strip()], check=True, capture_output=True)
    return tree


def run_child(tree: Path, args, hyp: Path) -> float:
    """One timed pass of bench_ct2.py's nmt child with the nmt of ``tree``: wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "bench_ct2.py"), "--child",
           "nmt", "--precision", "float32", "--beam", str(args.beam), "--threads",
           str(args.threads), "--batch-size", str(args.batch_size), "--rounds", "1",
           "--input", args.input, "--hyp", str(hyp), args.checkpoint]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
    if res.returncode != 0:
        raise SystemExit(f"bench_versions.py: error: {tree} failed: "
                         f"{res.stderr.strip().splitlines()[-1:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])["walls"][0]


def measure(args, trees: list[tuple[str, Path]]) -> list[dict]:
    walls: list[list[float]] = [[] for _ in trees]
    hyps = [Path(args.work) / f"hyp.{i}.txt" for i in range(len(trees))]
    n = sum(1 for _ in open(args.input, encoding="utf-8"))
    for r in range(args.rounds):
        turn = list(range(len(trees)))
        for i in turn[r % len(trees):] + turn[:r % len(trees)]:
            walls[i].append(run_child(trees[i][1], args, hyps[i]))
            print(f"round {r + 1}: {trees[i][0]}: {n / walls[i][-1]:.1f} sentences/s",
                  file=sys.stderr)
    base_text = hyps[0].read_text(encoding="utf-8")
    rows = []
    for (version, tree), w, hyp in zip(trees, walls, hyps):
        wall = statistics.median(w)
        rows.append({"version": version, "tree": str(tree), "walls": w, "median_wall": wall,
                     "sentences_per_s": n / wall,
                     "identical_to_first": hyp.read_text(encoding="utf-8") == base_text})
    for row in rows:
        row["speed_vs_first"] = row["sentences_per_s"] / rows[0]["sentences_per_s"]
    return rows


def table(rows: list[dict]) -> str:
    out = ["| version | median wall s | sentences/s | vs first | output identical to first |",
           "|---|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['version']} | {r['median_wall']:.2f} | {r['sentences_per_s']:.1f} | "
                   f"{r['speed_vs_first']:.3f}x | {'yes' if r['identical_to_first'] else 'no'} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--input", required=True)
    ap.add_argument("--versions", default="HEAD",
                    help="comma-separated git revisions or source directories; the first is "
                         "the reference")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--limit", type=int, default=0, help="the first N lines only (0: all)")
    ap.add_argument("--work", default=str(REPO / ".bench_versions"),
                    help="where worktrees and outputs go")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    args.checkpoint = str(Path(args.checkpoint).resolve())
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    args.work = str(work)
    args.input = str(Path(args.input).resolve())
    if args.limit:
        lines = Path(args.input).read_text(encoding="utf-8").splitlines(keepends=True)
        limited = work / "input.txt"
        limited.write_text("".join(lines[:args.limit]), encoding="utf-8")
        args.input = str(limited)
    trees = [(v, checkout(v, work)) for v in args.versions.split(",") if v]
    rows = measure(args, trees)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
