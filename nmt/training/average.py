"""Checkpoint averaging (section 6.1: the last 5 checkpoints for base models, 20 for big).

The result is an inference checkpoint: the mean of the inputs' model tensors, the configuration
and vocabularies of the first input, no optimizer/scheduler/RNG state.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

import torch

from nmt.checkpoint import inference_checkpoint, load_checkpoint, save_checkpoint
from nmt.config import ModelConfig
from nmt.errors import NmtError
from nmt.io import file_key

log = logging.getLogger("nmt.train")


def average_checkpoints(paths: Sequence[str | os.PathLike]) -> dict:
    """Mean of the model tensors of ``paths`` (loaded one at a time to bound memory)."""
    if not paths:
        raise NmtError("no checkpoints to average")
    _refuse_same_file(paths)
    first: dict | None = None
    sums: dict[str, torch.Tensor] = {}
    for path in paths:
        ckpt = load_checkpoint(path, mmap=True)     # optimizer states are never read
        weights = ckpt["model"]
        if first is None:
            first = ckpt
            keys = set(weights)
            for k, v in weights.items():
                # Accumulate in float64: twenty fp32 checkpoints lose no precision to the sum.
                sums[k] = v.double().clone() if v.is_floating_point() else v.clone()
            continue
        _check_same_model(ckpt, first, path, paths[0])
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


def _check_same_model(ckpt: dict, first: dict, path, first_path) -> None:
    """One model: the same configuration (a field a checkpoint predates counts as its default)
    and the same vocabularies, or the average would mix rows of different symbols."""
    from nmt.checkpoint import codecs_from_checkpoint
    from nmt.training.resume import codec_difference, model_differences

    diffs = model_differences(ckpt["model_config"],
                              ModelConfig.from_dict(first["model_config"]).to_dict())
    if diffs:
        raise NmtError(f"{path}: model configuration differs from {first_path} ({diffs}); "
                       f"only checkpoints of one model can be averaged")
    # Shared and separate embeddings have the same tensor names: averaged together, one of
    # the two tables would silently win when the result is loaded.
    for key in ("share_all_embeddings", "task"):
        if ckpt.get(key) != first.get(key):
            raise NmtError(f"{path}: {key} is {ckpt.get(key)!r}, {first_path}'s "
                           f"{first.get(key)!r}; only checkpoints of one model can be averaged")
    pairs = zip(("source", "target"), codecs_from_checkpoint(ckpt, str(path)),
                codecs_from_checkpoint(first, str(first_path)))
    for side, mine, theirs in pairs:
        diff = codec_difference(mine, theirs)
        if diff:
            raise NmtError(f"{path}: its {side} vocabulary differs from {first_path}'s "
                           f"({diff}); only checkpoints of one model can be averaged")


def _refuse_same_file(paths: Sequence[str | os.PathLike]) -> None:
    """A file given twice would weigh double: checkpoint_last.pt and checkpoint_best.pt are hard
    links to numbered checkpoints, so a glob like checkpoint_*.pt repeats the newest one."""
    seen: dict[tuple[int, int], str | os.PathLike] = {}
    for path in paths:
        key = file_key(path)
        if key is None:
            continue
        if key in seen:
            raise NmtError(f"{path} is the same file as {seen[key]}: it would be averaged twice; "
                           f"give each checkpoint once (the numbered checkpoint_<update>.pt, "
                           f"not checkpoint_best.pt/checkpoint_last.pt besides them)")
        seen[key] = path


def average_to_file(paths: Sequence[str | os.PathLike], output: str | os.PathLike) -> Path:
    out_key = file_key(output)
    if out_key is not None and out_key in map(file_key, paths):
        raise NmtError(f"{output}: is one of the checkpoints to average, which writing the "
                       f"average would replace; give another --output")
    out = average_checkpoints(paths)
    dest = save_checkpoint(out, output)
    log.info("averaged %d checkpoints into %s", len(paths), dest)
    return dest
