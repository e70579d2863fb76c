"""Export a checkpoint for another inference engine: CTranslate2 (``nmt-export``; its entry
point, export_model, hands ``format="huggingface"`` to nmt.interop.hf_export).

    export_model("checkpoint_best.pt", "ende-ct2", format="ctranslate2", quantization="int8")

writes a CTranslate2 model directory that translates as nmt does, without nmt::

    OUT/model.bin, config.json          the weights and settings, CTranslate2's format
    OUT/shared_vocabulary.json          (or source_/target_vocabulary.json) nmt's dictionaries,
                                        id for id, the specials <pad> <s> </s> <unk> at 0-3
    OUT/source.spm, target.spm          the sentencepiece models (subword bpe), or
    OUT/source.wordpiece.json, ...      the wordpiece tokenizers (subword wordpiece)
    OUT/translate.py                    translates as nmt-generate does (python translate.py)
    OUT/nmt_export.json                 what was exported and how nmt decodes it
    OUT/README.txt                      how to tokenize, translate and detokenize

How nmt's Transformer maps onto CTranslate2's ``TransformerSpec``:

- post-norm (the paper's) or pre-norm layers with LayerNorm epsilon ``layer_norm_eps``; ReLU,
  exact (erf) GELU or swish; biases on every linear layer; the fused query/key/value (self-attention)
  and key/value (encoder-decoder attention) projections are CTranslate2's layout already;
- embeddings scaled by sqrt(d_model) or not (CTranslate2's ``scale_embeddings``), optionally
  layer-normalized (``layernorm_embedding``); the output projection tied to the target
  embedding (CTranslate2 stores a shared matrix once) or its own matrix (``tie_output`` off);
- positions: nmt's sinusoids interleave sin/cos (eq. 4) from position 0 (imported models' use
  other layouts and offsets), CTranslate2's built-in ones are concatenated halves from position
  1 with another frequency spacing, so the table is written out explicitly
  (``position_encodings/encodings``), as are learned positions;
- every source gets ``</s>`` appended (``add_source_eos``), decoding starts from the model's
  start symbol (``<s>``; ``</s>`` or ``<pad>`` for imported models);
- nmt never predicts ``<pad>`` or ``<s>``: the output projection gets a bias of -1e4 on those
  two ids (0 elsewhere, or the model's own output bias), so CTranslate2 never predicts them
  either.

What a model directory cannot carry is decoding: the GNMT length penalty, the length limit
a * source length + b and nmt's handling of them. README.txt gives the CTranslate2 settings:
greedy decoding gives nmt's output token for token; beam search comes close (see there).

Models that CTranslate2 cannot run as nmt does are refused with a one-line NmtError naming
all of it: keys and values of different sizes per head (d_k != d_v), linearized-tree target
vocabularies, which nmt decodes under tree constraints (nmt.search.constraints), and text
pipelines that README.txt and translate.py do not write out (an imported fairseq model's).

ctranslate2 is an optional dependency (``pip install 'nmt[export]'``), imported here only.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import string
from pathlib import Path
from typing import Any

from nmt.errors import NmtError, UsageError
from nmt.interop.foreign import refuse
from nmt.io import check_readable, install_directory, temporary_directory_beside
from nmt.specials import BOS, EOS, PAD, SPECIALS, UNK

log = logging.getLogger("nmt.export")

FORMATS = ("ctranslate2", "huggingface")   # the second: nmt.interop.hf_export
# CTranslate2's weight types: float32 (exact), int8 (8-bit weights with per-row scales; the
# other weights keep their type, float32 here) and int8_float32 (the others made float32).
QUANTIZATIONS = ("float32", "int8_float32", "int8")
INSTALL_HINT = "pip install 'nmt[export]'"
# Added to the logits of <pad> and <s>: nmt's search never picks them.
FORBIDDEN_BIAS = -1e4
# The longest source nmt translates (BatchConfig.max_source_len, in subwords, without eos).
MAX_SOURCE_LEN = 1024
SUBWORD_FILES = {"bpe": "spm", "wordpiece": "wordpiece.json"}


def export_model(checkpoint: str | os.PathLike | dict, out: str | os.PathLike, *,
                 format: str = "ctranslate2", quantization: str = "float32",
                 force: bool = False) -> Path:
    """Export ``checkpoint`` (a path or a dict from nmt.checkpoint.load_checkpoint) to the model
    directory ``out``, built beside it under a temporary name and renamed when complete.
    ``force`` replaces a non-empty ``out``. Returns the absolute path of ``out``."""
    if format not in FORMATS:
        raise UsageError(f"unknown export format '{format}'; expected one of {', '.join(FORMATS)}")
    if quantization not in QUANTIZATIONS:
        raise UsageError(f"unknown quantization '{quantization}'; expected one of "
                         f"{', '.join(QUANTIZATIONS)}")
    from nmt.checkpoint import (checkpoint_task, codecs_from_checkpoint, inference_checkpoint,
                                load_checkpoint, load_model_from_checkpoint)

    # The cheap checks first: the checkpoint file, the destination, then ctranslate2.
    name = "checkpoint" if isinstance(checkpoint, dict) else str(checkpoint)
    if not isinstance(checkpoint, dict):
        check_readable(checkpoint, "checkpoint", expected="a checkpoint file")
    dest = _check_destination(out, force, None if isinstance(checkpoint, dict) else checkpoint)
    if format == "huggingface":
        if quantization != "float32":
            raise UsageError("--quantization goes with --format ctranslate2 (a huggingface "
                             "export holds float32 weights)")
        from nmt.interop.hf_export import export_huggingface

        ckpt = (checkpoint if isinstance(checkpoint, dict)
                else load_checkpoint(checkpoint, mmap=True))
        return export_huggingface(inference_checkpoint(ckpt), dest, name)
    ct2 = import_ctranslate2()
    ckpt = (checkpoint if isinstance(checkpoint, dict)
            else load_checkpoint(checkpoint, mmap=True))
    # Without the optimizer state of a training checkpoint: it would only take memory.
    model, ckpt = load_model_from_checkpoint(inference_checkpoint(ckpt))
    src_codec, tgt_codec = codecs_from_checkpoint(ckpt, name)
    check_exportable(model.cfg, src_codec, tgt_codec, name, checkpoint_task(ckpt, name).name)

    spec = ctranslate2_spec(ct2, model, src_codec.dictionary.symbols,
                            tgt_codec.dictionary.symbols)
    try:
        spec.validate()
        spec.optimize(quantization=quantization)
    except (ValueError, TypeError) as e:
        raise NmtError(f"{name}: CTranslate2 refused the model: {' '.join(str(e).split())}"
                       ) from None
    info = export_info(ckpt, model, src_codec, tgt_codec, quantization, ct2.__version__,
                       None if isinstance(checkpoint, dict) else str(checkpoint))
    tmp = temporary_directory_beside(dest, "model directory")
    try:
        spec.save(str(tmp))
        for side, codec in (("source", src_codec), ("target", tgt_codec)):
            if codec.kind in SUBWORD_FILES:
                codec.subword.save(tmp / f"{side}.{SUBWORD_FILES[codec.kind]}")
        (tmp / "nmt_export.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        (tmp / "translate.py").write_text(python_snippet(info) + "\n", encoding="utf-8")
        (tmp / "README.txt").write_text(readme(info), encoding="utf-8")
        install_directory(tmp, dest, "model directory", fsync_files=True)
    except OSError as e:
        raise NmtError(f"{dest}: cannot write the model directory "
                       f"({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(f.stat().st_size for f in dest.iterdir() if f.is_file())
    log.info("exported %s to %s: CTranslate2 %s, %s weights, %.1f MB", name, dest,
             ct2.__version__, quantization, size / 1e6)
    return dest


def import_ctranslate2():
    """The ctranslate2 module, or a one-line NmtError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise NmtError(f"exporting to CTranslate2 needs the ctranslate2 package: "
                       f"{INSTALL_HINT}") from None
    major = str(getattr(ctranslate2, "__version__", "0")).split(".")[0]
    if major != "4":
        raise NmtError(f"exporting to CTranslate2 needs ctranslate2 4.x, found "
                       f"{ctranslate2.__version__}: {INSTALL_HINT}")
    return ctranslate2


