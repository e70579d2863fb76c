import numpy as np
import pytest

from nmt.data.buckets import BOS, EOS, PAD, TokenBatchSampler, collate, longest_first

from train_support import FakeData


def sizes(n=500, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 60, size=n), rng.integers(1, 60, size=n)


def test_batches_respect_max_tokens_and_cover_each_sentence_once():
    src, tgt = sizes()
    s = TokenBatchSampler(src, tgt, max_tokens=300, seed=3)
    batches = s.global_batches(1)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(len(src)))
    for b in batches:
        longest = int(np.maximum(src[b], tgt[b]).max()) + 1
        assert len(b) * longest <= 300


def test_bucketing_keeps_padding_low():
    src, tgt = sizes(2000)
    s = TokenBatchSampler(src, tgt, max_tokens=1000, seed=1)
    cost = np.maximum(src, tgt) + 1
    real = padded = 0
    for b in s.global_batches(1):
        real += int(cost[b].sum())
        padded += len(b) * int(cost[b].max())
        assert padded <= 1000 * len(s.global_batches(1))
    assert real / padded > 0.95
    # batches are nearly full: few more batches than the token count needs
    assert len(s.global_batches(1)) < 1.1 * cost.sum() / 1000 + 2


def test_deterministic_per_seed_and_epoch():
    src, tgt = sizes()
    a = TokenBatchSampler(src, tgt, 256, seed=5).global_batches(2)
    b = TokenBatchSampler(src, tgt, 256, seed=5).global_batches(2)
    c = TokenBatchSampler(src, tgt, 256, seed=5).global_batches(3)
    d = TokenBatchSampler(src, tgt, 256, seed=6).global_batches(2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    assert [x.tolist() for x in a] != [x.tolist() for x in c]
    assert [x.tolist() for x in a] != [x.tolist() for x in d]


def test_shards_partition_the_epoch_with_equal_lengths():
    src, tgt = sizes(301)
    g = TokenBatchSampler(src, tgt, 200, seed=2).global_batches(1)
    shards = [TokenBatchSampler(src, tgt, 200, seed=2, num_shards=3, shard_id=r).shard_batches(1)
              for r in range(3)]
    assert len({len(s) for s in shards}) == 1
    real = [b for s in shards for b in s if b is not None]
    assert len(real) == len(g)
    # rank r's i-th batch is global batch i * world + r
    for r, s in enumerate(shards):
        for i, b in enumerate(s):
            if b is not None:
                assert np.array_equal(b, g[i * 3 + r])


def test_too_long_sentences_are_skipped():
    s = TokenBatchSampler(np.array([3, 50, 4]), np.array([3, 4, 70]), max_tokens=40,
                          max_positions=60)
    assert s.num_skipped == 2
    assert sorted(np.concatenate(s.global_batches(1)).tolist()) == [0]


def test_collate_layout():
    data = FakeData(n_train=5).load_split("train")
    b = collate(data, [0, 1])
    for row, i in enumerate([0, 1]):
        x, y = data.src(i), data.tgt(i)
        assert b.src_tokens[row, :len(x)].tolist() == x.tolist()
        assert b.src_tokens[row, len(x)] == EOS
        assert b.prev_output_tokens[row, 0] == BOS
        assert b.prev_output_tokens[row, 1:len(y) + 1].tolist() == y.tolist()
        assert b.target[row, :len(y)].tolist() == y.tolist() and b.target[row, len(y)] == EOS
        assert (b.target[row, len(y) + 1:] == PAD).all()
    assert b.ntokens == int(data.tgt_sizes[[0, 1]].sum()) + 2


def test_bad_arguments():
    with pytest.raises(ValueError):
        TokenBatchSampler(np.array([1]), np.array([1]), max_tokens=0)


@pytest.mark.parametrize("max_tokens,max_sentences", [(40, None), (None, 3), (25, 4), (5, 2)])
def test_decode_batches_are_longest_first_within_limits(max_tokens, max_sentences):
    """The batches of translation and forced scoring: every item once, longest first (ties:
    the larger ``tie``, then input order), each batch within both limits unless one item alone
    is over max_tokens, and every batch as full as the limits allow."""
    rng = np.random.default_rng(7)
    widths = rng.integers(1, 12, size=60).tolist()
    tie = rng.integers(0, 3, size=60).tolist()
    batches = longest_first(widths, max_tokens, max_sentences, tie=tie)
    order = [i for b in batches for i in b]
    assert order == sorted(range(60), key=lambda i: (-widths[i], -tie[i], i))
    for b, after in zip(batches, batches[1:] + [None]):
        fits = lambda n, w: ((max_sentences is None or n <= max_sentences)   # noqa: E731
                             and (max_tokens is None or n * w <= max_tokens))
        assert len(b) == 1 or fits(len(b), widths[b[0]])
        if after is not None:                 # greedy: the next item would not have fitted
            assert not fits(len(b) + 1, widths[b[0]])
    among = [i for i in range(60) if i % 5]
    assert [i for b in longest_first(widths, max_tokens, max_sentences, among=among)
            for i in b] == sorted(among, key=lambda i: (-widths[i], i))
