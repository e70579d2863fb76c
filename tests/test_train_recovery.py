"""nmt-train after the unusual: a crash between saving a checkpoint and linking it, a resume
that changes how embeddings are shared, --no-resume starting from the old run's own
checkpoint, and averaging checkpoints of different vocabularies."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.errors import NmtError
from nmt.training.loop import TrainConfig, train
from train_support import WORDS, FakeData


def cfg(save, **kw) -> TrainConfig:
    base = dict(arch="transformer_tiny", max_tokens=120, warmup=10, log_interval=1000,
                save_dir=str(save), device="cpu", save_interval_updates=2, keep_last=10)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_crash_before_linking_is_repaired_on_the_rerun(tmp_path, monkeypatch):
    """Killed after checkpoint_6.pt was written but before checkpoint_last.pt and
    checkpoint_best.pt named it: the rerun resumes from it and points both links at it."""
    import nmt.training.savedir as savedir

    real = savedir.link_or_copy

    def dies_at_6(src, dest):
        if src.name == "checkpoint_6.pt":
            raise KeyboardInterrupt          # stands for the kill: nothing after it runs
        real(src, dest)

    monkeypatch.setattr(savedir, "link_or_copy", dies_at_6)
    with pytest.raises(KeyboardInterrupt):
        train(cfg(tmp_path, max_update=6), FakeData(n_train=40), "fake")
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["progress"]["update"] == 4
    monkeypatch.setattr(savedir, "link_or_copy", real)
    final = train(cfg(tmp_path, max_update=6), FakeData(n_train=40), "fake")
    assert load_checkpoint(final)["progress"]["update"] == 6
    last = load_checkpoint(tmp_path / "checkpoint_last.pt")
    assert last["progress"]["update"] == 6
    best = last["progress"]["selection"]["best_update"]
    assert load_checkpoint(tmp_path / "checkpoint_best.pt")["progress"]["update"] == best


@pytest.mark.parametrize("first,then", [(None, False), (False, True)])
def test_resuming_with_embeddings_shared_otherwise_is_refused(tmp_path, first, then):
    train(cfg(tmp_path, max_update=2, share_all_embeddings=first), FakeData(n_train=40), "fake")
    with pytest.raises(NmtError, match="cannot resume") as e:
        train(cfg(tmp_path, max_update=4, share_all_embeddings=then), FakeData(n_train=40),
              "fake")
    assert f"--{'' if then else 'no-'}share-all-embeddings" in str(e.value)


def test_no_resume_can_start_from_the_previous_runs_own_checkpoint(tmp_path):
    """--no-resume --init-from SAVE/checkpoint_best.pt: the file is read before the old run's
    files move aside, and the run records where it is now."""
    train(cfg(tmp_path, max_update=2), FakeData(n_train=40), "fake")
    old = load_checkpoint(tmp_path / "checkpoint_best.pt")["model"]
    final = train(cfg(tmp_path, max_update=2, resume=False, arch=None,
                      init_from=str(tmp_path / "checkpoint_best.pt")),
                  FakeData(n_train=40), "fake")
    moved = list(tmp_path.glob("previous-*/checkpoint_best.pt"))
    assert len(moved) == 1
    assert all(torch.equal(old[k], load_checkpoint(moved[0])["model"][k]) for k in old)
    recorded = load_checkpoint(final)["train_config"]["init_from"]
    assert recorded == str(moved[0].resolve())


def test_checkpoints_of_other_vocabularies_are_not_averaged(tmp_path):
    from nmt.data.codec import whitespace_codec
    from nmt.data.dictionary import Dictionary
    from nmt.training.average import average_checkpoints

    final = train(cfg(tmp_path, max_update=2), FakeData(n_train=40), "fake")
    ck = load_checkpoint(final)
    other = whitespace_codec(Dictionary(list(reversed(WORDS)))).to_state()
    save_checkpoint({**ck, "src_codec": other, "tgt_codec": other}, tmp_path / "other.pt")
    with pytest.raises(NmtError, match="source vocabulary differs"):
        average_checkpoints([tmp_path / "checkpoint_2.pt", tmp_path / "other.pt"])


def stopped_by_a_signal_after(update: int, monkeypatch, run) -> None:
    """Run ``run()`` with SIGTERM raised after update ``update`` (the run then stops at the
    end of the next one), expecting it to stop there."""
    import os
    import signal

    from nmt.training.loop import TrainingInterrupted
    from nmt.training.trainer import Trainer

    real = Trainer.train_step

    def step(self, batches, flags=None):
        stats = real(self, batches, flags)
        if self.num_updates == update:
            os.kill(os.getpid(), signal.SIGTERM)
        return stats

    monkeypatch.setattr(Trainer, "train_step", step)
    with pytest.raises(TrainingInterrupted):
        run()
    monkeypatch.setattr(Trainer, "train_step", real)


def test_a_signal_on_a_save_leaves_its_validation_to_the_resumed_run(tmp_path, monkeypatch):
    """Stopped by a signal at update 4, a save point, the run saves without validating; the
    resumed run validates those same weights first and judges them as at the save, so
    --patience stops it where the uninterrupted run stopped, with the same scores."""
    kw = dict(max_update=8, patience=1)
    train(cfg(tmp_path / "straight", **kw), FakeData(n_train=40), "fake")
    split = tmp_path / "split"
    stopped_by_a_signal_after(3, monkeypatch, lambda: train(cfg(split, **kw),
                                                             FakeData(n_train=40), "fake"))
    assert load_checkpoint(split / "checkpoint_4.pt")["progress"]["deferred"] == {"judge": True}
    train(cfg(split, **kw), FakeData(n_train=40), "fake")
    a, b = (load_checkpoint(d / "checkpoint_last.pt") for d in (tmp_path / "straight", split))
    assert a["progress"]["update"] == b["progress"]["update"]
    assert a["progress"]["selection"] == b["progress"]["selection"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_a_signal_off_the_schedule_saves_no_numbered_checkpoint(tmp_path, monkeypatch):
    """Stopped at update 7 (saves every 2): only checkpoint_last.pt holds it, so the last-2
    average of the finished run is the uninterrupted run's (6 and 8), not 7 and 8."""
    kw = dict(max_update=8, average_last=2)
    straight = train(cfg(tmp_path / "straight", **kw), FakeData(n_train=40), "fake")
    split = tmp_path / "split"
    stopped_by_a_signal_after(6, monkeypatch, lambda: train(cfg(split, **kw),
                                                             FakeData(n_train=40), "fake"))
    assert not (split / "checkpoint_7.pt").exists()
    assert load_checkpoint(split / "checkpoint_last.pt")["progress"]["update"] == 7
    resumed = train(cfg(split, **kw), FakeData(n_train=40), "fake")
    a, b = load_checkpoint(straight), load_checkpoint(resumed)
    assert [p.rsplit("/", 1)[1] for p in b["averaged_from"]] == ["checkpoint_6.pt",
                                                                 "checkpoint_8.pt"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_ensemble_listings_never_name_a_missing_or_another_runs_checkpoint(tmp_path):
    """A run resumed without --ensemble-best prunes what the listing named: the listing goes.
    --no-resume moves a listing aside with its checkpoints, and it names them there."""
    first = cfg(tmp_path / "a", max_update=4, ensemble_best=2, keep_last=1)
    train(first, FakeData(n_train=40), "fake")
    listing = tmp_path / "a" / "ensemble_best2.txt"
    assert all(p and (tmp_path / "a" / p.rsplit("/", 1)[1]).exists()
               for p in listing.read_text().splitlines())
    train(cfg(tmp_path / "a", max_update=8, keep_last=1), FakeData(n_train=40), "fake")
    assert not listing.exists()

    train(dataclasses.replace(first, save_dir=str(tmp_path / "b")), FakeData(n_train=40),
          "fake")
    train(cfg(tmp_path / "b", max_update=2, resume=False, seed=7), FakeData(n_train=40),
          "fake")
    moved = next((tmp_path / "b").glob("previous-*"))
    names = (moved / "ensemble_best2.txt").read_text().splitlines()
    assert names and all(n.startswith(str(moved.resolve())) and os.path.exists(n)
                         for n in names)


def test_a_failed_rewrite_of_a_moved_listing_leaves_it_whole(tmp_path):
    """--no-resume rewrites a moved ensemble listing to name the moved checkpoints. A write
    that fails part way (here the file-size limit, as on a full disk) must leave the listing
    as it was, not a truncated one: the rewrite goes through a temporary file and a rename."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint_1.pt").write_bytes(b"x")
    listing = run / "ensemble_best1.txt"
    listing.write_text(str((run / "checkpoint_1.pt").resolve()) + "\n", encoding="utf-8")
    size = listing.stat().st_size
    script = (
        "import resource, signal, sys\n"
        "from nmt.errors import NmtError\n"
        "from nmt.training.savedir import SaveDir\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({size + 8}, {size + 8}))\n"
        "try:\n"
        f"    SaveDir({str(run)!r}).move_previous_run()\n"
        "except NmtError as e:\n"
        "    print('error:', e)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert "cannot move the previous run's files" in done.stdout    # the failure is reported
    moved = next(run.glob("previous-*"))
    assert (moved / "ensemble_best1.txt").read_text(encoding="utf-8") == \
        str((run / "checkpoint_1.pt").resolve()) + "\n"
    assert not list(moved.glob(".ensemble_best1.txt.*"))   # no temporary file left behind
