"""When to save, validate and stop: the loop's policy, and the signals one update carries.

Decisions that depend on a clock or on a signal are taken on each rank as ``StepSignals`` and
summed across ranks with the update's statistics (``Trainer.train_step``), so every rank acts
alike without an extra collective. Only rank 0's clock counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class StepSignals:
    """Per-update signals; after the all-reduce, True when any rank raised them."""

    save_now: bool = False       # --save-interval-minutes elapsed (rank 0's clock)
    time_up: bool = False        # --max-time elapsed (rank 0's clock)
    interrupted: bool = False    # SIGINT/SIGTERM arrived on some rank

    def to_floats(self) -> list[float]:
        return [float(self.save_now), float(self.time_up), float(self.interrupted)]

    @classmethod
    def from_floats(cls, values: Sequence[float]) -> "StepSignals":
        v = list(values) + [0.0] * (3 - len(values))
        return cls(v[0] > 0, v[1] > 0, v[2] > 0)


@dataclass(frozen=True)
class Decision:
    validate: bool
    save: bool
    stop: bool
    # A signal's stop saves at once and validates nothing. ``numbered``: the save is one the
    # schedule has too (checkpoint_<update>.pt; else only checkpoint_last.pt, a point to
    # resume from that --keep-last and --average-last never see). ``deferred``: the
    # validation the schedule had here, run by the resumed run before it trains on.
    numbered: bool = True
    deferred: bool = False


class Policy:
    """Turns the run's options and an update's outcome into a :class:`Decision`."""

    def __init__(self, cfg, is_main: bool, clock: Callable[[], float] = time.perf_counter):
        self.cfg = cfg
        self.is_main = is_main
        self.clock = clock
        self.start = self.last_save = clock()
        self.valid_every = (cfg.validate_interval_updates
                            if cfg.validate_interval_updates is not None
                            else cfg.save_interval_updates)

    def local_signals(self, interrupted: bool) -> StepSignals:
        now, cfg = self.clock(), self.cfg
        save_now = (self.is_main and bool(cfg.save_interval_minutes)
                    and now - self.last_save >= 60 * cfg.save_interval_minutes)
        time_up = self.is_main and bool(cfg.max_time) and now - self.start >= cfg.max_time
        return StepSignals(save_now, time_up, interrupted)

    def decide(self, update: int, skipped: bool, end_of_epoch: bool, epoch: int,
               signals: StepSignals) -> Decision:
        cfg = self.cfg
        # What the schedule does here (as if no signal had come) ...
        end = bool((cfg.max_update and update >= cfg.max_update) or signals.time_up
                   or (end_of_epoch and cfg.max_epoch and epoch >= cfg.max_epoch))
        by_updates = bool(cfg.save_interval_updates and not skipped
                          and update % cfg.save_interval_updates == 0)
        by_epoch = end_of_epoch and not cfg.save_interval_updates and not cfg.save_interval_minutes
        scheduled = by_updates or signals.save_now or by_epoch or end
        due = scheduled or bool(self.valid_every and not skipped
                                and update % self.valid_every == 0)
        validate = due and not (update < cfg.validate_after_updates and not end)
        if not signals.interrupted:
            return Decision(validate=validate, save=scheduled, stop=end)
        # ... and on a signal: save at once, validate nothing (a scheduler's grace period
        # before SIGKILL is short); the resumed run validates where the schedule did.
        return Decision(validate=False, save=True, stop=True, numbered=scheduled,
                        deferred=validate)

    @staticmethod
    def validation_stopped(decision: Decision) -> Decision:
        """A signal stopped the validation that ``decision`` asked for: save and stop as a
        signal at this update does; the resumed run validates here (judged if a save)."""
        return Decision(validate=False, save=True, stop=True, numbered=decision.save,
                        deferred=True)

    def saved(self) -> None:
        self.last_save = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.start


__all__ = ["StepSignals", "Decision", "Policy"]
