"""What a data directory's meta.json may hold, checked before anything in it is used.

meta.json names files (dictionaries, subword models) and parts of file names (languages,
splits). A crafted or damaged one must not make nmt read a file outside the directory, nor fail
with an internal error: every field the code reads is type-checked here, and each failure is a
one-line error naming meta.json and the field. Names are shown shortened, never the content of
a file they point at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nmt.data.subword import IMPORTED_KINDS, KINDS
from nmt.errors import NmtError
from nmt.tasks.task import TASKS

# The id dtypes nmt-preprocess writes (nmt.data.dictionary.Dictionary.dtype).
DTYPES = ("uint16", "int32")
REQUIRED = ("src_lang", "tgt_lang", "joined", "subword", "dtype", "vocab", "splits")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


class MetaChecker:
    """Checks one parsed meta.json; ``path`` (the meta.json file) is named in every error."""

    def __init__(self, path: Path):
        self.path = path

    def error(self, field: str, msg: str) -> NmtError:
        return NmtError(f"{self.path}: '{field}' {msg}")

    def typed(self, value: Any, field: str, tp: type, what: str) -> Any:
        # bool is an int to Python, never to meta.json.
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise self.error(field, f"must be {what}, got {_kind(value)}")
        return value

    def count(self, value: Any, field: str) -> int:
        if self.typed(value, field, int, "a non-negative integer") < 0:
            raise self.error(field, f"must be a non-negative integer, got {value}")
        return value

    def code(self, value: Any, field: str) -> str:
        """A language code or split name: a part of a shard's file name, so no separators."""
        self.typed(value, field, str, "a short name such as 'en'")
        if not value or len(value) > 64 or not value.isprintable() or any(
                c in value for c in "./\\ \t"):
            raise self.error(field, f"must be a short name such as 'en' (no dots, slashes or "
                                    f"spaces), got {_show(value)}")
        return value

    def file_name(self, value: Any, field: str) -> str:
        """A bare file name: the file must lie in the data directory itself."""
        self.typed(value, field, str, "a file name")
        if (not value or value in (".", "..") or "/" in value or "\\" in value
                or "\0" in value or not value.isprintable()):
            raise self.error(field, f"must be the name of a file inside the data directory "
                                    f"(no directories, no '..'), got {_show(value)}")
        return value

    def check(self, meta: dict[str, Any]) -> None:
        missing = [k for k in REQUIRED if k not in meta]
        if missing:
            raise NmtError(f"{self.path}: missing keys {', '.join(missing)}")
        src = self.code(meta["src_lang"], "src_lang")
        tgt = self.code(meta["tgt_lang"], "tgt_lang")
        if src == tgt:
            raise self.error("tgt_lang", f"is the source language too ({_show(src)})")
        self.typed(meta["joined"], "joined", bool, "true or false")
        vocab = self.typed(meta["vocab"], "vocab", dict, "an object")
        # A text pipeline kept whole (codec.LANG.json: an imported model's) may be of a kind
        # nmt does not learn itself.
        whole = all(isinstance(v, dict) and v.get("codec") is not None for v in vocab.values())
        kinds = KINDS + IMPORTED_KINDS if whole else KINDS
        if meta["subword"] not in kinds:
            raise self.error("subword", f"must be one of {', '.join(kinds)}, got "
                                        f"{_show(meta['subword'])}")
        if meta["dtype"] not in DTYPES:
            raise self.error("dtype", f"must be one of {', '.join(DTYPES)}, got "
                                      f"{_show(meta['dtype'])}")
        for lang in (src, tgt):
            if lang not in vocab:
                raise self.error("vocab", f"has no entry for language {_show(lang)}")
            self.vocab_entry(vocab[lang], f"vocab.{lang}", meta["subword"])
        splits = self.typed(meta["splits"], "splits", dict, "an object")
        for name, info in splits.items():
            self.split(name, info)
        if meta.get("task") is not None and meta["task"] not in TASKS:
            raise self.error("task", f"must be one of {', '.join(TASKS)}, got "
                                     f"{_show(meta['task'])}")

    def vocab_entry(self, entry: Any, field: str, kind: str) -> None:
        self.typed(entry, field, dict, "an object")
        if "dict" not in entry:
            raise self.error(field, "has no 'dict' (the dictionary's file name)")
        self.file_name(entry["dict"], f"{field}.dict")
        model = entry.get("model")
        if entry.get("codec") is not None:
            self.file_name(entry["codec"], f"{field}.codec")
        elif kind != "none" and model is None:
            raise self.error(f"{field}.model", f"is missing: a {kind} data directory needs "
                                               f"its subword model")
        if model is not None:
            self.file_name(model, f"{field}.model")
        if entry.get("size") is not None:
            self.count(entry["size"], f"{field}.size")
        if entry.get("moses_lang") is not None:
            self.code(entry["moses_lang"], f"{field}.moses_lang")

    def split(self, name: str, info: Any) -> None:
        field = f"splits.{self.code(name, 'splits')}"
        self.typed(info, field, dict, "an object")
        shards = self.typed(info.get("shards"), f"{field}.shards", list,
                            "a list of shard sizes")
        if not shards:
            raise self.error(f"{field}.shards", "is empty (a split has at least one shard)")
        for k, n in enumerate(shards):
            self.count(n, f"{field}.shards[{k}]")
        if info.get("sentences") is not None:
            self.count(info["sentences"], f"{field}.sentences")
        for key in ("source_path", "source_prefix"):
            if info.get(key) is not None:
                self.typed(info[key], f"{field}.{key}", str, "a path")


def check_meta(meta: dict[str, Any], path: Path) -> None:
    """Raise a one-line NmtError naming ``path`` and the field when ``meta`` is malformed."""
    MetaChecker(Path(path)).check(meta)


def confined(directory: Path, name: str, field: str, meta_path: Path) -> Path:
    """``directory / name``, refused when a symbolic link takes it outside ``directory``."""
    p = Path(directory) / name
    try:
        inside = p.resolve().is_relative_to(Path(directory).resolve())
    except (OSError, RuntimeError):      # a symlink loop
        inside = False
    if not inside:
        raise NmtError(f"{meta_path}: '{field}' {name} is a symbolic link to a file outside "
                       f"the data directory; refused")
    return p


__all__ = ["check_meta", "confined", "DTYPES"]
