"""Which checkpoint is best: the validation metric, its direction, patience, the N best.

``Selection`` sees every validation score of a run (``observe``), says whether it improved on
the best so far (ties count: the newer checkpoint wins), counts validations without
improvement for ``--patience``, and remembers each saved update's score for
``--average-best``. Its state travels in checkpoints so that a resumed run continues it.
"""

from __future__ import annotations

import math
from typing import Any

from nmt.metrics.table import TABLE

# metric -> key in the validation statistics, and whether higher is better
METRIC_KEYS = {m.name: (m.log_key, m.higher_is_better) for m in TABLE if m.log_key is not None}


class Selection:
    def __init__(self, metric: str = "loss"):
        if metric not in METRIC_KEYS:
            raise ValueError(f"unknown metric {metric!r}")
        self.metric = metric
        self.key, self.higher_is_better = METRIC_KEYS[metric]
        self.best: float | None = None
        self.best_update: int | None = None
        self.bad_in_a_row = 0
        self.scores: dict[int, float] = {}       # update -> score of the saved checkpoints

    def value(self, stats: dict[str, Any] | None) -> float | None:
        """The metric's value in validation statistics (None when absent or not finite)."""
        if not stats or stats.get(self.key) is None:
            return None
        v = float(stats[self.key])
        return v if math.isfinite(v) else None

    def at_least_as_good(self, a: float, b: float | None) -> bool:
        if b is None:
            return True
        return a >= b if self.higher_is_better else a <= b

    def observe(self, update: int, value: float | None) -> bool:
        """Record a validation score; True when it is at least as good as the best so far."""
        if value is None:
            return False
        improved = self.at_least_as_good(value, self.best)
        if improved:
            if self.best is None or value != self.best:
                self.bad_in_a_row = 0
            self.best, self.best_update = value, update
        else:
            self.bad_in_a_row += 1
        return improved

    def record_saved(self, update: int, value: float | None) -> None:
        if value is not None:
            self.scores[update] = value

    def out_of_patience(self, patience: int) -> bool:
        return patience > 0 and self.bad_in_a_row >= patience

    def best_updates(self, n: int, available: set[int] | None = None) -> list[int]:
        """The ``n`` best saved updates (newer first among equals), oldest first."""
        sign = -1.0 if self.higher_is_better else 1.0
        cands = [(sign * s, -u, u) for u, s in self.scores.items()
                 if available is None or u in available]
        return sorted(u for _, _, u in sorted(cands)[:n])

    def describe(self, value: float | None) -> str:
        return "n/a" if value is None else f"{self.metric} {value:.4g}"

    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "best": self.best, "best_update": self.best_update,
                "bad_in_a_row": self.bad_in_a_row,
                "scores": [[u, s] for u, s in sorted(self.scores.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a saved selection; a run that changed metric starts the new one afresh."""
        if state.get("metric") == self.metric:
            self.best, self.best_update = state["best"], state["best_update"]
            self.bad_in_a_row = int(state["bad_in_a_row"])
            self.scores = {int(u): float(s) for u, s in state["scores"]}


__all__ = ["Selection", "METRIC_KEYS"]
