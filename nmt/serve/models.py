"""The models nmt-serve serves: their names, their loading, their batchers.

``nmt-serve a.pt NAME=b.pt`` serves two models, named ``a`` (a file's stem) and ``NAME``.
Each is loaded with ``Translator.from_checkpoint`` (batching by ``--max-batch-tokens``, the
checkpoint's preset decoding) and gets one ``Batcher`` (one decoding thread).
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from nmt.errors import UsageError
from nmt.serve.config import ServeConfig

log = logging.getLogger("nmt.serve")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str


def parse_specs(args: Sequence[str]) -> list[ModelSpec]:
    """CHECKPOINT or NAME=CHECKPOINT arguments as specs; names unique, files present."""
    if not args:
        raise UsageError("no CHECKPOINT given: nmt-serve CHECKPOINT... (or NAME=CHECKPOINT)")
    specs: list[ModelSpec] = []
    for arg in args:
        name, sep, path = arg.partition("=")
        # A file whose name holds "=" (lr=0.001.pt) is a CHECKPOINT, not NAME=CHECKPOINT.
        if not sep or not _NAME.fullmatch(name) or Path(arg).is_file():
            name, path = Path(arg).stem, arg
        if not path:
            raise UsageError(f"'{arg}': no checkpoint after '='")
        if not Path(path).is_file():
            raise UsageError(f"{path}: no such checkpoint file")
        if any(s.name == name for s in specs):
            raise UsageError(f"two models named '{name}': name them apart with "
                             f"NAME=CHECKPOINT")
        specs.append(ModelSpec(name, path))
    return specs


@dataclass
class ServedModel:
    """A loaded model: its Translator (the checkpoint's preset decoding), the longest source it
    takes, and its batcher."""
    name: str
    path: str
    translator: object
    batcher: object
    max_sentence_tokens: int


class Models:
    """The served models, loaded on a background thread so that /health answers meanwhile."""

    def __init__(self, specs: Sequence[ModelSpec], cfg: ServeConfig, device: str = "auto",
                 precision: str = "fp32", threads: int | None = None):
        self.specs, self.cfg = list(specs), cfg
        self.device, self.precision, self.threads = device, precision, threads
        self.loaded: dict[str, ServedModel] = {}
        self.ready = threading.Event()
        self.error: BaseException | None = None      # why loading failed

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def load_in_background(self, on_failure=None) -> threading.Thread:
        """Load every model on a thread; ``on_failure()`` is called if one cannot be loaded
        (``self.error`` says why)."""
        def run():
            try:
                for spec in self.specs:
                    self.loaded[spec.name] = self._load(spec)
                self.ready.set()
                log.info("ready: %s", ", ".join(self.names))
            except BaseException as e:  # noqa: BLE001 - handed to the CLI, which reports it
                self.error = e
                if on_failure is not None:
                    on_failure()

        thread = threading.Thread(target=run, name="nmt-serve-load", daemon=True)
        thread.start()
        return thread

    def _load(self, spec: ModelSpec) -> ServedModel:
        from nmt.search.config import BatchConfig
        from nmt.serve.batching import Batcher

        cfg = self.cfg
        # one batch at a time: each model's batcher thread has all the threads (torch's count
        # is the process's, which two models decoding at once would share)
        batch = BatchConfig(max_tokens=cfg.max_batch_tokens, max_source_len=cfg.max_sentence_tokens,
                            parallel=1)
        if cfg.engine == "ctranslate2":
            from nmt.engines.ctranslate2 import CTranslate2Translator

            translator = CTranslate2Translator.from_checkpoint(
                spec.path, device=self.device, precision=self.precision, batch=batch,
                threads=self.threads)
        else:
            from nmt.search.translator import Translator

            translator = Translator.from_checkpoint(spec.path, device=self.device,
                                                    precision=self.precision, batch=batch)
        s = translator.search
        log.info("model '%s' (%s): beam %d, lenpen %g, max length %g * source + %d, "
                 "sources up to %d subwords, %s", spec.name, spec.path, s.beam, s.lenpen,
                 s.max_len_a, s.max_len_b, translator.max_source_len, translator.describe())
        batcher = Batcher(translator, spec.name, cfg.max_batch_tokens, cfg.max_wait_ms / 1000,
                          cfg.max_batch_search_tokens, cfg.max_queued_sentences)
        return ServedModel(spec.name, spec.path, translator, batcher.start(),
                           translator.max_source_len)

    @property
    def broken(self) -> list[str]:
        """The names of the models whose decoding thread has failed."""
        return [name for name, m in list(self.loaded.items()) if m.batcher.broken is not None]

    def stop(self, timeout: float | None = None) -> None:
        """End every batcher's thread: what is still queued is dropped (its requests have been
        answered); a batch being decoded gets ``timeout`` seconds (None: all it takes)."""
        for served in list(self.loaded.values()):      # (the loader may still be adding)
            served.batcher.stop(timeout, drop=True)


__all__ = ["ModelSpec", "parse_specs", "ServedModel", "Models"]
