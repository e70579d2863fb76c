"""nmt-generate's jsonl input: one JSON object per line, ``{"source": ...}`` with an optional
``"prefix"`` (the translation must start with it) and ``"target"`` (the reference that
``--score-reference`` scores). An empty line is an empty source, so that output stays
aligned with input; anything else that is not such an object is a one-line NmtError naming
the line."""

from __future__ import annotations

import json
from dataclasses import dataclass

from nmt.errors import NmtError

FIELDS = ("source", "prefix", "target")
_JSON_TYPES = {dict: "an object", list: "a list", int: "a number", float: "a number",
               bool: "true/false", type(None): "null", str: "a string"}


@dataclass
class Request:
    source: str
    prefix: str | None = None
    target: str | None = None


def parse_request(line: str, lineno: int, name: str = "<stdin>") -> Request:
    if not line.strip():
        return Request("")
    where = f"{name}: line {lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise NmtError(f"{where}: not JSON ({e.msg} at character {e.pos + 1}); "
                       f"--input-format jsonl reads one object per line") from None
    except RecursionError:
        # Python's parser recurses per bracket: ~1000 nested ones exceed its stack.
        raise NmtError(f"{where}: JSON nested too deeply for the parser; --input-format "
                       f"jsonl reads one flat object per line") from None
    if not isinstance(obj, dict):
        raise NmtError(f"{where}: expected a JSON object with \"source\", got "
                       f"{_JSON_TYPES.get(type(obj), type(obj).__name__)}")
    if "source" not in obj:
        raise NmtError(f"{where}: no \"source\" (the object has "
                       f"{', '.join(map(repr, obj)) or 'no keys'})")
    for key in FIELDS:
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            raise NmtError(f"{where}: \"{key}\" must be a string, got "
                           f"{_JSON_TYPES.get(type(value), type(value).__name__)}")
    return Request(obj["source"] or "", obj.get("prefix"), obj.get("target"))


def parse_requests(lines: list[str], first_line: int = 1,
                   name: str = "<stdin>") -> list[Request]:
    return [parse_request(line, first_line + i, name) for i, line in enumerate(lines)]


__all__ = ["Request", "parse_request", "parse_requests"]
