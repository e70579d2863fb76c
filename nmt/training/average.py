"""Checkpoint averaging (section 6.1: the last 5 checkpoints for base models, 20 for big).

The result is an inference checkpoint: the mean of the inputs' model tensors, the configuration
and vocabularies of the first input, no optimizer/scheduler/RNG state.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Sequence

import torch

from nmt.errors import NmtError
from nmt.training.checkpoint import inference_checkpoint, load_checkpoint, save_checkpoint

log = logging.getLogger("nmt.train")

_NUMBERED = re.compile(r"^checkpoint_(\d+)\.pt$")


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> dict:
    """Mean of the model tensors of ``paths`` (loaded one at a time to bound memory)."""
    if not paths:
        raise NmtError("no checkpoints to average")
    first: dict | None = None
    sums: dict[str, torch.Tensor] = {}
    for path in paths:
        ckpt = load_checkpoint(path)
        weights = ckpt["model"]
        if first is None:
            first = ckpt
            keys = set(weights)
            for k, v in weights.items():
                # Accumulate in float64: twenty fp32 checkpoints lose no precision to the sum.
                sums[k] = v.double().clone() if v.is_floating_point() else v.clone()
            continue
        if ckpt["model_config"] != first["model_config"]:
            raise NmtError(f"{path}: model configuration differs from {paths[0]}; "
                           f"only checkpoints of one model can be averaged")
        if set(weights) != keys:
            raise NmtError(f"{path}: parameter names differ from {paths[0]}")
        for k, v in weights.items():
            if v.shape != sums[k].shape:
                raise NmtError(f"{path}: tensor '{k}' has shape {tuple(v.shape)}, "
                               f"expected {tuple(sums[k].shape)}")
            if v.is_floating_point():
                sums[k] += v.double()
            elif not torch.equal(v, sums[k]):
                raise NmtError(f"{path}: integer tensor '{k}' differs from {paths[0]}")
    assert first is not None
    n = len(paths)
    averaged = {k: (s / n).to(first["model"][k].dtype) if first["model"][k].is_floating_point()
                else s for k, s in sums.items()}
    out = inference_checkpoint(first)
    out["model"] = averaged
    out["averaged_from"] = [str(p) for p in paths]
    return out


def average_to_file(paths: Sequence[str | os.PathLike], output: str | os.PathLike) -> Path:
    out = average_checkpoints(paths)
    dest = save_checkpoint(out, output)
    log.info("averaged %d checkpoints into %s", len(paths), dest)
    return dest


def numbered_checkpoints(save_dir: str | os.PathLike) -> list[Path]:
    """checkpoint_{update}.pt files of a save directory, oldest update first."""
    d = Path(save_dir)
    found = []
    for p in d.iterdir() if d.is_dir() else []:
        m = _NUMBERED.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def last_checkpoints(save_dir: str | os.PathLike, n: int) -> list[Path]:
    found = numbered_checkpoints(save_dir)
    if not found:
        raise NmtError(f"{save_dir}: no checkpoint_<update>.pt files to average")
    return found[-n:]
