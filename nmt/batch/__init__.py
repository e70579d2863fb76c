"""Translating files and streams at scale: the options of a batch run (GenerateConfig), input
read in chunks, output that resumes where a stopped run left off, worker processes and
torchrun shards. nmt-generate is a thin command over this package."""

from typing import Any

__all__ = ["GenerateConfig", "Summary", "translate_file"]


def __getattr__(name: str) -> Any:
    # Lazily: a worker or a CTranslate2 run imports nmt.batch.config without the rest.
    if name == "GenerateConfig":
        from nmt.batch.config import GenerateConfig

        return GenerateConfig
    if name in ("Summary", "translate_file"):
        from nmt.batch import run

        return getattr(run, name)
    raise AttributeError(f"module 'nmt.batch' has no attribute {name!r}")