def check_exportable(cfg, src_codec, tgt_codec, name: str = "checkpoint",
                     task: str | None = None) -> None:
    """One-line NmtError naming everything that keeps CTranslate2 from translating as nmt
    does. ``task``: the checkpoint's (nmt.tasks.task); None: inferred from the target
    vocabulary."""
    from nmt.tasks.task import get_task, infer_task

    problems = []
    if cfg.head_dim_k != cfg.head_dim_v:
        problems.append(f"its attention has keys of {cfg.head_dim_k} and values of "
                        f"{cfg.head_dim_v} dimensions per head, CTranslate2 needs one size "
                        f"for both")
    if (get_task(task) if task else infer_task(tgt_codec.dictionary)).name == "parsing":
        problems.append("it is a parsing model, whose outputs nmt decodes under tree "
                        "constraints that CTranslate2 cannot apply")
    undescribed = pipeline_not_described(src_codec, tgt_codec)
    if undescribed:
        problems.append(f"nmt-export does not write out the text pipeline of {undescribed} "
                        f"yet: translate it with nmt-generate")
    refuse(f"{name}: cannot export to CTranslate2", problems)


def pipeline_not_described(src_codec, tgt_codec) -> str:
    """The sides whose text pipeline README.txt and translate.py do not write out (an imported
    fairseq model's BPE codes or Moses settings), named with what is missing; "" for none.
    The export would translate, but the instructions beside it would tokenize differently
    from nmt-generate."""
    sides = []
    for side, codec in (("source", src_codec), ("target", tgt_codec)):
        what = ([f"{codec.kind} subwords"] if codec.kind in ("subword_nmt",
                                                             "fairseq_sentencepiece") else []
                ) + (["fairseq's Moses settings"] if codec.moses_options else [])
        if what:
            sides.append(f"its {side} ({' and '.join(what)})")
    return " and ".join(sides)


