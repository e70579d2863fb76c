"""What ``POST /translate`` accepts, checked field by field; anything else is a RequestError
(an HTTP status and a one-line reason).

    {"text": ["A man rides a bike .", ...],        required: the sentences, raw text
     "model": "NAME",                              required when several models are served
     "beam": 4, "lenpen": 0.6,                     decoding, as nmt-generate's --beam ...;
     "max_len_a": 1.0, "max_len_b": 50,            unset: the checkpoint's preset
     "min_len": 0, "no_repeat_ngram_size": 0,      controls, as nmt-generate's --min-len ...
     "unkpen": 0.0, "replace_unk": false,
     "diverse_beam_groups": 1, "diverse_beam_strength": 0.5,
     "nbest": 1,                                   hypotheses per sentence, best first (at most
                                                   the beam; sampling: samples, at most
                                                   --max-beam): > 1 adds "nbest" to the reply
     "sampling": false,                            draw each output token instead of beam
     "topk": 0, "topp": 1.0,                       search (nmt-generate's --sampling, --topk
     "temperature": 1.0, "seed": 1,                ...): a sentence draws from (seed, its
                                                   position in the request, from 1), as
                                                   nmt-generate numbers a file's lines; with
                                                   "nbest" N, N samples in the order drawn
     "prefix": ["Ein", null, ...] or "Ein",        forced translation prefixes (nmt-generate's
                                                   jsonl "prefix"): one per sentence, or one
                                                   for all; null or "" for none
     "constraints": [["Hund"], null, ...]          phrases each translation must contain
                    or ["Hund", "rote Ball"]}      (nmt-generate's jsonl "constraints"): a
                                                   list per sentence (null for none), or one
                                                   list of strings for all
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from nmt.errors import NmtError, suggest
from nmt.search.config import SamplingConfig, SearchConfig
from nmt.search.lexical import check_room, encode_constraints, refuse_with
from nmt.search.prefix import check_spelled
from nmt.search.jsonl_input import lone_surrogate, phrases_problem
from nmt.serve.config import ServeConfig
from nmt.serve.models import ServedModel

FIELDS = ("text", "model", "beam", "lenpen", "max_len_a", "max_len_b", "prefix", "min_len",
          "no_repeat_ngram_size", "unkpen", "replace_unk", "diverse_beam_groups",
          "diverse_beam_strength", "constraints", "nbest", "sampling", "topk", "topp",
          "temperature", "seed")
# What sampling takes besides "sampling": true, as nmt-generate's options of those names.
SAMPLING_FIELDS = {"topk": True, "topp": False, "temperature": False, "seed": True}
# The controls a request may set, with their defaults (SearchConfig's) and kinds.
CONTROLS = {"min_len": True, "no_repeat_ngram_size": True, "unkpen": False,
            "diverse_beam_groups": True, "diverse_beam_strength": False}
_KINDS = {dict: "an object", list: "a list", int: "a number", float: "a number",
          bool: "true/false", type(None): "null", str: "a string"}


class RequestError(Exception):
    """A request the server refuses: ``status`` (4xx/5xx) and a one-line reason."""

    def __init__(self, status: int, message: str):
        super().__init__(" ".join(message.split()))
        self.status = status


@dataclass
class TranslateRequest:
    model: ServedModel
    texts: list[str]
    search: SearchConfig                    # resolved against the model's preset
    prefixes: list[str | None] | None       # one per sentence, or None
    constraints: list[list[str] | None] | None = None     # one list per sentence, or None
    sampling: SamplingConfig | None = None  # None: beam search


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(body: bytes) -> dict:
    """The request body as a JSON object (400 otherwise)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"the body is not UTF-8 (byte {e.start + 1})") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant)    # refuse NaN and Infinity
    except json.JSONDecodeError as e:
        msg = e.msg.removesuffix(" at")       # "Invalid control character at"
        raise RequestError(400, f"the body is not JSON ({msg} at character {e.pos + 1})"
                           ) from None
    except ValueError as e:
        raise RequestError(400, f"the body is not JSON ({e})") from None
    except RecursionError:
        raise RequestError(400, "the body is JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise RequestError(400, f"expected a JSON object with \"text\", got {_kind(obj)}")
    if (bad := lone_surrogate(obj)) is not None:
        raise RequestError(400, f"the body has a string that is not text: a lone surrogate "
                                f"(\\u{ord(bad):04x}), which UTF-8 cannot hold")
    return obj


