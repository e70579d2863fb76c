"""``nmt-import huggingface``: a Marian model directory (OPUS-MT, transformers' format) -> an
ordinary, self-contained nmt checkpoint that translates as transformers does.

    import_huggingface("opus-mt-en-de", "ende.pt")

The directory holds what OPUS-MT ships: ``config.json`` (MarianConfig), the weights in
``model.safetensors`` or ``pytorch_model.bin`` (read with safetensors or
``torch.load(weights_only=True)``: nothing in them is executed), ``source.spm`` and
``target.spm`` (sentencepiece models), ``vocab.json`` (piece -> id, one vocabulary for both
sides), optionally ``tokenizer_config.json`` and ``generation_config.json``.

How a Marian model maps onto nmt's Transformer (nmt.config.ModelConfig):

- post-norm layers, the FFN activation (swish/silu, relu or exact gelu), embeddings scaled by
  sqrt(d_model) or not (``scale_embedding``), sinusoidal positions in Marian's layout (sines in
  the first half, cosines in the second, positions from 0) or, when the weights file stores
  the tables, the table it stores (nmt.importers.hf_positions), LayerNorm epsilon 1e-5, one
  embedding matrix for both sides, the output projection tied to it (or ``lm_head`` when
  ``tie_word_embeddings`` is false), ``final_logits_bias`` as the output bias;
- q/k/v projections fused as nmt's attention wants them ([q; k; v], cross-attention [k; v]);
- the vocabulary becomes nmt's dictionary: <pad>, <s>, </s>, <unk> at ids 0-3 (Marian has no
  <s>: its row is zeros and its logit bias -100, so it never takes probability), the other
  pieces after them in vocab.json's order; rows are permuted to match;
- decoding starts from ``decoder_start_token_id`` (<pad> for OPUS-MT); the checkpoint's preset
  decoding is transformers': ``num_beams``, ``length_penalty`` with the ``hf`` formula (or
  ``fairseq`` when ``early_stopping`` is true, which is that rule), ``max_length`` as
  ``max_len_b = max_length - 2`` (the start symbol and the forced eos take two), or
  ``max_new_tokens - 1``, or 19 when neither is set (transformers' 20 new tokens);
- text: MarianTokenizer's pipeline (nmt.data.subword.SentencePieceVocab): source.spm pieces
  looked up in vocab.json, target pieces joined by target.spm.

What nmt cannot represent exactly is refused with one line naming it: another ``model_type``,
separate source/target vocabularies, different encoder/decoder head counts or FFN sizes, an
activation other than the above, and the BART-era flags transformers' Marian ignores
(``normalize_before``, ``normalize_embedding``, ``add_final_layer_norm``...).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from nmt.config import ModelConfig
from nmt.errors import NmtError
from nmt.importers.common import (ABSENT_LOGIT, check_output, load_safetensors,
                                  load_torch_weights, named_errors, nmt_dictionary,
                                  permute_rows, probability, read_json, regular_file)
from nmt.importers.hf_positions import KEYS as POSITION_KEYS, import_positions
from nmt.specials import BOS, EOS, PAD, SPECIALS, UNK

log = logging.getLogger("nmt.import")

# The files of a Marian directory the import reads: -o may not name one of them.
MARIAN_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "vocab.json",
                "target_vocab.json", "source.spm", "target.spm", "model.safetensors",
                "pytorch_model.bin")

ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}
# MarianConfig's defaults for the keys a config.json may leave out (transformers 4.x-5.x).
DEFAULTS = {"activation_function": "gelu", "scale_embedding": False,
            "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
            "max_position_embeddings": 1024, "dropout": 0.1, "attention_dropout": 0.0,
            "activation_dropout": 0.0}
# BART-era keys of old Marian configs that transformers' Marian does not implement: a value
# other than this one describes a model it would run differently from how it was trained.
LEGACY = {"normalize_before": False, "normalize_embedding": False, "add_final_layer_norm": False,
          "add_bias_logits": False, "static_position_embeddings": True}
# Generation settings nmt's search has no equivalent of, and their neutral values.
NEUTRAL_GENERATION = {"no_repeat_ngram_size": 0, "repetition_penalty": 1.0,
                      "do_sample": False, "num_beam_groups": 1, "diversity_penalty": 0.0,
                      "encoder_no_repeat_ngram_size": 0, "encoder_repetition_penalty": 1.0,
                      "suppress_tokens": [], "begin_suppress_tokens": [],
                      "forced_bos_token_id": None, "forced_decoder_ids": [],
                      "sequence_bias": {}, "renormalize_logits": False,
                      "exponential_decay_length_penalty": None, "force_words_ids": []}


def import_huggingface(model_dir: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Convert the Marian model directory ``model_dir`` to the nmt checkpoint ``out`` (written
    atomically); returns its path. Every failure is a one-line NmtError."""
    from nmt.checkpoint import load_model_from_checkpoint, make_checkpoint, save_checkpoint
    from nmt.data.codec import TextCodec
    from nmt.data.subword import SentencePieceVocab, read_model_bytes

    d = Path(model_dir)
    if not d.is_dir():
        raise NmtError(f"{d}: not a directory (give the model directory, with config.json, "
                       f"the weights, source.spm, target.spm and vocab.json)")
    dest = check_output(out, reads={d: MARIAN_FILES})
    config = read_json(d / "config.json", "model configuration")
    tok = _optional_json(d / "tokenizer_config.json", "tokenizer configuration")
    if tok.get("separate_vocabs") or (d / "target_vocab.json").exists():
        raise NmtError(f"{d}: cannot import: separate source and target vocabularies "
                       f"(separate_vocabs) are not supported")
    symbols = _read_vocab(d / "vocab.json")
    specials = _special_ids(symbols, config, tok, d)
    # transformers reads generation_config.json alone when it is there, else config.json's keys
    gen_path = d / "generation_config.json"
    settings = (read_json(gen_path, "generation configuration") if gen_path.exists()
                else _generation_keys(config))
    cfg = marian_config(config, settings, specials, str(d))
    weights = _read_weights(d)
    rows = _check_vocab_sizes(len(symbols), config, weights, d)
    symbols = symbols + _unnamed(symbols, rows)
    dictionary, order = nmt_dictionary(symbols, specials)
    changes, positions = import_positions(weights, cfg.d_model, cfg.max_positions, config,
                                          str(d))
    cfg = _replace(cfg, **changes)
    state = {**convert_weights(weights, cfg, order, specials, str(d)), **positions}
    if "output_bias" not in state:
        cfg = _replace(cfg, output_bias=False)
    spm = {side: read_model_bytes(regular_file(d / f"{side}.spm", f"{side} sentencepiece model"),
                                  f"the {side} sentencepiece model")
           for side in ("source", "target")}
    codecs = [TextCodec(named_errors(d / f"{side}.spm",
                               lambda side=side: SentencePieceVocab(spm[side], dictionary)),
                        dictionary)
              for side in ("source", "target")]
    ckpt = make_checkpoint(model_config=cfg, model_state=state, share_all_embeddings=True,
                           src_codec=codecs[0], tgt_codec=codecs[1],
                           src_lang=str(tok.get("source_lang") or "src"),
                           tgt_lang=str(tok.get("target_lang") or "tgt"))
    load_model_from_checkpoint(ckpt)      # every weight has the shape the config says
    save_checkpoint(ckpt, dest)
    log.info("imported %s: Marian %d+%d layers, d_model %d, %d pieces, %s", d,
             cfg.encoder_layers, cfg.decoder_layers, cfg.d_model, len(dictionary),
             cfg.activation)
    return dest


