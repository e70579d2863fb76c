"""Import a fairseq (0.9-0.12) Transformer checkpoint as an nmt checkpoint that translates
exactly as fairseq does.

    ckpt = import_fairseq("checkpoint_best.pt", "data-bin", bpe_codes="bpecodes",
                          moses="en-de")
    nmt.checkpoint.save_checkpoint(ckpt, "model.pt")

What is carried over: the architecture (fairseq's args -> ModelConfig: every option either maps
to a field or is refused with one line naming it, never approximated), the weights (renamed;
the embedding and output rows permuted from fairseq's <s>,<pad>,</s>,<unk> to nmt's
<pad>,<s>,</s>,<unk>), the dictionaries, the text pipeline (Moses with fairseq's settings and
subword-nmt BPE codes, or a sentencepiece model) and fairseq's decoding defaults (beam 5,
lenpen 1.0 dividing by length, at most 200 tokens, decoding from </s>).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import torch

from nmt.config import ModelConfig
from nmt.data.dictionary import Dictionary
from nmt.errors import NmtError
from nmt.importers.safe_pickle import load_foreign, plain
from nmt.io import check_readable, iter_lines

WHAT = "fairseq checkpoint"
# fairseq's transformer family: one model class, these presets (same modules, other sizes).
TRANSFORMER_ARCHS = frozenset({
    "transformer", "transformer_iwslt_de_en", "transformer_wmt_en_de",
    "transformer_vaswani_wmt_en_de_big", "transformer_vaswani_wmt_en_fr_big",
    "transformer_wmt_en_de_big", "transformer_wmt_en_de_big_t2t", "transformer_tiny",
    "transformer_align", "transformer_wmt_en_de_big_align"})
# fairseq's dictionary puts its specials first in this order; nmt's are PAD, BOS, EOS, UNK.
FAIRSEQ_SPECIALS = {"bos": 0, "pad": 1, "eos": 2, "unk": 3}
# Row i of an nmt embedding is row NMT_FROM_FAIRSEQ[i] of fairseq's (then the same symbols).
NMT_FROM_FAIRSEQ = (1, 0, 2, 3)


def read_checkpoint(path: str | os.PathLike) -> tuple[dict, dict]:
    """(model args as a flat dict, state dict) of a fairseq checkpoint, read safely."""
    ckpt = plain(load_foreign(path, WHAT))
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict):
        raise NmtError(f"{path}: not a {WHAT} (no 'model' weights)")
    state = ckpt["model"]
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise NmtError(f"{path}: not a {WHAT} ('model' is not a tensor dictionary)")
    cfg = ckpt.get("cfg") if isinstance(ckpt.get("cfg"), dict) else {}
    args = cfg.get("model") or ckpt.get("args")
    if not isinstance(args, dict):
        raise NmtError(f"{path}: {WHAT} without its model arguments (no cfg.model or args)")
    args = _flatten(args)
    task = cfg.get("task") if isinstance(cfg.get("task"), dict) else {}
    for key in ("source_lang", "target_lang"):
        if args.get(key) is None and task.get(key) is not None:
            args[key] = task[key]
    return args, state


def _flatten(args: Mapping[str, Any]) -> dict:
    """fairseq >= 0.12's dataclass form nests encoder/decoder options ({"encoder":
    {"embed_dim": ...}}); the legacy form, what most checkpoints hold, is flat."""
    out = dict(args)
    for side in ("encoder", "decoder"):
        nested = out.pop(side, None)
        if isinstance(nested, dict):
            for k, v in nested.items():
                out.setdefault(f"{side}_{k}", v)
    return out


def load_dictionary(path: Path) -> Dictionary:
    """A fairseq dict.LANG.txt: ``symbol count [#fairseq:overwrite]`` lines after the four
    implicit specials, madeupword padding included; nmt ids = fairseq ids with 0 and 1
    swapped (pad and bos), which nmt's Dictionary gives when built from the same lines."""
    p = check_readable(path, "fairseq dictionary", expected="a dict.LANG.txt file")
    symbols, counts = [], []
    for lineno, line in enumerate(iter_lines(p), 1):
        line = line.rstrip()
        body, _, field = line.rpartition(" ")
        if field == "#fairseq:overwrite":
            body, _, field = body.rpartition(" ")
        if not body or not field.lstrip("-").isdigit():
            raise NmtError(f"{p}: line {lineno}: expected 'symbol count', got {line[:60]!r}")
        symbols.append(body)
        counts.append(max(0, int(field)))
    d = Dictionary(symbols, counts)
    if len(d) != len(symbols) + 4:
        raise NmtError(f"{p}: repeats a symbol or names a special one (<s>, <pad>, </s>, "
                       f"<unk>): not a dictionary nmt can map row for row")
    return d


def nmt_rows(fairseq_rows: torch.Tensor) -> torch.Tensor:
    """Embedding/output rows in nmt's order: fairseq's with <s> and <pad> swapped."""
    order = torch.arange(fairseq_rows.size(0))
    order[:4] = torch.tensor(NMT_FROM_FAIRSEQ)
    return fairseq_rows.index_select(0, order).clone()


__all__ = ["read_checkpoint", "load_dictionary", "nmt_rows", "TRANSFORMER_ARCHS"]
