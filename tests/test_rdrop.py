"""R-Drop (nmt-train --rdrop-alpha): the loss against a direct computation, the duplicated
batch against the plain loss, alpha 0 against a run without the option, exact resume."""

import os
import re
import signal
import subprocess

import pytest
import torch
import torch.nn.functional as F

import nmt
from nmt.checkpoint import load_checkpoint
from nmt.errors import UsageError
from nmt.training.loop import TrainConfig, train
from nmt.training.loss import ModelWithLoss, label_smoothed_nll_loss

from train_support import FakeData, write_reversal_corpus

V = 37


def _model(dropout: float):
    torch.manual_seed(0)
    cfg = nmt.get_arch("transformer_tiny", {"dropout": dropout})
    return nmt.build_model(cfg, V, V, share_all_embeddings=True).train()


def _batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, V, (3, 6), generator=g)
    tgt = torch.randint(4, V, (3, 5), generator=g)
    tgt[2, 3:] = 0                                         # padding (pad index 0)
    prev = torch.cat([torch.full((3, 1), 2), tgt[:, :-1]], 1)
    return src, prev, tgt


def test_the_loss_equals_a_direct_computation_of_two_passes():
    """Two separate forwards under the RNG states the one doubled forward used, the paper's
    loss written out with F.kl_div: the same value and the same gradients."""
    src, prev, tgt = _batch()
    alpha, eps = 3.0, 0.1
    model = _model(0.3)
    crit = ModelWithLoss(model, eps, pad_idx=0, rdrop_alpha=alpha).train()
    torch.manual_seed(5)
    loss, nll, kl = crit(src, prev, tgt)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()

    # The direct computation: the doubled batch's rows are independent, so one forward of
    # [x; x] with the RNG of seed 5 gives the two passes; split them as the paper writes them.
    torch.manual_seed(5)
    hidden = model(torch.cat([src, src]), torch.cat([prev, prev]), return_hidden=True)
    mask = tgt.ne(0)
    h1, h2 = hidden[:3][mask], hidden[3:][mask]
    lp1 = F.log_softmax(model.output_projection(h1), -1)
    lp2 = F.log_softmax(model.output_projection(h2), -1)
    t = tgt[mask]
    ce1, nll1 = label_smoothed_nll_loss(lp1, t, eps)
    ce2, nll2 = label_smoothed_nll_loss(lp2, t, eps)
    kl12 = F.kl_div(lp2, lp1, log_target=True, reduction="sum")     # KL(P1 || P2)
    kl21 = F.kl_div(lp1, lp2, log_target=True, reduction="sum")     # KL(P2 || P1)
    paper = ce1 + ce2 + alpha * (kl12 + kl21) / 2
    (paper / 2).backward()
    assert kl.item() > 1e-4                                 # dropout made the passes differ
    assert kl.item() == pytest.approx(((kl12 + kl21) / 2).item(), rel=1e-5)
    assert loss.item() == pytest.approx(paper.item() / 2, rel=1e-6)
    assert nll.item() == pytest.approx((nll1 + nll2).item() / 2, rel=1e-6)
    for k, p in model.named_parameters():
        assert torch.allclose(grads[k], p.grad, rtol=1e-4, atol=1e-6), (k, (grads[k] - p.grad).abs().max())


@pytest.mark.parametrize("eps", [0.1, 0.0])
def test_the_fused_loss_equals_autograd_through_rdrop_loss(eps):
    """fused_rdrop_loss (chunked, its gradient computed in the forward) against autograd
    through rdrop_loss, in float64: values and gradients to rounding."""
    from nmt.training.loss import fused_rdrop_loss, rdrop_loss

    g = torch.Generator().manual_seed(3)
    z = (torch.randn(2 * 7, 13, generator=g, dtype=torch.float64) * 2).requires_grad_()
    t = torch.randint(0, 13, (7,), generator=g)
    want = rdrop_loss(torch.log_softmax(z, -1), t, eps, 3.0)
    (gw,) = torch.autograd.grad(want[0], z)
    got = fused_rdrop_loss(z, t, eps, 3.0, chunk=3)
    (gg,) = torch.autograd.grad(got[0], z)
    for a, b in zip(got, want):
        assert a.item() == pytest.approx(b.item(), rel=1e-12)
    assert torch.allclose(gg, gw, rtol=1e-10, atol=1e-13)


