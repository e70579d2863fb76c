"""Substructure substitution (nmt.tasks.augment) and prepare.py / run.sh --substitute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.errors import NmtError
from nmt.tasks.augment import copy_tree, phrase_slots, substitution_copies
from nmt.tasks.parsing import SplitSpec, prepare_treebank
from nmt.tasks.trees import read_treebank_file, read_trees_text, to_string

REPO = Path(__file__).resolve().parents[1]
MINI = REPO / "tests" / "fixtures" / "parsing" / "mini"


def trees(*texts: str):
    return [read_trees_text(t)[0] for t in texts]


DOG = "(S (NP (DT the) (NN dog)) (VP (VBZ barks)))"
CAT = "(S (NP (DT a) (NN cat)) (VP (VBZ sleeps)))"
OWL = "(S (NP (DT an) (NN owl)) (VP (VBZ hoots)))"


def phrases(text: str) -> list[str]:
    (t,) = trees(text)
    return [to_string(c) for c in t.children]


def at(tree, path):
    for i in path:
        tree = tree.children[i]
    return tree


def swap(source, new):
    """(the source's subtree, the new one) at the deepest phrase of ``source`` whose
    replacement by the subtree at the same place in ``new`` gives ``new`` (its ancestors'
    would too); None if none."""
    found = None
    for parent, k in phrase_slots(source):
        path = path_of(source, parent) + (k,)
        try:
            put = at(new, path)
        except (IndexError, AttributeError):
            continue
        old = at(source, path)
        if isinstance(put, str) or to_string(put) == to_string(old):
            continue
        trial = copy_tree(source)
        at(trial, path[:-1]).children[k] = put
        if to_string(trial) == to_string(new) and (found is None or len(path) > found[0]):
            found = (len(path), old, put)
    return None if found is None else found[1:]


def path_of(root, node):
    stack = [(root, ())]
    while stack:
        t, path = stack.pop()
        if t is node:
            return path
        stack.extend((c, path + (i,)) for i, c in enumerate(t.children) if not isinstance(c, str))
    raise ValueError("not in the tree")


def test_each_new_tree_swaps_one_phrase_for_one_of_the_same_label_from_another_tree():
    texts = (DOG, CAT, OWL)
    for seed in range(20):
        got = [to_string(t) for t in substitution_copies(trees(*texts), copies=1, seed=seed)]
        assert len(got) == 3
        for j, line in enumerate(got):
            mine, new = phrases(texts[j]), phrases(line)
            kept = [i for i in range(2) if new[i] == mine[i]]
            assert len(kept) == 1                      # one phrase of its own, one taken
            taken = 1 - kept[0]
            others = [phrases(text)[taken] for i, text in enumerate(texts) if i != j]
            assert new[taken] in others                # the same label, from another tree


def test_one_swap_each_on_treebank_trees_and_the_originals_are_left_alone():
    originals = [t for f in sorted(MINI.glob("*.mrg")) for t in read_treebank_file(f)]
    assert all(phrase_slots(t) for t in originals)        # so copy j comes from tree j
    before = [to_string(t) for t in originals]
    new = substitution_copies(originals, copies=1, seed=1)
    assert len(new) == len(originals) and [to_string(t) for t in originals] == before
    for j, (src, t) in enumerate(zip(originals, new)):
        old, put = swap(src, t)
        assert old.label == put.label and not old.is_preterminal
        donors = {to_string(c) for i, o in enumerate(originals) if i != j
                  for p, k in phrase_slots(o) if (c := p.children[k]).label == old.label}
        assert to_string(put) in donors and old.words() != put.words()
    again = substitution_copies(originals, copies=1, seed=1)
    assert [to_string(t) for t in again] == [to_string(t) for t in new]
    assert [to_string(t) for t in substitution_copies(originals, copies=1, seed=2)] != \
        [to_string(t) for t in new]


def test_a_phrase_only_its_own_tree_has_is_never_replaced():
    # ADJP and NP appear in one tree each: the only phrases to replace are the VPs, each by
    # the other tree's
    first, second = trees("(S (ADJP (JJ big)) (VP (VBZ is)))", "(S (NP (NN it)) (VP (VBD was)))")
    for seed in range(10):
        new = substitution_copies([first, second], copies=1, seed=seed)
        assert to_string(new[0]) == "(S (ADJP (JJ big)) (VP (VBD was)))"
        assert to_string(new[1]) == "(S (NP (NN it)) (VP (VBZ is)))"
    # nothing to replace: no tree at all
    lone = trees("(S (ADJP (JJ big)))", "(S (NP (NN it)))")
    assert substitution_copies(lone, copies=3) == []
    with pytest.raises(ValueError):
        substitution_copies(lone, copies=-1)


def test_copy_and_slots():
    (t,) = trees("(S (NP (NP (NN a)) (PP (IN of) (NP (NN b)))) (VP (VBZ c)))")
    c = copy_tree(t)
    assert to_string(c) == to_string(t) and c is not t and c.children[0] is not t.children[0]
    labels = sorted(parent.children[k].label for parent, k in phrase_slots(t))
    assert labels == ["NP", "NP", "NP", "PP", "VP"]      # phrases below the root only


def test_prepare_appends_new_trees_to_the_train_split_only(tmp_path):
    specs = [SplitSpec.parse("train=0001-0003"), SplitSpec.parse("test=0001-0001")]
    plain = prepare_treebank([MINI], tmp_path / "plain", specs, leaves="words", signatures=2)
    more = prepare_treebank([MINI], tmp_path / "more", specs, leaves="words", signatures=2,
                            substitute=2, substitute_seed=5)
    n = plain["train"]["sentences"]
    assert more["train"]["sentences"] == n + more["train"]["substituted"]
    assert 0 < more["train"]["substituted"] <= 2 * n
    for name in ("test.words", "test.sig", "test.lin", "test.gold", "test.tags"):
        assert (tmp_path / "more" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    for suffix in ("words", "sig", "lin", "gold", "tags"):
        lines = (tmp_path / "more" / f"train.{suffix}").read_text().splitlines()
        assert len(lines) == more["train"]["sentences"]
        # the originals first, as without --substitute (signatures count the originals only)
        assert lines[:n] == (tmp_path / "plain" / f"train.{suffix}").read_text().splitlines()
    with pytest.raises(NmtError, match="'train' split"):
        prepare_treebank([MINI], tmp_path / "x", [SplitSpec.parse("test=0001-0001")],
                         substitute=1)


def run_sh(*args, cwd=None):
    return subprocess.run(["bash", str(REPO / "examples" / "parsing_wsj" / "run.sh"),
                           *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=60)


def test_run_sh_substitute_reaches_the_first_prepare_only_and_holds_a_work_dir(tmp_path):
    work = tmp_path / "w"
    p = run_sh("--dry-run", "--sample", "--substitute", 1, "--extra-test", "more=0180-0199",
               "/data/ptb-sample", work)
    assert p.returncode == 0, p.stderr
    prepares = [line for line in p.stdout.splitlines() if "prepare.py" in line]
    assert len(prepares) == 2
    assert prepares[0].endswith("--leaves words --signatures 2 --substitute 1")
    assert "--substitute" not in prepares[1]
    # --sample makes two rounds unless told otherwise; --substitute 0 turns them off, and
    # the other recipes have none
    default = run_sh("--dry-run", "--sample", "/data/ptb-sample", work)
    assert [line for line in default.stdout.splitlines() if "prepare.py" in line][0].endswith(
        "--leaves words --signatures 2 --substitute 2")
    plain = run_sh("--dry-run", "--sample", "--substitute", 0, "/data/ptb-sample", work)
    assert plain.returncode == 0 and "--substitute" not in plain.stdout
    tiny = run_sh("--dry-run", "--tiny", MINI, tmp_path / "t")
    assert tiny.returncode == 0 and "prepare.py" in tiny.stdout
    assert "--substitute" not in tiny.stdout
    full = run_sh("--dry-run", "/data/ptb", tmp_path / "f")
    assert full.returncode == 0 and "prepare.py" in full.stdout
    assert "--substitute" not in full.stdout
    for bad in ("x", "01", "-1", "1.5"):
        b = run_sh("--dry-run", "--sample", "--substitute", bad, "/data/ptb-sample", work)
        assert b.returncode == 2 and "--substitute" in b.stderr
        assert len(b.stderr.splitlines()) == 1
    # a folder made with one number of rounds is refused with another (nmt-train would
    # resume the model trained on the other data)
    work.mkdir()
    (work / ".substitute").write_text("1\n")
    b = run_sh("--dry-run", "--sample", "/data/ptb-sample", work)
    assert b.returncode == 2 and "made with --substitute 1, not 2" in b.stderr
    assert "give --substitute 1 to go on with it" in b.stderr
    b = run_sh("--dry-run", "--sample", "--substitute", 0, "/data/ptb-sample", work)
    assert b.returncode == 2 and "made with --substitute 1, not 0" in b.stderr
    assert run_sh("--dry-run", "--sample", "--substitute", 1, "/data/ptb-sample",
                  work).returncode == 0
    # a folder prepared before the option existed holds the treebank's trees alone
    old = tmp_path / "old"
    (old / ".done").mkdir(parents=True)
    (old / ".done" / "prepare").write_text("2026-11-26T00:00:00Z\n")
    b = run_sh("--dry-run", "--sample", "--substitute", 1, "/data/ptb-sample", old)
    assert b.returncode == 2 and "made with --substitute 0, not 1" in b.stderr
    b = run_sh("--dry-run", "--sample", "/data/ptb-sample", old)
    assert b.returncode == 2 and "made with --substitute 0, not 2" in b.stderr
    assert run_sh("--dry-run", "--sample", "--substitute", 0, "/data/ptb-sample",
                  old).returncode == 0


def curve_dir(work, trees, rounds=None, f1="50.00"):
    """A finished run.sh work dir as learning_curve.py reads it: ``trees`` train lines."""
    for name in ("text/train.words", "text/test.gold", "results/bracket_f1.txt",
                 ".done/score"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
    (work / "text" / "train.words").write_text("w\n" * trees)
    (work / "text" / "test.gold").write_text("(TOP x)\n")
    (work / "results" / "bracket_f1.txt").write_text(
        f"bracket-F1|evalb:ours|labeled:yes = {f1} (R 50.00 / P 50.00)\n")
    (work / ".done" / "score").write_text("2026-12-02T00:00:00Z\n")
    if rounds is not None:
        (work / ".substitute").write_text(f"{rounds}\n")
    return work


def learning_curve(*works):
    return subprocess.run([sys.executable, str(REPO / "examples" / "parsing_wsj" /
                                               "learning_curve.py"), *map(str, works)],
                          capture_output=True, text=True, timeout=60)


def test_a_learning_curve_counts_the_treebank_trees_of_a_substituted_folder(tmp_path):
    # prepare.py's record of the splits: how many train trees are new
    specs = [SplitSpec.parse("train=0001-0003"), SplitSpec.parse("test=0001-0001")]
    out = tmp_path / "prep"
    summary = prepare_treebank([MINI], out, specs, substitute=2, substitute_seed=5)
    assert json.loads((out / "splits.json").read_text()) == summary
    n, new = summary["train"]["sentences"], summary["train"]["substituted"]
    assert len((out / "train.words").read_text().splitlines()) == n and 0 < new < n

    small = curve_dir(tmp_path / "small", 30, rounds=2, f1="60.00")
    big = curve_dir(tmp_path / "big", 90, rounds=2, f1="70.00")
    for work, made in ((small, 10), (big, 30)):
        (work / "text" / "splits.json").write_text(json.dumps(
            {"train": {"files": 1, "sentences": 3 * made, "substituted": 2 * made,
                       "words": 3 * made}}))
    p = learning_curve(big, small)
    assert p.returncode == 0, p.stderr
    rows = [r.split("|")[1:5] for r in p.stdout.splitlines() if r.startswith("| ")][1:]
    assert [[c.strip() for c in r] for r in rows] == [["10", "30", "60.00", "-"],
                                                      ["30", "90", "70.00", "-"]]
    # another number of rounds, or none, is another recipe: not one curve
    plain = curve_dir(tmp_path / "plain", 20, f1="55.00")
    p = learning_curve(small, plain)
    assert p.returncode != 0 and "was made with --substitute 0 and" in p.stderr
    assert "Traceback" not in p.stderr
    assert learning_curve(plain, curve_dir(tmp_path / "zero", 5, rounds=0)).returncode == 0
    # the record must describe the train split that is there
    (big / "text" / "train.words").write_text("w\n" * 89)
    p = learning_curve(big)
    assert p.returncode != 0 and "counts 90 train trees, text/train.words has 89" in p.stderr
    for bad in ("[1, 2]", '{"train": {"sentences": 89}}', "{"):
        (big / "text" / "splits.json").write_text(bad)
        p = learning_curve(big)
        assert p.returncode != 0 and "not prepare.py's record" in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1


def test_a_learning_curve_refuses_a_substituted_folder_without_the_record(tmp_path):
    # a folder prepared before prepare.py recorded its splits cannot say which trees are new
    work = curve_dir(tmp_path / "w", 3, rounds=1)
    p = learning_curve(work)
    assert p.returncode != 0 and "made with --substitute 1" in p.stderr
    assert "text/splits.json" in p.stderr and "Traceback" not in p.stderr
