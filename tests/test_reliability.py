"""Crash safety of nmt-train: kill -9 at random moments (one of them in the middle of a
checkpoint write), SIGTERM/SIGINT, corrupt checkpoints, NaN/inf losses, crafted pickles.

The end-to-end test runs the real ``nmt-train`` console script on a real data directory and
checks that the interrupted-and-resumed run ends with exactly the parameters of one that was
never interrupted.
"""

import json
import logging
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from nmt.cli.export import main as export_main
from nmt.cli.generate import main as generate_main
from nmt.cli.import_ import main as import_main
from nmt.cli.train import main as train_main
from nmt.errors import NmtError
from nmt.checkpoint import load_checkpoint
from nmt.training.loop import TrainConfig, TrainingInterrupted, train
from nmt.training.trainer import Trainer

from train_support import FakeData, write_reversal_corpus

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
MAX_UPDATE = 40
UPDATE_RE = re.compile(r"\| update (\d+) \|")

# nmt-train, with torch.save made to stop half-way through the Nth checkpoint write of this
# process (and say so on stderr), so that the test can kill it in the middle of a write.
STALLING_TRAIN = textwrap.dedent("""
    import io, os, sys, time
    import torch
    real_save, count = torch.save, [0]
    def stalling_save(obj, f, *args, **kwargs):
        count[0] += 1
        if count[0] != int(os.environ["NMT_TEST_STALL_SAVE"]):
            return real_save(obj, f, *args, **kwargs)
        buf = io.BytesIO()
        real_save(obj, buf, *args, **kwargs)
        data = buf.getvalue()
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())
        sys.stderr.write("NMT-TEST: stalled in a checkpoint write\\n")
        sys.stderr.flush()
        time.sleep(120)
        f.write(data[len(data) // 2:])
    torch.save = stalling_save
    from nmt.cli.train import main
    sys.argv[0] = "nmt-train"
    main()
""")


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=180,
                          stdin=subprocess.DEVNULL, **kw)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_reversal_corpus(tmp_path_factory.mktemp("reliability"), run, ("--workers", "1", "-q"))


def train_args(data_dir, save_dir):
    # dropout stays on (the preset's): the RNG state must survive the crashes too.
    return [data_dir, "--arch", "transformer_tiny", "--max-tokens", "60", "--max-update",
            str(MAX_UPDATE), "--warmup", "4", "--seed", "3", "--save-interval-updates", "2",
            "--keep-last", "3", "--log-interval", "1", "--threads", "1",
            "--save-dir", str(save_dir)]


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    save = tmp_path_factory.mktemp("straight")
    r = run(["nmt-train", *train_args(data_dir, save)])
    assert r.returncode == 0, r.stderr[-3000:]
    return load_checkpoint(save / "checkpoint_last.pt")


