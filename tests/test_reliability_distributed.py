"""A rank that dies or hangs must not leave the others waiting forever: 2 CPU ranks (gloo) of
the real nmt-train; rank 1 is killed (or stopped) in the middle of training, and rank 0 must
leave by itself with nmt's one-line rank error."""

import os
import signal
import socket
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(fault: str, args: list[str]):
    """The job: (the process to wait for at the end, its stdout/stderr source, a function
    giving the rank processes once they exist). ``hang``: under torchrun, as users run it.
    ``kill``: the two ranks started with the environment torchrun gives them, without
    torchrun, which would SIGTERM the survivor as soon as a rank dies and so hide what nmt
    does; as when the rank lost is on another machine, whose torchrun ours cannot see."""
    if fault == "hang":
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc_per_node", "2", "--no-python", "nmt-train", *args],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=ENV)
        launcher = psutil.Process(proc.pid)
        return [proc], lambda: (_rank_process(launcher, "0"), _rank_process(launcher, "1"))
    port = str(_free_port())
    procs = [subprocess.Popen(["nmt-train", *args], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**ENV, "RANK": r, "LOCAL_RANK": r, "WORLD_SIZE": "2",
                                   "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": port})
             for r in ("0", "1")]
    return procs, lambda: tuple(psutil.Process(p.pid) for p in procs)


@pytest.mark.parametrize("fault", ["kill", pytest.param("hang", marks=pytest.mark.slow)])  # hang: 17 s
def test_a_dead_or_hung_rank_stops_the_job_within_the_timeout(data_dir, tmp_path, fault):
    save = tmp_path / "ckpt"
    args = [data_dir, "--arch", "transformer_tiny", "--max-tokens", "60", "--max-update",
            "100000", "--warmup", "4", "--save-interval-updates", "2", "--log-interval",
            "1000", "--device", "cpu", "--threads", "1", "--ddp-timeout", str(TIMEOUT_MIN),
            "--save-dir", str(save)]
    procs, ranks = _start(fault, args)
    victims = []
    try:
        deadline = time.monotonic() + 120
        while not (save / "checkpoint_2.pt").exists():   # both ranks are training
            for p in procs:
                assert p.poll() is None, p.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.1)
        rank0, rank1 = ranks()
        assert rank0 is not None and rank1 is not None
        victims = [rank0, rank1]
        t0 = time.monotonic()
        if fault == "kill":
            rank1.send_signal(signal.SIGKILL)
        else:
            # A hang (deadlock, stuck file system...): only the collective timeout helps.
            rank1.send_signal(signal.SIGSTOP)
        # Rank 0 must give up on its own within the timeout (plus start-up slack).
        rank0_code = rank0.wait(timeout=60 * TIMEOUT_MIN + 30)
        waited = time.monotonic() - t0
        _kill_quietly(rank1)                              # the stopped rank, for torchrun
        _, err = procs[0].communicate(timeout=60)
        for p in procs[1:]:
            p.communicate(timeout=60)
    finally:
        for p in victims:
            _kill_quietly(p)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    print(err[-1500:], f"\n{fault}: rank 0 gone after {waited:.1f}s")
    # psutil reaped rank 0: without torchrun, Popen no longer knows its exit status.
    assert (procs[0].returncode if fault == "hang" else rank0_code) != 0
    assert waited < 60 * TIMEOUT_MIN + 30
    if fault == "hang":
        assert waited >= 60 * TIMEOUT_MIN * 0.8            # it waited ~the timeout, then left
    # Rank 0's own one-line error, not a traceback; without torchrun (kill) it is the last
    # thing rank 0 says, and its exit status is nmt's (1), not a signal's.
    lines = [l for l in err.splitlines() if l.startswith("nmt-train: error: rank 0:")]
    assert len(lines) == 1 and "collective operation failed" in lines[0], err[-3000:]
    assert f"--ddp-timeout {TIMEOUT_MIN:g} min" in lines[0]
    if fault == "kill":
        assert err.rstrip().endswith(lines[0]) and rank0_code == 1, err[-3000:]
        assert "Traceback" not in err
