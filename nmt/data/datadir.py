"""The data directory written by nmt-preprocess: meta.json, dictionaries, subword models, shards.

See docs/DESIGN.md ("Data directory") for the layout. ``DataDir.open`` is what nmt-train and
nmt-generate use; ``write_codec`` and ``write_meta`` are what the preprocessor uses.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from nmt.data.codec import TextCodec
from nmt.data.dictionary import Dictionary
from nmt.data.indexed import IndexedDataset, ParallelDataset, shard_prefix
from nmt.data.metaschema import check_meta, confined
from nmt.data.subword import FILE_CLASSES, load_model
from nmt.errors import NmtError
from nmt.io import write_text_atomic

FORMAT_VERSION = 1
META = "meta.json"
_SPLIT_RE = re.compile(r"^(train|valid|test)\d*$")


def split_sort_key(name: str) -> tuple[int, int]:
    """train < valid < valid1 < ... < test < test1 < ..."""
    m = _SPLIT_RE.match(name)
    if not m:
        return (3, 0)
    base = m.group(1)
    num = name[len(base):]
    return (("train", "valid", "test").index(base), int(num) + 1 if num else 0)


def stored_as_files(codec: TextCodec) -> bool:
    """Whether dict.LANG.txt and the subword model's own file rebuild ``codec``: nmt's own
    kinds do. An imported text pipeline (another toolkit's subwords, Marian's vocabulary over
    a sentencepiece model, Moses options other than the defaults) is kept whole instead, as
    its plain state in codec.LANG.json, the form a checkpoint holds it in."""
    return (type(codec.subword) is FILE_CLASSES.get(codec.subword.kind)
            and codec.moses_options is None)


def codec_files(codec: TextCodec, lang: str) -> dict[str, Any]:
    files = stored_as_files(codec)
    entry = {"dict": f"dict.{lang}.txt",
             "model": (f"subword.{lang}{codec.subword.suffix}"
                       if files and codec.subword.suffix else None),
             "size": len(codec.dictionary), "moses_lang": codec.moses_lang}
    if not files:
        entry["codec"] = f"codec.{lang}.json"
    return entry


def write_codec(directory: Path, lang: str, codec: TextCodec) -> dict[str, Any]:
    """Save dict.{lang}.txt and subword.{lang}.* (or codec.{lang}.json) into ``directory``;
    returns the meta entry."""
    entry = codec_files(codec, lang)
    codec.dictionary.save(Path(directory) / entry["dict"])
    if entry["model"]:
        codec.subword.save(Path(directory) / entry["model"])
    if entry.get("codec"):
        write_text_atomic(Path(directory) / entry["codec"],
                          json.dumps(codec.to_state(), ensure_ascii=False) + "\n")
    return entry


def _read_whole_codec(directory: Path, entry: dict[str, Any], lang: str,
                      dictionary: Dictionary, dict_path: Path, meta_path: Path) -> TextCodec:
    """The codec kept whole in codec.{lang}.json (see stored_as_files)."""
    path = confined(directory, entry["codec"], f"vocab.{lang}.codec", meta_path)
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        codec = TextCodec.from_state(state)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NmtError(f"{path}: unreadable ({' '.join(str(e).split())})") from None
    except NmtError as e:
        raise NmtError(f"{path}: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise NmtError(f"{path}: not a text pipeline nmt-preprocess wrote "
                       f"({type(e).__name__}: {' '.join(str(e).split())[:60]})") from None
    if codec.dictionary != dictionary:
        raise NmtError(f"{dict_path}: does not match the text pipeline in {path}")
    return codec


def read_codec(directory: Path, kind: str, entry: dict[str, Any], lang: str) -> TextCodec:
    """The codec of ``lang`` from its meta.json ``entry`` (checked by check_meta already)."""
    directory = Path(directory)
    meta_path = directory / META
    dict_path = confined(directory, entry["dict"], f"vocab.{lang}.dict", meta_path)
    dictionary = Dictionary.load(dict_path)
    if entry.get("codec"):
        return _read_whole_codec(directory, entry, lang, dictionary, dict_path, meta_path)
    model_path = (confined(directory, entry["model"], f"vocab.{lang}.model", meta_path)
                  if entry.get("model") else None)
    subword = load_model(kind, model_path, dictionary)
    if kind != "none":
        expected = subword.dictionary()
        if expected != dictionary:
            raise NmtError(f"{dict_path}: does not match the subword model {model_path}")
        # Counts come from dict.txt (corpus frequencies), symbols from the model.
    size = entry.get("size")
    if size is not None and size != len(dictionary):
        raise NmtError(f"{dict_path}: {len(dictionary)} symbols, but {meta_path} says {size} "
                       f"(corrupt data directory)")
    return TextCodec(subword, dictionary, entry.get("moses_lang"))


def write_meta(directory: Path, meta: dict[str, Any]) -> None:
    write_text_atomic(Path(directory) / META, json.dumps(meta, indent=2, ensure_ascii=False) + "\n")


class DataDir:
    """A preprocessed data directory (read-only view)."""

    def __init__(self, path: Path, meta: dict[str, Any]):
        self.path = Path(path)
        self.meta = meta
        self.src_lang: str = meta["src_lang"]
        self.tgt_lang: str = meta["tgt_lang"]
        self.joined: bool = bool(meta["joined"])
        self.subword: str = meta["subword"]
        self.dtype = np.dtype(meta["dtype"])
        vocab = meta["vocab"]
        self.src_codec: TextCodec = read_codec(self.path, self.subword, vocab[self.src_lang],
                                                self.src_lang)
        # Joined: one dictionary. The codec itself is shared when nothing else tells the sides
        # apart (an imported pipeline, kept whole, may have a subword model for each side).
        if (self.joined and vocab[self.tgt_lang].get("moses_lang") == self.src_codec.moses_lang
                and not vocab[self.src_lang].get("codec")
                and not vocab[self.tgt_lang].get("codec")):
            self.tgt_codec: TextCodec = self.src_codec
        else:
            self.tgt_codec = read_codec(self.path, self.subword, vocab[self.tgt_lang],
                                        self.tgt_lang)
            if self.joined:
                # Moses rules differ per language, the vocabulary is shared.
                self.tgt_codec.dictionary = self.src_codec.dictionary
        self.splits: list[str] = sorted(meta["splits"], key=split_sort_key)
        # What the data is for (nmt.tasks.task); None for a directory written before tasks were
        # recorded: nmt.tasks.task.data_task infers it from the target vocabulary.
        self.task: str | None = meta.get("task")

    @classmethod
    def open(cls, path: str | Path) -> "DataDir":
        p = Path(path)
        if not p.exists():
            raise NmtError(f"{p}: no such data directory")
        if not p.is_dir():
            raise NmtError(f"{p}: not a directory (expected a data directory from nmt-preprocess)")
        meta_path = p / META
        if not meta_path.is_file():
            raise NmtError(f"{p}: not an nmt data directory (no {META}; run nmt-preprocess)")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise NmtError(f"{meta_path}: unreadable ({' '.join(str(e).split())})") from None
        if not isinstance(meta, dict):
            raise NmtError(f"{meta_path}: not a JSON object")
        version = meta.get("format_version")
        if version != FORMAT_VERSION:
            raise NmtError(f"{p}: data directory format version {version}, but this nmt reads "
                           f"version {FORMAT_VERSION}; rerun nmt-preprocess")
        check_meta(meta, meta_path)
        return cls(p, meta)

    def __repr__(self) -> str:
        return (f"DataDir({str(self.path)!r}, {self.src_lang}->{self.tgt_lang}, "
                f"{self.subword}, splits={self.splits})")

    def codec(self, lang: str) -> TextCodec:
        if lang == self.src_lang:
            return self.src_codec
        if lang == self.tgt_lang:
            return self.tgt_codec
        raise NmtError(f"language '{lang}' is not in {self.path} "
                       f"({self.src_lang}, {self.tgt_lang})")

    def split_info(self, split: str) -> dict[str, Any]:
        self._check_split(split)
        return self.meta["splits"][split]

    def _check_split(self, split: str) -> None:
        if split not in self.meta["splits"]:
            from nmt.errors import suggest
            raise NmtError(f"{self.path}: no split '{split}'{suggest(split, self.splits)}; "
                           f"available: {', '.join(self.splits) or 'none'}")

    def load_split(self, split: str) -> ParallelDataset:
        """The split as a memory-mapped ParallelDataset."""
        self._check_split(split)
        n_shards = len(self.meta["splits"][split]["shards"])

        def side(lang: str) -> IndexedDataset:
            return IndexedDataset([shard_prefix(self.path, split, lang, k)
                                   for k in range(n_shards)], self.dtype,
                                  vocab_size=len(self.codec(lang).dictionary))

        ds = ParallelDataset(side(self.src_lang), side(self.tgt_lang), name=split)
        expected = self.meta["splits"][split].get("sentences")
        if expected is not None and expected != len(ds):
            raise NmtError(f"{self.path}: split {split} has {len(ds)} sentences, "
                           f"meta.json says {expected} (corrupt data directory)")
        return ds


__all__ = ["DataDir", "FORMAT_VERSION", "write_codec", "read_codec", "write_meta",
           "split_sort_key"]
