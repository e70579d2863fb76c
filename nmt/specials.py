"""The four special symbols every dictionary starts with, and their ids (defined here only).

Every vocabulary nmt writes begins with these symbols at ids 0-3, so models, search, batching
and codecs agree on them without looking at a dictionary.
"""

from __future__ import annotations

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")

__all__ = ["PAD", "BOS", "EOS", "UNK", "SPECIALS"]
