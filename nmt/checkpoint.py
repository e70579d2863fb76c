"""Checkpoint files, shared by training, decoding and averaging: the format (one place,
:func:`make_checkpoint`), atomic writing, safe loading (``weights_only=True``), validation, and
rebuilding the model and codecs a checkpoint describes.

The format (docs/DESIGN.md, "Checkpoint") is a plain dict of python types and tensors, so that
``torch.load(weights_only=True)`` can read it without running any pickled code::

    format_version, nmt_version, model_config, share_all_embeddings,
    src_vocab_size, tgt_vocab_size, src_lang, tgt_lang, data_dir,
    src_codec, tgt_codec, model,
    # training checkpoints only:
    train_config, optimizer, scheduler, scaler, rng, progress

``nmt-generate`` needs only the first group; the second lets ``nmt-train`` resume exactly
(that half is built, checked and restored in one place: ``nmt.training.resume``).
"""

from __future__ import annotations

import os
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any, Mapping

import torch

from nmt.checkpoint_records import mmap_verdict
from nmt.config import ModelConfig
from nmt.errors import NmtError
from nmt.io import atomic_write, check_readable

# The version of the format that make_checkpoint writes. A file of an older version is brought
# up to this one when it is read (upgrade(), one step per version), so that the rest of the
# code sees only the current format:
#   1: the first format.
#   2: "task" and "src_vocab_size"/"tgt_vocab_size" always recorded; a training
#      checkpoint's progress always holds the checkpoint selection ("selection"), which
#      version-1 files written before it existed lack ("best_loss" stood for it).
FORMAT_VERSION = 2

# Keys every checkpoint (training, averaged or inference) must carry.
REQUIRED_KEYS = ("format_version", "model_config", "share_all_embeddings", "src_codec",
                 "tgt_codec", "model")
# Keys that only training checkpoints carry; an inference checkpoint drops them.
TRAINING_KEYS = ("train_config", "optimizer", "scheduler", "scaler", "rng", "progress")


