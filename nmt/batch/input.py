"""nmt-generate's input, in chunks of at most --buffer-size lines: memory holds one chunk (and
its translations) whatever the input's size.

An --input file that is a regular file is read twice: a first pass checks every line (UTF-8,
and each jsonl request) and counts them, so that bad input writes nothing and the progress
bar knows its total; the second translates it chunk by chunk from line 1 (or from where an
interrupted run stopped: nmt.batch.resumable), each chunk with the byte offset past it.
The chunks are the same whatever the start, so a resumed run batches, and so translates,
exactly as an uninterrupted one. stdin, a pipe or a process substitution is read once, as it
comes (nmt.io.stream_batches).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterator

from nmt.batch.config import GenerateConfig

Chunks = Iterator[tuple[list, "int | None"]]     # (lines or jsonl requests, offset past them)


def input_chunks(cfg: GenerateConfig, start_line: int = 1, start_byte: int = 0
                 ) -> tuple[Chunks, int | None]:
    """The chunks of ``cfg``'s input from ``start_line`` (at byte ``start_byte``; only a
    regular file can start elsewhere than at line 1), and the input's line count when known
    before translating (a regular file)."""
    from nmt.io import is_regular_file, iter_line_chunks, iter_lines

    path = cfg.input_path if cfg.input_path not in (None, "-") else None
    jsonl = cfg.input_format == "jsonl"
    if path is not None and is_regular_file(path):
        total = check_input(path, cfg.buffer_size, jsonl)
        chunks: Chunks = iter_line_chunks(path, cfg.buffer_size, start_byte, start_line)
        return (_parsed(chunks, path, start_line) if jsonl else chunks), total
    if start_line != 1:
        raise ValueError("only a regular file can be read from a given line")
    if path is not None:                            # a pipe named on the command line
        lines = _chunks(iter_lines(path), cfg.buffer_size)
    else:
        # What has arrived, up to --buffer-size lines, as soon as no more input is pending:
        # a caller writing one line and waiting for it gets its answer; a file piped in
        # still fills whole batches.
        lines = _stdin_chunks(cfg.buffer_size)
    name = path or "<stdin>"
    chunks = ((chunk, None) for chunk in lines)
    return (_parsed(chunks, name, 1) if jsonl else chunks), None


def check_input(path: str, chunk_lines: int, jsonl: bool) -> int:
    """Read the whole file once, one chunk at a time: every line valid UTF-8 (and a valid
    request with --input-format jsonl), else a one-line NmtError naming it; the line count."""
    from nmt.io import iter_line_chunks
    from nmt.search.jsonl_input import parse_requests

    n = 0
    for chunk, _ in iter_line_chunks(path, chunk_lines):
        if jsonl:
            parse_requests(chunk, n + 1, path)
        n += len(chunk)
    return n


def check_forced_targets(path: str, translator: Callable[[], Any], chunk_lines: int) -> None:
    """Before anything is written: every forced prefix and lexical constraint of a jsonl
    --input file can be spelled and fits its line's length limit (the checks the Translator
    makes per chunk, which would otherwise stop a long run midway, on a line a rerun cannot get
    past). ``translator()`` gives the Translator, called at the first line with a prefix or
    constraints only (--workers builds one in the parent for this check alone)."""
    from nmt.io import iter_line_chunks
    from nmt.search.lexical import check_room, encode_constraints, refuse_with
    from nmt.search.prefix import check_spelled
    from nmt.search.jsonl_input import parse_requests

    t, n, refused = None, 0, False
    for chunk, _ in iter_line_chunks(path, chunk_lines):
        for i, r in enumerate(parse_requests(chunk, n + 1, path)):
            if not r.constraints and not r.prefix:
                continue
            if t is None:
                t = translator()
            t.check_targets([r.prefix], [r.constraints])     # the engine can force them
            if r.constraints and not refused:
                refuse_with(t.search, t.sampling is not None, t.constraints is not None)
                refused = True
            where = f"{path}: line {n + 1 + i}"
            ids = encode_constraints(t.tgt_codec, r.constraints, where)
            prefix = list(t.tgt_codec.encode(r.prefix)) if r.prefix else []
            check_spelled(t.tgt_codec, prefix, r.prefix, where)
            source = min(len(t.src_codec.encode(r.source)), t.max_source_len)
            check_room(ids, len(prefix), source, t.search, t.max_positions, where)
        n += len(chunk)


def _stdin_chunks(max_lines: int) -> Iterator[list[str]]:
    from nmt.io import iter_lines, stream_batches

    try:
        fd: int | None = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):   # an in-memory stdin (tests, notebooks)
        fd = None
    return (stream_batches(fd, max_lines) if fd is not None
            else _chunks(iter_lines(None), max_lines))


def _chunks(lines: Iterator[str], n: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _parsed(chunks: Chunks, name: str, first: int) -> Chunks:
    """Chunks of raw jsonl lines as chunks of requests (nmt.search.jsonl_input), line numbers
    counted across chunks."""
    from nmt.search.jsonl_input import parse_requests

    for chunk, offset in chunks:
        yield parse_requests(chunk, first, name), offset
        first += len(chunk)


__all__ = ["input_chunks", "check_input"]
