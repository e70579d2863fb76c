"""What every console script shares: error handling, logging to stderr, progress bars.

Data goes to stdout; logs, tables and progress bars go to stderr (``console``).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import sys
from typing import Callable, TypeVar

import click
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from nmt.errors import NmtError, UsageError

console = Console(stderr=True)
# Errors of a write that the user's environment causes (full disk, quota, read-only, I/O).
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}
F = TypeVar("F", bound=Callable)


def setup_logging(verbose: bool = False, quiet: bool = False) -> None:
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    root = logging.getLogger("nmt")
    root.handlers.clear()
    if console.is_terminal:
        handler: logging.Handler = RichHandler(console=console, show_path=False,
                                               rich_tracebacks=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                                               datefmt="%Y-%m-%d %H:%M:%S"))
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def setup_runtime(verbose: bool, quiet: bool, threads: int | None) -> None:
    """Logging, glibc's allocator (nmt.perf) and PyTorch's CPU threads, for the commands that
    run a model (nmt-train, nmt-generate)."""
    setup_logging(verbose, quiet)
    from nmt.perf import keep_freed_memory

    keep_freed_memory()
    if threads is not None:
        if threads < 1:
            raise UsageError("--threads must be >= 1")
        import torch

        torch.set_num_threads(threads)


def die(prog: str, message: str, code: int = 1) -> "None":
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(code)


def handle_errors(prog: str) -> Callable[[F], F]:
    """Wrap a command body: NmtError and I/O failures become one stderr line and an exit code.

    Set NMT_DEBUG=1 to see the traceback of an unexpected error.
    """

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except NmtError as e:
                die(prog, str(e), e.exit_code)
            except click.exceptions.Exit:
                raise
            except click.ClickException:
                raise
            except KeyboardInterrupt:
                die(prog, "interrupted", 130)
            except BrokenPipeError:
                # The reader went away (e.g. `| head`): stop quietly, as Unix tools do.
                try:
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, sys.stdout.fileno())
                except OSError:
                    pass
                raise SystemExit(141)
            except MemoryError:
                die(prog, "out of memory", 1)
            except Exception as e:  # noqa: BLE001 - last line of defence against tracebacks
                if os.environ.get("NMT_DEBUG"):
                    raise
                if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
                    # Outside the writers that name their file (atomic_write, LineWriter):
                    # the environment's fault, e.g. a full disk, not an internal error.
                    die(prog, f"{e.filename or 'output'}: cannot write ({e.strerror})", 1)
                msg = " ".join(str(e).split()) or type(e).__name__
                die(prog, f"internal error: {type(e).__name__}: {msg} "
                          f"(set NMT_DEBUG=1 for the traceback)", 1)

        return wrapper  # type: ignore[return-value]

    return deco


def make_progress(transient: bool = True) -> Progress:
    """A rich progress bar on stderr; it draws nothing when stderr is not a terminal."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=transient,
        disable=not console.is_terminal,
    )


def read_path_from_stdin(what: str) -> str:
    """Read the one line a previous command printed (pipeline composition)."""
    if sys.stdin is None or sys.stdin.isatty():
        raise NmtError(f"no {what} given and nothing piped on stdin")
    line = sys.stdin.buffer.readline().decode("utf-8", errors="replace").strip()
    if not line:
        raise NmtError(f"no {what} given and stdin was empty")
    return line
