"""nmt.Translator: order, empty lines, batch-size invariance, truncation, ensembles, options."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import nmt
from nmt.data.codec import whitespace_codec
from nmt.data.dictionary import Dictionary
from nmt.errors import NmtError, UsageError
from nmt.search.translator import BatchConfig, SearchConfig, Translator
from nmt import checkpoint as ckpt_io
from nmt.checkpoint import save_checkpoint
from nmt.runtime import cpu_has_native_bf16

WORDS = [f"w{i}" for i in range(30)]
EOS = 2

# bf16 decoding where this CPU runs it: nmt refuses bf16 on a CPU without native bf16
# (AVX512-BF16 or AMX), as test_one_device_resolver_and_precision_table checks.
BF16 = pytest.param("bf16", marks=pytest.mark.skipif(
    not cpu_has_native_bf16(), reason="this CPU has no native bf16 (AVX512-BF16 or AMX)"))


def make_model(vocab, seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = nmt.get_arch("transformer_tiny", {"dropout": 0.0, "max_len_b": 8, **overrides})
    model = nmt.build_model(cfg, vocab, vocab).eval()
    with torch.no_grad():               # eos a little likelier: some outputs end early
        model.tgt_embed.weight[EOS] *= 1.2
    return model, cfg


def make_checkpoint(path, seed=0, words=WORDS, data_dir="", codec=None, **overrides):
    """A tiny untrained checkpoint in the real format (whitespace codec over ``words``)."""
    codec = codec or whitespace_codec(Dictionary(words))
    model, cfg = make_model(len(codec.dictionary), seed, **overrides)
    save_checkpoint(ckpt_io.make_checkpoint(
        model_config=cfg, model_state=model.state_dict(), share_all_embeddings=True,
        src_codec=codec, tgt_codec=codec, src_lang="xx", tgt_lang="yy", data_dir=data_dir), path)
    return path


def mixed_lines(n=40, seed=0):
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        if i % 9 == 3:
            lines.append("" if i % 2 else "   ")            # empty and blank lines
        else:
            k = int(rng.integers(1, 14))
            lines.append(" ".join(WORDS[int(j)] for j in rng.integers(0, len(WORDS), k)))
    return lines


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.pt")


def test_order_count_and_empty_lines(ckpt):
    t = Translator.from_checkpoint(ckpt, batch=BatchConfig(batch_size=8))
    lines = mixed_lines()
    out = t.translate(lines)
    assert len(out) == len(lines)
    for line, hyp in zip(lines, out):
        if not line.strip():
            assert hyp == ""
    assert any(out) and len(set(out)) > 5
    # each line translated alone gives the same: nothing shifted by sorting and batching
    for i in (0, 1, 5, 17, 39):
        assert t.translate([lines[i]]) == [out[i]]
    assert t.translate([]) == []


CONTROLS = [{}, {"min_len": 3, "no_repeat_ngram_size": 2, "unkpen": 0.5},
            {"beam": 4, "diverse_beam_groups": 2, "diverse_beam_strength": 0.7}]


@pytest.mark.parametrize("controls", CONTROLS, ids=["plain", "controls", "diverse"])
def test_same_output_for_any_batch_size(ckpt, controls):
    """A line translates the same whatever its batch, with the decoding controls too."""
    lines = mixed_lines(70, seed=1)
    runs = []
    for kw in ({"batch_size": 1}, {"batch_size": 7}, {"batch_size": 64},
               {"max_tokens": 25}, {"batch_size": 5, "max_tokens": 40}):
        res = Translator.from_checkpoint(ckpt, search=SearchConfig(nbest=2, **controls),
                                         batch=BatchConfig(**kw)).translate_results(lines)
        runs.append([[(h.ids, h.score) for h in r.hypotheses] for r in res])
    ids = [[[h[0] for h in r] for r in run] for run in runs]
    assert all(x == ids[0] for x in ids[1:])           # the same translations, exactly
    scores = [[h[1] for r in run for h in r] for run in runs]
    # scores agree to float rounding (matrix products of other shapes round differently)
    assert all(x == pytest.approx(scores[0], abs=1e-4) for x in scores[1:])


def test_defaults_come_from_the_checkpoint_and_can_be_overridden(ckpt):
    t = Translator.from_checkpoint(ckpt)
    s = t.search
    assert (s.beam, s.lenpen, s.max_len_a, s.max_len_b) == (4, 0.6, 1.0, 8)
    t = Translator.from_checkpoint(
        ckpt, search=SearchConfig(beam=2, lenpen=0.0, max_len_a=0.5, max_len_b=3))
    s = t.search
    assert (s.beam, s.lenpen, s.max_len_a, s.max_len_b) == (2, 0.0, 0.5, 3)
    assert all(len(r.hypotheses[0].ids) <= 0.5 * 3 + 3 + 1
               for r in t.translate_results(["w1 w2 w3"]))
    assert nmt.Translator is Translator


def test_rich_results(ckpt):
    t = Translator.from_checkpoint(ckpt, search=SearchConfig(nbest=3))
    res = t.translate_results(["w3 w4 w5", ""])
    r = res[0]
    assert len(r.hypotheses) == 3 and r.source == "w3 w4 w5"
    scores = [h.score for h in r.hypotheses]
    assert scores == sorted(scores, reverse=True)
    for h in r.hypotheses:
        assert h.ids[-1] == EOS and h.tokens[-1] == "</s>"
        assert len(h.token_scores) == len(h.ids)
        lp = ((5 + len(h.ids)) / 6) ** 0.6
        assert h.score == pytest.approx(sum(h.token_scores) / lp, abs=1e-4)
        assert h.text == " ".join(h.tokens[:-1])
    j = r.to_json()
    assert j["translation"] == r.text and len(j["nbest"]) == 3
    assert res[1].text == "" and res[1].to_json()["score"] is None


def test_overlong_source_is_truncated_with_a_warning(tmp_path, caplog):
    path = make_checkpoint(tmp_path / "learned.pt", positional="learned", max_positions=10)
    t = Translator.from_checkpoint(path)
    assert t.max_source_len == 9
    long_line = " ".join(WORDS[:25])
    with caplog.at_level(logging.WARNING, logger="nmt"):
        res = t.translate_results(["w1 w2", long_line], first_line=5)
    assert "line 6" in caplog.text and "truncated" in caplog.text
    assert res[1].truncated and not res[0].truncated
    assert len(res[1].hypotheses[0].ids) <= 9 + 1          # the decoder's positions, too
    # the truncated line translates as its first 9 words do
    assert res[1].text == t.translate([" ".join(WORDS[:9])])[0]
    t2 = Translator.from_checkpoint(make_checkpoint(tmp_path / "s.pt"),
                                    batch=BatchConfig(max_source_len=3))
    assert t2.max_source_len == 3 and t2.translate_results([long_line])[0].truncated


def test_sources_given_their_own_line_numbers_sample_and_warn_as_those_lines(tmp_path,
                                                                             ckpt, caplog):
    """translate_ids(lines=...): lines gathered from several inputs into one call (as
    nmt-serve gathers its requests') draw the samples, and name the lines, of their own."""
    from nmt.search.config import SamplingConfig

    t = Translator.from_checkpoint(ckpt, sampling=SamplingConfig(topk=5, seed=2))
    lines = [x for x in mixed_lines(16, seed=6) if x.strip()]
    ids = t.src_codec.encode_batch(lines)
    alone = [t.translate_ids(ids[:6]), t.translate_ids(ids[6:])]
    mixed = t.translate_ids(ids, lines=[*range(1, 7), *range(1, len(ids) - 5)])
    assert [r.text for r in mixed] == [r.text for part in alone for r in part]
    assert [r.index for r in mixed] == [*range(6), *range(len(ids) - 6)]
    assert [r.text for r in t.translate_ids(ids)][6:] != [r.text for r in alone[1]]
    with pytest.raises(ValueError, match="3 line numbers for 2 sources"):
        t.translate_ids(ids[:2], lines=[1, 2, 3])
    # the library refuses what nmt-generate and nmt-serve refuse by their own names
    groups = Translator.from_checkpoint(ckpt, sampling=SamplingConfig(seed=2),
                                        search=SearchConfig(beam=4, diverse_beam_groups=2))
    with pytest.raises(UsageError, match="diverse beam groups .* do not go with sampling"):
        groups.translate_ids(ids[:2])
    short = Translator.from_checkpoint(ckpt, batch=BatchConfig(max_source_len=2))
    with caplog.at_level(logging.WARNING, logger="nmt"):
        short.translate_ids(ids[:2], lines=[7, 3])
    assert "line 7:" in caplog.text and "line 3:" in caplog.text and "line 1:" not in caplog.text


def test_ensemble(tmp_path, ckpt):
    other = make_checkpoint(tmp_path / "other.pt", seed=3)
    lines = mixed_lines(12, seed=4)
    ens = Translator.from_checkpoint([ckpt, other], search=SearchConfig(beam=3))
    out = ens.translate(lines)
    assert len(out) == len(lines) and len(ens.ensemble) == 2
    # an ensemble of two identical models is that model
    same = Translator.from_checkpoint([ckpt, ckpt], search=SearchConfig(beam=3)).translate_results(
        lines)
    single = Translator.from_checkpoint(ckpt, search=SearchConfig(beam=3)).translate_results(lines)
    for a, b in zip(same, single):
        assert a.text == b.text
        if a.hypotheses:
            assert a.hypotheses[0].score == pytest.approx(b.hypotheses[0].score, abs=1e-4)
    bad = make_checkpoint(tmp_path / "bad.pt", words=WORDS + ["extra"])
    with pytest.raises(UsageError, match="different vocabularies"):
        Translator.from_checkpoint([ckpt, bad])


def test_default_batch_grows_for_decoders_narrower_than_transformer_small():
    from nmt.search.config import default_source_tokens

    # transformer_small's decoder (3 x 256) and wider: 8192 // beam, as without a width
    for width in (None, 3 * 256, 6 * 512, 6 * 1024):
        assert [default_source_tokens(b, width) for b in (1, 4, 5, 100)] == [8192, 2048, 1638, 256]
    # narrower: up to 4x the rows, at most 8192 source tokens
    assert [default_source_tokens(4, w) for w in (384, 256, 128, 64)] == [4096, 6144, 8192, 8192]
    assert [default_source_tokens(b, 128) for b in (1, 2, 16, 256)] == [8192, 8192, 2048, 256]


def test_the_default_batch_follows_the_models_decoder(ckpt):
    assert Translator.from_checkpoint(ckpt, search=SearchConfig(beam=4)).max_tokens == 8192
    # an ensemble holds the rows of each model: two transformer_tiny decoders, 2 x (2 x 64)
    assert Translator.from_checkpoint([ckpt, ckpt], search=SearchConfig(beam=4)).max_tokens == 6144
    t = Translator.from_checkpoint(ckpt, search=SearchConfig(beam=4), batch=BatchConfig(batch_size=8))
    assert (t.batch_size, t.max_tokens) == (8, None)


def test_bad_options_and_ids(ckpt):
    with pytest.raises(UsageError, match="needs a GPU"):
        Translator.from_checkpoint(ckpt, precision="fp16", device="cpu")
    with pytest.raises(UsageError):
        Translator.from_checkpoint(ckpt, batch=BatchConfig(batch_size=0))
    with pytest.raises(UsageError):
        Translator.from_checkpoint(ckpt, search=SearchConfig(nbest=9))
    t = Translator.from_checkpoint(ckpt)
    with pytest.raises(NmtError, match="line 2"):
        t.translate_ids([[5, 6], [5, 999]])
    res = t.translate_ids([np.array([5, 6, 7], dtype=np.uint16)])
    assert res[0].source == "w1 w2 w3" and res[0].hypotheses


def test_greedy_is_beam_one(ckpt):
    """Beam 1 through the Translator stops at the first eos, whatever the length penalty."""
    lines = mixed_lines(10, seed=7)
    a = Translator.from_checkpoint(ckpt, search=SearchConfig(beam=1, lenpen=0.0)).translate(lines)
    b = Translator.from_checkpoint(ckpt, search=SearchConfig(beam=1, lenpen=1.0)).translate(lines)
    assert a == b


def test_one_device_resolver_and_precision_table(monkeypatch):
    """nmt.runtime: what Translator, nmt-generate and nmt-train (pick_device) all use."""
    from nmt.runtime import PRECISIONS, check_precision, precision_dtype, resolve_device
    from nmt.training.distributed import DistInfo, pick_device

    cpu = torch.device("cpu")
    assert PRECISIONS == ("fp32", "bf16", "fp16", "int8", "auto")
    assert precision_dtype("bf16") is torch.bfloat16
    assert check_precision("fp32", cpu) is torch.float32
    with pytest.raises(UsageError, match="unknown precision 'fp8'"):
        check_precision("fp8", cpu)
    with pytest.raises(UsageError, match="needs a CUDA device"):
        check_precision("bf16", cpu, training=True)
    monkeypatch.setattr("nmt.runtime.cpu_has_native_bf16", lambda: False)
    with pytest.raises(UsageError, match="native bf16"):
        check_precision("bf16", cpu)
    monkeypatch.setattr("nmt.runtime.cpu_has_native_bf16", lambda: True)
    assert check_precision("bf16", cpu) is torch.bfloat16          # inference only
    with pytest.raises(UsageError, match="needs a GPU"):
        check_precision("fp16", cpu)
    with pytest.raises(UsageError, match="unknown device 'tpu9'"):
        resolve_device("tpu9")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == resolve_device(None) == cpu
    assert pick_device("auto", DistInfo(1, 2, 1)) == cpu
    with pytest.raises(UsageError, match="no CUDA GPU"):
        pick_device("cuda", DistInfo())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda", local_rank=3) == torch.device("cuda", 1)
    assert resolve_device("cuda:0", local_rank=3) == torch.device("cuda", 0)


def test_search_config_resolves_against_the_preset(ckpt):
    from nmt.batch.config import GenerateConfig

    preset = nmt.get_arch("transformer_tiny", {"max_len_b": 8})
    s = SearchConfig(beam=2).resolve(preset)
    assert (s.beam, s.lenpen, s.max_len_a, s.max_len_b, s.unset) == (2, 0.6, 1.0, 8, [])
    assert SearchConfig().resolve().beam == 4                       # the paper's by default
    with pytest.raises(UsageError, match="nbest"):
        SearchConfig(nbest=3).resolve(nmt.get_arch("transformer_tiny", {"beam": 2}))
    with pytest.raises(ValueError, match="resolved"):
        from nmt.search.generator import beam_search
        beam_search(None, torch.zeros(1, 1, dtype=torch.long), SearchConfig(beam=2))
    # a Translator built from models resolves against the first model's preset
    t = Translator.from_checkpoint(ckpt)
    direct = Translator(t.ensemble.models, t.src_codec, t.tgt_codec,
                        search=SearchConfig(nbest=2), batch=BatchConfig(batch_size=3))
    assert direct.search == SearchConfig(beam=4, lenpen=0.6, lenpen_formula="gnmt", max_len_a=1.0,
                                         max_len_b=8, min_len=0, nbest=2)
    assert direct.batch_size == 3
    cfg = GenerateConfig(beam=3, max_tokens=100)
    assert cfg.search == SearchConfig(beam=3) and cfg.batch == BatchConfig(max_tokens=100)
    with pytest.raises(UsageError):
        GenerateConfig(batch_size=0)


def checkpoint_and_input(tmp_path_factory, name: str, lines: int, seed: int) -> dict:
    """A tiny checkpoint and an input file of ``lines`` mixed lines, in a fresh directory."""
    d = tmp_path_factory.mktemp(name)
    ckpt = make_checkpoint(d / "tiny.pt")
    src = d / "in.txt"
    src.write_text("".join(x + "\n" for x in mixed_lines(lines, seed=seed)))
    return {"dir": d, "ckpt": str(ckpt), "in": str(src)}
