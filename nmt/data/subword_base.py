"""The interface every subword model implements (nmt.data.subword's kinds and the imported
toolkits' in nmt.data.fairseq_subword), in a module of its own so that both import it without
importing each other."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from nmt.data.dictionary import Dictionary


class SubwordModel:
    """Interface shared by the three kinds."""

    kind = "?"
    suffix = ""          # file name suffix of the saved model, "" when there is no file

    def encode_ids(self, lines: Sequence[str]) -> list[list[int]]:
        raise NotImplementedError

    def pieces(self, line: str) -> list[str]:
        raise NotImplementedError

    def decode_ids(self, ids: Sequence[int]) -> str:
        """``ids`` hold no specials except possibly unk."""
        raise NotImplementedError

    def dictionary(self) -> Dictionary:
        """The dictionary whose ids this model emits."""
        raise NotImplementedError

    def to_state(self) -> dict:
        raise NotImplementedError

    def identity(self) -> dict:
        """What decides how this model encodes and decodes: two models with equal identities
        are the same model (nmt.data.codec.TextCodec.same_as). Default: the whole state."""
        return self.to_state()

    def save(self, path: Path) -> None:
        raise NotImplementedError


__all__ = ["SubwordModel"]
