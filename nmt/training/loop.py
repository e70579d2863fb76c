"""The training run: data, model, updates, validation, checkpoints, resume, averaging.

``train(TrainConfig(...), data_dir)`` is what ``nmt-train`` calls; it returns the path of the
final checkpoint (the averaged one when ``average_last`` is set). Only rank 0 writes files.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt.config import ModelConfig
from nmt.data.batching import TokenBatchSampler, collate
from nmt.errors import NmtError, UsageError
from nmt.training import checkpoint as ckpt_io
from nmt.training.average import average_to_file, last_checkpoints, numbered_checkpoints
from nmt.training.curves import JsonlLog, plot_curves
from nmt.training.distributed import (DistInfo, all_gather_object, barrier, collective_failure,
                                      env_dist_info, init_distributed, pick_device,
                                      shutdown_distributed)
from nmt.training.trainer import Trainer, get_rng_state, set_rng_state
from nmt.training.validate import validation_bleu, validation_loss
from nmt.version import __version__

log = logging.getLogger("nmt.train")


@dataclass
class TrainConfig:
    """Everything about a run that is not the model architecture (saved in checkpoints)."""

    arch: str = "transformer_base"
    overrides: dict[str, str] = field(default_factory=dict)
    share_all_embeddings: bool | None = None   # None: share when the vocabulary is joined
    max_tokens: int = 4096                     # per micro-batch and rank (padded tokens)
    max_sentences: int | None = None
    update_freq: int = 1
    lr_scale: float = 1.0
    warmup: int = 4000
    clip_norm: float = 0.0
    seed: int = 1
    max_update: int = 0                        # 0: no limit
    max_epoch: int = 0
    max_time: float = 0.0                      # seconds of this run; 0: no limit
    save_dir: str = "checkpoints"
    save_interval_updates: int = 0
    save_interval_minutes: float = 0.0
    keep_last: int = 5
    average_last: int = 0
    validate_interval_updates: int | None = None   # None: at every save
    valid_subset: str = "valid"
    valid_bleu: bool = False
    precision: str = "fp32"
    device: str = "auto"
    resume: bool = True
    log_interval: int = 100
    ddp_timeout: float = 30.0                  # minutes
    max_nonfinite: int = 10                    # NaN/inf updates in a row before giving up

    def check(self) -> None:
        for name in ("max_tokens", "update_freq", "warmup", "log_interval", "max_nonfinite"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
        for name in ("max_update", "max_epoch", "save_interval_updates", "keep_last",
                     "average_last"):
            if getattr(self, name) < 0:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 0")
        if self.max_time < 0 or self.save_interval_minutes < 0 or self.clip_norm < 0:
            raise UsageError("--max-time, --save-interval-minutes and --clip-norm must be >= 0")
        if self.lr_scale <= 0:
            raise UsageError("--lr-scale must be > 0")
        if self.max_update == 0 and self.max_epoch == 0 and self.max_time == 0:
            raise UsageError("give a stopping criterion: --max-update, --max-epoch or --max-time")
        if not self.ddp_timeout > 0:
            raise UsageError("--ddp-timeout must be > 0")


class TrainingInterrupted(NmtError):
    """SIGINT/SIGTERM arrived: a checkpoint was saved; exit code 128 + the signal number."""

    def __init__(self, signum: int, update: int, path: Path | None):
        name = signal.Signals(signum).name if signum else "a signal"
        saved = f"saved {path}" if path else "checkpoint saved by rank 0"
        super().__init__(f"interrupted by {name} at update {update}; {saved}; run the same "
                         f"command again to resume")
        self.exit_code = 128 + (signum or signal.SIGTERM)


class _Meter:
    """Sums over the updates since the last log line (tensors: no per-update device sync)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss: Any = 0.0
        self.nll: Any = 0.0
        self.gnorm: Any = 0.0
        self.ntok = self.nsent = self.nsrc = self.updates = 0
        self.start = time.perf_counter()

    def add(self, s) -> None:
        self.loss = self.loss + s.loss
        self.nll = self.nll + s.nll
        self.gnorm = self.gnorm + s.gnorm
        self.ntok += s.ntokens
        self.nsent += s.nsentences
        self.nsrc += s.src_ntokens
        self.updates += 1

    def summary(self) -> dict[str, float]:
        dt = max(time.perf_counter() - self.start, 1e-9)
        ntok = max(self.ntok, 1)
        nll = float(self.nll) / ntok
        return {"loss": float(self.loss) / ntok, "nll_loss": nll,
                "ppl": math.exp(min(nll, 700.0)),
                "gnorm": float(self.gnorm) / max(self.updates, 1),
                "tgt_tokens_per_s": self.ntok / dt, "src_tokens_per_s": self.nsrc / dt,
                "updates_per_s": self.updates / dt, "sentences": self.nsent}


