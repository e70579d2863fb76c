"""Process-level performance settings that the commands apply at start-up."""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger("nmt.perf")

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_applied = False


def keep_freed_memory() -> bool:
    """Stop glibc from handing large freed buffers back to the kernel.

    A training step allocates the same large tensors every time (logits of several hundred MB,
    gradients), and so does a decoding step of beam search over a large vocabulary (46 MB of
    logits for 200 rows of 58k words). By default glibc serves each allocation over 32 MB with
    its own mmap and unmaps it on free, so every step page-faults those zeroed pages back in;
    on a 2-core CPU that was ~34,000 page faults a second and about 5% of a training step, and
    about half of an int8 beam-4 step on the OPUS-MT architecture. Serving them from the heap
    and not trimming it keeps those pages for the next step. Memory freed after the peak is
    returned only when the process ends, and blocks that a later, larger request cannot use
    stay in the heap: decoding the OPUS-MT architecture peaked 10-25% higher. Linux/glibc
    only; set NMT_MALLOC_TUNING=0 to disable. The commands call it at start-up, and
    Translator.from_checkpoint when it loads a model on a CPU.
    """
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux") or os.environ.get("NMT_MALLOC_TUNING", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False                      # not glibc (e.g. musl): nothing to tune
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, 2 ** 31 - 1) == 1
    _applied = ok
    log.debug("glibc malloc tuning %s", "applied" if ok else "refused")
    return ok
