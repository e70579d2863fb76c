"""Import a fairseq (0.9-0.12) Transformer checkpoint as an nmt checkpoint that translates
exactly as fairseq does.

    ckpt = import_fairseq("checkpoint_best.pt", "data-bin", bpe_codes="bpecodes",
                          moses="en-de")
    nmt.checkpoint.save_checkpoint(ckpt, "model.pt")

What is carried over: the architecture (fairseq's args -> ModelConfig: every option either maps
to a field or is refused with one line naming it, never approximated), the weights (renamed;
the embedding and output rows permuted from fairseq's <s>,<pad>,</s>,<unk> to nmt's
<pad>,<s>,</s>,<unk>), the dictionaries, the text pipeline (Moses with fairseq's settings and
subword-nmt BPE codes, or a sentencepiece model) and fairseq's decoding defaults (beam 5,
lenpen 1.0 dividing by length, at most 200 tokens, decoding from </s>).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping

import torch

from nmt.config import ModelConfig
from nmt.data.dictionary import Dictionary
from nmt.errors import NmtError
from nmt.interop.foreign import (check_float_weights, named_errors, nmt_dictionary, refuse,
                                regular_file)
from nmt.interop.fairseq_model import (FAIRSEQ_SPECIALS, NMT_FROM_FAIRSEQ,  # noqa: F401
                                       TRANSFORMER_ARCHS, nmt_rows)
from nmt.interop.safe_pickle import load_foreign, plain
from nmt.io import check_readable, iter_lines

log = logging.getLogger("nmt.import")
WHAT = "fairseq checkpoint"


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, dict]:
    """(model args as a flat dict, state dict) of a fairseq checkpoint, read safely."""
    ckpt = plain(load_foreign(path, WHAT))
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict):
        raise NmtError(f"{path}: not a {WHAT} (no 'model' weights)")
    state = ckpt["model"]
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise NmtError(f"{path}: not a {WHAT} ('model' is not a tensor dictionary)")
    check_float_weights(state, Path(path))
    cfg = ckpt.get("cfg") if isinstance(ckpt.get("cfg"), dict) else {}
    args = cfg.get("model") or ckpt.get("args")
    if not isinstance(args, dict):
        raise NmtError(f"{path}: {WHAT} without its model arguments (no cfg.model or args)")
    args = _flatten(args)
    task = cfg.get("task") if isinstance(cfg.get("task"), dict) else {}
    for key in ("source_lang", "target_lang"):
        if args.get(key) is None and task.get(key) is not None:
            args[key] = task[key]
    args[PIPELINE] = _recorded_pipeline(cfg, ckpt.get("args"))
    return args, state


PIPELINE = "_nmt_recorded_pipeline"      # read_checkpoint's key for what _recorded_pipeline says


def _recorded_pipeline(cfg: Mapping[str, Any], legacy: Any) -> dict:
    """The text pipeline the checkpoint records, as fairseq's hub interface reads it: the
    tokenizer and bpe names (None: none recorded) and their options, from cfg.tokenizer /
    cfg.bpe (fairseq >= 0.10) or the legacy args."""
    old = legacy if isinstance(legacy, dict) else {}
    out: dict[str, Any] = {}
    for kind in ("tokenizer", "bpe"):
        section = cfg.get(kind)
        if isinstance(section, dict):
            out[kind] = section.get("_name")
            out.update({f"{kind}.{k}": v for k, v in section.items() if k != "_name"})
        else:
            out[kind] = old.get(kind)
    for key in ("moses_no_dash_splits", "moses_no_escape"):
        out.setdefault(f"tokenizer.{key}", old.get(key))
    out.setdefault("bpe.bpe_separator", old.get("bpe_separator"))
    return out


def check_pipeline(recorded: Mapping[str, Any], bpe_codes, sentencepiece, moses,
                   moses_no_dash_splits: bool, moses_no_escape: bool) -> None:
    """The text pipeline given on the command line must be the one the checkpoint records,
    where it records one (fairseq's hub interface applies that one): a one-line NmtError
    naming every option to give. A checkpoint that records none (its text was prepared
    outside fairseq) takes what it is given."""
    problems = []
    bpe, tok = recorded.get("bpe"), recorded.get("tokenizer")
    if bpe == "subword_nmt" and bpe_codes is None:
        problems.append("bpe=subword_nmt: give its codes file with --bpe-codes")
    if bpe == "sentencepiece" and sentencepiece is None:
        problems.append("bpe=sentencepiece: give its model with --sentencepiece")
    if bpe not in (None, "subword_nmt", "sentencepiece"):
        problems.append(f"bpe={bpe}, which nmt cannot apply (it reads subword-nmt codes and "
                        f"sentencepiece models)")
    separator = recorded.get("bpe.bpe_separator")
    if bpe == "subword_nmt" and separator not in (None, "@@"):
        problems.append(f"bpe_separator={separator!r}, but nmt's subword-nmt codec joins on "
                        f"'@@'")
    if tok == "moses" and moses is None:
        problems.append("tokenizer=moses: give --moses SRC-TGT")
    if tok not in (None, "moses", "space", "nltk"):
        problems.append(f"tokenizer={tok}, which nmt cannot apply (it applies Moses)")
    if tok == "moses":
        for flag, given in (("moses_no_dash_splits", moses_no_dash_splits),
                            ("moses_no_escape", moses_no_escape)):
            want = bool(recorded.get(f"tokenizer.{flag}"))
            if want != given:
                problems.append(f"{flag}={want}: {'add' if want else 'leave out'} "
                                f"--{flag.replace('_', '-')}")
    refuse("the checkpoint records", problems, sep=" ")


def _flatten(args: Mapping[str, Any]) -> dict:
    """fairseq >= 0.12's dataclass form nests encoder/decoder options ({"encoder":
    {"embed_dim": ...}}); the legacy form, what most checkpoints hold, is flat."""
    out = dict(args)
    for side in ("encoder", "decoder"):
        nested = out.pop(side, None)
        if isinstance(nested, dict):
            for k, v in nested.items():
                out.setdefault(f"{side}_{k}", v)
    return out


def load_dictionary(path: Path) -> Dictionary:
    """A fairseq dict.LANG.txt: ``symbol count [#fairseq:overwrite]`` lines after the four
    implicit specials (<s>, <pad>, </s>, <unk>), madeupword padding included, as nmt's
    Dictionary (its specials first, then the same symbols in the same order)."""
    p = regular_file(check_readable(path, "fairseq dictionary", expected="a dict.LANG.txt file"),
                     "fairseq dictionary")
    symbols, counts, overwrites = [], [], 0
    for lineno, line in enumerate(iter_lines(p), 1):
        line = line.rstrip()
        body, _, field = line.rpartition(" ")
        if field == "#fairseq:overwrite":
            body, _, field = body.rpartition(" ")
            overwrites += 1
        if not body or not field.lstrip("-").isdigit():
            raise NmtError(f"{p}: line {lineno}: expected 'symbol count', got {line[:60]!r}")
        symbols.append(body)
        counts.append(max(0, int(field)))
    # '#fairseq:overwrite' gives a symbol a second row (fairseq encodes it with the last one);
    # nmt's dictionaries have one row per symbol, so such a file cannot be mapped row for row.
    why = (f" ({overwrites} '#fairseq:overwrite' lines: a symbol with two rows, which nmt's "
           f"dictionaries cannot hold)" if overwrites else "")
    try:
        d, _ = nmt_dictionary(list(FAIRSEQ_SPECIALS) + symbols, NMT_FROM_FAIRSEQ)
    except NmtError as e:
        raise NmtError(f"{p}: {e}{why}") from None
    if len(d) != len(symbols) + 4:
        raise NmtError(f"{p}: repeats a symbol: not a dictionary nmt can map row for row{why}")
    d.set_counts(d.counts[:4] + counts)
    return d


def import_fairseq(checkpoint: str | os.PathLike, data_dir: str | os.PathLike, *,
                   bpe_codes: str | os.PathLike | None = None,
                   sentencepiece: str | os.PathLike | None = None, moses: str | None = None,
                   moses_no_dash_splits: bool = False, moses_no_escape: bool = False,
                   source_lang: str | None = None, target_lang: str | None = None) -> dict:
    """The nmt checkpoint (a dict for nmt.checkpoint.save_checkpoint) of a fairseq
    Transformer checkpoint, its dictionaries (``data_dir``/dict.LANG.txt) and its text
    pipeline: ``bpe_codes`` (subword-nmt) or ``sentencepiece`` (a model file), and ``moses``
    ("SRC-TGT", fairseq's --tokenizer moses, with its two options)."""
    from nmt.checkpoint import make_checkpoint
    from nmt.interop.fairseq_model import _Source, model_fields, nmt_state
    from nmt.models.transformer import Transformer

    if bpe_codes is not None and sentencepiece is not None:
        raise NmtError("give --bpe-codes or --sentencepiece, not both")
    args, state = read_checkpoint(checkpoint)
    check_pipeline(args.pop(PIPELINE), bpe_codes, sentencepiece, moses, moses_no_dash_splits,
                   moses_no_escape)
    cfg = ModelConfig(**model_fields(args))
    data = Path(data_dir)
    src_lang, tgt_lang = language_pair(args, data, source_lang, target_lang, moses)
    src_dict = load_dictionary(data / f"dict.{src_lang}.txt")
    tgt_dict = load_dictionary(data / f"dict.{tgt_lang}.txt")
    share_all = bool(args.get("share_all_embeddings", False))
    _check_sizes(state, src_dict, tgt_dict, share_all, data)
    _check_specials(args)
    with torch.device("meta"):
        keys = list(Transformer(cfg, len(src_dict), len(tgt_dict), share_all).state_dict())
    weights = nmt_state(_Source(state), keys, share_all)
    options = None
    if moses is not None:
        options = {"escape": not moses_no_escape,
                   "aggressive_dash_splits": not moses_no_dash_splits, "unescape": True}
    langs = _moses_pair(moses)
    src_codec = text_codec(src_dict, bpe_codes, sentencepiece, langs[0], options)
    tgt_codec = text_codec(tgt_dict, bpe_codes, sentencepiece, langs[1], options)
    log.info("imported %s: fairseq %s, %d+%d layers, d_model %d, %s, %d/%d symbols, %s%s",
             checkpoint, args.get("arch"), cfg.encoder_layers, cfg.decoder_layers, cfg.d_model,
             "pre-norm" if cfg.pre_norm else "post-norm", len(src_dict), len(tgt_dict),
             src_codec.kind, f", Moses {moses}" if moses else "")
    return make_checkpoint(model_config=cfg, model_state=weights, share_all_embeddings=share_all,
                           src_codec=src_codec, tgt_codec=tgt_codec, src_lang=src_lang,
                           tgt_lang=tgt_lang)


def language_pair(args: Mapping[str, Any], data: Path, source_lang: str | None,
                  target_lang: str | None, moses: str | None) -> tuple[str, str]:
    """The LANGs of DATA/dict.LANG.txt: each side given, else the checkpoint's (fairseq-train
    -s/-t), else what fairseq infers from DATA's file names (train.SRC-TGT.*), else --moses's
    pair."""
    given = (source_lang or None, target_lang or None)
    if all(given):
        return given
    pairs = {p.name.split(".")[1] for p in data.glob("train.*-*.*")} if data.is_dir() else set()
    if args.get("source_lang") and args.get("target_lang"):
        known = (args["source_lang"], args["target_lang"])
    elif len(pairs) == 1:
        known = tuple(pairs.pop().split("-", 1))
    elif moses is not None:
        known = _moses_pair(moses)
    else:
        raise NmtError(f"the checkpoint names no language pair and {data} does not show it: "
                       f"give --source-lang and --target-lang (the LANG of "
                       f"{data}/dict.LANG.txt)")
    return given[0] or known[0], given[1] or known[1]


def _moses_pair(moses: str | None) -> tuple[str | None, str | None]:
    if moses is None:
        return None, None
    src, sep, tgt = moses.partition("-")
    if not sep or not src or not tgt:
        raise NmtError(f"--moses takes the language pair, e.g. en-de, not '{moses}'")
    return src, tgt


def _check_sizes(state: dict, src_dict: Dictionary, tgt_dict: Dictionary, share_all: bool,
                 data: Path) -> None:
    for side, d in (("encoder", src_dict), ("decoder", tgt_dict)):
        w = state.get(f"{side}.embed_tokens.weight")
        if w is None:
            raise NmtError(f"not a fairseq transformer checkpoint: no {side}.embed_tokens")
        if w.size(0) != len(d):
            raise NmtError(f"{data}: its {side} dictionary has {len(d)} symbols (with the 4 "
                           f"specials) but the checkpoint's {side} embeddings have "
                           f"{w.size(0)} rows: not the dictionaries this model was trained with")
    if share_all and src_dict != tgt_dict:
        raise NmtError(f"{data}: the model shares all embeddings but the two dictionaries "
                       f"differ")


def _check_specials(args: Mapping[str, Any]) -> None:
    """fairseq-train's --bos/--pad/--eos/--unk may move the specials: nmt maps the defaults."""
    refuse("cannot import this fairseq model", [
        f"its dictionary puts {symbol} at {args.get(name)} (fairseq's default, which nmt maps, "
        f"is {index})"
        for (symbol, index), name in zip(FAIRSEQ_SPECIALS.items(), ("bos", "pad", "eos", "unk"))
        if args.get(name, index) != index])


def text_codec(dictionary: Dictionary, bpe_codes, sentencepiece, moses_lang: str | None,
               moses_options: dict | None):
    """The codec of one side: Moses (optional), then BPE codes, sentencepiece or nothing."""
    from nmt.data.codec import TextCodec
    from nmt.data.subword import Whitespace

    if bpe_codes is not None:
        from nmt.data.fairseq_subword import SubwordNmtBPE
        p = check_readable(bpe_codes, "BPE codes", expected="a subword-nmt codes file")
        try:
            codes = regular_file(p, "BPE codes file").read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as e:
            raise NmtError(f"{p}: not a BPE codes file ({e})") from None
        subword = named_errors(p, lambda: SubwordNmtBPE(codes, dictionary))
    elif sentencepiece is not None:
        from nmt.data.fairseq_subword import FairseqSentencePiece
        p = check_readable(sentencepiece, "sentencepiece model", expected="a .model file")
        subword = named_errors(p, lambda: FairseqSentencePiece(
            regular_file(p, "sentencepiece model").read_bytes(), dictionary))
    else:
        subword = Whitespace(dictionary)
    return TextCodec(subword, dictionary, moses_lang, moses_options)


__all__ = ["import_fairseq", "read_checkpoint", "load_dictionary", "nmt_rows",
           "TRANSFORMER_ARCHS"]
