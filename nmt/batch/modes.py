"""What nmt-generate does with its input besides plain translation: jsonl requests (forced
prefixes, lexical constraints), alignments added to jsonl output, and scoring given pairs
(--score-reference)."""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from nmt.errors import NmtError
from nmt.batch.config import GenerateConfig
from nmt.specials import EOS



# Characters that str.splitlines() (and some editors, and JavaScript before ES2019) take for
# line ends: escaped, so that one JSON line is one line to every reader.
_LINE_ENDS = str.maketrans({"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def json_line(obj) -> str:
    """One JSON object on one line, UTF-8 text kept as it is (but for the line ends above)."""
    return json.dumps(obj, ensure_ascii=False).translate(_LINE_ENDS)

def format_result(result, output_format: str, nbest: int) -> str:
    """The output text of one input line: 1 line (text, jsonl) or ``nbest`` lines (text)."""
    if output_format == "jsonl":
        return json_line(result.to_json())
    # A line break inside a translation (a byte-fallback subword could produce one) would
    # shift every following line: it becomes a space.
    texts = [_one_line(h.text) for h in result.hypotheses[:nbest]]
    texts += [""] * (nbest - len(texts))
    return "\n".join(texts)


def lines_per_result(output_format: str, nbest: int) -> int:
    """How many output lines format_result gives each input line: ``nbest`` (text), 1 (jsonl)."""
    return 1 if output_format == "jsonl" else nbest


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


def build_translator(sources: Sequence, cfg: GenerateConfig, device: str, precision: str,
                     threads: int | None = None):
    """The translator of ``cfg``'s engine and decoding options over ``sources`` (checkpoint
    paths, or loaded checkpoints for --engine nmt); ``threads``: CTranslate2's (nmt's own
    engine uses torch's, set by the command)."""
    if cfg.engine == "ctranslate2":
        from nmt.engines.ctranslate2 import CTranslate2Translator

        return CTranslate2Translator.from_checkpoint(
            sources, search=cfg.search, batch=cfg.batch, device=device, precision=precision,
            threads=threads)
    from nmt.search.translator import Translator

    translator = Translator.from_checkpoint(
        sources, search=cfg.search, batch=cfg.batch, device=device, precision=precision,
        sampling=cfg.sampling_config if cfg.sampling else None,
        tree_constraints=cfg.tree_constraints)
    translator.align_layer = cfg.align_layer
    return translator


def translate_chunk(translator, cfg: GenerateConfig, chunk: list, first: int,
                    progress: Callable[[int], None] | None) -> tuple[list, list[str]]:
    """The results and output lines of one chunk of input: raw lines (text input) or
    nmt.search.jsonl_input.Request objects (jsonl input, parsed by the caller)."""

    prefixes = constraints = None
    if cfg.input_format == "jsonl":
        lines = [r.source for r in chunk]
        if any(r.prefix for r in chunk):
            prefixes = [r.prefix for r in chunk]
        if any(r.constraints for r in chunk):
            constraints = [r.constraints for r in chunk]
    else:
        lines = chunk
    results = translator.translate_results(lines, progress=progress, first_line=first,
                                           prefixes=prefixes, constraints=constraints,
                                           scores=cfg.output_format == "jsonl")
    if cfg.output_format != "jsonl" or (prefixes is None and constraints is None
                                        and not cfg.print_alignment):
        return results, [format_result(r, cfg.output_format, cfg.nbest) for r in results]
    extra = alignments(translator, results, cfg.align_layer) if cfg.print_alignment \
        else [{} for _ in results]
    for i, r in enumerate(results):
        if prefixes is not None and prefixes[i]:
            extra[i]["prefix"] = prefixes[i]
        if constraints is not None and constraints[i]:
            extra[i]["constraints"] = constraints[i]
    return results, [json_line({**r.to_json(), **e})
                     for r, e in zip(results, extra)]


def alignments(translator, results, layer: int | None) -> list[dict[str, Any]]:
    """Per result, the best translation's alignment in Pharaoh format ("source-target" index
    pairs): on words ("alignment") and on subwords ("alignment_subwords")."""
    from nmt.search.forced import align, to_pharaoh, words_alignment

    src_codec, tgt_codec = translator.src_codec, translator.tgt_codec
    src_ids = [list(src_codec.encode(r.source))[:translator.max_source_len] for r in results]
    tgt_ids = [[i for i in (r.hypotheses[0].ids if r.hypotheses else []) if i != EOS]
               for r in results]
    sub = align(translator, src_ids, tgt_ids, layer)
    out = []
    for s, t, a in zip(src_ids, tgt_ids, sub):
        sp = [src_codec.dictionary[i] for i in s]
        tp = [tgt_codec.dictionary[i] for i in t]
        words = words_alignment(sp, tp, a, src_kind=src_codec.kind,
                                tgt_kind=tgt_codec.kind) if t else []
        out.append({"alignment": to_pharaoh(words), "alignment_subwords": to_pharaoh(a)})
    return out


def score_reference(translator, cfg: GenerateConfig, out,
                    progress: Callable[[int], None] | None) -> None:
    """--score-reference: one line per input pair (text: total, per-token and normalized
    log-probability, tab-separated; jsonl: an object), written with ``out.write(text,
    pairs)`` (nmt-generate's writer). Everything is read and checked before anything is
    written."""
    from nmt.io import read_lines
    from nmt.search.forced import score_pairs

    name = cfg.input_path if cfg.input_path not in (None, "-") else "<stdin>"
    lines = read_lines(None if name == "<stdin>" else cfg.input_path)
    sources, targets = _pairs(cfg, lines, name)
    scores = score_pairs(translator, sources, targets, progress=progress)
    if cfg.output_format == "jsonl":
        text = "".join(json.dumps(s.to_json()) + "\n" for s in scores)
    else:
        text = "".join(f"{s.log_prob:.6f}\t{s.per_token:.6f}\t{s.score:.6f}\n" for s in scores)
    out.write(text, len(scores))


def _pairs(cfg: GenerateConfig, lines: Sequence[str], name: str
           ) -> tuple[list[str], list[str]]:
    from nmt.io import read_lines

    if cfg.input_format == "jsonl":
        from nmt.search.jsonl_input import parse_requests

        requests = parse_requests(list(lines), 1, name)
        # a blank line is an empty pair, as an empty line of a text file with --reference
        missing = next((i for i, r in enumerate(requests)
                        if r.target is None and lines[i].strip()), None)
        if missing is not None:
            raise NmtError(f"{name}: line {missing + 1}: no \"target\" to score")
        return [r.source for r in requests], [r.target or "" for r in requests]
    targets = read_lines(cfg.reference)
    if len(targets) != len(lines):
        raise NmtError(f"{cfg.reference} has {len(targets)} lines but {name} has "
                       f"{len(lines)}: --score-reference needs one target per source line")
    return list(lines), targets


__all__ = ["build_translator", "lines_per_result", "translate_chunk", "alignments",
           "score_reference"]