def _optional_json(path: Path, what: str) -> dict:
    return read_json(path, what) if path.exists() else {}


def _generation_keys(config: dict) -> dict:
    """The generation settings an old config.json carries (generation_config.json wins)."""
    keys = ("num_beams", "max_length", "max_new_tokens", "min_length", "min_new_tokens",
            "length_penalty", "early_stopping", "bad_words_ids", "forced_eos_token_id",
            *NEUTRAL_GENERATION)
    return {k: config[k] for k in keys if k in config}


def _read_vocab(path: Path) -> list[str]:
    """vocab.json's pieces in id order; the ids must be 0 .. n-1, each once."""
    vocab = read_json(path, "vocabulary")
    symbols: list[str | None] = [None] * len(vocab)
    for piece, i in vocab.items():
        if not isinstance(i, int) or not 0 <= i < len(vocab) or symbols[i] is not None:
            raise NmtError(f"{path}: ids must be 0..{len(vocab) - 1}, each once; "
                           f"{piece!r} has {i!r}")
        symbols[i] = piece
    bad = next((s for s in symbols if not s or "\n" in s or "\r" in s), None)
    if bad is not None:
        raise NmtError(f"{path}: piece {bad!r} is empty or holds a line break")
    return symbols  # type: ignore[return-value]


