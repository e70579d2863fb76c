"""nmt-train as a user runs it: a real data directory, one line on stdout, one-line errors."""

import os
import subprocess

import numpy as np
import pytest

from click.testing import CliRunner

from nmt.cli.train import main as train_main
from nmt.checkpoint import load_checkpoint, load_model_from_checkpoint
from train_support import write_reversal_corpus


def run(args, stdin=None, cwd=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, input=stdin, capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_reversal_corpus(tmp_path_factory.mktemp("train_cli"), run, ())


def test_pipeline_stdin_to_one_stdout_line(data_dir, tmp_path):
    save = tmp_path / "ckpt"
    r = run(["nmt-train", "--arch", "transformer_tiny", "--override", "dropout=0.2",
             "--max-tokens", "100",
             "--max-update", "6", "--save-dir", str(save), "--save-interval-updates", "2",
             "--average-last", "2", "--log-interval", "2", "--warmup", "4", "--threads", "1",
             "--valid-bleu"], stdin=data_dir + "\n")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].endswith("checkpoint_avg2.pt")
    model, ck = load_model_from_checkpoint(lines[0])
    assert ck["model_config"]["dropout"] == 0.2
    for name in ("checkpoint_last.pt", "checkpoint_best.pt", "train_log.jsonl", "checkpoint_6.pt"):
        assert (save / name).exists(), name
    assert "update 6" in r.stderr
    last = load_checkpoint(save / "checkpoint_last.pt")
    assert last["train_config"]["max_tokens"] == 100 and last["data_dir"] == data_dir


def cli(args):
    """In-process run (no interpreter start-up): exit code, stdout, stderr."""
    r = CliRunner().invoke(train_main, args, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def test_average_mode(data_dir, tmp_path):
    save = tmp_path / "ckpt"
    code, _, err = cli([data_dir, "--arch", "transformer_tiny", "--max-tokens", "100",
             "--max-update", "4", "--save-dir", str(save), "--save-interval-updates", "2"])
    assert code == 0, err
    out = tmp_path / "avg.pt"
    code, stdout, err = cli(["--average", str(save / "checkpoint_2.pt"),
                             str(save / "checkpoint_4.pt"), "--output", str(out)])
    assert code == 0, err
    assert stdout.splitlines() == [str(out.resolve())]
    a, b = (load_checkpoint(save / f"checkpoint_{u}.pt")["model"] for u in (2, 4))
    avg = load_checkpoint(out)["model"]
    k = "tgt_embed.weight"
    assert np.allclose(avg[k].numpy(), ((a[k].double() + b[k].double()) / 2).numpy(), atol=1e-7)


@pytest.mark.parametrize("args,needle", [
    (["/nonexistent/data"], "no such data directory"),
    (["DATA", "--arch", "transformer_huge"], "unknown architecture 'transformer_huge'"),
    (["DATA", "--override", "dropuot=0.3"], "unknown override key 'dropuot'"),
    (["DATA", "--override", "dropout=lots"], "expected float"),
    (["DATA"], "stopping criterion"),
    (["DATA", "--max-update", "1", "--precision", "fp16", "--device", "cpu"], "needs a CUDA"),
    (["DATA", "--max-update", "1", "--max-time", "soon"], "--max-time"),
    (["--average", "/nonexistent.pt", "--output", "x.pt"], "no such checkpoint"),
    # modes that train nothing took training options and overrides, unknown keys too
    (["--average", "a.pt", "--output", "x.pt", "--override", "nonsense=1", "--max-update", "7"],
     "--average trains nothing: --max-update, --override would be ignored"),
    (["--list-archs", "--override", "dropout=0.5"],
     "--list-archs trains nothing: --override would be"),
    (["--list-archs", "-o", "dropout=0.5"], "--list-archs trains nothing: -o would be"),
    (["DATA", "-o", "dropout=0.2", "--override", "heads=2"],
     "-o and --override both given: write every override as --override"),
    # given with its default value: still given, still ignored
    (["--average", "a.pt", "--output", "x.pt", "--max-update", "0", "--device", "auto"],
     "--average trains nothing: --max-update, --device would be ignored"),
    (["--list-archs", "--no-resume"], "--list-archs trains nothing: --resume/--no-resume would"),
    # --override arch=X only renamed the model
    (["DATA", "--max-update", "1", "--override", "arch=transformer_big"],
     "'arch' is not an override: choose the preset with --arch"),
    # a negative length limit trained, then nmt-generate refused the checkpoint
    (["DATA", "--max-update", "1", "--override", "max_len_b=-100"], "max_len_b must be >= 0"),
    (["DATA", "--max-update", "1", "--max-sentences", "-3"], "--max-sentences must be >= 1"),
    (["DATA", "--max-update", "1", "--validate-interval-updates", "-1"],
     "--validate-interval-updates must be >= 1"),
    (["DATA", "--max-update", "1", "--clip-norm", "nan"], "--clip-norm must be a finite"),
    (["DATA", "--max-update", "1", "--lr-scale", "nan"], "--lr-scale must be a finite"),
    (["DATA", "--max-update", "1", "--keep-last", "0"], "--keep-last must be >= 1"),
    (["DATA", "--max-update", "1", "--save-dir", "/proc/nmt-ckpt"], "cannot create save directory"),
])
def test_bad_input_gives_one_line_error(data_dir, tmp_path, args, needle):
    save = ["--save-dir", str(tmp_path / "s")] if "DATA" in args else []
    args = [data_dir if a == "DATA" else a for a in args]
    code, stdout, stderr = cli([*save, *args])
    assert code != 0
    err = stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nmt-train: error:"), stderr
    assert needle in err[0], err[0]
    assert stdout == ""


def test_old_short_override_still_works_and_says_so(data_dir, tmp_path):
    code, stdout, stderr = cli(["--save-dir", str(tmp_path / "s"), data_dir, "--max-update", "1",
                                "-o", "dropuot=0.3"])
    assert code != 0 and stdout == ""
    assert "-o is the old name of --override" in stderr
    assert "unknown override key 'dropuot'" in stderr.strip().splitlines()[-1]


def test_bad_input_through_the_console_script(tmp_path):
    r = run(["nmt-train", str(tmp_path / "missing"), "--max-update", "1"])
    assert r.returncode != 0 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        f"nmt-train: error: {tmp_path / 'missing'}: no such data directory"]


