"""The end of a training run: averaged checkpoints, the ensemble listing, and the last log
line that compares them on validation (a part of :class:`nmt.training.loop.Run`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from nmt import checkpoint as ckpt_io
from nmt.training import validate as V
from nmt.training.average import average_to_file
from nmt.training.curves import decoding_log_suffix
from nmt.training.distributed import barrier

log = logging.getLogger("nmt.train")


class EndOfRun:
    """Mixed into Run: uses its cfg, save_dir, selection, model, data, valid_ds, references,
    metrics, device, info, signals, trainer, epoch, jsonl, stopped_early and validate()."""

    def _finish(self) -> Path:
        """Average when asked; list the ensemble when asked; return the checkpoint to use."""
        final = self.save_dir.last
        if self.cfg.best_checkpoint_metric != "loss" or self.cfg.patience:
            final = self.save_dir.best if self.save_dir.best.exists() else final
        averaged: list[tuple[Path, float | None]] = []
        if self.is_main:
            averaged = self._average()
            if averaged:
                final = averaged[0][0]
            self._report_final(final, averaged + self._ensemble())
        barrier(self.info)
        return final.resolve()

    def _ensemble(self) -> list[tuple[Path, float | None]]:
        """ensemble_best<N>.txt (--ensemble-best): the N best checkpoints, one absolute path
        per line, oldest first; validated as an ensemble when the metric decodes."""
        from nmt.io import atomic_write

        n = self.cfg.ensemble_best
        if not n:
            return []
        paths = [p.resolve() for p in self._best_numbered(n, "for the ensemble")]
        if not paths:
            return []
        # Named by the N asked for, so that scripts find it (the warning says when fewer).
        listing = self.save_dir.path / f"ensemble_best{n}.txt"
        with atomic_write(listing, "w") as fh:
            fh.write("".join(f"{p}\n" for p in paths))
        score = None
        if self.valid_ds is not None and self.metrics and not self.info.enabled:
            score = self.selection.value(self._validate_ensemble(paths, listing.name))
        return [(listing, score)]

    def _validate_ensemble(self, paths: list[Path], name: str) -> dict[str, Any]:
        """Decoding scores of the checkpoints in ``paths`` decoded as one ensemble, as
        ``nmt-generate PATHS...`` would (no validation loss: that is per model)."""
        import copy

        models = []
        for path in paths:
            m = copy.deepcopy(self.model)
            m.load_state_dict(ckpt_io.load_checkpoint(path, self.device)["model"])
            models.append(m)
        stats = V.decoding_scores(models, self.data, self.valid_ds, self.references,
                                  self.search_config(), self.device, self.metrics,
                                  should_stop=lambda: bool(self.signals.received))
        rec = {"kind": "valid_ensemble", "update": self.trainer.num_updates,
               "epoch": self.epoch, "checkpoint": name, **stats}
        self.jsonl.write(rec)
        log.info("%s (%d checkpoints) | update %d%s", name, len(paths), self.trainer.num_updates,
                 decoding_log_suffix(stats))
        return stats

    def _best_numbered(self, n: int, purpose: str) -> list[Path]:
        """The numbered checkpoints of the N best scored updates still on disk, oldest first
        (a warning when fewer than N are)."""
        from nmt.training.savedir import checkpoint_update

        have = {checkpoint_update(p): p for p in self.save_dir.numbered()}
        ups = self.selection.best_updates(n, set(have))
        if len(ups) < n:
            log.warning("only %d scored checkpoints %s (asked for %d best)", len(ups), purpose, n)
        return [have[u] for u in ups]

    def _average(self) -> list[tuple[Path, float | None]]:
        """checkpoint_avg<N>.pt (--average-last) and checkpoint_avg_best<N>.pt (--average-best),
        each validated: [(path, score)], the last-N average first."""
        out = []
        numbered = self.save_dir.numbered()
        if self.cfg.average_last:
            paths = numbered[-self.cfg.average_last:]
            if len(paths) < self.cfg.average_last:
                log.warning("only %d checkpoints to average (asked for %d)", len(paths),
                            self.cfg.average_last)
            out.append(average_to_file(paths,
                                       self.save_dir.path / f"checkpoint_avg{len(paths)}.pt"))
        if self.cfg.average_best:
            best = self._best_numbered(self.cfg.average_best, "to average")
            if best:
                out.append(average_to_file(best, self.save_dir.path /
                                           f"checkpoint_avg_best{len(best)}.pt"))
        return [(p, self._score_checkpoint(p)) for p in out]

    def _score_checkpoint(self, path: Path) -> float | None:
        """The selection metric of an averaged checkpoint on the validation split."""
        if self.valid_ds is None or self.info.enabled:
            return None
        saved = {k: v.clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(ckpt_io.load_checkpoint(path, self.device)["model"])
        try:
            stats = self.validate("valid_averaged", path.name)
        finally:
            self.model.load_state_dict(saved)
        return self.selection.value(stats)

    def _report_final(self, final: Path, averaged: list[tuple[Path, float | None]]) -> None:
        """The final log line; ``averaged``: the averaged checkpoints and ensemble listings,
        with their validation scores."""
        sel = self.selection
        parts = [f"{self.save_dir.best.name}: {sel.describe(sel.best)} "
                 f"(update {sel.best_update})"] if sel.best is not None else []
        parts += [f"{p.name}: {sel.describe(v)}" for p, v in averaged]
        scored = [(v, p) for p, v in averaged if v is not None]
        if sel.best is not None:
            scored.append((sel.best, self.save_dir.best))
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
        why = "stopped early (--patience)" if self.stopped_early else "finished"
        log.info("%s; %s; use %s", why, "; ".join(parts) or "no validation", final)


__all__ = ["EndOfRun"]
