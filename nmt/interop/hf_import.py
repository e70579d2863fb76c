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
  the tables, the table it stores (nmt.interop.hf_positions), LayerNorm epsilon 1e-5, one
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

The parameter names and MarianConfig's keys are read from the table the export writes with
(nmt.interop.marian). What nmt cannot represent exactly is refused with one line naming all of
it: another ``model_type``, separate source/target vocabularies, different encoder/decoder
head counts or FFN sizes, an activation other than the above, and the BART-era flags
transformers' Marian ignores (``normalize_before``, ``normalize_embedding``,
``add_final_layer_norm``...).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from nmt.config import ModelConfig
from nmt.errors import NmtError
from nmt.interop.foreign import (ABSENT_LOGIT, check_output, load_safetensors,
                                load_torch_weights, named_errors, nmt_dictionary, permute_rows,
                                probability_problem, read_json, refuse, regular_file)
from nmt.interop.hf_positions import KEYS as POSITION_KEYS, import_positions
from nmt.interop.marian import (CONFIG_FIELDS, EMBEDDINGS, OUTPUT, OUTPUT_BIAS, PARTS,
                                layer_modules, marian_names)
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
        # vocab.json is then the source side's alone: refused before it is read as both,
        # with whatever else the configuration has that nmt cannot represent
        refuse(f"{d}: cannot import", ["separate source and target vocabularies "
                                       "(separate_vocabs) are not supported",
                                       *_model_fields(config)[1]])
    symbols = _read_vocab(d / "vocab.json")
    specials = _special_ids(symbols, config, tok, d)
    # transformers reads generation_config.json alone when it is there, else config.json's keys
    gen_path = d / "generation_config.json"
    settings = (read_json(gen_path, "generation configuration") if gen_path.exists()
                else _generation_keys(config))
    cfg = model_config(config, settings, specials, str(d))
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
    # recognised against the computed one rounded alike (nmt.interop.hf_positions).
    named = {(k if k.startswith("model.") or k in (OUTPUT, OUTPUT_BIAS) else f"model.{k}"): v
             for k, v in weights.items()}
    return {k: v if k in POSITION_KEYS.values() else v.float() for k, v in named.items()}


VOCAB_ROWS = (*EMBEDDINGS, OUTPUT, OUTPUT_BIAS)


