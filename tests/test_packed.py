"""Linear layers packed for oneDNN in CPU decoding (nmt.models.packed): where they apply, the
translations and scores are those of the plain model, and a sentence's translation does not
depend on the other sentences of its batch."""

import pytest
import torch
from torch import nn

from nmt.models import packed
from nmt.models.packed import PackedLinear, pack_linears
from nmt.search.config import BatchConfig, SearchConfig
from nmt.search.translator import Translator

from test_translator import make_checkpoint, make_model, mixed_lines

pytestmark = pytest.mark.skipif(not packed.available(),
                                reason="this PyTorch has no oneDNN packed linear")

WIDE = {"d_model": 256, "d_ff": 512, "heads": 4}      # wide enough for packing to apply


def test_a_packed_linear_computes_what_the_linear_does():
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(256, 96)
    x = torch.randn(3, 5, 256, generator=g)
    assert torch.allclose(PackedLinear(lin.weight, lin.bias)(x), lin(x), rtol=1e-4, atol=1e-5)
    assert torch.allclose(PackedLinear(lin.weight, None)(x), x @ lin.weight.T, rtol=1e-4,
                          atol=1e-5)


def test_where_packing_applies():
    wide, _ = make_model(40, **WIDE)
    assert pack_linears(wide)
    assert not any(type(m) is nn.Linear for m in wide.modules())
    assert wide.packed_output is not None
    narrow, _ = make_model(40)                       # transformer_tiny: d_model 64
    assert not pack_linears(narrow) and narrow.packed_output is None
    half, _ = make_model(40, **WIDE)
    assert not pack_linears(half.to(torch.bfloat16))
    t = Translator.from_checkpoint(make_checkpoint_wide(), precision="int8")
    assert t.ensemble.models[0].packed_output is None


_WIDE_CKPT = {}


def make_checkpoint_wide():
    if "path" not in _WIDE_CKPT:
        import tempfile
        from pathlib import Path

        _WIDE_CKPT["path"] = make_checkpoint(Path(tempfile.mkdtemp()) / "wide.pt", **WIDE)
    return _WIDE_CKPT["path"]


def test_translations_equal_the_plain_model_and_do_not_depend_on_the_batch(monkeypatch):
    lines = [x for x in mixed_lines(30, seed=4) if x.strip()]
    search = SearchConfig(beam=3)
    packed_t = Translator.from_checkpoint(make_checkpoint_wide(), search=search)
    assert packed_t.ensemble.models[0].packed_output is not None
    monkeypatch.setattr(packed, "available", lambda: False)
    plain_t = Translator.from_checkpoint(make_checkpoint_wide(), search=search)
    assert plain_t.ensemble.models[0].packed_output is None
    got, want = packed_t.translate_results(lines), plain_t.translate_results(lines)
    for g, w in zip(got, want):
        assert [h.ids for h in g.hypotheses] == [h.ids for h in w.hypotheses]
        assert g.hypotheses[0].score == pytest.approx(w.hypotheses[0].score, abs=1e-4)
    # each line alone, and in batches of 4: the same hypotheses (scores to float rounding:
    # the plain model's too differ in the last bits between batch sizes)
    alone = Translator.from_checkpoint(make_checkpoint_wide(), search=search,
                                       batch=BatchConfig(batch_size=1))
    fours = Translator.from_checkpoint(make_checkpoint_wide(), search=search,
                                       batch=BatchConfig(batch_size=4))
    for a, b, c in zip(alone.translate_results(lines), fours.translate_results(lines), got):
        assert a.hypotheses[0].ids == b.hypotheses[0].ids == c.hypotheses[0].ids
        assert a.hypotheses[0].score == pytest.approx(c.hypotheses[0].score, abs=1e-5)
        assert b.hypotheses[0].score == pytest.approx(c.hypotheses[0].score, abs=1e-5)
