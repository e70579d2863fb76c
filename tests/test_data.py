"""Library-level tests of nmt.data: dictionary, subword models, codec state, memory-mapped shards."""

import io
import json

import numpy as np
import pytest
import torch

from nmt.data.codec import TextCodec, whitespace_codec
from nmt.data.datadir import DataDir
from nmt.data.dictionary import BOS, EOS, PAD, UNK, Dictionary
from nmt.data.indexed import IndexedDataset, SplitWriter, shard_prefix
from nmt.data.resources import quickstart_dir
from nmt.data.subword import WordPiece, train_sentencepiece, train_wordpiece
from nmt.errors import NmtError
from nmt.io import read_lines
from nmt.specials import SPECIALS

SENTS = [
    "A man in an orange hat starring at something.",
    "Two young, White males are outside near many bushes.",
    "A little girl climbing into a wooden playhouse.",
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
] * 20


def _plain(x) -> bool:
    """True when x holds only str/int/float/bool/None/list/dict."""
    if isinstance(x, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in x.items())
    if isinstance(x, list):
        return all(_plain(v) for v in x)
    return x is None or type(x) in (str, int, float, bool)


@pytest.fixture(scope="module")
def corpus():
    q = quickstart_dir()
    return read_lines(q / "train.en")[:800] + read_lines(q / "train.de")[:800]


# --- dictionary ---------------------------------------------------------------------------------

