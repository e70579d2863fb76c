"""What a resumed run must share with the checkpoint it continues, and what it may change.

A checkpoint continues only on the data it was trained on: the same source and target
vocabularies and subword models (another data directory with the same codecs, e.g. new data
encoded with ``nmt-preprocess --reuse-vocab``, is allowed with a warning). The model
configuration must be the same. Options of the optimisation (warm-up, learning-rate scale,
clipping, seed, batching) may change, and every change is named in a warning, never taken
silently. A run started with ``--init-from`` needs the vocabularies of the checkpoint it starts
from just the same (``check_init_data``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from nmt.errors import NmtError

HOW_TO_RESTART = "use --no-resume to start afresh, or another --save-dir"

# TrainConfig fields that change the optimisation of a resumed run, with their option names.
RUN_OPTIONS = {"warmup": "--warmup", "lr_scale": "--lr-scale", "lr_period": "--lr-period",
               "lr": "--lr", "lr_scheduler": "--lr-scheduler",
               "warmup_init_lr": "--warmup-init-lr", "min_lr": "--min-lr",
               "optimizer": "--optimizer", "weight_decay": "--weight-decay",
               "clip_norm": "--clip-norm", "seed": "--seed", "dropout_masks": "--dropout-masks",
               "max_tokens": "--max-tokens", "max_sentences": "--max-sentences",
               "update_freq": "--update-freq"}


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
    trained_on = ckpt.get("data_dir") or "on the checkpoint's data directory"
    _check_data(ckpt, path, data, data_dir, warn, "initialize from it",
                f"encode the new data with nmt-preprocess --reuse-vocab {trained_on}")


def check_same_model(saved: Mapping[str, Any], current: Mapping[str, Any], path: Path) -> None:
    """Refuse another model configuration, naming what differs."""
    if dict(saved) == dict(current):
        return
    diffs = [f"{k} {saved.get(k)!r} vs {current.get(k)!r}"
             for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    raise NmtError(f"{path} was trained with another model configuration "
                   f"({'; '.join(diffs[:4])}{'; ...' if len(diffs) > 4 else ''}); "
                   f"cannot resume: {HOW_TO_RESTART}")


def changed_options(saved: Mapping[str, Any] | None, current: Any) -> list[str]:
    """'--warmup 4000 (was 1000)' for each optimisation option that differs from the run's."""
    if not saved:
        return []
    out = []
    for field, flag in RUN_OPTIONS.items():
        new = getattr(current, field, None)
        if field in saved and saved[field] != new:
            out.append(f"{flag} {_fmt(new)} (was {_fmt(saved[field])})")
    return out


def _fmt(value: Any) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


__all__ = ["check_same_data", "check_init_data", "check_same_model", "changed_options",
           "codec_difference", "vocabulary_mismatch"]
