"""A decoding step of one new position (DecoderLayer.step, the path beam and greedy search take
on a CPU) computes what the general decoder path computes, bit for bit: the same tokens, token
log-probabilities and scores, for post-norm and pre-norm stacks, padded batches, beams sharing
their sentence's keys, packed layers (d_model 256, relu fused into the product), bf16 and
int8 models."""

import pytest
import torch

from nmt.search.config import BatchConfig, SearchConfig
from nmt.search.translator import Translator

from test_translator import BF16, make_checkpoint, mixed_lines

LINES = mixed_lines(60, seed=5)


def results(path, fast, beam, precision="fp32", n=LINES):
    t = Translator.from_checkpoint(path, search=SearchConfig(beam=beam, nbest=beam),
                                   batch=BatchConfig(batch_size=16), precision=precision)
    calls = []
    for m in t.ensemble.models:
        m.fast_step = fast
        real = m._decode_one
        m._decode_one = lambda *a, real=real: calls.append(1) or real(*a)
    out = [[(h.ids, h.token_scores, h.score) for h in r.hypotheses]
           for r in t.translate_results(n)]
    assert bool(calls) == fast          # the path under test is the one taken
    return out


VARIANTS = {
    "post-norm": {},
    "pre-norm, layernorm_embedding, learned positions, output bias, packed relu":
        {"pre_norm": True, "layernorm_embedding": True, "positional": "learned",
         "output_bias": True, "d_model": 256, "d_ff": 512},
    "packed d_model 256, gelu": {"d_model": 256, "d_ff": 512, "activation": "gelu"},
}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("step")
    return {name: str(make_checkpoint(d / f"m{i}.pt", seed=i, **o))
            for i, (name, o) in enumerate(VARIANTS.items())}


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_step_equals_the_general_path(ckpts, variant, beam):
    want = results(ckpts[variant], False, beam)
    assert results(ckpts[variant], True, beam) == want
    assert sum(len(h) for h in want) > 0


@pytest.mark.parametrize("precision", [BF16, "int8"])
def test_step_equals_the_general_path_in_other_precisions(ckpts, precision):
    path = ckpts["packed d_model 256, gelu"]
    assert results(path, True, 3, precision) == results(path, False, 3, precision)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if "packed" in v])
def test_packed_layers_are_the_ones_stepped(ckpts, variant):
    """d_model 256 on a CPU packs the linear layers (relu fused into the first feed-forward
    product): the variants above compare those with the general path."""
    t = Translator.from_checkpoint(ckpts[variant])
    layer = t.ensemble.models[0].decoder_layers[0]
    if type(layer.self_attn.in_proj) is torch.nn.Linear:
        pytest.skip("no packed linear layers in this PyTorch")
    assert type(layer.ffn.fc1).__name__ == "PackedLinear"
    assert t.translate(LINES[:4])
