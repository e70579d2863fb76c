"""The training half of a checkpoint, in one place: what a run saves to continue exactly
(:func:`training_state`), where it finds it again (:func:`resume_point`), what it checks before
continuing (:func:`check_resumable`) and how it takes it back (:func:`restore`,
:func:`saved_position`). ``nmt.checkpoint`` keeps the half every checkpoint has (format, saving,
safe loading, the model and its codecs), which decoding uses too.

A checkpoint continues only on the data it was trained on: the same source and target
vocabularies and subword models (another data directory with the same codecs, e.g. new data
encoded with ``nmt-preprocess --reuse-vocab``, is allowed with a warning). The model
configuration must be the same. Options of the optimisation (warm-up, learning-rate scale,
clipping, seed, batching) may change, and every change is named in a warning, never taken
silently. A run started with ``--init-from`` needs the vocabularies of the checkpoint it starts
from just the same (``check_init_data``).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from nmt.errors import NmtError
from nmt.training.config import UNSET_MEANS

log = logging.getLogger("nmt.train")

# --- what a training checkpoint adds (nmt.checkpoint.TRAINING_KEYS) -------------------------

def training_state(cfg, trainer, selection, rng_states: list[dict[str, Any]], epoch: int,
                   epoch_batches_done: int, sampler_signature: Any,
                   valid: dict[str, Any] | None, deferred: dict | None = None
                   ) -> dict[str, Any]:
    """The training keys of a checkpoint: the run's options (a TrainConfig), the trainer's
    optimizer/scheduler/scaler, every rank's RNGs, the data position (the next batch of
    ``epoch``, valid for the batching ``sampler_signature`` describes), the checkpoint
    selection and the validation at this save (``deferred``: the one a signal's stop left to
    the resumed run, ``{"judge": True}`` when it counts as a save's)."""
    return {
        "train_config": dataclasses.asdict(cfg),
        **trainer.state_dict(),
        "rng": {"ranks": rng_states},
        "progress": {"epoch": epoch, "update": trainer.num_updates,
                     "epoch_batches_done": epoch_batches_done,
                     "sampler": sampler_signature,
                     "best_loss": selection.best if selection.metric == "loss" else None,
                     "selection": selection.state_dict(),
                     "valid": valid or {},
                     **({"deferred": deferred} if deferred else {})},
    }


def resume_point(save_dir, resume: bool, device, is_main: bool) -> tuple[Path, dict] | None:
    """The newest intact checkpoint of ``save_dir`` (a SaveDir) when ``resume`` is on, else
    None. Rank 0 first removes the leftovers of interrupted saves, and with --no-resume moves
    the previous run's files aside."""
    if is_main:
        save_dir.remove_stale_temporaries()
    if not resume:
        moved = save_dir.move_previous_run() if is_main else None
        if moved is not None:
            log.warning("--no-resume: starting afresh; the previous run's files are in %s",
                        moved)
        return None
    warn = log.warning if is_main else (lambda msg: None)
    found = save_dir.newest_intact(device, warn)
    if found is not None and is_main and found[0] != save_dir.last:
        # A crash between writing checkpoint_<n>.pt and linking left the links older: they
        # name the resumed checkpoint again (best too, when it is the selection's best).
        selection = found[1]["progress"].get("selection") or {}
        save_dir.relink(found[0], best=selection.get("best_update") == found[1]["progress"][
            "update"])
    return found


def check_resumable(ck: Mapping[str, Any], path: Path, cfg, model_cfg, data, data_dir: str,
                    warn: Callable[..., None], share: bool | None = None) -> None:
    """Refuse a checkpoint this run cannot continue (not a training checkpoint, other data,
    another model, embeddings shared otherwise than ``share``); warn about the optimisation
    options that change from its run."""
    if "progress" not in ck or "optimizer" not in ck:
        raise NmtError(f"{path}: not a training checkpoint (averaged?); cannot resume")
    check_same_data(ck, path, data, data_dir, warn)
    check_same_model(ck["model_config"], model_cfg.to_dict(), path)
    saved_share = ck.get("share_all_embeddings")
    if share is not None and saved_share is not None and bool(saved_share) != share:
        raise NmtError(f"{path} was trained with{'' if saved_share else 'out'} one embedding "
                       f"matrix shared by both languages, this run "
                       f"{'shares' if share else 'does not share'} it "
                       f"(--{'' if share else 'no-'}share-all-embeddings); cannot resume: "
                       f"{HOW_TO_RESTART}")
    changed = changed_options(ck.get("train_config"), cfg)
    if changed:
        warn("resuming %s with options that differ from its run: %s; the new values "
             "apply from update %d on", path.name, ", ".join(changed),
             ck["progress"]["update"] + 1)


def restore(ck: Mapping[str, Any], model, trainer, selection, rank: int,
            world_size: int) -> None:
    """Take back the weights, the optimizer/scheduler/scaler, the checkpoint selection and
    (with as many ranks as saved it) this rank's RNGs."""
    model.load_state_dict(ck["model"])
    trainer.load_state_dict(ck)
    prog = ck["progress"]
    selection.load_state_dict(prog.get("selection") or {})
    ranks = ck["rng"]["ranks"]
    if len(ranks) == world_size:
        try:
            set_rng_state(ranks[rank])
        except (KeyError, TypeError, ValueError, AttributeError, IndexError,
                RuntimeError) as e:
            raise NmtError(f"the checkpoint's random-number state is damaged ("
                           f"{type(e).__name__}: {' '.join(str(e).split())[:120]}); "
                           f"{HOW_TO_RESTART}") from None


def check_same_parent(ck: Mapping[str, Any], path: Path, init_from: str) -> None:
    """A run that resumes ignores --init-from: refuse one that names another checkpoint than
    the run started from (a fine-tune of another parent into a reused --save-dir would
    otherwise carry on the old run)."""
    saved = saved_init_from(ck)
    if saved is not None and Path(saved).resolve() == Path(init_from).expanduser().resolve():
        return
    began = f"from {saved}" if saved else "without --init-from"
    raise NmtError(f"--init-from {init_from}, but the run that {path} resumes began {began}; "
                   f"a resume would not use it: {HOW_TO_RESTART}")


def saved_init_from(ck: Mapping[str, Any]) -> str | None:
    """The file the run's weights first came from (--init-from): the run keeps the record."""
    return (ck.get("train_config") or {}).get("init_from")


def saved_position(ck: Mapping[str, Any], path: Path, sampler_signature: Any) -> tuple[int, int]:
    """(epoch, batches of it done) to continue at: the saved position, or the start of the
    next epoch when the batching changed (another --max-tokens or world size: the saved
    position would mean other batches)."""
    prog = ck["progress"]
    if prog.get("sampler") == sampler_signature:
        return prog["epoch"], prog["epoch_batches_done"]
    log.warning("batching changed since %s: continuing at the start of epoch %d",
                path, prog["epoch"] + 1)
    return prog["epoch"] + 1, 0


def get_rng_state() -> dict[str, Any]:
    """Every RNG training touches, as tensors and plain python values (weights_only safe)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "python": {"version": py_state[0], "state": list(py_state[1]), "gauss": py_state[2]},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Take back get_rng_state()'s RNGs. The tensors go to the CPU first: a checkpoint loaded
    with map_location="cuda" (a GPU run resuming) has them on the GPU, where torch's and
    numpy's setters refuse them."""
    torch.set_rng_state(state["torch"].cpu())
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].cpu().numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu())


