"""The projection fused with the label-smoothed loss (nmt.training.loss.
linear_smoothed_cross_entropy): the same loss and gradients as F.linear + log_softmax +
label_smoothed_nll_loss, chunk by chunk, with or without bias, and through ModelWithLoss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import nmt
from nmt.training import loss as loss_mod
from nmt.training.loss import (ModelWithLoss, label_smoothed_nll_loss,
                               linear_smoothed_cross_entropy)


def _inputs(bias: bool, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(7, 5, generator=g, dtype=torch.float64)
    w = torch.randn(11, 5, generator=g, dtype=torch.float64)
    b = torch.randn(11, generator=g, dtype=torch.float64) if bias else None
    tgt = torch.tensor([0, 10, 3, 3, 5, 1, 3])           # repeated and boundary classes
    return h, w, b, tgt


def _reference(h, w, b, tgt, eps):
    return label_smoothed_nll_loss(torch.log_softmax(F.linear(h, w, b), -1), tgt, eps)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", [1, 3, 7, 100])
def test_loss_and_gradients_equal_the_unfused_computation(eps, bias, chunk):
    h, w, b, tgt = _inputs(bias)
    leaves1 = [x.clone().requires_grad_() for x in (h, w) + ((b,) if bias else ())]
    leaves2 = [x.clone().requires_grad_() for x in (h, w) + ((b,) if bias else ())]
    l1, n1 = linear_smoothed_cross_entropy(leaves1[0], leaves1[1], leaves1[2] if bias else None,
                                           tgt, eps, chunk)
    l2, n2 = _reference(leaves2[0], leaves2[1], leaves2[2] if bias else None, tgt, eps)
    assert l1.item() == pytest.approx(l2.item(), rel=1e-12)
    assert n1.item() == pytest.approx(n2.item(), rel=1e-12)
    (2.5 * l1).backward()
    (2.5 * l2).backward()
    for a, c in zip(leaves1, leaves2):
        assert torch.allclose(a.grad, c.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bias", [False, True])
def test_gradcheck(bias):
    h, w, b, tgt = _inputs(bias, seed=5)
    args = [x.requires_grad_() for x in (h, w) + ((b,) if bias else ())]

    def f(*xs):
        return linear_smoothed_cross_entropy(xs[0], xs[1], xs[2] if bias else None, tgt, 0.1, 3)[0]
    assert torch.autograd.gradcheck(f, tuple(args))


def test_without_gradients_only_the_loss_is_computed():
    h, w, b, tgt = _inputs(True)
    with torch.no_grad():
        l1, n1 = linear_smoothed_cross_entropy(h, w, b, tgt, 0.1, 2)
    l2, n2 = _reference(h, w, b, tgt, 0.1)
    assert not l1.requires_grad
    assert (l1.item(), n1.item()) == pytest.approx((l2.item(), n2.item()), rel=1e-12)
    # only the weight wants a gradient: h's is neither computed nor returned
    wl = w.clone().requires_grad_()
    loss, _ = linear_smoothed_cross_entropy(h, wl, None, tgt, 0.1, 2)
    loss.backward()
    wr = w.clone().requires_grad_()
    _reference(h, wr, None, tgt, 0.1)[0].backward()
    assert torch.allclose(wl.grad, wr.grad, rtol=1e-10, atol=1e-12)


def test_no_gradient_work_under_no_grad_even_for_parameters():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    h, w, b, tgt = _inputs(True)
    params = [torch.nn.Parameter(x) for x in (h, w, b)]
    for grad_mode, expect_grads in ((torch.no_grad, False), (torch.enable_grad, True)):
        with grad_mode(), Ops() as ops:
            linear_smoothed_cross_entropy(*params, tgt, 0.1, 3)
        gradient_ops = {"exp_", "index_add_"} & {n.split(".")[0] for n in ops.names}
        assert bool(gradient_ops) == expect_grads, ops.names


def _model(output_bias: bool):
    torch.manual_seed(0)
    cfg = nmt.get_arch("transformer_tiny", {"dropout": 0.0, "output_bias": output_bias})
    model = nmt.build_model(cfg, 37, 37, share_all_embeddings=True)
    if output_bias:
        with torch.no_grad():
            model.output_bias.normal_()
    return model.train()


def _batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 37, (3, 6), generator=g)
    tgt = torch.randint(4, 37, (3, 5), generator=g)
    tgt[2, 3:] = 0                                         # padding (pad index 0)
    prev = torch.cat([torch.full((3, 1), 2), tgt[:, :-1]], 1)
    return src, prev, tgt


@pytest.mark.parametrize("output_bias", [False, True])
def test_model_with_loss_takes_the_fused_path_with_the_same_gradients(output_bias, monkeypatch):
    calls = []
    real = loss_mod.linear_smoothed_cross_entropy
    monkeypatch.setattr(loss_mod, "linear_smoothed_cross_entropy",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    results = []
    for fused in (True, False):
        model = _model(output_bias)
        crit = ModelWithLoss(model, 0.1, pad_idx=0, loss_chunk=4 if fused else 0)
        loss, nll, _ = crit(*_batch())
        loss.backward()
        results.append((loss.item(), nll.item(),
                        {k: p.grad.clone() for k, p in model.named_parameters()}))
    assert calls == [1]                                    # the fused path ran once, then not
    (l1, n1, g1), (l2, n2, g2) = results
    assert l1 == pytest.approx(l2, rel=1e-5) and n1 == pytest.approx(n2, rel=1e-5)
    assert g1.keys() == g2.keys()
    for k in g1:
        assert torch.allclose(g1[k], g2[k], rtol=1e-4, atol=1e-6), k


def test_autocast_keeps_the_unfused_path(monkeypatch):
    monkeypatch.setattr(loss_mod, "linear_smoothed_cross_entropy",
                        lambda *a, **k: pytest.fail("fused under autocast"))
    crit = ModelWithLoss(_model(False), 0.1, pad_idx=0, loss_chunk=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _, _ = crit(*_batch())
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


def test_nmt_train_loss_chunk_trains_alike_and_is_checked(tmp_path, monkeypatch):
    from nmt.errors import UsageError
    from nmt.training.loop import TrainConfig, train

    from train_support import FakeData

    from nmt.checkpoint import load_checkpoint

    def weights_after_3_updates(chunk: int) -> dict:
        save = tmp_path / f"c{chunk}"
        cfg = TrainConfig(arch="transformer_tiny", max_tokens=200, max_update=3, warmup=2,
                          save_dir=str(save), device="cpu", log_interval=1, loss_chunk=chunk)
        train(cfg, FakeData(n_train=30), "fake")
        return load_checkpoint(save / "checkpoint_last.pt")["model"]
    calls = []
    real = loss_mod.linear_smoothed_cross_entropy
    monkeypatch.setattr(loss_mod, "linear_smoothed_cross_entropy",
                        lambda *a, **k: calls.append(a[-1]) or real(*a, **k))
    plain, chunked = weights_after_3_updates(0), weights_after_3_updates(7)
    assert calls and set(calls) == {7}                    # only the chunked run took it
    # The same training to float rounding. Adam's first steps move each weight by about
    # +-lr whatever the gradient's size, so a wrong gradient shows as differences near lr
    # (0.05-0.09 here); the key biases are left out: attention is invariant to them, their
    # true gradient is 0 and both runs step on the sign of rounding noise.
    assert plain.keys() == chunked.keys()
    for k in plain:
        a, c = plain[k], chunked[k]
        if k.endswith("in_proj.bias"):
            d = a.numel() // 3
            a, c = torch.cat([a[:d], a[2 * d:]]), torch.cat([c[:d], c[2 * d:]])
        elif k.endswith("kv_proj.bias"):
            a, c = a[a.numel() // 2:], c[c.numel() // 2:]
        assert torch.allclose(a, c, rtol=1e-3, atol=5e-4), k
    with pytest.raises(UsageError, match="--loss-chunk must be >= 0"):
        TrainConfig(arch="transformer_tiny", max_update=1, save_dir=str(tmp_path / "x"),
                    loss_chunk=-1).check()
