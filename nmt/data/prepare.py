"""nmt-preprocess as a library: learn subwords, binarize parallel text into a data directory.

Stages, all streaming (memory does not grow with the corpus):

1. check every input file and the destination before any real work;
2. one pass over the training data: check the line counts match and draw a fixed-size random
   sample of sentence pairs (reservoir sampling), or count whitespace tokens (--subword none);
3. learn the subword model(s) on the sample (sentencepiece BPE or wordpiece), or reuse a codec;
4. encode every split in chunks on ``workers`` processes, filter (train only by default),
   and stream the ids into memory-mapped shards;
5. write dictionaries (with corpus counts), subword models and meta.json, then rename the
   temporary directory into place. Any error removes the temporary directory.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from nmt.data.codec import TextCodec, whitespace_codec
from nmt.data.datadir import (FORMAT_VERSION, META, DataDir, split_sort_key, write_codec,
                              write_meta)
from nmt.data.dictionary import Dictionary
from nmt.data.indexed import SplitWriter
from nmt.data.rebuild import built_from, difference, existing_build
from nmt.data.subword import KINDS, train_sentencepiece, train_wordpiece
from nmt.data.encode_pool import Filter, Runner, task_count, task_encode, task_tokenize
from nmt.errors import NmtError, UsageError
from nmt.tasks.task import TASKS, infer_task
from nmt.io import (_decode_line, check_readable, install_directory, is_regular_file,
                    temporary_directory_beside)
from nmt.fields import option

log = logging.getLogger("nmt.data.prepare")


def _prefixes(values: list[str]) -> list[str]:
    """--validpref/--testpref: comma-separated prefixes (fairseq's habit); repeating the
    option works too."""
    return [p for v in values for p in v.split(",") if p]


@dataclass
class PreprocessConfig:
    """What nmt-preprocess does; each field is also its command-line option (``nmt.fields``)."""

    source_lang: str = option(help="Source language code (file suffix), e.g. en.", short="-s")
    target_lang: str = option(help="Target language code (file suffix), e.g. de.", short="-t")
    trainpref: str | None = option(
        None, "Training data: PREFIX.SRC and PREFIX.TGT. Subwords and dictionaries are learned "
        "on it.", metavar="PREFIX")
    validpref: list[str] = option(
        help="Validation data (comma-separated or repeated for several sets: valid, valid1, ...).",
        metavar="PREFIX", multiple=True, parse=_prefixes, default_factory=list)
    testpref: list[str] = option(
        help="Test data (comma-separated or repeated for several sets: test, test1, ...).",
        metavar="PREFIX", multiple=True, parse=_prefixes, default_factory=list)
    destdir: str = option("data-bin", "Data directory to create (built under a temporary name, "
                          "renamed when complete).", metavar="PATH")
    overwrite: bool = option(False, "Replace --destdir if it is an nmt data directory that holds "
                                    "none of this build's input files.")
    # None: bpe, or the reused vocabulary's kind.
    subword: str | None = option(
        None, "Subword model: bpe (sentencepiece), wordpiece (HuggingFace tokenizers, '##' "
        "continuations) or none (whitespace tokens, for pre-tokenized input). "
        "[default: bpe, or the reused vocabulary's kind]", choices=KINDS)
    vocab_size: int = option(32000, "Symbols per dictionary (one shared dictionary with "
                             "--joined-dictionary), including the 4 specials. A soft limit for "
                             "bpe on small corpora.")
    joined: bool = option(False, "One subword model and dictionary shared by both languages "
                          "(the paper's 37k BPE).", flag="--joined-dictionary")
    threshold: int = option(1, "Minimum count: of a token for --subword none, of a merge for "
                            "wordpiece.")
    subword_sample: int = option(1_000_000, "The subword learner sees at most this many "
                                 "sentence pairs, drawn uniformly at random from the training "
                                 "data (keeps memory flat on huge corpora).")
    character_coverage: float = option(1.0, "bpe: share of characters covered by the model "
                                       "(0.9995 suits CJK); the rest become <unk>.")
    byte_fallback: bool = option(False, "bpe: spell characters outside the model as UTF-8 "
                                 "bytes instead of <unk>.")
    moses: bool = option(False, "Moses-tokenize (sacremoses) before subwords; decoding "
                         "detokenizes.")
    task: str = option(
        "auto", "What the data is for, recorded in meta.json and in every checkpoint trained "
        "on it: translation; parsing (targets are linearized trees: decoding under tree "
        "constraints, bracket-F1 validation); auto: parsing when the target vocabulary is "
        "one of linearized trees, else translation.", choices=("auto", *TASKS))
    reuse_vocab: str | None = option(
        None, "Reuse both codecs (subword models and dictionaries) of an existing data "
        "directory, or the text pipeline of a checkpoint (nmt's or an imported one: OPUS-MT, "
        "fairseq), so new data is encoded identically (fine-tuning with nmt-train "
        "--init-from, new test sets).", metavar="DIR|CKPT")
    srcdict: str | None = option(
        None, "Reuse a source dictionary: DIR/dict.LANG.txt of a data directory (its subword "
        "model comes along), or a plain 'symbol count' file with --subword none.",
        metavar="FILE")
    tgtdict: str | None = option(None, "Like --srcdict, for the target.", metavar="FILE")
    max_len: int = option(250, "Drop training pairs with a side longer than this many subword "
                          "tokens (0: no limit).")      # counted without eos
    max_len_ratio: float = option(9.0, "Drop training pairs whose longer side exceeds this "
                                  "many times the shorter (0: no limit).")
    filter_eval: bool = option(False, "Filter valid/test too. Off by default: those keep every "
                               "line (even empty) so that output aligns with the references; "
                               "what would be filtered is only counted.",
                               flag="--filter-eval-splits")
    shard_size: int = option(0, "Sentences per training shard (0: one shard).")
    bpe_dropout: float = option(
        0.0, "bpe: BPE-dropout on the training split (Provilkov et al. 2020; subword "
        "regularization): each merge is skipped with this probability (0.1 in the paper), "
        "so the model sees words split in varied ways. Valid and test splits keep the one "
        "deterministic segmentation that decoding uses.", metavar="P")
    bpe_dropout_copies: int = option(
        10, "With --bpe-dropout: the training split holds this many differently sampled "
        "copies of the corpus (an epoch is then this many passes).", metavar="K")
    workers: int = option(0, "Encoding processes (0: one per CPU).")
    seed: int = option(1, "Seed of the subword sample and of --bpe-dropout.")
    chunk_size: int = option(10000, "Lines per worker task.", cli=False)

    def resolved_workers(self) -> int:
        """--workers, or (0) the CPUs this process may run on (nmt.runtime.usable_cpus)."""
        from nmt.runtime import usable_cpus

        return self.workers if self.workers > 0 else usable_cpus()


@dataclass
class SplitStats:
    name: str
    prefix: str
    lines: int = 0
    kept: int = 0
    src_tokens: int = 0
    tgt_tokens: int = 0
    src_unk: int = 0
    tgt_unk: int = 0
    empty: int = 0
    too_long: int = 0
    ratio: int = 0
    filtered_applied: bool = False
    shards: list[int] = field(default_factory=list)
    bpe_dropout: dict[str, Any] | None = None     # {"p", "copies", "seed"} when sampled

    def to_meta(self) -> dict[str, Any]:
        # source_path: absolute, so that training can find the raw references (validation
        # BLEU against the text the split was made from) wherever it runs from.
        return {"source_prefix": self.prefix,
                "source_path": str(Path(self.prefix).resolve()) if self.prefix else None,
                "input_lines": self.lines, "sentences": self.kept,
                "shards": self.shards, "src_tokens": self.src_tokens,
                "tgt_tokens": self.tgt_tokens, "src_unk": self.src_unk, "tgt_unk": self.tgt_unk,
                # counted over every copy when the split is BPE-dropout's sampled copies
                "filtered": {"applied": self.filtered_applied, "empty": self.empty,
                             "too_long": self.too_long, "ratio": self.ratio,
                             **({"over_copies": self.bpe_dropout["copies"]}
                                if self.bpe_dropout else {})},
                **({"bpe_dropout": self.bpe_dropout} if self.bpe_dropout else {})}


@dataclass
class PreprocessResult:
    path: Path
    meta: dict[str, Any]
    splits: list[SplitStats]
    up_to_date: bool = False     # the destination already held this build: nothing was done


# --- checks --------------------------------------------------------------------------------------

def _check_config(cfg: PreprocessConfig) -> None:
    for name, lang in (("--source-lang", cfg.source_lang), ("--target-lang", cfg.target_lang)):
        if not lang or any(c in lang for c in "./\\ \t"):
            raise UsageError(f"{name} '{lang}' must be a short code such as 'en' (no dots, "
                             f"slashes or spaces)")
    if cfg.source_lang == cfg.target_lang:
        raise UsageError(f"--source-lang and --target-lang are both '{cfg.source_lang}'")
    if cfg.subword is not None and cfg.subword not in KINDS:
        raise UsageError(f"--subword must be one of {', '.join(KINDS)}, got '{cfg.subword}'")
    if cfg.vocab_size < 8:
        raise UsageError(f"--vocab-size must be at least 8, got {cfg.vocab_size}")
    if cfg.threshold < 1:
        raise UsageError(f"--threshold must be >= 1, got {cfg.threshold}")
    if cfg.subword_sample < 1:
        raise UsageError(f"--subword-sample must be >= 1, got {cfg.subword_sample}")
    if not 0.0 < cfg.character_coverage <= 1.0:
        raise UsageError(f"--character-coverage must be in (0, 1], got {cfg.character_coverage}")
    if cfg.max_len < 0 or cfg.max_len_ratio < 0 or cfg.shard_size < 0 or cfg.workers < 0:
        raise UsageError("--max-len, --max-len-ratio, --shard-size and --workers must be >= 0")
    if cfg.max_len_ratio and cfg.max_len_ratio < 1:
        raise UsageError(f"--max-len-ratio must be >= 1 (or 0 to disable), got {cfg.max_len_ratio}")
    if cfg.chunk_size < 1:
        raise UsageError("chunk size must be >= 1")
    if not 0.0 <= cfg.bpe_dropout < 1.0:
        raise UsageError(f"--bpe-dropout must be in [0, 1), got {cfg.bpe_dropout}")
    if cfg.bpe_dropout_copies < 1:
        raise UsageError(f"--bpe-dropout-copies must be >= 1, got {cfg.bpe_dropout_copies}")
    if cfg.bpe_dropout and not cfg.trainpref:
        raise UsageError("--bpe-dropout samples the training split: give --trainpref")
    if cfg.bpe_dropout and cfg.subword not in (None, "bpe"):
        raise UsageError(f"--bpe-dropout needs --subword bpe, not {cfg.subword}")
    if cfg.reuse_vocab and (cfg.srcdict or cfg.tgtdict):
        raise UsageError("use either --reuse-vocab or --srcdict/--tgtdict, not both")
    if not cfg.trainpref and not (cfg.reuse_vocab or cfg.srcdict or cfg.tgtdict):
        raise UsageError("nothing to learn the vocabulary from: give --trainpref, or reuse one "
                         "with --reuse-vocab DIR or --srcdict/--tgtdict")
    if not (cfg.trainpref or cfg.validpref or cfg.testpref):
        raise UsageError("no input: give --trainpref, --validpref or --testpref")


def _split_inputs(cfg: PreprocessConfig) -> list[tuple[str, str]]:
    """[(split name, file prefix)] in order: train, valid, valid1, ..., test, test1, ..."""
    out = [("train", cfg.trainpref)] if cfg.trainpref else []
    for base, prefs in (("valid", cfg.validpref), ("test", cfg.testpref)):
        for k, p in enumerate(prefs):
            out.append((base if k == 0 else f"{base}{k}", p))
    return out


def _check_inputs(cfg: PreprocessConfig, splits: list[tuple[str, str]]) -> None:
    langs = (cfg.source_lang, cfg.target_lang)
    for name, prefix in splits:
        missing = [lang for lang in langs if not Path(f"{prefix}.{lang}").exists()]
        if missing and Path(prefix).is_file():
            flag = "--" + name.rstrip("0123456789") + "pref"
            stem = next((prefix[:-len(lang) - 1] for lang in langs
                         if prefix.endswith(f".{lang}")), None)
            hint = (f"give {flag} {stem} (for {stem}.{langs[0]} and {stem}.{langs[1]})"
                    if stem else f"{flag} PREFIX reads PREFIX.{langs[0]} and PREFIX.{langs[1]}")
            raise UsageError(f"{flag} takes a file prefix, not a file: {prefix} is a file and "
                             f"{prefix}.{missing[0]} does not exist; {hint}")
        for lang in langs:
            check_readable(f"{prefix}.{lang}")
            if name == "train" and not is_regular_file(f"{prefix}.{lang}"):
                raise NmtError(f"{prefix}.{lang}: not a regular file (a pipe?); the training "
                               f"split is read twice, to learn the vocabulary and to binarize "
                               f"it: write it to a file first")


def _prepare_destination(cfg: PreprocessConfig, record: dict[str, Any]) -> tuple[Path, Path]:
    """(final path, temporary directory beside it)."""
    dest = Path(cfg.destdir).expanduser().absolute()
    if dest.exists():
        if not dest.is_dir():
            raise NmtError(f"{dest}: exists and is not a directory")
        if any(dest.iterdir()):
            if not cfg.overwrite:
                why = difference(dest, record)
                raise NmtError(f"{dest}: exists and is not empty" + (
                    f", and is not this build ({why})" if why else "") +
                    " (use --overwrite to replace it)")
            _check_replaceable(cfg, dest)
    return dest, temporary_directory_beside(dest, "data directory")


def _check_replaceable(cfg: PreprocessConfig, dest: Path) -> None:
    """--overwrite deletes ``dest``: only an nmt data directory, and none holding this build's
    own text (which would be gone once the build is installed)."""
    if not (dest / "meta.json").is_file():
        raise NmtError(f"{dest}: is not an nmt data directory (no meta.json), and --overwrite "
                       f"replaces only one; give another --destdir, or remove it yourself")
    root = dest.resolve()
    prefixes = [x for x in (cfg.trainpref, *cfg.validpref, *cfg.testpref) if x]
    for prefix in prefixes:
        for lang in (cfg.source_lang, cfg.target_lang):
            path = Path(f"{prefix}.{lang}").expanduser().resolve()
            if root in path.parents:
                raise NmtError(f"{dest}: holds {path.name}, an input of this build, which "
                               f"--overwrite would delete with it; give another --destdir")


# --- reading -------------------------------------------------------------------------------------

def _open_binary(path: Path):
    try:
        return open(path, "rb")
    except OSError as e:
        raise NmtError(f"{path}: cannot read ({e.strerror})") from None


def _mismatch(src: Path, tgt: Path, n_src: int, n_tgt: int) -> NmtError:
    return NmtError(f"{src} has {n_src} lines but {tgt} has {n_tgt}: "
                    f"source and target must be line-aligned")


def iter_raw_chunks(src: Path, tgt: Path, chunk: int
                    ) -> Iterator[tuple[int, list[bytes], list[bytes], int]]:
    """Yield (first line number, src raw lines, tgt raw lines, bytes read) in aligned chunks.

    Lines stay undecoded (workers decode them, in parallel); a line-count mismatch raises
    NmtError with both totals.
    """
    with _open_binary(src) as fs, _open_binary(tgt) as ft:
        first = 1
        while True:
            a = list(islice(fs, chunk))
            b = list(islice(ft, chunk))
            if len(a) != len(b):
                n_src = first - 1 + len(a) + sum(1 for _ in fs)
                n_tgt = first - 1 + len(b) + sum(1 for _ in ft)
                raise _mismatch(src, tgt, n_src, n_tgt)
            if not a:
                return
            yield first, a, b, sum(map(len, a)) + sum(map(len, b))
            first += len(a)


def sample_pairs(src: Path, tgt: Path, k: int, seed: int, progress=None
                 ) -> tuple[list[str], list[str], int]:
    """A uniform random sample of at most ``k`` line pairs in one streaming pass, plus the
    number of lines (Vitter/Li's reservoir "Algorithm L": O(k log(n/k)) random draws)."""
    rng = random.Random(seed)
    res: list[tuple[int, bytes, bytes]] = []
    n = 0
    w = math.exp(math.log(rng.random() or 1e-300) / k)
    nxt = k + int(math.log(rng.random() or 1e-300) / math.log1p(-w)) if w < 1 else k
    for first, a, b, nbytes in iter_raw_chunks(src, tgt, 10000):
        for i in range(len(a)):
            if n < k:
                res.append((first + i, a[i], b[i]))
            elif n == nxt:
                res[rng.randrange(k)] = (first + i, a[i], b[i])
                w *= math.exp(math.log(rng.random() or 1e-300) / k)
                nxt += int(math.log(rng.random() or 1e-300) / math.log1p(-w)) + 1 if w < 1 else 1
            n += 1
        if progress is not None:
            progress.advance(nbytes)
    res.sort()          # file order: the learner's result does not depend on sampling order
    s = [_decode_line(r[1], str(src), r[0]) for r in res]
    t = [_decode_line(r[2], str(tgt), r[0]) for r in res]
    return s, t, n


# --- vocabulary ----------------------------------------------------------------------------------

def _codec_from_dict_path(path: str, kind: str | None, moses_lang: str | None) -> TextCodec:
    """--srcdict/--tgtdict: a dict.{lang}.txt inside a data directory (its whole codec is
    reused), or a plain dictionary file for --subword none."""
    p = check_readable(path, "dictionary file", expected="a dictionary file")
    if (p.parent / META).is_file() and p.name.startswith("dict.") and p.name.endswith(".txt"):
        lang = p.name[len("dict."):-len(".txt")]
        return DataDir.open(p.parent).codec(lang)
    if kind not in (None, "none"):
        raise UsageError(f"{p}: a plain dictionary only works with --subword none; to reuse a "
                         f"{kind} model point at dict.LANG.txt inside an nmt data directory "
                         f"(or use --reuse-vocab DIR)")
    dictionary = Dictionary.load(p)
    marked = sum(s.startswith(("\u2581", "##")) for s in dictionary.symbols)
    if kind is None and marked > len(dictionary) // 4:
        # Read as whole words, nearly every word of the text would be <unk>.
        raise UsageError(f"{p}: holds subword pieces (▁ or ## marks on {marked} of "
                         f"{len(dictionary)} symbols), taken out of their data directory: "
                         f"give dict.LANG.txt inside it, or --reuse-vocab DIR (a plain "
                         f"dictionary is for whole words, with --subword none)")
    return whitespace_codec(dictionary, moses_lang)


@dataclass(frozen=True)
class CheckpointPipeline:
    """A checkpoint's text pipeline for --reuse-vocab CKPT, read by the caller (nmt-preprocess
    reads it with nmt.checkpoint, a layer above this one)."""
    src_codec: TextCodec
    tgt_codec: TextCodec
    src_lang: str | None
    tgt_lang: str | None


def _checkpoint_codecs(cfg: PreprocessConfig, pipeline: CheckpointPipeline | None
                       ) -> tuple[TextCodec, TextCodec, bool, str]:
    """--reuse-vocab CKPT: the checkpoint's (source, target) codecs, whether they share one
    dictionary, and what to call them in errors. Its source codec encodes the -s files."""
    if pipeline is None:
        raise UsageError(f"--reuse-vocab {cfg.reuse_vocab}: a file, so a checkpoint, but no "
                         f"text pipeline was read from it (preprocess(..., pipeline=...))")
    pair = (pipeline.src_lang, pipeline.tgt_lang)
    if (cfg.target_lang, cfg.source_lang) == pair:
        raise UsageError(f"{cfg.reuse_vocab} translates {pair[0]}->{pair[1]}: give "
                         f"-s {pair[0]} -t {pair[1]} (its source pipeline encodes -s's files)")
    src, tgt = pipeline.src_codec, pipeline.tgt_codec
    return src, tgt, src.dictionary == tgt.dictionary, f"the checkpoint {cfg.reuse_vocab}"


def _reused_codecs(cfg: PreprocessConfig, pipeline: CheckpointPipeline | None = None
                   ) -> tuple[TextCodec, TextCodec, bool] | None:
    s, t = cfg.source_lang, cfg.target_lang
    if cfg.reuse_vocab:
        if not Path(cfg.reuse_vocab).exists():
            raise NmtError(f"{cfg.reuse_vocab}: no such data directory or checkpoint "
                           f"(--reuse-vocab)")
        if Path(cfg.reuse_vocab).is_file():
            src, tgt, joined, name = _checkpoint_codecs(cfg, pipeline)
        else:
            dd = DataDir.open(cfg.reuse_vocab)
            for lang in (s, t):
                if lang not in (dd.src_lang, dd.tgt_lang):
                    raise NmtError(f"{dd.path} has languages {dd.src_lang}, {dd.tgt_lang}; "
                                   f"'{lang}' is not one of them")
            src, tgt, joined, name = dd.codec(s), dd.codec(t), dd.joined, f"({dd.path})"
        for option, given, there in (("--moses", cfg.moses, src.moses_lang is not None),
                                     ("--joined-dictionary", cfg.joined, joined)):
            if given and not there:
                raise UsageError(f"{option}, but the reused vocabulary {name} was built "
                                 f"without it: its codec is used as it is; leave {option} out")
        return src, tgt, joined
    if cfg.srcdict or cfg.tgtdict:
        m = (lambda lang: lang if cfg.moses else None)
        src = _codec_from_dict_path(cfg.srcdict, cfg.subword, m(s)) if cfg.srcdict else None
        tgt = _codec_from_dict_path(cfg.tgtdict, cfg.subword, m(t)) if cfg.tgtdict else None
        if cfg.joined:
            src = src or tgt
            tgt = tgt or src
            if src.dictionary != tgt.dictionary:
                raise UsageError("--joined-dictionary with different --srcdict and --tgtdict")
        if src is None or tgt is None:
            raise UsageError("give both --srcdict and --tgtdict (or one with "
                             "--joined-dictionary)")
        if src.kind != tgt.kind:
            raise UsageError(f"--srcdict is a {src.kind} dictionary and --tgtdict a {tgt.kind} "
                             f"one; a data directory has one kind of subword on both sides")
        return src, tgt, cfg.joined
    return None


def learn_codecs(cfg: PreprocessConfig, train_prefix: str, workers: int, progress=None
                 ) -> tuple[TextCodec, TextCodec, int]:
    """Learn the subword model(s) and dictionaries on the training data.

    Returns (src codec, tgt codec, training lines). Checks the line counts on the way.
    """
    kind = cfg.subword or "bpe"
    s_lang, t_lang = cfg.source_lang, cfg.target_lang
    src_path, tgt_path = Path(f"{train_prefix}.{s_lang}"), Path(f"{train_prefix}.{t_lang}")
    moses = (lambda lang: lang if cfg.moses else None)
    task = progress.add_task("reading training data", total=_size(src_path) + _size(tgt_path),
                             rate="") if progress else None
    adv = _Advance(progress, task)

    if kind == "none":
        # Every token counts: one streaming pass, counting in parallel.
        cs, ct, lines = Counter(), Counter(), [0]
        with Runner(workers) as run:
            def args():
                for first, a, b, nbytes in iter_raw_chunks(src_path, tgt_path, cfg.chunk_size):
                    adv.advance(nbytes)
                    lines[0] += len(a)
                    yield a, str(src_path), first, moses(s_lang)
                    yield b, str(tgt_path), first, moses(t_lang)
            for i, c in enumerate(run.imap(task_count, args())):
                (cs if i % 2 == 0 else ct).update(c)
        n = lines[0]
        if n == 0:
            raise NmtError(f"training set {train_prefix}.{{{s_lang},{t_lang}}} is empty")
        if cfg.joined:
            d = Dictionary.from_counts(cs + ct, cfg.vocab_size, cfg.threshold)
            src = whitespace_codec(d, moses(s_lang))
            tgt = src if not cfg.moses else whitespace_codec(d, moses(t_lang))
        else:
            src = whitespace_codec(Dictionary.from_counts(cs, cfg.vocab_size, cfg.threshold),
                                   moses(s_lang))
            tgt = whitespace_codec(Dictionary.from_counts(ct, cfg.vocab_size, cfg.threshold),
                                   moses(t_lang))
        return src, tgt, n

    t0 = time.time()
    s_sample, t_sample, n = sample_pairs(src_path, tgt_path, cfg.subword_sample, cfg.seed, adv)
    if n == 0:
        raise NmtError(f"training set {train_prefix}.{{{s_lang},{t_lang}}} is empty")
    log.info("sampled %d of %d training pairs in %.1fs", len(s_sample), n, time.time() - t0)
    if cfg.moses:
        with Runner(workers) as run:
            def tok_args(lines: list[str], lang: str):
                for i in range(0, len(lines), cfg.chunk_size):
                    yield ([x.encode("utf-8") for x in lines[i:i + cfg.chunk_size]], "sample",
                           1, lang)
            s_sample = [x for c in run.imap(task_tokenize, tok_args(s_sample, s_lang)) for x in c]
            t_sample = [x for c in run.imap(task_tokenize, tok_args(t_sample, t_lang)) for x in c]

    def learn(sentences: list[str], side: str):
        t1 = time.time()
        if not any(s.strip() for s in sentences):
            raise NmtError(f"{side}: no text to learn subwords from (every sampled line is "
                           f"empty or blank)")
        if kind == "bpe":
            m = train_sentencepiece(sentences, cfg.vocab_size, cfg.character_coverage,
                                    cfg.byte_fallback, threads=workers)
        else:
            m = train_wordpiece(sentences, cfg.vocab_size, max(cfg.threshold, 1))
        log.info("learned a %s model of %d symbols on %d sentences in %.1fs", kind,
                 len(m.dictionary()), len(sentences), time.time() - t1)
        return m

    if cfg.joined:
        model = learn(s_sample + t_sample, f"{src_path} and {tgt_path}")
        del s_sample, t_sample
        src = TextCodec(model, None, moses(s_lang))
        tgt = src if not cfg.moses else TextCodec(model, src.dictionary, moses(t_lang))
    else:
        src = TextCodec(learn(s_sample, str(src_path)), None, moses(s_lang))
        del s_sample
        tgt = TextCodec(learn(t_sample, str(tgt_path)), None, moses(t_lang))
    return src, tgt, n


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


class _Advance:
    def __init__(self, progress, task):
        self.progress, self.task = progress, task

    def advance(self, n: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, advance=n)


# --- binarization --------------------------------------------------------------------------------

def binarize_split(run: Runner, name: str, prefix: str, cfg: PreprocessConfig, out_dir: Path,
                   dtype: np.dtype, counts: list[np.ndarray] | None, progress=None) -> SplitStats:
    """Encode one split into shards; adds the kept ids to ``counts`` (train only)."""
    src_path = Path(f"{prefix}.{cfg.source_lang}")
    tgt_path = Path(f"{prefix}.{cfg.target_lang}")
    is_train = name == "train"
    flt = Filter(apply=is_train or cfg.filter_eval, max_len=cfg.max_len,
                  max_ratio=cfg.max_len_ratio)
    st = SplitStats(name, str(prefix), filtered_applied=flt.apply)
    sampled = is_train and bool(cfg.bpe_dropout)
    if sampled:
        st.bpe_dropout = {"p": cfg.bpe_dropout, "copies": cfg.bpe_dropout_copies,
                          "seed": cfg.seed}
    task = progress.add_task(f"binarizing {name}", total=_size(src_path) + _size(tgt_path),
                             rate="") if progress else None
    adv = _Advance(progress, task)
    shard_size = cfg.shard_size if is_train else 0
    ws = SplitWriter(out_dir, name, cfg.source_lang, dtype, shard_size)
    wt = SplitWriter(out_dir, name, cfg.target_lang, dtype, shard_size)
    # BPE-dropout: the training split is the corpus sampled bpe_dropout_copies times over.
    copies = cfg.bpe_dropout_copies if sampled else 1
    if progress is not None and copies > 1:
        progress.update(task, total=copies * (_size(src_path) + _size(tgt_path)))

    def args():
        for copy in range(copies):
            dropout = (cfg.bpe_dropout, cfg.seed, copy) if sampled else None
            for first, a, b, nbytes in iter_raw_chunks(src_path, tgt_path, cfg.chunk_size):
                adv.advance(nbytes)
                yield first, a, b, str(src_path), str(tgt_path), flt, dropout

    try:
        for n, s_flat, s_len, t_flat, t_len, (e, tl, r), s_unk, t_unk in \
                run.imap(task_encode, args()):
            ws.add(s_flat, s_len)
            wt.add(t_flat, t_len)
            st.lines += n         # every copy reads every input line: divided below
            st.kept += len(s_len)
            st.src_tokens += len(s_flat)
            st.tgt_tokens += len(t_flat)
            st.src_unk += s_unk
            st.tgt_unk += t_unk
            st.empty += e
            st.too_long += tl
            st.ratio += r
            if counts is not None:
                counts[0] += np.bincount(s_flat, minlength=len(counts[0]))[:len(counts[0])]
                counts[1] += np.bincount(t_flat, minlength=len(counts[1]))[:len(counts[1])]
    finally:
        st.shards = ws.close()
        wt.close()
    st.lines //= copies
    return st


def _report_split(cfg: PreprocessConfig, st: SplitStats, prefix: str, seconds: float) -> None:
    """Log what one split kept; an empty training set is an error."""
    name = st.name
    if st.bpe_dropout:
        log.info("%s: %d pairs kept in %.1fs: %d copies of the %d input lines, each sampled "
                 "with BPE-dropout %g", name, st.kept, seconds, cfg.bpe_dropout_copies,
                 st.lines, cfg.bpe_dropout)
    else:
        log.info("%s: %d of %d pairs kept in %.1fs", name, st.kept, st.lines, seconds)
    if name == "train" and st.lines == 0:
        raise NmtError(f"training set {prefix}.{{{cfg.source_lang},{cfg.target_lang}}} is empty")
    if st.lines == 0:
        log.warning("%s: %s.{%s,%s} is empty: the split has no sentences", name, prefix,
                    cfg.source_lang, cfg.target_lang)
    if name == "train" and st.kept == 0:
        over = (f"over the {cfg.bpe_dropout_copies} sampled copies: " if st.bpe_dropout
                else "")
        raise NmtError(f"no training pairs left after filtering ({over}{st.empty} empty, "
                       f"{st.too_long} longer than --max-len {cfg.max_len}, "
                       f"{st.ratio} over --max-len-ratio {cfg.max_len_ratio})")


def preprocess(cfg: PreprocessConfig, progress=None,
               pipeline: CheckpointPipeline | None = None) -> PreprocessResult:
    """Build the data directory described by ``cfg``; returns its path and meta.json content.

    ``progress``: an optional rich Progress (bars in bytes of input read). ``pipeline``: the
    text pipeline of the checkpoint that ``cfg.reuse_vocab`` names, when it names one.
    """
    t_start = time.time()
    _check_config(cfg)
    splits = _split_inputs(cfg)
    _check_inputs(cfg, splits)
    record = built_from(cfg, splits)
    if not cfg.overwrite:
        done = existing_build(Path(cfg.destdir).expanduser().absolute(), record)
        if done is not None:
            log.info("%s: already built from the same inputs and options; nothing to do "
                     "(--overwrite rebuilds it)", done.path)
            return PreprocessResult(done.path, done.meta, [], up_to_date=True)
    reused = _reused_codecs(cfg, pipeline)
    if cfg.trainpref is None and reused is None:
        raise UsageError("nothing to learn the vocabulary from")
    workers = cfg.resolved_workers()
    dest, tmp = _prepare_destination(cfg, record)
    try:
        if reused is not None:
            src, tgt, joined = reused
            kind = src.kind
            if cfg.subword is not None and cfg.subword != kind:
                raise UsageError(f"--subword {cfg.subword} but the reused vocabulary is {kind}")
            learned = False
        else:
            src, tgt, _ = learn_codecs(cfg, cfg.trainpref, workers, progress)
            kind, joined, learned = cfg.subword or "bpe", cfg.joined, True
        if cfg.bpe_dropout and not (src.supports_dropout and tgt.supports_dropout):
            raise UsageError(f"--bpe-dropout needs sentencepiece BPE models, not {kind}")
        dtype = np.dtype(np.uint16) if max(len(src), len(tgt)) <= 65536 else np.dtype(np.int32)

        stats: list[SplitStats] = []
        counts = None
        if learned:
            counts = [np.zeros(len(src), np.int64), np.zeros(len(tgt), np.int64)]
        with Runner(workers, src, tgt) as run:
            for name, prefix in splits:
                t0 = time.time()
                st = binarize_split(run, name, prefix, cfg, tmp, dtype,
                                    counts if name == "train" else None, progress)
                stats.append(st)
                _report_split(cfg, st, prefix, time.time() - t0)

        if counts is not None:
            # dict.txt counts are the kept training data's frequencies (fairseq's habit).
            if joined:
                both = counts[0] + counts[1]
                src.dictionary.set_counts(both)
                if tgt.dictionary is not src.dictionary:
                    tgt.dictionary.set_counts(both)
            else:
                src.dictionary.set_counts(counts[0])
                tgt.dictionary.set_counts(counts[1])
        vocab = {cfg.source_lang: write_codec(tmp, cfg.source_lang, src),
                 cfg.target_lang: write_codec(tmp, cfg.target_lang, tgt)}
        meta = _meta(cfg, kind, joined, dtype, vocab, stats, learned, time.time() - t_start)
        inferred = infer_task(tgt.dictionary).name
        meta["task"] = inferred if cfg.task == "auto" else cfg.task
        if meta["task"] == "parsing" and inferred != "parsing":
            raise NmtError(f"--task parsing needs targets that are linearized trees, but the "
                           f"{cfg.target_lang} vocabulary is not one of brackets (see "
                           f"examples/parsing_wsj/prepare.py)")
        meta["built_from"] = record
        write_meta(tmp, meta)
        install_directory(tmp, dest, "data directory")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PreprocessResult(dest, meta, stats)


def _meta(cfg: PreprocessConfig, kind: str, joined: bool, dtype: np.dtype,
          vocab: dict[str, Any], stats: list[SplitStats], learned: bool, seconds: float
          ) -> dict[str, Any]:
    from nmt.version import __version__
    options = dataclasses.asdict(cfg)
    options["workers"] = cfg.resolved_workers()
    return {
        "format_version": FORMAT_VERSION,
        "nmt_version": __version__,
        "src_lang": cfg.source_lang,
        "tgt_lang": cfg.target_lang,
        "langs": [cfg.source_lang, cfg.target_lang],
        "joined": joined,
        "subword": kind,
        "moses": any(v.get("moses_lang") for v in vocab.values()),
        "dtype": dtype.name,
        "vocab": vocab,
        "vocab_source": "learned" if learned else (cfg.reuse_vocab or
                                                   f"{cfg.srcdict},{cfg.tgtdict}"),
        "splits": {st.name: st.to_meta()
                   for st in sorted(stats, key=lambda s: split_sort_key(s.name))},
        "options": options,
        "seconds": round(seconds, 2),
    }


__all__ = ["PreprocessConfig", "PreprocessResult", "CheckpointPipeline", "SplitStats", "preprocess", "learn_codecs",
           "binarize_split", "sample_pairs", "iter_raw_chunks"]
