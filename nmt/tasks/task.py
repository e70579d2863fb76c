"""The task a model was trained for, recorded in its data directory and checkpoint, and what the
task supplies: its decoding constraints and how its validation is scored.

    task = nmt.checkpoint.checkpoint_task(ckpt)  # recorded (inferred for old files as they load)
    task.constraints(tgt_dictionary, src_dictionary, enabled=None)
    task.references(metric, data, split, n)      # None: the raw target file, as for any task
    task.hypotheses(metric, hyps, refs, tgt_dictionary)

``translation`` decodes freely and scores BLEU/chrF against the raw target sentences.
``parsing`` (constituency parsing as translation into linearized trees, section 6.3) decodes
well-formed trees by construction and scores bracket F1: its hypotheses are de-linearized over
the gold trees' words and compared with the gold trees (``<prefix>.gold``).

A data directory or checkpoint written before tasks were recorded has its task inferred once,
when it is read, from its target vocabulary (a vocabulary of brackets is parsing's).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

from nmt.errors import NmtError, UsageError

TASKS = ("translation", "parsing")
log = logging.getLogger("nmt.tasks")


class Task:
    """Translation; the base of every task."""

    name = "translation"

    def constraints(self, tgt_dictionary, src_dictionary=None, enabled: bool | None = None):
        """Decoding constraints (nmt.search.constraints), or None. ``enabled`` None: the
        task's default (none for translation); True/False: forced on or off."""
        from nmt.search.constraints import tree_constraints_for

        return tree_constraints_for(tgt_dictionary, bool(enabled), src_dictionary)

    def references(self, metric: str, data, split: str, n: int):
        """The references ``metric`` scores ``split`` against (validate.References), or None
        for the split's raw target sentences."""
        if metric == "bracket-f1":
            raise UsageError(f"--best-checkpoint-metric bracket-f1 scores parsing, but this "
                             f"data directory's task is {self.name}")
        return None

    def hypotheses(self, metric: str, hyps: Sequence[str], refs, tgt_dictionary) -> list[str]:
        """What ``metric`` scores of the decoded hypotheses."""
        return list(hyps)

    def __repr__(self) -> str:
        return f"Task({self.name})"


class ParsingTask(Task):
    name = "parsing"

    def constraints(self, tgt_dictionary, src_dictionary=None, enabled: bool | None = None):
        from nmt.search.constraints import tree_constraints_for

        return tree_constraints_for(tgt_dictionary, enabled, src_dictionary)

    def references(self, metric: str, data, split: str, n: int):
        if metric != "bracket-f1":
            return None
        from nmt.data.references import References, check_count, split_file
        from nmt.io import read_lines

        gold = split_file(data, split, "gold")
        if gold is None:
            raise NmtError(f"--best-checkpoint-metric bracket-f1 needs the gold trees of the "
                           f"'{split}' split (<prefix>.gold beside the files it was made from, "
                           f"as examples/parsing_wsj/prepare.py writes them)")
        lines = read_lines(gold)
        check_count(lines, n, gold)
        # The trees are built over the gold trees' own words: decoding the binarized source
        # would give <unk> for unknown words (and a signature source, prepare.py --signatures,
        # its signatures), which EVALB rejects as words that differ from the gold's.
        words = [" ".join(_tree_words(line, f"{gold}:{i + 1}")) for i, line in enumerate(lines)]
        return References(lines, str(gold), words)

    def hypotheses(self, metric: str, hyps: Sequence[str], refs, tgt_dictionary) -> list[str]:
        if metric != "bracket-f1":
            return list(hyps)
        from nmt.search.constraints import tree_leaves
        from nmt.tasks.parsing import delinearize
        from nmt.tasks.trees import to_string

        leaves = tree_leaves(tgt_dictionary) or "xx"
        sources = refs.sources or [""] * len(hyps)
        return [to_string(delinearize(h, sources[i].split(), leaves=leaves))
                for i, h in enumerate(hyps)]


def _tree_words(line: str, name: str) -> list[str]:
    from nmt.tasks.trees import read_trees_text

    trees = read_trees_text(line, name)
    if len(trees) != 1:
        raise NmtError(f"{name}: expected one tree, found {len(trees)}")
    return trees[0].words()


_TASKS: dict[str, Task] = {"translation": Task(), "parsing": ParsingTask()}


def get_task(name: str) -> Task:
    if name not in _TASKS:
        raise UsageError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return _TASKS[name]


def infer_task(tgt_dictionary) -> Task:
    """The task of a model or data directory that records none: parsing when its target
    vocabulary is one of linearized trees (nmt.search.constraints.is_tree_vocabulary)."""
    from nmt.search.constraints import is_tree_vocabulary

    return _TASKS["parsing" if is_tree_vocabulary(tgt_dictionary) else "translation"]


def recorded_task(value: Any, what: str, tgt_dictionary) -> Task:
    """The task ``value`` records (a name, or None for files written before tasks were
    recorded: then inferred from the target vocabulary)."""
    if value is None:
        return infer_task(tgt_dictionary)
    return get_recorded_task(value, what)


def get_recorded_task(value: Any, what: str) -> Task:
    """The task named ``value``, which ``what`` records."""
    if value not in _TASKS:
        raise NmtError(f"{what} records an unknown task {value!r} (this nmt knows "
                       f"{', '.join(TASKS)})")
    return _TASKS[value]


def data_task(data) -> Task:
    """The task of a data directory (nmt.data.datadir.DataDir.task), or inferred."""
    where = str(Path(getattr(data, "path", "data directory")))
    return recorded_task(getattr(data, "task", None), where, data.tgt_codec.dictionary)


__all__ = ["Task", "ParsingTask", "TASKS", "get_task", "infer_task", "recorded_task",
           "get_recorded_task", "data_task"]
