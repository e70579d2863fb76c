"""CTranslate2 as nmt's decoding engine (``--engine ctranslate2``; ``Translator.from_checkpoint(
..., engine="ctranslate2")``).

    from nmt.engines.ctranslate2 import CTranslate2Translator
    t = CTranslate2Translator.from_checkpoint("checkpoint_best.pt", threads=4)
    t.translate(["A man is riding a bike ."])

The checkpoint is converted once, with nmt-export's code (nmt.interop.ct2_export), into a
CTranslate2 model directory cached beside it: ``DIR/.nmt-ctranslate2/KEY/``, where KEY is a
hash of the checkpoint's bytes, the ctranslate2 version, nmt's and the weights' type: float32,
or int8 for ``--precision int8``, whose model is quantized when it is converted, as nmt-export
``--quantization int8`` does, so that loading it takes no more memory than an int8 export. The
directory is built under a temporary name and renamed into place, under an exclusive lock
(another process converting the same checkpoint waits for it); a checkpoint file that changes
(checkpoint_last.pt during training) gets new entries and the older entries of the same file
are removed. Where the
checkpoint's directory is not writable, the cache is ``$XDG_CACHE_HOME/nmt/ctranslate2``
(``~/.cache``). A cached model is read without torch: the codecs and the decoding preset are in
its ``nmt_engine.json``, so a process that finds its model there never imports torch.

The text side (encoding, source checks and truncation, batches by length, input order, empty
lines) is nmt.search.pipeline's, shared with nmt's own engine. What CTranslate2 decodes
exactly as nmt does:

- greedy search (beam 1): the same tokens;
- beam search with the GNMT or the fairseq length penalty: CTranslate2 runs with a length
  penalty of 1e-9, so that it stops as nmt does (once ``beam`` hypotheses have finished) and its
  scores stay log-probabilities, returns every finished hypothesis, and nmt ranks them by its
  own formula. CTranslate2 normalizes each step's probabilities without ``<pad>`` and ``<s>``,
  which nmt only never picks: on a trained model this changes nothing; on a model trained for
  seconds it can change a few beam outputs;
- the length limit ``floor(a * source length + b)``: a batch is one ``translate_batch``
  call up to its longest limit, and a sentence whose search reached its own limit is decoded
  again with it (greedy: cut to it, its forced ``</s>`` scored in one ``score_batch`` pass);
  ``--min-len``, ``--no-repeat-ngram-size``, ``--unkpen inf``.

Where a hypothesis reaches the length limit, CTranslate2 ends it there and nmt forces a
``</s>`` and counts its probability: greedy output and scores are nmt's (the forced
``</s>`` is scored after the search), beam search may rank such a hypothesis otherwise.
Below the best hypothesis, an n-best list can differ when more than ``beam`` hypotheses finish at one step (CTranslate2
keeps the ``beam`` most probable, nmt ranks them all by its length penalty). Token scores are
not given (None).
What CTranslate2 cannot decode as nmt does is refused in one line naming it
(:meth:`CTranslate2Translator.check_search`): sampling, ensembles, forced prefixes, lexical
and tree constraints, transformers' length-penalty rule (``hf``), a finite ``--unkpen``,
diverse beam groups, ``--replace-unk``, alignments and ``--score-reference``.

ctranslate2 is an optional dependency (``pip install 'nmt[export]'``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence


from nmt.config import ModelConfig
from nmt.errors import NmtError, UsageError
from nmt.runtime import usable_cpus
from nmt.search.config import (BatchConfig, SearchConfig, length_limit, parallel_batches,
                               parallel_engine_tokens, thread_share)
from nmt.search.pipeline import TranslatorBase
from nmt.specials import EOS

log = logging.getLogger("nmt.engines")

CACHE_NAME = ".nmt-ctranslate2"
META = "nmt_engine.json"
META_VERSION = 1
# nmt's --precision -> CTranslate2's compute type (auto: what the converted model holds).
COMPUTE_TYPES = {"fp32": "float32", "int8": "int8", "bf16": "bfloat16", "fp16": "float16",
                 "auto": "default"}
# nmt's --precision -> the weights of the cached conversion (others: float32, converted by
# CTranslate2 as it loads them).
_STORED = {"int8": "int8"}
# CTranslate2 stops as nmt does (after ``beam`` finished hypotheses) with any length penalty
# other than 0, and divides the log-probabilities by |Y| ** 1e-9: by less than 1e-8 of them.
TINY_LENPEN = 1e-9
FORMULAS = ("gnmt", "fairseq")      # those nmt ranks CTranslate2's finished hypotheses by


@dataclass
class _Hypothesis:
    tokens: list[int]
    score: float | None
    token_scores: None = None


def import_ctranslate2():
    """The ctranslate2 module, or a one-line NmtError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise NmtError("--engine ctranslate2 needs the ctranslate2 package: "
                       "pip install 'nmt[export]'") from None
    if str(getattr(ctranslate2, "__version__", "0")).split(".")[0] != "4":
        raise NmtError(f"--engine ctranslate2 needs ctranslate2 4.x, found "
                       f"{ctranslate2.__version__}: pip install 'nmt[export]'")
    return ctranslate2


