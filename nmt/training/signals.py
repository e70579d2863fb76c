"""SIGINT/SIGTERM during training: finish the update, save, stop; a second signal stops at once."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from nmt.errors import NmtError


class TrainingInterrupted(NmtError):
    """SIGINT/SIGTERM arrived: a checkpoint was saved; exit code 128 + the signal number."""

    def __init__(self, signum: int, update: int, path: Path | None):
        name = signal.Signals(signum).name if signum else "a signal"
        saved = f"saved {path}" if path else "checkpoint saved by rank 0"
        super().__init__(f"interrupted by {name} at update {update}; {saved}; run the same "
                         f"command again to resume")
        self.exit_code = 128 + (signum or signal.SIGTERM)


class SignalCatcher:
    """Context manager: records the first SIGINT/SIGTERM in ``received`` (the loop reads it
    after the current update); a second one raises KeyboardInterrupt at once, which is safe
    because checkpoints are written atomically. Restores the previous handlers on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received = 0
        self._old: dict = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else "a signal"

    def _handler(self, signum, frame) -> None:
        if self.received:
            raise KeyboardInterrupt
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


__all__ = ["SignalCatcher", "TrainingInterrupted"]