def _token(tok: dict, key: str, default: str) -> str:
    value = tok.get(key, default)
    return value.get("content", default) if isinstance(value, dict) else str(value)


def _special_ids(symbols: list[str], config: dict, tok: dict, d: Path) -> dict[int, int]:
    """{nmt special id: Marian id} for <pad>, </s>, <unk> (and <s> when vocab.json has it),
    checked against config.json's ids."""
    index = {s: i for i, s in enumerate(symbols)}
    out: dict[int, int] = {}
    for nmt_id, key, default, config_key in ((PAD, "pad_token", "<pad>", "pad_token_id"),
                                             (EOS, "eos_token", "</s>", "eos_token_id"),
                                             (UNK, "unk_token", "<unk>", None)):
        piece = _token(tok, key, default)
        if piece not in index:
            raise NmtError(f"{d}: cannot import: vocab.json has no {key} {piece!r}")
        want = config.get(config_key) if config_key else None
        if isinstance(want, list):
            want = want[0] if len(want) == 1 else want
        if config_key and want != index[piece]:
            raise NmtError(f"{d}: cannot import: config.json's {config_key} is {want!r} but "
                           f"vocab.json has {piece!r} at {index[piece]}")
        out[nmt_id] = index[piece]
    if SPECIALS[BOS] in index:                    # e.g. a model nmt exported
        out[BOS] = index[SPECIALS[BOS]]
    return out


DEFAULT_NEW_TOKENS = 20     # what transformers' generate() adds when no length is configured


def _read_weights(d: Path) -> dict[str, torch.Tensor]:
    if (d / "model.safetensors").exists():
        weights = load_safetensors(d / "model.safetensors")
    elif (d / "pytorch_model.bin").exists():
        weights = load_torch_weights(d / "pytorch_model.bin")
    else:
        raise NmtError(f"{d}: no weights (model.safetensors or pytorch_model.bin)")
    # Saved from MarianModel rather than MarianMTModel: the same names without "model.".
    # Position tables keep their stored precision: a half-precision sinusoid table is
    # recognised against the computed one rounded alike (nmt.importers.hf_positions).
    named = {(k if k.startswith("model.") or k in ("lm_head.weight", "final_logits_bias")
              else f"model.{k}"): v for k, v in weights.items()}
    return {k: v if k in POSITION_KEYS.values() else v.float() for k, v in named.items()}


VOCAB_ROWS = ("model.shared.weight", "model.encoder.embed_tokens.weight",
              "model.decoder.embed_tokens.weight", "lm_head.weight", "final_logits_bias")


