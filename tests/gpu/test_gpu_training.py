"""Mixed-precision training on a CUDA GPU: bf16 and fp16 learn and stay finite; fp16 overflow is
skipped with a real torch GradScaler, reported, the scale lowered, and training goes on.

The task is tests/train_support.py's FakeData (the target is the source reversed). On CPU in
fp32 the same schedule (100 updates, warm-up 40, --lr-scale 0.3, max tokens 120) brings the
mean loss of the last 5 updates to 0.43-0.55 of the first 5 (seeds 1-3); the tests ask for 0.75.
"""

from __future__ import annotations

import logging
import math
import re

import pytest
import torch

import nmt
from nmt.checkpoint import load_checkpoint
from nmt.data.buckets import collate
from nmt.training.loop import Run, TrainConfig, train
from nmt.training.trainer import Trainer

from gpu_support import GPU, all_finite, mean, train_records
from train_support import FakeData

pytestmark = GPU

UPDATES = 100
SKIP_RE = re.compile(r"update (\d+): .*not finite, update skipped \((\d+) in a row\); "
                     r"fp16 loss scale lowered to (\S+)$")


def gpu_cfg(save_dir, **kw) -> TrainConfig:
    base = dict(arch="transformer_tiny", max_tokens=120, warmup=40, lr_scale=0.3,
                max_update=UPDATES, log_interval=1, save_dir=str(save_dir), device="cuda")
    base.update(kw)
    return TrainConfig(**base)


def assert_learned(save_dir) -> list[dict]:
    recs = train_records(save_dir)
    # skipped updates do not count: one record per applied update, 1..UPDATES
    assert [r["update"] for r in recs] == list(range(1, UPDATES + 1))
    losses = [r["loss"] for r in recs]
    assert all(math.isfinite(x) for x in losses), losses
    first, last = mean(losses[:5]), mean(losses[-5:])
    assert last < 0.75 * first, (first, last)
    return recs


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_learns_and_stays_finite(tmp_path, caplog, precision):
    caplog.set_level(logging.INFO, logger="nmt")
    path = train(gpu_cfg(tmp_path, precision=precision), FakeData(), "fake")
    assert path == (tmp_path / "checkpoint_last.pt").resolve()
    # it ran on the GPU, in this precision (the start line of the run)
    assert re.search(rf"device cuda(:\d+)?, {precision}\b", caplog.text), caplog.text[-2000:]
    assert_learned(tmp_path)
    ck = load_checkpoint(path)
    assert ck["progress"]["update"] == UPDATES
    assert ck["train_config"]["precision"] == precision
    # autocast keeps the weights in fp32, and none became NaN/inf
    floats = [v for v in ck["model"].values() if v.is_floating_point()]
    assert floats and all(v.dtype == torch.float32 for v in floats)
    assert all_finite(ck["model"])
    if precision == "bf16":
        assert ck["scaler"] is None                       # no loss scaling in bf16
        assert "not finite" not in caplog.text            # and nothing was skipped
    else:
        scale = ck["scaler"]["scale"]
        assert math.isfinite(scale) and scale > 0


def _tiny_fp16_trainer():
    torch.manual_seed(0)
    vocab = len(FakeData().src_codec.dictionary)
    cfg = nmt.get_arch("transformer_tiny", {"dropout": "0"})
    model = nmt.build_model(cfg, vocab, vocab)
    trainer = Trainer(model, label_smoothing=0.1, d_model=cfg.d_model, warmup=10,
                      precision="fp16", device="cuda")
    return model, trainer


