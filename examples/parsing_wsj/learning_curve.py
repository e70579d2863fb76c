#!/usr/bin/env python3
"""Test bracket F1 against the number of training sentences, from finished run.sh work dirs.

    examples/parsing_wsj/run.sh --sample PTB --train-sentences 1000 work-1k
    examples/parsing_wsj/run.sh --sample PTB --train-sentences 2000 work-2k
    examples/parsing_wsj/run.sh --sample PTB work-all
    python examples/parsing_wsj/learning_curve.py work-1k work-2k work-all --out curve.png

Each WORK_DIR gives one point: its treebank training sentences (the lines of
WORK/text/train.words; with --substitute, the treebank's trees among them, as prepare.py
recorded in WORK/text/splits.json), the test F1 under tree constraints
(WORK/results/bracket_f1.txt) and, when the run wrote it, without them
(bracket_f1.free.txt), each read only when run.sh's marker of its scoring step
(WORK/.done/score, score_free) is there. All points must share one test set
(WORK/text/test.gold) and one number of --substitute rounds (--sample: 2 unless another is
given). Prints a markdown table and draws the picture.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nmt.cli.console import handle_errors  # noqa: E402
from nmt.errors import NmtError  # noqa: E402
from nmt.io import atomic_write  # noqa: E402
from nmt.tasks.parsing import SPLITS_JSON  # noqa: E402

F1 = re.compile(r"^bracket-F1\|\S* = ([0-9.]+) ")


def read_f1(path: Path) -> float | None:
    """The F1 of an ``nmt-score --metric bracket-f1`` output file; None when absent."""
    if not path.exists():
        return None
    m = F1.match(path.read_text(encoding="utf-8"))
    if m is None:
        raise NmtError(f"{path}: not an nmt-score bracket-f1 line")
    return float(m.group(1))


def point(work: Path) -> dict:
    """One work dir's point. Its scores count only when run.sh's marker of the scoring step
    vouches for them: a rerun with other settings removes the markers of the steps it redoes,
    so one stopped midway leaves scores of the old settings that are not read. A folder with
    no .substitute marker was made before the option existed: 0 rounds."""
    train, test = work / "text" / "train.words", work / "results" / "bracket_f1.txt"
    done, gold = work / ".done", work / "text" / "test.gold"
    if not all(p.exists() for p in (train, test, gold, done / "score")):
        raise NmtError(f"{work}: not a finished run.sh work dir (no text/train.words, "
                       f"text/test.gold, results/bracket_f1.txt or .done/score)")
    marker = work / ".substitute"
    rounds = marker.read_text(encoding="utf-8").strip() if marker.exists() else ""
    rounds = rounds or "0"
    with open(train, encoding="utf-8") as f:
        trees = sum(1 for line in f if line.strip())
    sentences = trees if rounds == "0" else treebank_trees(work, rounds, trees)
    free = work / "results" / "bracket_f1.free.txt"
    return {"work": str(work), "sentences": sentences, "trees": trees, "substitute": rounds,
            "f1": read_f1(test),
            "f1_free": read_f1(free) if (done / "score_free").exists() else None,
            "test": gold.read_bytes()}


def treebank_trees(work: Path, rounds: str, trees: int) -> int:
    """How many of the ``trees`` lines of a --substitute work dir's train split are the
    treebank's (the rest are new trees made from them), as prepare.py recorded it."""
    record = work / "text" / SPLITS_JSON
    if not record.exists():
        raise NmtError(f"{work}: made with --substitute {rounds}, but text/{SPLITS_JSON} (how "
                       f"many train trees are the treebank's) is missing: an earlier prepare.py "
                       f"prepared it; run line 2 of {work}/.done/prepare again, REPO there "
                       f"being this checkout (it writes the same files, and the record)")
    try:
        train = json.loads(record.read_text(encoding="utf-8"))["train"]
        made, new = int(train["sentences"]), int(train["substituted"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise NmtError(f"{record}: not prepare.py's record of the splits ({e})") from None
    if made != trees:
        raise NmtError(f"{record} counts {made} train trees, text/train.words has {trees}: "
                       f"they were not prepared together")
    return made - new


def check_same_test(points: list[dict]) -> None:
    """Every point is scored on the same test sentences (the same text/test.gold) and trained
    with the same number of substitution rounds (else the curve mixes two recipes)."""
    for p in points[1:]:
        if p["substitute"] != points[0]["substitute"]:
            raise NmtError(f"{p['work']} was made with --substitute {p['substitute']} and "
                           f"{points[0]['work']} with {points[0]['substitute']}: not one "
                           f"learning curve")
        if p["test"] != points[0]["test"]:
            raise NmtError(f"{p['work']} and {points[0]['work']} were tested on different "
                           f"sentences (text/test.gold differs): not one learning curve")


def draw(points: list[dict], out: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.5), layout="tight")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = [p["sentences"] for p in points]
    ax.plot(xs, [p["f1"] for p in points], "o-", label="tree constraints")
    free = [(p["sentences"], p["f1_free"]) for p in points if p["f1_free"] is not None]
    if free:
        ax.plot(*zip(*free), "s--", label="free decoding")
    ax.set_xlabel("treebank training sentences")
    if points[0]["substitute"] != "0":
        ax.set_title(f"with {points[0]['substitute']} rounds of substituted trees", fontsize=10)
    ax.set_ylabel("test bracket F1 (EVALB)")
    ax.grid(alpha=0.3)
    ax.legend()
    with atomic_write(out, "wb") as f:
        fig.savefig(f, format="png", dpi=100)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("works", nargs=-1, required=True, metavar="WORK_DIR...")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the picture here (PNG).")
@handle_errors("learning_curve.py")
def main(works, out):
    """One point per finished run.sh WORK_DIR: test F1 against treebank training sentences."""
    points = sorted((point(Path(w)) for w in works), key=lambda p: p["sentences"])
    check_same_test(points)
    click.echo("| treebank sentences | training trees | test F1 (tree constraints) "
               "| test F1 (free) | work dir |")
    click.echo("|---:|---:|---:|---:|---|")
    for p in points:
        free = "-" if p["f1_free"] is None else f"{p['f1_free']:.2f}"
        click.echo(f"| {p['sentences']:,} | {p['trees']:,} | {p['f1']:.2f} | {free} "
                   f"| {p['work']} |")
    if out:
        draw(points, Path(out))


if __name__ == "__main__":
    main()
