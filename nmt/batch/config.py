"""nmt-generate's command line, written once: each field of ``GenerateConfig`` is an option
(nmt.fields.option) with its default and help; ``.search``, ``.batch`` and
``.sampling_config`` hand the library its part (nmt.search.config).

    cfg = GenerateConfig(beam=5, max_tokens=4096)
    Translator.from_checkpoint("ckpt.pt", search=cfg.search, batch=cfg.batch)
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt.config import CHOICES
from nmt.engines import ENGINES
from nmt.errors import UsageError
from nmt.fields import option
from nmt.search.config import BatchConfig, SamplingConfig, SearchConfig

OUTPUT_FORMATS = ("text", "jsonl")
INPUT_FORMATS = ("text", "jsonl")


@dataclass
class GenerateConfig:
    """What nmt-generate reads, how it decodes and batches, and what it writes."""

    input_path: str | None = option(
        None, "Source sentences, one per line, raw text (default: stdin; with no CHECKPOINT: "
              "the --split of the checkpoint's data directory).",
        flag="--input", short="-i", metavar="PATH")
    output_path: str | None = option(
        None, "Write here instead of stdout (under a temporary name, renamed at the end; a "
              "FIFO or a device is written through, a symbolic link's file is written).",
        flag="--output", short="-o", metavar="PATH")
    # --- decoding (SearchConfig; None: the checkpoint's preset) ---
    engine: str = option(
        "nmt", "What decodes: nmt (PyTorch; every option) or ctranslate2 (pip install "
               "'nmt[export]'): the checkpoint is converted once, cached in "
               ".nmt-ctranslate2/ beside it, and decoded by CTranslate2 with nmt's text "
               "pipeline, greedy or beam search as nmt's; what it cannot decode as nmt does "
               "(an ensemble, --sampling, prefixes and constraints, --replace-unk, "
               "--score-reference, --print-alignment, ...) is refused.", choices=ENGINES)
    beam: int | None = option(
        SearchConfig.beam, "Beam size [default: the checkpoint's preset, 4 for translation].",
        short="-b")
    lenpen: float | None = option(
        SearchConfig.lenpen, "Length penalty alpha: scores are log P / ((5+|Y|)/6)^alpha "
                             "with --lenpen-formula gnmt [default: the preset's, 0.6].")
    lenpen_formula: str | None = option(
        SearchConfig.lenpen_formula,
        "How --lenpen normalizes: gnmt ((5+|Y|)/6)^alpha, nmt's; fairseq |Y|^alpha, as "
        "fairseq-generate; hf |Y|^alpha with transformers' rule for when a sentence's beam "
        "search is done, as its generate(). |Y| counts the eos [default: the preset's, gnmt; "
        "an imported model's: its toolkit's].", choices=CHOICES["lenpen_formula"],
        show_default=False)
    max_len_a: float | None = option(
        SearchConfig.max_len_a,
        "Output length limit a*source_length + b, a [default: the preset's, 1].")
    max_len_b: int | None = option(SearchConfig.max_len_b,
                                   "... and b [default: the preset's, 50].")
    nbest: int = option(
        SearchConfig.nbest, "Hypotheses per sentence (<= beam; with --sampling, samples, "
                            "any number). Text output: NBEST lines per input line, best "
                            "first, empty lines filling up; jsonl: an 'nbest' list.")
    # --- controls (nmt.search.controls), as fairseq-generate's ---
    min_len: int | None = option(
        SearchConfig.min_len, "No eos before this many output tokens (subwords; at the length "
                              "limit the eos comes all the same) [default: the preset's: 0, "
                              "1 for a fairseq import, as fairseq-generate].", metavar="N")
    no_repeat_ngram_size: int = option(
        SearchConfig.no_repeat_ngram_size,
        "No n-gram of N subwords twice in an output (0: off).", metavar="N")
    unkpen: float = option(
        SearchConfig.unkpen, "Subtract this from <unk>'s log-probability at each step "
                             "(positive: fewer unknown words in the output).")
    replace_unk: bool = option(
        SearchConfig.replace_unk,
        "Replace each output word holding <unk> by the source word it is aligned to (the "
        "attention of --align-layer; copied as it is, no dictionary).")
    diverse_beam_groups: int = option(
        SearchConfig.diverse_beam_groups,
        "Diverse beam search (Vijayakumar et al. 2018): split the beam into this many groups, "
        "each penalized for the tokens earlier groups chose at the same step (it must divide "
        "--beam; with --nbest, the n-best list spans the groups).", metavar="G")
    diverse_beam_strength: float = option(
        SearchConfig.diverse_beam_strength,
        "--diverse-beam-groups: the penalty (in log-probability) per earlier group's choice of "
        "the same token.")
    # --- batching (BatchConfig) ---
    batch_size: int | None = option(
        BatchConfig.batch_size, "Sentences per batch [default: no limit; the batch is sized "
                                "by --max-tokens].")
    max_tokens: int | None = option(BatchConfig.max_tokens,
                                    "Source tokens (padding included) per batch [default: "
                                    "8192 // beam (at least 256) when --batch-size is not "
                                    "given either; up to 4x that (at most 8192) for a "
                                    "decoder narrower than transformer_small's, but with "
                                    "--engine ctranslate2 in --precision int8 only; 2048 "
                                    "with --engine ctranslate2 decoding batches two at "
                                    "once (in int8 2048 // beam, 256 to 1024, up to 2048 "
                                    "for a narrower decoder)].")
    max_source_len: int = option(
        BatchConfig.max_source_len, "Longer sources (in subwords) are truncated with a warning "
                                    "naming the line (also capped by the model's learned "
                                    "positions).")
    parallel_batches: int | None = option(
        BatchConfig.parallel, "Batches decoded at once on a CPU, each on --threads // N "
                              "threads (as CTranslate2's inter_threads) [default, with 2 or "
                              "more threads: 2 for beam search with a decoder of up to 1024 "
                              "layers x d_model (transformer_small: 768), and for --engine "
                              "ctranslate2 (then in batches of 2048 source tokens; in int8 "
                              "2048 // beam, 256 to 1024, up to 2048 for a narrower decoder); "
                              "else 1].",
        metavar="N",
        show_default=False)
    # --- input and output ---
    buffer_size: int = option(
        10000, "Translate at most this many lines at a time (memory holds one such chunk, "
               "whatever the input's size); stdin: what has arrived, as soon as no more input "
               "is pending (a program that writes a line and waits gets its translation; a "
               "file piped in fills whole chunks).")
    split: str | None = option(
        None, "Translate this split of the checkpoint's data directory (the one it was trained "
              "on) instead of stdin [default: test when no CHECKPOINT is given, else stdin].",
        show_default=False)
    input_format: str = option(
        "text", "text: one raw sentence per line; jsonl: one object per line, {\"source\": "
                "...}, optionally with \"prefix\" (the translation starts with it, then beam "
                "search goes on), \"constraints\" (a list of phrases the translation must "
                "contain: lexically constrained beam search with dynamic beam allocation) and "
                "\"target\" (for --score-reference).",
        choices=INPUT_FORMATS)
    output_format: str = option(
        "text", "text: detokenized translations; jsonl: one object per line with id, source, "
                "translation, score, tokens and token_scores.", choices=OUTPUT_FORMATS)
    # --- scoring given pairs, alignments ---
    score_reference: bool = option(
        False, "Score given pairs instead of translating: for each input line, the model's "
               "log-probability of its target (jsonl \"target\", or the same line of "
               "--reference). Text output: total, per-token and length-normalized "
               "log-probability, tab-separated; jsonl: an object with all three. Not with "
               "--nbest, --sampling or --print-alignment.")
    reference: str | None = option(
        None, "--score-reference with text input: the targets, one per line of the input.",
        metavar="PATH", aliases=("--ref",))
    print_alignment: bool = option(
        False, "jsonl output: add \"alignment\", for each target word the source word its "
               "encoder-decoder attention weighs most (head-averaged), and "
               "\"alignment_subwords\", the same on subwords.")
    align_layer: int | None = option(
        None, "Decoder layer of --print-alignment (0-based, negative counts from the top) "
              "[default: the penultimate, whose attention aligns best in 6-layer Transformers "
              "(Garg et al. 2019); small models may align better with the last: check on "
              "your data].", show_default=False)
    # --- sampling (nmt.search.sampling) ---
    sampling: bool = option(
        False, "Draw each output token from the model's distribution instead of beam search "
               "(e.g. for back-translation); --nbest gives several samples. Reproducible: "
               "each line draws from (--seed, its line number), so the output depends neither "
               "on the batch size nor on the other lines.")
    topk: int | None = option(None, "--sampling: draw from the K most probable tokens only "
                                    "[default: all].", metavar="K", show_default=False)
    topp: float | None = option(None, "--sampling: draw from the smallest set of tokens "
                                      "holding this much probability, in (0, 1] "
                                      "[default: 1].", metavar="P", show_default=False)
    temperature: float | None = option(None, "--sampling: divide log-probabilities by T "
                                             "before drawing [default: 1].", metavar="T",
                                       show_default=False)
    seed: int | None = option(None, "--sampling: random seed [default: 1].", show_default=False)
    # --- parsing ---
    tree_constraints: bool | None = option(
        None, "Parsing: constrained decoding, every output a well-formed linearized tree "
              "(brackets open before they close, with matching labels and a word each; one XX, "
              "or the word itself in lexicalized trees, per source word, in order; room kept "
              "to close within the length limit). Default: on for a parsing checkpoint (the "
              "task it records; one from before checkpoints recorded it is recognized by its "
              "target dictionary: XX and only bracket symbols besides the specials, or no XX "
              "and the brackets of at least 3 phrase labels besides words); "
              "--tree-constraints forces it on.",
        negatable=True, show_default=False)

    def __post_init__(self) -> None:
        if self.buffer_size < 1:
            raise UsageError(f"--buffer-size must be >= 1, got {self.buffer_size}")
        for name in ("topk", "topp", "temperature", "seed"):
            if getattr(self, name) is not None and not self.sampling:
                raise UsageError(f"--{name} goes with --sampling")
        if self.input_format not in INPUT_FORMATS:
            raise UsageError(f"unknown input format '{self.input_format}' "
                             f"(choose from {', '.join(INPUT_FORMATS)})")
        if self.print_alignment and self.output_format != "jsonl":
            raise UsageError("--print-alignment needs --output-format jsonl")
        if self.align_layer is not None and not (self.print_alignment or self.replace_unk):
            raise UsageError("--align-layer goes with --print-alignment or --replace-unk")
        if self.sampling and self.diverse_beam_groups > 1:
            raise UsageError("--diverse-beam-groups is a beam search: it does not go with "
                             "--sampling")
        if self.reference is not None and not self.score_reference:
            raise UsageError("--reference goes with --score-reference")
        if self.reference is not None and self.input_format == "jsonl":
            raise UsageError("--reference and --input-format jsonl: the targets are the jsonl "
                             "lines' \"target\"; leave --reference out")
        if self.split is not None and self.print_alignment:
            raise UsageError("--print-alignment translates an --input: it does not go with "
                             "--split")
        if self.score_reference and (self.sampling or self.print_alignment or self.nbest != 1):
            raise UsageError("--score-reference scores given pairs, one score per pair: it "
                             "does not go with --sampling, --print-alignment or --nbest")
        if self.score_reference and self.input_format == "text" and self.reference is None:
            raise UsageError("--score-reference needs the targets: --reference FILE, or "
                             "--input-format jsonl with a \"target\" on each line")
        if self.sampling:
            self.sampling_config     # checks --topk/--topp/--temperature
        if self.output_format not in OUTPUT_FORMATS:
            raise UsageError(f"unknown output format '{self.output_format}' "
                             f"(choose from {', '.join(OUTPUT_FORMATS)})")
        if self.engine not in ENGINES:
            raise UsageError(f"unknown engine '{self.engine}' (choose from {', '.join(ENGINES)})")
        if self.engine != "nmt":
            given = [flag for flag, on in (("--sampling", self.sampling),
                                           ("--score-reference", self.score_reference),
                                           ("--print-alignment", self.print_alignment),
                                           ("--replace-unk", self.replace_unk),
                                           ("--diverse-beam-groups",
                                            self.diverse_beam_groups > 1),
                                           ("--tree-constraints", self.tree_constraints))
                     if on]
            if given:
                raise UsageError(f"--engine {self.engine} does not decode with "
                                 f"{', '.join(given)}: use --engine nmt")
        _ = self.search, self.batch       # bad values fail now, before any loading

    @property
    def search(self) -> SearchConfig:
        """The decoding options (unset ones: the checkpoint's preset)."""
        # Sampling draws --nbest samples whatever --beam says, so its search is --nbest rows a
        # sentence (what batches are sized by), as nmt-serve's sampling requests are.
        beam = self.nbest if self.sampling else self.beam
        return SearchConfig(beam=beam, lenpen=self.lenpen, lenpen_formula=self.lenpen_formula,
                            max_len_a=self.max_len_a,
                            max_len_b=self.max_len_b, nbest=self.nbest,
                            min_len=self.min_len, no_repeat_ngram_size=self.no_repeat_ngram_size,
                            unkpen=self.unkpen, replace_unk=self.replace_unk,
                            diverse_beam_groups=self.diverse_beam_groups,
                            diverse_beam_strength=self.diverse_beam_strength)

    @property
    def sampling_config(self):
        return SamplingConfig(topk=self.topk or 0, topp=1.0 if self.topp is None else self.topp,
                              temperature=1.0 if self.temperature is None else self.temperature,
                              seed=1 if self.seed is None else self.seed)

    @property
    def batch(self) -> BatchConfig:
        return BatchConfig(batch_size=self.batch_size, max_tokens=self.max_tokens,
                           max_source_len=self.max_source_len, parallel=self.parallel_batches)


__all__ = ["GenerateConfig", "OUTPUT_FORMATS", "INPUT_FORMATS"]
