"""nmt-generate's jsonl input: one JSON object per line, ``{"source": ...}`` with an optional
``"prefix"`` (the translation must start with it), ``"constraints"`` (a list of phrases the
translation must contain: nmt.search.lexical) and ``"target"`` (the reference that
``--score-reference`` scores). An empty line is an empty source, so that output stays
aligned with input; anything else that is not such an object is a one-line NmtError naming
the line."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from nmt.errors import NmtError, suggest

FIELDS = ("source", "prefix", "target")          # the string fields; and "constraints"
# What nmt-generate's jsonl output adds to a line: read back as input, they are ignored (an
# output line, "source" and all, translates again).
OUTPUT_FIELDS = ("id", "translation", "score", "tokens", "token_scores", "truncated", "nbest",
                 "alignment", "alignment_subwords")
_JSON_TYPES = {dict: "an object", list: "a list", int: "a number", float: "a number",
               bool: "true/false", type(None): "null", str: "a string"}


@dataclass
class Request:
    source: str
    prefix: str | None = None
    target: str | None = None
    constraints: list[str] | None = None


# A lone surrogate: what an unpaired JSON escape in \ud800-\udfff decodes to (no character).
SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(obj) -> str | None:
    """A lone surrogate in some string of ``obj`` (a string, or lists and dicts of them, keys
    included), else None: JSON's \\ud800 escapes parse, but name no character."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, str) and (m := SURROGATE.search(x)):
            return m.group()
    return None


def parse_request(line: str, lineno: int, name: str = "<stdin>") -> Request:
    if not line.strip():
        return Request("")
    where = f"{name}: line {lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        msg = e.msg.removesuffix(" at")       # "Invalid control character at"
        raise NmtError(f"{where}: not JSON ({msg} at character {e.pos + 1}); "
                       f"--input-format jsonl reads one object per line") from None
    except RecursionError:
        # Python's parser recurses per bracket: ~1000 nested ones exceed its stack.
        raise NmtError(f"{where}: JSON nested too deeply for the parser; --input-format "
                       f"jsonl reads one flat object per line") from None
    if not isinstance(obj, dict):
        raise NmtError(f"{where}: expected a JSON object with \"source\", got {_kind(obj)}")
    if "source" not in obj:
        raise NmtError(f"{where}: no \"source\" (the object has "
                       f"{', '.join(map(repr, obj)) or 'no keys'})")
    unknown = [k for k in obj if k not in (*FIELDS, "constraints", *OUTPUT_FIELDS)]
    if unknown:
        # a misspelt "constraint" or "prefx" would drop what the line asks for
        raise NmtError(f"{where}: unknown field {unknown[0]!r}"
                       f"{suggest(unknown[0], (*FIELDS, 'constraints'))}; the fields are "
                       f"\"source\", \"prefix\", \"constraints\" and \"target\"")
    if not isinstance(obj["source"], str):
        raise NmtError(f"{where}: \"source\" must be a string, got {_kind(obj['source'])}")
    for key in FIELDS:
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            raise NmtError(f"{where}: \"{key}\" must be a string, got {_kind(value)}")
    if problem := phrases_problem(obj.get("constraints")):
        raise NmtError(f"{where}: {problem}")
    bad = lone_surrogate([obj.get(k) for k in FIELDS] + list(obj.get("constraints") or []))
    if bad is not None:
        raise NmtError(f"{where}: a lone surrogate (\\u{ord(bad):04x}) in a string: JSON's "
                       f"\\ud800-\\udfff escapes name no character unless paired")
    return Request(obj["source"] or "", obj.get("prefix"), obj.get("target"),
                   obj.get("constraints"))


def phrases_problem(value, name: str = "\"constraints\"") -> str | None:
    """What is wrong with ``value`` as a list of constraint phrases (a list of non-blank
    strings; None is none), said of ``name``; None when nothing is."""
    if value is None:
        return None
    if not isinstance(value, list):
        return f"{name} must be a list of strings, got {_kind(value)}"
    for i, x in enumerate(value):
        if not isinstance(x, str):
            return f"{name}[{i}] must be a string, got {_kind(x)}"
        if not x.strip():
            return f"{name}[{i}] is empty"
    return None


def _kind(value) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def parse_requests(lines: list[str], first_line: int = 1,
                   name: str = "<stdin>") -> list[Request]:
    return [parse_request(line, first_line + i, name) for i, line in enumerate(lines)]


__all__ = ["Request", "parse_request", "parse_requests", "phrases_problem"]
