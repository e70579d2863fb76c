"""The four special symbols every dictionary starts with, and their ids (defined here only).

Every vocabulary nmt writes begins with these symbols at ids 0-3, so models, search, batching
and codecs agree on them without looking at a dictionary.
"""

from __future__ import annotations

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")
# The symbol the decoder reads before the first output token (ModelConfig.decoder_start): bos
# for nmt's models, eos for fairseq's, pad for Marian's.
START_IDS: dict[str, int] = {"bos": BOS, "eos": EOS, "pad": PAD}

__all__ = ["PAD", "BOS", "EOS", "UNK", "SPECIALS", "START_IDS"]
