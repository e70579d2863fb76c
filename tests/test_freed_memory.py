"""nmt.perf.keep_freed_memory: glibc's malloc keeps large freed blocks for reuse, so that a
step's large tensors (a beam's logits over a large vocabulary: tens of MB) stop faulting in
fresh pages at every step; ``NMT_MALLOC_TUNING=0`` leaves malloc as it was; the commands turn
it on at start-up, and Translator.from_checkpoint on a CPU (the Python API) too. Counted in
page faults (getrusage), not in time."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(platform.system() != "Linux"
                                or platform.libc_ver()[0] != "glibc",
                                reason="glibc's malloc only")

# Allocates, writes and frees a 64 MB tensor 20 times, as a decoding step does with its
# logits; prints whether the setting applied and the page faults of the last 10 rounds.
PROBE = """
import resource, sys, torch
from nmt import perf
if sys.argv[1] == "translator":
    from nmt.search.translator import Translator
    Translator.from_checkpoint(sys.argv[2], device="cpu")
    kept = perf._applied
else:
    kept = perf.keep_freed_memory()
    assert perf.keep_freed_memory() == kept           # the same answer when asked again
faults = []
for _ in range(20):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(16 << 20)
    del x
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(kept, sum(faults[10:]))
"""
PAGES = (64 << 20) // os.sysconf("SC_PAGE_SIZE")       # one round's worth of fresh pages


def probe(*args: str, env: dict | None = None) -> tuple[bool, int]:
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert r.returncode == 0, r.stderr[-2000:]
    kept, faults = r.stdout.split()
    return kept == "True", int(faults)


def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    kept, faults = probe("direct")
    assert kept
    assert faults < PAGES          # ten rounds: less than one round's fresh pages


def test_the_environment_turns_it_off():
    kept, faults = probe("direct", env={"NMT_MALLOC_TUNING": "0"})
    assert not kept
    assert faults >= 9 * PAGES     # glibc's default: every round maps fresh pages


def test_a_translator_on_the_cpu_turns_it_on(ckpt):
    kept, faults = probe("translator", str(ckpt))
    assert kept and faults < PAGES