def _check_vocab_sizes(pieces: int, config: dict, w: dict[str, torch.Tensor], d: Path
                       ) -> int | None:
    """The model's vocabulary rows: config.json's vocab_size and the rows of every
    vocabulary-sized weight must agree (as transformers loads no model whose weights disagree
    with its configuration), and vocab.json must name no id past them. Rows it does not name
    are kept (:func:`_unnamed`)."""
    sizes = {k: int(w[k].shape[-1] if k == "final_logits_bias" else w[k].shape[0])
             for k in VOCAB_ROWS if k in w and w[k].dim() > 0}
    declared = config.get("vocab_size")
    if isinstance(declared, int) and not isinstance(declared, bool):
        sizes["config.json's vocab_size"] = declared
    if len(set(sizes.values())) > 1:
        raise NmtError(f"{d}: cannot import: the vocabulary sizes disagree ("
                       + ", ".join(f"{k} {v}" for k, v in sizes.items()) + ")")
    rows = next(iter(sizes.values()), None)
    if rows is not None and pieces > rows:
        raise NmtError(f"{d}: cannot import: vocab.json has {pieces} pieces, but the model "
                       f"has {rows} vocabulary rows")
    if rows is not None and pieces < rows:
        log.warning("%s: vocab.json names %d of the model's %d vocabulary rows; the other %d "
                    "are kept under placeholder names (<unnamed-ID>)", d, pieces, rows,
                    rows - pieces)
    return rows


def _unnamed(symbols: list[str], rows: int | None) -> list[str]:
    """Placeholder pieces for the vocabulary rows vocab.json does not name. No text encodes to
    them, but transformers' softmax runs over every row and its search may pick one, so nmt
    keeps them too: dropping them changed every probability."""
    taken = set(symbols)
    extra = [f"<unnamed-{i}>" for i in range(len(symbols), rows or 0)]
    clash = next((s for s in extra if s in taken), None)
    if clash is not None:
        raise NmtError(f"vocab.json has a piece named {clash!r}, the name nmt gives an unnamed "
                       f"row")
    return extra


def _replace(cfg: ModelConfig, **changes: Any) -> ModelConfig:
    import dataclasses
    return dataclasses.replace(cfg, **changes)


def _int(config: dict, key: str, name: str) -> int:
    v = config.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise NmtError(f"{name}: cannot import: config.json's {key} is {v!r}, not a "
                       f"positive integer")
    return v


def marian_config(config: dict, gen: dict, specials: dict[int, int], name: str) -> ModelConfig:
    """The ModelConfig of a MarianConfig (a config.json as a dict) and its generation settings;
    a one-line NmtError naming what nmt cannot represent."""
    def refuse(what: str) -> NmtError:
        return NmtError(f"{name}: cannot import: {what}")

    c = {**DEFAULTS, **config}
    if c.get("model_type") != "marian":
        raise refuse(f"model_type {c.get('model_type')!r} is not 'marian' (nmt imports Marian "
                     f"models such as OPUS-MT from this format)")
    for key, fine in LEGACY.items():
        if key in c and c[key] is not None and bool(c[key]) != fine:
            raise refuse(f"{key}={c[key]!r}: transformers' Marian has no such variant")
    size = {k: _int(c, k, name) for k in ("d_model", "encoder_layers", "decoder_layers",
                                         "encoder_attention_heads", "decoder_attention_heads",
                                         "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size",
                                         "max_position_embeddings")}
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
                 ("encoder_ffn_dim", "decoder_ffn_dim")):
        if size[a] != size[b]:
            raise refuse(f"{a}={size[a]} differs from {b}={size[b]}: nmt has one size for both")
    if size["d_model"] % size["encoder_attention_heads"]:
        raise refuse(f"d_model={size['d_model']} is not divisible by the heads")
    act = c["activation_function"]
    if act not in ACTIVATIONS:
        raise refuse(f"activation_function {act!r} (nmt has {', '.join(ACTIVATIONS)})")
    if not c["share_encoder_decoder_embeddings"]:
        raise refuse("separate encoder and decoder embeddings "
                     "(share_encoder_decoder_embeddings=false) are not supported")
    if c.get("decoder_vocab_size") not in (None, size["vocab_size"]):
        raise refuse(f"decoder_vocab_size={c['decoder_vocab_size']} differs from vocab_size")
    start = c.get("decoder_start_token_id")
    roles = {v: k for k, v in specials.items()}
    if roles.get(start) not in (PAD, EOS, BOS):
        raise refuse(f"decoder_start_token_id {start!r} is not the id of <pad>, </s> or <s>")
    return ModelConfig(
        arch="marian", encoder_layers=size["encoder_layers"],
        decoder_layers=size["decoder_layers"], d_model=size["d_model"],
        d_ff=size["encoder_ffn_dim"], heads=size["encoder_attention_heads"],
        **{k: probability(c[k], k, name)
           for k in ("dropout", "attention_dropout", "activation_dropout")},
        positional="sinusoidal",
        max_positions=size["max_position_embeddings"], pre_norm=False,
        activation=ACTIVATIONS[act], scale_embedding=bool(c["scale_embedding"]),
        sinusoid_layout="marian", output_bias=True,
        tie_output=bool(c["tie_word_embeddings"]),
        decoder_start={PAD: "pad", EOS: "eos", BOS: "bos"}[roles[start]],
        **generation_preset(gen, specials, name))


