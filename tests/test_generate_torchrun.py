"""nmt-generate under torchrun: each rank translates its share of the input into a
resumable shard, rank 0 merges them into one file byte-identical to a one-process run; a rank
killed with SIGKILL is restarted by torchrun (--max-restarts) and resumes its shard. Real
torchrun on CPU where it matters; a rank's environment set by hand where one rank at a time
is enough (finishing apart, world-size changes, one-line errors)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from nmt.batch.shards import Shard
from test_reliability_output import error_line
from test_translator import checkpoint_and_input

LINES, CHUNK = 200, 10          # 20 chunks: 10 per rank
ENV = {k: v for k, v in os.environ.items()
       if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RESTART_COUNT")}
ENV["OMP_NUM_THREADS"] = "1"
ARGS = ["--threads", "1", "--buffer-size", str(CHUNK)]
GENERATE = [sys.executable, "-m", "nmt.cli.generate", *ARGS]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "2"]


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    return checkpoint_and_input(tmp_path_factory, "torchrun", LINES, 11)


def _one_process(f, *extra) -> bytes:
    r = subprocess.run([*GENERATE, f["ckpt"], "-i", f["in"], "-q", *extra],
                       capture_output=True, env=ENV, timeout=180)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def _torchrun(f, out, *extra, torchrun=()):
    return [*TORCHRUN, *torchrun, "-m", "nmt.cli.generate", *ARGS, f["ckpt"], "-i", f["in"],
            "-o", str(out), *extra]


def _rank(f, out, rank, world, *extra, ok=True, restart=0):
    """One rank of a ``world``-rank run, started by hand (the environment torchrun sets)."""
    env = {**ENV, "WORLD_SIZE": str(world), "RANK": str(rank), "LOCAL_RANK": str(rank),
           "TORCHELASTIC_RESTART_COUNT": str(restart)}
    r = subprocess.run([*GENERATE, f["ckpt"], "-i", f["in"], *(("-o", str(out)) if out else ()),
                        *extra], capture_output=True, text=True, env=env, timeout=180)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


# The default run keeps greedy search; the slow run also beam search with --nbest.
@pytest.mark.parametrize("extra", [("--beam", "1"), pytest.param(("--beam", "4", "--nbest", "2"),
                                                                marks=pytest.mark.slow)],
                         ids=["greedy", "beam-nbest2"])
def test_two_ranks_write_the_one_process_output(f, tmp_path, extra):
    want = _one_process(f, *extra)
    out = tmp_path / "out.txt"
    r = subprocess.run(_torchrun(f, out, "-q", *extra), capture_output=True, env=ENV,
                       timeout=180)
    assert r.returncode == 0, r.stderr.decode()
    assert out.read_bytes() == want
    assert want.count(b"\n") == LINES * (2 if "--nbest" in extra else 1)
    assert names(tmp_path) == ["out.txt"]        # shards removed


def _pid_of_rank(launcher: subprocess.Popen, rank: int) -> psutil.Process:
    for p in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if p.environ().get("RANK") == str(rank):
                return p
        except psutil.Error:
            pass
    raise AssertionError(f"no rank {rank}")


def test_a_killed_rank_is_restarted_and_resumes_its_shard(f, tmp_path):
    want = _one_process(f)
    out = tmp_path / "out.txt"
    journal = tmp_path / "out.txt.shard-1-of-2.nmt-progress.json"
    p = subprocess.Popen(_torchrun(f, out, torchrun=("--max-restarts", "1")),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None:
            try:
                if json.loads(journal.read_text())["input_lines"] >= CHUNK:
                    break       # rank 1 has written its first chunk (input lines 11-20)
            except (OSError, ValueError):
                pass
            time.sleep(0.005)
        assert p.poll() is None, "the run ended before rank 1 could be killed"
        _pid_of_rank(p, 1).send_signal(signal.SIGKILL)
        err = p.communicate(timeout=180)[1]
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert out.read_bytes() == want
    assert names(tmp_path) == ["out.txt"]
    # The restarted rank 1 went on after what its journal held, and translated only the rest
    # of its share (10 lines of each of its chunks 1, 3, ..., 19).
    resumed = re.findall(r"rank 1: resuming \S+shard-1-of-2 after input line (\d+)", err)
    assert len(resumed) == 1, err
    kept = Shard(1, 2, 1, CHUNK).lines(int(resumed[0]))
    assert 0 < kept < LINES // 2
    translated = re.findall(r"rank 1: translated (\d+) sentences", err)
    assert translated == [str(LINES // 2 - kept)], err


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_ranks_that_finish_apart_are_merged_by_rank_0(f, tmp_path):
    """Rank 1 alone, then rank 0 alone: rank 0 merges once rank 1's shard is complete and
    acknowledged by rank 0's own torchrun attempt. Meanwhile a run with another world size
    is refused in one line."""
    extra = ("--output-format", "jsonl", "--beam", "2")
    want = _one_process(f, *extra)
    out = tmp_path / "out.jsonl"
    _rank(f, out, 1, 2, *extra)
    assert not out.exists()
    for world, words in ((1, "under torchrun with WORLD_SIZE=2"),
                         (3, "(the world size is now 3)")):
        r = (subprocess.run([*GENERATE, f["ckpt"], "-i", f["in"], "-o", str(out), *extra],
                            capture_output=True, text=True, env=ENV, timeout=180)
             if world == 1 else _rank(f, out, 0, 3, *extra, ok=False))
        error_line("nmt-generate", r.returncode, r.stderr, words, "shard-*-of-2",
                   "add --overwrite to start afresh")
    # A restarted rank 0 does not take rank 1's shard before the restarted rank 1 has seen it.
    r = _rank(f, out, 0, 2, *extra, "--shard-timeout", "0.02", restart=1, ok=False)
    error_line("nmt-generate", r.returncode, r.stderr, "rank 1's shard has not moved")
    assert not out.exists()
    # Complete: no model loaded; torchrun's restart of a run with --overwrite resumes too.
    again = _rank(f, out, 1, 2, *extra, "--overwrite", restart=1)
    assert "is complete: nothing to translate" in again.stderr
    assert "beam 2" not in again.stderr
    r = _rank(f, out, 0, 2, *extra, restart=1)
    assert "is complete: nothing to translate" in r.stderr
    assert out.read_bytes() == want
    assert names(tmp_path) == ["out.jsonl"]


def test_rank_0_gives_up_on_a_shard_that_does_not_move(f, tmp_path):
    out = tmp_path / "out.txt"
    r = _rank(f, out, 0, 2, "--shard-timeout", "0.01", ok=False)
    error_line("nmt-generate", r.returncode, r.stderr, "rank 0: rank 1's shard has not moved",
               "every rank shares", "rerun the same command to resume")
    assert (tmp_path / "out.txt.shard-0-of-2.nmt-progress.json").exists()


@pytest.mark.parametrize("how,words", [
    ("stdin", "needs --input FILE, a regular file"),
    ("no-output", "needs --output FILE"),
    ("workers", "--workers and torchrun exclude each other")],
    ids=["stdin", "no-output", "workers"])
def test_what_cannot_be_sharded_is_one_line(f, tmp_path, how, words):
    out = None if how == "no-output" else tmp_path / "out.txt"
    extra = ("--workers", "2") if how == "workers" else ()
    env = {**ENV, "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    args = [*GENERATE, f["ckpt"], *(("-o", str(out)) if out else ()), *extra]
    r = subprocess.run(args if how == "stdin" else [*args, "-i", f["in"]], input="a b\n",
                       capture_output=True, text=True, env=env, timeout=180)
    error_line("nmt-generate", r.returncode, r.stderr,
               *(["under torchrun"] if how != "workers" else []), words)
    assert r.returncode == 2 and r.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_real_torchrun_reading_stdin_fails_in_one_line(f, tmp_path):
    r = subprocess.run([*TORCHRUN, "-m", "nmt.cli.generate", *ARGS, f["ckpt"], "-o",
                        str(tmp_path / "out.txt")], input="a b\n", capture_output=True,
                       text=True, env=ENV, timeout=180)
    assert r.returncode != 0
    # each rank refuses in one line; torchrun may stop the second before it writes its own
    ours = [ln for ln in r.stderr.splitlines() if ln.startswith("nmt-generate: error: ")]
    assert len(ours) in (1, 2) and all("needs --input FILE" in ln for ln in ours), r.stderr


def test_rank_0_holds_the_outputs_lock_and_each_rank_its_shards(f, tmp_path):
    """A one-process run on OUT holds .OUT.nmt-lock: rank 0 of a torchrun job on OUT (which
    would delete the one-process run's files with --overwrite, and write OUT) is refused.
    A rank's shard lock refuses that rank of a second job."""
    from nmt.batch.resumable import output_lock
    from nmt.batch.shards import shard_path

    out = tmp_path / "out.txt"
    with output_lock(out):
        r = _rank(f, out, 0, 2, "--overwrite", ok=False)
        error_line("nmt-generate", r.returncode, r.stderr, "in use by another nmt-generate",
                   f"pid {os.getpid()}")
    with output_lock(shard_path(out, 1, 2)):
        r = _rank(f, out, 1, 2, ok=False)
        error_line("nmt-generate", r.returncode, r.stderr, "in use by another nmt-generate")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def names(d):
    """What a run left in ``d``, but the records that say nmt wrote an output."""
    return [p.name for p in d.iterdir() if not p.name.endswith(".nmt-written")]
