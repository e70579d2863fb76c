"""Running training statistics between log lines, and the process's memory use."""

from __future__ import annotations

import math
import time
from typing import Any

import torch


class Meter:
    """Sums over the updates since the last reset (tensors: no per-update device sync)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss: Any = 0.0
        self.nll: Any = 0.0
        self.gnorm: Any = 0.0
        self.kl: Any = None      # R-Drop's KL term, when the run has one
        self.ntok = self.nsent = self.nsrc = self.updates = 0
        self.start = time.perf_counter()

    def add(self, s) -> None:
        self.loss = self.loss + s.loss
        self.nll = self.nll + s.nll
        self.gnorm = self.gnorm + s.gnorm
        if s.kl is not None:
            self.kl = s.kl if self.kl is None else self.kl + s.kl
        self.ntok += s.ntokens
        self.nsent += s.nsentences
        self.nsrc += s.src_ntokens
        self.updates += 1

    def summary(self) -> dict[str, float]:
        dt = max(time.perf_counter() - self.start, 1e-9)
        ntok = max(self.ntok, 1)
        nll = float(self.nll) / ntok
        out = {"loss": float(self.loss) / ntok, "nll_loss": nll,
               "ppl": math.exp(min(nll, 700.0)),
               "gnorm": float(self.gnorm) / max(self.updates, 1),
               "tgt_tokens_per_s": self.ntok / dt, "src_tokens_per_s": self.nsrc / dt,
               "updates_per_s": self.updates / dt, "sentences": self.nsent}
        if self.kl is not None:
            out["rdrop_kl"] = float(self.kl) / ntok   # per target token, before alpha
        return out


def memory_stats(device: torch.device) -> dict[str, float]:
    """Resident memory of this process (GB) and, on CUDA, the peak allocated GPU memory."""
    out: dict[str, float] = {}
    try:
        import psutil
        out["rss_gb"] = round(psutil.Process().memory_info().rss / 2 ** 30, 3)
    except ImportError:
        import resource
        out["rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 3)
    if device.type == "cuda":
        out["gpu_max_gb"] = round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 3)
    return out


__all__ = ["Meter", "memory_stats"]
