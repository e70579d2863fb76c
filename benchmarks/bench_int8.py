#!/usr/bin/env python3
"""int8 against fp32 CPU decoding: BLEU of each, and their speed side by side in one process.

    python benchmarks/bench_int8.py CHECKPOINT --input test_2016_flickr.en \\
        --ref test_2016_flickr.de --threads 1 --beam 4 --rounds 3
    python benchmarks/bench_int8.py --quick          # a random tiny model, a few seconds

Three decoders of the same checkpoint, loaded as ``nmt-generate`` loads them
(``Translator.from_checkpoint``): ``fp32``; ``int8`` (``--precision int8``: every nn.Linear
and the tied output projection dynamically quantized, nmt.models.quantize); ``int8-linear``
(the nn.Linear layers only, the output projection left in fp32: what quantizing the output
projection buys). Each translates the whole input once per round after a 16-sentence
warm-up; the rounds alternate the order of the decoders (fp32 first, then last, ...) so that a
machine getting busier or quieter during the run does not favour one of them. Reported per
decoder: the median and best wall time over the rounds, sentences/s, ms per decoder step, the
speed ratio int8/fp32 (median wall of int8 / median wall of fp32, below 1: int8 faster; and
the median of the same ratio taken round by round, steadier on a machine whose load drifts), the
share of lines identical to fp32's, and sacreBLEU against ``--ref`` computed by ``nmt-score
--ref REF --metric bleu`` on the translations of the first round (each round gives the same
translations; the script checks it). Run it on a quiet machine with a fixed --threads: every
time is a wall-clock measurement.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

VARIANTS = ("fp32", "int8", "int8-linear")


def load(variant: str, ckpts, beam: int, batch_size: int | None):
    from nmt.search.translator import BatchConfig, SearchConfig, Translator

    kw = dict(search=SearchConfig(beam=beam), batch=BatchConfig(batch_size=batch_size),
              device="cpu")
    if variant == "int8-linear":
        # loaded as int8 (an fp32 load packs its linear layers for oneDNN, where no nn.Linear
        # is left to quantize), then the output projection back to the fp32 matrix
        tr = Translator.from_checkpoint(ckpts, precision="int8", **kw)
        for m in tr.ensemble.models:
            m.quantized_output = None
        return tr
    return Translator.from_checkpoint(ckpts, precision=variant, **kw)


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_bytes("".join(x.replace("\n", " ") + "\n" for x in lines).encode("utf-8"))


def nmt_score_bleu(hyp: Path, ref: Path) -> dict:
    """sacreBLEU of ``hyp`` by the nmt-score command itself."""
    proc = subprocess.run([sys.executable, "-m", "nmt.cli.score", "--ref", str(ref),
                           "--hyp", str(hyp), "--metric", "bleu", "--json", "-q"],
                          capture_output=True, text=True, cwd=str(HERE.parent))
    if proc.returncode != 0:
        raise SystemExit(f"nmt-score failed: {proc.stderr.strip()}")
    rep = json.loads(proc.stdout)
    # nmt-score prints BLEU to one decimal; its JSON also has the unrounded figure.
    return {"bleu": round(rep.get("score_exact", rep["score"]), 2),
            "signature": rep["signature"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="*", help="checkpoint(s); several = an ensemble")
    ap.add_argument("--input", help="raw source sentences, one per line")
    ap.add_argument("--ref", help="references, one per line (default with --quick: the fp32 "
                    "translations)")
    ap.add_argument("--limit", type=int, default=0, help="use the first N lines (0: all)")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3, help="timed passes over the input per "
                    "decoder, alternating the decoders' order")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, from {', '.join(VARIANTS)} (fp32 is always run)")
    ap.add_argument("--hyp-prefix", help="keep the translations as PREFIX.VARIANT.txt")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--quick", action="store_true",
                    help="a random tiny model and synthetic input, to check the script works")
    args = ap.parse_args(argv)
    variants = ["fp32"] + [v for v in args.variants.split(",") if v and v != "fp32"]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {', '.join(bad)}")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")

    from nmt.perf import keep_freed_memory
    keep_freed_memory()  # as nmt-generate does

    import torch

    from bench_generate import StepTimer, checkpoints_and_lines

    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    work = Path(tmp.name)
    ckpts, lines = checkpoints_and_lines(args, ap, work)
    if args.ref is None and not args.quick:
        ap.error("give --ref (the references of --input)")

    decoders, timers, load_s = {}, {}, {}
    for v in variants:
        t = time.perf_counter()
        decoders[v] = load(v, ckpts, args.beam, args.batch_size)
        load_s[v] = time.perf_counter() - t
        timers[v] = StepTimer(decoders[v].ensemble)
        decoders[v].translate_results(lines[:16])            # warm-up
    walls = {v: [] for v in variants}
    steps_s = {v: [] for v in variants}
    steps = {v: 0 for v in variants}
    outputs: dict[str, list[str]] = {}
    stable = {v: True for v in variants}
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        for v in order:
            timers[v].reset()
            t = time.perf_counter()
            res = decoders[v].translate_results(lines)
            walls[v].append(time.perf_counter() - t)
            steps_s[v].append(timers[v].step_s)
            steps[v] = timers[v].steps
            texts = [x.text for x in res]
            if v not in outputs:
                outputs[v] = texts
            elif texts != outputs[v]:
                stable[v] = False

    prefix = Path(args.hyp_prefix) if args.hyp_prefix else work / "hyp"
    hyp_paths = {}
    for v in variants:
        hyp_paths[v] = Path(f"{prefix}.{v}.txt")
        write_lines(hyp_paths[v], outputs[v])
    ref = Path(args.ref) if args.ref else hyp_paths["fp32"]
    base = statistics.median(walls["fp32"])
    report = {"checkpoints": [str(c) for c in ckpts], "input": args.input, "ref": args.ref,
              "sentences": len(lines), "beam": args.beam, "threads": args.threads,
              "rounds": args.rounds, "torch": torch.__version__,
              "quantized_engine": torch.backends.quantized.engine, "variants": {}}
    for v in variants:
        med = statistics.median(walls[v])
        same = sum(a == b for a, b in zip(outputs[v], outputs["fp32"])) / max(len(lines), 1)
        report["variants"][v] = {
            **nmt_score_bleu(hyp_paths[v], ref),
            "wall_s": [round(w, 3) for w in walls[v]], "median_wall_s": round(med, 3),
            "best_wall_s": round(min(walls[v]), 3),
            "sentences_per_s": round(len(lines) / med, 2),
            "ms_per_decoder_step": round(1000 * statistics.median(steps_s[v])
                                         / max(steps[v], 1), 3),
            "decoder_steps": steps[v],
            "ratio_to_fp32": round(med / base, 3),
            # the same ratio round by round (each round runs every decoder once, close in
            # time): steadier than the ratio of medians on a machine whose load changes
            "paired_ratio_to_fp32": round(statistics.median(
                w / f for w, f in zip(walls[v], walls["fp32"])), 3),
            "identical_to_fp32": round(same, 4),
            "same_output_every_round": stable[v], "load_s": round(load_s[v], 3)}

    print(f"# int8 vs fp32 decoding: {len(lines)} sentences, beam {args.beam}, "
          f"{args.threads} thread(s), {args.rounds} alternating round(s), torch "
          f"{torch.__version__} ({torch.backends.quantized.engine})\n")
    print("| decoder | BLEU | median wall s | best wall s | sentences/s | ms/decoder step "
          "| time ratio to fp32 | same-round ratio | lines identical to fp32 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v, row in report["variants"].items():
        print(f"| {v} | {row['bleu']:.2f} | {row['median_wall_s']:.2f} | "
              f"{row['best_wall_s']:.2f} | {row['sentences_per_s']:.1f} | "
              f"{row['ms_per_decoder_step']:.2f} | {row['ratio_to_fp32']:.3f} | "
              f"{row['paired_ratio_to_fp32']:.3f} | {row['identical_to_fp32']:.1%} |")
    print("\ntime ratio: median wall / fp32's median wall; same-round ratio: the median over "
          "the rounds of wall / fp32's wall in that round (below 1: faster than fp32)")
    sig = report["variants"]["fp32"]["signature"]
    print(f"\nBLEU: nmt-score --metric bleu against {'the fp32 output' if not args.ref else ref} "
          f"({sig})")
    if not all(stable.values()):
        print("note: some decoder gave different translations in different rounds: "
              + ", ".join(v for v in variants if not stable[v]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
