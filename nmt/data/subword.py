"""Subword models: BPE (sentencepiece), wordpiece (HuggingFace tokenizers) and plain whitespace.

Every model maps text to ids that ARE dictionary ids: the learners are told to put the four
specials of docs/DESIGN.md at ids 0-3 and the dictionary is built from the model's vocabulary in
id order, so encoding needs no second lookup. Each model serializes to plain Python types
(``to_state``) so that checkpoints loaded with ``torch.load(weights_only=True)`` can carry it.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from nmt.data.dictionary import BOS, EOS, PAD, SPECIALS, UNK, Dictionary
from nmt.data.subword_base import SubwordModel  # noqa: F401 (re-exported)
from nmt.errors import NmtError

log = logging.getLogger("nmt.data.subword")

KINDS = ("bpe", "wordpiece", "none")
# Kinds of imported fairseq models' subwords: decoded and encoded, never learned.
IMPORTED_KINDS = ("subword_nmt", "fairseq_sentencepiece")


# --- BPE through sentencepiece -------------------------------------------------------------------

class SentencePieceBPE(SubwordModel):
    kind = "bpe"
    suffix = ".model"

    def __init__(self, proto: bytes, threads: int = 1):
        import sentencepiece as spm
        self.proto = proto
        self.threads = threads
        self.sp = spm.SentencePieceProcessor()
        self._dropout = None           # DropoutBPE, built on the first sampled encoding
        try:
            self.sp.LoadFromSerializedProto(proto)
        except Exception as e:  # noqa: BLE001 - sentencepiece raises bare RuntimeError/OSError
            raise NmtError(f"not a valid sentencepiece model ({_spm_reason(e)})") from None
        ids = (self.sp.pad_id(), self.sp.bos_id(), self.sp.eos_id(), self.sp.unk_id())
        if ids != (PAD, BOS, EOS, UNK):
            raise NmtError(f"sentencepiece model has special ids {ids} (pad, bos, eos, unk); "
                           f"nmt needs (0, 1, 2, 3): train it with nmt-preprocess")

    def encode_ids(self, lines: Sequence[str]) -> list[list[int]]:
        # With a list and num_threads > 1 the C++ side encodes in parallel, without the GIL.
        return self.sp.encode(list(lines), out_type=int, num_threads=self.threads)

    def encode_ids_dropout(self, lines: Sequence[str], p: float, seed: int
                           ) -> list[list[int]]:
        """BPE-dropout (Provilkov et al. 2020): each merge is left out with probability ``p``,
        so a word may come out in smaller pieces of the same vocabulary. The same ``seed``
        gives the same pieces in any process (:mod:`nmt.data.bpe_dropout`; sentencepiece's own
        sampling does not)."""
        if self._dropout is None:
            from nmt.data.bpe_dropout import DropoutBPE
            self._dropout = DropoutBPE(self.sp)
        return self._dropout.encode(lines, p, seed)

    def pieces(self, line: str) -> list[str]:
        return self.sp.encode(line, out_type=str)

    def decode_ids(self, ids: Sequence[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    def dictionary(self) -> Dictionary:
        n = self.sp.get_piece_size()
        return Dictionary([self.sp.id_to_piece(i) for i in range(len(SPECIALS), n)])

    def to_state(self) -> dict:
        return {"kind": self.kind, "model": base64.b64encode(self.proto).decode("ascii")}

    def identity(self) -> dict:
        """The model without what only records how it was trained (sentencepiece keeps its
        trainer's thread count, file names and sampling sizes in the model): the same text
        preprocessed with another --workers gives the same model."""
        return {"kind": self.kind, "model": encoding_proto(self.proto)}

    @classmethod
    def from_state(cls, state: dict) -> "SentencePieceBPE":
        return cls(base64.b64decode(state["model"]))

    def save(self, path: Path) -> None:
        from nmt.io import atomic_write
        with atomic_write(path) as f:
            f.write(self.proto)

    @classmethod
    def load(cls, path: Path) -> "SentencePieceBPE":
        data = read_model_bytes(path)
        try:
            return cls(data)
        except NmtError as e:
            raise NmtError(f"{path}: {e}") from None


# sentencepiece's TrainerSpec fields (sentencepiece_model.proto) that only say how the model
# was trained: input, model_prefix, self_test_sample_size, input_format, input_sentence_size,
# mining_ and training_sentence_size, seed_sentencepiece_size, num_threads,
# num_sub_iterations, shuffle_input_sentence, train_extremely_large_corpus.
TRAINING_ONLY = frozenset({1, 2, 6, 7, 11, 12, 13, 14, 16, 17, 19, 49})
TRAINER_SPEC = 2          # ModelProto.trainer_spec


def encoding_proto(proto: bytes) -> bytes:
    """``proto`` (a serialized sentencepiece ModelProto) without the TRAINING_ONLY fields of
    its trainer spec, as a comparison key (read with the protobuf wire format, so that nmt
    needs no protobuf package); the proto itself when it does not parse."""
    try:
        out = []
        for number, raw, payload in _wire_fields(proto):
            if number == TRAINER_SPEC:
                length, start = _varint(payload, 0)
                kept = [r for n, r, _ in _wire_fields(payload[start:start + length])
                        if n not in TRAINING_ONLY]
                raw = b"\x12" + b"".join(kept)       # a key, not a valid proto
            out.append(raw)
        return b"".join(out)
    except (IndexError, ValueError):
        return proto


def _wire_fields(buf: bytes) -> list[tuple[int, bytes, bytes]]:
    """(field number, the field's bytes, its value's bytes) of each field of a message."""
    out, i = [], 0
    while i < len(buf):
        key, start = _varint(buf, i)
        kind = key & 7
        if kind == 0:
            end = _varint(buf, start)[1]
        elif kind in (1, 5):
            end = start + (8 if kind == 1 else 4)
        elif kind == 2:
            length, at = _varint(buf, start)
            end = at + length
        else:
            raise ValueError(f"wire type {kind}")
        if end > len(buf):
            raise ValueError("truncated")
        out.append((key >> 3, buf[i:end], buf[start:end]))
        i = end
    return out


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _spm_reason(e: Exception) -> str:
    """sentencepiece's error, without its C++ source location ("INTERNAL: src/....cc(109)
    [model_proto->ParseFromArray(...)]"), which tells a user nothing."""
    text = " ".join(str(e).split())
    if "ParseFromArray" in text:
        return "it does not parse"
    # "INTERNAL: src/trainer_interface.cc(590) [(trainer_spec_.vocab_size()) == ...] Vocabulary
    # size is smaller than required_chars. 8 vs 34. ...": the reason follows the condition
    text = re.sub(r"^(INTERNAL|[A-Z_]+): \S+\.cc\(\d+\) (\[.*?\] )?", "", text)
    return text.replace("INTERNAL: ", "")[:160]


class SentencePieceVocab(SentencePieceBPE):
    """A sentencepiece model whose pieces are looked up in a separate vocabulary, as Marian
    (OPUS-MT) models use theirs: text -> pieces with the sentencepiece model, pieces -> ids
    through the dictionary (a piece it lacks is <unk>), never the sentencepiece ids.

    It reproduces transformers' MarianTokenizer: a leading language code such as ``>>deu<<``
    is one piece of its own, not passed to sentencepiece; decoding drops <unk> (what
    ``skip_special_tokens`` does), joins the pieces with the sentencepiece model, turns any
    '▁' left into spaces and strips the ends. The kind stays "bpe" (sentencepiece): word
    boundaries are marked '▁' and the exported files are the same as for nmt's own models.
    """

    def __init__(self, proto: bytes, dictionary: Dictionary, threads: int = 1):
        import sentencepiece as spm
        self.proto, self.threads, self._dict = proto, threads, dictionary
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(proto)
        except Exception as e:  # noqa: BLE001 - sentencepiece raises bare RuntimeError/OSError
            raise NmtError(f"invalid sentencepiece model: {' '.join(str(e).split())}") from None

    @staticmethod
    def _language_code(line: str) -> tuple[list[str], str]:
        """('>>xx<<' as a piece, the rest) as MarianTokenizer.remove_language_code splits."""
        end = line.find("<<") if line.startswith(">>") else -1
        return ([line[:end + 2]], line[end + 2:]) if end != -1 else ([], line)

    def pieces(self, line: str) -> list[str]:
        code, rest = self._language_code(line)
        return code + self.sp.encode(rest, out_type=str)

    def encode_ids(self, lines: Sequence[str]) -> list[list[int]]:
        split = [self._language_code(line) for line in lines]
        pieces = self.sp.encode([rest for _, rest in split], out_type=str,
                                num_threads=self.threads)
        index = self._dict.index
        return [[index(p) for p in code + ps] for (code, _), ps in zip(split, pieces)]

    def decode_ids(self, ids: Sequence[int]) -> str:
        pieces = [self._dict[int(i)] for i in ids if int(i) != UNK]
        return self.sp.decode_pieces(pieces).replace("\u2581", " ").strip()

    def dictionary(self) -> Dictionary:
        return self._dict

    def to_state(self) -> dict:
        # The dictionary travels in the codec state beside this one (TextCodec.to_state).
        return {**super().to_state(), "lookup": True}


def train_sentencepiece(sentences: Iterable[str], vocab_size: int,
                        character_coverage: float = 1.0, byte_fallback: bool = False,
                        threads: int = 1) -> SentencePieceBPE:
    """Learn a BPE model on ``sentences`` (a bounded sample: sentencepiece keeps them in memory).

    ``vocab_size`` includes the four specials. It is a soft limit, so a small corpus gives a
    smaller vocabulary instead of an error. ``character_coverage`` 1.0 keeps every character of
    the sample (right for alphabetic languages; 0.9995 suits CJK); ``byte_fallback`` spells
    unknown characters as UTF-8 bytes instead of <unk>.
    """
    import sentencepiece as spm
    # What reading the sentences raised (a signal's Interrupted, an error in the input): the
    # C++ side, which pulls them, turns it into a RuntimeError of its own text.
    raised: list[BaseException] = []

    def nonempty() -> Iterator[str]:
        try:
            # Empty lines teach nothing and sentencepiece warns about each.
            yield from (s for s in sentences if s.strip())
        except GeneratorExit:
            raise
        except BaseException as e:
            raised.append(e)
            raise

    it = nonempty()
    out = io.BytesIO()
    # sentencepiece's C++ side logs to file descriptor 2: catch it in a file and pass it on at
    # debug level (its own logstream= needs sys.stderr.fileno(), absent under test runners).
    log_buf = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
    saved_fd = _redirect_fd2(log_buf.fileno())
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=it, model_writer=out,
            model_type="bpe", vocab_size=vocab_size, hard_vocab_limit=False,
            character_coverage=character_coverage, byte_fallback=byte_fallback,
            num_threads=max(1, threads),
            input_sentence_size=0, shuffle_input_sentence=False,
            pad_id=PAD, bos_id=BOS, eos_id=EOS, unk_id=UNK,
            pad_piece=SPECIALS[PAD], bos_piece=SPECIALS[BOS], eos_piece=SPECIALS[EOS],
            unk_piece=SPECIALS[UNK],
            # Sentences up to 64 KiB take part; longer ones are rare noise.
            max_sentence_length=65536, minloglevel=1)
    except RuntimeError as e:
        if raised:
            raise raised[0] from None
        raise NmtError(f"sentencepiece training failed: {_spm_reason(e)}") from None
    finally:
        _restore_fd2(saved_fd)
        log_buf.seek(0)
        for line in log_buf.read().splitlines():
            if line.strip():
                log.debug("sentencepiece: %s", line)
        log_buf.close()
    return SentencePieceBPE(out.getvalue(), threads=threads)


