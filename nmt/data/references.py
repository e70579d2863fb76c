"""The raw files a data directory's split was made from (references for decoding scores):
``<prefix>.<suffix>`` beside the files nmt-preprocess read, as recorded in meta.json."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from nmt.errors import NmtError


@dataclass
class References:
    """What decoded validation output is scored against."""

    lines: list[str]
    origin: str                  # the file, or "decoded references"
    sources: list[str] | None = None   # source words (bracket F1 de-linearizes over them)


def split_file(data, split: str, suffix: str) -> Path | None:
    """The raw file ``<prefix>.<suffix>`` that ``split`` was binarized from, if it exists."""
    info_of = getattr(data, "split_info", None)
    if info_of is None:
        return None
    info = info_of(split)
    prefix = info.get("source_path") or info.get("source_prefix")
    if not prefix:
        return None
    candidates = [Path(f"{prefix}.{suffix}")]
    base = getattr(data, "path", None)
    if base is not None and not os.path.isabs(prefix):
        candidates.append(Path(base).parent / f"{prefix}.{suffix}")
    return next((p for p in candidates if p.is_file()), None)


def check_count(lines: Sequence[str], n: int, path: Path) -> None:
    if len(lines) != n:
        raise NmtError(f"{path} has {len(lines)} lines but the validation split has {n} "
                       f"sentences")


__all__ = ["References", "split_file", "check_count"]
