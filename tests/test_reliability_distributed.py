"""A rank that dies or hangs must not leave the others waiting forever: torchrun, 2 CPU ranks
(gloo), the real nmt-train; rank 1 is killed (or stopped) in the middle of training."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from train_support import write_reversal_corpus

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TIMEOUT_MIN = 0.2           # --ddp-timeout: 12 s


def _run(args):
    return subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_reversal_corpus(tmp_path_factory.mktemp("ddp_faults"), _run,
                                 ("--workers", "1", "-q"), valid=False)


def _rank_process(launcher: psutil.Process, rank: str) -> psutil.Process | None:
    for child in launcher.children(recursive=True):
        try:
            if child.environ().get("RANK") == rank and "nmt-train" in " ".join(child.cmdline()):
                return child
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def _kill_quietly(p: psutil.Process) -> None:
    try:
        p.kill()
    except psutil.NoSuchProcess:
        pass


@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_a_dead_or_hung_rank_stops_the_job_within_the_timeout(data_dir, tmp_path, fault):
    save = tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", "--no-python", "nmt-train", data_dir, "--arch", "transformer_tiny",
           "--max-tokens", "60", "--max-update", "100000", "--warmup", "4",
           "--save-interval-updates", "2", "--log-interval", "1000", "--device", "cpu",
           "--threads", "1", "--ddp-timeout", str(TIMEOUT_MIN), "--save-dir", str(save)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    launcher = psutil.Process(proc.pid)
    victims = []
    try:
        deadline = time.monotonic() + 120
        while not (save / "checkpoint_2.pt").exists():   # both ranks are training
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.1)
        rank0, rank1 = _rank_process(launcher, "0"), _rank_process(launcher, "1")
        assert rank0 is not None and rank1 is not None
        victims = [rank0, rank1]
        t0 = time.monotonic()
        if fault == "kill":
            rank1.send_signal(signal.SIGKILL)
        else:
            # A hang (deadlock, stuck file system...): only the collective timeout helps.
            rank1.send_signal(signal.SIGSTOP)
        # Rank 0 must give up on its own within the timeout (plus start-up slack).
        rank0.wait(timeout=60 * TIMEOUT_MIN + 30)
        waited = time.monotonic() - t0
        _kill_quietly(rank1)                              # the stopped rank, for torchrun
        _, err = proc.communicate(timeout=60)
    finally:
        for p in victims:
            _kill_quietly(p)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    print(err[-1500:], f"\n{fault}: rank 0 gone after {waited:.1f}s")
    assert proc.returncode != 0
    assert waited < 60 * TIMEOUT_MIN + 30
    if fault == "hang":
        # Rank 0's own one-line error, not a traceback: it waited ~the timeout, then left.
        assert waited >= 60 * TIMEOUT_MIN * 0.8
        lines = [l for l in err.splitlines() if l.startswith("nmt-train: error: rank 0:")]
        assert lines and "collective operation failed" in lines[0], err[-3000:]