def position_rows(cfg) -> int:
    """Rows of the position table: the learned ones, or as many sinusoids as nmt's longest
    source (MAX_SOURCE_LEN + eos) or output (bos + max_len) needs with the preset's
    max_len_a/max_len_b, and at least max_positions."""
    if cfg.positional == "learned":
        return cfg.max_positions
    longest_output = math.floor(cfg.max_len_a * MAX_SOURCE_LEN + cfg.max_len_b) + 1
    return max(cfg.max_positions, MAX_SOURCE_LEN + 1, longest_output)


def ctranslate2_spec(ct2, model, src_symbols: list[str], tgt_symbols: list[str]):
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights (float32) and the
    vocabularies ``src_symbols``/``tgt_symbols`` (id order, specials included)."""
    import torch

    from nmt.models.layers import sinusoid_table

    specs = ct2.specs
    cfg = model.cfg
    activation = {"relu": specs.Activation.RELU, "gelu": specs.Activation.GELU,
                  "swish": specs.Activation.SWISH}[cfg.activation]
    head_dim = cfg.head_dim_k
    extra: dict[str, Any] = {"layernorm_embedding": cfg.layernorm_embedding}
    if head_dim * cfg.heads != cfg.d_model:
        extra["head_dim"] = head_dim
    encoder = specs.TransformerEncoderSpec(cfg.encoder_layers, cfg.heads, pre_norm=cfg.pre_norm,
                                           activation=activation, **extra)
    decoder = specs.TransformerDecoderSpec(cfg.decoder_layers, cfg.heads, pre_norm=cfg.pre_norm,
                                           activation=activation, **extra)
    spec = specs.TransformerSpec(encoder, decoder)
    arr = _Arrays()
    linear, norm = arr.linear, arr.norm

    if cfg.positional == "learned":
        # CTranslate2 reads row p for position p: the rows before position_offset are unused.
        src_pos = arr(model.src_pos.weight)[cfg.position_offset:]
        tgt_pos = arr(model.tgt_pos.weight)[cfg.position_offset:]
    else:
        src_pos = tgt_pos = sinusoid_table(position_rows(cfg), cfg.d_model, cfg.position_offset,
                                           cfg.sinusoid_layout).numpy()

    encoder.embeddings[0].weight = arr(model.src_embed.weight)
    encoder.scale_embeddings = cfg.scale_embedding   # sqrt(d_model), as nmt
    encoder.position_encodings.encodings = src_pos
    if cfg.layernorm_embedding:
        norm(encoder.layernorm_embedding, model.src_embed_norm)
    for s, layer in zip(encoder.layer, model.encoder_layers):
        arr.self_attention_and_ffn(s, layer, layer.res2.norm)
    if cfg.pre_norm:
        norm(encoder.layer_norm, model.encoder_norm)

    decoder.embeddings.weight = arr(model.tgt_embed.weight)
    decoder.scale_embeddings = cfg.scale_embedding
    decoder.position_encodings.encodings = tgt_pos
    if cfg.layernorm_embedding:
        norm(decoder.layernorm_embedding, model.tgt_embed_norm)
    for s, layer in zip(decoder.layer, model.decoder_layers):
        arr.self_attention_and_ffn(s, layer, layer.res3.norm)
        linear(s.attention.linear[0], layer.cross_attn.q_proj)
        linear(s.attention.linear[1], layer.cross_attn.kv_proj)           # [k; v]
        linear(s.attention.linear[2], layer.cross_attn.out_proj)
        norm(s.attention.layer_norm, layer.res2.norm)
    if cfg.pre_norm:
        norm(decoder.layer_norm, model.decoder_norm)
    decoder.projection.weight = arr(model.projection_weight)       # tied unless tie_output off
    bias = torch.zeros(len(tgt_symbols), dtype=torch.float32)
    if model.output_bias is not None:
        bias += model.output_bias.detach().float().cpu()
    bias[[PAD, BOS]] = FORBIDDEN_BIAS
    decoder.projection.bias = bias.numpy()

    spec.config.layer_norm_epsilon = float(cfg.layer_norm_eps)
    spec.config.add_source_eos = True                # nmt's encoder reads ids + [</s>]
    spec.config.add_source_bos = False
    spec.config.bos_token, spec.config.eos_token, spec.config.unk_token = (
        SPECIALS[BOS], SPECIALS[EOS], SPECIALS[UNK])
    spec.config.decoder_start_token = SPECIALS[cfg.start_id]
    spec.register_source_vocabulary(list(src_symbols))
    spec.register_target_vocabulary(list(tgt_symbols))
    return spec


class _Arrays:
    """The float32 numpy arrays of a model's tensors that a CTranslate2 spec holds, and the
    copying of nmt's layers into the spec's."""

    def __init__(self):
        self._copies: dict[int, Any] = {}

    def __call__(self, t):
        import torch

        # One float32 copy per tensor: a shared embedding is one array, which CTranslate2
        # stores once; a copy, because quantizing works on the arrays in place.
        if id(t) not in self._copies:
            self._copies[id(t)] = t.detach().to("cpu", torch.float32).contiguous().numpy().copy()
        return self._copies[id(t)]

    def linear(self, s, layer) -> None:
        s.weight = self(layer.weight)
        s.bias = self(layer.bias)

    def norm(self, s, layer) -> None:
        s.gamma = self(layer.weight)
        s.beta = self(layer.bias)

    def self_attention_and_ffn(self, s, layer, ffn_norm) -> None:
        self.linear(s.self_attention.linear[0], layer.self_attn.in_proj)      # [q; k; v]
        self.linear(s.self_attention.linear[1], layer.self_attn.out_proj)
        self.norm(s.self_attention.layer_norm, layer.res1.norm)
        self.linear(s.ffn.linear_0, layer.ffn.fc1)
        self.linear(s.ffn.linear_1, layer.ffn.fc2)
        self.norm(s.ffn.layer_norm, ffn_norm)


def export_info(ckpt: dict, model, src_codec, tgt_codec, quantization: str, ct2_version: str,
                checkpoint_path: str | None) -> dict:
    """What nmt_export.json records: the model, its text pipeline, nmt's decoding settings."""
    from nmt.version import __version__

    cfg = model.cfg
    learned = cfg.positional == "learned"
    max_source = min(MAX_SOURCE_LEN, cfg.max_positions - 1) if learned else MAX_SOURCE_LEN
    joined = src_codec.dictionary.symbols == tgt_codec.dictionary.symbols   # one file

    def side(codec, name: str) -> dict:
        kind = codec.kind
        return {"subword": kind,
                "subword_file": f"{name}.{SUBWORD_FILES[kind]}" if kind in SUBWORD_FILES else None,
                "moses_lang": codec.moses_lang, "vocab_size": len(codec.dictionary),
                # an imported OPUS-MT model: MarianTokenizer's rules (nmt.data.subword)
                **({"marian": True} if codec.subword.to_state().get("lookup") else {})}

    return {
        "format": "ctranslate2",
        "ctranslate2_version": ct2_version,
        "nmt_version": __version__,
        "checkpoint": None if checkpoint_path is None else str(Path(checkpoint_path).absolute()),
        "src_lang": ckpt.get("src_lang"), "tgt_lang": ckpt.get("tgt_lang"),
        "arch": cfg.arch, "quantization": quantization,
        "joined_vocabulary": joined,
        "source": side(src_codec, "source"), "target": side(tgt_codec, "target"),
        "specials": {s: i for i, s in enumerate(SPECIALS)},
        "decoding": {"beam": cfg.beam, "lenpen": cfg.lenpen,
                     "lenpen_formula": cfg.lenpen_formula, "max_len_a": cfg.max_len_a,
                     "max_len_b": cfg.max_len_b, "min_len": cfg.min_len,
                     "max_source_len": max_source,
                     # CTranslate2's max_decoding_length may not exceed it: nmt's own cap
                     # with learned positions, the position table's rows with sinusoids.
                     "max_output_len": (cfg.max_positions - 1) if learned else position_rows(cfg)},
        "positions": {"kind": cfg.positional, "rows": position_rows(cfg)},
    }


