#!/usr/bin/env python3
"""Where the time of nmt's beam search goes on a CPU: matmuls, attention, search bookkeeping,
Python.

    python benchmarks/profile_generate.py CKPT --input test.en --beam 4 --threads 2
    python benchmarks/profile_generate.py CKPT --input test.en --precision int8 --limit 300
    python benchmarks/profile_generate.py --quick          # random tiny model, seconds (tests)

The input is translated as nmt-generate translates it (``Translator`` with its defaults: batches
sorted by length, GNMT alpha 0.6, max length source + 50), but one batch at a time
(``--parallel-batches 1``, so that the profile is of each step's operations): once after a
warm-up, timed with perf_counter, then once more under torch.profiler (CPU). The encoder (with
the decoder's keys and values of its output, computed once per batch) and each decoder step
are marked (``nmt::encoder``, ``nmt::decoder_step``); everything else inside the call (choosing
the beams' next tokens, finishing hypotheses, reordering the cache, batching and detokenizing)
is the search and the rest.

The self CPU time of every profiled event goes to one category, as benchmarks/profile_train.py
assigns them (matmul kernels, attention, layer norm, indexing, elementwise, copies, ...; the
self time of events that are not aten ops, Python mostly, is "outside aten ops"), and to one of
the three phases by the marked region it runs in. The table gives milliseconds per sentence;
the profiler adds a cost per op, so the plain wall time is given beside the profiled one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_generate  # noqa: E402  (sibling scripts)
import profile_train  # noqa: E402

PHASES = ("decoder steps", "encoder", "search and the rest")
SPANS = {"nmt::decoder_step": PHASES[0], "nmt::encoder": PHASES[1]}
# The ensemble's methods (decoding's model calls) and the region each is marked with.
MARKED = {"encode": "nmt::encoder", "init_state": "nmt::encoder", "step": "nmt::decoder_step",
          "_step_logits": "nmt::decoder_step"}     # greedy search of one model: its logits


def mark(ensemble) -> None:
    """Wrap the ensemble's model calls (this instance only) in profiler regions."""
    import torch

    def marked(method, region: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            with torch.profiler.record_function(region):
                return method(*args, **kwargs)
        return call

    for name, region in MARKED.items():
        setattr(ensemble, name, marked(getattr(ensemble, name), region))


def phase_of(event, memo: dict[int, str]) -> str:
    """The phase of the marked region ``event`` runs in (itself included)."""
    key = id(event)
    if key not in memo:
        if event.name in SPANS:
            memo[key] = SPANS[event.name]
        elif event.cpu_parent is not None:
            memo[key] = phase_of(event.cpu_parent, memo)
        else:
            memo[key] = PHASES[2]
    return memo[key]


def translate(translator, lines: list[str]) -> tuple[float, int]:
    """(wall seconds, output subwords) of one translation of ``lines``, as nmt-generate's
    text output translates them (no scores)."""
    import torch

    t0 = time.perf_counter()
    with torch.profiler.record_function("nmt::translate"):
        results = translator.translate_results(lines, scores=False)
    wall = time.perf_counter() - t0
    return wall, sum(len(r.hypotheses[0].ids) for r in results if r.hypotheses)


def measure(args: argparse.Namespace, ckpts: list, lines: list[str]) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nmt.perf import keep_freed_memory
    from nmt.search.translator import BatchConfig, SearchConfig, Translator

    keep_freed_memory()                       # as nmt-generate runs (nmt.cli.console)
    torch.set_num_threads(args.threads)
    tr = Translator.from_checkpoint(ckpts, search=SearchConfig(beam=args.beam),
                                    # one batch at a time: each step's operations, on
                                    # every thread, are what the profile shows
                                    batch=BatchConfig(batch_size=args.batch_size, parallel=1),
                                    device="cpu", precision=args.precision)
    mark(tr.ensemble)
    translate(tr, lines[:16])                                # warm-up
    plain_wall, tokens = translate(tr, lines)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        prof_wall, _ = translate(tr, lines)
    events = prof.events()
    attribution = profile_train.Attribution(events)
    cells: dict[tuple[str, str], float] = defaultdict(float)
    memo: dict[int, str] = {}
    steps = 0
    for e in events:
        cells[(attribution.category(e), phase_of(e, memo))] += e.self_cpu_time_total / 1e6
        steps += e.name == "nmt::decoder_step"
    n = len(lines)
    return {"sentences": n, "beam": args.beam, "precision": args.precision,
            "threads": args.threads, "torch": torch.__version__,
            "plain_wall_s": plain_wall, "profiled_wall_s": prof_wall, "target_tokens": tokens,
            "sentences_per_s": n / plain_wall, "decoder_steps": steps,
            "ms_per_sentence": {f"{cat} | {phase}": 1e3 * s / n
                                for (cat, phase), s in cells.items()}}


def render(r: dict[str, Any]) -> str:
    cells: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, ms in r["ms_per_sentence"].items():
        cat, phase = key.split(" | ")
        cells[cat][phase] += ms
    total = sum(sum(row.values()) for row in cells.values())
    per_sentence = 1e3 * r["profiled_wall_s"] / r["sentences"]
    lines = [f"{r['sentences']} sentences, beam {r['beam']}, {r['precision']}, "
             f"{r['threads']} threads, torch {r['torch']}: {r['sentences_per_s']:.1f} "
             f"sentences/s unprofiled ({1e3 * r['plain_wall_s'] / r['sentences']:.2f} ms per "
             f"sentence), {per_sentence:.2f} ms per sentence profiled; "
             f"{r['decoder_steps']} decoder steps.",
             "",
             "| category (ms per sentence, profiled) | " + " | ".join(PHASES)
             + " | all | share |",
             "|---|" + "---:|" * (len(PHASES) + 2)]
    order = [c for c in profile_train.ORDER if c in cells] + sorted(
        c for c in cells if c not in profile_train.ORDER)
    order.sort(key=lambda c: -sum(cells[c].values()))
    for cat in order:
        row = cells[cat]
        all_ms = sum(row.values())
        lines.append(f"| {cat} | " + " | ".join(f"{row.get(p, 0.0):.3f}" for p in PHASES)
                     + f" | {all_ms:.3f} | {100 * all_ms / per_sentence:.1f}% |")
    phase_ms = [sum(cells[c].get(p, 0.0) for c in cells) for p in PHASES]
    lines.append("| **all** | " + " | ".join(f"{v:.3f}" for v in phase_ms)
                 + f" | {total:.3f} | {100 * total / per_sentence:.1f}% |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, argparse.ArgumentParser]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="*", help="checkpoint(s); several = an ensemble")
    ap.add_argument("--input", help="raw source sentences, one per line")
    ap.add_argument("--limit", type=int, default=0, help="use the first N lines (0: all)")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "int8"])
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("--quick", action="store_true",
                    help="a random transformer_tiny and synthetic lines (seconds; for tests)")
    args = ap.parse_args(argv)
    return args, ap


def main(argv: list[str] | None = None) -> int:
    args, ap = parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        ckpts, lines = bench_generate.checkpoints_and_lines(args, ap, Path(work))
        result = measure(args, ckpts, lines)
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
