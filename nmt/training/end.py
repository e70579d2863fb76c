"""The end of a training run: averaged checkpoints, the ensemble listing, and the last log
line that compares them on validation. :func:`finish` is given what it works with, as a
:class:`RunEnd`; it returns the checkpoint to use. A run stopped by a signal ends in
:class:`TrainingInterrupted` instead."""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from nmt import checkpoint as ckpt_io
from nmt.errors import NmtError
from nmt.training.average import average_to_file
from nmt.training.config import TrainConfig
from nmt.training.distributed import DistInfo, barrier
from nmt.training.savedir import SaveDir, checkpoint_update
from nmt.training.selection import Selection

log = logging.getLogger("nmt.train")


class TrainingInterrupted(NmtError):
    """SIGINT/SIGTERM arrived: a checkpoint was saved; exit code 128 + the signal number."""

    def __init__(self, signum: int, update: int, path: Path | None):
        name = signal.Signals(signum).name if signum else "a signal"
        saved = f"saved {path}" if path else "checkpoint saved by rank 0"
        super().__init__(f"interrupted by {name} at update {update}; {saved}; run the same "
                         f"command again to resume")
        self.exit_code = 128 + (signum or signal.SIGTERM)


@dataclass
class RunEnd:
    """What the end of a run works with."""

    cfg: TrainConfig              # average_last/best, ensemble_best, best_checkpoint_metric
    save_dir: SaveDir
    selection: Selection          # the scores of the saved checkpoints
    info: DistInfo                # rank 0 writes; every rank waits for it
    stopped_early: bool           # --patience ran out
    model: Any                    # the run's model: averages are validated in it (then restored)
    device: Any
    # validate(kind, name): validation of the model's current weights, logged as KIND/NAME;
    # None without a validation split.
    validate: Callable[[str, str], dict[str, Any] | None] | None
    # validate_ensemble(models, name): decoding scores of MODELS as one ensemble, logged;
    # None when validation does not decode.
    validate_ensemble: Callable[[list, str], dict[str, Any]] | None


def finish(end: RunEnd) -> Path:
    """Average when asked; list the ensemble when asked; return the checkpoint to use."""
    cfg = end.cfg
    final = end.save_dir.last
    if cfg.best_checkpoint_metric != "loss" or cfg.patience:
        final = end.save_dir.best if end.save_dir.best.exists() else final
    if end.info.is_main:
        end.save_dir.check_unmoved(f"{final.name} there is not this run's")
        averaged = average(end)
        if averaged:
            final = averaged[0][0]
        report_final(end, final, averaged + ensemble(end))
    barrier(end.info)
    return final.resolve()


def ensemble(end: RunEnd) -> list[tuple[Path, float | None]]:
    """ensemble_best<N>.txt (--ensemble-best): the N best checkpoints, one absolute path
    per line, oldest first; validated as an ensemble when the metric decodes."""
    from nmt.io import atomic_write

    n = end.cfg.ensemble_best
    if not n:
        return []
    end.save_dir.check_unmoved(f"ensemble_best{n}.txt was not written")
    paths = [p.resolve() for p in best_numbered(end, n, "for the ensemble")]
    if not paths:
        return []
    # Named by the N asked for, so that scripts find it (the warning says when fewer).
    listing = end.save_dir.path / f"ensemble_best{n}.txt"
    with atomic_write(listing, "w") as fh:
        fh.write("".join(f"{p}\n" for p in paths))
    score = None
    if end.validate_ensemble is not None and not end.info.enabled:
        score = end.selection.value(validate_ensemble(end, paths, listing.name))
    return [(listing, score)]


def validate_ensemble(end: RunEnd, paths: list[Path], name: str) -> dict[str, Any]:
    """Decoding scores of the checkpoints in ``paths`` decoded as one ensemble, as
    ``nmt-generate PATHS...`` would (no validation loss: that is per model)."""
    import copy

    models = []
    for path in paths:
        m = copy.deepcopy(end.model)
        m.load_state_dict(ckpt_io.load_checkpoint(path, end.device)["model"])
        models.append(m)
    return end.validate_ensemble(models, name)


