"""nmt-train --init-from CKPT: a new run that starts from a trained model's weights,
with a fresh optimizer, learning-rate schedule and data position; the model configuration is
the checkpoint's, its vocabularies must be the data directory's."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.training.config import TrainConfig
from nmt.training.optim import noam_lr
from test_resume_checks import TINY, cli, corpus
from test_train_cli import run

# Options of a fine-tuning run: no --arch (the checkpoint's model), another warm-up.
FT = ["--max-tokens", "100", "--warmup", "7", "--threads", "1", "--save-interval-updates", "1",
      "--log-interval", "1"]


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def one_error_line(code, out, err, expected_code=1) -> str:
    assert code == expected_code and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nmt-train: error:"), err
    return lines[0]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A base model trained 4 updates on 'a', its average, and data dirs to fine-tune on."""
    root = tmp_path_factory.mktemp("init_from")
    words = [f"w{i}" for i in range(16)]
    dirs = {"a": corpus(root / "a", words),
            "bigger": corpus(root / "bigger", words + ["extra", "more"], seed=1)}
    # New in-domain data encoded with the base data's vocabulary.
    new = root / "new"
    new.mkdir()
    rng = np.random.default_rng(5)
    src = [" ".join(rng.choice(words[:8], size=rng.integers(3, 8))) for _ in range(30)]
    (new / "train.xx").write_text("\n".join(src) + "\n")
    (new / "train.yy").write_text("\n".join(" ".join(s.split()[::-1]) for s in src) + "\n")
    r = run(["nmt-preprocess", "-s", "xx", "-t", "yy", "--trainpref", str(new / "train"),
             "--reuse-vocab", dirs["a"], "--destdir", str(new / "bin")])
    assert r.returncode == 0, r.stderr
    dirs["new"] = r.stdout.strip()
    base = root / "base"
    code, _, err = cli([dirs["a"], *TINY, "--max-update", "4", "--save-dir", str(base)])
    assert code == 0, err
    avg = root / "avg.pt"
    code, _, err = cli(["--average", str(base / "checkpoint_2.pt"), str(base / "checkpoint_4.pt"),
                        "--output", str(avg)])
    assert code == 0, err
    return {**dirs, "base": base / "checkpoint_last.pt", "avg": avg, "root": root}


def test_weights_come_from_the_checkpoint_with_a_fresh_optimizer_and_schedule(env, tmp_path):
    # A copy of the checkpoint, removed before the rerun: resuming must not need it.
    source = tmp_path / "source.pt"
    shutil.copy(env["base"], source)
    base = load_checkpoint(source)
    save = tmp_path / "ft"
    args = [env["new"], "--init-from", str(source), *FT, "--max-update", "1",
            "--save-dir", str(save)]
    code, out, err = cli(args)
    assert code == 0, err
    assert out.strip() == str((save / "checkpoint_last.pt").resolve())
    assert f"initialized the model from {source} (update 4 of its run)" in err
    ck = load_checkpoint(save / "checkpoint_1.pt")
    # fresh optimizer and schedule: one update counted from 0, the new warm-up
    assert ck["progress"]["update"] == 1 and ck["progress"]["epoch"] == 1
    assert ck["scheduler"]["step_num"] == 1 and ck["scheduler"]["warmup"] == 7
    assert base["scheduler"]["step_num"] == 4 and base["scheduler"]["warmup"] == 4
    assert all(int(s["step"]) == 1 for s in ck["optimizer"]["state"].values())
    first = [json.loads(line) for line in (save / "train_log.jsonl").read_text().splitlines()]
    lr = next(r["lr"] for r in first if r["kind"] == "train" and r["update"] == 1)
    assert lr == pytest.approx(noam_lr(1, 64, 7))
    # the model is the checkpoint's, one small step away from its weights
    assert ck["model_config"] == base["model_config"]
    assert ck["train_config"]["arch"] == "transformer_tiny"
    assert ck["train_config"]["init_from"] == str(source.resolve())
    assert ck["data_dir"] == env["new"]
    moved = max_difference(ck["model"], base["model"])
    assert 0 < moved < 0.05, moved
    code, _, err = cli([env["new"], *TINY, "--max-update", "1", "--save-dir",
                        str(tmp_path / "scratch")])
    assert code == 0, err
    scratch = load_checkpoint(tmp_path / "scratch" / "checkpoint_1.pt")["model"]
    assert max_difference(scratch, base["model"]) > 10 * moved

    # the same command again, further: resumes the fine-tuning run, CKPT is not read
    source.unlink()
    args[args.index("--max-update") + 1] = "3"
    code, out, err = cli(args)
    assert code == 0, err
    assert f"--init-from {source} is not used: the run resumes from" in err
    assert "resumed from" in err and "at update 1" in err
    assert "initialized the model" not in err
    ck = load_checkpoint(save / "checkpoint_last.pt")
    assert ck["progress"]["update"] == 3 and ck["scheduler"]["step_num"] == 3
    assert ck["train_config"]["init_from"] == str(source.resolve())   # the record stays

    # another --init-from into the same --save-dir: the resume would carry on the old run
    other = tmp_path / "other.pt"
    other.write_bytes(b"")
    args[args.index("--init-from") + 1] = str(other)
    code, out, err = cli(args)
    assert code != 0 and out == ""
    assert f"--init-from {other}, but the run that" in err and "began from" in err, err
    assert "--no-resume" in err


