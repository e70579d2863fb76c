#!/usr/bin/env python3
"""nmt against CTranslate2 on the same checkpoint, the same input, in one run, each engine at
its best settings on this machine.

    python benchmarks/bench_ct2.py CKPT --input val.en --ref val.de --threads 2 \
        [--beams 1,4] [--rounds 3] [--json out.json] [--markdown out.md]

The checkpoint is exported with nmt-export (float32 and int8 model directories). Every
configuration decodes the whole input in a child process of its own (so that each one's peak
RSS is its own): a warm-up on 16 sentences, then one timed pass; tokenization and
detokenization (sentencepiece) are inside the timed pass for both engines.

1. CTranslate2 is tuned first, for each compute type (float32, int8, int8_float32) and beam:
   ``--tune-passes`` passes (2) over every setting, a child per environment (as shipped;
   ``CT2_PACKED_GEMM=0``, which is several times faster on some Intel CPUs;
   ``CT2_USE_MKL=0``, its oneDNN/ruy backends instead of MKL) decoding with each batching
   (``max_batch_size`` 32 examples as its own benchmark, 64 examples, and nmt's default token
   budget for this model as ``batch_type="tokens"``, and 8192 // beam tokens where that
   differs), each with ``inter_threads`` 1 (``intra_threads`` all of --threads) and, with 2
   threads or more, 2 (two batches at once, each on half the threads: its setting for
   throughput). The setting with the fastest pass is kept.
2. Then ``--rounds`` rounds, in an order reversed every other round, of nmt at its defaults
   (Translator: batches of 8192 // beam source tokens, up to 4x that, at most 8192, for a
   decoder narrower than transformer_small's, and so with --engine ctranslate2 in int8, but
   8192 // beam in its float32; two batches at once, each on half the threads, for beam
   search with a decoder no wider than transformer_small's, and always with --engine
   ctranslate2, then in batches of 2048 source tokens, in int8 of 2048 // beam
   (nmt.search.config.parallel_engine_tokens); GNMT length penalty 0.6, max length
   source + 50) in fp32, bf16 (where the CPU has native bf16) and int8, and CTranslate2 with
   the kept settings per compute type (``length_penalty=0``: it ends a sentence's search when
   its best hypothesis has finished, close to nmt's rule; max length source + 50 per call).

3. In the same rounds, ``nmt-generate --engine ctranslate2`` (the Translator with
   ``engine="ctranslate2"``: nmt's pipeline, the cached conversion, CTranslate2's kept
   environment) in float32 and int8, and, at beam > 1, CTranslate2 called directly with the
   search that engine runs (length_penalty 1e-9, every finished hypothesis returned and
   rescored with nmt's penalty: "nmt's search"), so that the engine's own cost is the ratio
   of two runs of one search.

The table gives the median wall time, sentences/s, output subword tokens/s, the child's peak
RSS and sacreBLEU against --ref. Ratios are printed only between engines measured in this run
on this model: nmt fp32 against CTranslate2 float32, each engine's fastest precision against
the other's, and --engine ctranslate2 against CTranslate2 called directly with the same
search. Needs ctranslate2 (pip install 'nmt[export]').
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARMUP = 16
CT2_ENVS = {"shipped": {}, "CT2_PACKED_GEMM=0": {"CT2_PACKED_GEMM": "0"},
            "CT2_USE_MKL=0": {"CT2_USE_MKL": "0"}}
CT2_TYPES = ("float32", "int8", "int8_float32")


# --- children: one configuration each -------------------------------------------------------
def child(args) -> None:
    """Decode --input with one configuration (for CTranslate2, each --batchings in turn);
    print one JSON line."""
    # Plain reading: the CTranslate2 child must not import nmt (and torch with it), or its
    # peak RSS would count them.
    with open(args.input, encoding="utf-8") as f:
        lines = [line.rstrip("\n").rstrip("\r") for line in f]
    results = []
    for batching in (json.loads(args.batchings) if args.engine == "ct2" else [None]):
        decode, count = (_nmt(args) if args.engine in ("nmt", "nmt-ct2")
                         else _ct2(args, batching))
        decode(lines[:WARMUP])
        t0 = time.perf_counter()
        hyps = decode(lines)
        wall = time.perf_counter() - t0
        results.append({"batching": batching or ["tokens", decode.max_tokens,
                                                 decode.parallel],
                        "wall": wall, "tokens": count()})
    Path(args.hyp).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    print(json.dumps({"results": results, "walls": [r["wall"] for r in results],
                      "rss_mb": peak_rss_mb()}))


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Not getrusage's ru_maxrss: Linux keeps that
    across fork and exec, so a child would report its parent's peak when it is the larger."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _nmt(args):
    from nmt.search.config import BatchConfig, SearchConfig

    # --batch-size: benchmarks/bench_versions.py times older trees with a fixed batch
    batch = BatchConfig(batch_size=args.batch_size) if args.batch_size else None
    precision = {"float32": "fp32"}.get(args.precision, args.precision)
    if args.engine == "nmt-ct2":
        # as nmt-generate --engine ctranslate2 runs: without torch (converted by the parent)
        from nmt.engines.ctranslate2 import CTranslate2Translator

        t = CTranslate2Translator.from_checkpoint(
            args.checkpoint, search=SearchConfig(beam=args.beam), batch=batch, device="cpu",
            precision=precision, threads=args.threads)
    else:
        import torch

        from nmt.search.translator import Translator

        torch.set_num_threads(args.threads)
        t = Translator.from_checkpoint(args.checkpoint, search=SearchConfig(beam=args.beam),
                                       batch=batch, device="cpu", precision=precision)
    tokens = {"n": 0}

    def decode(lines):
        # as nmt-generate's text output asks: no scores (CTranslate2 called directly returns
        # none in greedy search either)
        results = t.translate_results(lines, scores=False)
        tokens["n"] = sum(len(r.hypotheses[0].ids) - 1 for r in results if r.hypotheses)
        return [r.text for r in results]
    decode.max_tokens = t.max_tokens        # the batch its defaults chose
    decode.parallel = t._parallel()         # ... and how many batches at once
    return decode, lambda: tokens["n"]


def _ct2(args, batching):
    import ctranslate2
    import sentencepiece as spm

    d = args.model_dir
    batch_type, size, inter = batching
    tr = ctranslate2.Translator(d, device="cpu", compute_type=args.precision,
                                intra_threads=max(1, args.threads // inter),
                                inter_threads=inter)
    src = spm.SentencePieceProcessor(model_file=f"{d}/source.spm")
    tgt = spm.SentencePieceProcessor(model_file=f"{d}/target.spm")
    tokens = {"n": 0}
    # --nmt-search: the search --engine ctranslate2 runs (nmt.engines.ctranslate2)
    recipe = args.nmt_search and args.beam > 1
    options = ({"length_penalty": 1e-9, "num_hypotheses": args.beam, "return_scores": True}
               if recipe else {"length_penalty": 0.0})

    def gnmt(hyp_score):
        return hyp_score[1] / ((5 + len(hyp_score[0]) + 1) / 6) ** 0.6

    def decode(lines):
        pieces = [src.encode(line, out_type=str) for line in lines]
        keep = [i for i, p in enumerate(pieces) if p]
        out = [""] * len(lines)
        if keep:
            res = tr.translate_batch([pieces[i] for i in keep], max_batch_size=size,
                                     batch_type=batch_type, beam_size=args.beam,
                                     max_decoding_length=max(len(pieces[i]) for i in keep) + 50,
                                     min_decoding_length=0, **options)
            best = [max(zip(r.hypotheses, r.scores), key=gnmt)[0] if recipe else r.hypotheses[0]
                    for r in res]
            tokens["n"] = sum(len(h) for h in best)
            for i, h in zip(keep, best):
                out[i] = tgt.decode(h)
        return out
    return decode, lambda: tokens["n"]


def run_child(args, work: Path, engine: str, precision: str, beam: int, model_dir: str = "",
              env_name: str = "", batchings: list | None = None) -> dict:
    tag = f"{engine}.{precision}.b{beam}.{env_name or 'default'}".replace("=", "")
    hyp = work / f"{tag}.txt"
    cmd = [sys.executable, __file__, "--child", engine.replace("-search", ""), "--precision",
           precision, "--beam", str(beam), "--threads", str(args.threads), "--input",
           args.input, "--hyp", str(hyp), "--model-dir", model_dir, "--batchings",
           json.dumps(batchings or []), *(["--nmt-search"] if engine == "ct2-search" else []),
           args.checkpoint]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), **CT2_ENVS.get(env_name, {})}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench_ct2: {tag} failed:\n{p.stderr[-2000:]}")
    row = json.loads(p.stdout.strip().splitlines()[-1])
    row["hyp"] = str(hyp)
    return row


# --- the run --------------------------------------------------------------------------------
def token_budgets(width: int, beam: int) -> list[int]:
    """nmt's default source tokens per batch at ``beam`` for a decoder of ``width`` (layers x
    d_model), then the unscaled default where that differs."""
    from nmt.search.config import default_source_tokens

    ours = default_source_tokens(beam, width)
    return sorted({ours, default_source_tokens(beam)}, key=lambda n: n != ours)


def describe(batching: list, unit: str = "") -> str:
    """"2048 tokens", "64 examples, 2 batches at once": a batching [type, size, at once]."""
    kind, size, at_once = batching
    return f"{size} {unit or kind}" + (f", {at_once} batches at once" if at_once > 1 else "")


def tune_ct2(args, work: Path, dirs: dict, beams: list[int]) -> dict:
    """(compute type, beam) -> (environment, batching) of CTranslate2's fastest pass."""
    from nmt.checkpoint import load_checkpoint, model_config

    width = model_config(load_checkpoint(args.checkpoint, mmap=True)).decoder_width
    best = {}
    for ct in CT2_TYPES:
        for beam in beams:
            batchings = [[*b, inter] for inter in sorted({1, min(2, args.threads)})
                         for b in (["examples", 32], ["examples", 64],
                                   *(["tokens", n] for n in token_budgets(width, beam)))]
            tried = []
            for _ in range(args.tune_passes):       # each setting's fastest pass counts
                for env_name in CT2_ENVS:
                    row = run_child(args, work, "ct2", ct, beam, dirs[ct], env_name, batchings)
                    tried += [(r["wall"], env_name, r["batching"]) for r in row["results"]]
            wall, env_name, batching = min(tried, key=lambda x: x[0])
            best[(ct, beam)] = (env_name, batching)
            print(f"CTranslate2 {ct} beam {beam}: fastest {env_name}, {describe(batching)} "
                  f"({wall:.2f} s; slowest {max(tried)[0]:.2f} s)",
                  file=sys.stderr, flush=True)
    return best


