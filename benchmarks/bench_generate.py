#!/usr/bin/env python3
"""Benchmark nmt-generate's beam search: sentences/s, target tokens/s, where the time goes.

    python benchmarks/bench_generate.py CHECKPOINT --input test_2016_flickr.en --threads 2
    python benchmarks/bench_generate.py --quick          # a random tiny model, a few seconds

For each beam size (default 1 and 4) it reports sentences/s and target tokens/s (subwords,
eos included) over the whole input, the share of time spent in the decoder steps versus the
search bookkeeping, decoder steps and mean rows per step, then the time per sentence for buckets
of source lengths, and the peak resident memory. Model loading is timed separately and not
counted in the throughput. Compare with fairseq-generate on the same machine kind: 66.4
sentences/s (beam 4, 2 threads, 1,000 sentences of Multi30k test_2016_flickr, transformer_small).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def quick_setup(tmp: Path) -> tuple[list[Path], list[str]]:
    """A random transformer_tiny checkpoint with a whitespace codec, and 60 synthetic lines."""
    import numpy as np
    import torch

    import nmt
    from nmt.data.codec import whitespace_codec
    from nmt.data.dictionary import Dictionary
    from nmt.checkpoint import make_checkpoint, save_checkpoint

    words = [f"w{i}" for i in range(200)]
    codec = whitespace_codec(Dictionary(words))
    torch.manual_seed(0)
    cfg = nmt.get_arch("transformer_tiny", {"dropout": 0.0, "max_len_b": 10})
    v = len(codec.dictionary)
    model = nmt.build_model(cfg, v, v)
    path = tmp / "quick.pt"
    save_checkpoint(make_checkpoint(model_config=cfg, model_state=model.state_dict(),
                                    share_all_embeddings=True, src_codec=codec, tgt_codec=codec,
                                    data_dir=""), path)
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(words, int(rng.integers(1, 25)))) for _ in range(60)]
    return [path], lines


class StepTimer:
    """Wraps an EnsembleModel's encode/step to time them and count decoder rows."""

    def __init__(self, ensemble):
        self.ens = ensemble
        self.reset()
        self._step, self._encode = ensemble.step, ensemble.encode
        ensemble.step, ensemble.encode = self.step, self.encode

    def reset(self):
        self.step_s = self.encode_s = 0.0
        self.steps = self.rows = 0

    def step(self, prev, state):
        t = time.perf_counter()
        out = self._step(prev, state)
        self.step_s += time.perf_counter() - t
        self.steps += 1
        self.rows += prev.size(0)
        return out

    def encode(self, src):
        t = time.perf_counter()
        out = self._encode(src)
        self.encode_s += time.perf_counter() - t
        return out


def run_once(translator, lines):
    t = time.perf_counter()
    res = translator.translate_results(lines)
    wall = time.perf_counter() - t
    tokens = sum(len(r.hypotheses[0].ids) for r in res if r.hypotheses)
    return wall, tokens, res