# --- the cache ------------------------------------------------------------------------------

def checkpoint_hash(path: Path) -> str:
    """A hash of the checkpoint's bytes."""
    h = hashlib.blake2b(digest_size=16)
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    except OSError as e:
        raise NmtError(f"{path}: cannot read the checkpoint ({e.strerror or e})") from None
    return h.hexdigest()


def stored_weights(precision: str) -> str:
    """The weights of the cached conversion that ``--precision`` decodes: int8 for int8,
    float32 for the others."""
    return _STORED.get(precision, "float32")


def _check_precision(precision: str) -> None:
    """A one-line UsageError for a --precision CTranslate2 has no compute type for."""
    if precision not in COMPUTE_TYPES:
        raise UsageError(f"--engine ctranslate2 decodes in {', '.join(COMPUTE_TYPES)}, "
                         f"not {precision}")


def _made_by(ct2_version: str) -> str:
    from nmt.version import __version__

    return f"nmt {__version__} ctranslate2 {ct2_version}"


def cache_key(content: str, made_by: str, quantization: str) -> str:
    """A hash of the checkpoint's bytes (``content``: its checkpoint_hash), of the versions
    that make the conversion (``made_by``) and of the weights' type."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{made_by} {quantization}\n{content}".encode())
    return h.hexdigest()


def _user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nmt" / "ctranslate2"


def _cache_root(checkpoint: Path) -> Path:
    """``.nmt-ctranslate2`` beside the checkpoint, or the user's cache when that directory
    cannot be written."""
    root = checkpoint.parent / CACHE_NAME
    try:
        root.mkdir(exist_ok=True)
        if os.access(root, os.W_OK):
            return root
    except OSError:
        pass
    user = _user_cache()
    try:
        user.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NmtError(f"cannot create a cache for the CTranslate2 model of {checkpoint} "
                       f"beside it or in {user} ({e.strerror or e})") from None
    log.info("%s is not writable: the CTranslate2 model is cached in %s", checkpoint.parent,
             user)
    return user


class _CacheLock:
    """flock on ROOT/.lock: exclusive to convert and prune, shared to read an entry."""

    def __init__(self, root: Path, exclusive: bool):
        self.path, self.mode = root / ".lock", fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH

    def __enter__(self):
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise NmtError(f"cannot create the lock file {self.path} ({e.strerror or e})"
                           ) from None
        try:
            fcntl.flock(self.fd, self.mode | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process converting a checkpoint in %s",
                     self.path.parent)
            fcntl.flock(self.fd, self.mode)
        except OSError:
            pass    # a filesystem without flock: the temporary-name install still holds
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def converted_model(checkpoint: str | os.PathLike, quantization: str = "float32") -> Path:
    """The cached CTranslate2 model directory of ``checkpoint`` (a path) with ``quantization``
    weights (float32 or int8), converted now if it is not there yet. Safe to call from
    several processes at once."""
    ct2 = import_ctranslate2()
    path = Path(checkpoint)
    from nmt.io import check_readable

    check_readable(path, "checkpoint", expected="a checkpoint file")
    content, made_by = checkpoint_hash(path), _made_by(ct2.__version__)
    key = cache_key(content, made_by, quantization)
    root = _cache_root(path.resolve())
    entry = root / key
    if (entry / META).is_file():
        return entry
    with _CacheLock(root, exclusive=True):
        if not (entry / META).is_file():        # another process may have made it meanwhile
            _convert(path, entry, key, quantization, content, made_by)
            _prune(root, path.resolve(), content, made_by)
    return entry


def _convert(path: Path, entry: Path, key: str, quantization: str, content: str,
             made_by: str) -> None:
    from nmt.checkpoint import (checkpoint_task, codecs_from_checkpoint, inference_checkpoint,
                                load_checkpoint, model_config)
    from nmt.interop.ct2_export import export_model
    from nmt.io import fsync_dir

    log.info("converting %s for CTranslate2, %s weights (once; cached in %s)", path,
             quantization, entry.parent)
    ckpt = inference_checkpoint(load_checkpoint(path, mmap=True))
    src, tgt = codecs_from_checkpoint(ckpt, str(path))
    cfg = model_config(ckpt)
    meta = {"version": META_VERSION, "key": key, "checkpoint": str(path.resolve()),
            "content": content, "made_by": made_by, "quantization": quantization,
            "task": checkpoint_task(ckpt, str(path)).name,
            "model_config": cfg.to_dict(),
            "src_codec": src.to_state(), "tgt_codec": tgt.to_state()}
    tmp = entry.with_name(f".{key}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        export_model(ckpt, tmp, quantization=quantization)
        (tmp / META).write_text(json.dumps(meta) + "\n", encoding="utf-8")
        os.replace(tmp, entry)
        fsync_dir(entry.parent)
    except OSError as e:
        raise NmtError(f"{entry.parent}: cannot write the CTranslate2 model "
                       f"({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _prune(root: Path, checkpoint: Path, content: str, made_by: str) -> None:
    """Remove the entries converted from ``checkpoint`` before it changed (from other bytes
    than ``content``) or by other versions of nmt or ctranslate2 than ``made_by``, and
    temporaries left by processes that died converting (the caller holds the exclusive
    lock)."""
    for d in root.iterdir():
        if not d.is_dir():
            continue
        if d.name.startswith("."):
            shutil.rmtree(d, ignore_errors=True)
            continue
        try:
            meta = json.loads((d / META).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if meta.get("checkpoint") == str(checkpoint) and (meta.get("content"), meta.get(
                "made_by")) != (content, made_by):
            shutil.rmtree(d, ignore_errors=True)


# --- the translator -------------------------------------------------------------------------

class CTranslate2Translator(TranslatorBase):
    """nmt's text pipeline around a ctranslate2.Translator (see the module doc)."""

    engine = "ctranslate2"

    def __init__(self, model_dir: str | os.PathLike, meta: Mapping[str, Any], *,
                 search: SearchConfig | None = None, batch: BatchConfig | None = None,
                 device: str = "cpu", precision: str = "fp32", threads: int | None = None):
        from nmt.data.codec import TextCodec
        from nmt.tasks.task import get_task

        ct2 = import_ctranslate2()
        self.model_dir = Path(model_dir)
        cfg = ModelConfig.from_dict(meta["model_config"])
        self.src_codec = TextCodec.from_state(meta["src_codec"])
        self.tgt_codec = TextCodec.from_state(meta["tgt_codec"])
        self.task = get_task(meta["task"])
        self.search = (search or SearchConfig()).resolve(cfg)
        self.check_search(self.search)
        self.batch = batch or BatchConfig()
        export = json.loads((self.model_dir / "nmt_export.json").read_text(encoding="utf-8"))
        self._max_output = int(export["decoding"]["max_output_len"])
        self._learned = cfg.positional == "learned"
        self._max_positions = cfg.max_positions if self._learned else None
        _check_precision(precision)
        # One batch at a time, the default batch grows with a narrow decoder
        # (BatchConfig.limits) in int8 only: CTranslate2's int8 products quantize their inputs
        # at every call and gained from more rows (transformer_tiny at beam 4: 0.94x
        # CTranslate2 called directly at 8192 source tokens, 0.48x at 2048), while its float32
        # gained nothing measurable from them. Two at once take parallel_engine_tokens below.
        self._set_limits(self._max_positions, cfg.decoder_width if precision == "int8" else None)
        self.max_source_len = min(self.max_source_len, export["decoding"]["max_source_len"])
        self.device, self.device_index = _ct2_device(ct2, device)
        self.precision = precision
        self.compute_type = COMPUTE_TYPES[precision]
        self.threads = threads or usable_cpus()
        # Batches decoded at once (BatchConfig.parallel): CTranslate2's inter_threads, each
        # batch on threads // that many (its intra_threads); then smaller default batches
        # (parallel_engine_tokens), as CTranslate2's own tuning picked with two at once
        self.inter_threads = parallel_batches(self.batch.parallel, self.threads,
                                              cfg.decoder_width, self.search.beam,
                                              self.device == "cpu", engine="ctranslate2")
        if (self.inter_threads > 1 and self.batch.batch_size is None
                and self.batch.max_tokens is None):
            self.max_tokens = parallel_engine_tokens(self.search.beam, precision,
                                                     cfg.decoder_width)
        try:
            self.model = ct2.Translator(str(self.model_dir), device=self.device,
                                        device_index=self.device_index,
                                        compute_type=self.compute_type,
                                        inter_threads=self.inter_threads,
                                        intra_threads=thread_share(self.threads,
                                                                   self.inter_threads))
        except (RuntimeError, ValueError) as e:
            raise NmtError(f"CTranslate2 cannot load {self.model_dir} on {self.device} as "
                           f"{self.compute_type}: {' '.join(str(e).split())}") from None
        self.ct2_version = ct2.__version__

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike | Sequence, *,
                        search: SearchConfig | None = None, batch: BatchConfig | None = None,
                        device: str | None = None, precision: str = "fp32",
                        threads: int | None = None, sampling=None,
                        tree_constraints: bool | None = None) -> "CTranslate2Translator":
        """Convert (once, cached) and load ``path``; the options as Translator.from_checkpoint
        takes them, and ``threads`` (CTranslate2's intra-op threads; None: one per usable
        CPU)."""
        if not isinstance(path, (str, os.PathLike)):
            paths = list(path)
            if len(paths) != 1:
                raise UsageError("--engine ctranslate2 decodes with one checkpoint: an "
                                 "ensemble needs --engine nmt")
            path = paths[0]
            if not isinstance(path, (str, os.PathLike)):
                raise UsageError("--engine ctranslate2 takes a checkpoint file, not a "
                                 "checkpoint loaded in memory")
        _check_precision(precision)
        if sampling is not None:
            raise UsageError("--engine ctranslate2 does not sample as nmt does (its random "
                             "draws differ): use --engine nmt for --sampling")
        if tree_constraints:
            raise UsageError("--engine ctranslate2 cannot decode under tree constraints: "
                             "use --engine nmt")
        entry = converted_model(path, stored_weights(precision))
        meta = json.loads((entry / META).read_text(encoding="utf-8"))
        return cls(entry, meta, search=search, batch=batch, device=device or "auto",
                   precision=precision, threads=threads)

    # --- what the pipeline asks ---------------------------------------------------------------
    @property
    def max_positions(self) -> int | None:
        return self._max_positions

    def describe(self) -> str:
        at_once = f", {self.inter_threads} batches at once" if self.inter_threads > 1 else ""
        return (f"CTranslate2 {self.ct2_version} on {self.device}, {self.compute_type}, "
                f"{self.threads} thread(s){at_once}")

    def _parallel(self) -> int:
        return self.inter_threads

    def check_search(self, search: SearchConfig) -> None:
        refused = []
        if search.formula not in FORMULAS and search.beam > 1 and search.lenpen:
            refused.append(f"the {search.formula} length-penalty rule (use gnmt or fairseq)")
        if search.unkpen not in (0.0, math.inf):
            refused.append("a finite --unkpen (inf, never <unk>, is supported)")
        if search.diverse_beam_groups > 1:
            refused.append("diverse beam groups")
        if search.replace_unk:
            refused.append("--replace-unk")
        if refused:
            raise UsageError("--engine ctranslate2 cannot decode with " + "; ".join(refused)
                             + ": use --engine nmt")

    def check_targets(self, prefixes, constraints) -> None:
        given = [name for name, x in (("forced prefixes", prefixes),
                                      ("lexical constraints", constraints))
                 if x is not None and any(x)]
        if given:
            raise UsageError(f"--engine ctranslate2 does not decode with {' or '.join(given)}: "
                             f"use --engine nmt")

    def _limit(self, source_len: int, line: int) -> int:
        """nmt's length limit (nmt.search.generator.max_lengths) for one source."""
        limit = length_limit(source_len, self.search, self._max_positions)
        if limit > self._max_output:
            raise NmtError(f"line {line}: its length limit ({limit} tokens) is longer than the "
                           f"{self._max_output} the converted model has positions for: lower "
                           f"--max-len-a/--max-len-b or use --engine nmt")
        return limit

    def _decode_batch(self, batch, arrays, lines, prefixes, constraints, scores=True):
        """One translate_batch call for the whole batch, up to its longest length limit; a
        sentence whose search ran into its own, shorter limit is decoded again with it
        (CTranslate2's max_decoding_length is one number per call), or, in greedy search,
        cut to its limit and given the forced eos. A search that ended before its limit is
        the search the limit would have given: its steps never came near it. Greedy search
        without ``scores`` skips what only the scores need: CTranslate2's softmax over the
        vocabulary at each step, and the scoring pass of the forced eos."""
        self.check_search(self.search)
        limits = {i: self._limit(arrays[i].size, lines[i]) for i in batch}
        # nmt: with a limit of 0 only eos may follow
        out = {i: [_Hypothesis([EOS], 0.0)] for i in batch if limits[i] == 0}
        rows = [i for i in batch if limits[i] > 0]
        if rows:
            longest = max(limits[i] for i in rows)
            again: dict[int, list[int]] = {}
            cut: dict[int, list[int]] = {}     # greedy: the output's first `limit` tokens
            for i, hyps in zip(rows, self._call(rows, arrays, longest, scores)):
                # every finished hypothesis: the longest ended the search (when more than a
                # beam finish at once, one of the last step's is among the beam kept)
                if not any(len(h.tokens) - 1 >= limits[i] for h in hyps):
                    out[i] = hyps
                elif self.search.beam == 1:
                    # Greedy: before its limit nothing is forced, so the search with its own
                    # limit is this one's first `limit` tokens, then the forced eos (also at
                    # the longest limit, for that eos's probability)
                    cut[i] = hyps[0].tokens[:limits[i]]
                elif limits[i] < longest:
                    again.setdefault(limits[i], []).append(i)
                else:
                    out[i] = hyps
            if cut and not scores:
                out.update((i, [_Hypothesis([*p, EOS], None)]) for i, p in cut.items())
            elif cut:           # one scoring pass instead of a decoding call per limit
                out.update(zip(cut, self._end_at(list(cut), arrays, list(cut.values()))))
            for limit, group in again.items():
                out.update(zip(group, self._call(group, arrays, limit)))
        return [out[i][:self.search.nbest] for i in batch]

    def _end_at(self, rows: list[int], arrays, prefixes: list[list[int]]
                ) -> list[list[_Hypothesis]]:
        """``prefixes[j]`` (target ids) ended with eos, scored as nmt's search scores a forced
        eos: the model's log-probabilities of the prefix and of eos after it."""
        src, tgt = self.src_codec.dictionary.symbols, self.tgt_codec.dictionary.symbols
        results = self.model.score_batch([[src[t] for t in arrays[i]] for i in rows],
                                         [[tgt[t] for t in p] for p in prefixes],
                                         max_batch_size=0, max_input_length=0)
        return [[self._nmt_scored([*p, EOS], sum(r.log_probs))]
                for p, r in zip(prefixes, results)]

    def _call(self, rows: list[int], arrays, limit: int, scores: bool = True
              ) -> list[list[_Hypothesis]]:
        """CTranslate2's hypotheses for ``arrays[i]``, i in ``rows``, with at most ``limit``
        tokens: the (up to) ``beam`` finished ones, ranked by nmt's score (ties: CTranslate2's
        order). Greedy search without ``scores``: one hypothesis each, its score None."""
        s = self.search
        scored = scores or s.beam > 1      # beam search ranks by nmt's score: it needs them
        symbols = self.src_codec.dictionary.symbols
        index = self.tgt_codec.dictionary.index
        results = self.model.translate_batch(
            [[symbols[t] for t in arrays[i]] for i in rows], beam_size=s.beam,
            num_hypotheses=s.beam, length_penalty=TINY_LENPEN if s.beam > 1 else 0.0,
            return_scores=scored, min_decoding_length=min(s.minimum, limit),
            max_decoding_length=limit, max_input_length=0,
            no_repeat_ngram_size=s.no_repeat_ngram_size, disable_unk=s.unkpen == math.inf,
            max_batch_size=0)
        if not scored:
            return [[_Hypothesis([index(t) for t in r.hypotheses[0]] + [EOS], None)]
                    for r in results]
        out = []
        for r in results:
            hyps = [self._scored(tokens, score, index) for tokens, score
                    in zip(r.hypotheses, r.scores)]
            hyps.sort(key=lambda h: -h.score)        # stable
            out.append(hyps)
        return out

    def _scored(self, tokens: list[str], score: float, index) -> _Hypothesis:
        return self._nmt_scored([index(t) for t in tokens] + [EOS], score)

    def _nmt_scored(self, ids: list[int], log_prob: float) -> _Hypothesis:
        """``ids`` (ending with eos) and their log-probability, scored by nmt's formula."""
        from nmt.search.length_penalty import length_penalty

        s = self.search
        return _Hypothesis(ids, float(log_prob) / length_penalty(len(ids), s.lenpen, s.formula))


def _ct2_device(ct2, device: str | None) -> tuple[str, int]:
    """CTranslate2's (device, device_index): cpu, or cuda and a GPU index. auto means cuda
    when CTranslate2 sees a GPU; cuda without an index means GPU LOCAL_RANK under torchrun
    (modulo the GPUs), as nmt.runtime.resolve_device does."""
    from nmt.runtime import env_dist_info

    name = str(device or "auto")
    gpus = ct2.get_cuda_device_count()
    if name == "cpu" or (name == "auto" and not gpus):
        return "cpu", 0
    if name in ("auto", "cuda"):
        if not gpus:
            raise UsageError("--device cuda: CTranslate2 sees no GPU")
        return "cuda", env_dist_info().local_rank % gpus
    if name.startswith("cuda:") and name[5:].isdigit():
        return "cuda", int(name[5:])
    raise UsageError(f"unknown device '{name}' for --engine ctranslate2 (cpu, cuda, cuda:N or "
                     f"auto)")


__all__ = ["CTranslate2Translator", "converted_model", "cache_key", "CACHE_NAME"]
