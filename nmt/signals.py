"""SIGINT and SIGTERM: what a command does when one arrives (stop cleanly, or finish what
must not be cut first; a second signal stops at once). Shared by the commands, the training
loop and batch translation."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator


class StoppedAtOnce(KeyboardInterrupt):
    """A second signal stopped training at once; the message says which checkpoint is intact
    (a KeyboardInterrupt, so that no ``except Exception`` on the way can swallow it)."""


class SignalCatcher:
    """Context manager: records the first SIGINT/SIGTERM in ``received`` (the loop reads it
    after the current update); a second one raises :class:`StoppedAtOnce` at once, which is
    safe because checkpoints are written atomically; its message is ``intact()``'s, which says
    what a rerun resumes from. Restores the previous handlers on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, intact: Callable[[], str] | None = None) -> None:
        self.received = 0
        self.intact = intact
        self._old: dict = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else "a signal"

    def _handler(self, signum, frame) -> None:
        if self.received:
            what = signal.Signals(signum).name
            try:
                detail = self.intact() if self.intact is not None else ""
            except Exception:  # noqa: BLE001 - never fail while stopping
                detail = ""
            stop = StoppedAtOnce(f"stopped at once by a second {what}" +
                                 (f"; {detail}" if detail else ""))
            stop.exit_code = 128 + signum         # 143 for SIGTERM, as the first one's
            raise stop
        self.received = signum

    def __enter__(self) -> "SignalCatcher":
        self.received = 0
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                try:
                    self._old[sig] = signal.signal(sig, self._handler)
                except (ValueError, OSError):
                    pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
        self._old = {}


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped a command (a KeyboardInterrupt, so that no ``except
    Exception`` on the way swallows it); exit code 128 + the signal number."""

    def __init__(self, signum: int, detail: str = ""):
        super().__init__(f"interrupted by {signal.Signals(signum).name}" +
                         (f"; {detail}" if detail else ""))
        self.signum, self.exit_code = signum, 128 + signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` inside (SIGTERM would otherwise end the
    process on the spot, leaving temporary files and half-written output): the ``finally``
    and ``except`` blocks on the way clean up. Use :func:`signals_deferred` around what must
    not be cut. Previous handlers come back on exit."""
    def handler(signum, frame):
        raise Interrupted(signum)

    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT/SIGTERM arriving inside take effect when it ends, as :class:`Interrupted`, so
    that e.g. a batch of output lines is written whole; a second signal stops at once
    (SignalCatcher, as nmt-train's updates)."""
    with SignalCatcher() as caught:
        yield
    if caught.received:
        raise Interrupted(caught.received)


__all__ = ["Interrupted", "SignalCatcher", "StoppedAtOnce", "signals_deferred",
           "stop_on_signals"]