def _check_vocab_sizes(pieces: int, config: dict, w: dict[str, torch.Tensor], d: Path
                       ) -> int | None:
    """The model's vocabulary rows: config.json's vocab_size and the rows of every
    vocabulary-sized weight must agree (as transformers loads no model whose weights disagree
    with its configuration), and vocab.json must name no id past them. Rows it does not name
    are kept (:func:`_unnamed`)."""
    sizes = {k: int(w[k].shape[-1] if k == OUTPUT_BIAS else w[k].shape[0])
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


def model_config(config: dict, gen: dict, specials: dict[int, int], name: str) -> ModelConfig:
    """The ModelConfig of a MarianConfig (a config.json as a dict) and its generation settings;
    a one-line NmtError naming everything nmt cannot represent."""
    fields, problems = _model_fields(config)
    c = {**DEFAULTS, **config}
    start = c.get("decoder_start_token_id")
    roles = {v: k for k, v in specials.items()}
    if roles.get(start) not in (PAD, EOS, BOS):
        problems.append(f"decoder_start_token_id {start!r} is not the id of <pad>, </s> or <s>")
    preset = _generation_preset(gen, specials, name, problems)
    refuse(f"{name}: cannot import", problems)
    return ModelConfig(
        arch="marian", **fields, positional="sinusoidal", pre_norm=False,
        sinusoid_layout="marian", output_bias=True, tie_output=bool(c["tie_word_embeddings"]),
        decoder_start={PAD: "pad", EOS: "eos", BOS: "bos"}[roles[start]], **preset)


def _model_fields(config: dict) -> tuple[dict[str, Any], list[str]]:
    """(ModelConfig fields, what nmt cannot represent) of a MarianConfig's model: its keys
    read through nmt.interop.marian.CONFIG_FIELDS, the flags checked."""
    c = {**DEFAULTS, **config}
    problems = []
    if c.get("model_type") != "marian":
        problems.append(f"model_type {c.get('model_type')!r} is not 'marian' (nmt imports "
                        f"Marian models such as OPUS-MT from this format)")
    for key, fine in LEGACY.items():
        if key in c and c[key] is not None and bool(c[key]) != fine:
            problems.append(f"{key}={c[key]!r}: transformers' Marian has no such variant")
    fields: dict[str, Any] = {}
    first: dict[str, str] = {}          # field -> the key it was read from
    for key, field in (*CONFIG_FIELDS, ("vocab_size", "vocab_size")):   # the last: checked only
        value, problem = _config_value(key, field, c.get(key))
        if problem:
            problems.append(problem)
        elif field not in fields:
            fields[field], first[field] = value, key
        elif fields[field] != value:
            problems.append(f"{first[field]}={fields[field]} differs from {key}={value}: nmt "
                            f"has one size for both")
    vocab_size = fields.pop("vocab_size", None)
    if fields.get("heads") and fields.get("d_model") and fields["d_model"] % fields["heads"]:
        problems.append(f"d_model={fields['d_model']} is not divisible by the heads")
    if not c["share_encoder_decoder_embeddings"]:
        problems.append("separate encoder and decoder embeddings "
                        "(share_encoder_decoder_embeddings=false) are not supported")
    if vocab_size and c.get("decoder_vocab_size") not in (None, vocab_size):
        problems.append(f"decoder_vocab_size={c['decoder_vocab_size']} differs from vocab_size")
    return fields, problems


PROBABILITIES = ("dropout", "attention_dropout", "activation_dropout")


def _config_value(key: str, field: str, value: Any) -> tuple[Any, str | None]:
    """(ModelConfig's value, None) of config.json's ``key`` holding ``field``, or (None, why
    nmt cannot take it)."""
    if field in PROBABILITIES:
        problem = probability_problem(value, key)
        return (None, problem) if problem else (float(value), None)
    if field == "activation":
        if isinstance(value, str) and value in ACTIVATIONS:
            return ACTIVATIONS[value], None
        return None, f"activation_function {value!r} (nmt has {', '.join(ACTIVATIONS)})"
    if field == "scale_embedding":
        return bool(value), None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return None, f"config.json's {key} is {value!r}, not a positive integer"
    return value, None


def generation_preset(gen: dict, specials: dict[int, int], name: str) -> dict[str, Any]:
    """beam, lenpen, lenpen_formula, max_len_a/b and min_len from transformers' generation
    settings (its defaults where absent); settings nmt's search cannot follow are named in a
    warning, settings it cannot read in a one-line NmtError."""
    problems: list[str] = []
    preset = _generation_preset(gen, specials, name, problems)
    refuse(f"{name}: cannot import", problems)
    return preset


def _generation_preset(gen: dict, specials: dict[int, int], name: str, problems: list[str]
                       ) -> dict[str, Any]:
    """generation_preset's work; what it cannot read is added to ``problems`` (its default
    taken instead), and the warning left out when there is any."""
    early = gen.get("early_stopping", False)
    if early not in (True, False):
        problems.append(f"early_stopping={early!r} (nmt follows transformers' beam search "
                        f"with early_stopping true or false)")

    def setting(key: str, default, integer: bool):
        """A generation setting: null or absent is transformers' default."""
        v = gen.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
            problems.append(f"the generation setting {key}={v!r} is not "
                            f"{'an integer' if integer else 'a number'}")
            return default
        return v

    if gen.get("max_new_tokens") is not None:
        max_len_b = setting("max_new_tokens", DEFAULT_NEW_TOKENS, True) - 1
    elif gen.get("max_length") is not None:
        max_len_b = setting("max_length", 20, True) - 2
    else:
        # Neither set: transformers 5 generates 20 new tokens (the forced eos among them),
        # not max_length 20 with the start symbol counted
        max_len_b = DEFAULT_NEW_TOKENS - 1
    # min_length counts the decoder's start symbol, min_new_tokens does not; both apply.
    min_len = max(setting("min_length", 0, True) - 1, setting("min_new_tokens", 0, True), 0)
    preset = {"beam": max(1, setting("num_beams", 1, True)),
              "lenpen": float(setting("length_penalty", 1.0, False)),
              "lenpen_formula": "fairseq" if early else "hf",
              "max_len_a": 0.0, "max_len_b": max(0, max_len_b), "min_len": min_len}
    if not problems:
        _warn_ignored(gen, specials, name)
    return preset


def _warn_ignored(gen: dict, specials: dict[int, int], name: str) -> None:
    """A warning naming the generation settings nmt's search has no equivalent of."""
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


def convert_weights(w: dict[str, torch.Tensor], cfg: ModelConfig, order: list[int],
                    specials: dict[int, int], name: str) -> dict[str, torch.Tensor]:
    """nmt's state dict from a MarianMTModel's (rows permuted by ``order``)."""
    used: set[str] = set()

    def take(key: str) -> torch.Tensor:
        if key not in w:
            raise NmtError(f"{name}: cannot import: the weights lack {key}")
        used.add(key)
        return w[key]

    emb_key = next((k for k in EMBEDDINGS if k in w), None)
    if emb_key is None:
        raise NmtError(f"{name}: cannot import: the weights have no embedding matrix")
    embedding = take(emb_key)
    for k in EMBEDDINGS[1:]:
        if k in w and not torch.equal(take(k), embedding):
            raise NmtError(f"{name}: cannot import: {k} differs from {emb_key}, but the "
                           f"configuration shares one embedding matrix")
    emb = permute_rows(embedding, order)
    state = {"src_embed.weight": emb, "tgt_embed.weight": emb}
    if cfg.tie_output:
        if OUTPUT in w and not torch.equal(take(OUTPUT), embedding):
            raise NmtError(f"{name}: cannot import: {OUTPUT} differs from the embedding, but "
                           f"tie_word_embeddings is true")
    else:
        state["output_weight"] = permute_rows(take(OUTPUT), order)
    bias = (take(OUTPUT_BIAS) if OUTPUT_BIAS in w
            else torch.zeros(1, embedding.size(0))).reshape(-1)
    if BOS not in specials or bool(bias.any()):
        state["output_bias"] = permute_rows(bias, order, fill=ABSENT_LOGIT)
    for marian, nmt, fused in layer_modules(cfg):
        for part in PARTS:
            parts = [take(k) for k in marian_names(marian, fused, part)]
            state[f"{nmt}.{part}"] = parts[0] if len(parts) == 1 else torch.cat(parts)
    unused = sorted(set(w) - used)
    if unused:
        raise NmtError(f"{name}: cannot import: weights nmt has no place for: "
                       f"{', '.join(unused[:3])}{' ...' if len(unused) > 3 else ''}")
    return state


__all__ = ["import_huggingface", "model_config", "generation_preset", "convert_weights"]