def generation_preset(gen: dict, specials: dict[int, int], name: str) -> dict[str, Any]:
    """beam, lenpen, lenpen_formula, max_len_a/b and min_len from transformers' generation
    settings (its defaults where absent); settings nmt's search cannot follow are named in a
    warning."""
    early = gen.get("early_stopping", False)
    if early not in (True, False):
        raise NmtError(f"{name}: cannot import: early_stopping={early!r} (nmt follows "
                       f"transformers' beam search with early_stopping true or false)")
    def setting(key: str, default, integer: bool):
        """A generation setting: null or absent is transformers' default."""
        v = gen.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
            raise NmtError(f"{name}: cannot import: the generation setting {key}={v!r} is not "
                           f"{'an integer' if integer else 'a number'}")
        return v

    if gen.get("max_new_tokens") is not None:
        max_len_b = setting("max_new_tokens", 0, True) - 1
    elif gen.get("max_length") is not None:
        max_len_b = setting("max_length", 20, True) - 2
    else:
        # Neither set: transformers 5 generates 20 new tokens (the forced eos among them),
        # not max_length 20 with the start symbol counted
        max_len_b = DEFAULT_NEW_TOKENS - 1
    ignored = [f"{k}={gen[k]!r}" for k, neutral in NEUTRAL_GENERATION.items()
               if gen.get(k) not in (None, neutral)]
    banned = {specials[PAD]} | ({specials[BOS]} if BOS in specials else set())
    extra = [w for w in gen.get("bad_words_ids") or [] if w not in ([b] for b in banned)]
    if extra:
        ignored.append(f"bad_words_ids {extra!r}")
    if gen.get("forced_eos_token_id", specials[EOS]) in (None, []):
        ignored.append("forced_eos_token_id=None (nmt always ends at the length limit with "
                       "</s>)")
    if ignored:
        log.warning("%s: generation settings nmt-generate does not apply: %s", name,
                    "; ".join(ignored))
    # min_length counts the decoder's start symbol, min_new_tokens does not; both apply.
    min_len = max(setting("min_length", 0, True) - 1, setting("min_new_tokens", 0, True), 0)
    return {"beam": max(1, setting("num_beams", 1, True)),
            "lenpen": float(setting("length_penalty", 1.0, False)),
            "lenpen_formula": "fairseq" if early else "hf",
            "max_len_a": 0.0, "max_len_b": max(0, max_len_b), "min_len": min_len}