def _redirect_fd2(target: int) -> int | None:
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(target, 2)
        return saved
    except OSError:
        return None


def _restore_fd2(saved: int | None) -> None:
    if saved is not None:
        os.dup2(saved, 2)
        os.close(saved)


# --- wordpiece through HuggingFace tokenizers --------------------------------------------------

CONT = "##"


class WordPiece(SubwordModel):
    """Greedy longest-match-first wordpiece; continuation pieces start with '##'.

    Words are split on whitespace only (punctuation stays attached and becomes '##' pieces), so
    decoding gives back the original text up to runs of spaces.
    """

    kind = "wordpiece"
    suffix = ".json"

    def __init__(self, tokenizer_json: str):
        from tokenizers import Tokenizer
        self.json = tokenizer_json
        try:
            self.tok = Tokenizer.from_str(tokenizer_json)
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
            # Short: serde's messages can quote a piece of the text.
            reason = " ".join(str(e).split())[:80]
            raise NmtError(f"not a valid wordpiece model ({reason})") from None
        # "</s>" written in the text is text, not an eos in the middle of a sentence.
        self.tok.encode_special_tokens = True
        vocab = self.tok.get_vocab(with_added_tokens=True)
        self._symbols = [""] * len(vocab)
        for s, i in vocab.items():
            if i >= len(self._symbols):
                raise NmtError("invalid wordpiece model: ids are not dense")
            self._symbols[i] = s
        if tuple(self._symbols[:len(SPECIALS)]) != SPECIALS:
            raise NmtError(f"wordpiece model has specials {self._symbols[:4]}; nmt needs "
                           f"{list(SPECIALS)} at ids 0-3: train it with nmt-preprocess")

    def encode_ids(self, lines: Sequence[str]) -> list[list[int]]:
        # encode_batch runs in parallel in Rust (unless TOKENIZERS_PARALLELISM=false).
        return [e.ids for e in self.tok.encode_batch(list(lines), add_special_tokens=False)]

    def pieces(self, line: str) -> list[str]:
        return self.tok.encode(line, add_special_tokens=False).tokens

    def decode_ids(self, ids: Sequence[int]) -> str:
        return join_wordpieces(self._symbols[int(i)] if 0 <= int(i) < len(self._symbols)
                               else SPECIALS[UNK] for i in ids)

    def dictionary(self) -> Dictionary:
        return Dictionary(self._symbols[len(SPECIALS):])

    def to_state(self) -> dict:
        return {"kind": self.kind, "model": self.json}

    @classmethod
    def from_state(cls, state: dict) -> "WordPiece":
        return cls(state["model"])

    def save(self, path: Path) -> None:
        from nmt.io import write_text_atomic
        write_text_atomic(path, self.json)

    @classmethod
    def load(cls, path: Path) -> "WordPiece":
        data = read_model_bytes(path)
        try:
            return cls(data.decode("utf-8", errors="strict"))
        except UnicodeDecodeError as e:
            raise NmtError(f"{path}: not a valid wordpiece model (invalid UTF-8 at byte "
                           f"{e.start})") from None
        except NmtError as e:
            raise NmtError(f"{path}: {e}") from None


