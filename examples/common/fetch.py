"""Downloads that resume, use local copies, and verify what they got.

What is verified, and why:

- the byte count announced by the server (Content-Length / Content-Range) for every download;
- a published checksum where one exists (``md5`` taken from sacrebleu's dataset table for the
  WMT test archives, sha256 of the Multi30k files measured on a copy of the public repository);
- for archives without a published checksum: integrity, by reading the whole compressed stream
  (gzip checks its CRC-32 and length at the end of the stream) while extracting, plus the line
  counts of the extracted files (the two sides of a parallel corpus must agree, test sets have
  known sizes).
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import shutil
import tarfile
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Iterable, Mapping

from nmt.errors import NmtError

log = logging.getLogger("recipe.fetch")

CHUNK = 1 << 20


def file_digest(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def count_lines(path: Path) -> int:
    """Number of lines as ``wc -l`` counts them, plus one for a last line without newline."""
    n = 0
    last = b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def download(url: str, dest: Path, retries: int = 5, timeout: float = 60.0) -> None:
    """Download ``url`` to ``dest`` through ``dest.part``, resuming a partial ``.part``.

    The final size must equal the size the server announced; the file is renamed into place
    only when complete.
    """
    part = dest.with_name(dest.name + ".part")
    for attempt in range(1, retries + 1):
        have = part.stat().st_size if part.exists() else 0
        req = urllib.request.Request(url, headers={"User-Agent": "nmt-examples/1.0"})
        if have:
            req.add_header("Range", f"bytes={have}-")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                if have and resp.status != 206:
                    log.info("%s: server ignores ranges; restarting the download", dest.name)
                    have = 0
                total = _announced_total(resp, have)
                with open(part, "ab" if have else "wb") as f:
                    for block in iter(lambda: resp.read(CHUNK), b""):
                        f.write(block)
            size = part.stat().st_size
            if total is not None and size != total:
                raise OSError(f"got {size} bytes, server announced {total}")
            os.replace(part, dest)
            log.info("%s: downloaded %d bytes", dest.name, size)
            return
        except urllib.error.HTTPError as e:
            if e.code == 416 and part.exists():   # range past the end: the .part is complete?
                os.replace(part, dest)
                return
            if 400 <= e.code < 500:
                raise NmtError(f"cannot download {url}: HTTP {e.code} {e.reason}") from None
            err: Exception = e
        except (OSError, urllib.error.URLError) as e:
            err = e
        log.warning("%s: attempt %d/%d failed (%s); resuming", dest.name, attempt, retries, err)
        time.sleep(min(30, 2 ** attempt))
    raise NmtError(f"cannot download {url} after {retries} attempts: {err}; run again to resume, "
                   f"or download it yourself and give the recipe its folder (see its --help)")


def _announced_total(resp, have: int) -> int | None:
    cr = resp.headers.get("Content-Range")          # "bytes 100-999/1000"
    if cr and "/" in cr and cr.rsplit("/", 1)[1].strip().isdigit():
        return int(cr.rsplit("/", 1)[1])
    cl = resp.headers.get("Content-Length")
    if cl and cl.isdigit():
        return int(cl) + (have if resp.status == 206 else 0)
    return None


def obtain(url: str, dest: Path, data_dir: Path | None, checksums: Mapping[str, str] | None = None
           ) -> None:
    """Put the file ``url`` names at ``dest``: from ``data_dir`` (a symlink) or downloaded.

    With a ``data_dir`` the file must be there under its usual name: nothing is downloaded, so
    that offline runs never reach the network by surprise. ``checksums`` maps an algorithm
    (``md5``, ``sha256``) to the published digest.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    if data_dir is None and dest.is_file() and not dest.is_symlink():
        # download() renames into place only complete files: this one finished earlier (the
        # run stopped before its marker was written). The checks below still run.
        log.info("%s: already downloaded", dest.name)
    elif data_dir is None:
        if dest.is_symlink():
            dest.unlink()
        log.info("downloading %s", url)
        download(url, dest)
    else:
        local = Path(data_dir) / dest.name
        if not local.is_file():
            raise NmtError(f"{dest.name} not found in {data_dir} (--data-dir); download {url} "
                           f"into that folder, or leave out --data-dir to download it")
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        dest.symlink_to(local.resolve())
        log.info("%s: using the local copy %s", dest.name, local)
    for algo, want in (checksums or {}).items():
        got = file_digest(dest, algo)
        if got != want:
            where = "your local copy" if data_dir is not None else "the download"
            if data_dir is None:
                dest.unlink()
            raise NmtError(f"{dest.name}: {algo} of {where} is {got}, expected {want} "
                           f"(corrupt or a different release)")
        log.info("%s: %s verified", dest.name, algo)


