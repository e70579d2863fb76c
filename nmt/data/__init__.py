"""Data: dictionaries, subword models, text codecs, memory-mapped shards, data directories.

    from nmt.data import DataDir
    dd = DataDir.open("data-bin/wmt14.en-de")
    ds = dd.load_split("train")
    dd.src_codec.decode(ds.src(0))
"""

from nmt.data.codec import TextCodec
from nmt.data.datadir import DataDir
from nmt.data.dictionary import BOS, EOS, PAD, UNK, Dictionary
from nmt.data.indexed import ParallelDataset

__all__ = ["DataDir", "ParallelDataset", "TextCodec", "Dictionary", "PAD", "BOS", "EOS", "UNK"]
