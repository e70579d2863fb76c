"""User-facing errors.

Anything a user can cause (a missing file, bad UTF-8, a wrong option) is raised as
:class:`NmtError`. The CLIs turn it into one line on stderr and a non-zero exit code;
library users catch it like any exception. Internal bugs stay ordinary exceptions.
"""

from __future__ import annotations

import difflib
from typing import Iterable


class NmtError(Exception):
    """An error caused by the user's input or environment; its message is one line."""

    exit_code = 1

    def __init__(self, message: str):
        # Keep the message on one line whatever the caller passed.
        super().__init__(" ".join(str(message).split()))


class UsageError(NmtError):
    """Bad options or arguments (exit code 2, like click's own usage errors)."""

    exit_code = 2


def suggest(name: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""
