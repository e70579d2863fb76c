"""nmt-train under torchrun on GPUs, mirroring tests/test_train_distributed.py (gloo on CPUs).

- one GPU: ``torchrun --standalone --nproc_per_node 1 --no-python nmt-train ... --device cuda``
  saves, and the same command with a larger --max-update resumes from its checkpoint and
  continues the run as if it had never stopped (the losses of the resumed updates match an
  uninterrupted run's). With one rank nmt-train joins no process group (WORLD_SIZE=1), so this
  checks torchrun's environment (LOCAL_RANK -> cuda:0), saving and resuming on the GPU.
- two GPUs (skipped with fewer): 2 ranks joined over NCCL train as one process with
  --update-freq 2 that sees the same global batches.

GPU kernels are not bitwise reproducible (attention's backward accumulates with atomics), so
where the CPU tests compare weights with torch.equal these compare the logged per-update losses
and gradient norms with a relative tolerance: run-to-run noise is ~1e-6 relative, while a wrong
resume (other dropout masks, other batches, a reset optimizer) or a missing gradient all-reduce
moves them by percents (dropout 0.3 alone changes this model's loss on a batch by ~1.8%, std).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nmt.checkpoint import load_checkpoint

from gpu_support import GPU, all_finite, requires_gpus, run, train_records
from train_support import write_reversal_corpus

pytestmark = GPU

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_reversal_corpus(tmp_path_factory.mktemp("gpu_dist"), run)


def torchrun_train(nproc: int, data_dir: str, save_dir: Path, *args: str):
    return run([*TORCHRUN, "--nproc_per_node", str(nproc), "--no-python", "nmt-train", data_dir,
                "--arch", "transformer_tiny", "--device", "cuda", "--save-dir", str(save_dir),
                "--log-interval", "1", *args])


def losses(save_dir: Path) -> dict[int, float]:
    return {r["update"]: r["loss"] for r in train_records(save_dir)}


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


RESUME_ARGS = ["-o", "dropout=0.3", "--max-tokens", "100", "--warmup", "4",
               "--save-interval-updates", "2"]


def test_torchrun_one_gpu_saves_then_resumes(data_dir, tmp_path):
    split = tmp_path / "split"
    first = torchrun_train(1, data_dir, split, *RESUME_ARGS, "--max-update", "4")
    assert first.returncode == 0, first.stderr[-3000:]
    assert [Path(x).resolve() for x in first.stdout.split()] == [
        (split / "checkpoint_last.pt").resolve()]
    assert "device cuda:0" in first.stderr
    ck = load_checkpoint(split / "checkpoint_last.pt")
    assert ck["progress"]["update"] == 4 and ck["train_config"]["device"] == "cuda"
    assert len(ck["rng"]["ranks"]) == 1 and "cuda" in ck["rng"]["ranks"][0]  # GPU RNG saved
    assert ck["progress"]["epoch_batches_done"] > 0          # stopped inside an epoch

    # The same command, further: it resumes at update 4 instead of starting again.
    second = torchrun_train(1, data_dir, split, *RESUME_ARGS, "--max-update", "8")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr and "at update 4" in second.stderr
    last = load_checkpoint(split / "checkpoint_last.pt")
    assert last["progress"]["update"] == 8 and last["scheduler"]["step_num"] == 8
    assert all_finite(last["model"])
    # the log continues where the checkpoint was: each update once, in order
    assert [r["update"] for r in train_records(split)] == list(range(1, 9))

    # An uninterrupted run: the resumed updates 5-8 see the same weights, batches, learning
    # rates and dropout masks, so their losses agree to GPU rounding noise.
    straight = tmp_path / "straight"
    whole = torchrun_train(1, data_dir, straight, *RESUME_ARGS, "--max-update", "8")
    assert whole.returncode == 0, whole.stderr[-3000:]
    a, b = losses(split), losses(straight)
    for u in range(1, 9):
        assert rel(a[u], b[u]) < 2e-3, (u, a[u], b[u])


@requires_gpus(2)
def test_torchrun_two_gpus_nccl_equals_single_process(data_dir, tmp_path):
    common = ["-o", "dropout=0", "--max-tokens", "40", "--warmup", "5", "--max-update", "5",
              "--clip-norm", "1.0", "--save-interval-updates", "5"]
    # One process, update-freq 2: each update sees global batches 2i and 2i+1 ...
    single = run(["nmt-train", data_dir, "--arch", "transformer_tiny", "--device", "cuda",
                  "--save-dir", str(tmp_path / "one"), "--log-interval", "1",
                  "--update-freq", "2", *common])
    assert single.returncode == 0, single.stderr[-3000:]
    # ... and with 2 ranks, rank r sees global batch 2i+r: the same global batch.
    multi = torchrun_train(2, data_dir, tmp_path / "two", *common)
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert "joined the nccl process group" in multi.stderr
    assert [Path(x).resolve() for x in multi.stdout.split()] == [
        (tmp_path / "two" / "checkpoint_last.pt").resolve()]       # rank 0 only
    one, two = train_records(tmp_path / "one"), train_records(tmp_path / "two")
    assert [r["update"] for r in one] == [r["update"] for r in two] == [1, 2, 3, 4, 5]
    for r1, r2 in zip(one, two):
        assert r1["sentences"] == r2["sentences"]          # the same global batch
        assert rel(r2["loss"], r1["loss"]) < 1e-3, (r1, r2)
        assert rel(r2["gnorm"], r1["gnorm"]) < 1e-2, (r1, r2)
    a = load_checkpoint(tmp_path / "one" / "checkpoint_last.pt")
    b = load_checkpoint(tmp_path / "two" / "checkpoint_last.pt")
    assert a["progress"]["update"] == b["progress"]["update"] == 5
    assert len(b["rng"]["ranks"]) == 2 and all_finite(b["model"])
