#!/usr/bin/env python3
"""nmt against CTranslate2 on the same model, the same input, in one run (issue 14).

    python benchmarks/bench_ct2.py CKPT --input test.en --ref test.de --threads 2 \
        [--beams 1,4] [--rounds 3] [--json out.json]

The checkpoint is exported with nmt-export (float32 and int8 model directories), then every
configuration (engine x precision x beam) decodes the whole input in a child process of its
own, so that each one's peak RSS is its own: a warm-up on 16 sentences, then ``--rounds``
timed passes; the table reports the median wall time, sentences/s and output subword tokens/s
of the median pass, the peak RSS of the child, and sacreBLEU of its output against --ref. The
configurations run in an order that alternates between rounds, so that a drift of the machine
does not favour one engine.

Each engine runs as its users would: nmt with its defaults, through ``Translator`` (batches
of 64 sentences sorted by length, GNMT length penalty, alpha 0.6, max length source + 50);
CTranslate2 with the settings of its own published benchmark (tools/benchmark in its
repository): ``translate_batch`` with ``max_batch_size=32`` examples (``--ct2-batch``),
``length_penalty=0`` (``--ct2-lenpen``; with 0, CTranslate2 ends a sentence's beam search as
soon as its best hypothesis has finished, with any other value only when ``beam``
hypotheses have: 0.6 made it decode longer than nmt, which stops when no live hypothesis can
win), ``intra_threads`` = --threads, ``inter_threads=1``, one maximum length per call (the
longest source + 50; its default is 256). It sorts each call's sentences by length before
batching, as nmt does. Tokenization and detokenization (sentencepiece) are inside the timed
passes for both. ``--ct2-env KEY=VALUE`` sets an environment variable for the CTranslate2
children only (e.g. CT2_USE_MKL=0), ``--engines ct2`` runs one engine.
Needs ctranslate2 (pip install 'nmt[export]').
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARMUP = 16


def child(args) -> None:
    """Decode --input with one configuration; print one JSON line."""
    # Plain reading: the CTranslate2 child must not import nmt (and torch with it), or its
    # peak RSS would count them.
    with open(args.input, encoding="utf-8") as f:
        lines = [line.rstrip("\n").rstrip("\r") for line in f]
    decode, count = (_nmt if args.engine == "nmt" else _ct2)(args)
    decode(lines[:WARMUP])
    walls, hyps = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        hyps = decode(lines)
        walls.append(time.perf_counter() - t0)
    Path(args.hyp).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    print(json.dumps({"walls": walls, "tokens": count(hyps), "rss_mb": peak_rss_mb()}))


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Not getrusage's ru_maxrss: Linux keeps that
    across fork and exec, so a child would report its parent's peak when it is the larger."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _nmt(args):
    import torch

    from nmt.search.config import BatchConfig, SearchConfig
    from nmt.search.translator import Translator

    torch.set_num_threads(args.threads)
    t = Translator.from_checkpoint(args.checkpoint, search=SearchConfig(beam=args.beam),
                                   batch=BatchConfig(batch_size=args.batch_size), device="cpu",
                                   precision="fp32" if args.precision == "float32" else "int8")
    tokens = {}

    def decode(lines):
        results = t.translate_results(lines)
        tokens["n"] = sum(len(r.hypotheses[0].ids) - 1 for r in results if r.hypotheses)
        return [r.text for r in results]
    return decode, lambda hyps: tokens["n"]


def _ct2(args):
    import ctranslate2
    import sentencepiece as spm

    d = args.model_dir
    tr = ctranslate2.Translator(d, device="cpu", compute_type=args.precision,
                                intra_threads=args.threads, inter_threads=1)
    src = spm.SentencePieceProcessor(model_file=f"{d}/source.spm")
    tgt = spm.SentencePieceProcessor(model_file=f"{d}/target.spm")
    tokens = {}

    def decode(lines):
        pieces = [src.encode(line, out_type=str) for line in lines]
        keep = [i for i, p in enumerate(pieces) if p]
        out = [""] * len(lines)
        if keep:
            res = tr.translate_batch([pieces[i] for i in keep], max_batch_size=args.ct2_batch,
                                     beam_size=args.beam, length_penalty=args.ct2_lenpen,
                                     max_decoding_length=max(len(pieces[i]) for i in keep) + 50)
            tokens["n"] = sum(len(r.hypotheses[0]) for r in res)
            for i, r in zip(keep, res):
                out[i] = tgt.decode(r.hypotheses[0])
        return out
    return decode, lambda hyps: tokens.get("n", 0)


def run_config(args, engine: str, precision: str, beam: int, model_dir: str,
               work: Path) -> dict:
    hyp = work / f"{engine}.{precision}.b{beam}.txt"
    cmd = [sys.executable, __file__, "--child", engine, "--precision", precision, "--beam",
           str(beam), "--threads", str(args.threads), "--rounds", "1", "--input", args.input,
           "--hyp", str(hyp), "--model-dir", model_dir, "--ct2-batch", str(args.ct2_batch),
           "--ct2-lenpen", str(args.ct2_lenpen), args.checkpoint]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if engine == "ct2":
        env.update(x.split("=", 1) for x in args.ct2_env)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench_ct2: {engine} {precision} beam {beam} failed:\n{p.stderr[-2000:]}")
    row = json.loads(p.stdout.strip().splitlines()[-1])
    row["hyp"] = str(hyp)
    return row


def bleu(hyp: str, ref: str) -> float:
    from nmt.io import read_lines
    from nmt.metrics.scoring import corpus_score

    return round(corpus_score("bleu", read_lines(hyp), [read_lines(ref)]).score, 2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--input", required=True)
    ap.add_argument("--ref")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beams", default="1,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--engines", default="nmt,ct2")
    ap.add_argument("--ct2-batch", type=int, default=32,
                    help="CTranslate2's max_batch_size in examples [32, its benchmark's]")
    ap.add_argument("--ct2-lenpen", type=float, default=0.0,
                    help="CTranslate2's length_penalty [0, its benchmark's]")
    ap.add_argument("--ct2-env", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--child", choices=["nmt", "ct2"], help=argparse.SUPPRESS)
    ap.add_argument("--precision", default="float32", help=argparse.SUPPRESS)
    ap.add_argument("--beam", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--hyp", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, default=64, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.engine = args.child
        child(args)
        return 0
    if not args.ref:
        ap.error("--ref is required")
    from nmt.export import export_model

    tmp = tempfile.TemporaryDirectory()
    work = Path(tmp.name)
    dirs = {q: str(export_model(args.checkpoint, work / f"ct2-{q}", quantization=q))
            for q in ("float32", "int8")}
    engines = args.engines.split(",")
    configs = [(e, p, int(b)) for b in args.beams.split(",") for p in ("float32", "int8")
               for e in ("nmt", "ct2") if e in engines]
    walls: dict = {c: [] for c in configs}
    rows: dict = {}
    for r in range(args.rounds):
        for c in (configs if r % 2 == 0 else configs[::-1]):
            row = run_config(args, *c, dirs[c[1]], work)
            walls[c] += row["walls"]
            rows[c] = row
    report = []
    for c in configs:
        wall = statistics.median(walls[c])
        n = sum(1 for _ in open(args.input, encoding="utf-8"))
        report.append({"engine": c[0], "precision": c[1], "beam": c[2], "wall_s": wall,
                       "sentences_per_s": n / wall, "tokens_per_s": rows[c]["tokens"] / wall,
                       "rss_mb": max(rows[c]["rss_mb"], 0), "bleu": bleu(rows[c]["hyp"],
                                                                          args.ref)})
    print(table(report, args))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def table(report: list[dict], args) -> str:
    import torch

    out = [f"# nmt vs CTranslate2: {sum(1 for _ in open(args.input, encoding='utf-8'))} "
           f"sentences, {args.threads} thread(s), {args.rounds} round(s), torch "
           f"{torch.__version__}, ctranslate2 {_ct2_version()} (batch {args.ct2_batch}, "
           f"length_penalty {args.ct2_lenpen}{', ' + ' '.join(args.ct2_env) if args.ct2_env else ''})",
           "",
           "| engine | precision | beam | median wall s | sentences/s | tokens/s | peak RSS MB "
           "| BLEU | nmt / CTranslate2 speed |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["engine"], r["precision"], r["beam"]): r for r in report}
    for r in report:
        other = by.get(("ct2", r["precision"], r["beam"]))
        ratio = other["wall_s"] / r["wall_s"] if r["engine"] == "nmt" and other else None
        out.append(f"| {r['engine']} | {r['precision']} | {r['beam']} | {r['wall_s']:.2f} | "
                   f"{r['sentences_per_s']:.1f} | {r['tokens_per_s']:.0f} | {r['rss_mb']:.0f} | "
                   f"{r['bleu']} | {'' if ratio is None else f'{ratio:.2f}x'} |")
    return "\n".join(out)


def _ct2_version() -> str:
    try:
        import ctranslate2
    except ImportError:
        return "not installed"
    return ctranslate2.__version__


if __name__ == "__main__":
    sys.exit(main())