def parse_request(obj: Mapping[str, Any], models: Mapping[str, ServedModel],
                  cfg: ServeConfig) -> TranslateRequest:
    unknown = [k for k in obj if k not in FIELDS]
    if unknown:
        raise RequestError(400, f"unknown field \"{unknown[0]}\"{suggest(unknown[0], FIELDS)}; "
                                f"the fields are {', '.join(FIELDS)}")
    served = _model(obj.get("model"), models)
    texts = obj.get("text")
    if not isinstance(texts, list):
        raise RequestError(400, "\"text\" is required: a list of sentences" if texts is None
                           else f"\"text\" must be a list of strings, got {_kind(texts)}")
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise RequestError(400, f"\"text\"[{bad}] must be a string, got {_kind(texts[bad])}")
    if len(texts) > cfg.max_sentences_per_request:
        raise RequestError(413, f"{len(texts)} sentences in one request; this server takes at "
                                f"most {cfg.max_sentences_per_request} (--max-sentences-per-"
                                f"request)")
    prefixes = _prefixes(obj.get("prefix"), len(texts), served)
    sampling = _sampling(obj, served)
    search = _search(obj, served, cfg, sampling is not None)
    constraints = _constraints(obj.get("constraints"), len(texts), served, search,
                               sampling is not None)
    return TranslateRequest(served, texts, search, prefixes, constraints, sampling)


def _model(name: Any, models: Mapping[str, ServedModel]) -> ServedModel:
    served = ", ".join(models)
    if name is None:
        if len(models) == 1:
            return next(iter(models.values()))
        raise RequestError(400, f"\"model\" is required: this server has {served}")
    if not isinstance(name, str):
        raise RequestError(400, f"\"model\" must be a string, got {_kind(name)}")
    if name not in models:
        raise RequestError(404, f"unknown model \"{name}\"{suggest(name, models)}; this server "
                                f"has {served}")
    return models[name]


def _number(obj: Mapping[str, Any], key: str, integer: bool):
    """The request's number ``key`` (None: not given); 400 for another kind."""
    v = obj.get(key)
    if v is None:
        return None
    ok = isinstance(v, int) or (not integer and isinstance(v, float) and math.isfinite(v))
    if isinstance(v, bool) or not ok:
        raise RequestError(400, f"\"{key}\" must be {'an integer' if integer else 'a number'}"
                                f", got {_kind(v) if not isinstance(v, float) else v}")
    if not integer:
        # A JSON integer has no bound, a float has: 1 followed by 400 zeros is no float.
        try:
            v = float(v)
        except OverflowError:
            raise RequestError(400, f"\"{key}\" is too large a number") from None
    return v


def _sampling(obj: Mapping[str, Any], served: ServedModel) -> SamplingConfig | None:
    """The request's sampling options (None: beam search), as nmt-generate checks them."""
    on = obj.get("sampling", False)
    if not isinstance(on, bool):
        raise RequestError(400, f"\"sampling\" must be true or false, got {_kind(on)}")
    given = {k: v for k, integer in SAMPLING_FIELDS.items()
             if (v := _number(obj, k, integer)) is not None}
    if not on:
        if given:
            raise RequestError(400, f"\"{next(iter(given))}\" goes with \"sampling\": true")
        return None
    if served.translator.engine != "nmt":
        raise RequestError(400, f"model '{served.name}' is decoded by {served.translator.engine}"
                                f", which does not sample: serve it with --engine nmt")
    try:
        return SamplingConfig(**given)
    except NmtError as e:
        # the request's names: "topk", not the command line's --topk
        raise RequestError(400, re.sub(r"--(\w+)", r'"\1"', str(e))) from None


