"""The training run: set-up, the loop over updates, validation, saving, the end of the run.

``train(TrainConfig(...), data, data_dir)`` is what ``nmt-train`` calls; it returns the path of
the checkpoint to use. What the loop relies on lives beside it: the options
(``config.TrainConfig``), when to save/validate/stop (``policy``), which checkpoint is best
(``selection``), the save directory (``savedir``), signals (``signals``), the checkpoint format
(``nmt.checkpoint``), validation (``validate``). Only rank 0 writes files.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from nmt import checkpoint as ckpt_io
from nmt.config import ModelConfig
from nmt.data.batching import TokenBatchSampler, collate
from nmt.errors import NmtError, UsageError
from nmt.models.dropout import set_dropout_masks
from nmt.search.config import SearchConfig
from nmt.training.config import TrainConfig
from nmt.training.curves import JsonlLog, TensorBoardLog, decoding_log_suffix, plot_curves
from nmt.training.end import EndOfRun
from nmt.training.distributed import (DistInfo, all_gather_object, barrier, collective_failure,
                                      env_dist_info, init_distributed, pick_device,
                                      shutdown_distributed)
from nmt.training.meter import Meter, memory_stats
from nmt.training.optim import ScheduleSpec
from nmt.training.policy import Decision, Policy
from nmt.training.savedir import SaveDir
from nmt.training.selection import Selection
from nmt.training.signals import SignalCatcher, TrainingInterrupted
from nmt.tasks.task import data_task
from nmt.training.trainer import StepStats, Trainer, get_rng_state, set_rng_state
from nmt.training import init_from, resume
from nmt.training import validate as V

log = logging.getLogger("nmt.train")

# progress(update, total or None, text): called after every update on rank 0.
ProgressFn = Callable[[int, "int | None", str], None]


class Run(EndOfRun):
    """State of one training run; see :func:`train`."""

    def __init__(self, cfg: TrainConfig, data, data_dir: str,
                 progress: ProgressFn | None = None):
        cfg.check()
        self.cfg, self.data, self.data_dir = cfg, data, data_dir
        self.progress = progress
        self.info: DistInfo = env_dist_info()
        self.is_main = self.info.is_main
        self.device = pick_device(cfg.device, self.info)
        init_distributed(self.info, self.device, cfg.ddp_timeout)
        self.save_dir = SaveDir(cfg.save_dir)
        self._lock_save_dir()
        try:
            self._set_up()
        except BaseException:
            self.save_dir.release()       # a failed start leaves no empty save directory
            raise

    def _lock_save_dir(self) -> None:
        """Rank 0, the only writer, creates and locks SAVE_DIR until run() ends (a second
        nmt-train into it is refused); the other ranks stop with it when it cannot."""
        problem = None
        if self.is_main:
            try:
                self.save_dir.prepare()
            except NmtError as e:
                problem = e
        verdict = all_gather_object(None if problem is None else str(problem), self.info)[0]
        if problem is not None:
            raise problem
        if verdict is not None:
            raise NmtError(f"rank {self.info.rank}: rank 0 stopped: {verdict}")

    def _set_up(self) -> None:
        cfg = self.cfg
        # The checkpoint to resume from, looked up once (--init-from needs it before the model).
        self._resume_looked, self._resume_found = False, None
        self._build_model()
        self._build_data()
        self.epoch, self.epoch_batches_done = 1, 0
        self.selection = Selection(cfg.best_checkpoint_metric)
        self.jsonl = JsonlLog(None)   # opened in run(): appended to when resuming
        self.tensorboard = TensorBoardLog(None)   # opened in run() on rank 0
        self.signals = SignalCatcher(self._intact_message)

    # --- set-up ---------------------------------------------------------------------------------
    def _build_model(self) -> None:
        import nmt

        cfg, data = self.cfg, self.data
        init = self._init_source() if cfg.init_from else None
        if init is None:
            from nmt.registry import get_arch

            self.model_cfg: ModelConfig = get_arch(cfg.arch_name, cfg.overrides)
            share = data.joined if cfg.share_all_embeddings is None else cfg.share_all_embeddings
        else:
            self.model_cfg = init_from.model_config(init[1], init[0], cfg.arch, cfg.overrides)
            share = init_from.share_embeddings(init[1], init[0], cfg.share_all_embeddings)
        if share and not data.joined:
            raise UsageError("--share-all-embeddings needs a joined vocabulary "
                             "(nmt-preprocess --joined)")
        self.share = bool(share)
        # What the checkpoints record: the preset used, and the file the weights came from.
        self.cfg = dataclasses.replace(cfg, arch=self.model_cfg.arch, init_from=(
            str(init[0].resolve()) if init is not None and not init[2] else None))
        # Same initial weights on every rank (DDP also broadcasts rank 0's).
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed % 2 ** 32)
        random.seed(cfg.seed)
        self.model = nmt.build_model(self.model_cfg, len(data.src_codec.dictionary),
                                     len(data.tgt_codec.dictionary),
                                     share_all_embeddings=self.share)
        if init is not None and not init[2]:
            init_from.load_weights(self.model, init[1], init[0])
            if self.is_main:
                log.info("initialized the model from %s (%s); a fresh optimizer, learning-rate "
                         "schedule and data position", init[0], init_from.describe(init[1]))
        set_dropout_masks(self.model, cfg.dropout_masks)
        # Different dropout masks per rank; rank 0 keeps the single-process stream.
        torch.manual_seed(cfg.seed + 1000 * self.info.rank)
        schedule = ScheduleSpec(cfg.lr_scheduler, cfg.warmup, cfg.lr_scale, cfg.lr_period, cfg.lr,
                                cfg.warmup_init_lr, cfg.min_lr, cfg.max_update)
        self.trainer = Trainer(self.model, label_smoothing=self.model_cfg.label_smoothing,
                               d_model=self.model_cfg.d_model, schedule=schedule,
                               optimizer=cfg.optimizer, weight_decay=cfg.weight_decay,
                               clip_norm=cfg.clip_norm,
                               precision=cfg.precision, device=self.device,
                               dist_info=self.info)

    def _init_source(self) -> tuple[Path, dict, bool]:
        """With --init-from: (path, checkpoint, resuming) of the checkpoint that gives the model
        configuration: SAVE_DIR's newest when the run resumes (CKPT is then not used), else
        CKPT, whose vocabularies must be the data directory's."""
        found = self._resume_point()
        if found is not None:
            if self.is_main:
                log.info("--init-from %s is not used: the run resumes from %s",
                         self.cfg.init_from, found[0])
            return found[0], found[1], True
        path = Path(self.cfg.init_from)
        ck = ckpt_io.load_checkpoint(path)
        warn = log.warning if self.is_main else (lambda msg: None)
        resume.check_init_data(ck, path, self.data, self.data_dir, warn)
        return path, ck, False

    def _build_data(self) -> None:
        cfg, data, info = self.cfg, self.data, self.info
        if "train" not in data.splits:
            raise NmtError(f"{self.data_dir}: no 'train' split")
        self.train_ds = data.load_split("train")
        max_pos = getattr(self.model, "max_positions", None)
        self.sampler = TokenBatchSampler(self.train_ds.src_sizes, self.train_ds.tgt_sizes,
                                         cfg.max_tokens, cfg.max_sentences, cfg.seed,
                                         num_shards=info.world_size, shard_id=info.rank,
                                         max_positions=max_pos)
        if len(self.sampler.valid_indices) == 0:
            raise NmtError(f"no training sentence fits in --max-tokens {cfg.max_tokens}")
        if self.sampler.num_skipped:
            log.warning("skipping %d training pairs longer than --max-tokens %d or the model's "
                        "max positions", self.sampler.num_skipped, cfg.max_tokens)
        self.valid_ds = self.references = None
        self.metrics: list[str] = []
        if cfg.valid_subset not in data.splits:
            if cfg.best_checkpoint_metric != "loss" or cfg.patience:
                raise NmtError(f"{self.data_dir}: no '{cfg.valid_subset}' split, which "
                               f"--best-checkpoint-metric/--patience need")
            log.warning("no '%s' split in %s: no validation", cfg.valid_subset, self.data_dir)
            return
        self.valid_ds = data.load_split(cfg.valid_subset)
        self.valid_sampler = TokenBatchSampler(
            self.valid_ds.src_sizes, self.valid_ds.tgt_sizes, cfg.max_tokens, shuffle=False,
            num_shards=info.world_size, shard_id=info.rank, max_positions=max_pos)
        self.metrics = self._decoding_metrics()
        if self.metrics and self.is_main:
            self.references = V.load_references(data, cfg.valid_subset, self.valid_ds,
                                                self.metrics)
            log.info("validation %s: scored against %s", "/".join(self.metrics),
                     self.references.origin)

    def _decoding_metrics(self) -> list[str]:
        cfg = self.cfg
        chosen = [] if cfg.best_checkpoint_metric == "loss" else [cfg.best_checkpoint_metric]
        if cfg.valid_bleu:
            chosen += [m for m in ("bleu", "chrf") if m not in chosen]
        return chosen

    def search_config(self) -> SearchConfig:
        """Validation decoding: the --valid-* options, else the preset's (as nmt-generate)."""
        return self.cfg.valid_search.resolve(self.model_cfg)

    # --- checkpoints ----------------------------------------------------------------------------
    def _checkpoint(self, rng_states: list[Any], valid: dict[str, Any] | None) -> dict:
        training = {
            "train_config": dataclasses.asdict(self.cfg),
            **self.trainer.state_dict(),
            "rng": {"ranks": rng_states},
            "progress": {"epoch": self.epoch, "update": self.trainer.num_updates,
                         "epoch_batches_done": self.epoch_batches_done,
                         "sampler": self.sampler.signature(),
                         "best_loss": self.selection.best if self.selection.metric == "loss"
                         else None,
                         "selection": self.selection.state_dict(),
                         "valid": valid or {}},
        }
        return ckpt_io.make_checkpoint(
            model_config=self.model_cfg, model_state=self.model.state_dict(),
            share_all_embeddings=self.share, src_codec=self.data.src_codec,
            tgt_codec=self.data.tgt_codec, src_lang=self.data.src_lang,
            tgt_lang=self.data.tgt_lang, data_dir=str(self.data_dir),
            task=data_task(self.data).name, training=training)

    def save(self, valid: dict[str, Any] | None, is_best: bool = False) -> Path | None:
        # Every rank's RNG, so that a resumed multi-rank run draws the same dropout masks.
        rng_states = all_gather_object(get_rng_state(), self.info)
        path = None
        if self.is_main:
            t0 = time.perf_counter()
            upd = self.trainer.num_updates
            self.selection.record_saved(upd, self.selection.value(valid))
            keep = self.selection.best_updates(max(self.cfg.average_best,
                                                   self.cfg.ensemble_best))
            path = self.save_dir.write(self._checkpoint(rng_states, valid), upd, is_best,
                                       max(self.cfg.keep_last, self.cfg.average_last), keep)
            log.info("saved %s (%.1fs)", path, time.perf_counter() - t0)
        barrier(self.info)
        return path

    def try_resume(self) -> bool:
        """Load the newest intact checkpoint of SAVE_DIR when asked; True if it did."""
        found = self._resume_point()
        if found is None:
            return False
        self._resume_found = None     # the only reference to the loaded checkpoint
        self._restore(*found)
        return True

    def _resume_point(self) -> tuple[Path, dict] | None:
        """The newest intact checkpoint of SAVE_DIR when resuming is on, else None (looked up
        once: with --init-from it decides where the model comes from)."""
        if self._resume_looked:
            return self._resume_found
        self._resume_looked = True
        if self.is_main:
            self.save_dir.remove_stale_temporaries()
        if not self.cfg.resume:
            moved = self.save_dir.move_previous_run() if self.is_main else None
            if moved is not None:
                log.warning("--no-resume: starting afresh; the previous run's files are in %s",
                            moved)
            return None
        warn = log.warning if self.is_main else (lambda msg: None)
        self._resume_found = self.save_dir.newest_intact(self.device, warn)
        return self._resume_found

    def _restore(self, path: Path, ck: dict) -> None:
        warn = log.warning if self.is_main else (lambda msg, *a: None)
        if "progress" not in ck or "optimizer" not in ck:
            raise NmtError(f"{path}: not a training checkpoint (averaged?); cannot resume")
        resume.check_same_data(ck, path, self.data, self.data_dir, warn)
        resume.check_same_model(ck["model_config"], self.model_cfg.to_dict(), path)
        changed = resume.changed_options(ck.get("train_config"), self.cfg)
        if changed:
            warn("resuming %s with options that differ from its run: %s; the new values "
                 "apply from update %d on", path.name, ", ".join(changed),
                 ck["progress"]["update"] + 1)
        self.model.load_state_dict(ck["model"])
        self.trainer.load_state_dict(ck)
        # The run keeps the record of where its weights first came from (--init-from).
        self.cfg.init_from = (ck.get("train_config") or {}).get("init_from")
        prog = ck["progress"]
        self.selection.load_state_dict(prog.get("selection"), prog.get("best_loss"))
        ranks = ck["rng"]["ranks"]
        if len(ranks) == self.info.world_size:
            set_rng_state(ranks[self.info.rank])
        if prog.get("sampler") == self.sampler.signature():
            self.epoch, self.epoch_batches_done = prog["epoch"], prog["epoch_batches_done"]
        else:
            # Another --max-tokens or world size: the saved position means other batches.
            log.warning("batching changed since %s: continuing at the start of epoch %d",
                        path, prog["epoch"] + 1)
            self.epoch, self.epoch_batches_done = prog["epoch"] + 1, 0
        if self.is_main:
            log.info("resumed from %s at update %d (epoch %d, batch %d)", path,
                     self.trainer.num_updates, self.epoch, self.epoch_batches_done)

    def _intact_message(self) -> str:
        """What a rerun resumes from (said when a second signal stops the run at once)."""
        if not self.is_main:
            return ""
        saved = self.save_dir.numbered()
        if not saved:
            return "no checkpoint was saved yet: the same command starts afresh"
        return (f"{saved[-1]} is intact (checkpoints are written atomically): the same "
                f"command resumes from it")

    # --- validation -----------------------------------------------------------------------------
    def validate(self, kind: str = "valid", name: str | None = None) -> dict[str, Any] | None:
        """Validation statistics (and decoding scores when asked), logged as ``kind``."""
        if self.valid_ds is None:
            return None
        stats: dict[str, Any] = V.validation_loss(self.trainer, self.valid_ds,
                                                  self.valid_sampler, self.info)
        if self.metrics and self.is_main:
            stats.update(V.decoding_scores(self.model, self.data, self.valid_ds,
                                           self.references, self.search_config(),
                                           self.device, self.metrics,
                                           should_stop=lambda: bool(self.signals.received)))
        if self.metrics and self.info.enabled:
            stats = all_gather_object(stats, self.info)[0]   # rank 0's scores everywhere
        barrier(self.info)
        if self.is_main:
            rec = {"kind": kind, "update": self.trainer.num_updates, "epoch": self.epoch}
            rec = {**rec, **({"checkpoint": name} if name else {}), **stats}
            self.jsonl.write(rec)
            self.tensorboard.write(rec)
            log.info("%s | update %d | loss %.4f | nll %.4f | ppl %.2f%s",
                     name or "valid", self.trainer.num_updates, stats["loss"], stats["nll_loss"], stats["ppl"],
                     decoding_log_suffix(stats))
        return stats

    # --- the loop -------------------------------------------------------------------------------
    def run(self) -> Path:
        """Train to the end; SAVE_DIR is unlocked when this returns or raises."""
        try:
            return self._run()
        finally:
            self.save_dir.release()

    def _run(self) -> Path:
        resumed = self.try_resume()
        if self.is_main:
            self.jsonl = JsonlLog(self.save_dir.path / "train_log.jsonl", append=resumed)
            self.tensorboard = TensorBoardLog(self.cfg.tensorboard_logdir,
                                              purge_step=self.trainer.num_updates + 1)
            self._log_start()
        self.policy, self.total = Policy(self.cfg, self.is_main), Meter()
        stop = self._already_done()
        with self.signals:
            while not stop and not (self.cfg.max_epoch and self.epoch > self.cfg.max_epoch):
                stop = self._train_epoch()
        if self.signals.received:
            if self.is_main:
                self._log_end()
            barrier(self.info)
            raise TrainingInterrupted(self.signals.received, self.trainer.num_updates,
                                      self.saved_at)
        final = self._finish()
        if self.is_main:
            self._log_end()
        return final

    def _train_epoch(self) -> bool:
        """Train from the saved position to the end of this epoch; True to stop the run."""
        shard = self.sampler.shard_batches(self.epoch)
        uf = self.cfg.update_freq
        while self.epoch_batches_done < len(shard):
            group = shard[self.epoch_batches_done:self.epoch_batches_done + uf]
            start = self.model_cfg.start_id
            batches = [None if idx is None else collate(self.train_ds, idx, start)
                       for idx in group]
            local = self.policy.local_signals(bool(self.signals.received))
            stats = self.trainer.train_step(batches, local)
            self.epoch_batches_done += len(group)
            self._account(stats)
            end_of_epoch = self.epoch_batches_done >= len(shard)
            decision = self.policy.decide(self.trainer.num_updates, stats.skipped,
                                          end_of_epoch, self.epoch, stats.signals)
            if stats.signals.interrupted and self.is_main:
                log.warning("%s received: saving a checkpoint and stopping (send it again to "
                            "stop at once)", self.signals.name)
            if end_of_epoch:
                # The saved position must point at the next batch to train on.
                self.epoch, self.epoch_batches_done = self.epoch + 1, 0
            if self._act(decision) or decision.stop:
                return True
            if end_of_epoch:
                return False
        return False

    def _account(self, stats: StepStats) -> None:
        """Meters, warnings, the progress callback and the periodic log line of an update."""
        upd = self.trainer.num_updates
        if stats.nonfinite:
            self._nonfinite(stats)
        else:
            self.meter.add(stats)
            self.total.add(stats)
        if stats.skipped and not stats.nonfinite and self.is_main:
            log.warning("update skipped (no target tokens)")
        if self.progress is not None and self.is_main:
            self.progress(upd, self.cfg.max_update or None, f"epoch {self.epoch}")
        if upd % self.cfg.log_interval == 0 and not stats.skipped:
            self._log_train(stats.lr)

    def _act(self, decision: Decision) -> bool:
        """Validate and save as decided; True when --patience ran out."""
        if not (decision.validate or decision.save):
            return False
        valid = self.validate() if decision.validate else None
        if not decision.save:
            return False
        # Only validations at a save compete for checkpoint_best.pt and count for --patience:
        # the best score always has a checkpoint.
        value = self.selection.value(valid)
        improved = self.selection.observe(self.trainer.num_updates, value)
        if valid is not None:
            valid = {**valid, "best": improved}
        self.saved_at = self.save(valid, is_best=improved)
        self.policy.saved()
        if value is not None and self.selection.out_of_patience(self.cfg.patience):
            if self.is_main:
                log.info("stopping: %d validations in a row without a better %s (best %.4g "
                         "at update %s)", self.selection.bad_in_a_row, self.selection.metric,
                         self.selection.best, self.selection.best_update)
            self.stopped_early = True
            return True
        return False

    def _already_done(self) -> bool:
        self.meter, self.saved_at, self.stopped_early = Meter(), None, False
        # Resuming a run that already reached --max-update (or ran out of patience) trains
        # nothing more.
        done = bool(self.cfg.max_update and self.trainer.num_updates >= self.cfg.max_update)
        if self.selection.out_of_patience(self.cfg.patience):
            done = self.stopped_early = True
        if done and self.is_main:
            log.info("already at update %d: nothing to train", self.trainer.num_updates)
        return done

    # --- logging and faults ---------------------------------------------------------------------
    def _log_start(self) -> None:
        cfg = self.cfg
        n_params = sum(p.numel() for p in self.model.parameters())
        log.info("model %s: %d parameters; %d training pairs; %d ranks x %d max tokens x "
                 "update-freq %d; device %s, %s%s", self.model_cfg.arch, n_params,
                 len(self.train_ds), self.info.world_size, cfg.max_tokens, cfg.update_freq,
                 self.device, cfg.precision,
                 "; fast dropout masks" if cfg.dropout_masks == "fast" else "")
        if cfg.max_update and cfg.max_update < cfg.warmup \
                and self.trainer.num_updates < cfg.max_update:
            log.warning("--max-update %d ends the run before its warm-up of %d updates: the "
                        "learning rate never reaches its peak and the model will be undertrained; "
                        "give a shorter warm-up, e.g. --warmup %d", cfg.max_update, cfg.warmup,
                        max(1, cfg.max_update // 4))
        every = cfg.save_interval_updates
        if cfg.lr_period and (not every or cfg.warmup % every or cfg.lr_period % every):
            log.warning("--lr-period %d: not every cycle's end (updates %d, %d, ...) is saved, so "
                        "annealed snapshots are lost; give a --save-interval-updates that "
                        "divides both --warmup %d and --lr-period %d", cfg.lr_period,
                        cfg.warmup + cfg.lr_period, cfg.warmup + 2 * cfg.lr_period, cfg.warmup,
                        cfg.lr_period)

    def _log_end(self) -> None:
        s = self.total.summary()
        seconds = self.policy.elapsed()
        log.info("done: %d updates in %.1fs | %.0f target tokens/s | %.3f updates/s",
                 self.trainer.num_updates, seconds, s["tgt_tokens_per_s"], s["updates_per_s"])
        self.jsonl.write({"kind": "summary", "update": self.trainer.num_updates,
                          "seconds": seconds, **s})
        self.jsonl.close()
        self.tensorboard.close()
        plot_curves(self.save_dir.path / "train_log.jsonl", self.save_dir.path / "curves.png")

    def _nonfinite(self, stats: StepStats) -> None:
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
                           f"stopped without saving them (the checkpoints in "
                           f"{self.save_dir.path} are intact); try a smaller --lr-scale, "
                           f"--clip-norm or fp32")

    def _log_train(self, lr: float) -> None:
        s = self.meter.summary()
        self.meter.reset()
        if not np.isfinite(s["loss"]):
            raise NmtError(f"the loss became {s['loss']} at update {self.trainer.num_updates}; "
                           f"try a smaller --lr-scale, --clip-norm or fp32")
        if not self.is_main:
            return
        mem = memory_stats(self.device)
        rec = {"kind": "train", "update": self.trainer.num_updates, "epoch": self.epoch,
               "lr": lr, **s, **mem}
        self.jsonl.write(rec)
        self.tensorboard.write(rec)
        log.info("epoch %d | update %d | loss %.3f | nll %.3f | ppl %.2f | lr %.3e | "
                 "gnorm %.3f | %.0f tgt tok/s | %.2f upd/s | rss %.2f GB%s", self.epoch,
                 self.trainer.num_updates, s["loss"], s["nll_loss"], s["ppl"], lr, s["gnorm"],
                 s["tgt_tokens_per_s"], s["updates_per_s"], mem["rss_gb"],
                 f" | gpu {mem['gpu_max_gb']:.2f} GB" if "gpu_max_gb" in mem else "")


def train(cfg: TrainConfig, data, data_dir: str, progress: ProgressFn | None = None) -> Path:
    """Train on an opened data directory (nmt.data.DataDir or anything with its interface).

    ``progress(update, max_update or None, text)`` is called after each update on rank 0.
    Raises :class:`TrainingInterrupted` after saving when SIGINT/SIGTERM arrived, and
    NmtError when another rank died or hung past ``cfg.ddp_timeout`` minutes.
    """
    try:
        return Run(cfg, data, data_dir, progress).run()
    except RuntimeError as e:
        msg = collective_failure(e, cfg.ddp_timeout)
        if msg is None:
            raise
        raise NmtError(msg) from None
    finally:
        shutdown_distributed()


__all__ = ["Run", "train", "TrainConfig", "TrainingInterrupted"]
