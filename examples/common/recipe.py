"""Resumable recipes: named steps that leave a marker when complete, and commands that a
``--dry-run`` prints instead of running.

A step is skipped when its marker ``WORK/.done/<step>.json`` exists, was written with the same
parameters, and every output it lists still has the size (files) or listing (directories) it had
when the step finished. Markers are written atomically after the outputs, so an interrupted
step is simply redone (or, for training, resumed by ``nmt-train`` from its own checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from nmt.errors import NmtError
from nmt.io import write_text_atomic

log = logging.getLogger("recipe")

REPO_ROOT = Path(__file__).resolve().parents[2]
NMT_COMMANDS = ("nmt-preprocess", "nmt-train", "nmt-generate", "nmt-score")


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s | %(name)s | %(message)s", datefmt="%H:%M:%S")


HASH_LIMIT = 64 << 20


def output_signature(path: Path) -> str | None:
    """sha1 of a file (size and mtime for files over 64 MiB, which are only ever replaced
    whole), or a digest of (relative path, size) of every file under a directory."""
    if path.is_file():
        st = path.stat()
        if st.st_size > HASH_LIMIT:
            return f"file:{st.st_size}:{st.st_mtime_ns}"
        h = hashlib.sha1()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return f"sha1:{h.hexdigest()}"
    if path.is_dir():
        h = hashlib.sha1()
        for p in sorted(path.rglob("*")):
            if p.is_file():
                h.update(f"{p.relative_to(path)}\0{p.stat().st_size}\n".encode())
        return f"dir:{h.hexdigest()}"
    return None


def resolve_command(cmd: Sequence[str]) -> list[str]:
    """Turn ``nmt-xxx`` into something runnable: the console script, or bin/ of this checkout."""
    cmd = list(cmd)
    for i, word in enumerate(cmd):
        if word in NMT_COMMANDS:
            found = shutil.which(word)
            if found:
                cmd[i] = found
            elif i == 0:
                cmd[i:i + 1] = [sys.executable, str(REPO_ROOT / "bin" / word)]
            else:
                cmd[i] = str(REPO_ROOT / "bin" / word)
            break
    return cmd


def validate_command(cmd: Sequence[str]) -> None:
    """Parse an nmt-* command line with the real click command, without running it.

    Catches misspelt options, bad numbers and bad choices in dry runs. Paths are not checked:
    they do not exist yet in a dry run.
    """
    words = list(cmd)
    if words and words[0] == "torchrun":
        words = words[words.index("--no-python") + 1:] if "--no-python" in words else []
    if not words or words[0] not in NMT_COMMANDS:
        return
    import importlib

    import click

    name = words[0]
    try:
        module = importlib.import_module(f"nmt.cli.{name.split('-', 1)[1]}")
    except ImportError as e:
        log.warning("cannot check `%s`: %s is not available (%s)", shlex.join(cmd), name, e)
        return
    command: click.Command = module.main
    shown = shlex.join(cmd)
    ctx = click.Context(command, info_name=name, resilient_parsing=True)
    try:
        values, _, _ = command.make_parser(ctx).parse_args(list(words[1:]))
    except click.UsageError as e:
        raise NmtError(f"invalid command `{shown}`: {e.format_message()}") from None
    # The resilient parser lets unknown options through: check them by hand.
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    for w in words[1:]:
        if w.startswith("-") and len(w) > 1 and not w[1:2].isdigit():
            flag = w.split("=", 1)[0]
            if flag not in known:
                raise NmtError(f"invalid command `{shown}`: no such option {flag}")
    # Convert every value except paths (they do not exist yet in a dry run): this checks
    # numbers and choices as the real run would.
    for param in command.params:
        if param.name not in values or isinstance(param.type, (click.Path, click.File)):
            continue
        try:
            param.type_cast_value(ctx, values[param.name])
        except click.BadParameter as e:
            raise NmtError(f"invalid command `{shown}`: {param.opts[-1]}: "
                           f"{e.format_message()}") from None


class Recipe:
    """Runs (or, with ``dry_run``, prints) the steps of one example under ``work_dir``."""

    def __init__(self, work_dir: Path, dry_run: bool = False, force: bool = False,
                 env: Mapping[str, str] | None = None, validate: bool = True):
        self.work_dir = Path(work_dir).resolve()
        self.dry_run = dry_run
        self.force = force
        self.env = dict(env or {})
        self.validate = validate
        self.commands: list[list[str]] = []   # every command issued, in order (for tests)
        if not dry_run:
            self.work_dir.mkdir(parents=True, exist_ok=True)

    # --- markers ---------------------------------------------------------------------------
    def marker(self, name: str) -> Path:
        return self.work_dir / ".done" / f"{name}.json"

    def _rel(self, p: Path) -> str:
        p = Path(p).resolve()
        try:
            return str(p.relative_to(self.work_dir))
        except ValueError:
            return str(p)

    def _abs(self, s: str) -> Path:
        p = Path(s)
        return p if p.is_absolute() else self.work_dir / p

    def is_done(self, name: str, params: Mapping) -> bool:
        m = self.marker(name)
        if not m.exists():
            return False
        try:
            data = json.loads(m.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        if data.get("params") != params:
            log.info("%s: parameters changed since it last ran; redoing it", name)
            return False
        for path, sig in data.get("outputs", {}).items():
            if output_signature(self._abs(path)) != sig:
                log.info("%s: output %s is missing or changed; redoing it", name, path)
                return False
        return True

    def mark_done(self, name: str, outputs: Iterable[Path], params: Mapping,
                  extra: Mapping | None = None) -> None:
        outs = {}
        for o in outputs:
            sig = output_signature(Path(o))
            if sig is None:
                raise NmtError(f"step {name} finished but did not produce {o}")
            outs[self._rel(o)] = sig
        self.marker(name).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.marker(name), json.dumps(
            {"params": params, "outputs": outs, **(extra or {})}, indent=1, sort_keys=True) + "\n")

    def forget(self, name: str) -> None:
        self.marker(name).unlink(missing_ok=True)

    # --- steps -----------------------------------------------------------------------------
    def step(self, name: str, outputs: Sequence[Path], action: Callable[[], None], *,
             params: Mapping | None = None, describe: str = "", python: bool = False,
             inputs: Sequence[Path] = (), on_stale: Callable[[], None] | None = None) -> bool:
        """Run ``action`` unless the step is already complete; returns whether it ran.

        ``python=True`` marks a step done in Python (download, text preparation): a dry run
        prints its description only. Other steps issue commands through :meth:`sh`, which a
        dry run prints. A change in an ``inputs`` file (an earlier step was redone) redoes it.
        ``on_stale`` is called first when the step had completed but must run again (its
        parameters, inputs or outputs changed since), e.g. to refuse to resume a finished run.
        """
        params = dict(params or {})
        if inputs and not self.dry_run:
            params["inputs"] = {self._rel(p): output_signature(Path(p)) for p in inputs}
        params = json.loads(json.dumps(params, sort_keys=True, default=str))
        done = not self.dry_run and self.is_done(name, params)
        if done and not self.force:
            log.info("%s: already complete, skipping", name)
            return False
        if on_stale is not None and not done and not self.dry_run and self.marker(name).exists():
            on_stale()
            # the marker described the refused run; from here it describes the new one only,
            # so that an interruption of the new run resumes instead of being refused again
            self.forget(name)
        if self.dry_run:
            print(f"# [{name}] {describe}".rstrip())
            if not python:
                action()
            return True
        log.info("%s: %s", name, describe or "running")
        action()
        self.mark_done(name, outputs, params)
        return True

    def sh(self, cmd: Sequence[str], stdout: Path | None = None,
           env: Mapping[str, str] | None = None) -> None:
        """Run one command (or print it in a dry run); ``stdout`` is written atomically."""
        cmd = [str(c) for c in cmd]
        shown = shlex.join(cmd) + (f" > {shlex.quote(str(stdout))}" if stdout else "")
        envs = {**self.env, **(env or {})}
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in envs.items())
        self.commands.append(cmd)
        if self.validate:
            validate_command(cmd)
        if self.dry_run:
            print(f"{prefix} {shown}".strip())
            return
        log.info("$ %s", f"{prefix} {shown}".strip())
        full_env = {**os.environ, **envs}
        real = resolve_command(cmd)
        try:
            if stdout is None:
                rc = subprocess.run(real, env=full_env).returncode
            else:
                stdout = Path(stdout)
                fd, tmp = tempfile.mkstemp(prefix=f".{stdout.name}.", suffix=".tmp",
                                           dir=stdout.parent)
                try:
                    with os.fdopen(fd, "wb") as f:
                        rc = subprocess.run(real, env=full_env, stdout=f).returncode
                    if rc == 0:
                        os.replace(tmp, stdout)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
        except FileNotFoundError:
            raise NmtError(f"command not found: {cmd[0]}") from None
        if rc != 0:
            raise NmtError(f"command failed with exit code {rc}: {shown}")


def run_main(prog: str, body: Callable[[], None]) -> None:
    """Run a script body: one-line errors on stderr and a non-zero exit, never a traceback."""
    try:
        body()
    except NmtError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        raise SystemExit(e.exit_code) from None
    except (OSError, UnicodeError) as e:        # a folder that is a file, a text not UTF-8
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        reason = getattr(e, "strerror", None) or " ".join(str(e).split())
        sys.stderr.write(f"{prog}: error: {where}{reason}\n")
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted (run it again to resume)\n")
        raise SystemExit(130) from None