def checkpoints_and_lines(args, ap, work: Path) -> tuple[list, list[str]]:
    """The checkpoints and input lines a decoding benchmark runs on: --quick's tiny model and
    synthetic input (made in ``work``), or CHECKPOINT(s) and --input, cut to --limit."""
    from nmt.io import read_lines

    if args.quick and not args.checkpoints:
        ckpts, lines = quick_setup(work)
    else:
        if not args.checkpoints or not args.input:
            ap.error("give CHECKPOINT(s) and --input (or --quick)")
        ckpts, lines = args.checkpoints, read_lines(args.input)
    return ckpts, (lines[:args.limit] if args.limit else lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="*", help="checkpoint(s); several = an ensemble")
    ap.add_argument("--input", help="raw source sentences, one per line")
    ap.add_argument("--limit", type=int, default=0, help="use the first N lines (0: all)")
    ap.add_argument("--beams", default="1,4", help="comma-separated beam sizes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16", "int8"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-buckets", action="store_true", help="skip time per sentence length")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--hyp-prefix", help="write each beam's translations to PREFIX.beamN.txt "
                    "(one line per input line, in order), e.g. to score them")
    ap.add_argument("--quick", action="store_true",
                    help="a random tiny model and synthetic input, to check the script works")
    args = ap.parse_args(argv)
    from nmt.perf import keep_freed_memory
    keep_freed_memory()  # as nmt-train / nmt-generate do

    import torch

    from nmt.search.translator import BatchConfig, SearchConfig, Translator

    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    ckpts, lines = checkpoints_and_lines(args, ap, Path(tmp.name))

    beams = [int(b) for b in args.beams.split(",")]
    report = {"threads": args.threads, "sentences": len(lines), "precision": args.precision,
              "checkpoints": [str(c) for c in ckpts], "beams": {}}
    print(f"# nmt-generate benchmark: {len(lines)} sentences, {args.threads} threads, "
          f"{args.precision}, torch {torch.__version__}\n")
    print("| beam | sentences/s | target tokens/s | wall s | decoder steps | rows/step "
          "| ms/step | in decoder | in search | encoder |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for beam in beams:
        t = time.perf_counter()
        tr = Translator.from_checkpoint(
            ckpts, search=SearchConfig(beam=beam),
            batch=BatchConfig(batch_size=args.batch_size, max_tokens=args.max_tokens),
            device=args.device, precision=args.precision)
        load_s = time.perf_counter() - t
        timer = StepTimer(tr.ensemble)
        run_once(tr, lines[: min(len(lines), 16)])          # warm-up (allocator, kernels)
        timer.reset()
        wall, tokens, res = run_once(tr, lines)
        if args.hyp_prefix:
            from nmt.io import atomic_write
            with atomic_write(f"{args.hyp_prefix}.beam{beam}.txt", "wb") as f:
                f.write("".join(r.text.replace("\n", " ") + "\n" for r in res).encode())
        search_s = wall - timer.step_s - timer.encode_s
        row = {"load_s": round(load_s, 3), "wall_s": round(wall, 3),
               "sentences_per_s": round(len(lines) / wall, 2),
               "target_tokens_per_s": round(tokens / wall, 1), "target_tokens": tokens,
               "decoder_steps": timer.steps,
               "rows_per_step": round(timer.rows / max(timer.steps, 1), 1),
               "ms_per_step": round((wall - timer.encode_s) * 1000 / max(timer.steps, 1), 2),
               "decoder_share": round(timer.step_s / wall, 3),
               "search_share": round(search_s / wall, 3),
               "encoder_share": round(timer.encode_s / wall, 3)}
        print(f"| {beam} | {row['sentences_per_s']:.1f} | {row['target_tokens_per_s']:.0f} | "
              f"{wall:.2f} | {timer.steps} | {row['rows_per_step']} | {row['ms_per_step']} | "
              f"{row['decoder_share']:.0%} | {row['search_share']:.0%} | "
              f"{row['encoder_share']:.0%} |")
        if not args.no_buckets:
            row["ms_per_sentence_by_source_length"] = buckets(tr, lines)
        report["beams"][beam] = row

    if not args.no_buckets:
        print("\n| source subwords | " + " | ".join(f"beam {b} ms/sentence" for b in beams)
              + " | sentences |")
        print("|---|" + "---|" * (len(beams) + 1))
        keys = list(report["beams"][beams[0]]["ms_per_sentence_by_source_length"])
        for key in keys:
            cells = [report["beams"][b]["ms_per_sentence_by_source_length"][key] for b in beams]
            print(f"| {key} | " + " | ".join(f"{c['ms']:.1f}" for c in cells)
                  + f" | {cells[0]['n']} |")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024     # KiB -> MiB (Linux)
    report["peak_rss_mib"] = round(peak, 1)
    print(f"\npeak RSS: {peak:.0f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    tmp.cleanup()
    return 0


def buckets(tr, lines) -> dict:
    """Time per sentence for source-length buckets, each bucket translated on its own."""
    lengths = [len(x) for x in tr.src_codec.encode_batch(lines)]
    edges = [(1, 10), (11, 20), (21, 30), (31, 10 ** 9)]
    out = {}
    for lo, hi in edges:
        sel = [line for line, n in zip(lines, lengths) if lo <= n <= hi]
        if not sel:
            continue
        t = time.perf_counter()
        tr.translate_results(sel)
        ms = (time.perf_counter() - t) * 1000 / len(sel)
        out[f"{lo}-{hi}" if hi < 10 ** 9 else f">={lo}"] = {"ms": round(ms, 2), "n": len(sel)}
    return out


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