def join_wordpieces(pieces: Iterable[str]) -> str:
    """'##' pieces glue onto the previous piece; the others start a new space-separated word."""
    out: list[str] = []
    for p in pieces:
        if p.startswith(CONT) and out:
            out.append(p[len(CONT):])
        else:
            if out:
                out.append(" ")
            out.append(p[len(CONT):] if p.startswith(CONT) else p)
    return "".join(out)


def train_wordpiece(sentences: Iterable[str], vocab_size: int, min_frequency: int = 2
                    ) -> WordPiece:
    """A wordpiece model whose vocabulary is learnt by nmt.data.wordpiece_learner (the same
    on every run, unlike tokenizers' WordPieceTrainer), applied by tokenizers' WordPiece."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from nmt.data.wordpiece_learner import learn_wordpiece_vocab

    symbols = learn_wordpiece_vocab(sentences, vocab_size, min_frequency, SPECIALS)
    tok = Tokenizer(models.WordPiece({s: i for i, s in enumerate(symbols)},
                                     unk_token=SPECIALS[UNK], continuing_subword_prefix=CONT,
                                     max_input_chars_per_word=100))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIALS))
    return WordPiece(tok.to_str())


# --- whitespace tokens (pre-tokenized input) ---------------------------------------------------

class Whitespace(SubwordModel):
    """No subwords: tokens are the whitespace-separated fields, looked up in a dictionary."""

    kind = "none"

    def __init__(self, dictionary: Dictionary):
        self._dict = dictionary
        # Special symbols written in the text ("</s>") are ordinary unknown words, never an
        # eos in the middle of a sentence.
        self._lookup = {s: i for i, s in enumerate(dictionary.symbols) if i >= len(SPECIALS)}

    def encode_ids(self, lines: Sequence[str]) -> list[list[int]]:
        get = self._lookup.get
        return [[get(t, UNK) for t in line.split()] for line in lines]

    def pieces(self, line: str) -> list[str]:
        return line.split()

    def decode_ids(self, ids: Sequence[int]) -> str:
        d = self._dict
        return " ".join(d[int(i)] for i in ids)

    def dictionary(self) -> Dictionary:
        return self._dict

    def to_state(self) -> dict:
        return {"kind": self.kind}


def count_whitespace_tokens(lines: Iterable[str], counter: Counter | None = None) -> Counter:
    counter = counter if counter is not None else Counter()
    for line in lines:
        counter.update(line.split())
    return counter


def model_from_state(state: dict, dictionary: Dictionary) -> SubwordModel:
    kind = state.get("kind")
    if kind == "bpe" and state.get("lookup"):
        return SentencePieceVocab(base64.b64decode(state["model"]), dictionary)
    if kind == "bpe":
        return SentencePieceBPE.from_state(state)
    if kind == "wordpiece":
        return WordPiece.from_state(state)
    if kind == "none":
        return Whitespace(dictionary)
    if kind in IMPORTED_KINDS:    # imported fairseq models
        from nmt.data.fairseq_subword import FairseqSentencePiece, SubwordNmtBPE
        cls = SubwordNmtBPE if kind == "subword_nmt" else FairseqSentencePiece
        return cls.from_state(state, dictionary)
    raise NmtError(f"unknown subword kind {kind!r}; expected one of {', '.join(KINDS)}")


# The class load_model reads each kind's file back as (nmt.data.datadir keeps a codec whose
# subword model is of another class whole, since its file would not rebuild it).
FILE_CLASSES: dict[str, type[SubwordModel]] = {"bpe": SentencePieceBPE, "wordpiece": WordPiece,
                                               "none": Whitespace}


def load_model(kind: str, path: Path | None, dictionary: Dictionary | None) -> SubwordModel:
    if kind == "bpe":
        return SentencePieceBPE.load(path)
    if kind == "wordpiece":
        return WordPiece.load(path)
    if kind == "none":
        if dictionary is None:
            raise NmtError("subword 'none' needs a dictionary")
        return Whitespace(dictionary)
    raise NmtError(f"unknown subword kind {kind!r}; expected one of {', '.join(KINDS)}")


def read_model_bytes(path: Path | os.PathLike, what: str | None = None) -> bytes:
    """A model file's bytes, or a one-line NmtError naming it (and ``what`` it is)."""
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError:
        raise NmtError(f"{p}: no such file" + (f" ({what})" if what else "")) from None
    except OSError as e:
        raise NmtError(f"{p}: cannot read ({e.strerror})") from None


__all__ = ["KINDS", "IMPORTED_KINDS", "SubwordModel", "SentencePieceBPE", "SentencePieceVocab", "WordPiece", "Whitespace",
           "train_sentencepiece", "train_wordpiece", "count_whitespace_tokens",
           "model_from_state", "load_model", "FILE_CLASSES", "join_wordpieces"]
