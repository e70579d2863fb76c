"""Penn Treebank trees: read ``.mrg`` files, normalize them, print them one per line.

A :class:`Tree` is a label and a list of children; a preterminal is a tree whose only child is
a word (a ``str``). The reader accepts the treebank's own layout (several trees per file, each
over several lines, wrapped in an outer bracket without a label: ``( (S ...) )``) as well as one
bracketed tree per line, which is what parsers print and EVALB reads.

:func:`normalize` applies the usual preprocessing for parsing experiments:

* function tags and indices are dropped from phrase labels: ``NP-SBJ-1`` -> ``NP``,
  ``PP-TMP=3`` -> ``PP`` (gapping indices), ``-NONE-``/``-LRB-``/``-RRB-`` are kept as they are;
* empty elements (preterminals labelled ``-NONE-``) are removed, and so is every constituent
  that is left without words after that;
* unary chains (``(S (VP ...))``) and POS tags are kept.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Iterable, Union

from nmt.errors import NmtError
from nmt.io import iter_lines

Child = Union["Tree", str]

# Labels that start with '-' and must not be cut at their dashes.
_SPECIAL_LABELS = {"-NONE-", "-LRB-", "-RRB-", "-LCB-", "-RCB-", "-LSB-", "-RSB-"}
_TOKEN = re.compile(r"\(|\)|[^\s()]+")
# Words that would break the one-line bracketed format are written as PTB escapes.
_WORD_ESCAPES = {"(": "-LRB-", ")": "-RRB-"}


@dataclass
class Tree:
    label: str
    children: list[Child] = field(default_factory=list)

    @property
    def is_preterminal(self) -> bool:
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def words(self) -> list[str]:
        return [w for _, w in self.tagged_words()]

    def tags(self) -> list[str]:
        return [t for t, _ in self.tagged_words()]

    def tagged_words(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        stack: list[Tree] = [self]
        # Iterative depth-first walk: treebank trees can be deeper than Python's recursion limit
        # after repair of generated output.
        while stack:
            node = stack.pop()
            if node.is_preterminal:
                out.append((node.label, node.children[0]))  # type: ignore[arg-type]
                continue
            for child in reversed(node.children):
                if isinstance(child, Tree):
                    stack.append(child)
                else:  # a bare word directly under a phrase: give it an unknown tag
                    stack.append(Tree("XX", [child]))
        return out

    def __str__(self) -> str:
        return to_string(self)


def clean_label(label: str) -> str:
    """Drop function tags and indices: NP-SBJ-1 -> NP, NP=2 -> NP; keep -NONE-, -LRB-, ..."""
    if label in _SPECIAL_LABELS or not label:
        return label
    cut = re.search(r"[-=]", label[1:])
    return label if cut is None else label[: cut.start() + 1]


def to_string(tree: Tree) -> str:
    """One-line bracketed form, ``(S (NP (DT The) (NN dog)) (VP (VBZ barks)))``."""
    parts: list[str] = []
    # Explicit stack of (node, next child index) to stay iterative.
    stack: list[tuple[Child, int]] = [(tree, 0)]
    while stack:
        node, i = stack.pop()
        if isinstance(node, str):
            parts.append(" " + _WORD_ESCAPES.get(node, node))
            continue
        if i == 0:
            parts.append(("" if not parts else " ") + "(" + node.label)
        if i < len(node.children):
            stack.append((node, i + 1))
            stack.append((node.children[i], 0))
        else:
            parts.append(")")
    return "".join(parts)


def parse_tokens(tokens: list[str], name: str = "<tree>") -> list[Tree]:
    """Parse a token stream of brackets and symbols into the list of top-level trees."""
    trees: list[Tree] = []
    stack: list[Tree] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "(":
            label = ""
            if i + 1 < len(tokens) and tokens[i + 1] not in ("(", ")"):
                label = tokens[i + 1]
                i += 1
            node = Tree(label)
            if stack:
                stack[-1].children.append(node)
            stack.append(node)
        elif tok == ")":
            if not stack:
                raise NmtError(f"{name}: unbalanced brackets (too many ')')")
            node = stack.pop()
            if not stack:
                trees.append(node)
        else:
            if not stack:
                raise NmtError(f"{name}: text outside brackets: {tok!r}")
            stack[-1].children.append(tok)
        i += 1
    if stack:
        raise NmtError(f"{name}: unbalanced brackets (missing ')')")
    for t in trees:
        _check_shape(t, name)
    return trees


def _check_shape(tree: Tree, name: str) -> None:
    stack = [tree]
    while stack:
        node = stack.pop()
        words = [c for c in node.children if isinstance(c, str)]
        if words and (len(node.children) != 1):
            raise NmtError(f"{name}: constituent ({node.label} ...) mixes words and brackets "
                           f"or has several words")
        stack.extend(c for c in node.children if isinstance(c, Tree))


def unwrap(tree: Tree) -> Tree:
    """Remove the treebank's outer unlabelled bracket ``( (S ...) )``."""
    if tree.label == "" and len(tree.children) == 1 and isinstance(tree.children[0], Tree):
        return tree.children[0]
    return tree


def normalize(tree: Tree, strip_tags: bool = True, remove_empty: bool = True) -> Tree | None:
    """Function tags/indices dropped, -NONE- elements and emptied constituents removed.

    Returns None when nothing is left (a tree made only of empty elements).
    """
    def walk(node: Tree) -> Tree | None:
        if node.is_preterminal:
            if remove_empty and node.label == "-NONE-":
                return None
            return Tree(node.label, list(node.children))
        kids = [k for k in (walk(c) for c in node.children if isinstance(c, Tree)) if k is not None]
        if not kids:
            return None
        return Tree(clean_label(node.label) if strip_tags else node.label, kids)

    return walk(tree)


def read_trees_text(text: str, name: str = "<text>") -> list[Tree]:
    return parse_tokens(_TOKEN.findall(text), name)


def read_treebank_file(path: str | os.PathLike, normalized: bool = True) -> list[Tree]:
    """All trees of one ``.mrg`` file, unwrapped and (by default) normalized."""
    text = "\n".join(iter_lines(path))
    out = []
    for t in read_trees_text(text, str(path)):
        t = unwrap(t)
        if normalized:
            t = normalize(t)
            if t is None:
                continue
        out.append(t)
    return out


def with_root(tree: Tree, root: str = "TOP") -> Tree:
    """Wrap in a root node (EVALB's COLLINS.prm deletes TOP), unless it already is one."""
    return tree if tree.label == root else Tree(root, [tree])


def list_treebank_files(paths: Iterable[str | os.PathLike]) -> list[str]:
    """Expand directories (recursively) into their ``.mrg`` files, sorted by name."""
    files: list[str] = []
    for p in paths:
        p = str(p)
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                files.extend(os.path.join(root, n) for n in names if n.endswith(".mrg"))
        elif os.path.exists(p):
            files.append(p)
        else:
            raise NmtError(f"{p}: no such file or directory")
    return sorted(files, key=os.path.basename)
