"""curves.png after every run, and nmt-train --tensorboard-logdir."""

import json
import os
import runpy
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import setuptools
from click.testing import CliRunner

from nmt.checkpoint import load_checkpoint
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
    # checkpoint_best.pt is marked where it was saved, on the loss and the metric panels
    best = load_checkpoint(save / "checkpoint_best.pt")["progress"]["update"]
    assert labels.count(f"checkpoint_best.pt ({best})") == 2, labels


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
    assert "checkpoint_best.pt (2)" not in lines           # no "best" record: no marker
    log = tmp_path / "train_log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "tra')   # cut line
    assert plot_curves(log, tmp_path / "curves.png") == tmp_path / "curves.png"
    png_size(tmp_path / "curves.png")


def test_the_best_marker_follows_resumes():
    """A run killed after marking update 6 best and resumed from its checkpoint 4 marks what
    the resumed run finds best, not the killed run's 6."""
    from nmt.training.curves import best_update

    def train(u):
        return {"kind": "train", "update": u, "loss": 1.0, "nll_loss": 1.0}

    def best(u):
        return {"kind": "best", "update": u, "metric": "loss", "value": 1.0}

    killed = [train(2), best(2), train(4), best(4), train(6), best(6)]
    assert best_update(killed) == 6
    assert best_update(killed + [train(5), train(6)]) == 4
    assert best_update(killed + [train(5), train(6), best(6), train(8)]) == 6
    assert best_update([train(2), train(4)]) is None


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
    assert "tensorboard>=2.14,<3" in seen["extras_require"]["test"]


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


def tensorboard_scalars(logdir: Path) -> dict[str, list]:
    """{tag: [ScalarEvent(wall_time, step, value), ...]} as TensorBoard itself reads the
    directory's event files back (orphaned steps purged, as its UI shows them)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: acc.Scalars(tag) for tag in acc.Tags()["scalars"]}


def test_tensorboard_gets_the_scalars_of_train_log(data_dir, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install "
                        "'nmt[test]')")
    from torch.utils.tensorboard import SummaryWriter

    save, tb = tmp_path / "ckpt", tmp_path / "tb"
    # An earlier run's events in the directory: a fresh run (purge_step 1) hides them.
    with SummaryWriter(log_dir=str(tb)) as old:
        for step in (2, 4, 6, 8, 10):
            old.add_scalar("train/loss", 1e6, step)
    code, _, err = train(data_dir, save, "--valid-bleu", "--tensorboard-logdir", str(tb),
                         max_update=6)
    assert code == 0, err
    assert "| WARNING |" not in err, err
    first = tensorboard_scalars(tb)
    assert set(first) == TRAIN_TAGS | VALID_TAGS, sorted(first)
    assert all([e.step for e in events] == [2, 4, 6] for events in first.values()), first

    # Killed after update 6 was logged but before checkpoint_6.pt was complete: the rerun
    # resumes from checkpoint_4.pt and logs update 6 again; TensorBoard must show it once.
    for p in save.glob("checkpoint*.pt"):
        if load_checkpoint(p)["progress"]["update"] == 6:
            p.unlink()
    rerun = time.time()
    code, _, err = train(data_dir, save, "--valid-bleu", "--tensorboard-logdir", str(tb),
                         max_update=8)
    assert code == 0, err
    assert "resumed from" in err and "checkpoint_4.pt" in err, err
    scalars = tensorboard_scalars(tb)
    assert set(scalars) == TRAIN_TAGS | VALID_TAGS, sorted(scalars)
    # The same numbers as train_log.jsonl (its last record of each update: the rerun's).
    records = {(r["kind"], r["update"]): r for r in read_log(save / "train_log.jsonl")}
    for tag, events in scalars.items():
        assert [e.step for e in events] == [2, 4, 6, 8], (tag, events)
        assert [e.wall_time >= rerun for e in events] == [False, False, True, True], tag
        kind, key = tag.split("/")
        for e in events:
            assert e.value == pytest.approx(records[kind, e.step][key], rel=1e-6), (tag, e)


def test_a_validation_stopped_by_a_signal_sends_no_scalars(tmp_path):
    """The resumed run validates those weights again at the same step (nmt-train, on a signal
    during validation decoding): TensorBoard shows that step's point once, the whole one."""
    pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install "
                        "'nmt[test]')")
    from nmt.training.curves import TensorBoardLog

    stopped = {"kind": "valid", "update": 4, "loss": 9.0, "nll_loss": 8.0, "ppl": 256.0,
               "decoding_stopped": True}
    first = TensorBoardLog(tmp_path, purge_step=1)
    first.write(stopped)
    first.close()
    resumed = TensorBoardLog(tmp_path, purge_step=5)
    resumed.write({"kind": "valid", "update": 4, "loss": 2.0, "nll_loss": 1.5, "ppl": 2.8,
                   "bleu": 30.0})
    resumed.close()
    scalars = tensorboard_scalars(tmp_path)
    assert [(e.step, e.value) for e in scalars["valid/loss"]] == [(4, 2.0)]
    assert [e.step for e in scalars["valid/bleu"]] == [4]