def _search(obj: Mapping[str, Any], served: ServedModel, cfg: ServeConfig,
            sampling: bool = False) -> SearchConfig:
    """The request's decoding options, unset ones from the model's preset."""
    beam = _number(obj, "beam", True)
    if beam is not None and beam > cfg.max_beam and not sampling:      # samples do not use it
        raise RequestError(400, f"\"beam\" {beam} is larger than this server allows "
                                f"({cfg.max_beam}, --max-beam)")
    nbest = _number(obj, "nbest", True)
    controls = {k: v for k, integer in CONTROLS.items()
                if (v := _number(obj, k, integer)) is not None}
    if sampling:
        # "nbest" samples a sentence, whatever the beam, which samples do not use: the search
        # (and what a request and a batch are charged for it) is "nbest" rows a sentence.
        if nbest is not None and not 1 <= nbest <= cfg.max_beam:
            raise RequestError(400, f"\"nbest\" must be between 1 and {cfg.max_beam} samples "
                                    f"a sentence (--max-beam), got {nbest}")
        beam = nbest or 1
        if controls.get("diverse_beam_groups", 1) > 1:
            raise RequestError(400, "\"diverse_beam_groups\" is beam search's: it does not "
                                    "go with \"sampling\"")
    replace_unk = obj.get("replace_unk", False)
    if not isinstance(replace_unk, bool):
        raise RequestError(400, f"\"replace_unk\" must be true or false, got "
                                f"{_kind(replace_unk)}")
    try:
        search = SearchConfig(beam=beam, lenpen=_number(obj, "lenpen", False),
                              max_len_a=_number(obj, "max_len_a", False),
                              max_len_b=_number(obj, "max_len_b", True), replace_unk=replace_unk,
                              nbest=1 if nbest is None else nbest, **controls)
        search = search.resolve(served.translator.search)
        served.translator.check_search(search)
        return search
    except NmtError as e:
        # The request's names: max_len_a, not the command line's --max-len-a.
        raise RequestError(400, re.sub(r"(?<=[a-z])-(?=[a-z])", "_", str(e))) from None


def _engine_allows(served: ServedModel, prefixes=None, constraints=None) -> None:
    """400 when the model's engine cannot force what the request gives (CTranslate2)."""
    try:
        served.translator.check_targets(prefixes, constraints)
    except NmtError as e:
        raise RequestError(400, str(e)) from None


def _prefixes(value: Any, n: int, served: ServedModel) -> list[str | None] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value] * n
    if not isinstance(value, list):
        raise RequestError(400, f"\"prefix\" must be a string or a list (one per sentence), "
                                f"got {_kind(value)}")
    if len(value) != n:
        raise RequestError(400, f"{len(value)} prefixes for {n} sentences: give one per "
                                f"sentence (null for none), or one string for all")
    bad = next((i for i, p in enumerate(value) if p is not None and not isinstance(p, str)),
               None)
    if bad is not None:
        raise RequestError(400, f"\"prefix\"[{bad}] must be a string or null, got "
                                f"{_kind(value[bad])}")
    if not any(value):
        return None
    _engine_allows(served, prefixes=value)
    if served.translator.constraints is not None:
        raise RequestError(400, f"model '{served.name}' decodes with tree constraints, which "
                                f"forced prefixes cannot be combined with")
    return value


