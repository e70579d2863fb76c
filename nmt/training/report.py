"""What a training run says (rank 0): its first line and the warnings about its options, the
line every --log-interval updates, a skipped non-finite update, and the summary at its end.
The periodic line and the summary also go to the JSON-lines log (and TensorBoard)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from nmt.errors import NmtError
from nmt.search.config import PRESET_FIELDS
from nmt.training.config import TrainConfig
from nmt.training.curves import plot_curves
from nmt.training.meter import memory_stats

log = logging.getLogger("nmt.train")

TRY = "try a smaller --lr-scale, --clip-norm or fp32"


def start(cfg: TrainConfig, arch: str, n_params: int, n_train: int, world_size: int, device,
          num_updates: int) -> None:
    """The run's first line, and warnings about options that undo what they are for."""
    log.info("model %s: %d parameters; %d training pairs; %d ranks x %d max tokens x "
             "update-freq %d; device %s, %s%s%s%s", arch, n_params, n_train, world_size,
             cfg.max_tokens, cfg.update_freq, device, cfg.precision,
             "; fast dropout masks" if cfg.dropout_masks == "fast" else "",
             f"; loss in chunks of {cfg.loss_chunk} tokens" if cfg.loss_chunk else "",
             f"; R-Drop alpha {cfg.rdrop_alpha:g}" if cfg.rdrop_alpha else "")
    if cfg.loss_chunk and cfg.precision != "fp32":
        log.warning("--loss-chunk applies to float32 training only; with --precision %s the "
                    "logits are computed whole", cfg.precision)
    if cfg.loss_chunk and cfg.rdrop_alpha:
        log.warning("--loss-chunk does not apply with --rdrop-alpha: R-Drop compares the two "
                    "passes' whole output distributions, so the logits are computed whole")
    if cfg.max_update and cfg.max_update < cfg.warmup and num_updates < cfg.max_update:
        log.warning("--max-update %d ends the run before its warm-up of %d updates: the "
                    "learning rate never reaches its peak and the model will be undertrained; "
                    "give a shorter warm-up, e.g. --warmup %d", cfg.max_update, cfg.warmup,
                    max(1, cfg.max_update // 4))
    unused = [f"--valid-{name.replace('_', '-')}" for name in PRESET_FIELDS
              if getattr(cfg, f"valid_{name}") is not None]
    if unused and not cfg.metric_needs_decoding:
        log.warning("%s: validation does not decode in this run, so %s no effect; give "
                    "--valid-bleu or a decoding --best-checkpoint-metric (bleu, chrf, "
                    "bracket-f1)", " ".join(unused), "has" if len(unused) == 1 else "have")
    every = cfg.save_interval_updates
    if cfg.lr_period and (not every or cfg.warmup % every or cfg.lr_period % every):
        log.warning("--lr-period %d: not every cycle's end (updates %d, %d, ...) is saved, so "
                    "annealed snapshots are lost; give a --save-interval-updates that "
                    "divides both --warmup %d and --lr-period %d", cfg.lr_period,
                    cfg.warmup + cfg.lr_period, cfg.warmup + 2 * cfg.lr_period, cfg.warmup,
                    cfg.lr_period)


def check_finite(summary: dict[str, float], update: int) -> None:
    """Stop (every rank) when the mean loss of the last updates is not finite."""
    if not np.isfinite(summary["loss"]):
        raise NmtError(f"the loss became {summary['loss']} at update {update}; {TRY}")


def train_line(summary: dict[str, float], lr: float, update: int, epoch: int, device,
               sinks: tuple) -> None:
    """The periodic training line (``summary``: a Meter's), logged and written to ``sinks``."""
    mem = memory_stats(device)
    rec = {"kind": "train", "update": update, "epoch": epoch, "lr": lr, **summary, **mem}
    for sink in sinks:
        sink.write(rec)
    s = summary
    log.info("epoch %d | update %d | loss %.3f | nll %.3f | ppl %.2f%s | lr %.3e | "
             "gnorm %.3f | %.0f tgt tok/s | %.2f upd/s | rss %.2f GB%s", epoch, update,
             s["loss"], s["nll_loss"], s["ppl"],
             f" | kl {s['rdrop_kl']:.4f}" if "rdrop_kl" in s else "", lr, s["gnorm"],
             s["tgt_tokens_per_s"], s["updates_per_s"], mem["rss_gb"],
             f" | gpu {mem['gpu_max_gb']:.2f} GB" if "gpu_max_gb" in mem else "")


def nonfinite(stats: Any, trainer, max_nonfinite: int, save_dir: Path, is_main: bool) -> None:
    """A skipped NaN/inf update (``stats``: its StepStats): warn; give up after
    ``max_nonfinite`` in a row."""
    n = trainer.nonfinite_in_a_row
    attempted = trainer.num_updates + 1     # skipped updates do not count
    loss = float(stats.loss) / max(stats.ntokens, 1)
    gnorm = float(stats.gnorm)
    scale = trainer.scaler.get_scale() if trainer.scaler is not None else None
    if is_main:
        log.warning("update %d: loss %s, gradient norm %s: not finite, update skipped "
                    "(%d in a row)%s", attempted, loss, gnorm, n,
                    f"; fp16 loss scale lowered to {scale:g}" if scale is not None else "")
    if n >= max_nonfinite:
        raise NmtError(f"the loss or gradient was not finite for {n} updates in a row "
                       f"(last at update {attempted}: loss {loss}, gradient norm {gnorm}); "
                       f"stopped without saving them (the checkpoints in {save_dir} are "
                       f"intact); {TRY}")


def already_done(update: int, max_update: int) -> None:
    """A resumed run with nothing left to train; a warning when its checkpoint is past
    --max-update (its model is a longer run's, not what this command asks for)."""
    if max_update and update > max_update:
        log.warning("already at update %d, past --max-update %d: nothing to train, and the "
                    "model is the longer run's (--no-resume starts afresh)", update, max_update)
    else:
        log.info("already at update %d: nothing to train", update)


def best(jsonl, update: int, metric: str, value: float) -> None:
    """Record that the save of ``update`` is now checkpoint_best.pt (curves.png marks it)."""
    jsonl.write({"kind": "best", "update": update, "metric": metric, "value": value})


def end(summary: dict[str, float], seconds: float, update: int, jsonl, tensorboard,
        save_dir: Path | None) -> None:
    """The summary line and record; closes the logs and draws SAVE_DIR/curves.png (not when
    ``save_dir`` is None: the run's directory is no longer at its path)."""
    log.info("done: %d updates in %.1fs | %.0f target tokens/s | %.3f updates/s",
             update, seconds, summary["tgt_tokens_per_s"], summary["updates_per_s"])
    jsonl.write({"kind": "summary", "update": update, "seconds": seconds, **summary})
    jsonl.close()
    tensorboard.close()
    if save_dir is not None:
        plot_curves(save_dir / "train_log.jsonl", save_dir / "curves.png")


__all__ = ["start", "check_finite", "train_line", "nonfinite", "best", "end"]
