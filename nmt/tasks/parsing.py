"""Constituency parsing as translation ("Grammar as a Foreign Language", Vinyals et al. 2015).

Source: the sentence's words, as tokenized in the treebank. Target: the tree, depth first, with
labelled opening and closing brackets and every POS tag replaced by ``XX``::

    (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .))
    ->  (S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S

Decisions (see nmt.tasks.trees.normalize for the treebank side): the root label ``TOP`` is not
part of the sequence; unary chains are kept (``(S (VP XX )VP )S``); preterminals become ``XX``,
so the linearization of a normalized tree is lossless except for the POS tags, which
:func:`delinearize` takes back from a tag list when one is given (else they stay ``XX``).

:func:`delinearize` turns any generated sequence into a tree over the input words:

* a ``)``/``)L`` closes the innermost open constituent whatever ``L`` says; one with nothing
  open is dropped (too many closing brackets);
* constituents still open at the end are closed (too few closing brackets);
* ``XX`` beyond the number of words is dropped; words left over when the ``XX`` run out are
  appended to the sentence's single top constituent (or under the root when there are several);
* constituents without words are removed; any other token (``<unk>``, stray text) is ignored.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from nmt.errors import NmtError
from nmt.io import atomic_write, iter_lines
from nmt.tasks.augment import substitution_copies
from nmt.tasks.signatures import Signatures
from nmt.tasks.trees import Tree, list_treebank_files, read_treebank_file, to_string, with_root

log = logging.getLogger("nmt.tasks.parsing")

#: what prepare_treebank wrote, per split (its return value), in the output folder
SPLITS_JSON = "splits.json"

WORD_SLOT = "XX"
ROOT = "TOP"
# What stands for a word in a linearized tree: XX (Vinyals et al., the paper's section 6.3), or
# the word itself ("lexicalized": the decoder sees which word it is at, and copying it from the
# source is easier to learn than counting XX; see examples/parsing_wsj/README.md).
LEAVES = ("xx", "words")


def is_bracket(tok: str) -> bool:
    return (tok[:1] == "(" and len(tok) > 1) or tok[:1] == ")"


def linearize(tree: Tree, leaves: str = "xx") -> list[str]:
    """Depth-first bracket sequence; TOP (if present) is not part of it. ``leaves``: ``xx``
    writes each word as XX, ``words`` as the word itself."""
    if leaves not in LEAVES:
        raise ValueError(f"leaves must be one of {LEAVES}, got {leaves!r}")
    if tree.label == ROOT and not tree.is_preterminal:
        out: list[str] = []
        for child in tree.children:
            if isinstance(child, Tree):
                out.extend(linearize(child, leaves))
        return out
    out = []
    # (node, entered) pairs: the second visit of a phrase emits its closing bracket.
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        node, entered = stack.pop()
        if node.is_preterminal:
            word = node.children[0] if node.children else WORD_SLOT
            out.append(WORD_SLOT if leaves == "xx" else str(word))
        elif entered:
            out.append(")" + node.label)
        else:
            out.append("(" + node.label)
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(node.children) if isinstance(c, Tree))
    return out


def delinearize(sequence: str | Sequence[str], words: Sequence[str],
                tags: Sequence[str] | None = None, root: str = ROOT,
                stats: Counter | None = None, leaves: str = "xx") -> Tree:
    """Rebuild a tree over ``words`` from a (possibly ill-formed) generated bracket sequence.

    ``tags`` (one per word) are the POS tags to put back; without them every tag is ``XX``.
    ``stats`` (optional) counts the repairs made, by kind. The result is rooted at ``root``.
    ``leaves="words"``: every token that is not a bracket stands for the next word (whatever
    it says: the tree is always over ``words``); with ``xx`` only ``XX`` does.
    """
    if leaves not in LEAVES:
        raise ValueError(f"leaves must be one of {LEAVES}, got {leaves!r}")
    tokens = sequence.split() if isinstance(sequence, str) else list(sequence)
    if tags is not None and len(tags) != len(words):
        raise ValueError(f"{len(tags)} tags for {len(words)} words")
    stats = stats if stats is not None else Counter()
    top = Tree(root)
    stack: list[Tree] = [top]
    n_used = 0

    def leaf(i: int) -> Tree:
        return Tree(tags[i] if tags is not None else WORD_SLOT, [words[i]])

    for tok in tokens:
        if tok == WORD_SLOT or (leaves == "words" and tok and not is_bracket(tok)):
            if n_used < len(words):
                stack[-1].children.append(leaf(n_used))
                n_used += 1
            else:
                stats["extra_xx"] += 1
        elif len(tok) > 1 and tok[0] == "(":
            node = Tree(tok[1:])
            stack[-1].children.append(node)
            stack.append(node)
        elif tok[0] == ")":
            if len(stack) == 1:
                stats["extra_close"] += 1
                continue
            if len(tok) > 1 and tok[1:] != stack[-1].label:
                stats["label_mismatch"] += 1
            stack.pop()
        else:
            stats["junk_token"] += 1
    if len(stack) > 1:
        stats["missing_close"] += len(stack) - 1
    if n_used < len(words):
        stats["missing_xx"] += len(words) - n_used
        phrases = [c for c in top.children if isinstance(c, Tree) and not c.is_preterminal]
        host = phrases[0] if len(phrases) == 1 and len(top.children) == 1 else top
        host.children.extend(leaf(i) for i in range(n_used, len(words)))
    _prune_empty(top, stats)
    return top


def _prune_empty(tree: Tree, stats: Counter) -> None:
    """Remove constituents without words (e.g. ``(NP )NP``), bottom-up, iteratively."""
    order: list[Tree] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(c for c in node.children if isinstance(c, Tree) and not c.is_preterminal)
    for node in reversed(order):  # children before parents
        kept = [c for c in node.children
                if not isinstance(c, Tree) or c.is_preterminal or c.children]
        if len(kept) != len(node.children):
            stats["empty_constituent"] += len(node.children) - len(kept)
            node.children = kept


def right_branching(words: Sequence[str], tags: Sequence[str] | None = None,
                    label: str = "S", root: str = ROOT) -> Tree:
    """Baseline: every suffix of the sentence of two or more words is a constituent ``label``."""
    leaves = [Tree(tags[i] if tags is not None else WORD_SLOT, [w]) for i, w in enumerate(words)]
    if not leaves:
        return Tree(root)
    node: Tree = leaves[-1]
    for lf in reversed(leaves[:-1]):
        node = Tree(label, [lf, node])
    if node.is_preterminal:  # one-word sentence
        node = Tree(label, [node])
    return Tree(root, [node])


# ---- files -------------------------------------------------------------------------------

@dataclass
class SplitSpec:
    name: str
    first: int
    last: int

    @classmethod
    def parse(cls, text: str) -> "SplitSpec":
        m = re.fullmatch(r"([A-Za-z][\w.]*)=(\d+)-(\d+)", text.strip())
        if not m:
            raise NmtError(f"bad split {text!r}: expected NAME=FIRST-LAST, e.g. train=0200-2199")
        first, last = int(m.group(2)), int(m.group(3))
        if first > last:
            raise NmtError(f"bad split {text!r}: {first} > {last}")
        return cls(m.group(1), first, last)


def file_number(path: str) -> int | None:
    """wsj_0172.mrg -> 172 (the file numbers that define the standard WSJ splits)."""
    m = re.search(r"(\d+)\D*$", os.path.basename(path))
    return int(m.group(1)) if m else None


def prepare_treebank(inputs: Iterable[str | os.PathLike], out_dir: str | os.PathLike,
                     splits: Sequence[SplitSpec], src_suffix: str = "words",
                     tgt_suffix: str = "lin", leaves: str = "xx",
                     signatures: int = 0,
                     train_sentences: int = 0,
                     substitute: int = 0, substitute_seed: int = 1) -> dict[str, dict[str, int]]:
    """Write, per split, ``{split}.{src_suffix}`` (words), ``{split}.{tgt_suffix}`` (linearized
    trees, :func:`linearize` with ``leaves``), ``{split}.gold`` (one normalized tree per line,
    rooted at TOP) and ``{split}.tags``.

    ``signatures`` N > 0: also ``{split}.sig``, the words with those seen fewer than N times in
    the ``train`` split replaced by their signature (:mod:`nmt.tasks.signatures`); lexicalized
    targets (``leaves="words"``) then carry the same signatures as leaves.

    ``train_sentences`` N > 0: the ``train`` split keeps only its first N sentences (in file
    order), before the signatures count its words; for learning curves.

    ``substitute`` K > 0: the ``train`` split is followed by K rounds of new trees made from
    its own by substructure substitution (:func:`nmt.tasks.augment.substitution_copies`, seeded
    by ``substitute_seed``); the signatures count the words of the original trees only, and
    the other splits are as they were.

    Returns {split: {"files": n, "sentences": n, "words": n}} (sentences: originals and new
    trees; with ``substitute``, the train split's "substituted": the new trees), also written
    to ``splits.json`` beside the files: how many of a train split's trees are the treebank's
    stays readable after the run (a learning curve counts those).
    """
    files = list_treebank_files(inputs)
    if not files:
        raise NmtError("no .mrg files found in the given inputs")
    if signatures and "train" not in {s.name for s in splits}:
        raise NmtError("signatures count the words of the 'train' split: give --split train=...")
    if substitute and "train" not in {s.name for s in splits}:
        raise NmtError("--substitute adds trees to the 'train' split: give --split train=...")
    if signatures and "sig" in (src_suffix, tgt_suffix):
        raise NmtError("with signatures, 'sig' is the suffix of the signature files: choose "
                       "another source or target suffix")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    read: dict[str, tuple[int, list[Tree]]] = {}
    for spec in splits:
        chosen = [f for f in files if (n := file_number(f)) is not None
                  and spec.first <= n <= spec.last]
        if not chosen:
            raise NmtError(f"split {spec.name}: no .mrg file numbered {spec.first}-{spec.last}")
        read[spec.name] = (len(chosen), [t for f in chosen for t in read_treebank_file(f)])
    if train_sentences:
        if "train" not in read:
            raise NmtError("--train-sentences limits the 'train' split: give --split train=...")
        n_files, trees = read["train"]
        if train_sentences > len(trees):
            raise NmtError(f"--train-sentences {train_sentences}: the train split has only "
                           f"{len(trees)} sentences")
        read["train"] = (n_files, trees[:train_sentences])
    sig = None
    if signatures:
        sig = Signatures.from_sentences(
            (t.words() for t in read["train"][1]), signatures)
    new: list[Tree] = []
    if substitute:
        n_files, trees = read["train"]
        new = substitution_copies(trees, substitute, substitute_seed)
        read["train"] = (n_files, trees + new)
    summary: dict[str, dict[str, int]] = {}
    for name, (n_files, trees) in read.items():
        files_out = _split_lines(trees, leaves, sig)
        names = {"src": src_suffix, "tgt": tgt_suffix}
        for key, lines in files_out.items():
            with atomic_write(out / f"{name}.{names.get(key, key)}", "w") as fh:
                fh.write("".join(line + "\n" for line in lines))
        summary[name] = {"files": n_files, "sentences": len(trees),
                         "words": sum(len(s.split()) for s in files_out["src"])}
        log.info("%s: %d files, %d sentences", name, n_files, len(trees))
    if substitute:
        summary["train"]["substituted"] = len(new)
    with atomic_write(out / SPLITS_JSON, "w") as fh:
        fh.write(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return summary


def _split_lines(trees: Sequence[Tree], leaves: str,
                 sig: Signatures | None) -> dict[str, list[str]]:
    """{"src", "tgt", "gold", "tags"[, "sig"]: one line per tree} of one split."""
    out: dict[str, list[str]] = {"src": [], "tgt": [], "gold": [], "tags": []}
    if sig is not None:
        out["sig"] = []
    for tree in trees:
        tw = tree.tagged_words()
        words = [w for _, w in tw]
        seq = linearize(tree, leaves)
        if sig is not None:
            mapped = sig.map(words)
            out["sig"].append(" ".join(mapped))
            if leaves == "words":       # the leaves are the words, in order
                it = iter(mapped)
                seq = [t if is_bracket(t) else next(it) for t in seq]
        out["src"].append(" ".join(words))
        out["tags"].append(" ".join(t for t, _ in tw))
        out["tgt"].append(" ".join(seq))
        out["gold"].append(to_string(with_root(tree)))
    return out


def leaves_of(sequences: Iterable[str]) -> str:
    """``xx`` when every token that is not a bracket is XX (or there is none), else ``words``."""
    for seq in sequences:
        if any(t != WORD_SLOT and not is_bracket(t) for t in seq.split()):
            return "words"
    return "xx"


def delinearize_file(words_path: str | os.PathLike, generated_path: str | os.PathLike | None,
                     tags_path: str | os.PathLike | None = None,
                     leaves: str | None = None) -> tuple[list[str], Counter]:
    """One tree line per input line: generated sequences (None: stdin) over the source words.
    ``leaves`` None: told from the sequences (:func:`leaves_of`)."""
    words = list(iter_lines(words_path))
    generated = list(iter_lines(generated_path))
    leaves = leaves or leaves_of(generated)
    if len(generated) != len(words):
        raise NmtError(f"{generated_path or '<stdin>'} has {len(generated)} lines but "
                       f"{words_path} has {len(words)}")
    tag_lines = list(iter_lines(tags_path)) if tags_path is not None else None
    if tag_lines is not None and len(tag_lines) != len(words):
        raise NmtError(f"{tags_path} has {len(tag_lines)} lines but {words_path} has {len(words)}")
    stats: Counter = Counter()
    trees = []
    for i, (w, g) in enumerate(zip(words, generated)):
        ws = w.split()
        ts = tag_lines[i].split() if tag_lines is not None else None
        if ts is not None and len(ts) != len(ws):
            raise NmtError(f"{tags_path}: line {i + 1}: {len(ts)} tags for {len(ws)} words")
        trees.append(to_string(delinearize(g, ws, ts, stats=stats, leaves=leaves)))
    return trees, stats
