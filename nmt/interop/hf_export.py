"""``nmt-export --format huggingface``: a checkpoint as a Marian model directory that
transformers loads (``MarianMTModel.from_pretrained``, ``MarianTokenizer.from_pretrained``):

    OUT/model.safetensors            the weights, transformers' MarianMTModel names
    OUT/config.json                  MarianConfig
    OUT/generation_config.json       beam, length penalty, length limit, banned <pad> and <s>
    OUT/source.spm, target.spm       the sentencepiece models
    OUT/vocab.json                   piece -> id: nmt's dictionary, id for id
    OUT/tokenizer_config.json, special_tokens_map.json    MarianTokenizer's settings

The vocabulary keeps nmt's ids (<pad> 0, <s> 1, </s> 2, <unk> 3), so ``nmt-import
huggingface`` gives back the very same weights: both read the parameter names and the
configuration keys from one table (nmt.interop.marian). What transformers' Marian can express
is exported; the rest is refused with one line naming all of it: pre-norm layers,
layernorm_embedding, LayerNorm epsilon other than 1e-5, separate source and target
vocabularies, Moses tokenization and subwords other than sentencepiece (MarianTokenizer has
neither).

Positions of every kind export: transformers loads ``embed_positions`` from the weights file
when it has them, so the file carries nmt's own table (any sinusoid layout and offset, or the
learned rows); see nmt.interop.hf_positions. (transformers' own save_pretrained leaves the
tables out: a directory it re-saved runs with Marian's table, which only a model trained with
``sinusoid_layout=marian`` was.)

Decoding: transformers has no GNMT length penalty; a model whose preset uses it gets
``length_penalty`` = its alpha with transformers' |Y|^alpha (a warning says so).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch

from nmt.errors import NmtError
from nmt.interop.foreign import refuse
from nmt.interop.hf_positions import MARK, MAX_OFFSET, export_positions
from nmt.interop.marian import (EMBEDDINGS, OUTPUT, OUTPUT_BIAS, PARTS, layer_modules,
                                marian_config, marian_names)
from nmt.io import install_directory, temporary_directory_beside
from nmt.specials import BOS, EOS, PAD, SPECIALS, UNK

log = logging.getLogger("nmt.export")

INSTALL_HINT = "pip install 'nmt[hf]'"


def check_hf_exportable(ckpt: dict, cfg, src_codec, tgt_codec, name: str) -> None:
    """One-line NmtError naming everything a Marian directory cannot hold as nmt runs it."""
    problems = []
    if cfg.pre_norm:
        problems.append("pre-norm layers (transformers' Marian is post-norm)")
    if cfg.positional == "sinusoidal" and cfg.position_offset > MAX_OFFSET:
        problems.append(f"position_offset {cfg.position_offset} (nmt-import recognises "
                        f"sinusoid tables of offsets up to {MAX_OFFSET})")
    if cfg.layernorm_embedding:
        problems.append("layernorm_embedding")
    if cfg.layer_norm_eps != 1e-5:
        problems.append(f"LayerNorm epsilon {cfg.layer_norm_eps:g} (Marian's is 1e-5)")
    if cfg.head_dim_k * cfg.heads != cfg.d_model or cfg.head_dim_v != cfg.head_dim_k:
        problems.append("head sizes other than d_model / heads")
    if not ckpt["share_all_embeddings"] or src_codec.dictionary != tgt_codec.dictionary:
        problems.append("separate source and target vocabularies")
    for side, codec in (("source", src_codec), ("target", tgt_codec)):
        if codec.kind != "bpe":
            problems.append(f"the {side} side's {codec.kind} subwords (MarianTokenizer reads "
                            f"sentencepiece models)")
        if codec.moses_lang:
            problems.append(f"Moses tokenization of the {side} side (MarianTokenizer has none)")
    refuse(f"{name}: cannot export to huggingface (Marian)", problems)


def hf_state_dict(model) -> dict[str, torch.Tensor]:
    """MarianMTModel's state dict (each tensor its own contiguous copy) of an nmt model."""
    out: dict[str, torch.Tensor] = {}

    def put(name: str, t: torch.Tensor) -> None:
        out[name] = t.detach().to("cpu", torch.float32).contiguous().clone()

    # All three names: transformers would initialize the encoder's and decoder's embeddings
    # at random otherwise (it ties them only when tie_word_embeddings is true).
    for name in EMBEDDINGS:
        put(name, model.tgt_embed.weight)
    for name, table in export_positions(model).items():
        put(name, table)
    if model.output_weight is not None:
        put(OUTPUT, model.output_weight)
    bias = (model.output_bias if model.output_bias is not None
            else torch.zeros(model.tgt_embed.weight.size(0)))
    put(OUTPUT_BIAS, bias.reshape(1, -1))
    for marian, nmt, fused in layer_modules(model.cfg):
        module = model.get_submodule(nmt)
        for part in PARTS:
            names = marian_names(marian, fused, part)
            for name, t in zip(names, getattr(module, part).chunk(len(names))):
                put(name, t)
    return out