def extract_members(archive: Path, wanted: Iterable[str], out_dir: Path) -> dict[str, Path]:
    """Read a tar archive from start to end, writing the members whose base names are wanted.

    Reading every byte makes gzip check its CRC over the whole archive, so a truncated or
    corrupted download fails here. A member ``NAME.gz`` is wanted as ``NAME`` and decompressed
    (again with a CRC check). Files are written under ``out_dir`` by base name, through a
    temporary name; nothing outside ``out_dir`` is ever written.
    """
    wanted = set(wanted)
    out_dir.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    try:
        with tarfile.open(archive, "r|*") as tar:
            for member in tar:
                f = tar.extractfile(member) if member.isfile() else None
                if f is None:
                    continue
                base = Path(member.name).name
                inner_gz = base.endswith(".gz") and base[:-3] in wanted
                target = base[:-3] if inner_gz else base
                if target not in wanted:
                    for _ in iter(lambda: f.read(CHUNK), b""):   # read through: CRC check
                        pass
                    continue
                if target in found:
                    raise NmtError(f"{archive.name}: two members named {target}")
                dest = out_dir / target
                tmp = dest.with_name(dest.name + ".tmp")
                src = gzip.GzipFile(fileobj=f) if inner_gz else f
                with open(tmp, "wb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
                os.replace(tmp, dest)
                found[target] = dest
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile, OSError) as e:
        raise NmtError(f"{archive.name} is corrupt or truncated ({type(e).__name__}: {e}); "
                       f"delete it and run again") from None
    missing = sorted(wanted - set(found))
    if missing:
        raise NmtError(f"{archive.name}: expected files not in the archive: {', '.join(missing)}")
    return found


def check_line_counts(files: Mapping[str, Path], expected: Mapping[str, int] | None = None,
                      parallel: Iterable[tuple[str, str]] = ()) -> dict[str, int]:
    """Count lines; fail on a count that differs from ``expected`` or between parallel sides."""
    counts = {name: count_lines(p) for name, p in files.items()}
    for name, want in (expected or {}).items():
        if counts.get(name) != want:
            raise NmtError(f"{name}: {counts.get(name)} lines, expected {want} "
                           f"(truncated, or a different release)")
    for a, b in parallel:
        if counts[a] != counts[b]:
            raise NmtError(f"{a} has {counts[a]} lines but {b} has {counts[b]}: the parallel "
                           f"files do not match (truncated or corrupt archive?)")
        if counts[a] == 0:
            raise NmtError(f"{a} is empty")
    return counts


def sgm_segments(path: Path) -> list[str]:
    """The text of each ``<seg id=..>...</seg>`` line of a WMT (pseudo-)SGML file.

    Whitespace is collapsed and stripped as sacreBLEU does for its ``wmt14/full`` references,
    so a reference written from here scores the same as ``sacrebleu -t wmt14/full``.
    """
    import re

    seg = re.compile(r"<seg[^>]*>(.*)</seg>")
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("<seg "):
                m = seg.search(line)
                if m is None:
                    raise NmtError(f"{path}: malformed segment line: {line.strip()[:80]}")
                out.append(" ".join(m.group(1).split()))
    if not out:
        raise NmtError(f"{path}: no <seg> lines (not a WMT sgm file?)")
    return out
