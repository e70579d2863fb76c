"""The subwords of fairseq models, looked up in the model's own dictionary (fairseq's ids):
BPE codes as subword-nmt learns and applies them (``@@ `` marks a piece that continues; most
fairseq models) and sentencepiece pieces (fairseq's ``--bpe sentencepiece``).

Applying the codes goes through the subword-nmt library itself (the optional extra
``nmt[fairseq]``): its merge order, end-of-word handling and cache define what fairseq's
``--bpe subword_nmt`` produces, so reproducing a fairseq model's input exactly means running the
same code, not a second implementation of it. The codes travel inside the checkpoint as text.
"""

from __future__ import annotations

import io
from typing import Sequence

from nmt.data.dictionary import Dictionary
from nmt.data.subword_base import SubwordModel
from nmt.errors import NmtError

INSTALL_HINT = "pip install 'nmt[fairseq]' (or: pip install subword-nmt)"


def check_codes(codes: str, name: str = "BPE codes") -> None:
    """Refuse, in one line, codes subword-nmt cannot read (it would print and exit instead)."""
    lines = codes.rstrip("\n").split("\n")
    first = 1 if lines and lines[0].startswith("#version:") else 0
    if len(lines) <= first or not codes.strip():
        raise NmtError(f"{name}: empty, no BPE merges")
    for n, line in enumerate(lines[first:], first + 1):
        fields = line.strip("\r\n ").split(" ")
        if len(fields) != 2:
            hint = (" (three fields: fastBPE codes, which nmt does not apply)"
                    if len(fields) == 3 and fields[2].isdigit() else "")
            raise NmtError(f"{name}: line {n}: expected two subword units, got {line[:60]!r}"
                           f"{hint}")


class SubwordNmtBPE(SubwordModel):
    """subword-nmt BPE codes + a dictionary (ids are that dictionary's)."""

    kind = "subword_nmt"
    suffix = ".codes"

    def __init__(self, codes: str, dictionary: Dictionary, separator: str = "@@"):
        check_codes(codes)
        try:
            from subword_nmt.apply_bpe import BPE
        except ImportError:
            raise NmtError(f"this model's BPE codes are applied with subword-nmt, which is not "
                           f"installed: {INSTALL_HINT}") from None
        self.codes, self.separator, self._dict = codes, separator, dictionary
        self.bpe = BPE(io.StringIO(codes), separator=separator)

    def pieces(self, line: str) -> list[str]:
        # fairseq: bpe.encode(line) = process_line, then the dictionary splits on whitespace.
        return self.bpe.process_line(line).split()

    def encode_ids(self, lines: Sequence[str]) -> list[list[int]]:
        return [self._dict.encode_tokens(self.pieces(line)) for line in lines]

    def decode_ids(self, ids: Sequence[int]) -> str:
        # fairseq's SubwordNMTBPE.decode: drop every "@@ " of the space-joined symbols.
        text = " ".join(self._dict[int(i)] for i in ids)
        return (text + " ").replace(self.separator + " ", "").rstrip()

    def dictionary(self) -> Dictionary:
        return self._dict

    def to_state(self) -> dict:
        return {"kind": self.kind, "codes": self.codes, "separator": self.separator}

    @classmethod
    def from_state(cls, state: dict, dictionary: Dictionary) -> "SubwordNmtBPE":
        return cls(state["codes"], dictionary, state.get("separator", "@@"))


class FairseqSentencePiece(SubwordModel):
    """A sentencepiece model's pieces looked up in a fairseq dictionary (not sentencepiece's
    own ids), decoded as fairseq's SentencepieceBPE does."""

    kind = "fairseq_sentencepiece"
    suffix = ".model"

    def __init__(self, proto: bytes, dictionary: Dictionary):
        import sentencepiece as spm
        self.proto, self._dict = proto, dictionary
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(proto)
        except Exception as e:  # noqa: BLE001 - sentencepiece raises bare RuntimeError/OSError
            raise NmtError(f"invalid sentencepiece model: {' '.join(str(e).split())}") from None

    def pieces(self, line: str) -> list[str]:
        return self.sp.encode(line, out_type=str)

    def encode_ids(self, lines: Sequence[str]) -> list[list[int]]:
        return [self._dict.encode_tokens(self.pieces(line)) for line in lines]

    def decode_ids(self, ids: Sequence[int]) -> str:
        text = " ".join(self._dict[int(i)] for i in ids)
        return text.replace(" ", "").replace("\u2581", " ").strip()

    def dictionary(self) -> Dictionary:
        return self._dict

    def to_state(self) -> dict:
        import base64
        return {"kind": self.kind, "model": base64.b64encode(self.proto).decode("ascii")}

    @classmethod
    def from_state(cls, state: dict, dictionary: Dictionary) -> "FairseqSentencePiece":
        import base64
        return cls(base64.b64decode(state["model"]), dictionary)


__all__ = ["SubwordNmtBPE", "FairseqSentencePiece", "check_codes"]
