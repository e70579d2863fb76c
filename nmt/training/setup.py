"""The parts of a training run, built before its first update: the locked save directory,
the model (from a preset, or from --init-from's checkpoint) and its trainer, the training
batches, and what validation reads. Each is a function of the options and the data, called
in this order by :class:`nmt.training.loop.Run` (the order of the seeds is part of the run).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nmt.config import ModelConfig
from nmt.data.buckets import TokenBatchSampler
from nmt.errors import NmtError, UsageError
from nmt.models.dropout import set_dropout_masks
from nmt.training import init_from
from nmt.training import validate as V
from nmt.training.config import TrainConfig
from nmt.training.distributed import DistInfo, all_gather_object
from nmt.training.optim import ScheduleSpec
from nmt.training.savedir import SaveDir
from nmt.training.trainer import Trainer

log = logging.getLogger("nmt.train")

# --init-from's checkpoint: (path, checkpoint, resuming: True when it is SAVE_DIR's newest).
InitSource = tuple[Path, dict, bool]


def lock_save_dir(save_dir: SaveDir, info: DistInfo) -> None:
    """Rank 0, the only writer, creates and locks SAVE_DIR until the run ends (a second
    nmt-train into it is refused); the other ranks stop with it when it cannot."""
    problem = None
    if info.is_main:
        try:
            save_dir.prepare()
        except NmtError as e:
            problem = e
    verdict = all_gather_object(None if problem is None else str(problem), info)[0]
    if problem is not None:
        raise problem
    if verdict is not None:
        raise NmtError(f"rank {info.rank}: rank 0 stopped: {verdict}")


def model_config(cfg: TrainConfig, data, init: InitSource | None
                 ) -> tuple[ModelConfig, bool, TrainConfig]:
    """(model configuration, share all embeddings, ``cfg`` as the checkpoints record it: the
    preset used, and the file the weights came from)."""
    if init is None:
        from nmt.registry import get_arch

        model_cfg = get_arch(cfg.arch_name, cfg.overrides)
        share = data.joined if cfg.share_all_embeddings is None else cfg.share_all_embeddings
    else:
        model_cfg = init_from.model_config(init[1], init[0], cfg.arch, cfg.overrides)
        share = init_from.share_embeddings(init[1], init[0], cfg.share_all_embeddings)
    if share and not data.joined:
        raise UsageError("--share-all-embeddings needs a joined vocabulary "
                         "(nmt-preprocess --joined)")
    recorded = dataclasses.replace(cfg, arch=model_cfg.arch, init_from=(
        str(init[0].resolve()) if init is not None and not init[2] else None))
    return model_cfg, bool(share), recorded


def build_model(cfg: TrainConfig, model_cfg: ModelConfig, share: bool, data, info: DistInfo,
                init: InitSource | None) -> torch.nn.Module:
    """The model, initialized from ``cfg.seed`` or --init-from's weights; leaves this rank's
    dropout stream seeded."""
    from nmt.models.transformer import build_model as build

    # Same initial weights on every rank (DDP also broadcasts rank 0's).
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed % 2 ** 32)
    random.seed(cfg.seed)
    model = build(model_cfg, len(data.src_codec.dictionary), len(data.tgt_codec.dictionary),
                  share_all_embeddings=share)
    if init is not None and not init[2]:
        init_from.load_weights(model, init[1], init[0])
        if info.is_main:
            log.info("initialized the model from %s (%s); a fresh optimizer, learning-rate "
                     "schedule and data position", init[0], init_from.describe(init[1]))
    set_dropout_masks(model, cfg.dropout_masks)
    # Different dropout masks per rank; rank 0 keeps the single-process stream.
    torch.manual_seed(cfg.seed + 1000 * info.rank)
    return model


def build_trainer(cfg: TrainConfig, model, model_cfg: ModelConfig, device,
                  info: DistInfo) -> Trainer:
    schedule = ScheduleSpec(cfg.lr_scheduler, cfg.warmup, cfg.eq5_scale, cfg.lr_period, cfg.lr,
                            cfg.warmup_init_lr, cfg.min_lr, cfg.max_update)
    return Trainer(model, label_smoothing=model_cfg.label_smoothing, d_model=model_cfg.d_model,
                   schedule=schedule, optimizer=cfg.optimizer, weight_decay=cfg.weight_decay,
                   clip_norm=cfg.clip_norm, precision=cfg.precision, device=device,
                   dist_info=info, loss_chunk=cfg.loss_chunk,
                   rdrop_alpha=cfg.rdrop_alpha)


def train_batches(cfg: TrainConfig, data, data_dir: str, info: DistInfo,
                  max_positions: int | None) -> tuple[Any, TokenBatchSampler]:
    """(the training split, its batches of this rank)."""
    if "train" not in data.splits:
        raise NmtError(f"{data_dir}: no 'train' split")
    train_ds = data.load_split("train")
    sampler = TokenBatchSampler(train_ds.src_sizes, train_ds.tgt_sizes, cfg.max_tokens,
                                cfg.max_sentences, cfg.seed, num_shards=info.world_size,
                                shard_id=info.rank, max_positions=max_positions)
    if len(sampler.valid_indices) == 0:
        raise NmtError(f"no training sentence fits in --max-tokens {cfg.max_tokens}")
    if sampler.num_skipped:
        log.warning("skipping %d training pairs longer than --max-tokens %d or the model's "
                    "max positions", sampler.num_skipped, cfg.max_tokens)
    return train_ds, sampler


@dataclass
class ValidationData:
    """What validation reads: the split and its batches of this rank, the metrics that decode
    it and (rank 0) their references."""

    dataset: Any = None                         # None: no validation split, no validation
    sampler: TokenBatchSampler | None = None
    metrics: list[str] = field(default_factory=list)
    references: V.References | None = None


def validation_data(cfg: TrainConfig, data, data_dir: str, info: DistInfo,
                    max_positions: int | None) -> ValidationData:
    if cfg.valid_subset not in data.splits:
        if (cfg.best_checkpoint_metric != "loss" or cfg.patience or cfg.average_best
                or cfg.ensemble_best):
            raise NmtError(f"{data_dir}: no '{cfg.valid_subset}' split, which "
                           f"--best-checkpoint-metric/--patience/--average-best/"
                           f"--ensemble-best need")
        log.warning("no '%s' split in %s: no validation", cfg.valid_subset, data_dir)
        return ValidationData()
    dataset = data.load_split(cfg.valid_subset)
    sampler = TokenBatchSampler(dataset.src_sizes, dataset.tgt_sizes, cfg.max_tokens,
                                shuffle=False, num_shards=info.world_size, shard_id=info.rank,
                                max_positions=max_positions)
    out = ValidationData(dataset, sampler, decoding_metrics(cfg))
    if out.metrics and info.is_main:
        out.references = V.load_references(data, cfg.valid_subset, dataset, out.metrics)
        log.info("validation %s: scored against %s", "/".join(out.metrics),
                 out.references.origin)
    return out


def decoding_metrics(cfg: TrainConfig) -> list[str]:
    """The validation metrics that decode: the selection metric, and BLEU/chrF with
    --valid-bleu."""
    chosen = [] if cfg.best_checkpoint_metric == "loss" else [cfg.best_checkpoint_metric]
    if cfg.valid_bleu:
        chosen += [m for m in ("bleu", "chrf") if m not in chosen]
    return chosen


__all__ = ["lock_save_dir", "model_config", "build_model", "build_trainer", "train_batches",
           "ValidationData", "validation_data", "decoding_metrics"]