def test_list_archs_prints_a_table_on_stdout():
    code, stdout, err = cli(["--list-archs", "--vocab-size", "8000"])
    assert code == 0, err
    assert "transformer_big" in stdout and "transformer_tiny" in stdout
    assert "8000" in stdout


VALID_VALUES = {"beam": 3, "lenpen": 1.5, "lenpen_formula": "fairseq", "max_len_a": 2.0,
                "max_len_b": 7, "min_len": 2}


def test_validation_decodes_with_a_search_config_built_from_the_valid_options():
    """Each SearchConfig field that defaults to the preset is a --valid-<field> option, and
    TrainConfig.valid_search carries it (a new SearchConfig field needs its option here)."""
    from nmt.search.config import PRESET_FIELDS, SearchConfig
    from nmt.training.config import TrainConfig

    _, out, _ = cli(["--help"])
    for name in PRESET_FIELDS:
        assert f"--valid-{name.replace('_', '-')}" in out, name
    cfg = TrainConfig(**{f"valid_{k}": v for k, v in VALID_VALUES.items()})
    assert cfg.valid_search == SearchConfig(**{k: VALID_VALUES[k] for k in PRESET_FIELDS})
    assert TrainConfig().valid_search == SearchConfig()


def test_a_bad_validation_search_option_stops_before_training(data_dir, tmp_path):
    save = tmp_path / "s"
    code, out, err = cli([data_dir, "--arch", "transformer_tiny", "--max-update", "2",
                          "--max-tokens", "100", "--valid-bleu", "--valid-lenpen", "-1",
                          "--save-dir", str(save)])
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["nmt-train: error: lenpen must be between 0 and 10, got -1.0"]
    assert not save.exists()