def test_dictionary_specials_counts_and_file_round_trip(tmp_path):
    d = Dictionary.from_counts({"b": 5, "a": 5, "c": 1, "d": 9, "<unk>": 100},
                               vocab_size=7, threshold=2)
    assert (d.pad(), d.bos(), d.eos(), d.unk()) == (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert d.symbols == ["<pad>", "<s>", "</s>", "<unk>", "d", "a", "b"]  # count, then symbol
    assert d.index("zzz") == UNK and d.index("a") == 5
    d.save(tmp_path / "dict.txt")
    assert (tmp_path / "dict.txt").read_text() == "d 9\na 5\nb 5\n"
    assert Dictionary.load(tmp_path / "dict.txt") == d
    (tmp_path / "bad.txt").write_text("a 1\nnocount\n")
    with pytest.raises(NmtError, match="line 2"):
        Dictionary.load(tmp_path / "bad.txt")
    assert d.dtype == np.uint16


def test_whitespace_codec_maps_spelled_specials_to_unk():
    d = Dictionary.from_counts({"hello": 2, "world": 1})
    c = whitespace_codec(d)
    assert c.encode("hello </s> world <s> x") == [4, UNK, 5, UNK, UNK]
    assert c.decode([4, 5, EOS, 4]) == "hello world"
    assert c.decode(torch.tensor([BOS, 4, PAD, 5])) == "hello world"


# --- subword models ------------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["signal", "input error"])
def test_what_reading_the_sentences_raised_leaves_sentencepiece_training_as_it_was(what):
    """A signal (Ctrl-C, SIGTERM) arriving while sentencepiece's C++ side pulled the sentences
    came out as "sentencepiece training failed: Interrupted: ..." and nmt-preprocess exited 1
    instead of 128 + the signal; an error reading the input was wrapped the same way."""
    import signal

    from nmt.signals import Interrupted
    exc = Interrupted(signal.SIGINT) if what == "signal" else NmtError("train.en: bad line 81")

    def sentences():
        for i, line in enumerate(SENTS):
            if i == 80:
                raise exc
            yield line

    with pytest.raises(type(exc)) as info:
        train_sentencepiece(sentences(), 60)
    assert info.value is exc
    # a sentencepiece error of its own still reads as one
    with pytest.raises(NmtError, match="sentencepiece training failed"):
        train_sentencepiece(iter(SENTS), 60, character_coverage=2.0)


def test_sentencepiece_round_trip_and_state_is_plain(corpus, tmp_path):
    codec = TextCodec(train_sentencepiece(corpus, 600))
    assert len(codec.dictionary) == 600
    assert codec.dictionary.symbols[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
    for line in corpus[:300]:
        ids = codec.encode(line)
        assert min(ids) > EOS
        assert codec.decode(ids + [EOS, 7, 8]) == line
    state = codec.to_state()
    assert _plain(state)
    # A checkpoint carrying the codec loads with weights_only=True.
    buf = io.BytesIO()
    torch.save({"src_codec": state}, buf)
    buf.seek(0)
    again = TextCodec.from_state(torch.load(buf, weights_only=True)["src_codec"])
    batch = again.encode_batch(corpus[:50])
    assert [b.tolist() for b in batch] == [codec.encode(x) for x in corpus[:50]]
    assert all(b.dtype == np.int64 for b in batch)


def test_wordpiece_is_greedy_longest_match_with_continuations():
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {s: i for i, s in enumerate(
        ["<pad>", "<s>", "</s>", "<unk>", "un", "u", "##a", "##aff", "##ff", "##able", "##abl",
         "##e", "play", "##ing", "##.", "a"])}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="<unk>",
                                     continuing_subword_prefix="##"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    codec = TextCodec(WordPiece(tok.to_str()))
    # Longest match first: "un" not "u", "##aff" not "##a", "##able" not "##abl".
    assert codec.pieces("unaffable playing.") == ["un", "##aff", "##able", "play", "##ing", "##."]
    assert codec.decode(codec.encode("unaffable playing.")) == "unaffable playing."
    # A word that cannot be covered is one <unk>, as in BERT's wordpiece.
    assert codec.encode("a xyz") == [vocab["a"], UNK]


def test_wordpiece_learner_merges_the_most_frequent_pair_ties_by_string():
    """Hand-checked on "low" x5, "lower" x2, "newest" x6, "widest" x3 (Sennrich et al.'s
    words): the alphabet by frequency (ties by string), then the merges. ##e+##s and ##s+##t
    both occur 9 times: "##e" < "##s" decides; then ##es+##t (9); ##o+##w and l+##o (7):
    "##o" < "l"; ... and at 2, ##e+##r before low+##e."""
    from nmt.data.wordpiece_learner import learn_wordpiece_vocab

    text = ["low"] * 5 + ["lower"] * 2 + ["newest"] * 6 + ["widest"] * 3
    vocab = learn_wordpiece_vocab(text, 27, 2, SPECIALS)
    assert vocab[:4] == list(SPECIALS)
    assert vocab[4:15] == ["##e", "##w", "##s", "##t", "##o", "l", "n", "##d", "##i", "w",
                           "##r"]
    assert vocab[15:] == ["##es", "##est", "##ow", "low", "##ew", "##ewest", "newest", "##dest",
                          "##idest", "widest", "##er", "lower"]
    # the same whatever the input order; a pair seen fewer than min_frequency times is
    # never merged
    assert learn_wordpiece_vocab(text[::-1], 27, 2, SPECIALS) == vocab
    assert learn_wordpiece_vocab(text, 100, 10, SPECIALS) == vocab[:15]


def test_trained_wordpiece_has_continuation_pieces(corpus):
    codec = TextCodec(train_wordpiece(corpus, 500))
    pieces = [p for line in corpus[:200] for p in codec.pieces(line)]
    assert any(p.startswith("##") for p in pieces)
    assert sum(s.startswith("##") for s in codec.dictionary.symbols) > 20
    for line in corpus[:200]:
        if "  " not in line:
            assert codec.decode(codec.encode(line)) == line
    assert codec.encode("</s>") != [EOS]
    assert _plain(codec.to_state())
    assert TextCodec.from_state(codec.to_state()).encode(corpus[0]) == codec.encode(corpus[0])


def test_moses_codec_detokenizes():
    words = " ".join(SENTS).replace(",", " ,").replace(".", " .").split()
    d = Dictionary.from_counts({w: 1 for w in words})
    c = whitespace_codec(d, moses_lang="en")
    line = "Two young, White males are outside near many bushes."
    assert c.pieces(line)[-2:] == ["bushes", "."]
    assert c.decode(c.encode(line)) == line


# --- shards --------------------------------------------------------------------------------------

def _random_corpus(rng, n):
    lens = rng.integers(0, 9, size=n).astype(np.int32)
    flat = rng.integers(4, 60000, size=int(lens.sum())).astype(np.uint16)
    return flat, lens


@pytest.mark.parametrize("shard_size", [0, 1, 7, 50])
def test_sharded_shards_read_back_like_one(tmp_path, shard_size):
    rng = np.random.default_rng(0)
    flat, lens = _random_corpus(rng, 50)
    w = SplitWriter(tmp_path, "train", "en", np.uint16, shard_size)
    # Feed in uneven chunks so shard boundaries fall inside chunks.
    cut = np.cumsum(lens)
    for a, b in [(0, 3), (3, 20), (20, 20), (20, 50)]:
        start = cut[a - 1] if a else 0
        w.add(flat[start:cut[b - 1] if b else 0], lens[a:b])
    shards = w.close()
    assert sum(shards) == 50 and (shard_size == 0 or max(shards) <= shard_size)
    ds = IndexedDataset([shard_prefix(tmp_path, "train", "en", k) for k in range(len(shards))],
                        np.uint16)
    assert ds.sizes.tolist() == lens.tolist()
    offsets = np.concatenate([[0], cut])
    for i in range(50):
        assert ds[i].tolist() == flat[offsets[i]:offsets[i + 1]].tolist()
    assert ds[-1].tolist() == ds[49].tolist()
    with pytest.raises(IndexError):
        ds[50]


def test_corrupt_shard_is_an_error(tmp_path):
    w = SplitWriter(tmp_path, "valid", "en", np.uint16)
    w.add(np.arange(4, 10, dtype=np.uint16), np.array([2, 4], np.int32))
    w.close()
    with open(tmp_path / "valid.en.0.bin", "ab") as f:
        f.write(b"\x00\x00")
    with pytest.raises(NmtError, match="corrupt"):
        IndexedDataset([shard_prefix(tmp_path, "valid", "en", 0)], np.uint16)


def test_datadir_open_errors(tmp_path):
    with pytest.raises(NmtError, match="no such data directory"):
        DataDir.open(tmp_path / "nope")
    with pytest.raises(NmtError, match="no meta.json"):
        DataDir.open(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(NmtError, match="format version 99"):
        DataDir.open(tmp_path)
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(NmtError, match="unreadable"):
        DataDir.open(tmp_path)


def test_training_sample_is_uniform_and_complete(tmp_path):
    from nmt.data.prepare import sample_pairs
    (tmp_path / "s.en").write_text("".join(f"{i}\n" for i in range(1000)))
    (tmp_path / "s.de").write_text("".join(f"d{i}\n" for i in range(1000)))
    hits = np.zeros(1000)
    for seed in range(150):
        s, t, n = sample_pairs(tmp_path / "s.en", tmp_path / "s.de", 100, seed)
        assert n == 1000 and len(set(s)) == 100 and t == [f"d{x}" for x in s]  # aligned pairs
        hits[[int(x) for x in s]] += 1
    # Every line has chance 0.1, wherever it is in the file (a biased reservoir favours the head).
    assert abs(hits[:200].mean() / 150 - 0.1) < 0.015
    assert abs(hits[-200:].mean() / 150 - 0.1) < 0.015
    s, _, n = sample_pairs(tmp_path / "s.en", tmp_path / "s.de", 5000, 0)
    assert n == 1000 and s == [str(i) for i in range(1000)]


@pytest.mark.parametrize("count", ["²", "٣", "1.5", "-2"])
def test_a_count_that_is_not_ascii_digits_is_a_clear_error(tmp_path, count):
    """str.isdigit() holds for '²' and '٣', which int() then refuses: not an internal error."""
    from nmt.errors import NmtError

    path = tmp_path / "dict.txt"
    path.write_text(f"a 3\nb {count}\n", encoding="utf-8")
    with pytest.raises(NmtError, match="line 2: not a dictionary line"):
        Dictionary.load(path)