def is_hf_export(d: Path) -> bool:
    """Whether ``d`` holds a Marian directory nmt-export wrote: its config.json carries nmt's
    own key (MARK), which a model from elsewhere (the Hub's) has not."""
    try:
        config = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and MARK in config


def generation_config(cfg, name: str) -> dict:
    """generation_config.json: nmt's preset decoding, as near as transformers can follow it."""
    if cfg.lenpen_formula == "gnmt" and cfg.lenpen and cfg.beam > 1:
        log.warning("%s: transformers has no GNMT length penalty; its beam search will divide "
                    "by |Y|^%g instead (nmt-generate --lenpen-formula hf does the same)",
                    name, cfg.lenpen)
    if cfg.max_len_a:
        max_length = cfg.max_positions
        log.warning("%s: transformers has one length limit for every sentence, not %g * "
                    "source length + %d: max_length %d", name, cfg.max_len_a, cfg.max_len_b,
                    max_length)
    else:
        max_length = cfg.max_len_b + 2        # the start symbol and the forced eos
    gen = {"decoder_start_token_id": cfg.start_id, "pad_token_id": PAD, "eos_token_id": EOS,
           "forced_eos_token_id": EOS, "bad_words_ids": [[PAD], [BOS]],
           "num_beams": cfg.beam, "length_penalty": cfg.lenpen,
           "early_stopping": cfg.lenpen_formula == "fairseq", "max_length": max_length}
    if cfg.min_len:
        # transformers counts the start symbol in min_length: no eos while the output,
        # start included, is shorter
        gen["min_length"] = cfg.min_len + 1
    return gen


def export_huggingface(ckpt: dict, dest: Path, name: str) -> Path:
    """Write the Marian directory of ``ckpt`` (a loaded checkpoint) to ``dest`` (checked free
    by the caller), built under a temporary name and renamed when complete."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise NmtError(f"exporting to huggingface needs the safetensors package: "
                       f"{INSTALL_HINT}") from None
    from nmt.checkpoint import codecs_from_checkpoint, load_model_from_checkpoint

    model, ckpt = load_model_from_checkpoint(ckpt)
    src_codec, tgt_codec = codecs_from_checkpoint(ckpt, name)
    check_hf_exportable(ckpt, model.cfg, src_codec, tgt_codec, name)
    symbols = tgt_codec.dictionary.symbols
    specials = {"eos_token": SPECIALS[EOS], "unk_token": SPECIALS[UNK],
                "pad_token": SPECIALS[PAD]}
    tokenizer = {"tokenizer_class": "MarianTokenizer", **specials,
                 "source_lang": ckpt.get("src_lang"), "target_lang": ckpt.get("tgt_lang"),
                 "model_max_length": model.cfg.max_positions, "separate_vocabs": False,
                 "sp_model_kwargs": {}}
    files = {"config.json": marian_config(model.cfg, len(symbols)),
             "generation_config.json": generation_config(model.cfg, name),
             "vocab.json": {s: i for i, s in enumerate(symbols)},
             "tokenizer_config.json": tokenizer, "special_tokens_map.json": specials}
    tmp = temporary_directory_beside(dest, "model directory")
    try:
        save_file(hf_state_dict(model), str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        for fname, data in files.items():
            (tmp / fname).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
        (tmp / "source.spm").write_bytes(src_codec.subword.proto)
        (tmp / "target.spm").write_bytes(tgt_codec.subword.proto)
        install_directory(tmp, dest, "model directory", fsync_files=True)
    except OSError as e:
        raise NmtError(f"{dest}: cannot write the model directory ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(f.stat().st_size for f in dest.iterdir() if f.is_file())
    log.info("exported %s to %s: transformers Marian, %.1f MB", name, dest, size / 1e6)
    return dest


__all__ = ["export_huggingface", "check_hf_exportable", "hf_state_dict", "generation_config"]
