"""More training trees from the ones a treebank has: substructure substitution.

Shi, Livescu and Gimpel (2021), "Substructure Substitution: Structured Data Augmentation for
NLP" (SUB2): a constituent of a training tree is replaced by a constituent with the same label
from another training tree, which gives a new sentence with a tree that is as well formed as
the two it came from: ``(S (NP the dog )NP (VP barks )VP )S`` and ``(NP a small cat )NP`` make
``(S (NP a small cat )NP (VP barks )VP )S``. For a parser trained on a few thousand trees the
new trees put known phrases into contexts the treebank did not show them in.

Only phrases are substituted (nodes above the preterminals; never the root, whose replacement
would be another training tree whole), and the donor always comes from another tree. The
result depends only on the trees, the number of copies and the seed.
"""

from __future__ import annotations

import random
from typing import Sequence

from nmt.tasks.trees import Tree

# Draws of a donor before a tree is given up on (every donor drawn spelled the phrase it
# would replace).
_TRIES = 8


def copy_tree(tree: Tree) -> Tree:
    """A deep copy (iterative: generated trees can be deeper than the recursion limit)."""
    root = Tree(tree.label)
    stack: list[tuple[Tree, Tree]] = [(tree, root)]
    while stack:
        src, dst = stack.pop()
        for child in src.children:
            if isinstance(child, Tree):
                twin = Tree(child.label)
                dst.children.append(twin)
                stack.append((child, twin))
            else:
                dst.children.append(child)
    return root


def phrase_slots(tree: Tree) -> list[tuple[Tree, int]]:
    """(parent, index) of every phrase below the root: ``parent.children[index]`` is a
    constituent that is not a preterminal."""
    slots: list[tuple[Tree, int]] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        for i, child in enumerate(node.children):
            if isinstance(child, Tree) and not child.is_preterminal:
                slots.append((node, i))
                stack.append(child)
    return slots


def substitution_copies(trees: Sequence[Tree], copies: int, seed: int = 1) -> list[Tree]:
    """``copies`` rounds over ``trees``, each making one new tree per tree: one of its phrases
    (chosen uniformly among those that another tree has a phrase of the same label for)
    replaced by a phrase of the same label from another tree (uniformly among that label's
    phrases in the other trees). A tree with no such phrase yields nothing, and so, rarely,
    does one whose draws of a donor all spelled the phrase it would replace; so there may be
    fewer than ``copies * len(trees)`` new trees. The originals are not among them and are
    left as they are. Deterministic for a given ``seed``."""
    if copies < 0:
        raise ValueError(f"copies must be >= 0, got {copies}")
    # every label's phrases in tree order, so that one tree's phrases of a label form one
    # block, pool[label][start:start + count] with (start, count) = block[label, i]: a donor
    # from another tree is drawn uniformly by skipping that block
    pool: dict[str, list[Tree]] = {}
    block: dict[tuple[str, int], tuple[int, int]] = {}
    for i, tree in enumerate(trees):
        for parent, k in phrase_slots(tree):
            node = parent.children[k]
            phrases = pool.setdefault(node.label, [])                # type: ignore[union-attr]
            start, count = block.get((node.label, i), (len(phrases), 0))  # type: ignore[union-attr]
            block[node.label, i] = (start, count + 1)                # type: ignore[union-attr]
            phrases.append(node)                                     # type: ignore[arg-type]
    rng = random.Random(seed)
    out: list[Tree] = []
    for _ in range(copies):
        for i, tree in enumerate(trees):
            new = _substitute_one(tree, i, pool, block, rng)
            if new is not None:
                out.append(new)
    return out


def _substitute_one(tree: Tree, index: int, pool: dict[str, list[Tree]],
                    block: dict[tuple[str, int], tuple[int, int]],
                    rng: random.Random) -> Tree | None:
    new = copy_tree(tree)
    # a phrase can be replaced when its label has phrases in other trees too
    slots = [(p, k) for p, k in phrase_slots(new)
             if len(pool[p.children[k].label])                       # type: ignore[union-attr]
             > block[p.children[k].label, index][1]]                 # type: ignore[union-attr]
    if not slots:
        return None
    parent, k = slots[rng.randrange(len(slots))]
    old = parent.children[k]
    label = old.label                                                # type: ignore[union-attr]
    donors = pool[label]
    lo, n_own = block[label, index]
    old_words = old.words()                                          # type: ignore[union-attr]
    for _ in range(_TRIES):
        r = rng.randrange(len(donors) - n_own)
        donor = donors[r + n_own if r >= lo else r]
        if donor.words() != old_words:
            parent.children[k] = copy_tree(donor)
            return new
    return None
