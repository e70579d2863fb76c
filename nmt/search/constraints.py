"""Constrained beam search for linearized trees: every hypothesis is a well-formed tree.

Parsing as translation (nmt.tasks.parsing) generates trees as bracket sequences,
``(S (NP XX )NP (VP XX )VP )S``. A model can emit sequences that are not trees; the
de-linearizer repairs them. With these constraints the beam never builds one: at each step the
tokens that would break the tree get probability 0, so every finished hypothesis
de-linearizes over its source words without any repair. Per beam row, a token is allowed when:

* ``(L`` (open): a source word is still without its ``XX`` (the new constituent needs one) and
  the length budget leaves room to close it as well (see below);
* ``)L`` (close): a constituent is open, its label is ``L`` (a bare ``)`` closes any label) and
  it already holds a word (an empty constituent would be pruned, a repair);
* ``XX``: fewer ``XX`` than source words so far;
* eos: every word has its ``XX`` and every constituent is closed;
* anything else (``<unk>``, a symbol that is neither a bracket nor ``XX``): never.

Lexicalized trees (examples/parsing_wsj/prepare.py --leaves words: ``(NP the dog )NP``) have
the words themselves as leaves; there the leaf rule reads: the next source word (mapped to its
target id, ``<unk>`` for an unknown word) and no other word, so the output spells the
sentence in order, and that word is scored with the probability the model gives to all
words together (whether a word comes now is the model's decision; which word is not). Such a
vocabulary (no ``XX``; brackets of at least three labels besides words) is recognized as a
tree vocabulary too (:func:`tree_leaves`).

Length budget: with ``max_len`` tokens allowed before eos (nmt.search.generator) and ``step``
tokens generated, ``budget = max_len - step`` tokens may still come before eos, and
``need = depth + (words - XX so far)`` of them are required to finish. ``XX`` and a close
lower ``need`` by one, so they always stay possible; an open raises it by one, so it is only
allowed when ``budget - need >= 2``; when ``budget == need`` only the required tokens remain.
A hypothesis therefore always has room to finish. The only exception is a source with more
words than ``max_len`` (a ``--max-len-a/-b`` too small for it): there the search emits ``XX``
until the forced eos, and that output still needs the de-linearizer's repair.

The state is a few tensors per beam row (sentence-major rows, as the generator's): a stack of
open label ids [R, D], depth, ``XX`` count, whether the innermost open constituent is still
empty, word count and length limit [R]. Vocabulary ids are classified once into tensors, so a
step costs a handful of [R, V] element-wise operations and no Python loop over rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.errors import UsageError
from nmt.specials import EOS, PAD, SPECIALS, UNK
from nmt.tasks.parsing import WORD_SLOT, is_bracket

FLOOR = 1e-30       # probability given to allowed tokens of a row where the model gives all 0


def _symbols(dictionary) -> list[str]:
    return list(getattr(dictionary, "symbols", dictionary))


_LABEL = re.compile(r"[A-Z]+")
MIN_LABELS = 3      # a lexicalized tree vocabulary has at least this many (L/)L pairs


def tree_leaves(dictionary) -> str | None:
    """What stands for a word in the linearized trees of a target dictionary: ``xx`` when it
    holds ``XX`` and every other symbol besides the specials is a bracket ``(L``/``)L``;
    ``words`` (lexicalized trees, prepare.py --leaves words) when it holds no ``XX`` but open
    and close brackets of at least MIN_LABELS phrase labels (upper-case letters), besides any
    words; None when it is not a tree vocabulary.

    Data directories and checkpoints record their task (nmt.tasks.task); this is how the task
    of one written before tasks were recorded is inferred, once, when it is read: a parsing
    data directory is an ordinary one (nmt-preprocess --subword none) whose target side is
    linearized trees (examples/parsing_wsj/prepare.py).
    """
    rest = _symbols(dictionary)[len(SPECIALS):]
    if WORD_SLOT in rest:
        return "xx" if all(s == WORD_SLOT or is_bracket(s) for s in rest) else None
    present = set(rest)
    labels = {s[1:] for s in rest if s[:1] == "(" and _LABEL.fullmatch(s[1:])
              and ")" + s[1:] in present}
    return "words" if len(labels) >= MIN_LABELS else None


def is_tree_vocabulary(dictionary) -> bool:
    """True when a target dictionary is that of linearized trees (:func:`tree_leaves`)."""
    return tree_leaves(dictionary) is not None


@dataclass
class TreeVocab:
    """Vocabulary ids by class, as [V] tensors: label id of each open / close bracket."""

    open_label: Tensor          # [V] long: label id of ``(L``, -1 for other symbols
    close_label: Tensor         # [V] long: label id of ``)L``, -1 for other symbols
    close_any: Tensor           # [V] bool: a bare ``)`` (closes whatever is open)
    leaf: Tensor                # [V] bool: stands for a word (XX; or any word and <unk>)
    xx: int                     # id of XX (-1 for lexicalized trees)
    size: int

    @property
    def lexical(self) -> bool:
        return self.xx < 0

    @classmethod
    def build(cls, dictionary) -> "TreeVocab":
        syms = _symbols(dictionary)
        # Asked for explicitly (tree_constraints_for(d, True)), any dictionary with XX will do.
        leaves = "xx" if WORD_SLOT in syms[len(SPECIALS):] else tree_leaves(dictionary)
        if leaves is None:
            raise UsageError(f"tree constraints need the target dictionary of linearized trees "
                             f"(brackets with {WORD_SLOT}, or brackets of at least {MIN_LABELS} "
                             f"labels with words); this one is not")
        labels: dict[str, int] = {}
        open_label = [-1] * len(syms)
        close_label = [-1] * len(syms)
        close_any = [False] * len(syms)
        for i, s in enumerate(syms):
            if i < len(SPECIALS) or len(s) < 1:
                continue
            if s[0] == "(" and len(s) > 1:
                open_label[i] = labels.setdefault(s[1:], len(labels))
            elif s == ")":
                close_any[i] = True
            elif s[0] == ")":
                close_label[i] = labels.setdefault(s[1:], len(labels))
        if leaves == "xx":
            xx = syms.index(WORD_SLOT)
            leaf = [i == xx for i in range(len(syms))]
        else:
            xx = -1
            leaf = [(i >= len(SPECIALS) and not is_bracket(s)) or i == UNK
                    for i, s in enumerate(syms)]
        return cls(torch.tensor(open_label), torch.tensor(close_label),
                   torch.tensor(close_any), torch.tensor(leaf), xx, len(syms))

    def to(self, device: torch.device) -> "TreeVocab":
        return TreeVocab(self.open_label.to(device), self.close_label.to(device),
                         self.close_any.to(device), self.leaf.to(device), self.xx, self.size)


class TreeConstraints:
    """The constraints for one target dictionary; ``start`` gives the state of one batch.

    The generator's protocol (nmt.search.generator.beam_search, ``constraints=``):
    ``start(src_tokens, beam, max_len)`` -> a state with ``restrict(probs, step)`` (zero the
    forbidden tokens in place) and ``advance(rows, tokens)`` (the state of the next beam).
    """

    def __init__(self, dictionary, src_dictionary=None):
        """``src_dictionary``: for lexicalized trees, the source dictionary, whose ids are
        mapped to the target's by symbol (the same dictionary, or None: ids are equal)."""
        self.vocab = TreeVocab.build(dictionary)
        self._on: dict[torch.device, TreeVocab] = {}
        self.src_to_tgt: Tensor | None = None
        if self.vocab.lexical and src_dictionary is not None and \
                _symbols(src_dictionary) != _symbols(dictionary):
            index = {s: i for i, s in enumerate(_symbols(dictionary))}
            self.src_to_tgt = torch.tensor([index.get(s, UNK) if i >= len(SPECIALS) else i
                                            for i, s in enumerate(_symbols(src_dictionary))])

    def start(self, src_tokens: Tensor, beam: int, max_len: Tensor) -> "TreeConstraintState":
        """src_tokens [B, S] (right-padded, eos-terminated: its words are the tokens that are
        neither pad nor eos); max_len [B] most tokens before eos; rows are b * beam + j."""
        dev = src_tokens.device
        if dev not in self._on:
            self._on[dev] = self.vocab.to(dev)
        words = (src_tokens.ne(PAD) & src_tokens.ne(EOS)).sum(1).repeat_interleave(beam)
        rows = words.numel()
        depth_cap = int(max_len.max()) // 2 + 1 if max_len.numel() else 1
        zeros = torch.zeros(rows, dtype=torch.long, device=dev)
        src = None
        if self.vocab.lexical:      # each row's source words, as target ids
            src = src_tokens if self.src_to_tgt is None else \
                self.src_to_tgt.to(dev)[src_tokens.clamp(max=self.src_to_tgt.numel() - 1)]
            src = src.repeat_interleave(beam, 0)
        return TreeConstraintState(
            self._on[dev], stack=torch.zeros(rows, min(depth_cap, 8), dtype=torch.long,
                                             device=dev),
            depth=zeros, n_xx=zeros.clone(), empty_top=zeros.bool(), n_words=words,
            max_len=max_len.to(dev).repeat_interleave(beam), depth_cap=depth_cap, src=src)


