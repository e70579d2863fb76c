"""SIGINT/SIGTERM during training: finish the update, save, stop; a second signal stops at once."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Callable

from nmt.errors import NmtError


class TrainingInterrupted(NmtError):
    """SIGINT/SIGTERM arrived: a checkpoint was saved; exit code 128 + the signal number."""

    def __init__(self, signum: int, update: int, path: Path | None):
        name = signal.Signals(signum).name if signum else "a signal"
        saved = f"saved {path}" if path else "checkpoint saved by rank 0"
        super().__init__(f"interrupted by {name} at update {update}; {saved}; run the same "
                         f"command again to resume")
        self.exit_code = 128 + (signum or signal.SIGTERM)


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


__all__ = ["SignalCatcher", "StoppedAtOnce", "TrainingInterrupted"]