def _check_destination(out: str | os.PathLike, force: bool,
                       checkpoint: str | os.PathLike | None = None) -> Path:
    dest = Path(out).expanduser().absolute()
    if checkpoint is not None and dest.resolve() in Path(checkpoint).resolve().parents:
        raise NmtError(f"{dest}: holds the checkpoint {checkpoint}, which writing the model "
                       f"there would delete; give another directory")
    if dest.exists():
        if not dest.is_dir():
            raise NmtError(f"{dest}: exists and is not a directory")
        if any(dest.iterdir()) and not force:
            raise NmtError(f"{dest}: exists and is not empty (use --overwrite to replace it)")
        if any(dest.iterdir()) and not _is_export(dest):
            raise NmtError(f"{dest}: is not a model directory nmt-export wrote (no "
                           f"nmt_export.json, nor a config.json with nmt's mark), and --overwrite "
                           f"replaces only one; give another directory, or remove it yourself")
        if dest.resolve() in (Path.cwd().resolve(), *Path.cwd().resolve().parents):
            raise NmtError(f"{dest}: is the current directory or one above it, which --overwrite "
                           f"would replace; give another directory")
    return dest


def _is_export(d: Path) -> bool:
    """A directory nmt-export wrote: CTranslate2's (nmt_export.json) or a Marian one (its
    config.json carries nmt's own key; a Marian model downloaded from the Hub has none, and
    --overwrite must not delete it)."""
    from nmt.interop.hf_export import is_hf_export

    return (d / "nmt_export.json").is_file() or is_hf_export(d)


