"""``nmt-train --init-from CKPT``: a new run that starts from another run's weights.

The model is the checkpoint's: its configuration comes from the checkpoint, and an ``--arch``,
``-o KEY=VALUE`` or ``--[no-]share-all-embeddings`` that contradicts it is a one-line error,
except for the regularization keys (``REGULARIZATION``), which a fine-tuning run may change.
Only the weights are taken: the optimizer, the learning-rate schedule, the data position and
the best-checkpoint selection start afresh. The vocabularies must be the checkpoint's
(``nmt.training.resume.check_init_data``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from nmt import checkpoint as ckpt_io
from nmt.config import ModelConfig, apply_overrides
from nmt.errors import NmtError, UsageError

# Model settings that do not shape the weights and that a fine-tuning run may change with -o.
REGULARIZATION = ("dropout", "attention_dropout", "activation_dropout", "label_smoothing")


def model_config(ckpt: Mapping[str, Any], path: Path | str, arch: str | None,
                 overrides: Mapping[str, Any]) -> ModelConfig:
    """The checkpoint's model configuration with the regularization ``overrides`` applied.

    ``arch`` (None: not given) must name the checkpoint's preset and every other override must
    repeat the checkpoint's value: anything else is a UsageError that names the difference.
    """
    saved = ckpt_io.model_config(ckpt)
    if arch is not None and arch != saved.arch:
        from nmt.registry import get_arch

        get_arch(arch)    # an unknown name: the usual error with a suggestion
        raise UsageError(f"--arch {arch} contradicts {path}, a {saved.arch} model: with "
                         f"--init-from the model comes from the checkpoint (leave --arch out)")
    wanted = apply_overrides(saved, overrides)
    diffs = [f"{f.name} {getattr(wanted, f.name)!r} vs {getattr(saved, f.name)!r}"
             for f in dataclasses.fields(ModelConfig)
             if f.name not in REGULARIZATION and getattr(wanted, f.name) != getattr(saved, f.name)]
    if diffs:
        raise UsageError(f"-o contradicts the model configuration of {path} (asked vs "
                         f"saved: {'; '.join(diffs)}): with --init-from only "
                         f"{', '.join(REGULARIZATION[:-1])} and {REGULARIZATION[-1]} may be "
                         f"changed")
    return wanted


def share_embeddings(ckpt: Mapping[str, Any], path: Path | str, asked: bool | None) -> bool:
    """The checkpoint's embedding sharing; ``asked`` (None: not given) must agree with it."""
    shared = bool(ckpt["share_all_embeddings"])
    if asked is not None and bool(asked) != shared:
        flag = "--share-all-embeddings" if asked else "--no-share-all-embeddings"
        raise UsageError(f"{flag} contradicts {path}, whose embeddings are "
                         f"{'' if shared else 'not '}shared: leave it out with --init-from")
    return shared


def load_weights(model, ckpt: Mapping[str, Any], path: Path | str) -> None:
    """Copy the checkpoint's weights into ``model`` (built from :func:`model_config`)."""
    try:
        model.load_state_dict(ckpt["model"], strict=True)
    except RuntimeError as e:
        first = " ".join(str(e).split())[:300]
        raise NmtError(f"{path}: weights do not match the model configuration ({first})"
                       ) from None


def describe(ckpt: Mapping[str, Any]) -> str:
    """Where the checkpoint's weights stand: 'update 1200 of its run', 'an average of 5'."""
    if ckpt.get("averaged_from"):
        return f"an average of {len(ckpt['averaged_from'])} checkpoints"
    update = (ckpt.get("progress") or {}).get("update")
    return f"update {update} of its run" if update is not None else "an inference checkpoint"


__all__ = ["REGULARIZATION", "model_config", "share_embeddings", "load_weights", "describe"]
