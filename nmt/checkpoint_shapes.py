"""A checkpoint's model configuration, checked against its tensors before any model is built.

The configuration says how big a model to build; the tensors are what the file holds. A crafted
or damaged configuration (d_model 65536, a vocabulary of 10^9), or a tensor that is a view of a
tiny storage (shape [10^9, 512] with stride 0 takes a few bytes on disk, and torch.save keeps
views), would make building the model allocate hundreds of gigabytes before anything failed.
So: bounds on the sizes first (nmt.config.LIMITS), then the layer counts against the tensor
names, then the model built on the meta device (shapes only, nothing allocated) compared tensor
by tensor, and the weights' bytes against the storage that holds them. Each failure is one line
naming the checkpoint and the first mismatch.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from nmt.config import ModelConfig
from nmt.errors import NmtError

MAX_VOCAB = 1 << 31           # ids are int32 at most on disk


def check_weights(ckpt: Mapping[str, Any], name: str) -> None:
    """Raise a one-line NmtError unless ``ckpt['model']`` holds exactly the tensors that its
    model configuration, vocabulary sizes and embedding sharing imply."""
    from nmt.models.transformer import meta_model   # late: the model code imports torch.nn

    cfg = _config(ckpt, name)
    share = ckpt["share_all_embeddings"]
    if not isinstance(share, bool):
        raise NmtError(f"{name}: share_all_embeddings is not true or false")
    src_v, tgt_v = (_vocab_size(ckpt, side, name) for side in ("src", "tgt"))
    if share and src_v != tgt_v:
        raise NmtError(f"{name}: shares its embeddings, but the source vocabulary has {src_v} "
                       f"symbols and the target {tgt_v}")
    weights = ckpt["model"]
    _layer_counts(cfg, weights, name)
    model = meta_model(cfg, src_v, tgt_v, share)
    _compare(model, weights, name)


def _mismatch(name: str, what: str) -> NmtError:
    return NmtError(f"{name}: weights do not match the model configuration: {what}")


def _config(ckpt: Mapping[str, Any], name: str) -> ModelConfig:
    raw = ckpt["model_config"]
    if not isinstance(raw, dict):
        raise NmtError(f"{name}: model_config is not a dictionary")
    try:
        # Validation includes nmt.config.LIMITS: the sizes no tensor shape shows.
        return ModelConfig.from_dict(raw)
    except NmtError as e:
        raise NmtError(f"{name}: model_config: {e}") from None


def _vocab_size(ckpt: Mapping[str, Any], side: str, name: str) -> int:
    """``{side}_vocab_size``, checked against the symbols of the codec beside it (without
    parsing its subword model)."""
    key = f"{side}_vocab_size"
    try:
        symbols = ckpt[f"{side}_codec"]["dictionary"]["symbols"]
        in_codec = len(symbols) + 4 if isinstance(symbols, list) else None
    except (KeyError, TypeError):
        in_codec = None          # reported, with its reason, when the codec is rebuilt
    size = ckpt.get(key, in_codec)
    if size is None:
        raise NmtError(f"{name}: records no {key} and no readable {side}_codec")
    if not isinstance(size, int) or isinstance(size, bool) or not 4 <= size <= MAX_VOCAB:
        raise NmtError(f"{name}: {key} must be a number of symbols from 4 to {MAX_VOCAB}")
    if in_codec is not None and in_codec != size:
        raise NmtError(f"{name}: {key} is {size}, but its {side}_codec has {in_codec} symbols")
    return size


def _layer_counts(cfg: ModelConfig, weights: Mapping[str, torch.Tensor], name: str) -> None:
    """Layers against tensor names, before building: a stack of a million (meta) layers
    takes long even when it allocates nothing."""
    for stack in ("encoder_layers", "decoder_layers"):
        held = {k.split(".")[1] for k in weights if k.startswith(stack + ".")}
        count = max((int(i) + 1 for i in held if i.isdigit()), default=0)
        if count != getattr(cfg, stack):
            raise _mismatch(name, f"{stack} is {getattr(cfg, stack)}, the tensors hold {count}")


def _compare(model: torch.nn.Module, weights: Mapping[str, torch.Tensor], name: str) -> None:
    expected = model.state_dict()
    for key, want in expected.items():
        got = weights.get(key)
        if got is None:
            raise _mismatch(name, f"no tensor '{key}'")
        if tuple(got.shape) != tuple(want.shape):
            raise _mismatch(name, f"tensor '{key}' has shape {tuple(got.shape)}, the "
                                  f"configuration implies {tuple(want.shape)}")
        if not got.is_floating_point():
            raise _mismatch(name, f"tensor '{key}' holds {got.dtype}, not floating point")
        if got.untyped_storage().nbytes() < got.numel() * got.element_size():
            raise _mismatch(name, f"tensor '{key}' is a view of a smaller storage (it holds "
                                  f"fewer values than its shape says)")
    extra = [k for k in weights if k not in expected]
    if extra:
        raise _mismatch(name, f"unexpected tensor '{extra[0]}'")
    # Views that share one storage each pass the check above; together they could still ask
    # for far more memory than the file holds. Tied parameters are counted once.
    needed = sum(p.numel() * weights[k].element_size() for k, p in model.named_parameters())
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in weights.values()}
    held = sum(storages.values())
    if needed > held:
        raise _mismatch(name, f"the tensors hold {held} bytes for {needed} bytes of weights "
                              f"(views sharing a storage)")


__all__ = ["check_weights", "MAX_VOCAB"]
