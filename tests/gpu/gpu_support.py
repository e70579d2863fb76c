"""Shared by the GPU tests (tests/gpu): the marks that keep them out of the default run and skip
them cleanly on a machine without CUDA.

    python -m pytest -q -m gpu tests/gpu          # on a machine with a CUDA GPU

The default ``python -m pytest -q`` deselects them (pytest.ini: -m "not slow and not gpu").
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

NO_CUDA = ("no CUDA device (torch.cuda.is_available() is False): these checks need a GPU; run "
           "them with python -m pytest -q -m gpu tests/gpu on a machine with one")

# pytestmark of every module here: the gpu marker, and a skip without CUDA.
GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)]


def requires_gpus(n: int):
    """Skip unless at least ``n`` CUDA devices are visible."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return pytest.mark.skipif(have < n, reason=f"needs {n} CUDA GPUs, {have} visible")


def run(args, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """A command as a user runs it (the console scripts from PATH), output captured."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, env=full_env, timeout=timeout)


def train_records(save_dir: Path) -> list[dict]:
    """The "train" records of SAVE_DIR/train_log.jsonl, in order."""
    lines = (Path(save_dir) / "train_log.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "train"]


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def all_finite(state: dict) -> bool:
    """Every floating-point tensor of a state dict is finite."""
    return all(bool(torch.isfinite(v).all()) for v in state.values()
               if torch.is_tensor(v) and v.is_floating_point())