@dataclass
class TreeConstraintState:
    """Per beam row: open labels (stack [R, D], innermost at depth - 1), depth, XX so far,
    whether the innermost open constituent has no word yet, source words, length limit."""

    vocab: TreeVocab
    stack: Tensor
    depth: Tensor
    n_xx: Tensor
    empty_top: Tensor
    n_words: Tensor
    max_len: Tensor
    depth_cap: int              # no row can get deeper (max_len // 2 + 1)
    bound: int = 0              # no row is deeper yet (steps so far, at most depth_cap)
    src: Tensor | None = None   # [R, S] source words as target ids (lexicalized trees)

    def forbidden(self, step: int) -> Tensor:
        """[R, V] bool: the tokens row r may not emit after ``step`` tokens."""
        v = self.vocab
        budget = self.max_len - step                                  # [R]
        missing = self.n_words - self.n_xx                            # [R] words without XX
        need = self.depth + missing                                   # [R] tokens to finish
        can_open = (missing > 0) & (budget - need >= 2)
        can_close = (self.depth > 0) & ~self.empty_top
        top = self.stack.gather(1, (self.depth - 1).clamp(0, self.stack.size(1) - 1)
                                .unsqueeze(1))                        # [R, 1] innermost label
        allowed = ((v.open_label >= 0) & can_open.unsqueeze(1)) | (
            ((v.close_label == top) | v.close_any) & can_close.unsqueeze(1))
        if v.lexical:           # the leaf is the next source word itself
            allowed.scatter_(1, self.next_leaf(), (missing > 0).unsqueeze(1))
        else:
            allowed[:, v.xx] = missing > 0
        allowed[:, EOS] = need == 0
        return ~allowed

    def next_leaf(self) -> Tensor:
        """[R, 1] lexicalized trees: the target id of each row's next source word."""
        return self.src.gather(1, self.n_xx.clamp(max=self.src.size(1) - 1).unsqueeze(1))

    def restrict(self, probs: Tensor, step: int) -> None:
        """Zero the forbidden tokens of ``probs`` [R, V] in place. A row whose allowed tokens
        all have probability 0 gives them FLOOR instead, so that it can still finish.

        Lexicalized trees: the word is given (the next source word), so what the model decides
        is only *that* a word comes now; the next word gets the probability the model gives
        to all words together (its XX). Scored by its own probability instead, a word the
        model did not expect there would look improbable, and the search would rather open
        bracket after bracket than write it."""
        if probs.size(1) != self.vocab.size:
            raise UsageError(f"tree constraints: the model predicts {probs.size(1)} symbols "
                             f"but the target dictionary has {self.vocab.size}")
        forbidden = self.forbidden(step)
        leaf_mass = (probs * self.vocab.leaf).sum(1, keepdim=True) if self.vocab.lexical \
            else None
        probs.masked_fill_(forbidden, 0.0)
        if leaf_mass is not None:
            # Only rows with a word still to place: once all are, next_leaf() points past
            # them (at the source's eos, or padding), whose own probability must stay.
            nxt = self.next_leaf()
            write = ~forbidden.gather(1, nxt) & (self.n_words - self.n_xx > 0).unsqueeze(1)
            probs.scatter_(1, nxt, torch.where(write, leaf_mass, probs.gather(1, nxt)))
        stuck = probs.sum(1, keepdim=True).eq(0)                    # no sync with the device
        probs.masked_fill_(stuck & ~forbidden, FLOOR)

    def advance(self, rows: Tensor, tokens: Tensor) -> "TreeConstraintState":
        """The state after the beam is reselected and extended: new row i continues old row
        ``rows[i]`` (of this state's numbering) with ``tokens[i]``."""
        v = self.vocab
        stack, depth = self.stack.index_select(0, rows), self.depth.index_select(0, rows)
        opened = v.open_label[tokens] >= 0
        closed = (v.close_label[tokens] >= 0) | v.close_any[tokens]
        is_xx = v.leaf[tokens]
        # The depth grows by one per step at most: widen the stack from that bound, without
        # reading the depths back from the device.
        bound = min(self.bound + 1, self.depth_cap)
        if bound > stack.size(1):
            wider = min(2 * stack.size(1), self.depth_cap)
            stack = torch.cat([stack, stack.new_zeros(stack.size(0), wider - stack.size(1))], 1)
        pos = depth.clamp(max=stack.size(1) - 1).unsqueeze(1)      # where an open goes
        stack.scatter_(1, pos, torch.where(opened.unsqueeze(1),
                                           v.open_label[tokens].unsqueeze(1), stack.gather(1, pos)))
        # A close leaves the parent holding the closed (non-empty) constituent: not empty.
        empty_top = torch.where(opened, True, self.empty_top.index_select(0, rows) & ~closed)
        return TreeConstraintState(
            v, stack, (depth + opened.long() - closed.long()).clamp(0, stack.size(1)),
            self.n_xx.index_select(0, rows) + is_xx.long(), empty_top & ~is_xx,
            self.n_words.index_select(0, rows), self.max_len.index_select(0, rows),
            self.depth_cap, bound, None if self.src is None else self.src.index_select(0, rows))


def tree_constraints_for(dictionary, enabled: bool | None = None,
                         src_dictionary=None) -> TreeConstraints | None:
    """Constraints for a target ``dictionary``: ``enabled`` None (auto) gives them when it is a
    tree vocabulary (:func:`is_tree_vocabulary`), True always (UsageError without ``XX``),
    False never."""
    if enabled is False or (enabled is None and not is_tree_vocabulary(dictionary)):
        return None
    return TreeConstraints(dictionary, src_dictionary)


__all__ = ["TreeConstraints", "TreeConstraintState", "TreeVocab", "is_tree_vocabulary",
           "tree_leaves",
           "tree_constraints_for", "FLOOR"]
