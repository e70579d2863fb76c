#!/usr/bin/env python3
"""Lexically constrained decoding: its cost in sentences/s and its BLEU with 0, 1 and 3
constraints per sentence taken from the reference (the usual terminology experiment).

    python benchmarks/bench_constraints.py CHECKPOINT --src test_2016_flickr.en \\
        --ref test_2016_flickr.de --threads 2 --json constraints.json
    python benchmarks/bench_constraints.py --quick       # a random tiny model, a few seconds

Constraints: for each line, the distinct words of its reference (whitespace-separated,
punctuation stripped from their ends) of at least 3 characters with at least one letter, in
an order drawn with ``--seed`` and the line number; the first 1 or 3 of them, as raw text (a
line with fewer such words gets fewer). The 1-constraint setting uses the first word of the
3-constraint one. Each setting decodes the whole input with beam ``--beam`` (4) after a
16-sentence warm-up, model loading excluded, and reports sentences/s, the time relative to
unconstrained decoding, sacreBLEU against the reference (nmt.metrics, sacreBLEU's defaults),
and the share of constrained lines whose output contains every one of its constraints as a
word (the detokenized text, at word boundaries). Quick mode: the tiny model of
bench_generate.py, its synthetic input as source and reference (outputs are meaningless; it
checks that the script works). Every time is a wall-clock measurement: run it on a quiet
machine with a fixed --threads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

SETTINGS = (0, 1, 3)


def candidate_words(reference: str) -> list[str]:
    """The reference's distinct words usable as constraints, in order of appearance."""
    out: list[str] = []
    for token in reference.split():
        word = token.strip("".join(ch for ch in token
                                   if unicodedata.category(ch).startswith("P")))
        if len(word) >= 3 and any(ch.isalpha() for ch in word) and word not in out:
            out.append(word)
    return out


def draw_constraints(references: list[str], seed: int, most: int) -> list[list[str]]:
    """Per line, up to ``most`` of its reference words in a seeded random order."""
    import numpy as np

    out = []
    for i, ref in enumerate(references):
        words = candidate_words(ref)
        order = np.random.default_rng([seed, i]).permutation(len(words))
        out.append([words[j] for j in order[:most]])
    return out


def has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


def setting(translator, lines, refs, constraints) -> dict:
    """Decode ``lines`` once (with ``constraints``: per line a list, or None) and measure."""
    from nmt.metrics.scoring import corpus_score

    start = time.perf_counter()
    results = translator.translate_results(lines, constraints=constraints)
    wall = time.perf_counter() - start
    hyps = [r.text for r in results]
    bleu = corpus_score("bleu", hyps, [refs])
    row = {"wall_s": round(wall, 3), "sentences_per_s": round(len(lines) / wall, 2),
           "bleu": round(bleu.score, 2), "bleu_signature": bleu.signature}
    if constraints is not None:
        constrained = [(h, c) for h, c in zip(hyps, constraints) if c]
        row["constrained_lines"] = len(constrained)
        row["constraint_words"] = sum(len(c) for _, c in constrained)
        row["all_constraints_present"] = round(
            sum(all(has_word(h, w) for w in c) for h, c in constrained)
            / max(len(constrained), 1), 4)
    return row


def inputs(args, ap, work: Path) -> tuple[list, list[str], list[str]]:
    """Checkpoints, source lines and references: --quick's, or the files given."""
    from nmt.io import read_lines

    if args.quick and not args.checkpoints:
        from bench_generate import quick_setup

        ckpts, lines = quick_setup(work)
        refs = list(lines)
    else:
        if not args.checkpoints or not args.src or not args.ref:
            ap.error("give CHECKPOINT(s), --src and --ref (or --quick)")
        ckpts, lines, refs = args.checkpoints, read_lines(args.src), read_lines(args.ref)
        if len(lines) != len(refs):
            ap.error(f"--src has {len(lines)} lines but --ref has {len(refs)}")
    if args.lines:
        lines, refs = lines[:args.lines], refs[:args.lines]
    return ckpts, lines, refs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="*", help="checkpoint(s); several = an ensemble")
    ap.add_argument("--src", help="raw source sentences, one per line")
    ap.add_argument("--ref", help="their references, one per line (the constraints' source)")
    ap.add_argument("--lines", type=int, default=0, help="use the first N lines (0: all)")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1, help="seed of the constraints' draw")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--quick", action="store_true",
                    help="a random tiny model and synthetic input, to check the script works")
    args = ap.parse_args(argv)

    from nmt.perf import keep_freed_memory
    keep_freed_memory()  # as nmt-generate does

    import torch

    from nmt.search.translator import BatchConfig, SearchConfig, Translator

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:       # --quick's checkpoint
        ckpts, lines, refs = inputs(args, ap, Path(tmp))
        translator = Translator.from_checkpoint(ckpts, search=SearchConfig(beam=args.beam),
                                                batch=BatchConfig(batch_size=args.batch_size),
                                                device="cpu")
    translator.translate_results(lines[:16])                      # warm-up
    drawn = draw_constraints(refs, args.seed, max(SETTINGS))
    report = {"checkpoints": [str(c) for c in ckpts], "src": args.src, "ref": args.ref,
              "sentences": len(lines), "beam": args.beam, "threads": args.threads,
              "seed": args.seed, "torch": torch.__version__, "settings": []}
    for k in SETTINGS:
        row = setting(translator, lines, refs, [c[:k] for c in drawn] if k else None)
        report["settings"].append({"constraints": k, **row})
    if args.quick and not args.checkpoints:
        report["checkpoints"] = ["(--quick: a random tiny model, removed)"]
    base = report["settings"][0]["wall_s"]
    for row in report["settings"]:
        row["time_ratio_to_unconstrained"] = round(row["wall_s"] / max(base, 1e-9), 3)

    print(f"# Lexically constrained decoding: {len(lines)} sentences, beam {args.beam}, "
          f"{args.threads} thread(s), torch {torch.__version__}\n")
    print("| constraints per sentence | constrained lines | sentences/s | time vs none "
          "| BLEU | outputs with all their constraints |")
    print("|---|---|---|---|---|---|")
    for row in report["settings"]:
        share = row.get("all_constraints_present")
        print(f"| {row['constraints']} | {row.get('constrained_lines', 0)} | "
              f"{row['sentences_per_s']:.1f} | {row['time_ratio_to_unconstrained']:.2f} | "
              f"{row['bleu']:.2f} | {'-' if share is None else f'{share:.1%}'} |")
    print(f"\nConstraints: reference words of >= 3 characters (seed {args.seed}); BLEU: "
          f"sacreBLEU against {args.ref or 'the source (--quick)'} "
          f"({report['settings'][0]['bleu_signature']})")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