def test_model_right_after_initialization_is_the_checkpoint(env, tmp_path):
    from nmt.data.datadir import DataDir
    from nmt.training.loop import Run

    cfg = TrainConfig(init_from=str(env["avg"]), max_update=1, max_tokens=100, warmup=7,
                      save_dir=str(tmp_path / "ft"), device="cpu")
    run_ = Run(cfg, DataDir.open(env["new"]), env["new"])
    saved = load_checkpoint(env["avg"])["model"]
    assert max_difference(run_.model.state_dict(), saved) == 0.0
    assert run_.trainer.num_updates == 0 and not run_.trainer.optimizer.state
    assert run_.cfg.init_from == str(env["avg"].resolve()) and cfg.arch is None
    assert run_.model_cfg.arch == "transformer_tiny" and run_.epoch == 1


def test_regularization_may_change_from_an_averaged_checkpoint(env, tmp_path):
    save = tmp_path / "ft"
    code, _, err = cli([env["new"], "--init-from", str(env["avg"]), *FT, "--max-update", "1",
                        "--arch", "transformer_tiny", "--override", "dropout=0.3",
                        "--override", "attention_dropout=0.1", "--override", "label_smoothing=0",
                        "--save-dir", str(save)])
    assert code == 0, err
    assert "an average of 2 checkpoints" in err
    got = load_checkpoint(save / "checkpoint_last.pt")["model_config"]
    want = load_checkpoint(env["avg"])["model_config"]
    assert (got["dropout"], got["attention_dropout"], got["label_smoothing"]) == (0.3, 0.1, 0.0)
    assert {k: v for k, v in got.items() if "dropout" not in k and k != "label_smoothing"} == \
        {k: v for k, v in want.items() if "dropout" not in k and k != "label_smoothing"}


@pytest.mark.parametrize("extra,expected", [
    (["--arch", "transformer_small"], "--arch transformer_small contradicts"),
    (["--override", "heads=2"], "(asked vs saved: heads 2 vs 4)"),
    (["--override", "layers=3", "--override", "dropout=0.2"], "encoder_layers 3 vs 2; decoder_layers 3 vs 2"),
    (["--no-share-all-embeddings"], "--no-share-all-embeddings contradicts"),
])
def test_a_contradicting_model_option_is_one_line(env, tmp_path, extra, expected):
    save = tmp_path / "ft"
    line = one_error_line(*cli([env["new"], "--init-from", str(env["base"]), *FT, *extra,
                                "--max-update", "1", "--save-dir", str(save)]),
                          expected_code=2)
    assert expected in line and str(env["base"]) in line, line
    assert not list(save.glob("checkpoint*.pt"))


def test_another_vocabulary_is_refused(env, tmp_path):
    save = tmp_path / "ft"
    line = one_error_line(*cli([env["bigger"], "--init-from", str(env["base"]), *FT,
                                "--max-update", "1", "--save-dir", str(save)]))
    assert "source vocabulary differs" in line and "20 vs 22 symbols" in line, line
    assert "cannot initialize from it" in line and f"--reuse-vocab {env['a']}" in line, line
    assert env["bigger"] in line
    assert not list(save.glob("checkpoint*.pt"))


@pytest.mark.parametrize("content", ["not a checkpoint\n", None])
def test_an_unreadable_checkpoint_is_one_line(env, tmp_path, content):
    path = tmp_path / "bad.pt"
    if content is not None:
        path.write_text(content)
    line = one_error_line(*cli([env["new"], "--init-from", str(path), *FT, "--max-update", "1",
                                "--save-dir", str(tmp_path / "ft")]))
    assert str(path) in line


def test_arch_default_is_unchanged_without_init_from():
    cfg = TrainConfig(max_update=1)
    assert cfg.arch is None and cfg.arch_name == "transformer_base"
    assert TrainConfig(arch="transformer_tiny", max_update=1).arch_name == "transformer_tiny"


def test_a_checkpoint_lends_its_vocabularies_to_new_data(env, tmp_path):
    """nmt-preprocess --reuse-vocab CKPT: the new data is encoded as with --reuse-vocab on the
    data directory the checkpoint was trained on (nmt's own subword kinds stay files, no
    codec.LANG.json), and the checkpoint fine-tunes on it; the reversed direction is refused
    in one line."""
    from nmt.data.datadir import DataDir

    new = env["root"] / "new"
    out = tmp_path / "bin"
    r = run(["nmt-preprocess", "-s", "xx", "-t", "yy", "--trainpref", str(new / "train"),
             "--reuse-vocab", str(env["base"]), "--destdir", str(out)])
    assert r.returncode == 0, r.stderr
    got, base = DataDir.open(out), DataDir.open(env["a"])
    assert got.src_codec.same_as(base.src_codec) and got.tgt_codec.same_as(base.tgt_codec)
    assert got.joined == base.joined and not list(out.glob("codec.*.json"))
    for lang in ("xx", "yy"):
        assert ((out / f"train.{lang}.0.bin").read_bytes()
                == (Path(env["new"]) / f"train.{lang}.0.bin").read_bytes())
    code, _, err = cli([str(out), "--init-from", str(env["base"]), *FT, "--max-update", "1",
                        "--save-dir", str(tmp_path / "ft")])
    assert code == 0, err

    r = run(["nmt-preprocess", "-s", "yy", "-t", "xx", "--trainpref", str(new / "train"),
             "--reuse-vocab", str(env["base"]), "--destdir", str(tmp_path / "reversed")])
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert lines[0].startswith("nmt-preprocess: error:") and "-s xx -t yy" in lines[0], lines[0]
    assert not (tmp_path / "reversed").exists()
