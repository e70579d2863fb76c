"""Paths to the data files shipped inside the package."""

from __future__ import annotations

from pathlib import Path

_RESOURCES = Path(__file__).resolve().parent.parent / "resources"


def quickstart_dir() -> Path:
    """The bundled English-German quickstart corpus (a Multi30k slice).

    Holds ``train.{en,de}`` (3,000 pairs), ``valid.{en,de}`` and ``test.{en,de}`` (300 each), so
    ``nmt-preprocess -s en -t de --trainpref DIR/train --validpref DIR/valid --testpref DIR/test``
    works out of the box.
    """
    return _RESOURCES / "quickstart"
