"""SIGINT/SIGTERM during training: finish the update, save, stop; a second signal stops at once."""

from __future__ import annotations

import signal
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
