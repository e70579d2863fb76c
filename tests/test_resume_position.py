"""A resume whose saved position is past its epoch's end (the data directory rebuilt with the
same vocabulary and line count but shorter sentences, so fewer batches) goes on with the next
epoch and finishes, with a warning; it used to spin forever at 100% CPU."""

import os
import subprocess

import pytest
import torch

from nmt.checkpoint import load_checkpoint, save_checkpoint

from train_support import write_reversal_corpus

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run(args, timeout=120):
    return subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_a_position_past_the_end_goes_on_with_the_next_epoch(tmp_path):
    data = write_reversal_corpus(tmp_path, run)
    save = tmp_path / "ckpt"
    args = ["nmt-train", data, "--arch", "transformer_tiny", "--max-tokens", "200",
            "--save-dir", str(save), "--threads", "1", "--save-interval-updates", "2",
            "--warmup", "2"]
    assert run([*args, "--max-update", "2"]).returncode == 0
    last = save / "checkpoint_last.pt"
    ck = load_checkpoint(last)
    ck["progress"]["epoch_batches_done"] = 10_000
    save_checkpoint(ck, last)
    p = run([*args, "--max-update", "4"], timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "past its" in p.stderr and "going on with epoch 2" in p.stderr, p.stderr[-2000:]
    after = load_checkpoint(last)["progress"]
    assert after["update"] == 4 and after["epoch"] >= 2
    assert torch.is_tensor(load_checkpoint(last)["model"]["tgt_embed.weight"])