def save_checkpoint(ckpt: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write ``ckpt`` to ``path`` atomically (temporary file, fsync, rename)."""
    dest = Path(path)
    if "format_version" not in ckpt:
        ckpt = {"format_version": FORMAT_VERSION, **ckpt}
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NmtError(f"{dest.parent}: cannot create directory ({e.strerror})") from None
    with atomic_write(dest, "wb") as f:
        _torch_save(dict(ckpt), f)
    return dest


class _WriteRecorder:
    """The file torch.save writes to, keeping the OSError of a failed write: torch.save turns
    it into a RuntimeError ("[enforce fail at inline_container.cc...] unexpected pos") that no
    longer says why (a full disk, a file size limit, a quota) nor names the file."""

    def __init__(self, f):
        self._f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self.error = e
            raise

    def __getattr__(self, name: str) -> Any:       # flush, fileno, ...: the file's own
        return getattr(self._f, name)


def _torch_save(obj: Any, f) -> None:
    """torch.save, the only one in nmt: a failed write raises the OSError behind it, which
    atomic_write reports as 'PATH: cannot write (No space left on device)'."""
    out = _WriteRecorder(f)
    try:
        torch.save(obj, out)
    except RuntimeError:
        if out.error is None:
            raise
        raise out.error from None


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    mmap: bool = False) -> dict:
    """Read and validate a checkpoint; every failure is a one-line :class:`NmtError`.

    Only tensors and plain python containers are unpickled (``weights_only=True``): a file that
    asks to construct arbitrary objects (a crafted pickle) is refused, not executed.

    ``mmap``: map the file instead of reading it (torch.save's zip format; a legacy pickle is
    read whole). A tensor is then read from disk only when used, so a reader that needs the
    weights alone (decoding, averaging, export) never reads a training checkpoint's optimizer
    state, twice the size of the weights. nmt replaces checkpoints by renaming, never in
    place, so a mapped file does not change under its reader.
    """
    p = check_readable(path, "checkpoint", expected="a checkpoint file")
    if p.stat().st_size == 0:
        raise NmtError(f"{p}: empty file, not a checkpoint")
    is_zip = _check_kind(p)
    # A mapped archive is trusted as it is: check its records first (compressed ones are
    # read whole instead; a record of the wrong size is refused).
    mmap = mmap and is_zip and mmap_verdict(p)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pickle-protocol chatter on foreign files
            try:
                ckpt = torch.load(p, map_location=map_location, weights_only=True,
                                  mmap=mmap and is_zip)
            except (RuntimeError, OSError):
                if not (mmap and is_zip):
                    raise
                # a filesystem that cannot map files (some FUSE mounts): read it whole; a
                # corrupt file fails again below and is reported as such
                ckpt = torch.load(p, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # weights_only's restricted unpickler refuses any global it does not allow: a crafted
        # file asking for os.system lands here and nothing of it is executed.
        text = str(e)
        if "global" in text.lower():
            raise NmtError(f"{p}: refused to load: the file asks to build objects other than "
                           f"tensors and plain data (not an nmt checkpoint, or a crafted one)"
                           ) from None
        raise NmtError(f"{p}: not a readable checkpoint (the safe loader refused it)") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, KeyError, AttributeError,
            TypeError, IndexError, OSError) as e:
        msg = " ".join(str(e).split())
        msg = msg.split(". ")[0][:160] or type(e).__name__
        raise NmtError(f"{p}: corrupt or truncated checkpoint ({msg})") from None
    validate_checkpoint(ckpt, str(p))
    return ckpt


def _check_kind(p: Path) -> bool:
    """Refuse at once a file that is not in torch.save's format (a zip archive, or a legacy
    pickle), saying what it looks like: a text file is not 'refused by the safe loader'.
    True for a zip archive (the format that can be memory-mapped)."""
    try:
        with open(p, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise NmtError(f"{p}: cannot read ({e.strerror or e})") from None
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return head.startswith(b"PK\x03\x04")
    try:
        head.decode("utf-8")
        kind = "a text file"
    except UnicodeDecodeError as e:
        kind = "a text file" if e.start > len(head) - 4 else "some other binary file"
    raise NmtError(f"{p}: not a checkpoint ({kind}; checkpoints are the .pt files that "
                   f"nmt-train writes)")


def validate_checkpoint(ckpt: Any, name: str = "checkpoint") -> None:
    if not isinstance(ckpt, dict):
        raise NmtError(f"{name}: not an nmt checkpoint (top level is {type(ckpt).__name__})")
    if "format_version" not in ckpt:
        raise NmtError(f"{name}: not an nmt checkpoint (no format_version)")
    version = ckpt["format_version"]
    if type(version) is not int or not 1 <= version <= FORMAT_VERSION:
        raise NmtError(f"{name}: unsupported checkpoint format_version {version!r} "
                       f"(this nmt reads versions 1 to {FORMAT_VERSION})")
    missing = [k for k in REQUIRED_KEYS if k not in ckpt]
    if missing:
        raise NmtError(f"{name}: incomplete checkpoint, missing {', '.join(missing)}")
    if not isinstance(ckpt["model"], dict) or not all(
            isinstance(v, torch.Tensor) for v in ckpt["model"].values()):
        raise NmtError(f"{name}: incomplete checkpoint, 'model' is not a tensor dictionary")
    for key in ("src_lang", "tgt_lang", "data_dir"):
        if ckpt.get(key) is not None and not isinstance(ckpt[key], str):
            raise NmtError(f"{name}: '{key}' is not a string")
    # Before anything is built from it: the configuration must be what the tensors hold.
    from nmt.checkpoint_shapes import check_weights

    check_weights(ckpt, name)
    upgrade(ckpt, name)


def upgrade(ckpt: dict, name: str = "checkpoint") -> dict:
    """Bring ``ckpt`` (a checkpoint dictionary of any version this nmt reads, with the
    required keys) up to FORMAT_VERSION, in place, one version at a time; return it.
    validate_checkpoint (and so every loader) calls it."""
    while ckpt["format_version"] < FORMAT_VERSION:
        _UPGRADES[ckpt["format_version"]](ckpt, name)
        ckpt["format_version"] += 1
    return ckpt


def _version_1_to_2(ckpt: dict, name: str) -> None:
    from nmt.tasks.task import recorded_task

    if ckpt.get("task") is None or "src_vocab_size" not in ckpt or "tgt_vocab_size" not in ckpt:
        src, tgt = codecs_from_checkpoint(ckpt, name)
        ckpt.setdefault("src_vocab_size", len(src.dictionary))
        ckpt.setdefault("tgt_vocab_size", len(tgt.dictionary))
        ckpt["task"] = recorded_task(ckpt.get("task"), name, tgt.dictionary).name
    progress = ckpt.get("progress")
    if isinstance(progress, dict) and progress.get("selection") is None:
        best = progress.get("best_loss")
        progress["selection"] = {"metric": "loss", "best": None if best is None else float(best),
                                 "best_update": None, "bad_in_a_row": 0, "scores": []}


_UPGRADES = {1: _version_1_to_2}


def make_checkpoint(*, model_config: ModelConfig, model_state: Mapping[str, torch.Tensor],
                    share_all_embeddings: bool, src_codec, tgt_codec, src_lang: str = "src",
                    tgt_lang: str = "tgt", data_dir: str | None = None,
                    task: str | None = None,
                    training: Mapping[str, Any] | None = None) -> dict:
    """The checkpoint dictionary of a model and its codecs (the one place that spells out the
    format). ``src_codec``/``tgt_codec`` are TextCodec objects or their ``to_state()``;
    ``task`` is what the model is for (nmt.tasks.task.TASKS; None: inferred from the target
    vocabulary, as for files written before tasks were recorded); ``training`` adds the
    training keys (train_config, optimizer, scheduler, scaler, rng, progress) to make a
    resumable training checkpoint."""
    from nmt.version import __version__

    def state(codec) -> dict:
        return codec if isinstance(codec, Mapping) else codec.to_state()

    src_state, tgt_state = state(src_codec), state(tgt_codec)
    ckpt = {
        "format_version": FORMAT_VERSION,
        "nmt_version": __version__,
        "model_config": model_config.to_dict(),
        "share_all_embeddings": bool(share_all_embeddings),
        "src_vocab_size": _codec_size(src_codec),
        "tgt_vocab_size": _codec_size(tgt_codec),
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
        "data_dir": None if data_dir is None else str(data_dir),
        "task": task or _inferred_task(tgt_codec),
        "src_codec": src_state,
        "tgt_codec": tgt_state,
        "model": dict(model_state),
    }
    if training is not None:
        unknown = set(training) - set(TRAINING_KEYS)
        if unknown:
            raise ValueError(f"not training keys: {', '.join(sorted(unknown))}")
        ckpt.update(training)
    return ckpt


def checkpoint_task(ckpt: Mapping[str, Any], name: str = "checkpoint"):
    """The nmt.tasks.task.Task a (loaded, so current-format) checkpoint records."""
    from nmt.tasks.task import get_recorded_task

    return get_recorded_task(ckpt["task"], name)


def _inferred_task(codec) -> str:
    from nmt.tasks.task import infer_task

    if isinstance(codec, Mapping):
        from nmt.data.codec import TextCodec  # late: needs sentencepiece etc.

        codec = TextCodec.from_state(codec)
    return infer_task(codec.dictionary).name


def _codec_size(codec) -> int:
    if isinstance(codec, Mapping):
        from nmt.data.codec import TextCodec  # late: needs sentencepiece etc.

        codec = TextCodec.from_state(codec)
    return len(codec.dictionary)


def codecs_from_checkpoint(ckpt: Mapping[str, Any], name: str = "checkpoint"):
    """(source, target) TextCodec objects rebuilt from a checkpoint."""
    from nmt.data.codec import TextCodec  # late: needs sentencepiece etc.

    codecs = []
    for side in ("src", "tgt"):
        try:
            codecs.append(TextCodec.from_state(ckpt[f"{side}_codec"]))
        except NmtError as e:     # e.g. a sentencepiece model that does not parse
            raise NmtError(f"{name}: {side}_codec: {e}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            reason = " ".join(str(e).split())[:60]
            raise NmtError(f"{name}: checkpoint has an unreadable {side}_codec "
                           f"({type(e).__name__}: {reason})") from None
    return tuple(codecs)


def vocab_sizes(ckpt: Mapping[str, Any]) -> tuple[int, int]:
    """(source, target) vocabulary sizes of a loaded checkpoint."""
    return int(ckpt["src_vocab_size"]), int(ckpt["tgt_vocab_size"])


def model_config(ckpt: Mapping[str, Any]) -> ModelConfig:
    try:
        return ModelConfig.from_dict(ckpt["model_config"])
    except NmtError as e:
        raise NmtError(f"checkpoint has an invalid model configuration: {e}") from None


def load_model_from_checkpoint(path_or_ckpt: str | os.PathLike | Mapping[str, Any],
                               device: str | torch.device = "cpu"):
    """Rebuild the model a checkpoint describes and load its weights.

    Returns ``(model, ckpt)``; the model is in eval mode on ``device``.
    """
    from nmt.models.transformer import build_model  # late: the model code imports torch.nn

    if isinstance(path_or_ckpt, Mapping):
        ckpt = dict(path_or_ckpt)
        validate_checkpoint(ckpt)
        name = "checkpoint"
    else:
        ckpt = load_checkpoint(path_or_ckpt, mmap=True)   # the weights only are read
        name = str(path_or_ckpt)
    cfg = model_config(ckpt)
    src_v, tgt_v = vocab_sizes(ckpt)
    model = build_model(cfg, src_v, tgt_v, share_all_embeddings=bool(ckpt["share_all_embeddings"]))
    try:
        model.load_state_dict(ckpt["model"], strict=True)
    except RuntimeError as e:
        first = " ".join(str(e).split())[:300]
        raise NmtError(f"{name}: weights do not match the model configuration ({first})") from None
    model.to(device)
    model.eval()
    return model, ckpt


def inference_checkpoint(ckpt: Mapping[str, Any]) -> dict:
    """A copy without optimizer/scheduler/RNG/progress: what averaging and export produce."""
    return {k: v for k, v in ckpt.items() if k not in TRAINING_KEYS}