def _memory(device: torch.device) -> dict[str, float]:
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


def _link_or_copy(src: Path, dest: Path) -> None:
    """Make ``dest`` the same file as ``src`` atomically (hard link, else copy)."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        if tmp.exists():
            tmp.unlink()
        os.link(src, tmp)
        os.replace(tmp, dest)
    except OSError:
        from nmt.io import atomic_write
        with open(src, "rb") as fin, atomic_write(dest, "wb") as fout:
            while chunk := fin.read(1 << 24):
                fout.write(chunk)


class Run:
    """State of one training run; see :func:`train`."""

    def __init__(self, cfg: TrainConfig, data, data_dir: str):
        cfg.check()
        self.cfg = cfg
        self.data = data
        self.data_dir = data_dir
        self.info: DistInfo = env_dist_info()
        self.device = pick_device(cfg.device, self.info)
        init_distributed(self.info, self.device, cfg.ddp_timeout)
        self.save_dir = Path(cfg.save_dir)
        self.is_main = self.info.is_main
        if self.is_main:
            # Fail now, not at the first save an hour from now.
            try:
                self.save_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise NmtError(f"{self.save_dir}: cannot create save directory "
                               f"({e.strerror})") from None
            if not os.access(self.save_dir, os.W_OK):
                raise NmtError(f"{self.save_dir}: save directory is not writable")

        from nmt.registry import get_arch
        self.model_cfg: ModelConfig = get_arch(cfg.arch, cfg.overrides)
        share = data.joined if cfg.share_all_embeddings is None else cfg.share_all_embeddings
        if share and not data.joined:
            raise UsageError("--share-all-embeddings needs a joined vocabulary "
                             "(nmt-preprocess --joined)")
        self.share = bool(share)
        self.src_vocab = len(data.src_codec.dictionary)
        self.tgt_vocab = len(data.tgt_codec.dictionary)

        # Same initial weights on every rank (DDP also broadcasts rank 0's).
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed % 2 ** 32)
        random.seed(cfg.seed)
        import nmt
        model = nmt.build_model(self.model_cfg, self.src_vocab, self.tgt_vocab,
                                share_all_embeddings=self.share)
        # Different dropout masks per rank; rank 0 keeps the single-process stream.
        torch.manual_seed(cfg.seed + 1000 * self.info.rank)
        self.trainer = Trainer(model, label_smoothing=self.model_cfg.label_smoothing,
                               d_model=self.model_cfg.d_model, warmup=cfg.warmup,
                               lr_scale=cfg.lr_scale, clip_norm=cfg.clip_norm,
                               precision=cfg.precision, device=self.device,
                               dist_info=self.info)
        self.model = model

        if "train" not in data.splits:
            raise NmtError(f"{data_dir}: no 'train' split")
        self.train_ds = data.load_split("train")
        max_pos = getattr(model, "max_positions", None)
        self.sampler = TokenBatchSampler(self.train_ds.src_sizes, self.train_ds.tgt_sizes,
                                         cfg.max_tokens, cfg.max_sentences, cfg.seed,
                                         num_shards=self.info.world_size,
                                         shard_id=self.info.rank, max_positions=max_pos)
        if len(self.sampler.valid_indices) == 0:
            raise NmtError(f"no training sentence fits in --max-tokens {cfg.max_tokens}")
        if self.sampler.num_skipped:
            log.warning("skipping %d training pairs longer than --max-tokens %d or the model's "
                        "max positions", self.sampler.num_skipped, cfg.max_tokens)
        self.valid_ds = None
        if cfg.valid_subset in data.splits:
            self.valid_ds = data.load_split(cfg.valid_subset)
            self.valid_sampler = TokenBatchSampler(
                self.valid_ds.src_sizes, self.valid_ds.tgt_sizes, cfg.max_tokens,
                shuffle=False, num_shards=self.info.world_size, shard_id=self.info.rank,
                max_positions=max_pos)
        else:
            log.warning("no '%s' split in %s: no validation", cfg.valid_subset, data_dir)

        self.epoch = 1
        self.epoch_batches_done = 0
        self.best_loss = math.inf
        self.codec_states = (data.src_codec.to_state(), data.tgt_codec.to_state())
        self.jsonl = JsonlLog(None)   # opened in run(): appended to when resuming

    # --- checkpoints ----------------------------------------------------------------------------
    def _checkpoint(self, rng_states: list[Any], valid: dict[str, float] | None) -> dict:
        return {
            "format_version": ckpt_io.FORMAT_VERSION,
            "nmt_version": __version__,
            "model_config": self.model_cfg.to_dict(),
            "share_all_embeddings": self.share,
            "src_vocab_size": self.src_vocab,
            "tgt_vocab_size": self.tgt_vocab,
            "src_lang": self.data.src_lang,
            "tgt_lang": self.data.tgt_lang,
            "data_dir": str(self.data_dir),
            "src_codec": self.codec_states[0],
            "tgt_codec": self.codec_states[1],
            "model": self.model.state_dict(),
            "train_config": dataclasses.asdict(self.cfg),
            **self.trainer.state_dict(),
            "rng": {"ranks": rng_states},
            "progress": {"epoch": self.epoch, "update": self.trainer.num_updates,
                         "epoch_batches_done": self.epoch_batches_done,
                         "sampler": self.sampler.signature(),
                         "best_loss": self.best_loss if math.isfinite(self.best_loss) else None,
                         "valid": valid or {}},
        }

    def save(self, valid: dict[str, float] | None) -> Path | None:
        # Every rank's RNG, so that a resumed multi-rank run draws the same dropout masks.
        rng_states = all_gather_object(get_rng_state(), self.info)
        path = None
        if self.is_main:
            t0 = time.perf_counter()
            upd = self.trainer.num_updates
            path = ckpt_io.save_checkpoint(self._checkpoint(rng_states, valid),
                                           self.save_dir / f"checkpoint_{upd}.pt")
            _link_or_copy(path, self.save_dir / "checkpoint_last.pt")
            if valid and valid.get("best"):
                _link_or_copy(path, self.save_dir / "checkpoint_best.pt")
            keep = max(self.cfg.keep_last, self.cfg.average_last, 1)
            for old in numbered_checkpoints(self.save_dir)[:-keep]:
                old.unlink(missing_ok=True)
            log.info("saved %s (%.1fs)", path, time.perf_counter() - t0)
        barrier(self.info)
        return path

    def _remove_stale_temporaries(self) -> None:
        """A run killed while saving leaves '.checkpoint_*.tmp' files (never a checkpoint)."""
        for p in self.save_dir.glob(".checkpoint*.tmp"):
            try:
                p.unlink()
                log.info("removed %s, left by an interrupted save", p)
            except OSError:
                pass

    def _newest_intact_checkpoint(self) -> tuple[Path, dict] | None:
        """checkpoint_last.pt or a newer checkpoint_<update>.pt, newest first; unreadable files
        (truncated, corrupt, refused) are skipped with a warning. None if nothing exists."""
        last = self.save_dir / "checkpoint_last.pt"
        numbered = numbered_checkpoints(self.save_dir)[::-1]
        if not last.exists() and not numbered:
            return None
        skipped: list[str] = []

        def attempt(path: Path) -> dict | None:
            try:
                return ckpt_io.load_checkpoint(path, map_location=self.device)
            except NmtError as e:
                if self.is_main:
                    log.warning("skipping an unusable checkpoint: %s", e)
                skipped.append(path.name)
                return None

        best: tuple[Path, dict] | None = None
        if last.exists():
            ck = attempt(last)
            if ck is not None:
                best = (last, ck)
        # checkpoint_last.pt is normally a hard link to the newest numbered file (one load);
        # a crash between writing checkpoint_<n>.pt and linking leaves a newer numbered one.
        have = best[1].get("progress", {}).get("update", -1) if best else -1
        for path in numbered:
            if int(path.stem.split("_")[1]) <= have:
                break
            ck = attempt(path)
            if ck is not None:
                best = (path, ck)
                break
        if best is None:
            raise NmtError(f"{self.save_dir}: no intact checkpoint to resume from "
                           f"({', '.join(skipped)} unreadable); use --no-resume to start afresh "
                           f"or another --save-dir")
        return best

    def try_resume(self) -> bool:
        """Load the newest intact checkpoint of SAVE_DIR when asked; True if it did."""
        if self.is_main:
            self._remove_stale_temporaries()
        last = self.save_dir / "checkpoint_last.pt"
        if not self.cfg.resume:
            if self.is_main and (last.exists() or numbered_checkpoints(self.save_dir)):
                log.warning("--no-resume: starting afresh; the checkpoints in %s will be "
                            "overwritten", self.save_dir)
            return False
        found = self._newest_intact_checkpoint()
        if found is None:
            return False
        last, ck = found
        if ck["model_config"] != self.model_cfg.to_dict():
            raise NmtError(f"{last}: was trained with another model configuration; use "
                           f"--no-resume or another --save-dir")
        if "progress" not in ck or "optimizer" not in ck:
            raise NmtError(f"{last}: not a training checkpoint (averaged?); cannot resume")
        self.model.load_state_dict(ck["model"])
        self.trainer.load_state_dict(ck)
        prog = ck["progress"]
        self.best_loss = prog.get("best_loss") or math.inf
        ranks = ck["rng"]["ranks"]
        if len(ranks) == self.info.world_size:
            set_rng_state(ranks[self.info.rank])
        if prog.get("sampler") == self.sampler.signature():
            self.epoch, self.epoch_batches_done = prog["epoch"], prog["epoch_batches_done"]
        else:
            # Another --max-tokens or world size: the saved position means other batches.
            log.warning("batching changed since %s: continuing at the start of epoch %d",
                        last, prog["epoch"] + 1)
            self.epoch, self.epoch_batches_done = prog["epoch"] + 1, 0
        if self.is_main:
            log.info("resumed from %s at update %d (epoch %d, batch %d)", last,
                     self.trainer.num_updates, self.epoch, self.epoch_batches_done)
        return True

    # --- validation -----------------------------------------------------------------------------
    def validate(self) -> dict[str, float] | None:
        if self.valid_ds is None:
            return None
        stats = validation_loss(self.trainer, self.valid_ds, self.valid_sampler, self.info)
        if self.cfg.valid_bleu and self.is_main:
            stats.update(validation_bleu(self.model, self.valid_ds, self.data.tgt_codec,
                                         self.device, self.cfg.max_tokens,
                                         self.model_cfg.max_len_a, self.model_cfg.max_len_b))
        barrier(self.info)
        if self.is_main:
            rec = {"kind": "valid", "update": self.trainer.num_updates, "epoch": self.epoch,
                   **stats}
            self.jsonl.write(rec)
            log.info("valid | update %d | loss %.4f | nll %.4f | ppl %.2f%s",
                     self.trainer.num_updates, stats["loss"], stats["nll_loss"], stats["ppl"],
                     f" | bleu {stats['bleu']:.2f}" if "bleu" in stats else "")
        return stats

    # --- the loop -------------------------------------------------------------------------------
    def run(self) -> Path:
        cfg = self.cfg
        resumed = self.try_resume()
        if self.is_main:
            self.jsonl = JsonlLog(self.save_dir / "train_log.jsonl", append=resumed)
        uf = cfg.update_freq
        t_start = time.perf_counter()
        last_save_time = t_start
        meter = _Meter()
        total = _Meter()
        valid_every = (cfg.validate_interval_updates if cfg.validate_interval_updates is not None
                       else cfg.save_interval_updates)
        n_params = sum(p.numel() for p in self.model.parameters())
        if self.is_main:
            log.info("model %s: %d parameters; %d training pairs; %d ranks x %d max tokens x "
                     "update-freq %d; device %s, %s", cfg.arch, n_params, len(self.train_ds),
                     self.info.world_size, cfg.max_tokens, uf, self.device, cfg.precision)
        from nmt.cli.common import make_progress
        progress = make_progress(transient=True) if self.is_main else None
        task = None
        if progress is not None:
            progress.start()
            task = progress.add_task("train", total=cfg.max_update or None,
                                     completed=self.trainer.num_updates, rate="")
        # Resuming a run that already reached --max-update trains nothing more.
        stop = bool(cfg.max_update and self.trainer.num_updates >= cfg.max_update)
        if stop and self.is_main:
            log.info("already at update %d (--max-update %d): nothing to train",
                     self.trainer.num_updates, cfg.max_update)
        signalled = False
        saved_at: Path | None = None
        old_handlers = self._catch_signals()
        try:
            while not stop:
                if cfg.max_epoch and self.epoch > cfg.max_epoch:
                    break
                shard = self.sampler.shard_batches(self.epoch)
                start = self.epoch_batches_done
                while start < len(shard):
                    group_idx = shard[start:start + uf]
                    batches = [None if idx is None else collate(self.train_ds, idx)
                               for idx in group_idx]
                    now = time.perf_counter()
                    # Time-based decisions follow rank 0's clock; a signal on any rank counts.
                    flags = [float(self.is_main and bool(cfg.save_interval_minutes) and
                                   now - last_save_time >= 60 * cfg.save_interval_minutes),
                             float(self.is_main and bool(cfg.max_time)
                                   and now - t_start >= cfg.max_time),
                             float(self._signal != 0)]
                    stats = self.trainer.train_step(batches, flags)
                    start += len(group_idx)
                    self.epoch_batches_done = start
                    upd = self.trainer.num_updates
                    if stats.nonfinite:
                        self._nonfinite(stats)
                    else:
                        meter.add(stats)
                        total.add(stats)
                    if stats.skipped and not stats.nonfinite and self.is_main:
                        log.warning("update skipped (no target tokens)")
                    if progress is not None:
                        progress.update(task, completed=upd, rate=f"epoch {self.epoch}")
                    if upd % cfg.log_interval == 0 and not stats.skipped:
                        self._log_train(meter, stats.lr)
                        meter.reset()
                    end_of_epoch = start >= len(shard)
                    time_up = stats.flags[1] > 0
                    signalled = stats.flags[2] > 0
                    if signalled and self.is_main:
                        log.warning("%s received: saving a checkpoint and stopping (send it "
                                    "again to stop at once)",
                                    signal.Signals(self._signal).name if self._signal
                                    else "a signal")
                    stop = ((cfg.max_update and upd >= cfg.max_update) or time_up or signalled
                            or (end_of_epoch and cfg.max_epoch and self.epoch >= cfg.max_epoch))
                    stop = bool(stop)
                    by_updates = (cfg.save_interval_updates and not stats.skipped
                                  and upd % cfg.save_interval_updates == 0)
                    by_epoch = (end_of_epoch and not cfg.save_interval_updates
                                and not cfg.save_interval_minutes)
                    do_save = bool(by_updates or stats.flags[0] > 0 or by_epoch or stop)
                    # Stopping on a signal: save at once, no validation (a scheduler's grace
                    # period before SIGKILL is short).
                    do_valid = not signalled and (do_save or bool(
                        valid_every and not stats.skipped and upd % valid_every == 0))
                    if end_of_epoch:
                        # The saved position must point at the next batch to train on.
                        self.epoch += 1
                        self.epoch_batches_done = 0
                    if do_valid or do_save:
                        valid = self.validate() if do_valid else None
                        if do_save:
                            if valid and valid.get("loss") is not None:
                                improved = valid["loss"] <= self.best_loss
                                self.best_loss = min(self.best_loss, valid["loss"])
                                valid = {**valid, "best": improved}
                            saved_at = self.save(valid)
                            last_save_time = time.perf_counter()
                    if stop:
                        break
        finally:
            self._restore_signals(old_handlers)
            if progress is not None:
                progress.stop()
        if self.is_main:
            summary = total.summary()
            log.info("done: %d updates in %.1fs | %.0f target tokens/s | %.3f updates/s",
                     self.trainer.num_updates, time.perf_counter() - t_start,
                     summary["tgt_tokens_per_s"], summary["updates_per_s"])
            self.jsonl.write({"kind": "summary", "update": self.trainer.num_updates,
                              "seconds": time.perf_counter() - t_start, **summary})
            self.jsonl.close()
            plot_curves(self.save_dir / "train_log.jsonl", self.save_dir / "curves.png")
        if signalled:
            barrier(self.info)
            raise TrainingInterrupted(self._signal, self.trainer.num_updates, saved_at)
        final = self.save_dir / "checkpoint_last.pt"
        if cfg.average_last and self.is_main:
            paths = last_checkpoints(self.save_dir, cfg.average_last)
            if len(paths) < cfg.average_last:
                log.warning("only %d checkpoints to average (asked for %d)", len(paths),
                            cfg.average_last)
            final = average_to_file(paths, self.save_dir / f"checkpoint_avg{len(paths)}.pt")
        barrier(self.info)
        return final.resolve()

    # --- faults ---------------------------------------------------------------------------------
    def _catch_signals(self) -> dict:
        """SIGINT/SIGTERM: finish the update, save, stop. A second one stops at once."""
        self._signal = 0
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum, frame):
            if self._signal:
                # Checkpoints are written atomically: stopping anywhere is safe.
                raise KeyboardInterrupt
            self._signal = signum   # read by the loop after the current update

        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                old[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):
                pass
        return old

    @staticmethod
    def _restore_signals(old: dict) -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    def _nonfinite(self, stats) -> None:
        """A skipped NaN/inf update: warn; give up after --max-nonfinite in a row."""
        n = self.trainer.nonfinite_in_a_row
        attempted = self.trainer.num_updates + 1     # skipped updates do not count
        loss = float(stats.loss) / max(stats.ntokens, 1)
        gnorm = float(stats.gnorm)
        scale = self.trainer.scaler.get_scale() if self.trainer.scaler is not None else None
        if self.is_main:
            log.warning("update %d: loss %s, gradient norm %s: not finite, update skipped "
                        "(%d in a row)%s", attempted, loss, gnorm, n,
                        f"; fp16 loss scale lowered to {scale:g}" if scale is not None else "")
        if n >= self.cfg.max_nonfinite:
            raise NmtError(f"the loss or gradient was not finite for {n} updates in a row "
                           f"(last at update {attempted}: loss {loss}, gradient norm {gnorm}); "
                           f"stopped without saving them (the checkpoints in {self.save_dir} "
                           f"are intact); try a smaller --lr-scale, --clip-norm or fp32")

    def _log_train(self, meter: _Meter, lr: float) -> None:
        s = meter.summary()
        if not math.isfinite(s["loss"]):
            raise NmtError(f"the loss became {s['loss']} at update {self.trainer.num_updates}; "
                           f"try a smaller --lr-scale, --clip-norm or fp32")
        if not self.is_main:
            return
        mem = _memory(self.device)
        rec = {"kind": "train", "update": self.trainer.num_updates, "epoch": self.epoch,
               "lr": lr, **s, **mem}
        self.jsonl.write(rec)
        log.info("epoch %d | update %d | loss %.3f | nll %.3f | ppl %.2f | lr %.3e | "
                 "gnorm %.3f | %.0f tgt tok/s | %.2f upd/s | rss %.2f GB%s", self.epoch,
                 self.trainer.num_updates, s["loss"], s["nll_loss"], s["ppl"], lr, s["gnorm"],
                 s["tgt_tokens_per_s"], s["updates_per_s"], mem["rss_gb"],
                 f" | gpu {mem['gpu_max_gb']:.2f} GB" if "gpu_max_gb" in mem else "")


def train(cfg: TrainConfig, data, data_dir: str) -> Path:
    """Train on an opened data directory (nmt.data.DataDir or anything with its interface).

    Raises :class:`TrainingInterrupted` after saving when SIGINT/SIGTERM arrived, and
    NmtError when another rank died or hung past ``cfg.ddp_timeout`` minutes.
    """
    try:
        return Run(cfg, data, data_dir).run()
    except RuntimeError as e:
        msg = collective_failure(e, cfg.ddp_timeout)
        if msg is None:
            raise
        raise NmtError(msg) from None
    finally:
        shutdown_distributed()
