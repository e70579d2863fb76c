"""Resuming continues only the run a checkpoint belongs to: another vocabulary is
refused in one line, changed optimisation options are named, never taken silently."""

import numpy as np
import pytest
from click.testing import CliRunner

from nmt.checkpoint import load_checkpoint
from nmt.cli.train import main as train_main
from test_train_cli import run

TINY = ["--arch", "transformer_tiny", "--max-tokens", "100", "--warmup", "4", "--threads", "1",
        "--save-interval-updates", "2"]


def corpus(directory, words, seed=0):
    """A reversal corpus over ``words``, binarized by the real nmt-preprocess."""
    directory.mkdir()
    rng = np.random.default_rng(seed)
    for split, n in (("train", 40), ("valid", 6)):
        src = [" ".join(rng.choice(words, size=rng.integers(2, 7))) for _ in range(n)]
        (directory / f"{split}.xx").write_text("\n".join(src) + "\n")
        (directory / f"{split}.yy").write_text(
            "\n".join(" ".join(s.split()[::-1]) for s in src) + "\n")
    r = run(["nmt-preprocess", "-s", "xx", "-t", "yy", "--trainpref", str(directory / "train"),
             "--validpref", str(directory / "valid"), "--destdir", str(directory / "bin"),
             "--subword", "none", "--joined-dictionary"])
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def cli(args):
    r = CliRunner().invoke(train_main, args, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume_checks")
    words = [f"w{i}" for i in range(16)]
    return {"a": corpus(root / "a", words),
            "same": corpus(root / "same", words, seed=0),      # identical vocabulary
            "bigger": corpus(root / "bigger", words + ["extra", "more"], seed=1),
            "renamed": corpus(root / "renamed", [w.replace("w", "v") for w in words])}


@pytest.mark.parametrize("other,detail", [("bigger", "20 vs 22 symbols"),
                                          ("renamed", "symbol 4 is 'w")])
def test_resume_on_another_vocabulary_is_refused(dirs, tmp_path, other, detail):
    save = tmp_path / "ckpt"
    code, _, err = cli([dirs["a"], *TINY, "--max-update", "2", "--save-dir", str(save)])
    assert code == 0, err
    before = (save / "checkpoint_last.pt").read_bytes()
    code, out, err = cli([dirs[other], *TINY, "--max-update", "4", "--save-dir", str(save)])
    assert code == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nmt-train: error:"), err
    assert "source vocabulary differs" in lines[0] and detail in lines[0], lines[0]
    assert "--no-resume" in lines[0] and dirs[other] in lines[0]
    assert (save / "checkpoint_last.pt").read_bytes() == before      # nothing was trained
    # --no-resume starts afresh on the new data, as the message says
    code, out, err = cli([dirs[other], *TINY, "--max-update", "2", "--save-dir", str(save),
                          "--no-resume"])
    assert code == 0, err
    assert load_checkpoint(save / "checkpoint_last.pt")["data_dir"] == dirs[other]


def test_resume_names_changed_options_and_another_data_directory(dirs, tmp_path):
    save = tmp_path / "ckpt"
    code, _, err = cli([dirs["a"], *TINY, "--max-update", "2", "--save-dir", str(save)])
    assert code == 0, err
    args = [a if a != "4" else "8" for a in TINY] + ["--lr-scale", "2"]   # --warmup 8
    code, out, err = cli([dirs["same"], *args, "--max-update", "4", "--save-dir", str(save)])
    assert code == 0, err
    assert "--warmup 8 (was 4), --lr-scale 2 (was 1)" in err
    assert "apply from update 3" in err
    assert f"resuming on {dirs['same']}" in err and "vocabularies are the same" in err
    ck = load_checkpoint(save / "checkpoint_last.pt")
    assert ck["progress"]["update"] == 4 and ck["scheduler"]["warmup"] == 8
    # cosine cycles from here on: named too, and kept in the scheduler's state
    code, out, err = cli([dirs["same"], *args, "--lr-period", "3", "--max-update", "6",
                          "--save-dir", str(save)])
    assert code == 0, err
    assert "--lr-period 3 (was 0)" in err
    assert load_checkpoint(save / "checkpoint_last.pt")["scheduler"]["period"] == 3
    # and so are the cheaper dropout masks
    code, out, err = cli([dirs["same"], *args, "--lr-period", "3", "--dropout-masks", "fast",
                          "--max-update", "8", "--save-dir", str(save)])
    assert code == 0, err
    assert "--dropout-masks fast (was torch)" in err and "; fast dropout masks" in err
    assert load_checkpoint(save / "checkpoint_last.pt")["train_config"]["dropout_masks"] == "fast"


def test_resume_with_another_model_names_the_difference(dirs, tmp_path):
    save = tmp_path / "ckpt"
    code, _, err = cli([dirs["a"], *TINY, "--max-update", "2", "--save-dir", str(save)])
    assert code == 0, err
    code, out, err = cli([dirs["a"], *TINY, "--override", "dropout=0.3", "--max-update", "4",
                          "--save-dir", str(save)])
    assert code == 1 and out == ""
    line = err.strip()
    assert "\n" not in line and "another model configuration (dropout 0.1 vs 0.3)" in line, line


def test_checkpoint_from_an_older_nmt_resumes(dirs, tmp_path):
    """A checkpoint written before a model field existed (here those added for the importers)
    resumes: the missing fields are their defaults, the model it describes is the same. Found
    resuming a run from the previous release, which was refused as 'another model
    configuration (decoder_start None vs 'bos'; ...)'."""
    import torch

    save = tmp_path / "ckpt"
    code, _, err = cli([dirs["a"], *TINY, "--max-update", "2", "--save-dir", str(save)])
    assert code == 0, err
    last = save / "checkpoint_last.pt"
    ck = torch.load(last, weights_only=True)
    for new in ("decoder_start", "layernorm_embedding", "lenpen_formula", "output_bias",
                "tie_output", "scale_embedding", "sinusoid_layout", "position_offset"):
        assert new in ck["model_config"]
        del ck["model_config"][new]
    torch.save(ck, last)
    for stale in save.glob("checkpoint_2.pt"):
        stale.unlink()
    code, _, err = cli([dirs["a"], *TINY, "--max-update", "4", "--save-dir", str(save)])
    assert code == 0, err
    assert load_checkpoint(save / "checkpoint_last.pt")["progress"]["update"] == 4
    # another configuration is still refused, and named as before
    code, _, err = cli([dirs["a"], *TINY, "--override", "dropout=0.3", "--max-update", "6",
                        "--save-dir", str(save)])
    assert code == 1 and "another model configuration (dropout 0.1 vs 0.3)" in err
