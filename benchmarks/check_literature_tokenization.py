#!/usr/bin/env python3
"""Does `nmt-score -m multi-bleu --lowercase` tokenize the references as the literature did?

    python benchmarks/check_literature_tokenization.py RAW_DIR TOK_DIR \
        --split test_2016_flickr --split val --lang de --lang fr

RAW_DIR holds the raw Multi30k task-1 files (``test_2016_flickr.de``, ...); TOK_DIR the
tokenized release of the Multi30k repository (``data/task1/tok``:
``test_2016_flickr.lc.norm.tok.de``, ...), which the published Multi30k systems trained on and
were scored against. For every split and language, each raw reference line goes through
nmt's literature preparation (lowercase, Moses punctuation normalization, Moses tokenization
with escaping; ``nmt.metrics.tok_bleu.literature_prepare``) and is compared, token by token,
with the released line. Prints one row per file and the lines that differ; exits 1 if a file's
line count differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nmt.io import read_lines  # noqa: E402
from nmt.metrics.tok_bleu import literature_prepare  # noqa: E402


def compare(raw: Path, tok: Path, lang: str) -> tuple[int, list, int, int]:
    ours = [literature_prepare(x, lang, True) for x in read_lines(raw)]
    theirs = read_lines(tok)
    if len(ours) != len(theirs):
        sys.exit(f"error: {raw} has {len(ours)} lines, {tok} {len(theirs)}")
    differ = [(a, b) for a, b in zip(ours, theirs) if a.split() != b.split()]
    return (len(ours), differ, sum(len(a.split()) for a in ours),
            sum(len(b.split()) for b in theirs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw_dir", type=Path)
    ap.add_argument("tok_dir", type=Path)
    ap.add_argument("--split", action="append", default=None)
    ap.add_argument("--lang", action="append", default=None)
    ap.add_argument("--show", type=int, default=3, help="differing lines shown per file")
    args = ap.parse_args()
    rows = []
    for split in args.split or ["test_2016_flickr", "val"]:
        for lang in args.lang or ["de", "fr"]:
            raw = args.raw_dir / f"{split}.{lang}"
            tok = args.tok_dir / f"{split}.lc.norm.tok.{lang}"
            if not raw.is_file() or not tok.is_file():
                sys.exit(f"error: need both {raw} and {tok}")
            rows.append((f"{split}.{lang}", *compare(raw, tok, lang)))
    print("| file | lines | lines that differ | tokens (nmt) | tokens (release) |")
    print("|---|---:|---:|---:|---:|")
    for name, n, differ, a, b in rows:
        print(f"| {name} | {n:,} | {len(differ)} | {a:,} | {b:,} |")
    for name, _, differ, _, _ in rows:
        for a, b in differ[:args.show]:
            print(f"{name}\n  nmt:      {a.strip()}\n  release:  {b.strip()}")


if __name__ == "__main__":
    main()
