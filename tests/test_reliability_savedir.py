"""One writer per directory, a fresh run never mixed with an old one's files, every checkpoint
byte written or an error naming the file.

The locks are tested with real processes (a running nmt-train and a second one; a lock held by
this process against a real nmt-preprocess), full disks with a real tmpfs and a real file-size
limit: nothing is mocked.
"""

import fcntl
import os
import re
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from conftest import skip_unless_ci

from nmt.checkpoint import load_checkpoint
from nmt.cli.generate import main as generate_main
from nmt.cli.preprocess import main as preprocess_main
from nmt.cli.train import main as train_main
from nmt.training.savedir import checkpoint_update, numbered_checkpoints

from train_support import write_reversal_corpus

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
TINY = ["--arch", "transformer_tiny", "--max-tokens", "60", "--warmup", "4", "--seed", "3",
        "--threads", "1", "--save-interval-updates", "2"]
BUSY_TRAIN = "wait for it to finish, or give another --save-dir"


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=180,
                          stdin=subprocess.DEVNULL, **kw)


def cli(args):
    """nmt-train in this process (no interpreter start-up): exit code, stdout, stderr."""
    r = CliRunner().invoke(train_main, [str(a) for a in args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_reversal_corpus(tmp_path_factory.mktemp("savedir"), run, ("--workers", "1",
                                                                           "-q"))


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """A finished 4-update run: checkpoint_2.pt and checkpoint_4.pt."""
    save = tmp_path_factory.mktemp("trained") / "ckpt"
    code, _, err = cli([data_dir, *TINY, "--max-update", "4", "--save-dir", save])
    assert code == 0, err
    return save


def wait_for(condition, proc, seconds=120):
    end = time.time() + seconds
    while not condition():
        if proc.poll() is not None:
            raise AssertionError("nmt-train ended early:\n" + proc.stderr.read()[-3000:])
        assert time.time() < end, "timed out"
        time.sleep(0.2)


# --- item 2: one writer per directory ------------------------------------------------------------

def test_a_second_nmt_train_into_a_running_ones_save_dir_is_refused_naming_its_pid(
        data_dir, tmp_path):
    save = tmp_path / "ckpt"
    first = subprocess.Popen(["nmt-train", data_dir, *TINY, "--max-update", "1000000",
                              "--keep-last", "2", "-q", "--save-dir", str(save)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_for(lambda: (save / "checkpoint_last.pt").exists(), first)
        # What a save in progress of the running writer looks like (an interrupted save's
        # leftover looks the same): a second run must not delete it.
        in_progress = save / ".checkpoint_1000000.pt.live.tmp"
        in_progress.write_bytes(b"half of a checkpoint")
        second = run(["nmt-train", data_dir, *TINY, "--max-update", "4", "--save-dir",
                      str(save)])
        assert second.returncode == 1 and second.stdout == ""
        assert second.stderr.splitlines() == [
            f"nmt-train: error: {save} is in use by another nmt-train (pid {first.pid}); "
            f"{BUSY_TRAIN}"]
        assert in_progress.read_bytes() == b"half of a checkpoint"
        # nmt-train --average into the running run's directory is refused as well
        code, out, err = cli(["--average", save / "checkpoint_last.pt",
                              "--output", save / "avg.pt"])
        assert (code, out) == (1, "") and not (save / "avg.pt").exists()
        assert err.splitlines() == [
            f"nmt-train: error: {save} is in use by another nmt-train (pid {first.pid}); "
            f"wait for it to finish, or write the average elsewhere"]
        assert first.poll() is None          # refused because it runs, not because it ended
    finally:
        first.kill()                         # kill -9: the kernel drops its lock
        first.wait()
    # The dead run's lock file is still there, naming it: it blocks nothing.
    assert (save / ".nmt.lock").read_text().split()[0] == str(first.pid)
    n = checkpoint_update(numbered_checkpoints(save)[-1])
    code, out, err = cli([data_dir, *TINY, "--max-update", n + 2, "--save-dir", save])
    assert code == 0, err
    assert f"at update {n} " in err and not in_progress.exists()    # a dead run's leftover
    assert load_checkpoint(out.strip())["progress"]["update"] == n + 2
    assert not (save / ".nmt.lock").exists()


def test_a_save_dir_moved_during_the_run_is_not_recreated_at_the_old_path(data_dir, tmp_path):
    """The directory a run locked is moved away and another run takes the old path: the first
    run's next save (here the one SIGTERM asks for) fails with one line instead of writing
    into the second run's directory, and its exit leaves the second run's lock alone."""
    save, moved = tmp_path / "ckpt", tmp_path / "moved"
    first = subprocess.Popen(["nmt-train", data_dir, *TINY, "--max-update", "1000000",
                              "--keep-last", "2", "--save-dir", str(save)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_for(lambda: (save / "checkpoint_last.pt").exists(), first)
        os.rename(save, moved)
        save.mkdir()                                   # another writer's directory now
        other = hold_lock(save / ".nmt.lock", "nmt-train")
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=120)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 1 and out == ""
    last = err.splitlines()[-1]
    assert last.startswith(f"nmt-train: error: {save}: the save directory was moved, removed "
                           "or replaced while this run was training; checkpoint_"), err
    assert "Traceback" not in err
    assert sorted(p.name for p in save.iterdir()) == [".nmt.lock"]    # nothing written there
    assert (save / ".nmt.lock").read_text().split() == [str(os.getpid()), "nmt-train"]
    os.close(other)
    # The run's own checkpoints went with its directory and resume from there.
    assert (moved / "checkpoint_last.pt").exists() and (moved / "train_log.jsonl").exists()
    n = checkpoint_update(numbered_checkpoints(moved)[-1])
    code, out, err = cli([data_dir, *TINY, "--max-update", n + 2, "--save-dir", moved])
    assert code == 0, err
    assert f"at update {n} " in err


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_savedir_writes_nothing_once_its_directory_is_not_the_one_it_locked(tmp_path, how):
    """SaveDir.write: a directory replaced by another (with a checkpoint of its own) is neither
    written into nor pruned; a removed one is not recreated; its release leaves the other
    directory's lock file alone."""
    from nmt.errors import NmtError
    from nmt.training.savedir import SaveDir

    path = tmp_path / "ckpt"
    sd = SaveDir(path)
    sd.prepare()
    ck = {"model": {"w": torch.zeros(2)}}
    assert sd.write(ck, 1, False, keep_last=1).name == "checkpoint_1.pt"
    os.rename(path, tmp_path / "moved")
    if how == "replaced":
        path.mkdir()
        (path / "checkpoint_0.pt").write_bytes(b"another run's")
        (path / ".nmt.lock").write_text("12345 nmt-train\n")
    with pytest.raises(NmtError, match=r"the save directory was moved, removed or replaced "
                                       r"while this run was training; checkpoint_2\.pt was "
                                       r"not written"):
        sd.write(ck, 2, True, keep_last=1)
    assert not sd.unmoved()
    sd.release()
    if how == "replaced":
        assert sorted(p.name for p in path.iterdir()) == [".nmt.lock", "checkpoint_0.pt"]
        assert (path / ".nmt.lock").read_text() == "12345 nmt-train\n"
    else:
        assert not path.exists()
    # the moved directory keeps its lock file (unlocked now: it blocks nothing)
    assert sorted(p.name for p in (tmp_path / "moved").iterdir()) == [
        ".nmt.lock", "checkpoint_1.pt", "checkpoint_last.pt"]


def hold_lock(path: Path, prog: str) -> int:
    """Take the writer lock at ``path`` as ``prog`` would, from this process."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, f"{os.getpid()} {prog}\n".encode())
    return fd


def test_nmt_preprocess_into_a_locked_destination_is_refused_naming_the_holder(
        data_dir, tmp_path):
    raw = Path(data_dir).parent          # train.xx/yy and valid.xx/yy of the module's corpus
    dest = tmp_path / "bin"
    args = ["-s", "xx", "-t", "yy", "--trainpref", str(raw / "train"), "--validpref",
            str(raw / "valid"), "--subword", "none", "--joined-dictionary", "--workers", "1",
            "-q", "--destdir", str(dest)]
    fd = hold_lock(tmp_path / ".bin.lock", "nmt-preprocess")
    try:
        r = run(["nmt-preprocess", *args])
    finally:
        os.close(fd)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"nmt-preprocess: error: {dest} is in use by another nmt-preprocess "
        f"(pid {os.getpid()}); wait for it to finish, or give another --destdir"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".bin.lock"]   # nothing built
    # Unlocked, the left-over lock file (naming a process that no longer holds it) is no
    # obstacle, and the run removes it.
    r = CliRunner().invoke(preprocess_main, args, catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == [str(dest)] and (dest / "meta.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]


@pytest.mark.slow
def test_under_torchrun_rank_0_takes_the_lock_and_every_rank_stops(data_dir, tmp_path):
    """(A normal two-rank run, where only rank 0 locks and rank 1 is not refused, is
    test_train_distributed.py's.)"""
    save = tmp_path / "ckpt"
    save.mkdir()
    fd = hold_lock(save / ".nmt.lock", "nmt-train")
    try:
        r = run(["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                 "2", "--no-python", "nmt-train", data_dir, *TINY, "--max-update", "4",
                 "--device", "cpu", "--save-dir", str(save)])
    finally:
        os.close(fd)
    assert r.returncode != 0 and r.stdout == ""
    refusal = f"{save} is in use by another nmt-train (pid {os.getpid()}); {BUSY_TRAIN}"
    lines = r.stderr.splitlines()
    assert f"nmt-train: error: {refusal}" in lines                      # rank 0, the writer
    assert f"nmt-train: error: rank 1: rank 0 stopped: {refusal}" in lines      # at once
    assert "internal error" not in r.stderr and not list(save.glob("checkpoint*"))


# --- item 3: --no-resume never mixes two runs ----------------------------------------------------

def test_no_resume_moves_the_old_run_aside_and_a_rerun_resumes_the_new_one(data_dir, tmp_path):
    save = tmp_path / "ckpt"
    args = [data_dir, *TINY, "--keep-last", "5", "--save-dir", save]
    code, _, err = cli([*args, "--max-update", "6"])
    assert code == 0, err
    old = {p.name: p.read_bytes() for p in save.iterdir()}
    assert "checkpoint_6.pt" in old and "train_log.jsonl" in old
    code, _, err = cli([*args, "--max-update", "2", "--no-resume"])
    assert code == 0, err
    aside = list(save.glob("previous-*"))
    assert len(aside) == 1 and f"the previous run's files are in {aside[0]}" in err
    assert {p.name: p.read_bytes() for p in aside[0].iterdir()} == old      # nothing lost
    assert [p.name for p in numbered_checkpoints(save)] == ["checkpoint_2.pt"]
    # The rerun continues the new run (update 2), not the old one (update 6) ...
    code, out, err = cli([*args, "--max-update", "4"])
    assert code == 0, err
    assert re.search(r"resumed from \S+ at update 2 ", err), err
    assert "nothing to train" not in err
    assert out.splitlines() == [str((save / "checkpoint_last.pt").resolve())]
    # ... and what it prints is the new run's: the weights of a straight run to update 4.
    code, straight, err = cli([data_dir, *TINY, "--max-update", "4", "--save-dir",
                               tmp_path / "straight"])
    assert code == 0, err
    a, b = load_checkpoint(out.strip()), load_checkpoint(straight.strip())
    assert a["progress"]["update"] == b["progress"]["update"] == 4
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


# --- item 5: a full disk while saving names the file ---------------------------------------------

@pytest.fixture
def small_fs(tmp_path):
    """A real 4 MiB tmpfs (a transformer_tiny checkpoint is about 2 MB)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
    except FileNotFoundError:
        skip_unless_ci("no mount command: cannot make a small filesystem")
    if r.returncode != 0:
        skip_unless_ci(f"mounting a tmpfs is not permitted here ({r.stderr.strip()})")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(directory: Path, leave: int = 0) -> None:
    """Leave exactly ``leave`` bytes free on the filesystem of ``directory``."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    os.truncate(filler, filler.stat().st_size - leave)
    st = os.statvfs(directory)
    assert st.f_bavail * st.f_frsize == leave


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != "filler")


# Where torch.save's write fails decides what it raises: at 0 bytes free an OSError, further on
# a RuntimeError ("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0").
@pytest.mark.parametrize("leave", [0, 4096, 65536, 1 << 20])
def test_save_checkpoint_on_a_full_disk_names_the_file_wherever_the_write_fails(
        trained, small_fs, leave):
    from nmt.checkpoint import save_checkpoint
    from nmt.errors import NmtError

    ck = load_checkpoint(trained / "checkpoint_4.pt")
    fill(small_fs, leave)
    with pytest.raises(NmtError) as e:
        save_checkpoint(ck, small_fs / "c.pt")
    assert str(e.value) == f"{small_fs}/c.pt: cannot write (No space left on device)"
    assert leftovers(small_fs) == []


def test_disk_full_during_a_checkpoint_save_names_the_checkpoint(data_dir, small_fs):
    fill(small_fs, 512 << 10)          # room for the log, not for a checkpoint
    save = small_fs / "ckpt"
    code, out, err = cli([data_dir, *TINY, "--max-update", "4", "-q", "--save-dir", save])
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"nmt-train: error: {save}/checkpoint_2.pt: cannot write (No space left on device)"]
    assert leftovers(save) == ["train_log.jsonl"]              # no partial checkpoint


@pytest.mark.parametrize("leave", [0, 65536])
def test_disk_full_while_averaging_names_the_output(trained, small_fs, leave):
    fill(small_fs, leave)
    code, out, err = cli(["--average", trained / "checkpoint_2.pt", trained / "checkpoint_4.pt",
                          "--output", small_fs / "avg.pt"])
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"nmt-train: error: {small_fs}/avg.pt: cannot write (No space left on device)"]
    assert leftovers(small_fs) == []


def test_zero_bytes_free_while_training_names_the_file(data_dir, small_fs):
    fill(small_fs)
    save = small_fs / "ckpt"
    code, out, err = cli([data_dir, *TINY, "--max-update", "4", "-q", "--save-dir", save])
    assert (code, out) == (1, "")
    # the first write of the run is the validation record of update 2, before its save
    assert err.splitlines() == [
        f"nmt-train: error: {save}/train_log.jsonl: cannot write (No space left on device)"]


def test_file_size_limit_during_a_checkpoint_save_names_the_checkpoint(data_dir, tmp_path):
    def limit():       # in the child only: 1 MiB per file (EFBIG "File too large")
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    save = tmp_path / "ckpt"
    r = run(["nmt-train", data_dir, *TINY, "--max-update", "4", "-q", "--save-dir", str(save)],
            preexec_fn=limit)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.splitlines() == [
        f"nmt-train: error: {save}/checkpoint_2.pt: cannot write (File too large)"]
    assert leftovers(save) == ["train_log.jsonl"]


# --- item 10 -------------------------------------------------------------------------------------

def test_negative_seed_is_a_usage_error(data_dir, trained, tmp_path):
    args = [a for a in TINY if a not in ("--seed", "3")]
    code, out, err = cli([data_dir, *args, "--seed", "-1", "--max-update", "2", "--save-dir",
                          tmp_path / "ckpt"])
    assert (code, out) == (2, "")
    assert err.splitlines() == ["nmt-train: error: --seed must be >= 0, got -1"]
    assert not (tmp_path / "ckpt").exists()
    src = tmp_path / "in.txt"
    src.write_text("w1 w2\n")
    r = CliRunner().invoke(generate_main, ["-q", "--device", "cpu", str(trained /
                                                                        "checkpoint_4.pt"),
                                           "-i", str(src), "--sampling", "--seed", "-1"])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["nmt-generate: error: --seed must be >= 0, got -1"]


def test_a_failed_run_leaves_no_empty_save_dir_it_created(data_dir, tmp_path):
    save = tmp_path / "new" / "ckpt"          # both made by the run, both taken back
    bad = [*TINY, "--max-tokens", "1", "--max-update", "2"]    # nothing fits: fails after set-up
    code, _, err = cli([data_dir, *bad, "--save-dir", save])
    assert code == 1 and "no training sentence fits in --max-tokens 1" in err, err
    assert not (tmp_path / "new").exists()
    # a directory that was there before stays, empty as it was
    (tmp_path / "mine").mkdir()
    code, _, err = cli([data_dir, *bad, "--save-dir", tmp_path / "mine"])
    assert code == 1, err
    assert (tmp_path / "mine").is_dir() and not list((tmp_path / "mine").iterdir())


FINAL = re.compile(r"(finished|stopped early \(--patience\)); (.*); use (\S+)$")


@pytest.mark.parametrize("extra", [["--ensemble-best", "2"], ["--average-last", "2"],
                                   ["--ensemble-best", "2", "--average-best", "2"]],
                         ids=["ensemble", "average-last", "ensemble+average-best"])
def test_the_final_line_says_what_was_printed(data_dir, tmp_path, extra):
    code, out, err = cli([data_dir, *TINY, "--max-update", "6", "--save-dir", tmp_path / "c",
                          *extra])
    assert code == 0, err
    printed = Path(out.strip())
    final = [m for m in map(FINAL.search, err.splitlines()) if m]
    assert len(final) == 1, err
    assert Path(final[0][3]).resolve() == printed
    claim = re.search(r"printed: the average (\S+),", final[0][2])
    if "--average-last" in extra or "--average-best" in extra:
        assert printed.name.startswith("checkpoint_avg")
        assert claim is None or claim[1] == printed.name
    else:       # nothing was averaged: no line may say an average was printed
        assert printed.name == "checkpoint_last.pt" and "average" not in final[0][2]
