"""curves.png after every run, and nmt-train --tensorboard-logdir (issue 15)."""

import json
import os
import runpy
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest
import setuptools
from click.testing import CliRunner

from nmt.cli.train import main as train_main
from nmt.training.curves import draw_curves, plot_curves, read_log
from train_support import write_reversal_corpus

ROOT = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TRAIN_TAGS = {"train/loss", "train/nll_loss", "train/ppl", "train/lr", "train/gnorm",
              "train/tgt_tokens_per_s"}
VALID_TAGS = {"valid/loss", "valid/nll_loss", "valid/ppl", "valid/bleu", "valid/chrf"}


def run(args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_reversal_corpus(tmp_path_factory.mktemp("curves"), run, ())


def train(data_dir, save, *extra, max_update=4):
    """nmt-train in-process: exit code, stdout, stderr."""
    args = [data_dir, "--arch", "transformer_tiny", "--max-tokens", "100", "--warmup", "4",
            "--max-update", str(max_update), "--save-dir", str(save), "--log-interval", "2",
            "--save-interval-updates", "2", "--threads", "1", *extra]
    r = CliRunner().invoke(train_main, args, catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def png_size(path: Path) -> tuple[int, int]:
    """Width and height of a PNG, after checking its signature and its first and last chunks."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, data[:8]
    assert data[12:16] == b"IHDR" and data[-8:-4] == b"IEND"
    return struct.unpack(">II", data[16:24])


def legend_labels(fig) -> list[str]:
    return [line.get_label() for ax in fig.axes for line in ax.get_lines()]


# --- curves.png ---------------------------------------------------------------------------------

def test_every_run_leaves_a_png_with_the_validation_scores(data_dir, tmp_path):
    save = tmp_path / "ckpt"
    code, stdout, err = train(data_dir, save, "--valid-bleu")
    assert code == 0, err
    assert Path(stdout.strip()).exists()
    assert png_size(save / "curves.png") == (1200, 400)
    assert "matplotlib" not in err
    import matplotlib.image

    assert matplotlib.image.imread(save / "curves.png").shape[:2] == (400, 1200)
    # The picture is drawn from train_log.jsonl: its validation BLEU and chrF get a panel.
    from matplotlib.figure import Figure

    fig = Figure()
    draw_curves(fig, read_log(save / "train_log.jsonl"))
    labels = legend_labels(fig)
    for label in ("train loss", "train nll", "valid loss", "valid nll", "learning rate",
                  "valid BLEU", "valid chrF"):
        assert label in labels, labels
    assert len(fig.axes) == 3


def test_curves_show_every_decoding_metric_and_each_update_once(tmp_path):
    from matplotlib.figure import Figure

    records = [{"kind": "train", "update": u, "loss": 5.0 - u / 10, "nll_loss": 4.0, "ppl": 50.0,
                "lr": 1e-4 * u} for u in (1, 2, 3, 2, 3, 4)]   # resumed from update 1
    records += [{"kind": "valid", "update": 2, "loss": 4.0, "nll_loss": 3.0, "bracket_f1": 61.0},
                {"kind": "valid", "update": 4, "loss": None, "nll_loss": 2.5, "bracket_f1": 70.0},
                {"kind": "valid_averaged", "update": 4, "loss": 3.0, "nll_loss": 2.0,
                 "bracket_f1": 99.0}]
    fig = Figure()
    draw_curves(fig, records)
    lines = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
    assert list(lines["train loss"].get_xdata()) == [1, 2, 3, 4]
    assert list(lines["valid bracket F1"].get_ydata()) == [61.0, 70.0]
    assert "valid BLEU" not in lines
    log = tmp_path / "train_log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "tra')   # cut line
    assert plot_curves(log, tmp_path / "curves.png") == tmp_path / "curves.png"
    png_size(tmp_path / "curves.png")


def test_without_matplotlib_one_warning_says_how_to_get_it(tmp_path, monkeypatch, caplog):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)   # import fails as if not installed
    log = tmp_path / "train_log.jsonl"
    log.write_text(json.dumps({"kind": "train", "update": 1, "loss": 2.0, "nll_loss": 1.5,
                               "lr": 1e-4}) + "\n")
    assert plot_curves(log, tmp_path / "curves.png") is None
    assert not (tmp_path / "curves.png").exists()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "pip install 'matplotlib>=3.7,<4'" in warnings[0], warnings


def test_matplotlib_is_a_core_dependency_and_the_extras_remain(monkeypatch):
    seen = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.update(kw))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"))
    assert any(r.startswith("matplotlib>=3.7") for r in seen["install_requires"])
    assert seen["extras_require"]["plot"] == ["matplotlib>=3.7,<4"]
    assert seen["extras_require"]["tensorboard"] == ["tensorboard>=2.14,<3"]


def test_importing_nmt_imports_neither_matplotlib_nor_tensorboard():
    code = ("import sys, nmt, nmt.cli.train, nmt.training.loop; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('matplotlib', 'tensorboard') or m.startswith('torch.utils.tensorboard')))")
    r = run([sys.executable, "-c", code])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# --- --tensorboard-logdir -----------------------------------------------------------------------

def test_without_tensorboard_one_warning_and_training_goes_on(data_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)   # as if not installed
    save = tmp_path / "ckpt"
    code, stdout, err = train(data_dir, save, "--tensorboard-logdir", str(tmp_path / "tb"))
    assert code == 0, err
    assert Path(stdout.strip()).exists()
    warnings = [line for line in err.splitlines() if "| WARNING |" in line]
    assert len(warnings) == 1, err
    assert "TensorBoard" in warnings[0] and "pip install 'nmt[tensorboard]'" in warnings[0]
    assert "update 4" in err and (save / "curves.png").exists()


class FakeSummaryWriter:
    """Records what torch.utils.tensorboard.SummaryWriter would have been asked to write."""

    made: list["FakeSummaryWriter"] = []

    def __init__(self, log_dir=None, purge_step=None, **kwargs):
        self.log_dir, self.purge_step, self.scalars, self.closed = log_dir, purge_step, [], False
        FakeSummaryWriter.made.append(self)

    def add_scalar(self, tag, value, global_step=None):
        assert not self.closed
        self.scalars.append((tag, value, global_step))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def test_tensorboard_gets_the_scalars_of_train_log(data_dir, tmp_path, monkeypatch):
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = FakeSummaryWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    monkeypatch.setattr(FakeSummaryWriter, "made", [])
    save, tb = tmp_path / "ckpt", tmp_path / "tb"
    code, _, err = train(data_dir, save, "--valid-bleu", "--tensorboard-logdir", str(tb))
    assert code == 0, err
    assert "| WARNING |" not in err, err
    (w,) = FakeSummaryWriter.made
    assert w.log_dir == str(tb) and w.purge_step == 1 and w.closed
    steps = {tag: sorted(s for t, _, s in w.scalars if t == tag) for tag, _, _ in w.scalars}
    assert set(steps) == TRAIN_TAGS | VALID_TAGS, sorted(steps)
    assert all(s == [2, 4] for s in steps.values()), steps
    # The same numbers as train_log.jsonl.
    records = read_log(save / "train_log.jsonl")
    for tag, value, step in w.scalars:
        kind, key = tag.split("/")
        (rec,) = [r for r in records if r["kind"] == kind and r["update"] == step]
        assert value == pytest.approx(rec[key]), tag

    # Resuming from checkpoint_4.pt: TensorBoard drops whatever the earlier run wrote after it.
    code, _, err = train(data_dir, save, "--valid-bleu", "--tensorboard-logdir", str(tb),
                         max_update=6)
    assert code == 0, err
    assert "resuming" in err.lower() or "resumed" in err.lower(), err
    w2 = FakeSummaryWriter.made[1]
    assert w2.purge_step == 5 and w2.closed
    assert {s for _, _, s in w2.scalars} == {6}
    assert {t for t, _, _ in w2.scalars} == TRAIN_TAGS | VALID_TAGS
