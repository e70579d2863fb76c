"""Batches decoded at once (BatchConfig.parallel, nmt-generate --parallel-batches): the same
translations in the same order as one batch at a time, errors and progress as before, torch's
threads given back; the auto rule; and CTranslate2's inter_threads through the engine."""

from __future__ import annotations

import threading

import pytest
import torch

from nmt.errors import NmtError, UsageError
from nmt.search.config import PARALLEL_BATCH_WIDTH, BatchConfig, SearchConfig, parallel_batches
from nmt.search.pipeline import split_for_threads
from nmt.search.translator import Translator

from test_translator import make_checkpoint, mixed_lines


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("par") / "tiny.pt")


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_the_auto_rule():
    assert parallel_batches(None, 2, 128, beam=4) == 2          # transformer_tiny's decoder
    assert parallel_batches(None, 8, 768, beam=5) == 2          # transformer_small's
    assert parallel_batches(None, 2, 128, beam=1) == 1          # greedy search gained nothing
    assert parallel_batches(None, 2, 3072, beam=4) == 1         # transformer_base's
    assert parallel_batches(None, 2, PARALLEL_BATCH_WIDTH + 1, beam=4) == 1
    assert parallel_batches(None, 1, 128, beam=4) == 1          # one thread
    assert parallel_batches(None, 2, None, beam=4) == 1         # width unknown
    assert parallel_batches(None, 2, 128, beam=4, on_cpu=False) == 1    # a GPU
    # CTranslate2: two at any width and beam
    assert parallel_batches(None, 2, 3072, beam=1, engine="ctranslate2") == 2
    assert parallel_batches(None, 1, 3072, beam=1, engine="ctranslate2") == 1
    assert parallel_batches(3, 8, 3072, beam=1) == 3            # asked for: kept ...
    assert parallel_batches(4, 2, 128, beam=1) == 2             # ... up to the threads
    with pytest.raises(UsageError, match="parallel batches must be >= 1"):
        BatchConfig(parallel=0)


def test_split_for_threads_halves_the_largest_in_order():
    assert split_for_threads([[0, 1, 2, 3, 4]], 2) == [[0, 1], [2, 3, 4]]
    assert split_for_threads([[0, 1, 2], [3]], 3) == [[0], [1, 2], [3]]
    assert split_for_threads([[0], [1]], 2) == [[0], [1]]
    assert split_for_threads([[7]], 4) == [[7]]                 # one sentence: nothing to cut
    assert split_for_threads([], 2) == []


@pytest.mark.parametrize("search", [{"beam": 1}, {"beam": 4, "nbest": 2}], ids=["greedy", "beam"])
def test_two_at_once_translates_as_one_at_a_time(ckpt, two_threads, search):
    lines = mixed_lines(90, seed=3)
    runs = {}
    for parallel in (1, 2):
        t = Translator.from_checkpoint(ckpt, search=SearchConfig(**search),
                                       batch=BatchConfig(max_tokens=40, parallel=parallel))
        assert t._parallel() == parallel
        seen = []
        calls = []
        decode = t._decode_batch

        def spy(batch, *a, **k):
            calls.append(threading.current_thread().name)
            assert torch.get_num_threads() == 2 // parallel     # each batch's share
            return decode(batch, *a, **k)
        t._decode_batch = spy
        res = t.translate_results(lines, progress=seen.append)
        assert torch.get_num_threads() == 2                     # given back
        assert sum(seen) == len(lines)
        assert [r.index for r in res] == list(range(len(lines)))
        runs[parallel] = [[(h.ids, h.score) for h in r.hypotheses] for r in res]
        assert len(calls) > 4
        if parallel == 2:
            assert all(name.startswith("nmt-batch") for name in calls)
    assert [[h[0] for h in r] for r in runs[1]] == [[h[0] for h in r] for r in runs[2]]
    assert [h[1] for r in runs[1] for h in r] == pytest.approx(
        [h[1] for r in runs[2] for h in r], abs=1e-4)