def nmt_precisions() -> list[str]:
    from nmt.runtime import cpu_has_native_bf16

    return ["fp32", "bf16", "int8"] if cpu_has_native_bf16() else ["fp32", "int8"]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        args.engine = args.child
        child(args)
        return 0
    from nmt.interop.ct2_export import export_model

    tmp = tempfile.TemporaryDirectory()
    work = Path(tmp.name)
    dirs = {"float32": str(export_model(args.checkpoint, work / "ct2-float32"))}
    dirs["int8"] = dirs["int8_float32"] = str(export_model(args.checkpoint, work / "ct2-int8",
                                                           quantization="int8"))
    beams = [int(b) for b in args.beams.split(",")]
    from nmt.engines.ctranslate2 import converted_model

    for stored in ("float32", "int8"):     # --engine ctranslate2's cache, before any timing
        converted_model(args.checkpoint, stored)
    load_before = os.getloadavg()[0]
    tuned = tune_ct2(args, work, dirs, beams)
    configs = [("nmt", p, b) for b in beams for p in nmt_precisions()]
    configs += [("ct2", ct, b) for b in beams for ct in CT2_TYPES]
    configs += [("nmt-ct2", ct, b) for b in beams for ct in ("float32", "int8")]
    configs += [("ct2-search", ct, b) for b in beams if b > 1 for ct in ("float32", "int8")]
    walls: dict = {c: [] for c in configs}
    rows: dict = {}
    for r in range(args.rounds):
        for c in (configs if r % 2 == 0 else configs[::-1]):
            engine, precision, beam = c
            env_name, batching = (tuned[(precision, beam)] if engine.startswith("ct2")
                                  else (tuned[(precision, beam)][0], None)
                                  if engine == "nmt-ct2" else ("", None))
            row = run_child(args, work, engine, precision, beam, dirs.get(precision, ""),
                            env_name, [batching] if batching else None)
            walls[c].append(row["results"][-1]["wall"])
            rows[c] = {**row, "tokens": row["results"][-1]["tokens"], "setting": (
                f"{env_name}, {describe(batching)}"
                + (", nmt's search" if engine == "ct2-search" else "")
                if engine.startswith("ct2") else
                f"defaults ({describe(row['results'][-1]['batching'], 'source tokens per batch')})"
                + (f", {env_name}" if engine == "nmt-ct2" else ""))}
    n = sum(1 for _ in open(args.input, encoding="utf-8"))
    report = {"command": "python benchmarks/bench_ct2.py " + " ".join(argv or sys.argv[1:]),
              "machine": machine(args.threads), "sentences": n, "rounds": args.rounds,
              "load_before": load_before, "load_after": os.getloadavg()[0], "rows": []}
    for c in configs:
        wall = statistics.median(walls[c])
        report["rows"].append({
            "engine": c[0], "precision": c[1], "beam": c[2], "setting": rows[c]["setting"],
            "wall_s": round(wall, 4), "walls_s": walls[c], "sentences_per_s": n / wall,
            "tokens_per_s": rows[c]["tokens"] / wall, "rss_mb": rows[c]["rss_mb"],
            "bleu": bleu(rows[c]["hyp"], args.ref) if args.ref else None})
    text = markdown(report, beams)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(text + "\n", encoding="utf-8")
    return 0


