#!/usr/bin/env python3
"""A BENCHMARKS.md section for a finished recipe run: command, wall time, learning curve, scores.

    python benchmarks/recipe_report.py runs/m30k-de --name "Multi30k en-de, converge" \
        --log checkpoints-converge/train_log.jsonl --scores results-converge/scores.txt \
        --command "python examples/multi30k/run.py MULTI30K --recipe converge" \
        --picture docs/curves/m30k_converge_en_de.png --out BENCHMARKS.md --marker m30k-de

Everything it prints is read from the run's own files: train_log.jsonl (validation loss and
BLEU at each checkpoint, the training summary with its wall time) and the scores file that
nmt-score wrote. The picture is drawn with matplotlib (a dependency of nmt).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# Validation metrics of train_log.jsonl, with their display names, in column order.
from nmt.training.curves import DECODING_METRICS as METRICS


def read_log(path: Path) -> list[dict]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def plot(valid: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    ups = [r["update"] for r in valid]
    ax.plot(ups, [r["loss"] for r in valid], "o-", color="tab:blue", label="valid loss")
    ax.set_xlabel("update")
    ax.set_ylabel("valid loss (nats/token)", color="tab:blue")
    key = next((k for k in METRICS if any(r.get(k) is not None for r in valid)), None)
    if key is not None:
        scored = [r for r in valid if r.get(key) is not None]
        ax2 = ax.twinx()
        ax2.plot([r["update"] for r in scored], [r[key] for r in scored], "s-",
                 color="tab:red", label=f"valid {METRICS[key]}")
        ax2.set_ylabel(f"valid {METRICS[key]}", color="tab:red")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def section(args, records: list[dict]) -> str:
    valid = [r for r in records if r.get("kind") == "valid"]
    # Averaged checkpoints and ensembles (nmt-train --average-*/--ensemble-best), validated at
    # the end; an ensemble has decoding scores only.
    averaged = [r for r in records if r.get("kind") in ("valid_averaged", "valid_ensemble")]
    summary = [r for r in records if r.get("kind") == "summary"]
    seconds = sum(r["seconds"] for r in summary)
    lines = [f"### {args.name}", "", f"Command: `{args.command}`", ""]
    if summary:
        s = summary[-1]
        part = (f"in the last of its {len(summary)} runs (it was resumed)" if len(summary) > 1
                else "over the run")
        lines.append(f"Training: {s['update']:,} updates in {seconds:,.0f} s "
                     f"({seconds / 3600:.2f} h, validation and checkpoints included; "
                     f"{s['tgt_tokens_per_s']:,.0f} target tokens/s {part}).")
    if args.picture:
        lines += ["", f"![learning curve]({args.picture})"]
    # The decoding metrics the run validated with (BLEU and chrF; bracket F1 for parsing).
    keys = [k for k in METRICS if any(r.get(k) is not None for r in valid + averaged)]
    lines += ["", "| update | valid loss | valid nll | " +
              " | ".join(f"valid {METRICS[k]}" for k in keys) + " |",
              "|---:|---:|---:|" + "---:|" * len(keys)]
    for r in valid + averaged:
        first = f"{r['update']:,}" if r in valid else r.get("checkpoint", "average")
        loss, nll = (f"{r[k]:.3f}" if r.get(k) is not None else "-" for k in ("loss", "nll_loss"))
        lines.append(f"| {first} | {loss} | {nll} | " +
                     " | ".join(str(r.get(k, "-")) for k in keys) + " |")
    if args.scores:
        text = "\n".join(Path(p).read_text(encoding="utf-8").strip() for p in args.scores)
        lines += ["", f"Test ({args.test_name}, decoded once at the end), `nmt-score` output:",
                  "", "```", text, "```"]
    if args.note:
        lines += ["", args.note]
    return "\n".join(lines) + "\n"


def write_into(out: Path, marker: str, text: str) -> None:
    start, end = f"<!-- recipe:{marker} -->", f"<!-- /recipe:{marker} -->"
    block = f"{start}\n{text}{end}"
    doc = out.read_text(encoding="utf-8") if out.exists() else ""
    if start in doc:
        doc = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda m: block, doc,
                     flags=re.S)
    else:
        doc = doc.rstrip() + "\n\n" + block + "\n"
    out.write_text(doc, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work_dir", type=Path)
    ap.add_argument("--name", required=True)
    ap.add_argument("--log", required=True, help="train_log.jsonl, relative to WORK_DIR")
    ap.add_argument("--scores", action="append",
                    help="nmt-score output, relative to WORK_DIR (repeatable)")
    ap.add_argument("--test-name", default="test_2016_flickr",
                    help="what the scores were measured on")
    ap.add_argument("--command", required=True, help="the command that made the run")
    ap.add_argument("--picture", help="PNG to write (path as linked from --out)")
    ap.add_argument("--note", help="a closing paragraph (e.g. where the goal was missed)")
    ap.add_argument("--out", type=Path, help="write the section into this markdown file")
    ap.add_argument("--marker", default="run", help="section marker in --out")
    args = ap.parse_args(argv)
    records = read_log(args.work_dir / args.log)
    if not records:
        sys.exit(f"recipe_report: {args.work_dir / args.log}: no records")
    if args.scores:
        args.scores = [str(args.work_dir / p) for p in args.scores]
    if args.picture:
        valid = [r for r in records if r.get("kind") == "valid"]
        plot(valid, Path(args.picture), args.name)
    text = section(args, records)
    if args.out:
        write_into(args.out, args.marker, text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
