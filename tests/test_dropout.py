"""nmt-train --dropout-masks: torch's own dropout by default, cheaper masks on request
(training speed)."""

import pytest
import torch
import torch.nn.functional as F

import nmt
from nmt.models.dropout import Dropout, dropout, set_dropout_masks
from test_model import V, batch


def fast(x, p):
    return dropout(x, p, True, masks="fast")


def test_default_masks_are_f_dropouts_bit_for_bit():
    """The published runs used F.dropout; the default must stay exactly it, stream included."""
    x = torch.randn(37, 53)
    torch.manual_seed(7)
    ref = F.dropout(x, 0.1, True)
    ref_state = torch.get_rng_state()
    torch.manual_seed(7)
    assert torch.equal(Dropout(0.1).train()(x), ref)
    assert torch.equal(torch.get_rng_state(), ref_state)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_fast_masks_drop_at_the_rate_in_every_lane_independently(p):
    torch.manual_seed(0)
    y = fast(torch.ones(1 << 20), p)
    dropped = y == 0
    assert abs(float(dropped.float().mean()) - p) < 0.003
    assert abs(float(y.mean()) - 1.0) < 0.005                       # unbiased: scale = 1 / keep
    lanes = dropped.view(-1, 4).float().mean(0)                      # four elements per draw
    assert all(abs(float(r) - p) < 0.006 for r in lanes), lanes
    both = (dropped[:-1] & dropped[1:]).float().mean()               # neighbours independent
    assert abs(float(both) - p * p) < 0.003


def test_fast_masks_scale_gradients_follow_the_seed_and_differ_from_torchs():
    x = torch.randn(300, 70)
    level = round(0.9 * (1 << 15))
    runs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        leaf = x.clone().requires_grad_(True)
        y = fast(leaf, 0.1)
        y.backward(torch.ones_like(y))
        runs.append((y.detach(), leaf.grad))
    (y, g), (y2, _), (y3, _) = runs
    kept = y != 0
    assert torch.equal(y[kept], x[kept] * ((1 << 15) / level))
    assert torch.equal(g, kept.float() * ((1 << 15) / level))
    assert torch.equal(y, y2) and not torch.equal(y, y3)
    torch.manual_seed(5)
    assert not torch.equal(F.dropout(x, 0.1, True) != 0, kept)


def test_fast_masks_draw_nothing_at_p_zero_or_in_eval_and_drop_all_at_one():
    x = torch.randn(5, 6)
    state = torch.get_rng_state()
    assert dropout(x, 0.0, True, "fast") is x and dropout(x, 0.3, False, "fast") is x
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(dropout(x, 1.0, True, "fast"), torch.zeros_like(x))
    odd = torch.randn(3, 5, 7).transpose(0, 2)                       # non-contiguous, 105 elements
    y = dropout(odd, 0.5, True, "fast")
    assert y.shape == odd.shape and torch.equal(y[y != 0], odd[y != 0] * 2)


def test_set_dropout_masks_reaches_every_dropout_of_the_model():
    model = nmt.build_model("transformer_tiny", V, V).train()
    set_dropout_masks(model, "fast")
    mods = [m for m in model.modules() if isinstance(m, Dropout)]
    assert len(mods) == 1 + 2 * (2 + 1) + 2 * (3 + 1)   # embeddings; residuals + FFN per layer
    assert all(m.masks == "fast" for m in mods) and "masks=fast" in repr(mods[0])
    src, tgt = batch()
    torch.manual_seed(1)
    a = model(src, tgt)
    set_dropout_masks(model, "torch")
    torch.manual_seed(1)
    assert not torch.equal(a, model(src, tgt))
    with pytest.raises(ValueError, match="torch, fast"):
        set_dropout_masks(model, "quick")
