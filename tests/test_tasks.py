"""The task is recorded, not guessed: nmt-preprocess writes it to meta.json (--task,
or inferred once from the target vocabulary), checkpoints carry it, and decoding and validation
follow what is recorded; files written before tasks were recorded are inferred once, at load."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

import nmt
from nmt.checkpoint import checkpoint_task, make_checkpoint, upgrade
from nmt.config import apply_overrides
from nmt.data.codec import whitespace_codec
from nmt.data.datadir import DataDir
from nmt.data.dictionary import Dictionary
from nmt.errors import NmtError
from nmt.search.translator import Translator
from nmt.tasks.parsing import SplitSpec, prepare_treebank
from test_parsing import MINI

TREES = ["(S", ")S", "(NP", ")NP", "(VP", ")VP", "XX"]


def run(args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)


def checkpoint(tgt_symbols, **task):
    cfg = apply_overrides(nmt.get_arch("transformer_tiny"), {})
    src = whitespace_codec(Dictionary([f"w{i}" for i in range(10)]))
    tgt = whitespace_codec(Dictionary(tgt_symbols))
    model = nmt.build_model(cfg, len(src.dictionary), len(tgt.dictionary),
                            share_all_embeddings=False)
    return make_checkpoint(model_config=cfg, model_state=model.state_dict(),
                           share_all_embeddings=False, src_codec=src, tgt_codec=tgt, **task)


@pytest.fixture(scope="module")
def treebank(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    prepare_treebank([MINI], root, [SplitSpec.parse("train=1-2"),
                                    SplitSpec.parse("valid=0003-0003")])
    return root


def preprocess(treebank, dest, *extra):
    return run(["nmt-preprocess", "-s", "words", "-t", "lin", "--trainpref",
                treebank / "train", "--validpref", treebank / "valid", "--destdir", dest,
                "--subword", "none", "--max-len", "0", "--max-len-ratio", "0", "-q", *extra])


def test_preprocess_records_the_task(treebank, tmp_path):
    r = preprocess(treebank, tmp_path / "auto")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "auto" / "meta.json").read_text())["task"] == "parsing"
    assert DataDir.open(tmp_path / "auto").task == "parsing"
    r = preprocess(treebank, tmp_path / "forced", "--task", "translation")
    assert r.returncode == 0, r.stderr
    assert DataDir.open(tmp_path / "forced").task == "translation"
    # parsing needs a tree vocabulary: the words side is none
    r = run(["nmt-preprocess", "-s", "lin", "-t", "words", "--trainpref", treebank / "train",
             "--destdir", tmp_path / "wrong", "--subword", "none", "--task", "parsing", "-q"])
    assert r.returncode == 1 and "--task parsing needs targets that are linearized trees" in \
        r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_meta_json_with_an_unknown_task_is_refused(treebank, tmp_path):
    assert preprocess(treebank, tmp_path / "d").returncode == 0
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    (tmp_path / "d" / "meta.json").write_text(json.dumps({**meta, "task": "poetry"}))
    with pytest.raises(NmtError, match="'task' must be one of translation, parsing"):
        DataDir.open(tmp_path / "d")


def test_decoding_follows_the_recorded_task():
    parsing = checkpoint(TREES)
    assert parsing["task"] == "parsing"                       # inferred when it was made
    assert Translator.from_checkpoint(parsing).constraints is not None
    # recorded translation on the same vocabulary: no tree constraints
    translation = checkpoint(TREES, task="translation")
    t = Translator.from_checkpoint(translation)
    assert t.task.name == "translation" and t.constraints is None
    # forced on as before (--tree-constraints)
    assert Translator.from_checkpoint(translation, tree_constraints=True).constraints is not None
    # a checkpoint written before tasks were recorded: inferred once, at load
    old = {k: v for k, v in parsing.items() if k != "task"} | {"format_version": 1}
    assert Translator.from_checkpoint(old).constraints is not None
    assert checkpoint_task(upgrade(dict(old))).name == "parsing"
    plain = checkpoint([f"v{i}" for i in range(12)])
    assert plain["task"] == "translation" and Translator.from_checkpoint(plain).constraints is None
    with pytest.raises(NmtError, match="records an unknown task 'poetry'"):
        Translator.from_checkpoint({**plain, "task": "poetry"})


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_training_records_the_data_directorys_task(treebank, tmp_path):
    assert preprocess(treebank, tmp_path / "bin", "--task", "translation").returncode == 0
    save = tmp_path / "ck"
    r = run(["nmt-train", tmp_path / "bin", "--arch", "transformer_tiny", "--max-update", "2",
             "--warmup", "2", "--save-dir", save, "--threads", "1"])
    assert r.returncode == 0, r.stderr
    ck = torch.load(save / "checkpoint_last.pt", weights_only=True)
    assert ck["task"] == "translation"          # recorded, although the vocabulary is trees
    # bracket-F1 validation is parsing's: refused on translation data, in one line
    r = run(["nmt-train", tmp_path / "bin", "--arch", "transformer_tiny", "--max-update", "2",
             "--warmup", "2", "--save-dir", tmp_path / "ck2", "--threads", "1",
             "--best-checkpoint-metric", "bracket-f1"])
    assert r.returncode == 2, r.stderr
    assert "bracket-f1 scores parsing, but this data directory's task is translation" in r.stderr