def assert_same_weights(a, b):
    assert a["progress"]["update"] == b["progress"]["update"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def assert_every_checkpoint_is_intact(save_dir: Path, *names: str) -> list[str]:
    """What a crash may leave: complete checkpoints and hidden temporaries, nothing else.
    ``names`` must be among them (an empty directory must not pass); returns the names found."""
    found = sorted(p.name for p in save_dir.glob("checkpoint*.pt"))
    assert found and set(names) <= set(found), (names, found)
    for name in found:
        load_checkpoint(save_dir / name)
    return found


def interrupt(cmd, save_dir, sig, trigger, pause):
    """Start ``cmd``; when a stderr line matches ``trigger`` wait ``pause`` s and send ``sig``."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if trigger(line):
                time.sleep(pause)
                proc.send_signal(sig)
                break
        else:
            raise AssertionError("nmt-train ended before the trigger:\n" + "".join(seen[-20:]))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, "".join(seen) + err


def at_update(n):
    def trigger(line):
        m = UPDATE_RE.search(line)
        return m is not None and int(m.group(1)) >= n
    return trigger


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_kill_at_random_moments_then_resume_equals_uninterrupted(data_dir, reference,
                                                                   tmp_path):
    rng = random.Random(int(os.environ.get("NMT_TEST_SEED", "8")))
    save = tmp_path / "ckpt"
    args = train_args(data_dir, save)
    wrapper = tmp_path / "stalling_train.py"
    wrapper.write_text(STALLING_TRAIN)

    # 1. kill -9 in the middle of the 2nd checkpoint write (update 4): half a file on disk.
    ENV["NMT_TEST_STALL_SAVE"] = "2"
    try:
        code, _, err = interrupt([sys.executable, str(wrapper), *args], save, signal.SIGKILL,
                                 lambda line: line.startswith("NMT-TEST: stalled"), 0.0)
    finally:
        del ENV["NMT_TEST_STALL_SAVE"]
    assert code == -signal.SIGKILL
    partial = list(save.glob(".checkpoint_4.pt.*.tmp"))
    assert partial, sorted(p.name for p in save.iterdir())
    assert not (save / "checkpoint_4.pt").exists()
    assert load_checkpoint(save / "checkpoint_last.pt")["progress"]["update"] == 2
    assert assert_every_checkpoint_is_intact(save) == [
        "checkpoint_2.pt", "checkpoint_best.pt", "checkpoint_last.pt"]

    # 2.-3. kill -9 at random updates, a random few milliseconds after the log line: in an
    # update, in validation, in a save, between them.
    for lo, hi in ((6, 12), (14, 20)):
        code, _, err = interrupt(["nmt-train", *args], save, signal.SIGKILL,
                                 at_update(rng.randint(lo, hi)), rng.uniform(0, 0.03))
        assert code == -signal.SIGKILL, err[-2000:]
        assert "resumed from" in err
        last = load_checkpoint(save / "checkpoint_last.pt")["progress"]["update"]
        assert_every_checkpoint_is_intact(save, "checkpoint_last.pt", f"checkpoint_{last}.pt")
    assert not list(save.glob(".checkpoint_4.pt.*.tmp"))      # the partial write was cleaned up

    # 4.-5. SIGTERM and SIGINT: finish the update, save, exit 128 + signal.
    for sig, (lo, hi) in ((signal.SIGTERM, (22, 27)), (signal.SIGINT, (29, 34))):
        code, out, err = interrupt(["nmt-train", *args], save, sig, at_update(rng.randint(lo, hi)),
                                   rng.uniform(0, 0.03))
        assert code == 128 + sig, err[-2000:]
        assert out == ""                                   # no "finished" path for a pipeline
        msg = [l for l in err.splitlines() if l.startswith("nmt-train: error: interrupted")]
        assert len(msg) == 1 and sig.name in msg[0], err[-2000:]
        saved = int(re.search(r"at update (\d+)", msg[0]).group(1))
        assert load_checkpoint(save / "checkpoint_last.pt")["progress"]["update"] == saved
        # a numbered checkpoint only where the schedule saves (every 2): elsewhere the stop
        # is a resume point, checkpoint_last.pt alone
        assert (save / f"checkpoint_{saved}.pt").exists() == (saved % 2 == 0)
        assert "Traceback" not in err

    # 6. run to the end: the same weights as the run that was never interrupted.
    r = run(["nmt-train", *args])
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str((save / "checkpoint_last.pt").resolve())
    assert_same_weights(load_checkpoint(save / "checkpoint_last.pt"), reference)
    assert not list(save.glob(".*.tmp"))


# --- in-process tests (FakeData: fast) ----------------------------------------------------------

def run_cfg(tmp, **kw) -> TrainConfig:
    base = dict(arch="transformer_tiny", max_tokens=120, warmup=10, log_interval=1,
                save_dir=str(tmp), device="cpu", save_interval_updates=2, keep_last=10)
    base.update(kw)
    return TrainConfig(**base)


@pytest.fixture(scope="module")
def straight_9(tmp_path_factory):
    save = tmp_path_factory.mktemp("straight9")
    train(run_cfg(save, max_update=9), FakeData(n_train=40), "fake")
    return load_checkpoint(save / "checkpoint_last.pt")


def _first_six(tmp_path) -> Path:
    save = tmp_path / "ck"
    train(run_cfg(save, max_update=6), FakeData(n_train=40), "fake")
    assert (save / "checkpoint_last.pt").samefile(save / "checkpoint_6.pt")
    return save


def test_truncated_newest_checkpoint_is_skipped_with_a_warning(tmp_path, straight_9, caplog):
    save = _first_six(tmp_path)
    # Disk corruption of the newest file: checkpoint_last.pt is a hard link to it, so both
    # are truncated; checkpoint_4.pt is the newest intact one.
    data = (save / "checkpoint_6.pt").read_bytes()
    with open(save / "checkpoint_6.pt", "r+b") as f:
        f.truncate(len(data) // 3)
    with caplog.at_level(logging.INFO, logger="nmt"):
        train(run_cfg(save, max_update=9), FakeData(n_train=40), "fake")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("checkpoint_last.pt" in w and "truncated" in w for w in warnings), warnings
    assert any("checkpoint_6.pt" in w and "truncated" in w for w in warnings), warnings
    assert any("resumed from" in r.getMessage() and "checkpoint_4.pt" in r.getMessage()
               for r in caplog.records)
    assert_same_weights(load_checkpoint(save / "checkpoint_last.pt"), straight_9)


def test_missing_last_link_and_stale_older_last(tmp_path, straight_9):
    # Killed between writing checkpoint_6.pt and linking checkpoint_last.pt to it.
    save = _first_six(tmp_path)
    os.replace(save / "checkpoint_4.pt", save / "checkpoint_last.pt")  # an older "last"
    train(run_cfg(save, max_update=9), FakeData(n_train=40), "fake")
    assert_same_weights(load_checkpoint(save / "checkpoint_last.pt"), straight_9)


def test_no_intact_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    save = _first_six(tmp_path)
    for p in save.glob("checkpoint*.pt"):
        if p.name != "checkpoint_last.pt":
            p.unlink()
    (save / "checkpoint_last.pt").unlink()
    (save / "checkpoint_last.pt").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(NmtError, match="no intact checkpoint.*--no-resume"):
        train(run_cfg(save, max_update=9), FakeData(n_train=40), "fake")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_and_stops_then_resume_equals_uninterrupted(tmp_path, monkeypatch,
                                                                  straight_9, sig):
    real_step = Trainer.train_step

    def step(self, batches, flags=()):
        stats = real_step(self, batches, flags)
        if self.num_updates == 3:
            os.kill(os.getpid(), sig)
        return stats

    monkeypatch.setattr(Trainer, "train_step", step)
    save = tmp_path / "ck"
    before = signal.getsignal(sig)
    with pytest.raises(TrainingInterrupted) as e:
        train(run_cfg(save, max_update=9), FakeData(n_train=40), "fake")
    assert signal.getsignal(sig) is before                 # handlers restored
    assert e.value.exit_code == 128 + sig
    assert "update 4" in str(e.value) and sig.name in str(e.value)
    assert load_checkpoint(save / "checkpoint_last.pt")["progress"]["update"] == 4
    monkeypatch.setattr(Trainer, "train_step", real_step)
    train(run_cfg(save, max_update=9), FakeData(n_train=40), "fake")
    assert_same_weights(load_checkpoint(save / "checkpoint_last.pt"), straight_9)


def test_second_signal_stops_at_once(tmp_path, monkeypatch):
    real_step = Trainer.train_step

    def step(self, batches, flags=()):
        stats = real_step(self, batches, flags)
        if self.num_updates == 3:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return stats

    monkeypatch.setattr(Trainer, "train_step", step)
    with pytest.raises(KeyboardInterrupt) as e:
        train(run_cfg(tmp_path, max_update=9, save_interval_updates=2), FakeData(n_train=40),
              "fake")
    assert assert_every_checkpoint_is_intact(tmp_path) == [
        "checkpoint_2.pt", "checkpoint_best.pt", "checkpoint_last.pt"]
    assert e.value.exit_code == 128 + signal.SIGTERM
    # The message names what a rerun resumes from.
    assert str(e.value) == (f"stopped at once by a second SIGTERM; {tmp_path / 'checkpoint_2.pt'}"
                            f" is intact (checkpoints are written atomically): the same command "
                            f"resumes from it")


def test_a_signal_during_validation_decoding_stops_it_at_once(tmp_path, monkeypatch):
    """Decoding the valid split can take minutes: a signal stops it after the current batch,
    then the run saves and stops there, as a signal at that update does. The resumed run validates those weights first, so the best checkpoint
    and --patience are the uninterrupted run's."""
    from nmt.search.translator import Translator

    real = Translator.translate_ids
    batches = []

    def translate_ids(self, ids, sources=None, progress=None, first_line=1):
        def counting(n):
            batches.append(n)
            if len(batches) == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            progress(n)
        return real(self, ids, sources=sources, progress=counting, first_line=first_line)

    straight = tmp_path / "straight"
    kw = dict(max_update=9, save_interval_updates=2, valid_bleu=True)
    train(run_cfg(straight, **kw), FakeData(n_train=40, n_valid=64), "fake")
    split = tmp_path / "split"
    monkeypatch.setattr(Translator, "translate_ids", translate_ids)
    with pytest.raises(TrainingInterrupted):
        train(run_cfg(split, **kw), FakeData(n_train=40, n_valid=64), "fake")
    assert len(batches) == 1          # the other batches of the split were not decoded
    recs = [json.loads(l) for l in (split / "train_log.jsonl").read_text().splitlines()]
    valid = [r for r in recs if r["kind"] == "valid"]
    assert len(valid) == 1 and valid[0]["decoding_stopped"] and "bleu" not in valid[0]
    # no update is trained after the stopped validation: the save point (2) is saved, and
    # its validation is left to the resumed run
    last = load_checkpoint(split / "checkpoint_last.pt")["progress"]
    assert last["update"] == 2 and last["deferred"] == {"judge": True}
    # A signal during that owed validation too: the resumed run stops with a message, and
    # the checkpoint still owes it.
    batches.clear()
    with pytest.raises(TrainingInterrupted, match="at update 2; saved .*checkpoint_last.pt"):
        train(run_cfg(split, **kw), FakeData(n_train=40, n_valid=64), "fake")
    assert len(batches) == 1
    last = load_checkpoint(split / "checkpoint_last.pt")["progress"]
    assert last["update"] == 2 and last["deferred"] == {"judge": True}
    monkeypatch.setattr(Translator, "translate_ids", real)
    train(run_cfg(split, **kw), FakeData(n_train=40, n_valid=64), "fake")
    a, b = (load_checkpoint(d / "checkpoint_last.pt") for d in (straight, split))
    assert a["progress"]["update"] == b["progress"]["update"] == 9
    assert a["progress"]["selection"] == b["progress"]["selection"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


# --- numerical faults -------------------------------------------------------------------------

def test_repeated_nonfinite_losses_stop_without_a_broken_checkpoint(tmp_path, caplog):
    # An absurd learning rate: update 1 blows the weights up to ~1e27, every later loss is NaN.
    with caplog.at_level(logging.WARNING, logger="nmt"):
        with pytest.raises(NmtError) as e:
            train(run_cfg(tmp_path, max_update=20, lr_scale=1e30, max_nonfinite=3,
                          save_interval_updates=1), FakeData(n_train=40), "fake")
    msg = str(e.value)
    assert "not finite for 3 updates in a row" in msg and "update 2" in msg and "\n" not in msg
    assert sum("not finite, update skipped" in r.getMessage() for r in caplog.records) == 3
    # Update 1 was saved (--save-interval-updates 1) and nothing after it.
    names = sorted(p.name for p in tmp_path.glob("checkpoint*.pt"))
    assert names == ["checkpoint_1.pt", "checkpoint_last.pt"], names
    for name in names:
        ck = load_checkpoint(tmp_path / name)
        assert ck["progress"]["update"] == 1
        assert all(torch.isfinite(t).all() for t in ck["model"].values())
        for st in ck["optimizer"]["state"].values():
            assert all(torch.isfinite(v).all() for v in st.values() if torch.is_tensor(v))


def _trainer_and_batch():
    import nmt
    from nmt.data.buckets import collate

    torch.manual_seed(0)
    cfg = nmt.get_arch("transformer_tiny", {"dropout": "0"})
    model = nmt.build_model(cfg, 28, 28)
    trainer = Trainer(model, label_smoothing=0.1, d_model=cfg.d_model, warmup=5, device="cpu")
    batch = collate(FakeData(n_train=8).load_split("train"), list(range(8)))
    return model, trainer, batch


def _poison_next_backward(model, value=float("nan")):
    """The next backward pass writes ``value`` into one gradient (once)."""
    p = next(model.parameters())
    handle = []

    def hook(grad):
        handle[0].remove()
        return torch.full_like(grad, value)
    handle.append(p.register_hook(hook))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nonfinite_gradient_is_skipped_fp32(value):
    model, trainer, batch = _trainer_and_batch()
    trainer.train_step([batch])
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    adam = {k: v.clone() for k, v in trainer.optimizer.state[next(model.parameters())].items()}
    _poison_next_backward(model, value)
    stats = trainer.train_step([batch])
    assert stats.nonfinite and stats.skipped and trainer.nonfinite_in_a_row == 1
    assert trainer.num_updates == 1                       # the schedule did not advance
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    for k, v in trainer.optimizer.state[next(model.parameters())].items():
        assert torch.equal(v, adam[k]), k                 # Adam's moments untouched
    stats = trainer.train_step([batch])
    assert not stats.nonfinite and trainer.nonfinite_in_a_row == 0 and trainer.num_updates == 2


def test_fp16_overflow_skips_the_step_and_lowers_the_scale():
    """The fp16 path with a GradScaler (on CPU here: fp16 autocast itself needs a GPU)."""
    model, trainer, batch = _trainer_and_batch()
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 7)
    trainer.train_step([batch])
    assert trainer.num_updates == 1 and trainer.scaler.get_scale() == 2.0 ** 7
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    _poison_next_backward(model, float("inf"))
    stats = trainer.train_step([batch])
    assert stats.nonfinite and stats.skipped and trainer.num_updates == 1
    assert trainer.scaler.get_scale() == 2.0 ** 6
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k
    stats = trainer.train_step([batch])                   # recovers at the lower scale
    assert not stats.skipped and trainer.num_updates == 2
    assert trainer.scaler.get_scale() == 2.0 ** 6


# --- malicious checkpoints through the CLIs ----------------------------------------------------

class Evil:
    def __reduce__(self):
        return (os.system, (f"echo pwned > {os.environ['NMT_TEST_MARK']}",))


def test_crafted_pickle_is_refused_by_every_cli(tmp_path, monkeypatch, data_dir):
    mark = tmp_path / "pwned"
    monkeypatch.setenv("NMT_TEST_MARK", str(mark))
    evil = tmp_path / "evil.pt"
    torch.save({"format_version": 1, "model": {}, "payload": Evil()}, evil)
    raw = tmp_path / "raw.pt"
    raw.write_bytes(pickle.dumps({"format_version": 1, "payload": Evil()}, protocol=2))
    # Sanity: the file really runs code when loaded without weights_only.
    torch.load(evil, weights_only=False)
    assert mark.exists()
    mark.unlink()
    src = tmp_path / "in.txt"
    src.write_text("w1 w2\n")
    save = tmp_path / "ck"
    save.mkdir()
    os.link(evil, save / "checkpoint_last.pt")
    runner = CliRunner()
    cases = [
        (generate_main, [str(evil), "-i", str(src)], str(evil)),
        (generate_main, [str(raw), "-i", str(src)], str(raw)),
        (train_main, ["--average", str(evil), str(raw), "--output", str(tmp_path / "avg.pt")],
         str(evil)),
        (train_main, [data_dir, "--init-from", str(evil), "--max-update", "1", "--save-dir",
                      str(tmp_path / "init")], str(evil)),
        (export_main, [str(evil), str(tmp_path / "ct2")], str(evil)),
        (export_main, ["--format", "huggingface", str(evil), str(tmp_path / "hf")], str(evil)),
        (import_main, ["fairseq", str(evil), "--data", str(tmp_path), "--output",
                       str(tmp_path / "imported.pt")], str(evil)),
    ]
    for cli, args, name in cases:
        r = runner.invoke(cli, args)
        assert r.exit_code == 1, r.output
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and name in lines[0] and "refused" in lines[0], r.stderr
    for made in ("avg.pt", "init", "ct2", "hf", "imported.pt"):
        assert not (tmp_path / made).exists(), made
    # nmt-serve loads its models after it starts listening: it stops with the one line last
    r = subprocess.run([sys.executable, "-m", "nmt.cli.serve", str(evil), "--port", "0",
                        "--device", "cpu"], capture_output=True, text=True, env=ENV,
                       timeout=120, stdin=subprocess.DEVNULL)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and last.startswith("nmt-serve: error: " + str(evil)), r.stderr
    assert "refused" in last and "Traceback" not in r.stderr
    # Resuming skips the refused file (with a warning) and, with nothing else, stops.
    fake = FakeData(n_train=20)
    with pytest.raises(NmtError, match="no intact checkpoint"):
        train(run_cfg(save, max_update=2), fake, "fake")
    assert not mark.exists()