def convert_weights(w: dict[str, torch.Tensor], cfg: ModelConfig, order: list[int],
                    specials: dict[int, int], name: str) -> dict[str, torch.Tensor]:
    """nmt's state dict from a MarianMTModel's (rows permuted by ``order``)."""
    used: set[str] = set()

    def take(key: str) -> torch.Tensor:
        if key not in w:
            raise NmtError(f"{name}: cannot import: the weights lack {key}")
        used.add(key)
        return w[key]

    def fused(prefix: str, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        return {part: torch.cat([take(f"{prefix}.{n}_proj.{part}") for n in names])
                for part in ("weight", "bias")}

    emb_key = next((k for k in ("model.shared.weight", "model.encoder.embed_tokens.weight",
                                "model.decoder.embed_tokens.weight") if k in w), None)
    if emb_key is None:
        raise NmtError(f"{name}: cannot import: the weights have no embedding matrix")
    embedding = take(emb_key)
    for k in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        if k in w and not torch.equal(take(k), embedding):
            raise NmtError(f"{name}: cannot import: {k} differs from {emb_key}, but the "
                           f"configuration shares one embedding matrix")
    emb = permute_rows(embedding, order)
    state = {"src_embed.weight": emb, "tgt_embed.weight": emb}
    if cfg.tie_output:
        if "lm_head.weight" in w and not torch.equal(take("lm_head.weight"), embedding):
            raise NmtError(f"{name}: cannot import: lm_head.weight differs from the "
                           f"embedding, but tie_word_embeddings is true")
    else:
        state["output_weight"] = permute_rows(take("lm_head.weight"), order)
    bias = (take("final_logits_bias") if "final_logits_bias" in w
            else torch.zeros(1, embedding.size(0))).reshape(-1)
    if BOS not in specials or bool(bias.any()):
        state["output_bias"] = permute_rows(bias, order, fill=ABSENT_LOGIT)
    for i in range(cfg.encoder_layers):
        p, q = f"model.encoder.layers.{i}", f"encoder_layers.{i}"
        state.update(_prefixed(f"{q}.self_attn.in_proj", fused(f"{p}.self_attn", "qkv")))
        state.update(_sublayers(take, p, q, (("self_attn_layer_norm", "res1.norm"),
                                             ("self_attn.out_proj", "self_attn.out_proj"),
                                             ("fc1", "ffn.fc1"), ("fc2", "ffn.fc2"),
                                             ("final_layer_norm", "res2.norm"))))
    for i in range(cfg.decoder_layers):
        p, q = f"model.decoder.layers.{i}", f"decoder_layers.{i}"
        state.update(_prefixed(f"{q}.self_attn.in_proj", fused(f"{p}.self_attn", "qkv")))
        state.update(_prefixed(f"{q}.cross_attn.kv_proj", fused(f"{p}.encoder_attn", "kv")))
        state.update(_sublayers(take, p, q, (
            ("self_attn_layer_norm", "res1.norm"), ("self_attn.out_proj", "self_attn.out_proj"),
            ("encoder_attn.q_proj", "cross_attn.q_proj"),
            ("encoder_attn.out_proj", "cross_attn.out_proj"),
            ("encoder_attn_layer_norm", "res2.norm"), ("fc1", "ffn.fc1"), ("fc2", "ffn.fc2"),
            ("final_layer_norm", "res3.norm"))))
    unused = sorted(set(w) - used)
    if unused:
        raise NmtError(f"{name}: cannot import: weights nmt has no place for: "
                       f"{', '.join(unused[:3])}{' ...' if len(unused) > 3 else ''}")
    return state


def _prefixed(prefix: str, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"{prefix}.{k}": v for k, v in parts.items()}


def _sublayers(take, src: str, dst: str, pairs) -> dict[str, torch.Tensor]:
    return {f"{dst}.{b}.{part}": take(f"{src}.{a}.{part}")
            for a, b in pairs for part in ("weight", "bias")}


__all__ = ["import_huggingface", "marian_config", "generation_preset", "convert_weights"]