def bleu(hyp: str, ref: str) -> float:
    from nmt.io import read_lines
    from nmt.metrics.scoring import corpus_score

    return round(corpus_score("bleu", read_lines(hyp), [read_lines(ref)]).score, 2)


def machine(threads: int) -> dict:
    import ctranslate2
    import torch

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)
    except OSError:
        pass
    from nmt.runtime import cpu_has_native_bf16

    return {"cpu": cpu, "native_bf16": cpu_has_native_bf16(), "threads": threads,
            "torch": torch.__version__, "ctranslate2": ctranslate2.__version__}


def markdown(report: dict, beams: list[int]) -> str:
    m = report["machine"]
    out = [f"{report['sentences']} sentences, {m['threads']} threads, median of "
           f"{report['rounds']} rounds; {m['cpu']} (native bf16: {m['native_bf16']}), torch "
           f"{m['torch']}, CTranslate2 {m['ctranslate2']}; load average "
           f"{report['load_before']:.2f} before, {report['load_after']:.2f} after.", "",
           "| engine | precision | beam | setting | sentences/s | tokens/s | peak RSS MB "
           "| BLEU |", "|---|---|---:|---|---:|---:|---:|---:|"]
    names = {"nmt": "nmt", "ct2": "CTranslate2", "ct2-search": "CTranslate2",
             "nmt-ct2": "nmt --engine ctranslate2"}
    for r in report["rows"]:
        out.append(f"| {names[r['engine']]} | {r['precision']} "
                   f"| {r['beam']} | {r['setting']} | {r['sentences_per_s']:,.1f} | "
                   f"{r['tokens_per_s']:,.0f} | {r['rss_mb']:.0f} | {r['bleu']} |")
    out += ["", "| beam | nmt fp32 / CTranslate2 float32 | nmt fastest / CTranslate2 fastest "
            "| --engine ctranslate2 / CTranslate2, float32 | ... int8 |",
            "|---:|---:|---:|---:|---:|"]
    for b in beams:
        rows = [r for r in report["rows"] if r["beam"] == b]
        by = {(r["engine"], r["precision"]): r for r in rows}
        fast = {e: min((r for r in rows if r["engine"] == e), key=lambda r: r["wall_s"])
                for e in ("nmt", "ct2")}      # nmt's own engine; CTranslate2 at its fastest
        same = "ct2" if b == 1 else "ct2-search"        # CTranslate2 with the same search
        engine = [f"{by[(same, ct)]['wall_s'] / by[('nmt-ct2', ct)]['wall_s']:.2f}x"
                  for ct in ("float32", "int8")]
        out.append(f"| {b} | {by[('ct2', 'float32')]['wall_s'] / by[('nmt', 'fp32')]['wall_s']:.2f}x "
                   f"| {fast['ct2']['wall_s'] / fast['nmt']['wall_s']:.2f}x (nmt "
                   f"{fast['nmt']['precision']}, CTranslate2 {fast['ct2']['precision']}) "
                   f"| {engine[0]} | {engine[1]} |")
    return "\n".join(out)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--input", required=True)
    ap.add_argument("--ref")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beams", default="1,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tune-passes", type=int, default=2,
                    help="passes over every CTranslate2 setting while tuning; each setting "
                         "counts with its fastest (a busy machine only ever slows a pass)")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--child", choices=["nmt", "ct2", "nmt-ct2"], help=argparse.SUPPRESS)
    ap.add_argument("--nmt-search", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--beam", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--hyp", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--batchings", default="[]", help=argparse.SUPPRESS)
    ap.add_argument("--batch-size", type=int, default=None, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
