"""One update of the paper's training regime, and its state for checkpoints.

An update (``train_step``) runs ``update_freq`` micro-batches forward/backward, sums their losses
and gradients, sums those again across ranks, divides once by the update's number of target
tokens, optionally clips, and makes one Adam step at the learning rate of the schedule (eq. 5 by default).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from nmt.data.buckets import BOS, Batch, dummy_batch
from nmt.runtime import precision_dtype
from nmt.training.distributed import DistInfo, all_reduce_sum, sum_allreduce_hook
from nmt.training.loss import ModelWithLoss
from nmt.training.optim import LRSchedule, ScheduleSpec, check_optimizer_state, make_optimizer
from nmt.training.policy import StepSignals

log = logging.getLogger("nmt.train")


@dataclass
class StepStats:
    """Sums over one update (all ranks). Tensors stay on the device: reading them is a sync."""

    loss: torch.Tensor       # label-smoothed loss, summed over target tokens (nats)
    nll: torch.Tensor        # negative log-likelihood, summed (nats)
    gnorm: torch.Tensor      # gradient norm after normalisation, before clipping
    ntokens: int
    nsentences: int
    src_ntokens: int
    lr: float
    skipped: bool            # not applied: no tokens, or a non-finite loss/gradient
    signals: StepSignals     # save/stop signals, raised when any rank raised them
    nonfinite: bool = False  # the loss or the gradient norm was NaN/inf (fp16: overflow)
    kl: torch.Tensor | None = None   # R-Drop's symmetric KL term, summed (None: R-Drop off)


class Trainer:
    def __init__(self, model: nn.Module, *, label_smoothing: float, d_model: int,
                 warmup: int = 4000, lr_scale: float = 1.0, lr_period: int = 0,
                 schedule: ScheduleSpec | None = None, optimizer: str = "adam",
                 weight_decay: float = 0.0, clip_norm: float = 0.0, precision: str = "fp32",
                 device: torch.device | str = "cpu",
                 dist_info: DistInfo | None = None, pad_idx: int = 0, loss_chunk: int = 0,
                 rdrop_alpha: float = 0.0):
        self.device = torch.device(device)
        self.dist = dist_info or DistInfo()
        dtype = precision_dtype(precision)   # that it can train here: TrainConfig.check
        self.precision = precision
        self.model = model.to(self.device)
        self.criterion = ModelWithLoss(self.model, label_smoothing, pad_idx, loss_chunk,
                                       rdrop_alpha)
        self.wrapped: nn.Module = self.criterion
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.wrapped = DDP(self.criterion, device_ids=ids)
            self.wrapped.register_comm_hook(None, sum_allreduce_hook)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.params, kind=optimizer, weight_decay=weight_decay)
        # ``schedule`` gives the whole schedule; without it, eq. 5 with warmup/lr_scale/lr_period
        self.schedule = LRSchedule(self.optimizer, d_model, schedule or ScheduleSpec(
            warmup=warmup, scale=lr_scale, period=lr_period))
        self.clip_norm = clip_norm
        self.scaler = (torch.amp.GradScaler("cuda", init_scale=2.0 ** 7)
                       if precision == "fp16" else None)
        self.amp_dtype = None if precision == "fp32" else dtype
        self._dummy = dummy_batch(getattr(model, "start_token", BOS)).to(self.device)
        self.num_skipped = 0
        self.nonfinite_in_a_row = 0   # consecutive updates skipped for a NaN/inf loss or gradient

    @property
    def num_updates(self) -> int:
        return self.schedule.step_num

    def _autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def train_step(self, batches: Sequence[Batch | None],
                   signals: StepSignals | None = None) -> StepStats:
        """One update over ``batches`` (this rank's micro-batches; ``None`` = nothing left).

        ``signals`` (nmt.training.policy.StepSignals: save now, time is up, a signal arrived)
        are summed across ranks with the statistics, so every rank takes the same decision
        without an extra collective; the returned ``StepStats.signals`` are the combined ones.

        A NaN or infinite loss or gradient norm never reaches the weights or Adam's moments:
        the update is skipped (and with fp16 the loss scale lowered), ``nonfinite`` is set and
        ``nonfinite_in_a_row`` counts such updates until a good one.
        """
        self.wrapped.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = self._forward_backward(batches)
        loss_sum, nll_sum, kl_sum, counts, flags = self._reduce(
            sums, (signals or StepSignals()).to_floats())
        ntok = counts[0]
        gnorm = self._normalise_and_clip(ntok)
        lr = self.schedule.prepare_step()
        # One host sync per update, so that NaN/inf never reaches the weights or Adam's
        # moments. loss_sum and gnorm are all-reduced values: every rank decides alike.
        nonfinite = ntok > 0 and not bool(torch.isfinite(loss_sum) & torch.isfinite(gnorm))
        skipped = self._apply(ntok, nonfinite)
        self.nonfinite_in_a_row = self.nonfinite_in_a_row + 1 if nonfinite else 0
        if skipped:
            self.num_skipped += 1
        else:
            self.schedule.advance()
        return StepStats(loss_sum, nll_sum, gnorm.detach(), ntok, counts[1], counts[2], lr,
                         skipped, StepSignals.from_floats(flags), nonfinite,
                         kl_sum if self.criterion.rdrop_alpha > 0 else None)

    def _forward_backward(self, batches: Sequence[Batch | None]) -> tuple:
        """Forward and backward over this rank's micro-batches; (loss, nll, kl, ntok, nsent,
        nsrc)."""
        # float64 sums: thousands of per-token losses over update_freq micro-batches.
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        nll_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        kl_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        ntok = nsent = nsrc = 0
        for i, batch in enumerate(batches):
            is_dummy = batch is None
            b = self._dummy if is_dummy else batch.to(self.device, non_blocking=True)
            last = i == len(batches) - 1
            # Accumulate locally; DDP communicates only on the last micro-batch.
            sync = (self.wrapped.no_sync() if self.dist.enabled and not last
                    else contextlib.nullcontext())
            with sync:
                with self._autocast():
                    loss, nll, kl = self.wrapped(b.src_tokens, b.prev_output_tokens,
                                                 b.target, b.target_positions)
                if is_dummy:
                    loss, nll, kl = loss * 0.0, nll * 0.0, kl * 0.0
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()
                else:
                    loss.backward()
            loss_sum += loss.detach()
            nll_sum += nll.detach()
            kl_sum += kl.detach()
            ntok += b.ntokens
            nsent += b.nsentences
            nsrc += b.src_ntokens
        return loss_sum, nll_sum, kl_sum, ntok, nsent, nsrc

    def _reduce(self, sums: tuple, flags: list[float]) -> tuple:
        """Sum the update's statistics and flags over the ranks in one small collective."""
        loss_sum, nll_sum, kl_sum, ntok, nsent, nsrc = sums
        if not self.dist.enabled:
            return loss_sum, nll_sum, kl_sum, (ntok, nsent, nsrc), flags
        stats = torch.tensor([0.0, 0.0, 0.0, ntok, nsent, nsrc, *flags], dtype=torch.float64,
                             device=self.device)
        stats[0] = loss_sum.double()
        stats[1] = nll_sum.double()
        stats[2] = kl_sum.double()
        all_reduce_sum(stats, self.dist)
        vals = stats.tolist()
        return (stats[0], stats[1], stats[2], (int(vals[3]), int(vals[4]), int(vals[5])),
                vals[6:])

    def _normalise_and_clip(self, ntok: int) -> torch.Tensor:
        """Gradients are sums over tokens: make them means over the update's tokens, clip;
        returns the norm before clipping."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.params if p.grad is not None]
        if ntok > 0 and grads:
            torch._foreach_mul_(grads, 1.0 / ntok)
        gnorm = (torch.nn.utils.get_total_norm(grads) if grads
                 else torch.zeros((), device=self.device))
        if self.clip_norm > 0 and grads:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.clip_norm, gnorm)
        return gnorm

    def _apply(self, ntok: int, nonfinite: bool) -> bool:
        """The optimizer step, unless there is nothing to apply; True when skipped."""
        if ntok == 0:
            return True
        if nonfinite:
            if self.scaler is not None:
                # unscale_ recorded the overflow; update() halves the scale (no step taken).
                self.scaler.update()
            return True
        if self.scaler is not None:
            scale_before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            return self.scaler.get_scale() < scale_before
        self.optimizer.step()
        return False

    @torch.no_grad()
    def valid_step(self, batch: Batch | None) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(loss sum, nll sum, ntokens) of one validation batch on this rank."""
        self.criterion.eval()
        if batch is None:
            z = torch.zeros((), device=self.device)
            return z, z, 0
        b = batch.to(self.device, non_blocking=True)
        with self._autocast():
            loss, nll, _ = self.criterion(b.src_tokens, b.prev_output_tokens, b.target,
                                          b.target_positions)
        return loss.float(), nll.float(), b.ntokens

    # --- state for checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(),
                "scheduler": self.schedule.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_optimizer_state(self.optimizer, state["optimizer"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