# --- what a resumed run must share with its checkpoint ---------------------------------------

HOW_TO_RESTART = "use --no-resume to start afresh, or another --save-dir"

# TrainConfig fields that change the optimisation of a resumed run, with their option names.
RUN_OPTIONS = {"warmup": "--warmup", "lr_scale": "--lr-scale", "lr_period": "--lr-period",
               "lr": "--lr", "lr_scheduler": "--lr-scheduler",
               "warmup_init_lr": "--warmup-init-lr", "min_lr": "--min-lr",
               "optimizer": "--optimizer", "weight_decay": "--weight-decay",
               "clip_norm": "--clip-norm", "seed": "--seed", "dropout_masks": "--dropout-masks",
               "max_tokens": "--max-tokens", "max_sentences": "--max-sentences",
               "update_freq": "--update-freq",
               "rdrop_alpha": "--rdrop-alpha",
               # fp16's loss scaler is saved and restored only for fp16
               "precision": "--precision",
               # the end of a cosine or linear schedule; which checkpoint counts as best
               "max_update": "--max-update", "best_checkpoint_metric": "--best-checkpoint-metric"}


def codec_difference(saved, current) -> str | None:
    """How two TextCodecs differ, in a few words; None when they encode alike."""
    if saved.same_as(current):
        return None
    a, b = saved.dictionary, current.dictionary
    if saved.subword.kind != current.subword.kind:
        return f"subword model {saved.subword.kind} vs {current.subword.kind}"
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} symbols"
    for i, (x, y) in enumerate(zip(a.symbols, b.symbols)):
        if x != y:
            return f"symbol {i} is {x!r} vs {y!r}"
    if saved.moses_lang != current.moses_lang:
        return f"Moses tokenization {saved.moses_lang} vs {current.moses_lang}"
    return "the subword models differ"