# --- README.txt and translate.py: templates in nmt/resources/export ---------------------------

SNIPPET_BEGIN = "# --- translate.py ---"
SNIPPET_END = "# --- end of translate.py ---"
TEMPLATES = Path(__file__).resolve().parents[1] / "resources" / "export"


def _template(name: str, **values: Any) -> str:
    """The template file ``name`` with its ``$names`` replaced by ``values``."""
    text = (TEMPLATES / name).read_text(encoding="utf-8")
    return string.Template(text).substitute({k: str(v) for k, v in values.items()})


# translate.py's rescoring of CTranslate2's n-best list: nmt's GNMT penalty, or |Y|^alpha (the
# fairseq and hf formulas; |Y| counts the </s>).
SNIPPET_SCORES = {
    True: "    return log_prob / ((5 + len(pieces) + 1) / 6) ** ALPHA  "
          "# nmt's: log P / ((5 + |Y|) / 6)^alpha, |Y| with </s>",
    False: "    return log_prob / (len(pieces) + 1) ** ALPHA  "
           "# this model's: log P / |Y|^alpha, |Y| with </s>"}


def python_snippet(info: dict) -> str:
    """translate.py: a Python program, in the exported directory, whose ``translate(lines)``
    does what nmt-generate does with the exported model (and ``python translate.py < in``
    translates stdin). Every value taken from the checkpoint enters the program as a Python
    literal (``repr`` of a checked int, float or str), never as pasted source text."""
    dec = info["decoding"]
    imports, setup, to_pieces, from_pieces = _snippet_pipeline(info["source"], info["target"])
    text = _template("translate.py.tmpl", snippet_begin=SNIPPET_BEGIN, snippet_end=SNIPPET_END,
                     extra_imports="".join("\n" + line for line in imports),
                     beam=_int_literal(dec["beam"], "beam"),
                     alpha=_float_literal(dec["lenpen"], "lenpen"),
                     max_len_a=_float_literal(dec["max_len_a"], "max_len_a"),
                     max_len_b=_int_literal(dec["max_len_b"], "max_len_b"),
                     min_len=_int_literal(dec.get("min_len", 0), "min_len"),
                     max_source_len=_int_literal(dec["max_source_len"], "max_source_len"),
                     max_output_len=_int_literal(dec["max_output_len"], "max_output_len"),
                     setup="\n".join(setup), to_pieces="\n".join(to_pieces),
                     from_pieces="\n".join(from_pieces),
                     score=SNIPPET_SCORES[dec.get("lenpen_formula", "gnmt") == "gnmt"])
    return text[:-1] if text.endswith("\n") else text       # the README places it in its text