def _constraints(value: Any, n: int, served: ServedModel, search: SearchConfig,
                 sampling: bool = False) -> list[list[str] | None] | None:
    """One list of phrases per sentence (None for none), or None when no sentence has any."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise RequestError(400, f"\"constraints\" must be a list (of strings for all "
                                f"sentences, or of lists, one per sentence), got {_kind(value)}")
    if all(isinstance(x, str) for x in value):
        if problem := phrases_problem(value):
            raise RequestError(400, problem)
        value = [value] * n
    elif len(value) != n:
        raise RequestError(400, f"{len(value)} constraint lists for {n} sentences: give one "
                                f"list per sentence (null for none), or one list of strings "
                                f"for all")
    for i, x in enumerate(value):
        if problem := phrases_problem(x, f"\"constraints\"[{i}]"):
            raise RequestError(400, problem)
    if not any(value):
        return None
    _engine_allows(served, constraints=value)
    if served.translator.constraints is not None:
        raise RequestError(400, f"model '{served.name}' decodes with tree constraints, which "
                                f"lexical constraints cannot be combined with")
    try:
        refuse_with(search, sampling=sampling, tree=False)
    except NmtError as e:
        raise RequestError(400, str(e)) from None
    return value


def encode(req: TranslateRequest, cfg: ServeConfig
           ) -> tuple[list[np.ndarray], list[list[int]] | None, list[list[np.ndarray]] | None]:
    """The sources' ids (413 for one longer than the model takes: the server refuses what
    nmt-generate would truncate), the prefixes' target ids and the constraints' (400 for one
    the vocabulary cannot spell or that does not fit), as the Translator encodes them."""
    t = req.model.translator
    ids = t.src_codec.encode_batch(req.texts) if req.texts else []
    limit = req.model.max_sentence_tokens
    long = next((i for i, x in enumerate(ids) if x.size > limit), None)
    if long is not None:
        raise RequestError(413, f"\"text\"[{long}] has {ids[long].size} subwords; model "
                                f"'{req.model.name}' takes at most {limit}")
    s, preset = req.search, t.search
    if (s.max_len_a, s.max_len_b) != (preset.max_len_a, preset.max_len_b) and ids:
        # A request's own length options could ask for millions of steps (the decoder's cache
        # is allocated for them): bound them. The preset's are the operator's choice.
        longest = max(x.size for x in ids)
        # (compared as a float: a huge max_len_a makes it inf, which floor() cannot take)
        if s.max_len_a * longest + s.max_len_b >= cfg.max_output_tokens + 1:
            raise RequestError(400, f"max_len_a * {longest} + max_len_b allows more than "
                                    f"{cfg.max_output_tokens} output tokens "
                                    f"(--max-output-tokens)")
    if ids:
        from nmt.serve.batching import step_limits

        steps = s.beam * sum(step_limits(ids, s, t.max_positions))
        rows = "beam" if req.sampling is None else "nbest"      # sampling: nbest rows
        if steps > cfg.max_request_search_tokens:
            raise RequestError(413, f"this request asks for up to {steps} search steps "
                                    f"({rows} {s.beam} x each sentence's length limit + 1); "
                                    f"this server takes at most "
                                    f"{cfg.max_request_search_tokens} in one request "
                                    f"(--max-request-search-tokens): send fewer sentences, a "
                                    f"smaller {rows} or a lower max_len_b")
    prefixes = None
    if req.prefixes is not None:
        # One string for every sentence is encoded once.
        encoded = {p: list(t.tgt_codec.encode(p)) for p in set(req.prefixes) if p}
        prefixes = [encoded[p] if p else [] for p in req.prefixes]
        try:
            for i, (text, p) in enumerate(zip(req.prefixes, prefixes)):
                check_spelled(t.tgt_codec, p, text, f"\"prefix\"[{i}]")
                if req.constraints is None:
                    check_room((), len(p), ids[i].size, s, t.max_positions,
                               f"\"text\"[{i}]")
        except NmtError as e:
            raise RequestError(400, str(e)) from None
    return ids, prefixes, _encode_constraints(req, ids, prefixes)


def _encode_constraints(req: TranslateRequest, ids: list[np.ndarray], prefixes
                        ) -> list[list[np.ndarray]] | None:
    if req.constraints is None:
        return None
    t = req.model.translator
    out = []
    try:
        for i, phrases in enumerate(req.constraints):
            where = f"\"text\"[{i}]"
            out.append(encode_constraints(t.tgt_codec, phrases, where))
            check_room(out[-1], len(prefixes[i]) if prefixes else 0, ids[i].size, req.search,
                       t.max_positions, where)
    except NmtError as e:
        raise RequestError(400, str(e)) from None
    return out


__all__ = ["FIELDS", "RequestError", "TranslateRequest", "parse_json", "parse_request",
           "encode"]
