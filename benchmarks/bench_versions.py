#!/usr/bin/env python3
"""Decoding or training speed of versions of nmt, side by side in one run (a change, measured).

    python benchmarks/bench_versions.py CKPT --input test.en --versions a1ac3fc,HEAD \\
        [--beam 4] [--threads 2] [--rounds 3] [--batch-size 64] [--limit N] [--json out.json]
    python benchmarks/bench_versions.py --train DATA_DIR --versions a1ac3fc,HEAD \\
        [--arch transformer_small] [--warm-updates 5] [--updates 30] [--threads 2] [--rounds 3]
    python benchmarks/bench_versions.py --train DATA_DIR --versions HEAD,HEAD+--dropout-masks=fast

Each version (a git revision of this repository, checked out with ``git worktree`` under
``--work``, or a directory holding an ``nmt`` package) translates the same input with the same
checkpoint in a child process of its own (``PYTHONPATH`` = that tree): bench_ct2.py's nmt
child, which decodes through ``Translator`` as ``nmt-generate`` does, a warm-up on 16
sentences, then one timed pass over the input. The
versions take turns, ``--rounds`` times, in an order that rotates every round, so a drift of
the machine favours none; the table gives the median sentences/s of each, its ratio to the
first version, and whether its output is identical to the first version's.

With ``--train``, each turn is instead one ``bench_train.py DATA_DIR --warm-updates W --updates
U`` with that version's nmt (this script's own bench_train.py, so the timing is the same code):
the table gives the median target tokens/s and MFU (against the median of the matmul rates that
all turns measured), and whether the weights after the run are bit for bit the first version's.
A version written ``REV+ARG+ARG...`` passes those arguments to its bench_train.py (an option of
the same version, measured against it).
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


def child_result(tree: Path, threads: int, cmd: list[str]) -> dict:
    """Run a benchmark child with the nmt of ``tree``; its last stdout line, parsed as JSON."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads)}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
    if res.returncode != 0:
        raise SystemExit(f"bench_versions.py: error: {tree} failed: "
                         f"{res.stderr.strip().splitlines()[-1:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def rotation(rounds: int, n: int):
    """(round, version index) for ``rounds`` rounds of ``n`` versions, the order rotating every
    round so that a drift of the machine favours none."""
    for r in range(rounds):
        for k in range(n):
            yield r, (r + k) % n


def run_child(tree: Path, args, hyp: Path) -> float:
    """One timed pass of bench_ct2.py's nmt child with the nmt of ``tree``: wall seconds."""
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "bench_ct2.py"), "--child",
           "nmt", "--precision", "float32", "--beam", str(args.beam), "--threads",
           str(args.threads), "--batch-size", str(args.batch_size), "--rounds", "1",
           "--input", args.input, "--hyp", str(hyp), args.checkpoint]
    return child_result(tree, args.threads, cmd)["walls"][0]


def run_train_child(tree: Path, args, extra: list[str]) -> dict:
    """One bench_train.py run (warm-up, then timed updates) with the nmt of ``tree``."""
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "bench_train.py"), args.train,
           "--arch", args.arch, "--warm-updates", str(args.warm_updates), "--updates",
           str(args.updates), "--threads", str(args.threads),
           *(x for o in args.override for x in ("--override", o)), *extra]
    return child_result(tree, args.threads, cmd)


def measure_train(args, trees: list[tuple[str, Path]]) -> list[dict]:
    runs: list[list[dict]] = [[] for _ in trees]
    for r, i in rotation(args.rounds, len(trees)):
        runs[i].append(run_train_child(trees[i][1], args, trees[i][0].split("+")[1:]))
        print(f"round {r + 1}: {trees[i][0]}: {runs[i][-1]['tgt_tokens_per_s']:.1f} target "
              f"tokens/s, MFU {runs[i][-1]['mfu']:.1%}", file=sys.stderr)
    first = runs[0][0]["weights_sha256"]
    # One machine, one run: MFU against the median matmul rate of all turns, so that the
    # versions are divided by the same rate (a turn's own 2-second measurement moves by +-5%).
    rate = statistics.median(x["matmul_peak_gflops"] for rs in runs for x in rs)
    rows = []
    for (version, tree), rs in zip(trees, runs):
        achieved = statistics.median(x["achieved_gflops"] for x in rs)
        rows.append({"version": version, "tree": str(tree), "runs": rs,
                     "tgt_tokens_per_s": statistics.median(x["tgt_tokens_per_s"] for x in rs),
                     "achieved_gflops": achieved, "matmul_gflops": rate, "mfu": achieved / rate,
                     "peak_rss_gb": max(x["peak_rss_gb"] for x in rs),
                     "identical_to_first": all(x["weights_sha256"] == first for x in rs)})
    for row in rows:
        row["speed_vs_first"] = row["tgt_tokens_per_s"] / rows[0]["tgt_tokens_per_s"]
    return rows


def train_table(rows: list[dict]) -> str:
    out = [f"MFU: median achieved GFLOP/s over the median fp32 matmul rate of all turns, "
           f"{rows[0]['matmul_gflops']:.1f} GFLOP/s.", "",
           "| version | target tokens/s (median) | vs first | achieved GFLOP/s (median) | MFU | "
           "peak RSS (GB) | weights identical to first |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['version']} | {r['tgt_tokens_per_s']:,.1f} | {r['speed_vs_first']:.3f}x "
                   f"| {r['achieved_gflops']:.1f} | {r['mfu']:.1%} | {r['peak_rss_gb']:.2f} | "
                   f"{'yes' if r['identical_to_first'] else 'no'} |")
    return "\n".join(out)


def measure(args, trees: list[tuple[str, Path]]) -> list[dict]:
    walls: list[list[float]] = [[] for _ in trees]
    hyps = [Path(args.work) / f"hyp.{i}.txt" for i in range(len(trees))]
    n = sum(1 for _ in open(args.input, encoding="utf-8"))
    for r, i in rotation(args.rounds, len(trees)):
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
    ap.add_argument("checkpoint", nargs="?", help="decoding: the checkpoint to translate with")
    ap.add_argument("--input", help="decoding: the source file")
    ap.add_argument("--train", metavar="DATA_DIR",
                    help="measure training instead, on this nmt-preprocess output")
    ap.add_argument("--arch", default="transformer_small", help="training: the architecture")
    ap.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                    help="training: change a hyperparameter of --arch, for every version")
    ap.add_argument("--warm-updates", type=int, default=5, help="training: untimed updates")
    ap.add_argument("--updates", type=int, default=30, help="training: timed updates")
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
    if args.train is None and (args.checkpoint is None or args.input is None):
        ap.error("give CHECKPOINT and --input (decoding), or --train DATA_DIR (training)")
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    args.work = str(work)
    # A version's own arguments (REV+ARG+ARG, training only) do not name its tree.
    trees = [(v, checkout(v.split("+")[0] if args.train else v, work))
             for v in args.versions.split(",") if v]
    if args.train is not None:
        args.train = str(Path(args.train).resolve())
        rows = measure_train(args, trees)
        print(train_table(rows))
    else:
        args.checkpoint = str(Path(args.checkpoint).resolve())
        args.input = str(Path(args.input).resolve())
        if args.limit:
            lines = Path(args.input).read_text(encoding="utf-8").splitlines(keepends=True)
            limited = work / "input.txt"
            limited.write_text("".join(lines[:args.limit]), encoding="utf-8")
            args.input = str(limited)
        rows = measure(args, trees)
        print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
