"""Decoding, batching and sampling options: plain dataclasses, importable without torch.

``SearchConfig`` (how beam search decodes), ``BatchConfig`` (how the Translator batches) and
``SamplingConfig`` (how sampling draws) are what the library takes; nmt-generate's command line
(its files and formats too) is ``nmt.batch.config.GenerateConfig``, built on these.

    from nmt.search.config import SearchConfig
    SearchConfig(beam=5).resolve(model_cfg)          # unset fields: the model's preset
    Translator.from_checkpoint("ckpt.pt", search=SearchConfig(beam=5))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from nmt.config import CHOICES, ModelConfig
from nmt.errors import UsageError


# Beyond these the arithmetic of a search overflows: the length penalty ((5 + |Y|) / 6) ** alpha
# or |Y| ** alpha passes float32's range near alpha 13 for 1,024-token outputs, and an <unk>
# boost of exp(-unkpen) passes float64's at unkpen -710. Nobody decodes near them on purpose
# (alpha is 0.6-2, unkpen a few nats), so a value past them is refused, not silently broken.
LENPEN_MAX = 10.0
UNKPEN_MIN = -50.0
MAX_LEN_B_MAX = 2 ** 31 - 1


@dataclass(frozen=True)
class SearchConfig:
    """How to decode. A field left None means "the model's preset" (``ModelConfig.beam``,
    ``.lenpen``, ``.max_len_a``, ``.max_len_b``, ``.min_len``): :meth:`resolve` fills them in, and
    :func:`nmt.search.generator.beam_search` needs a resolved config.

        SearchConfig(beam=5).resolve(model_cfg)    # beam 5, the preset's length settings
        SearchConfig(beam=1, lenpen=0.0, max_len_a=1.0, max_len_b=50)   # resolved already
    """

    beam: int | None = None
    lenpen: float | None = None       # alpha of the length penalty; 0 ranks by log-probability
    lenpen_formula: str | None = None  # gnmt, fairseq or hf (nmt.search.length_penalty)
    max_len_a: float | None = None    # at most floor(a * source_length + b) tokens before eos
    max_len_b: int | None = None
    nbest: int = 1                    # hypotheses returned per sentence, best first
    # Controls (nmt.search.controls), as fairseq-generate's options of the same names:
    min_len: int | None = None        # eos is forbidden before this many tokens (a preset field)
    no_repeat_ngram_size: int = 0     # no n-gram of this size twice in an output (0: off)
    unkpen: float = 0.0               # subtracted from <unk>'s log-probability at every step
    replace_unk: bool = False         # each <unk> of the output becomes its aligned source word
    diverse_beam_groups: int = 1      # diverse beam search (Vijayakumar et al. 2018): groups
    diverse_beam_strength: float = 0.5    # ... and the penalty per earlier group's same token

    def __post_init__(self) -> None:
        if self.beam is not None and self.beam < 1:
            raise UsageError(f"beam must be >= 1, got {self.beam}")
        if self.nbest < 1 or (self.beam is not None and self.nbest > self.beam):
            raise UsageError(f"nbest must be between 1 and the beam size "
                             f"({'the preset' if self.beam is None else self.beam}), "
                             f"got {self.nbest}")
        if self.lenpen is not None and not 0 <= self.lenpen <= LENPEN_MAX:
            raise UsageError(f"lenpen must be between 0 and {LENPEN_MAX:g}, got {self.lenpen}")
        if not (UNKPEN_MIN <= self.unkpen or self.unkpen == math.inf):
            raise UsageError(f"unkpen must be >= {UNKPEN_MIN:g} (a boost of <unk> by more "
                             f"than e^{-UNKPEN_MIN:g}), got {self.unkpen}")
        formulas = CHOICES["lenpen_formula"]
        if self.lenpen_formula is not None and self.lenpen_formula not in formulas:
            raise UsageError(f"unknown length penalty formula '{self.lenpen_formula}' "
                             f"(choose from {', '.join(formulas)})")
        for name in ("min_len", "no_repeat_ngram_size"):
            if (getattr(self, name) or 0) < 0:
                raise UsageError(f"{name.replace('_', '-')} must be >= 0, got "
                                 f"{getattr(self, name)}")
        if self.diverse_beam_groups < 1:
            raise UsageError(f"diverse-beam-groups must be >= 1, got {self.diverse_beam_groups}")
        if self.diverse_beam_groups > 1 and self.beam is not None \
                and self.beam % self.diverse_beam_groups:
            raise UsageError(f"diverse-beam-groups {self.diverse_beam_groups} must divide the "
                             f"beam size {self.beam}")
        if not self.diverse_beam_strength >= 0:
            raise UsageError(f"diverse-beam-strength must be >= 0, got "
                             f"{self.diverse_beam_strength}")
        a, b = self.max_len_a or 0, self.max_len_b or 0
        if not (0 <= a < math.inf and 0 <= b <= MAX_LEN_B_MAX):
            raise UsageError(f"max-len-a must be a finite number >= 0 and max-len-b between 0 "
                             f"and {MAX_LEN_B_MAX}, got {self.max_len_a} and {self.max_len_b}")

    @property
    def formula(self) -> str:
        """The length penalty formula; unset means nmt's own, GNMT's, so that a config written
        before formulas existed (beam, lenpen, max_len_a, max_len_b given) decodes as it did."""
        return self.lenpen_formula or "gnmt"

    @property
    def minimum(self) -> int:
        """min_len; unset means none, so that a config written before min_len was a preset
        field (beam, lenpen, max_len_a, max_len_b given) decodes as it did."""
        return self.min_len or 0

    @property
    def unset(self) -> list[str]:
        """The fields still meaning "the preset's"."""
        return [k for k in PRESET_FIELDS if getattr(self, k) is None]

    def resolve(self, preset: ModelConfig | None = None) -> "SearchConfig":
        """This config with its unset fields taken from ``preset`` (a ModelConfig, or anything
        with beam/lenpen/max_len_a/max_len_b; None: ModelConfig's defaults, the paper's
        beam 4, alpha 0.6, source length + 50, no minimum length). A preset without
        ``lenpen_formula`` or ``min_len`` (a scripted test model) means the GNMT formula and
        no minimum."""
        if not self.unset:
            return self
        preset = ModelConfig() if preset is None else preset
        optional = {"lenpen_formula": ModelConfig.lenpen_formula, "min_len": ModelConfig.min_len}
        return replace(self, **{k: getattr(preset, k, optional[k]) if k in optional
                                else getattr(preset, k) for k in self.unset})


def length_limit(source_len: int, cfg: SearchConfig, max_positions: int | None) -> int:
    """The most tokens before eos for a source of ``source_len`` subwords (without eos):
    floor(a * len + b), capped so that the decoder needs at most ``max_positions`` positions
    (None: no cap); the arithmetic of nmt.search.generator.max_lengths, without torch."""
    top = MAX_LEN_B_MAX if max_positions is None else max_positions - 1
    limit = math.floor(cfg.max_len_a * float(source_len) + cfg.max_len_b)
    return int(min(max(limit, 0), top))


# The fields that default to the model's preset (each also a --valid-<field> option of nmt-train:
# TrainConfig.valid_search).
PRESET_FIELDS = ("beam", "lenpen", "lenpen_formula", "max_len_a", "max_len_b", "min_len")


# The default batch: source tokens (padding included) x beam. 8192 // 4 = 2048 source tokens
# at beam 4, about 140 Multi30k sentences (560 decoder rows); 8192 at beam 1.
DEFAULT_SEARCH_TOKENS = 8192
# A decoder narrower than transformer_small's (decoder layers x d_model, 3 x 256) holds less per
# row and spends its steps on the fixed cost of each operation rather than on products, so its
# default batch holds WIDTH // its width times as many rows (at most 4x), up to
# DEFAULT_SEARCH_TOKENS source tokens: fewer batches at beam > 1, so fewer decoder steps in all
# (greedy decoding gained nothing measurable from more than 8192 tokens, for more memory).
DEFAULT_BATCH_WIDTH = 768
MAX_BATCH_SCALE = 4


def default_source_tokens(beam: int, width: int | None = None) -> int:
    """Source tokens per batch when neither a batch size nor a token budget is given, for a
    search with ``beam`` rows per sentence and a decoder of ``width`` = layers x d_model (None:
    not known, no scaling)."""
    scale = 1 if not width else max(1, min(MAX_BATCH_SCALE, DEFAULT_BATCH_WIDTH // width))
    return max(min(DEFAULT_SEARCH_TOKENS, DEFAULT_SEARCH_TOKENS * scale // max(beam, 1)), 256)


@dataclass(frozen=True)
class BatchConfig:
    """How sources are batched: at most ``batch_size`` sentences and/or ``max_tokens`` source
    tokens (padding included) per batch; when neither is set, ``DEFAULT_SEARCH_TOKENS`` // beam
    source tokens (``limits``: default_source_tokens), so that a batch holds about as many
    decoder rows whatever the beam: enough to keep the per-step cost of small models low, few
    enough to bound the memory of big ones (nmt's own engine, and the CTranslate2 engine in
    int8, pass their decoder's width: one narrower than transformer_small's gets up to 4x the
    rows, at most 8192 source tokens; the CTranslate2 engine decoding two batches at once takes
    parallel_engine_tokens). Sources longer than ``max_source_len`` subwords are truncated
    (the model's learned positions may lower that limit). ``parallel``: batches decoded at
    once on a CPU, each on its share of the threads (None: parallel_batches' choice). The
    batching never changes the translations (but with --precision int8, whose activation
    scales are per batch)."""

    batch_size: int | None = None
    max_tokens: int | None = None
    max_source_len: int = 1024
    # batches decoded at once on a CPU, each by its share of the threads (None: auto,
    # parallel_batches; 1: one at a time, on every thread)
    parallel: int | None = None

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size < 1:
            raise UsageError(f"batch size must be >= 1, got {self.batch_size}")
        if self.parallel is not None and self.parallel < 1:
            raise UsageError(f"parallel batches must be >= 1, got {self.parallel}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise UsageError(f"max tokens must be >= 1, got {self.max_tokens}")
        if self.max_source_len < 1:
            raise UsageError(f"max source length must be >= 1, got {self.max_source_len}")

    def limits(self, beam: int, width: int | None = None) -> tuple[int | None, int | None]:
        """(sentences, source tokens) per batch in force for a search with ``beam`` rows per
        sentence by a decoder of ``width`` = layers x d_model (None: unknown); None: no limit
        of that kind."""
        if self.batch_size is None and self.max_tokens is None:
            return None, default_source_tokens(beam, width)
        return self.batch_size, self.max_tokens


# Batches decoded at once by default (BatchConfig.parallel unset), each on its share of the
# threads, as CTranslate2's inter_threads. nmt's own engine: two for beam search with a decoder
# of up to 1024 layers x d_model (transformer_small: 768), where each PyTorch operation's fixed
# cost outweighs its work and two batches pay it side by side (whole nmt-generate runs on 2
# threads at beam 4 took 0.90x the time for transformer_tiny, 0.94x for transformer_small, for
# 36% more peak memory); greedy search and wider decoders gained nothing. CTranslate2: two at
# any width (its int8 ran slower with intra_threads 2 than 1 here, and 3.3x as fast two at
# once at transformer_small's beam 4), in batches of PARALLEL_ENGINE_TOKENS source tokens
# (parallel_engine_tokens).
PARALLEL_BATCH_WIDTH = 1024
PARALLEL_ENGINE_TOKENS = 2048


def parallel_engine_tokens(beam: int, precision: str, width: int | None = None) -> int:
    """The CTranslate2 engine's default source tokens per batch with two or more at once:
    PARALLEL_ENGINE_TOKENS; in int8, PARALLEL_ENGINE_TOKENS // ``beam`` (as many decoder
    rows at every beam), at least 256 and at most 1024, or at most PARALLEL_ENGINE_TOKENS
    for a decoder (``width`` = layers x d_model) narrower than transformer_small's.
    CTranslate2's int8 ran faster in smaller batches at beam 4 and nearly as fast greedy,
    with less memory (two at once, 2 threads of an AMD EPYC; peak RSS of the whole process):
    at beam 4, transformer_small 1.05x as fast at 512 source tokens as at 2048, 163 MB
    against 359, and a base-size model 1.11x, 302 MB against 556; greedy, transformer_small
    0.97x at 1024, 129 MB against 167, where transformer_tiny (93 MB at 2048) ran 0.96x.
    Its float32 ran 7% slower at 512 at beam 4 on transformer_small."""
    if precision != "int8":
        return PARALLEL_ENGINE_TOKENS
    narrow = width is not None and width < DEFAULT_BATCH_WIDTH
    most = PARALLEL_ENGINE_TOKENS if narrow else 1024
    return min(most, max(256, PARALLEL_ENGINE_TOKENS // max(beam, 1)))


def thread_share(threads: int, n: int) -> int:
    """Each of ``n`` parts sharing ``threads`` (batches decoded at once, worker processes)
    gets ``threads // n`` of them, at least one."""
    return max(1, threads // n)


def parallel_batches(requested: int | None, threads: int, width: int | None, beam: int,
                     on_cpu: bool = True, engine: str = "nmt") -> int:
    """How many batches to decode at once with ``threads`` CPU threads in all (each batch gets
    thread_share). ``requested`` None (auto): 2 on a CPU with at least 2 threads for
    ``engine`` "ctranslate2", and for nmt's own engine at ``beam`` > 1 with a decoder of known
    ``width`` (layers x d_model) up to PARALLEL_BATCH_WIDTH; else 1. A number is kept, capped
    by the threads (on a GPU: 1)."""
    if not on_cpu:
        return 1
    if requested is None:
        if threads < 2:
            return 1
        if engine == "ctranslate2":
            return 2
        return 2 if beam > 1 and width is not None and width <= PARALLEL_BATCH_WIDTH else 1
    return max(1, min(requested, threads))


@dataclass(frozen=True)
class SamplingConfig:
    topk: int = 0                 # keep the k most probable tokens (0: all)
    topp: float = 1.0             # keep the smallest set with this much probability (1: all)
    temperature: float = 1.0      # p ** (1 / temperature), renormalized
    seed: int = 1

    def __post_init__(self) -> None:
        if self.topk < 0:
            raise UsageError(f"--topk must be >= 0, got {self.topk}")
        if not 0.0 < self.topp <= 1.0:
            raise UsageError(f"--topp must be in (0, 1], got {self.topp}")
        if not self.temperature > 0.0:
            raise UsageError(f"--temperature must be > 0, got {self.temperature}")
        if self.seed < 0:
            raise UsageError(f"--seed must be >= 0, got {self.seed}")


__all__ = ["SearchConfig", "BatchConfig", "length_limit", "SamplingConfig", "DEFAULT_SEARCH_TOKENS", "PRESET_FIELDS",
           "default_source_tokens", "parallel_batches", "PARALLEL_BATCH_WIDTH",
           "PARALLEL_ENGINE_TOKENS", "parallel_engine_tokens", "thread_share"]
