"""A crafted optimizer state in a resumed checkpoint is refused in one line before torch's
load_state_dict: a broadcast view of the right shape crashed the fused Adam kernel (SIGSEGV),
a wrong shape aborted it (SIGABRT). A garbage random-number state, an internal error, is one
line too."""

import os
import subprocess

import pytest
import torch

from nmt.checkpoint import load_checkpoint, save_checkpoint

from train_support import write_reversal_corpus

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(args):
    return subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("optstate")
    data = write_reversal_corpus(d, run)
    save = d / "ckpt"
    args = ["nmt-train", data, "--arch", "transformer_tiny", "--max-tokens", "200",
            "--save-dir", str(save), "--threads", "1", "--warmup", "2"]
    assert run([*args, "--max-update", "2"]).returncode == 0
    return args, save


def tamper(change):
    def apply(ck):
        state = ck["optimizer"]["state"]
        pid = max(state, key=lambda i: state[i]["exp_avg"].numel())
        change(state[pid])
    return apply


def garbage_rng(ck):
    ck["rng"]["ranks"][0]["torch"] = torch.zeros(3, dtype=torch.uint8)


@pytest.mark.parametrize("how", [
    tamper(lambda s: s.update(exp_avg=torch.zeros(1).expand(*s["exp_avg"].shape))),
    tamper(lambda s: s.update(exp_avg_sq=torch.zeros(3, 5))),
    tamper(lambda s: s.update(exp_avg=s["exp_avg"].long())),
    tamper(lambda s: s.update(step=torch.zeros(4))),
    lambda ck: ck["optimizer"]["param_groups"][0]["params"].pop(),
    garbage_rng,
], ids=["broadcast", "shape", "dtype", "step", "group", "rng"])
def test_a_damaged_optimizer_state_is_one_line(trained, tmp_path, how):
    args, save = trained
    copy = tmp_path / "ckpt"
    copy.mkdir()
    ck = load_checkpoint(save / "checkpoint_last.pt")
    how(ck)
    save_checkpoint(ck, copy / "checkpoint_last.pt")
    argv = [a if a != str(save) else str(copy) for a in args]
    p = run([*argv, "--max-update", "4"])
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    last = p.stderr.strip().splitlines()[-1]
    damaged = ("random-number state is damaged" if how is garbage_rng
               else "optimizer state is damaged")
    assert damaged in last and "Traceback" not in p.stderr, p.stderr[-2000:]