def best_numbered(end: RunEnd, n: int, purpose: str) -> list[Path]:
    """The numbered checkpoints of the N best scored updates still on disk, oldest first
    (a warning when fewer than N are)."""
    have = {checkpoint_update(p): p for p in end.save_dir.numbered()}
    ups = end.selection.best_updates(n, set(have))
    if len(ups) < n:
        log.warning("only %d scored checkpoints %s (asked for %d best)", len(ups), purpose, n)
    return [have[u] for u in ups]


def average(end: RunEnd) -> list[tuple[Path, float | None]]:
    """checkpoint_avg<N>.pt (--average-last) and checkpoint_avg_best<N>.pt (--average-best),
    each validated: [(path, score)], the last-N average first."""
    cfg, out = end.cfg, []

    def write(paths: list[Path], name: str) -> Path:
        # checked just before each write: averaging many checkpoints takes a while
        end.save_dir.check_unmoved(f"{name} was not written")
        return average_to_file(paths, end.save_dir.path / name)

    numbered = end.save_dir.numbered()
    if cfg.average_last:
        paths = numbered[-cfg.average_last:]
        if len(paths) < cfg.average_last:
            log.warning("only %d checkpoints to average (asked for %d)", len(paths),
                        cfg.average_last)
        out.append(write(paths, f"checkpoint_avg{len(paths)}.pt"))
    if cfg.average_best:
        best = best_numbered(end, cfg.average_best, "to average")
        if best:
            out.append(write(best, f"checkpoint_avg_best{len(best)}.pt"))
    return [(p, score_checkpoint(end, p)) for p in out]


def score_checkpoint(end: RunEnd, path: Path) -> float | None:
    """The selection metric of an averaged checkpoint on the validation split."""
    if end.validate is None or end.info.enabled:
        return None
    saved = {k: v.clone() for k, v in end.model.state_dict().items()}
    end.model.load_state_dict(ckpt_io.load_checkpoint(path, end.device)["model"])
    try:
        stats = end.validate("valid_averaged", path.name)
    finally:
        end.model.load_state_dict(saved)
    return end.selection.value(stats)


def report_final(end: RunEnd, final: Path, averaged: list[tuple[Path, float | None]]) -> None:
    """The final log line; ``averaged``: the averaged checkpoints and ensemble listings,
    with their validation scores."""
    sel, best = end.selection, end.save_dir.best
    parts = [f"{best.name}: {sel.describe(sel.best)} "
             f"(update {sel.best_update})"] if sel.best is not None else []
    parts += [f"{p.name}: {sel.describe(v)}" for p, v in averaged]
    scored = [(v, p) for p, v in averaged if v is not None]
    if sel.best is not None:
        scored.append((sel.best, best))
    if scored:
        top = scored[0]
        for cand in scored[1:]:
            if not sel.at_least_as_good(top[0], cand[0]):
                top = cand
        parts.append(f"best on validation: {top[1].name}")
        if top[1].suffix == ".txt":
            parts.append(f"printed: {final.name}, one checkpoint (ensemble: nmt-generate "
                         f"$(cat {top[1]}))")
        elif final in (p for p, _ in averaged) and top[1].name != final.name:
            # (an ensemble listing alone prints no average: say nothing of one)
            parts.append(f"printed: the average {final.name}, as --average-last/"
                         f"--average-best ask (use {top[1].name} for the best "
                         f"validation score)")
    why = "stopped early (--patience)" if end.stopped_early else "finished"
    log.info("%s; %s; use %s", why, "; ".join(parts) or "no validation", final)


__all__ = ["RunEnd", "TrainingInterrupted", "finish"]
