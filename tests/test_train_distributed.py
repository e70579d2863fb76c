"""torchrun with 2 CPU ranks (gloo) equals one process that sees the same global batches."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from nmt.checkpoint import load_checkpoint

TESTS = Path(__file__).resolve().parent

WORKER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from train_support import FakeData
    from nmt.training.loop import TrainConfig, train
    save_dir, update_freq = sys.argv[1], int(sys.argv[2])
    cfg = TrainConfig(arch="transformer_tiny", overrides={{"dropout": "0"}}, max_tokens=60,
                      update_freq=update_freq, warmup=5, max_update=5, save_dir=save_dir,
                      device="cpu", log_interval=1, clip_norm=1.0)
    path = train(cfg, FakeData(n_train=45), "fake")
    import os
    if os.environ.get("RANK", "0") == "0":
        print(path)
""")


def test_torchrun_two_ranks_equals_single_process(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER.format(tests=str(TESTS)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # One process, update-freq 2: each update sees global batches 2i and 2i+1 ...
    single = subprocess.run([sys.executable, str(worker), str(tmp_path / "one"), "2"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert single.returncode == 0, single.stderr[-2000:]
    # ... and with 2 ranks, rank r sees global batch 2i+r: the same global batch.
    multi = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc_per_node", "2", str(worker), str(tmp_path / "two"), "1"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert multi.stdout.strip().splitlines() == [str((tmp_path / "two" / "checkpoint_last.pt"))]
    a = load_checkpoint(tmp_path / "one" / "checkpoint_last.pt")
    b = load_checkpoint(tmp_path / "two" / "checkpoint_last.pt")
    assert a["progress"]["update"] == b["progress"]["update"] == 5
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert len(b["rng"]["ranks"]) == 2