def test_fp16_forced_inf_gradient_is_skipped_and_the_scale_halved():
    model, tr = _tiny_fp16_trainer()
    assert isinstance(tr.scaler, torch.amp.GradScaler) and tr.scaler.is_enabled()
    data = FakeData(n_train=48).load_split("train")
    batch = [collate(data, list(range(i * 8, i * 8 + 8))) for i in range(6)]

    s1 = tr.train_step([batch[0]])
    assert not s1.skipped and not s1.nonfinite and tr.num_updates == 1
    scale = tr.scaler.get_scale()
    # a parameter that received a gradient; poison its gradient for the next update only
    target = next(p for p in tr.params if p.grad is not None)
    weights = [p.detach().clone() for p in tr.params]
    adam = {id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
            for p, st in tr.optimizer.state.items()}
    hook = target.register_hook(lambda g: torch.full_like(g, float("inf")))
    try:
        s2 = tr.train_step([batch[1]])
    finally:
        hook.remove()
    assert s2.skipped and s2.nonfinite and not math.isfinite(float(s2.gnorm))
    assert tr.num_updates == 1 and tr.num_skipped == 1 and tr.nonfinite_in_a_row == 1
    assert tr.scaler.get_scale() == scale * tr.scaler.get_backoff_factor() < scale
    # nothing reached the weights or Adam's moments
    for p, w in zip(tr.params, weights):
        assert torch.equal(p.detach(), w)
    for p, st in tr.optimizer.state.items():
        for k, v in st.items():
            before = adam[id(p)][k]
            assert torch.equal(v, before) if torch.is_tensor(v) else v == before, k

    # training continues at the lowered scale: the next updates apply and stay finite
    for b in batch[2:]:
        s = tr.train_step([b])
        assert not s.skipped and not s.nonfinite and math.isfinite(float(s.loss))
    assert tr.num_updates == 5 and tr.nonfinite_in_a_row == 0 and tr.num_skipped == 1
    assert tr.scaler.get_scale() == scale * tr.scaler.get_backoff_factor()
    assert any(not torch.equal(p.detach(), w) for p, w in zip(tr.params, weights))
    assert all(bool(torch.isfinite(p).all()) for p in tr.params)


def test_fp16_overflow_in_the_training_loop_is_skipped_reported_and_survived(tmp_path, caplog):
    """A real overflow: a GradScaler starting at 2**20 makes the fp16 gradient of the logits
    (about 0.86 * scale for an untrained model) exceed fp16's 65504 until the scale is low
    enough. The loop must skip those updates (counting only applied ones), report each with the
    lowered scale, and then train normally."""
    caplog.set_level(logging.INFO, logger="nmt")
    init = 2.0 ** 20
    run = Run(gpu_cfg(tmp_path, precision="fp16", max_nonfinite=40), FakeData(), "fake")
    run.trainer.scaler = torch.amp.GradScaler("cuda", init_scale=init)
    path = run.run()

    reports = [SKIP_RE.search(r.getMessage()) for r in caplog.records]
    reports = [(int(m[1]), int(m[2]), float(m[3])) for m in reports if m]
    assert reports, "no overflowing update was reported"
    assert reports[0][:2] == (1, 1)           # the very first update overflowed
    # every report halves the previous scale (no growth within 2000 good updates)
    assert [s for _, _, s in reports] == [init / 2 ** (i + 1) for i in range(len(reports))]
    k = len(reports)
    assert run.trainer.num_skipped == k < 40
    assert run.trainer.scaler.get_scale() == init / 2 ** k
    assert_learned(tmp_path)                  # then it trained normally
    ck = load_checkpoint(path)
    assert ck["progress"]["update"] == UPDATES
    assert ck["scaler"]["scale"] == init / 2 ** k
    assert all_finite(ck["model"])


def test_attention_runs_no_cudnn_kernels_whose_plans_cost_milliseconds_per_shape():
    """torch 2.11 picks cuDNN's fused attention on Hopper, and cuDNN builds a plan for every new
    shape: ~4 ms of CPU per call, 80% of the CPU time of an update with NMT's changing batch
    lengths (the first H200 run: transformer_base 34k target tokens/s, 202k without it). nmt's
    attention switches cuDNN attention off on its first CUDA call (training: masks, dropout;
    decoding goes through the same MultiHeadAttention.attend). The flag is checked on any GPU;
    the profile shows no cuDNN attention op on one where SDPA would have picked it."""
    from torch.profiler import ProfilerActivity, profile

    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        torch.manual_seed(0)
        data = FakeData(n_train=48).load_split("train")
        vocab = len(FakeData().src_codec.dictionary)
        model = nmt.build_model(nmt.get_arch("transformer_tiny"), vocab, vocab).cuda()
        batches = [collate(data, list(range(i, i + 8))) for i in (0, 8, 16)]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for b in batches:                          # three batch shapes, as in training
                b = b.to("cuda")
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(b.src_tokens, b.prev_output_tokens)
                logits.float().sum().backward()
            torch.cuda.synchronize()
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        names = {e.key for e in prof.key_averages()}
        assert any("scaled_dot_product" in n for n in names), sorted(names)[:40]
        assert not [n for n in names if "cudnn_attention" in n], sorted(names)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
