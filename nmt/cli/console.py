"""What every console script shares: error handling, logging to stderr, progress bars.

Data goes to stdout; logs, tables and progress bars go to stderr (``console``).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import sys
import time
from typing import Callable, TypeVar

import click
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from nmt.errors import NmtError, UsageError

console = Console(stderr=True)
if not console.is_terminal and not os.environ.get("COLUMNS"):
    # Captured to a file or a pipe: rich would assume 80 columns and cut table cells to
    # "spl…"; a log is read later, in any editor, so give tables the room they need.
    console = Console(stderr=True, width=160)
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


def setup_runtime(verbose: bool, quiet: bool, threads: int | None,
                  torch_threads: bool = True) -> None:
    """Logging, glibc's allocator (nmt.perf) and PyTorch's CPU threads (unless
    ``torch_threads`` is False: another engine decodes, given its threads itself), for the
    commands that run a model (nmt-train, nmt-generate, nmt-serve)."""
    setup_logging(verbose, quiet)
    from nmt.perf import keep_freed_memory

    keep_freed_memory()
    if threads is not None:
        if threads < 1:
            raise UsageError("--threads must be >= 1")
        if not torch_threads:
            return
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
            except KeyboardInterrupt as e:
                die(prog, str(e) or "interrupted", getattr(e, "exit_code", 130))
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


class Command(click.Command):
    """A click command whose usage errors are one line, as every other error of nmt:
    ``nmt-train: error: no such option --train-pref (did you mean --trainpref?)``, exit 2.

    Use as ``@click.command(cls=Command, prog="nmt-train", ...)``."""

    def __init__(self, *args, prog: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.prog = prog

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            rv = super().main(args, prog_name or self.prog, complete_var, False, **extra)
        except click.exceptions.NoSuchOption as e:
            die(self.prog, f"no such option {e.option_name}"
                           f"{suggest_option(e.option_name, self.long_options())}", 2)
        except click.UsageError as e:
            die(self.prog, " ".join(e.format_message().split()), 2)
        except click.ClickException as e:
            die(self.prog, " ".join(e.format_message().split()), e.exit_code)
        except click.exceptions.Abort:
            die(self.prog, "interrupted", 130)
        raise SystemExit(rv if isinstance(rv, int) else 0)

    def long_options(self) -> list[str]:
        names = [n for p in self.params if isinstance(p, click.Option)
                 for n in (*p.opts, *p.secondary_opts) if n.startswith("--")]
        return names + ["--help"]


# What users call a subcommand by other names (nmt-import hf -> huggingface).
SUBCOMMAND_HINTS = {"hf": "huggingface", "hugging-face": "huggingface", "marian": "huggingface",
                    "opus-mt": "huggingface", "transformers": "huggingface"}


class Group(Command, click.Group):
    """A click group (a command with subcommands, ``nmt-import huggingface ...``) whose usage
    errors are one line too: ``@click.group(cls=Group, prog="nmt-import")``; an unknown
    subcommand names the one it probably means."""

    def resolve_command(self, ctx, args):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            import difflib

            names = list(self.list_commands(ctx))
            pick = SUBCOMMAND_HINTS.get(name.lower()) or next(
                iter(difflib.get_close_matches(name.lower(), names, 1, 0.6)), None)
            if pick in names:
                ctx.fail(f"No such command '{name}' (did you mean '{pick}'?).")
        return super().resolve_command(ctx, args)


def suggest_option(given: str, options: list[str]) -> str:
    """' (did you mean --x?)': an option that the given one starts (--lr -> --lr-scale), is
    spelled alike without dashes (--train-pref -> --trainpref), or resembles; else ''."""
    import difflib

    def bare(name: str) -> str:
        return name.lstrip("-").replace("-", "").replace("_", "")

    name = bare(given.split("=", 1)[0])
    by_bare = {bare(o): o for o in options}
    same = [o for b, o in by_bare.items() if b == name]
    starts = sorted((o for b, o in by_bare.items() if len(name) >= 2 and b.startswith(name)),
                    key=len)
    close = [by_bare[b] for b in difflib.get_close_matches(name, list(by_bare), n=2,
                                                           cutoff=0.75)]
    picks = list(dict.fromkeys(same or (starts[:1] + close)))[:2]
    return f" (did you mean {' or '.join(picks)}?)" if picks else ""


# Seconds between the progress lines logged instead of a bar when stderr is not a terminal
# (a job in the background, under a scheduler, in a pipeline's log file), as fairseq's simple
# log format does.
PROGRESS_LOG_SECONDS = 60.0


class LoggedProgress(Progress):
    """A rich progress bar on stderr where stderr is a terminal; elsewhere the bar is not
    drawn and a line is logged every ``log_every`` seconds instead (0: never): the task, how
    far it is, its rate field, the time taken and the time left."""

    def __init__(self, *columns, log_every: float, **kwargs):
        super().__init__(*columns, **kwargs)
        self.log_every = log_every
        self._logged_at = time.monotonic()

    def update(self, task_id, **kwargs) -> None:
        super().update(task_id, **kwargs)
        self._maybe_log(task_id)

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._maybe_log(task_id)

    def _maybe_log(self, task_id) -> None:
        if not self.disable or not self.log_every:
            return
        now = time.monotonic()
        if now - self._logged_at < self.log_every:
            return
        self._logged_at = now
        task = next((t for t in self.tasks if t.id == task_id), None)
        if task is None:
            return
        done = f"{int(task.completed):,}"
        if task.total:
            done += f" / {int(task.total):,} ({100 * task.completed / task.total:.0f}%)"
        rate = task.fields.get("rate", "")
        left = task.time_remaining
        logging.getLogger("nmt.progress").info(
            "%s: %s%s, %s elapsed%s", task.description, done, f", {rate}" if rate else "",
            _duration(task.elapsed or 0.0),
            f", about {_duration(left)} left" if left is not None and task.total else "")


def _duration(seconds: float) -> str:
    s = int(seconds)
    return (f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else
            f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def make_progress(transient: bool = True, log_every: float | None = None) -> Progress:
    """A rich progress bar on stderr; where stderr is not a terminal, a progress line every
    ``log_every`` seconds instead (default PROGRESS_LOG_SECONDS; 0: none)."""
    return LoggedProgress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=transient,
        disable=not console.is_terminal,
        log_every=PROGRESS_LOG_SECONDS if log_every is None else log_every,
    )


def read_path_from_stdin(what: str) -> str:
    """Read the one line a previous command printed (pipeline composition)."""
    if sys.stdin is None or sys.stdin.isatty():
        raise NmtError(f"no {what} given and nothing piped on stdin")
    line = sys.stdin.buffer.readline().decode("utf-8", errors="replace").strip()
    if not line:
        raise NmtError(f"no {what} given and stdin was empty: {EMPTY_PIPE}")
    return line


# Said by a command whose piped stdin is empty: in a pipeline, the command before it failed.
EMPTY_PIPE = "in a pipeline, the command before this one printed nothing (see its error above)"
