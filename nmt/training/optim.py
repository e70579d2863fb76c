"""The optimizer (Adam as the paper, or AdamW) and the learning-rate schedules.

The paper's schedule (section 5.3, eq. 5; ``noam``, the default):

    lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)

``step`` is the number of the update being made, counted from 1. ``--lr`` gives its peak (the
rate at update ``warmup``) directly instead of ``scale``.

fairseq's ``inverse_sqrt``, as fairseq computes it: with ``n`` updates made before this one,
``warmup_init_lr + n * (lr - warmup_init_lr) / warmup`` during the warm-up (the first update
runs at ``warmup_init_lr``), then ``lr * sqrt(warmup / n)``. ``cosine``: the same linear
warm-up, then half a cosine from ``lr`` down to ``min_lr`` at update ``total`` (--max-update).

With ``period`` > 0 (``nmt-train --lr-period N``), the learning rate after the warm-up runs in
cosine cycles of ``period`` updates with warm restarts (SGDR, Loshchilov and Hutter 2017): each
cycle starts at eq. 5's value for its first update and falls along half a cosine to near zero,
so the cycles' peaks follow eq. 5. The checkpoint at the end of a cycle has been annealed; such
snapshots are better single models than those taken at eq. 5's high rate, and differ from one
another enough to make a good ensemble (snapshot ensembles, Huang et al. 2017).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from nmt.errors import NmtError
from nmt.training.config import OPTIMIZERS, SCHEDULES

ADAM_BETAS = (0.9, 0.98)   # beta1, beta2 of the paper
ADAM_EPS = 1e-9


def make_optimizer(params: Iterable[torch.nn.Parameter], *, kind: str = "adam",
                   weight_decay: float = 0.0, fused: bool = True) -> torch.optim.Optimizer:
    """Adam as in the paper (``weight_decay`` then adds an L2 term to the gradients) or AdamW
    (decoupled weight decay, as fairseq's ``adam`` applies it); the learning rate is set by
    :class:`LRSchedule` before each step.

    The fused implementation (one pass over each tensor, on CPU too since torch 2.4) is about
    5x faster than foreach on CPU, where the update is memory bound; older torch falls back.
    """
    if kind not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {kind!r}")
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    params = list(params)
    kwargs: dict[str, Any] = {"lr": 0.0, "betas": ADAM_BETAS, "eps": ADAM_EPS,
                              "weight_decay": weight_decay}
    if fused:
        try:
            return cls(params, fused=True, **kwargs)
        except (RuntimeError, TypeError, ValueError):
            pass
    return cls(params, foreach=True, **kwargs)


def noam_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Eq. 5 at update ``step`` (>= 1)."""
    step = max(1, int(step))
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def cyclic_lr(step: int, d_model: int, warmup: int, scale: float, period: int) -> float:
    """Eq. 5 through the warm-up, then cosine cycles of ``period`` updates that restart on it.

    Update ``warmup + k * period + 1`` starts cycle k at eq. 5's rate for that update; the
    cycle's last update (``warmup + (k + 1) * period``) runs at about (pi / period)^2 / 4 of it.
    """
    step = max(1, int(step))
    if period <= 0 or step <= warmup:
        return noam_lr(step, d_model, warmup, scale)
    pos = (step - warmup - 1) % period             # 0 .. period-1 within the cycle
    peak = noam_lr(step - pos, d_model, warmup, scale)
    return peak * 0.5 * (1.0 + math.cos(math.pi * pos / period))


def noam_scale_for_peak(lr: float, d_model: int, warmup: int) -> float:
    """The eq. 5 scale whose peak (at update ``warmup``) is ``lr``."""
    return lr / noam_lr(warmup, d_model, warmup)


def warmup_then_decay_lr(step: int, kind: str, lr: float, warmup: int, warmup_init_lr: float = 0.0,
                         min_lr: float = 0.0, total: int = 0) -> float:
    """``inverse_sqrt`` or ``cosine`` at update ``step`` (>= 1): see the module docstring."""
    n = max(0, int(step) - 1)                      # updates made before this one
    if n < warmup:
        return warmup_init_lr + n * (lr - warmup_init_lr) / warmup
    if kind == "inverse_sqrt":
        return lr * math.sqrt(warmup / n) if n else lr
    progress = min(1.0, (n - warmup) / max(1, total - warmup))
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class ScheduleSpec:
    """Which learning-rate schedule and its numbers (TrainConfig's --lr-scheduler options)."""

    kind: str = "noam"
    warmup: int = 4000
    scale: float = 1.0            # noam: eq. 5's multiplier
    period: int = 0               # noam: cosine cycles after the warm-up (0: none)
    lr: float | None = None       # the peak; noam: sets scale; inverse_sqrt/cosine: required
    warmup_init_lr: float = 0.0   # inverse_sqrt/cosine: the rate of the first update
    min_lr: float = 0.0           # cosine: the rate at update total
    total: int = 0                # cosine: the update where it reaches min_lr (--max-update)

    def check(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown learning-rate schedule {self.kind!r}")
        if self.warmup < 1:
            raise ValueError("warmup must be >= 1")
        if self.period < 0:
            raise ValueError("period must be >= 0")
        if self.kind != "noam" and self.lr is None:
            raise ValueError(f"the {self.kind} schedule needs a peak learning rate (lr)")
        if self.kind == "cosine" and self.total <= self.warmup:
            raise ValueError("the cosine schedule needs a total number of updates beyond the "
                             "warm-up")


class LRSchedule:
    """Sets the optimizer's learning rate before every update, by a :class:`ScheduleSpec`."""

    def __init__(self, optimizer: torch.optim.Optimizer, d_model: int,
                 spec: ScheduleSpec | None = None, **fields: Any):
        spec = spec or ScheduleSpec(**fields)
        spec.check()
        self.spec = spec
        self.optimizer = optimizer
        self.d_model = d_model
        self.warmup = spec.warmup
        self.period = spec.period
        self.scale = (spec.scale if spec.kind != "noam" or spec.lr is None
                      else noam_scale_for_peak(spec.lr, d_model, spec.warmup))
        self.step_num = 0    # updates made so far

    def lr_at(self, step: int) -> float:
        s = self.spec
        if s.kind == "noam":
            return cyclic_lr(step, self.d_model, self.warmup, self.scale, self.period)
        assert s.lr is not None
        return warmup_then_decay_lr(step, s.kind, s.lr, s.warmup, s.warmup_init_lr, s.min_lr,
                                    s.total)

    def prepare_step(self) -> float:
        """Set the learning rate for the next update (number step_num + 1) and return it."""
        lr = self.lr_at(self.step_num + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def advance(self) -> None:
        """Count an update actually made (fp16 overflow skips do not count)."""
        self.step_num += 1

    def state_dict(self) -> dict[str, Any]:
        return {"step_num": self.step_num, "d_model": self.d_model, "warmup": self.warmup,
                "scale": self.scale, "period": self.period, "kind": self.spec.kind,
                "lr": self.spec.lr, "warmup_init_lr": self.spec.warmup_init_lr,
                "min_lr": self.spec.min_lr, "total": self.spec.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_num = int(state["step_num"])


def check_optimizer_state(optimizer: torch.optim.Optimizer, saved: Any) -> None:
    """NmtError unless the saved Adam state fits ``optimizer``'s parameters: the same groups
    and sizes, and per parameter tensors of its shape, a floating dtype, dense and contiguous
    (a broadcast view of the right shape would make the fused kernel write out of bounds: a
    crash, not an error). Checked before torch's load_state_dict, which trusts it."""
    def bad(what: str) -> NmtError:
        return NmtError(f"the checkpoint's optimizer state is damaged ({what}); resume from "
                        f"another checkpoint, or start afresh with --no-resume")

    if not (isinstance(saved, dict) and isinstance(saved.get("param_groups"), list)
            and isinstance(saved.get("state"), dict)):
        raise bad("not an optimizer state")
    groups = optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        raise bad(f"{len(saved['param_groups'])} parameter groups, this model {len(groups)}")
    params: dict = {}
    for mine, theirs in zip(groups, saved["param_groups"]):
        ids = theirs.get("params") if isinstance(theirs, dict) else None
        if not isinstance(ids, list) or len(ids) != len(mine["params"]):
            raise bad("a parameter group of another size")
        params.update(zip(ids, mine["params"]))
    for pid, entry in saved["state"].items():
        if pid not in params or not isinstance(entry, dict):
            raise bad(f"state for an unknown parameter {pid!r}")
        for key, value in entry.items():
            _check_state_tensor(params[pid], pid, key, value, bad)


def _check_state_tensor(p: torch.Tensor, pid, key: str, value, bad) -> None:
    if not torch.is_tensor(value):
        raise bad(f"{key} of parameter {pid} is not a tensor")
    if key == "step":
        if value.numel() != 1:
            raise bad(f"step of parameter {pid} has {value.numel()} values")
        return
    if (tuple(value.shape) != tuple(p.shape) or not value.is_floating_point() or value.is_sparse
            or not value.is_contiguous()
            or value.untyped_storage().nbytes() < value.numel() * value.element_size()):
        raise bad(f"{key} of parameter {pid}: shape {tuple(value.shape)}, {value.dtype}, "
                  f"{'contiguous' if value.is_contiguous() else 'strided'}; the parameter "
                  f"is {tuple(p.shape)}")
