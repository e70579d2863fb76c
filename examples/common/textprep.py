"""Text cleaning as the standard WMT recipes do it before tokenization.

``normalize-punctuation.perl`` then ``remove-non-printing-char.perl`` (fairseq's
prepare-wmt14en2de.sh), here through sacremoses' port of the first and a few lines for the
second. Training pairs with an empty side are dropped here; pairs too long or too unbalanced
(Moses' ``clean-corpus-n.perl``) are dropped by ``nmt-preprocess --max-len/--max-len-ratio``,
on subword tokens as the recipe does. Test and validation sets keep every line.
"""

from __future__ import annotations

import logging
import os
import unicodedata
from multiprocessing import Pool
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from nmt.data.moses import punct_normalizer
from nmt.errors import NmtError
from nmt.io import iter_lines

log = logging.getLogger("recipe.text")

def remove_non_printing(line: str) -> str:
    """Replace control/format/unassigned characters (Unicode category C*) with spaces."""
    if line.isprintable():           # fast path: nothing to do for almost every line
        return line
    return "".join(" " if unicodedata.category(c)[0] == "C" else c for c in line)


def clean_line(line: str, lang: str) -> str:
    line = punct_normalizer(lang).normalize(line)
    return " ".join(remove_non_printing(line).split())


def _clean_pairs(args: tuple[list[tuple[str, str]], str, str]) -> tuple[list[tuple[str, str]], int]:
    pairs, src_lang, tgt_lang = args
    kept = []
    for s, t in pairs:
        s, t = clean_line(s, src_lang), clean_line(t, tgt_lang)
        if s and t:
            kept.append((s, t))
    return kept, len(pairs)


def _chunks(src: Path, tgt: Path, size: int) -> Iterator[list[tuple[str, str]]]:
    chunk: list[tuple[str, str]] = []
    s_it, t_it = iter_lines(src), iter_lines(tgt)
    for s in s_it:
        t = next(t_it, None)
        if t is None:
            raise NmtError(f"{tgt} has fewer lines than {src}")
        chunk.append((s, t))
        if len(chunk) == size:
            yield chunk
            chunk = []
    if next(t_it, None) is not None:
        raise NmtError(f"{tgt} has more lines than {src}")
    if chunk:
        yield chunk


def clean_parallel(corpora: Sequence[tuple[Path, Path]], out_src: Path, out_tgt: Path,
                   src_lang: str, tgt_lang: str, *, jobs: int = 1) -> tuple[int, int]:
    """Clean and concatenate parallel corpora into ``out_src``/``out_tgt``; (read, kept)."""
    read = kept = 0
    tmp_s, tmp_t = out_src.with_suffix(out_src.suffix + ".tmp"), out_tgt.with_suffix(
        out_tgt.suffix + ".tmp")
    pool = Pool(jobs) if jobs > 1 else None
    try:
        with open(tmp_s, "w", encoding="utf-8", newline="\n") as fs, \
                open(tmp_t, "w", encoding="utf-8", newline="\n") as ft:
            for src, tgt in corpora:
                before = kept
                work: Iterable = ((c, src_lang, tgt_lang)
                                  for c in _chunks(src, tgt, 20000))
                results = pool.imap(_clean_pairs, work) if pool else map(_clean_pairs, work)
                for pairs, n in results:
                    read += n
                    kept += len(pairs)
                    for s, t in pairs:
                        fs.write(s + "\n")
                        ft.write(t + "\n")
                log.info("%s: kept %d pairs", src.name.rsplit(".", 1)[0], kept - before)
        os.replace(tmp_s, out_src)
        os.replace(tmp_t, out_tgt)
    finally:
        if pool:
            pool.close()
            pool.join()
        for t in (tmp_s, tmp_t):
            if t.exists():
                t.unlink()
    return read, kept


def write_lines(path: Path, lines: Iterable[str]) -> int:
    from nmt.io import atomic_write

    n = 0
    with atomic_write(path, "wb") as f:
        for line in lines:
            f.write((line + "\n").encode("utf-8"))
            n += 1
    return n
