"""Decoding, batching and nmt-generate options: plain dataclasses, importable without torch.

``SearchConfig`` (how beam search decodes) and ``BatchConfig`` (how the Translator batches) are
what the library takes; ``GenerateConfig`` is nmt-generate's command line: each of its fields
is an option (nmt.options.option), its default and help written here once.

    from nmt.search.config import GenerateConfig, SearchConfig
    SearchConfig(beam=5).resolve(model_cfg)          # unset fields: the model's preset
    cfg = GenerateConfig(beam=5, max_tokens=4096)
    Translator.from_checkpoint("ckpt.pt", search=cfg.search, batch=cfg.batch)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nmt.config import ModelConfig
from nmt.errors import UsageError
from nmt.options import option


@dataclass(frozen=True)
class SearchConfig:
    """How to decode. A field left None means "the model's preset" (``ModelConfig.beam``,
    ``.lenpen``, ``.max_len_a``, ``.max_len_b``): :meth:`resolve` fills them in, and
    :func:`nmt.search.generator.beam_search` needs a resolved config.

        SearchConfig(beam=5).resolve(model_cfg)    # beam 5, the preset's length settings
        SearchConfig(beam=1, lenpen=0.0, max_len_a=1.0, max_len_b=50)   # resolved already
    """

    beam: int | None = None
    lenpen: float | None = None       # alpha of the length penalty; 0 ranks by log-probability
    max_len_a: float | None = None    # at most floor(a * source_length + b) tokens before eos
    max_len_b: int | None = None
    nbest: int = 1                    # hypotheses returned per sentence, best first

    def __post_init__(self) -> None:
        if self.beam is not None and self.beam < 1:
            raise UsageError(f"beam must be >= 1, got {self.beam}")
        if self.nbest < 1 or (self.beam is not None and self.nbest > self.beam):
            raise UsageError(f"nbest must be between 1 and the beam size "
                             f"({'the preset' if self.beam is None else self.beam}), "
                             f"got {self.nbest}")
        if self.lenpen is not None and self.lenpen < 0:
            raise UsageError(f"lenpen must be >= 0, got {self.lenpen}")
        if (self.max_len_a or 0) < 0 or (self.max_len_b or 0) < 0:
            raise UsageError(f"max-len-a and max-len-b must be >= 0, got "
                             f"{self.max_len_a} and {self.max_len_b}")

    @property
    def unset(self) -> list[str]:
        """The fields still meaning "the preset's"."""
        return [k for k in _PRESET_FIELDS if getattr(self, k) is None]

    def resolve(self, preset: ModelConfig | None = None) -> "SearchConfig":
        """This config with its unset fields taken from ``preset`` (a ModelConfig, or anything
        with beam/lenpen/max_len_a/max_len_b; None: ModelConfig's defaults, the paper's
        beam 4, alpha 0.6, source length + 50)."""
        if not self.unset:
            return self
        preset = ModelConfig() if preset is None else preset
        return replace(self, **{k: getattr(preset, k) for k in self.unset})


_PRESET_FIELDS = ("beam", "lenpen", "max_len_a", "max_len_b")


DEFAULT_BATCH_SIZE = 64


@dataclass(frozen=True)
class BatchConfig:
    """How sources are batched: at most ``batch_size`` sentences and/or ``max_tokens`` source
    tokens (padding included) per batch, ``DEFAULT_BATCH_SIZE`` sentences when neither is set;
    sources longer than ``max_source_len`` subwords are truncated (the model's learned positions
    may lower that limit). The batching never changes the translations."""

    batch_size: int | None = None
    max_tokens: int | None = None
    max_source_len: int = 1024

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size < 1:
            raise UsageError(f"batch size must be >= 1, got {self.batch_size}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise UsageError(f"max tokens must be >= 1, got {self.max_tokens}")
        if self.max_source_len < 1:
            raise UsageError(f"max source length must be >= 1, got {self.max_source_len}")

    @property
    def sentences(self) -> int | None:
        """The sentence limit in force (None: only ``max_tokens``)."""
        if self.batch_size is None and self.max_tokens is None:
            return DEFAULT_BATCH_SIZE
        return self.batch_size


OUTPUT_FORMATS = ("text", "jsonl")


@dataclass
class GenerateConfig:
    """What nmt-generate reads, how it decodes and batches, and what it writes."""

    input_path: str | None = option(
        None, "Source sentences, one per line, raw text (default: stdin; with no CHECKPOINT: "
              "the --split of the checkpoint's data directory).",
        flag="--input", short="-i", metavar="PATH")
    output_path: str | None = option(
        None, "Write here instead of stdout (under a temporary name, renamed at the end).",
        flag="--output", short="-o", metavar="PATH")
    # --- decoding (SearchConfig; None: the checkpoint's preset) ---
    beam: int | None = option(
        SearchConfig.beam, "Beam size [default: the checkpoint's preset, 4 for translation].",
        short="-b")
    lenpen: float | None = option(
        SearchConfig.lenpen, "Length penalty alpha: scores are log P / ((5+|Y|)/6)^alpha "
                             "[default: the preset's, 0.6].")
    max_len_a: float | None = option(
        SearchConfig.max_len_a,
        "Output length limit a*source_length + b, a [default: the preset's, 1].")
    max_len_b: int | None = option(SearchConfig.max_len_b,
                                   "... and b [default: the preset's, 50].")
    nbest: int = option(
        SearchConfig.nbest, "Hypotheses per sentence (<= beam). Text output: NBEST lines per "
                            "input line, best first, empty lines filling up; jsonl: an 'nbest' "
                            "list.")
    # --- batching (BatchConfig) ---
    batch_size: int | None = option(
        BatchConfig.batch_size, "Sentences per batch [default: 64 unless --max-tokens is given].")
    max_tokens: int | None = option(BatchConfig.max_tokens,
                                    "Source tokens (padding included) per batch.")
    max_source_len: int = option(
        BatchConfig.max_source_len, "Longer sources (in subwords) are truncated with a warning "
                                    "naming the line (also capped by the model's learned "
                                    "positions).")
    # --- input and output ---
    split: str | None = option(
        None, "Translate this split of the checkpoint's data directory (the one it was trained "
              "on) instead of stdin [default: test when no CHECKPOINT is given, else stdin].",
        show_default=False)
    output_format: str = option(
        "text", "text: detokenized translations; jsonl: one object per line with id, source, "
                "translation, score, tokens and token_scores.", choices=OUTPUT_FORMATS)
    # --- parsing ---
    tree_constraints: bool | None = option(
        None, "Parsing: constrained decoding, every output a well-formed linearized tree "
              "(brackets open before they close, with matching labels and a word each; one XX "
              "per source word; room kept to close within the length limit). Default: on for a "
              "parsing checkpoint, recognized by its target dictionary (XX and only bracket "
              "symbols besides the specials; checkpoints record no task); --tree-constraints "
              "forces it on, e.g. with a joined dictionary.", negatable=True, show_default=False)

    def __post_init__(self) -> None:
        if self.output_format not in OUTPUT_FORMATS:
            raise UsageError(f"unknown output format '{self.output_format}' "
                             f"(choose from {', '.join(OUTPUT_FORMATS)})")
        _ = self.search, self.batch       # bad values fail now, before any loading

    @property
    def search(self) -> SearchConfig:
        """The decoding options (unset ones: the checkpoint's preset)."""
        return SearchConfig(beam=self.beam, lenpen=self.lenpen, max_len_a=self.max_len_a,
                            max_len_b=self.max_len_b, nbest=self.nbest)

    @property
    def batch(self) -> BatchConfig:
        return BatchConfig(batch_size=self.batch_size, max_tokens=self.max_tokens,
                           max_source_len=self.max_source_len)


__all__ = ["SearchConfig", "BatchConfig", "GenerateConfig", "DEFAULT_BATCH_SIZE",
           "OUTPUT_FORMATS"]