def test_one_batch_is_halved_for_two_threads(ckpt, two_threads):
    t = Translator.from_checkpoint(ckpt, batch=BatchConfig(parallel=2))
    sizes = []
    decode = t._decode_batch
    t._decode_batch = lambda batch, *a, **k: (sizes.append(len(batch)), decode(batch, *a, **k))[1]
    lines = ["w1 w2 w3", "w4 w5", "w6", "w7 w8 w9 w10"]
    assert t.translate(lines) == Translator.from_checkpoint(
        ckpt, batch=BatchConfig(parallel=1)).translate(lines)
    assert sorted(sizes) == [2, 2]


def test_an_error_in_one_batch_stops_the_call_and_gives_the_threads_back(ckpt, two_threads):
    t = Translator.from_checkpoint(ckpt, batch=BatchConfig(max_tokens=20, parallel=2))
    decode, n = t._decode_batch, {"calls": 0}

    def failing(batch, *a, **k):
        n["calls"] += 1
        if n["calls"] == 2:
            raise NmtError("line 7: broken")
        return decode(batch, *a, **k)
    t._decode_batch = failing
    with pytest.raises(NmtError, match="line 7: broken"):
        t.translate(mixed_lines(60))
    assert torch.get_num_threads() == 2


def test_the_engine_passes_inter_threads_to_ctranslate2(ckpt, tmp_path):
    pytest.importorskip("ctranslate2")
    from nmt.engines.ctranslate2 import CTranslate2Translator

    lines = mixed_lines(50, seed=5)
    out = {}
    for parallel in (1, 2):
        t = CTranslate2Translator.from_checkpoint(
            ckpt, search=SearchConfig(beam=2), threads=2,
            batch=BatchConfig(max_tokens=30, parallel=parallel))
        assert t.inter_threads == parallel == t._parallel()
        assert ("2 batches at once" in t.describe()) == (parallel == 2)
        out[parallel] = t.translate(lines)
    assert out[1] == out[2]
    auto = CTranslate2Translator.from_checkpoint(ckpt, threads=2)
    assert (auto.inter_threads, auto.max_tokens) == (2, 2048)    # two at once, smaller


def test_the_engines_default_batch_with_two_at_once():
    """--engine ctranslate2, two at once: 2048 source tokens in float32 at any beam; in int8
    2048 // beam, from 256 up to 1024, up to 2048 for a decoder narrower than
    transformer_small's (3 x 256)."""
    from nmt.search.config import parallel_engine_tokens

    small, tiny = 3 * 256, 2 * 64
    assert {b: parallel_engine_tokens(b, "fp32", small) for b in (1, 4, 12)} == {
        1: 2048, 4: 2048, 12: 2048}
    assert {b: parallel_engine_tokens(b, "int8", small) for b in (1, 2, 4, 5, 8, 12)} == {
        1: 1024, 2: 1024, 4: 512, 5: 409, 8: 256, 12: 256}
    assert {b: parallel_engine_tokens(b, "int8", tiny) for b in (1, 2, 4, 12)} == {
        1: 2048, 2: 1024, 4: 512, 12: 256}
    assert parallel_engine_tokens(1, "int8") == 1024          # width unknown: not narrow


@pytest.mark.parametrize("kind", ["int8", "ensemble", "sampling", "constraints"])
def test_two_at_once_for_int8_ensembles_and_sampling(ckpt, tmp_path, two_threads, kind):
    """Each batch whole on one thread: int8 (its scales are per batch, and the batches are the
    same), an ensemble, sampling (its draws are seeded per line) and lexical constraints
    translate as one batch at a time does."""
    from nmt.search.sampling import SamplingConfig

    other = make_checkpoint(tmp_path / "other.pt", seed=1)
    opts = {"int8": {"precision": "int8"}, "ensemble": {}, "constraints": {},
            "sampling": {"sampling": SamplingConfig(topk=5, seed=3),
                         "search": SearchConfig(nbest=2)}}[kind]
    paths = [ckpt, other] if kind == "ensemble" else ckpt
    lines = mixed_lines(60, seed=4)
    # lexical constraints: every third line must contain a word
    must = ([["w5"] if i % 3 == 0 else None for i in range(len(lines))]
            if kind == "constraints" else None)
    out = [[[h.ids for h in r.hypotheses] for r in Translator.from_checkpoint(
        paths, batch=BatchConfig(max_tokens=30, parallel=p), **opts).translate_results(
            lines, constraints=must)]
        for p in (1, 2)]
    assert out[0] == out[1] and any(out[0])