def vocabulary_mismatch(ckpt: Mapping[str, Any], path: Path, data) -> tuple[str, str] | None:
    """('source' or 'target', how it differs) for the first side whose vocabulary or subword
    model is not the checkpoint's; None when both are the same."""
    from nmt.checkpoint import codecs_from_checkpoint

    saved_src, saved_tgt = codecs_from_checkpoint(ckpt, str(path))
    for side, saved, current in (("source", saved_src, data.src_codec),
                                 ("target", saved_tgt, data.tgt_codec)):
        diff = codec_difference(saved, current)
        if diff:
            return side, diff
    return None


def _check_data(ckpt: Mapping[str, Any], path: Path, data, data_dir: str,
                warn: Callable[[str], None], doing: str, remedy: str) -> bool:
    """Refuse a data directory with other vocabularies (``cannot DOING: REMEDY``); warn about
    another language pair. True when the language pair is the checkpoint's."""
    trained_on = ckpt.get("data_dir") or "another data directory"
    mismatch = vocabulary_mismatch(ckpt, path, data)
    if mismatch:
        raise NmtError(f"{path} was trained on {trained_on}, whose {mismatch[0]} vocabulary "
                       f"differs from {data_dir}'s ({mismatch[1]}); cannot {doing}: {remedy}")
    langs = (ckpt.get("src_lang"), ckpt.get("tgt_lang"))
    if langs != (data.src_lang, data.tgt_lang):
        warn(f"{'resuming' if doing == 'resume' else 'initializing from'} a {langs[0]}->"
             f"{langs[1]} checkpoint on {data.src_lang}->{data.tgt_lang} data (the "
             f"vocabularies are the same)")
        return False
    return True


def check_same_data(ckpt: Mapping[str, Any], path: Path, data, data_dir: str,
                    warn: Callable[[str], None]) -> None:
    """Refuse a data directory whose vocabularies or subword models are not the checkpoint's."""
    if _check_data(ckpt, path, data, data_dir, warn, "resume", HOW_TO_RESTART) and \
            ckpt.get("data_dir") and Path(ckpt["data_dir"]).resolve() != Path(data_dir).resolve():
        warn(f"resuming on {data_dir}, not on {ckpt['data_dir']} where {path.name} was trained "
             f"(the vocabularies are the same)")


def check_init_data(ckpt: Mapping[str, Any], path: Path, data, data_dir: str,
                    warn: Callable[[str], None]) -> None:
    """--init-from: refuse a data directory whose vocabularies or subword models are not the
    checkpoint's (the embeddings would mean other symbols), saying how to encode it."""
    # The data directory it was trained on when it still exists, else the checkpoint itself
    # (its text pipeline: an imported model has no data directory).
    trained_on = ckpt.get("data_dir")
    source = trained_on if trained_on and Path(trained_on, "meta.json").is_file() else path
    _check_data(ckpt, path, data, data_dir, warn, "initialize from it",
                f"encode the new data with nmt-preprocess --reuse-vocab {source}")


def check_same_model(saved: Mapping[str, Any], current: Mapping[str, Any], path: Path) -> None:
    """Refuse another model configuration, naming what differs. A checkpoint written before a
    configuration field existed lacks it: it counts as the field's default (the model it
    describes is the same), as it does when the checkpoint is loaded for decoding."""
    if diffs := model_differences(saved, current):
        raise NmtError(f"{path} was trained with another model configuration ({diffs}); "
                       f"cannot resume: {HOW_TO_RESTART}")


def model_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """'d_model 512 vs 256; ...' (at most four fields) between two model configurations (a
    field the saved one predates counts as its default); empty when they are the same."""
    from nmt.config import ModelConfig

    try:
        saved = ModelConfig.from_dict(saved).to_dict()
    except (NmtError, TypeError, ValueError):
        saved = dict(saved)          # unreadable: the comparison below names what differs
    diffs = [f"{k} {saved.get(k)!r} vs {current.get(k)!r}"
             for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    return "; ".join(diffs[:4]) + ("; ..." if len(diffs) > 4 else "")


def changed_options(saved: Mapping[str, Any] | None, current: Any) -> list[str]:
    """'--warmup 4000 (was 1000)' for each optimisation option that differs from the run's."""
    if not saved:
        return []
    out = []
    for field, flag in RUN_OPTIONS.items():
        new, old = getattr(current, field, None), saved.get(field)
        if field in UNSET_MEANS:
            # not given is the value it stands for (checkpoints before it could be unset hold it)
            new, old = (UNSET_MEANS[field] if v is None else v for v in (new, old))
        if field in saved and old != new:
            out.append(f"{flag} {_fmt(new)} (was {_fmt(old)})")
    return out


def _fmt(value: Any) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


__all__ = ["training_state", "resume_point", "check_resumable", "restore",
           "saved_init_from", "check_same_parent", "saved_position", "get_rng_state",
           "set_rng_state", "check_same_data", "check_init_data", "check_same_model",
           "model_differences", "changed_options", "codec_difference", "vocabulary_mismatch"]