def test_without_dropout_both_passes_are_the_plain_loss():
    """No dropout: the two copies are the same computation, so the KL term is zero and the
    loss is the plain loss (which also checks that the second copy's targets line up)."""
    src, prev, tgt = _batch()
    model = _model(0.0)
    plain = ModelWithLoss(model, 0.1, pad_idx=0)(src, prev, tgt)
    rdrop = ModelWithLoss(model, 0.1, pad_idx=0, rdrop_alpha=5.0)(src, prev, tgt)
    assert rdrop[2].item() == pytest.approx(0.0, abs=1e-6)
    assert rdrop[0].item() == pytest.approx(plain[0].item(), rel=1e-5)
    assert rdrop[1].item() == pytest.approx(plain[1].item(), rel=1e-5)


def test_validation_is_a_single_pass():
    src, prev, tgt = _batch()
    model = _model(0.3)
    crit = ModelWithLoss(model, 0.1, pad_idx=0, rdrop_alpha=5.0).eval()
    plain = ModelWithLoss(model, 0.1, pad_idx=0).eval()
    with torch.no_grad():
        a, b = crit(src, prev, tgt), plain(src, prev, tgt)
    assert a[2].item() == 0.0 and a[0].item() == b[0].item()


def _weights(tmp_path, name, **kw):
    save = tmp_path / name
    cfg = TrainConfig(arch="transformer_tiny", max_tokens=200, max_update=3, warmup=2,
                      save_dir=str(save), device="cpu", log_interval=1, **kw)
    train(cfg, FakeData(n_train=30), "fake")
    return load_checkpoint(save / "checkpoint_last.pt"), save


def test_alpha_zero_trains_the_same_weights_bit_for_bit_and_alpha_is_logged(tmp_path):
    plain, _ = _weights(tmp_path, "plain")
    zero, _ = _weights(tmp_path, "zero", rdrop_alpha=0.0)
    on, save = _weights(tmp_path, "on", rdrop_alpha=2.0)
    assert plain["model"].keys() == zero["model"].keys()
    for k in plain["model"]:
        assert torch.equal(plain["model"][k], zero["model"][k]), k
    assert any(not torch.equal(plain["model"][k], on["model"][k]) for k in plain["model"])
    records = [r for r in map(__import__("json").loads,
                              (save / "train_log.jsonl").read_text().splitlines())
               if r["kind"] == "train"]
    assert len(records) == 3 and all(r["rdrop_kl"] > 0 for r in records)


@pytest.mark.parametrize("alpha", [-1.0, float("nan"), float("inf")])
def test_a_bad_alpha_is_refused(alpha, tmp_path):
    with pytest.raises(UsageError, match="--rdrop-alpha"):
        TrainConfig(arch="transformer_tiny", max_update=1, save_dir=str(tmp_path),
                    rdrop_alpha=alpha).check()


# --- exact resume with R-Drop on (the real console script) --------------------------------

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=180,
                          stdin=subprocess.DEVNULL, **kw)


@pytest.mark.slow        # ~20 s; CI runs it (.ci/run: -m slow)
def test_kill_9_and_resume_with_rdrop_equals_an_uninterrupted_run(tmp_path):
    data = write_reversal_corpus(tmp_path, _run, ("--workers", "1", "-q"))

    def args(save):
        return [data, "--arch", "transformer_tiny", "--max-tokens", "60", "--max-update", "12",
                "--warmup", "4", "--seed", "3", "--save-interval-updates", "2",
                "--log-interval", "1", "--threads", "1", "--rdrop-alpha", "1.5",
                "--save-dir", str(save)]

    r = _run(["nmt-train", *args(tmp_path / "straight")])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "R-Drop alpha 1.5" in r.stderr and " | kl " in r.stderr
    reference = load_checkpoint(tmp_path / "straight" / "checkpoint_last.pt")

    save = tmp_path / "killed"
    proc = subprocess.Popen(["nmt-train", *args(save)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        for line in proc.stderr:
            m = re.search(r"\| update (\d+) \|", line)
            if m and int(m.group(1)) >= 5:
                proc.send_signal(signal.SIGKILL)
                break
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert load_checkpoint(save / "checkpoint_last.pt")["progress"]["update"] < 12
    r = _run(["nmt-train", *args(save)])
    assert r.returncode == 0 and "resumed from" in r.stderr, r.stderr[-3000:]
    resumed = load_checkpoint(save / "checkpoint_last.pt")
    assert resumed["progress"]["update"] == 12
    for k in reference["model"]:
        assert torch.equal(reference["model"][k], resumed["model"][k]), k