def _int_literal(value: Any, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise NmtError(f"the checkpoint's {what} is {value!r}, not an integer")
    return repr(int(value))


def _float_literal(value: Any, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise NmtError(f"the checkpoint's {what} is {value!r}, not a finite number")
    return repr(value)


def _str_literal(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise NmtError(f"the checkpoint's {what} is {value!r}, not a string")
    return repr(value)


def _snippet_pipeline(src: dict, tgt: dict) -> tuple[list[str], ...]:
    """translate.py's text pipeline as lines of code: (imports beyond ctranslate2's, set-up,
    the body of to_pieces(line), the body of from_pieces(pieces))."""
    imports: list[str] = []
    setup: list[str] = []
    to_pieces: list[str] = []
    from_pieces: list[str] = []
    if src["moses_lang"] or tgt["moses_lang"]:
        imports.append("from sacremoses import MosesDetokenizer, MosesTokenizer")
    if "bpe" in (src["subword"], tgt["subword"]):
        imports.append("import sentencepiece as spm")
    if src["subword"] == "wordpiece":          # (the target side needs no tokenizer)
        imports.append("from tokenizers import Tokenizer")
    if src["moses_lang"]:
        setup.append("src_moses = MosesTokenizer(lang="
                     f"{_str_literal(src['moses_lang'], 'source Moses language')})")
        to_pieces.append('    line = src_moses.tokenize(line, escape=False, '
                         'aggressive_dash_splits=False,\n'
                         '                              return_str=True)')
    if src["subword"] == "bpe":
        setup.append(f'src_sp = spm.SentencePieceProcessor(model_file=os.path.join(MODEL_DIR, '
                     f'{_str_literal(src["subword_file"], "source subword file")}))')
        if src.get("marian"):       # MarianTokenizer: a leading >>xx<< code is one piece
            to_pieces.append('    code = []\n'
                             '    if line.startswith(">>") and "<<" in line:\n'
                             '        end = line.index("<<") + 2\n'
                             '        code, line = [line[:end]], line[end:]\n'
                             '    return code + src_sp.encode(line, out_type=str)')
        else:
            to_pieces.append("    return src_sp.encode(line, out_type=str)")
    elif src["subword"] == "wordpiece":
        setup.append(f'src_wp = Tokenizer.from_file(os.path.join(MODEL_DIR, '
                     f'{_str_literal(src["subword_file"], "source subword file")}))')
        setup.append('src_wp.encode_special_tokens = True   # "</s>" in a text is text')
        to_pieces.append("    return src_wp.encode(line, add_special_tokens=False).tokens")
    else:
        to_pieces.append('    # the special symbols written in a text are unknown words to nmt\n'
                         '    return [t if t not in SPECIALS else "<unk>" for t in line.split()]')
        setup.append('SPECIALS = {"<pad>", "<s>", "</s>", "<unk>"}')
    if tgt["subword"] == "bpe":
        setup.append(f'tgt_sp = spm.SentencePieceProcessor(model_file=os.path.join(MODEL_DIR, '
                     f'{_str_literal(tgt["subword_file"], "target subword file")}))')
        if tgt.get("marian"):       # MarianTokenizer: <unk> dropped, '\u2581' left as spaces
            from_pieces.append('    text = tgt_sp.decode([p for p in pieces if p != "<unk>"])'
                               '.replace("\\u2581", " ").strip()')
        else:
            from_pieces.append("    text = tgt_sp.decode(pieces)")
    elif tgt["subword"] == "wordpiece":
        from_pieces.append('    words = []                            # "##" pieces glue onto '
                           'the previous one\n'
                           '    for p in pieces:\n'
                           '        if p.startswith("##") and words:\n'
                           '            words[-1] += p[2:]\n'
                           '        else:\n'
                           '            words.append(p[2:] if p.startswith("##") else p)\n'
                           '    text = " ".join(words)')
    else:
        from_pieces.append('    text = " ".join(pieces)')
    if tgt["moses_lang"]:
        setup.append("tgt_moses = MosesDetokenizer(lang="
                     f"{_str_literal(tgt['moses_lang'], 'target Moses language')})")
        from_pieces.append("    return tgt_moses.detokenize(text.split(), unescape=False)")
    else:
        from_pieces.append("    return text")
    return imports, setup, to_pieces, from_pieces


def readme(info: dict) -> str:
    """README.txt of an exported model directory: tokenize, translate, detokenize. Its
    measured figures (how often CTranslate2 gives nmt's translation) are not the exporter's to
    know: the text points to BENCHMARKS.md."""
    src, tgt, dec = info["source"], info["target"], info["decoding"]
    pkgs = ['"ctranslate2>=4,<5"']
    kinds = {src["subword"], tgt["subword"]}
    if "bpe" in kinds:
        pkgs.append("sentencepiece")
    if "wordpiece" in kinds:
        pkgs.append("tokenizers")
    if src["moses_lang"] or tgt["moses_lang"]:
        pkgs.append("sacremoses")
    return _template("README.txt.tmpl", nmt_version=info["nmt_version"],
                     checkpoint=info["checkpoint"] or "a checkpoint", arch=info["arch"],
                     src_lang=info["src_lang"], tgt_lang=info["tgt_lang"],
                     quantization=info["quantization"],
                     ctranslate2_version=info["ctranslate2_version"], packages=" ".join(pkgs),
                     files=_readme_files(info), tokenize=_readme_tokenize(src),
                     max_source_len=dec["max_source_len"], detokenize=_readme_detokenize(tgt),
                     snippet=python_snippet(info), settings=_readme_settings(info),
                     lenpen=dec["lenpen"])


def _readme_files(info: dict) -> str:
    """The FILES list of README.txt."""
    vocab = ("shared_vocabulary.json      " if info["joined_vocabulary"] else
             "source_vocabulary.json,\n  target_vocabulary.json      ")
    files = ["  model.bin, config.json      the weights and settings, CTranslate2's format",
             f"  {vocab}nmt's dictionaries, id for id (<pad> <s> </s> <unk> are 0-3)"]
    for side in ("source", "target"):
        s = info[side]
        if s["subword_file"]:
            what = ("sentencepiece model" if s["subword"] == "bpe"
                    else "wordpiece tokenizer (HuggingFace tokenizers)")
            files.append(f"  {s['subword_file']:<27} the {side} {what}")
    files += ["  translate.py                translates as nmt-generate does (below)",
              "  nmt_export.json             what was exported, nmt's decoding settings",
              "  README.txt                  this file"]
    return "\n".join(files)


def _readme_tokenize(s: dict) -> str:
    """Step 1 of README.txt: how a source line becomes pieces."""
    moses = (f"Moses-tokenize ({s['moses_lang']}; sacremoses, escape=False, no aggressive "
             f"dash splits),\n     then " if s["moses_lang"] else "")
    if s["subword"] == "bpe":
        return f"{moses}split into pieces with {s['subword_file']} (sentencepiece)"
    if s["subword"] == "wordpiece":
        return f"{moses}split into pieces with {s['subword_file']} (tokenizers)"
    return f"{moses}split at whitespace (the model has no subwords)"


def _readme_detokenize(s: dict) -> str:
    """Step 3 of README.txt: how output pieces become a line."""
    if s["subword"] == "bpe":
        out = f"join the output pieces with {s['subword_file']} (sentencepiece decode)"
    elif s["subword"] == "wordpiece":
        out = "join the output pieces: '##' pieces glue onto the previous one"
    else:
        out = "join the output tokens with spaces"
    if s["moses_lang"]:
        out += f",\n     then Moses-detokenize ({s['moses_lang']})"
    return out


def _readme_settings(info: dict) -> str:
    """The table of nmt's decoding settings and CTranslate2's options that give them."""
    dec = info["decoding"]
    a, b = dec["max_len_a"], dec["max_len_b"]
    limit = f"floor({a:g} * source pieces + {b})"
    learned = info["positions"]["kind"] == "learned"
    cap = (f"at most {dec['max_output_len']} (nmt's limit, learned positions)" if learned else
           f"at most {dec['max_output_len']} (the position table's rows)")
    rows = [
        (f"beam {dec['beam']}", f"beam_size={dec['beam']} (default 2); beam_size=1 is greedy "
                               f"decoding"),
        ("at most a * source + b", f"max_decoding_length={limit} (default 256),"),
        (f"  output pieces (a={a:g}, b={b})", f"{cap}; one number per"),
        ("", "translate_batch call: translate the sentences with the same"),
        ("", "limit together, as translate.py does"),
        (("an empty output is allowed", "min_decoding_length=0 (default 1)")
         if not dec.get("min_len") else
         (f"no </s> before {dec['min_len']} pieces", f"min_decoding_length={dec['min_len']} "
                                                      f"(default 1)")),
        (f"sources cut at {dec['max_source_len']} pieces",
         "cut them yourself and max_input_length=0, or"),
        ("", f"max_input_length={dec['max_source_len'] + 1} (it counts the </s> that "
             f"CTranslate2"),
        ("", "appends; default 1024)"),
        (f"length penalty alpha {dec['lenpen']}", "see LENGTH PENALTY"),
        ("<pad>, <s> never output", f"built into model.bin (a {FORBIDDEN_BIAS:g} bias on their "
                                    f"logits)"),
        ("no other penalty", "keep coverage_penalty, repetition_penalty, no_repeat_ngram_size,"),
        ("", "disable_unk and the sampling options at their defaults"),
    ]
    return "\n".join(f"  {left:<30}{right}".rstrip() for left, right in rows)


__all__ = ["FORMATS", "QUANTIZATIONS", "export_model", "import_ctranslate2", "check_exportable",
           "ctranslate2_spec", "position_rows", "export_info", "readme", "python_snippet",
           "SNIPPET_BEGIN", "SNIPPET_END"]
