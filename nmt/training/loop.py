"""The training run, top to bottom: set-up, the loop over updates, validation, saving, resuming.

``train(TrainConfig(...), data, data_dir)`` is what ``nmt-train`` calls; it returns the path of
the checkpoint to use. What the run relies on lives beside it: the options
(``config.TrainConfig``), the parts built before the first update (``setup``), one update
(``trainer``), when to save/validate/stop (``policy``), which checkpoint is best
(``selection``), the save directory (``savedir``), the training half of a checkpoint
(``resume``), validation (``validate``), what the run logs (``report``) and the end of the
run (``end``). :class:`Run` is the run itself: everything that reads or changes its state is
one of its methods. Only rank 0 writes files.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from nmt import checkpoint as ckpt_io
from nmt.data.buckets import collate
from nmt.errors import NmtError
from nmt.search.config import SearchConfig
from nmt.training import report, resume, setup
from nmt.training import validate as V
from nmt.training.config import TrainConfig
from nmt.training.curves import JsonlLog, TensorBoardLog, decoding_log_suffix
from nmt.training.distributed import (DistInfo, all_gather_object, barrier, collective_failure,
                                      env_dist_info, init_distributed, pick_device,
                                      shutdown_distributed)
from nmt.training.end import RunEnd, TrainingInterrupted, finish
from nmt.training.meter import Meter
from nmt.training.policy import Decision, Policy
from nmt.training.savedir import SaveDir
from nmt.training.selection import Selection
from nmt.signals import SignalCatcher

log = logging.getLogger("nmt.train")

# progress(update, total or None, text): called after every update on rank 0.
ProgressFn = Callable[[int, "int | None", str], None]


class Run:
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
        setup.lock_save_dir(self.save_dir, self.info)
        try:
            self._set_up()
        except BaseException:
            self.save_dir.release()       # a failed start leaves no empty save directory
            raise

    def _set_up(self) -> None:
        cfg, data, info = self.cfg, self.data, self.info
        # The checkpoint to resume from, looked up once (--init-from needs it before the model).
        self._resume_looked, self._resume_found = False, None
        init = self._init_source() if cfg.init_from else None
        self.model_cfg, self.share, self.cfg = setup.model_config(cfg, data, init)
        self.model = setup.build_model(cfg, self.model_cfg, self.share, data, info, init)
        self.trainer = setup.build_trainer(cfg, self.model, self.model_cfg, self.device, info)
        max_pos = getattr(self.model, "max_positions", None)
        self.train_ds, self.sampler = setup.train_batches(cfg, data, self.data_dir, info, max_pos)
        valid = setup.validation_data(cfg, data, self.data_dir, info, max_pos)
        self.valid_ds, self.valid_sampler = valid.dataset, valid.sampler
        self.metrics, self.references = valid.metrics, valid.references
        self.epoch, self.epoch_batches_done = 1, 0
        self.deferred: dict | None = None     # a validation a signal's stop left (resume)
        self.selection = Selection(cfg.best_checkpoint_metric)
        self.jsonl = JsonlLog(None)   # opened in run(): appended to when resuming
        self.tensorboard = TensorBoardLog(None)   # opened in run() on rank 0
        # What a rerun resumes from: said when a second signal stops the run at once.
        self.signals = SignalCatcher(self.save_dir.intact_message if self.is_main
                                     else (lambda: ""))

    def _init_source(self) -> tuple[Path, dict, bool]:
        """With --init-from: (path, checkpoint, resuming) of the checkpoint that gives the model
        configuration: SAVE_DIR's newest when the run resumes (CKPT is then not used), else
        CKPT (read first with --no-resume, which moves the old run's files: CKPT may be one)."""
        early = None if self.cfg.resume else ckpt_io.load_checkpoint(self.cfg.init_from)
        found = self._resume_point()
        if found is not None:
            resume.check_same_parent(found[1], found[0], self.cfg.init_from)
            if self.is_main:
                log.info("--init-from %s is not used: the run resumes from %s",
                         self.cfg.init_from, found[0])
            return found[0], found[1], True
        path = self.save_dir.moved_path(Path(self.cfg.init_from))
        ck = early if early is not None else ckpt_io.load_checkpoint(path)
        resume.check_init_data(ck, path, self.data, self.data_dir,
                               log.warning if self.is_main else (lambda msg: None))
        return path, ck, False

    # --- the loop ---------------------------------------------------------------------------------
    def run(self) -> Path:
        """Train to the end; SAVE_DIR is unlocked when this returns or raises."""
        try:
            return self._run()
        finally:
            self.save_dir.release()

    def _run(self) -> Path:
        resumed = self.try_resume()
        if self.is_main:
            self.save_dir.check_unmoved("train_log.jsonl was not opened")
            self.jsonl = JsonlLog(self.save_dir.path / "train_log.jsonl", append=resumed)
            self.tensorboard = TensorBoardLog(self.cfg.tensorboard_logdir,
                                              purge_step=self.trainer.num_updates + 1)
            report.start(self.cfg, self.model_cfg.arch,
                         sum(p.numel() for p in self.model.parameters()), len(self.train_ds),
                         self.info.world_size, self.device, self.trainer.num_updates)
        self.policy, self.total = Policy(self.cfg, self.is_main), Meter()
        done = self._already_done()
        with self.signals:
            stop = self._deferred_validation() or done
            while not stop and not (self.cfg.max_epoch and self.epoch > self.cfg.max_epoch):
                stop = self._train_epoch()
        if self.signals.received:
            if self.is_main:
                self._log_end()
            barrier(self.info)
            raise TrainingInterrupted(self.signals.received, self.trainer.num_updates,
                                      self.saved_at)
        final = finish(RunEnd(
            cfg=self.cfg, save_dir=self.save_dir, selection=self.selection, info=self.info,
            stopped_early=self.stopped_early, model=self.model, device=self.device,
            validate=self.validate if self.valid_ds is not None else None,
            validate_ensemble=self.validate_ensemble if self.metrics else None))
        if self.is_main:
            self._log_end()
        return final

    def _already_done(self) -> bool:
        self.meter, self.saved_at, self.stopped_early = Meter(), None, False
        # Resuming a run that already reached --max-update (or ran out of patience) trains
        # nothing more.
        done = self._at_max_update()
        if not done and self.selection.out_of_patience(self.cfg.patience):
            done = self.stopped_early = True
        if done and self.is_main:
            report.already_done(self.trainer.num_updates, self.cfg.max_update)
        return done

    def _train_epoch(self) -> bool:
        """Train from the saved position to the end of this epoch; True to stop the run."""
        shard = self.sampler.shard_batches(self.epoch)
        uf = self.cfg.update_freq
        if self.epoch_batches_done >= len(shard):      # a saved position past the end
            return self._past_the_end(len(shard))
        while self.epoch_batches_done < len(shard):
            group = shard[self.epoch_batches_done:self.epoch_batches_done + uf]
            start = self.model_cfg.start_id
            batches = [None if i is None else collate(self.train_ds, i, start) for i in group]
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

    def _past_the_end(self, batches: int) -> bool:
        """The run resumed at a position past its epoch's ``batches`` batches: the data
        directory's batches are not those of the run that saved it (the same vocabulary and
        line count, shorter sentences). Go on with the next epoch (False: the run goes on); a
        rank with no batch at all cannot train."""
        if batches == 0:
            raise NmtError(f"epoch {self.epoch} has no batch for this rank: the training set is "
                           f"smaller than one batch per rank")
        log.warning("the saved position, batch %d of epoch %d, is past its %d batches (the "
                    "data changed since it was saved?): going on with epoch %d",
                    self.epoch_batches_done, self.epoch, batches, self.epoch + 1)
        self.epoch, self.epoch_batches_done = self.epoch + 1, 0
        return False

    def _account(self, stats) -> None:
        """An update's meters, warnings, progress callback and periodic log line."""
        upd, cfg = self.trainer.num_updates, self.cfg
        if stats.nonfinite:
            report.nonfinite(stats, self.trainer, cfg.max_nonfinite, self.save_dir.path,
                             self.is_main)
        else:
            self.meter.add(stats)
            self.total.add(stats)
        if stats.skipped and not stats.nonfinite and self.is_main:
            log.warning("update skipped (no target tokens)")
        if self.progress is not None and self.is_main:
            self.progress(upd, cfg.max_update or None, f"epoch {self.epoch}")
        if upd % cfg.log_interval == 0 and not stats.skipped:
            summary = self.meter.summary()
            self.meter.reset()
            report.check_finite(summary, upd)
            if self.is_main:
                report.train_line(summary, stats.lr, upd, self.epoch, self.device,
                                  (self.jsonl, self.tensorboard))

    def _act(self, decision: Decision) -> bool:
        """Validate and save as decided; True to stop (--patience ran out, or a signal)."""
        if not (decision.validate or decision.save):
            return False
        valid = self.validate() if decision.validate else None
        if valid is not None and valid.get("decoding_stopped"):     # by a signal
            decision, valid = self.policy.validation_stopped(decision), None
        if not decision.save:
            return False
        if not decision.numbered:        # a signal off the saving schedule: a resume point
            self.saved_at = self.save(None, numbered=False, deferred=decision.deferred)
            return decision.stop
        value, improved = self.judge(valid)
        if valid is not None:
            valid = {**valid, "best": improved}
        self.saved_at = self.save(valid, is_best=improved, deferred=decision.deferred)
        self.policy.saved()
        return self.out_of_patience(value) or decision.stop

    def _deferred_validation(self) -> bool:
        """The validation a signal's stop left to this resumed run: the saved weights and RNG
        state are those it would have seen, so it is the uninterrupted run's; at a save it is
        judged and the checkpoint saved again as that run saved it. True to stop: --patience
        ran out, or a signal stopped this validation too (the checkpoint keeps its marker, and
        the next resume validates again)."""
        deferred, self.deferred = self.deferred, None
        if not deferred:
            return False
        valid = self.validate()
        if valid is not None and valid.get("decoding_stopped"):
            self.saved_at = self.save_dir.last if self.is_main else None
            return True
        if not deferred.get("judge"):
            return False
        value, improved = self.judge(valid)
        self.saved_at = self.save(valid and {**valid, "best": improved}, is_best=improved)
        return self.out_of_patience(value)

    def judge(self, valid: dict[str, Any] | None) -> tuple[float | None, bool]:
        """(score, improved) of a validation at a save: only those compete for
        checkpoint_best.pt and count for --patience (the best score always has a checkpoint)."""
        value = self.selection.value(valid)
        improved = self.selection.observe(self.trainer.num_updates, value)
        if improved and self.is_main:
            report.best(self.jsonl, self.trainer.num_updates, self.selection.metric, value)
        return value, improved

    def _at_max_update(self) -> bool:
        return bool(self.cfg.max_update and self.trainer.num_updates >= self.cfg.max_update)

    def out_of_patience(self, value: float | None) -> bool:
        if value is None or not self.selection.out_of_patience(self.cfg.patience):
            return False
        if self._at_max_update():
            return False     # the run ends here anyway: it finished, it did not stop early
        if self.is_main:
            log.info("stopping: %d validations in a row without a better %s (best %.4g at "
                     "update %s)", self.selection.bad_in_a_row, self.selection.metric,
                     self.selection.best, self.selection.best_update)
        self.stopped_early = True
        return True

    def _log_end(self) -> None:
        """The summary (rank 0): also after an interruption."""
        report.end(self.total.summary(), self.policy.elapsed(), self.trainer.num_updates,
                   self.jsonl, self.tensorboard, self.save_dir.current)

    # --- validation -------------------------------------------------------------------------------
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
            log.info("%s | update %d | loss %.4f | nll %.4f | ppl %.2f%s", name or "valid",
                     self.trainer.num_updates, stats["loss"], stats["nll_loss"], stats["ppl"],
                     decoding_log_suffix(stats))
        return stats

    def validate_ensemble(self, models: list, name: str) -> dict[str, Any]:
        """Decoding scores of ``models`` decoded as one ensemble, logged as ``name``."""
        stats = V.decoding_scores(models, self.data, self.valid_ds, self.references,
                                  self.search_config(), self.device, self.metrics,
                                  should_stop=lambda: bool(self.signals.received))
        self.jsonl.write({"kind": "valid_ensemble", "update": self.trainer.num_updates,
                          "epoch": self.epoch, "checkpoint": name, **stats})
        log.info("%s (%d checkpoints) | update %d%s", name, len(models),
                 self.trainer.num_updates, decoding_log_suffix(stats))
        return stats

    def search_config(self) -> SearchConfig:
        """Validation decoding: the --valid-* options, else the preset's (as nmt-generate)."""
        return self.cfg.valid_search.resolve(self.model_cfg)

    # --- checkpoints: saving, resuming (their training half: nmt.training.resume) -----------------
    def save(self, valid: dict[str, Any] | None, is_best: bool = False, numbered: bool = True,
             deferred: bool = False) -> Path | None:
        # Every rank's RNG, so that a resumed multi-rank run draws the same dropout masks.
        rng_states = all_gather_object(resume.get_rng_state(), self.info)
        path = None
        if self.is_main:
            t0 = time.perf_counter()
            upd = self.trainer.num_updates
            self.selection.record_saved(upd, self.selection.value(valid))
            keep = self.selection.best_updates(max(self.cfg.average_best,
                                                   self.cfg.ensemble_best))
            ck = self._checkpoint(rng_states, valid, {"judge": numbered} if deferred else None)
            path = self.save_dir.write(ck, upd, is_best, max(self.cfg.keep_last,
                                       self.cfg.average_last), keep, numbered=numbered)
            log.info("saved %s (%.1fs)", path, time.perf_counter() - t0)
        barrier(self.info)
        return path

    def _checkpoint(self, rng_states: list[dict[str, Any]], valid: dict[str, Any] | None,
                    deferred: dict | None) -> dict:
        """The checkpoint the run saves now: model, codecs and the training half
        (:func:`nmt.training.resume.training_state`)."""
        from nmt.tasks.task import data_task

        training = resume.training_state(self.cfg, self.trainer, self.selection, rng_states,
                                         self.epoch, self.epoch_batches_done,
                                         self.sampler.signature(), valid, deferred)
        data = self.data
        return ckpt_io.make_checkpoint(
            model_config=self.model_cfg, model_state=self.model.state_dict(),
            share_all_embeddings=self.share, src_codec=data.src_codec, tgt_codec=data.tgt_codec,
            src_lang=data.src_lang, tgt_lang=data.tgt_lang, data_dir=str(self.data_dir),
            task=data_task(data).name, training=training)

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
        self._resume_found = resume.resume_point(self.save_dir, self.cfg.resume, self.device,
                                                 self.is_main)
        return self._resume_found

    def _restore(self, path: Path, ck: dict) -> None:
        warn = log.warning if self.is_main else (lambda msg, *a: None)
        resume.check_resumable(ck, path, self.cfg, self.model_cfg, self.data, self.data_dir,
                               warn, self.share)
        resume.restore(ck, self.model, self.trainer, self.selection, self.info.rank,
                       self.info.world_size)
        self.cfg.init_from = resume.saved_init_from(ck)
        self.deferred = ck["progress"].get("deferred")
        self.epoch, self.epoch_batches_done = resume.saved_position(ck, path,
                                                                    self.sampler.signature())
        if self.is_main:
            log.info("resumed from %s at update %d (epoch %d, batch %d)", path,
                     self.trainer.num_updates, self.epoch, self.epoch_batches_done)


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
