"""TextCodec: the whole text pipeline of one language, raw text <-> dictionary ids.

raw text -> (optional Moses tokenization, sacremoses) -> subword model -> ids, and back.
A codec is rebuilt from ``to_state()`` alone (plain Python types), so checkpoints carry it.
"""

from __future__ import annotations

import re
from itertools import chain
from typing import Iterable, Sequence

import numpy as np

from nmt.data import moses
from nmt.data.dictionary import BOS, EOS, PAD, UNK, Dictionary
from nmt.data.subword import SubwordModel, Whitespace, model_from_state
from nmt.errors import NmtError

STATE_VERSION = 1


class TextCodec:
    """Encode raw text to ids (no eos) and decode ids to detokenized text."""

    def __init__(self, subword: SubwordModel, dictionary: Dictionary | None = None,
                 moses_lang: str | None = None, moses_options: dict | None = None):
        self.subword = subword
        self.dictionary: Dictionary = dictionary if dictionary is not None else subword.dictionary()
        if subword.kind != "none" and len(self.dictionary) != len(subword.dictionary()):
            raise NmtError(f"dictionary has {len(self.dictionary)} symbols but the "
                           f"{subword.kind} model has {len(subword.dictionary())}")
        if moses_lang is not None and not (isinstance(moses_lang, str)
                                           and MOSES_LANG.fullmatch(moses_lang)):
            raise NmtError(f"invalid Moses language {moses_lang!r} in a text codec (expected a "
                           f"language code such as 'en' or 'pt-br')")
        self.moses_lang = moses_lang
        # None: nmt's own Moses settings; imported models carry their toolkit's (MOSES_KEYS).
        self.moses_options = None if moses_options is None else _moses_options(moses_options)

    @property
    def kind(self) -> str:
        return self.subword.kind

    def __len__(self) -> int:
        return len(self.dictionary)

    def __repr__(self) -> str:
        moses = f", moses={self.moses_lang}" if self.moses_lang else ""
        return f"TextCodec({self.kind}, {len(self.dictionary)} symbols{moses})"

    # --- Moses ---------------------------------------------------------------------------------
    def tokenize(self, line: str) -> str:
        """``line`` as the subword model reads it: Moses-tokenized when the codec has a
        language, else as it is."""
        if self.moses_lang is None:
            return line
        if self.moses_options is not None:
            o = self.moses_options
            return moses.tokenize(line, self.moses_lang, escape=o["escape"],
                                  aggressive_dash_splits=o["aggressive_dash_splits"])
        # escape=False: keep '&' and '<' as they are instead of XML entities.
        return moses.tokenize(line, self.moses_lang, escape=False)

    def detokenize(self, text: str) -> str:
        """The inverse of :meth:`tokenize` on decoded subwords."""
        if self.moses_lang is None:
            return text
        unescape = self.moses_options is not None and self.moses_options["unescape"]
        return moses.detokenize(text, self.moses_lang, unescape=unescape)

    # --- encoding ------------------------------------------------------------------------------
    def _ids(self, lines: Sequence[str], dropout: tuple[float, int] | None = None
             ) -> list[list[int]]:
        if self.moses_lang is not None:
            lines = [self.tokenize(line) for line in lines]
        if dropout is not None:
            return self.subword.encode_ids_dropout(lines, *dropout)
        return self.subword.encode_ids(lines)

    @property
    def supports_dropout(self) -> bool:
        """Whether :meth:`encode_flat` can sample (``dropout``): sentencepiece BPE models."""
        return hasattr(self.subword, "encode_ids_dropout")

    def encode(self, line: str) -> list[int]:
        """Ids of one line, without eos."""
        # A special symbol spelled in the text ("</s>") is an unknown word, never a real eos.
        return [i if i > EOS else UNK for i in self._ids([line])[0]]

    def encode_batch(self, lines: Sequence[str]) -> list[np.ndarray]:
        """Ids (int64 arrays, without eos) of many lines; faster than encode() in a loop."""
        flat, lens = self.encode_flat(lines, np.int64)
        return np.split(flat, np.cumsum(lens[:-1])) if len(lens) else []

    def encode_flat(self, lines: Sequence[str], dtype: np.dtype | None = None,
                    dropout: tuple[float, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """All ids of ``lines`` concatenated, and the length of each line (int32).

        What the binarizer writes: no per-line arrays, so it stays fast for millions of lines.
        ``dropout``: (p, seed) samples BPE-dropout segmentations instead (training data).
        """
        ids = self._ids(list(lines), dropout)
        lens = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=dtype or self.dictionary.dtype,
                           count=int(lens.sum()))
        np.putmask(flat, flat <= EOS, UNK)     # see encode()
        return flat, lens

    def pieces(self, line: str) -> list[str]:
        """The subword pieces of a line (after Moses tokenization), for inspection."""
        return self.subword.pieces(self.tokenize(line))

    # --- decoding ------------------------------------------------------------------------------
    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``: stops at eos, drops pad and bos, undoes subwords and Moses."""
        if hasattr(ids, "tolist"):          # torch tensors and numpy arrays
            ids = ids.tolist()
        keep: list[int] = []
        n = len(self.dictionary)
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i == PAD or i == BOS:
                continue
            keep.append(i if 0 <= i < n else UNK)
        return self.detokenize(self.subword.decode_ids(keep))

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    # --- persistence ---------------------------------------------------------------------------
    def to_state(self) -> dict:
        """Plain Python types only: safe inside a ``torch.load(weights_only=True)`` checkpoint."""
        state = {"version": STATE_VERSION, "subword": self.subword.to_state(),
                 "dictionary": self.dictionary.to_state(), "moses_lang": self.moses_lang}
        if self.moses_options is not None:
            state["moses_options"] = dict(self.moses_options)
        return state

    @classmethod
    def from_state(cls, state: dict) -> "TextCodec":
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            got = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise NmtError(f"unsupported text codec state (version {got}); "
                           f"this nmt reads version {STATE_VERSION}")
        dictionary = Dictionary.from_state(state["dictionary"])
        subword = model_from_state(state["subword"], dictionary)
        codec = cls(subword, dictionary, state.get("moses_lang"), state.get("moses_options"))
        if subword.kind != "none" and subword.dictionary() != dictionary:
            raise NmtError("text codec state is inconsistent: the dictionary does not match "
                           "the subword model")
        return codec

    def same_as(self, other: "TextCodec") -> bool:
        """True when both encode and decode identically."""
        return self.to_state() == other.to_state() or (
            self.subword.identity() == other.subword.identity()
            and self.dictionary == other.dictionary and self.moses_lang == other.moses_lang
            and self.moses_options == other.moses_options)


# A language code as Moses and the file names of nmt-preprocess take it: letters, digits, '-',
# '_' (anything else in a checkpoint is tampering, and would reach exported code and READMEs).
MOSES_LANG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}")

# Moses settings a codec may carry (all three False is nmt's own way).
MOSES_KEYS = ("escape", "aggressive_dash_splits", "unescape")


def _moses_options(options: dict) -> dict:
    if not isinstance(options, dict) or set(options) != set(MOSES_KEYS) or not all(
            isinstance(v, bool) for v in options.values()):
        raise NmtError(f"invalid Moses options in a text codec: {options!r} (expected "
                       f"{', '.join(MOSES_KEYS)}, each true or false)")
    return {k: options[k] for k in MOSES_KEYS}


def whitespace_codec(dictionary: Dictionary, moses_lang: str | None = None) -> TextCodec:
    return TextCodec(Whitespace(dictionary), dictionary, moses_lang)


__all__ = ["TextCodec", "whitespace_codec"]
