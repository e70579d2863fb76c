import json

import pytest
import torch

import nmt
from nmt.data.buckets import collate
from nmt.checkpoint import load_checkpoint
from nmt.training.loop import TrainConfig, train
from nmt.training.loss import label_smoothed_nll_loss
from nmt.training.optim import LRSchedule, cyclic_lr, make_optimizer, noam_lr
from nmt.training.trainer import Trainer

from train_support import FakeData


def run_cfg(tmp, **kw) -> TrainConfig:
    base = dict(arch="transformer_tiny", max_tokens=120, warmup=10, log_interval=1,
                save_dir=str(tmp), device="cpu")
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("step,expected", [
    (1, 512 ** -0.5 * 1 * 4000 ** -1.5),
    (100, 512 ** -0.5 * 100 * 4000 ** -1.5),
    (4000, 512 ** -0.5 * 4000 ** -0.5),
    (16000, 512 ** -0.5 * 16000 ** -0.5),
])
def test_learning_rate_follows_eq5(step, expected):
    assert noam_lr(step, 512, 4000) == pytest.approx(expected, rel=1e-12)
    assert noam_lr(step, 512, 4000, scale=2.0) == pytest.approx(2 * expected, rel=1e-12)


def test_schedule_sets_the_optimizer_lr_per_update():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = make_optimizer([p])
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    sched = LRSchedule(opt, d_model=256, warmup=50)
    seen = []
    for _ in range(120):
        seen.append(sched.prepare_step())
        assert opt.param_groups[0]["lr"] == seen[-1]
        sched.advance()
    assert seen[0] == pytest.approx(256 ** -0.5 * 50 ** -1.5)
    assert max(seen) == pytest.approx(256 ** -0.5 * 50 ** -0.5)   # peak at step == warmup
    assert seen.index(max(seen)) == 49
    assert seen[99] == pytest.approx(256 ** -0.5 * 100 ** -0.5)


def test_lr_period_runs_cosine_cycles_that_restart_on_eq5():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = make_optimizer([p])
    sched = LRSchedule(opt, d_model=256, warmup=50, period=100)
    seen = []
    for _ in range(350):
        seen.append(sched.prepare_step())
        sched.advance()
    # the warm-up is eq. 5's
    assert seen[:50] == pytest.approx([noam_lr(s, 256, 50) for s in range(1, 51)], rel=1e-12)
    for first in (51, 151, 251):                      # cycles of 100 updates, numbered from 1
        cycle = seen[first - 1:first - 1 + 100]
        assert cycle[0] == pytest.approx(noam_lr(first, 256, 50), rel=1e-12)  # restart on eq. 5
        assert cycle[50] == pytest.approx(cycle[0] / 2, rel=1e-12)             # half-way: half
        assert all(a > b for a, b in zip(cycle, cycle[1:]))                    # falls all along
        assert cycle[-1] < 1e-3 * cycle[0]                                     # to near zero
    assert seen[150] > seen[149] * 100                     # the warm restart
    assert cyclic_lr(120, 256, 50, 1.0, 0) == noam_lr(120, 256, 50)   # period 0: eq. 5 alone
    assert sched.state_dict()["period"] == 100


def test_label_smoothing_formula():
    torch.manual_seed(0)
    lprobs = torch.log_softmax(torch.randn(5, 7, dtype=torch.float64), -1)
    tgt = torch.tensor([0, 3, 6, 2, 2])
    eps = 0.1
    loss, nll = label_smoothed_nll_loss(lprobs, tgt, eps)
    q = torch.full((5, 7), eps / 6, dtype=torch.float64)
    q[torch.arange(5), tgt] = 1 - eps
    assert loss.item() == pytest.approx(-(q * lprobs).sum().item(), rel=1e-12)
    assert nll.item() == pytest.approx(-lprobs[torch.arange(5), tgt].sum().item(), rel=1e-12)


def test_loss_goes_down(tmp_path):
    train(run_cfg(tmp_path, max_update=40, warmup=20, lr_scale=0.3), FakeData(), "fake")
    recs = [json.loads(l) for l in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in recs if r["kind"] == "train"]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.85 * sum(losses[:5]) / 5
    assert (tmp_path / "checkpoint_last.pt").exists() and (tmp_path / "checkpoint_best.pt").exists()


def _tiny_trainer(seed=0):
    torch.manual_seed(seed)
    cfg = nmt.get_arch("transformer_tiny", {"dropout": "0"})
    model = nmt.build_model(cfg, 28, 28).double()
    return model, Trainer(model, label_smoothing=0.1, d_model=cfg.d_model, warmup=5,
                          clip_norm=0.5, device="cpu")


def test_update_freq_2_equals_one_step_on_the_double_batch():
    data = FakeData(n_train=16).load_split("train")
    m1, t1 = _tiny_trainer()
    m2, t2 = _tiny_trainer()
    for step in range(3):
        first = 8 * (step % 2)
        a, b = list(range(first, first + 4)), list(range(first + 4, first + 8))
        s1 = t1.train_step([collate(data, a), collate(data, b)])
        s2 = t2.train_step([collate(data, a + b)])
        assert s1.ntokens == s2.ntokens
        assert s1.loss.item() == pytest.approx(s2.loss.item(), rel=1e-12)
        assert s1.gnorm.item() == pytest.approx(s2.gnorm.item(), rel=1e-10)
        # the normalised gradients of the update agree to float64 rounding
        for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
            assert torch.allclose(p1.grad, p2.grad, rtol=1e-9, atol=1e-14), n
    # Attention key biases get a gradient that is 0 up to rounding (softmax is shift
    # invariant), which Adam rescales; hence atol 1e-9 rather than 1e-12 on the weights.
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
        assert torch.allclose(p1, p2, rtol=1e-10, atol=1e-9), n


def _final_weights(path):
    return load_checkpoint(path)["model"]


def test_resume_equals_uninterrupted(tmp_path):
    # dropout stays on: the RNG state must travel in the checkpoint too. 13 updates cross
    # several epoch boundaries and the first run stops mid-epoch.
    data = FakeData(n_train=40)
    straight = tmp_path / "straight"
    train(run_cfg(straight, max_update=13, save_interval_updates=5), data, "fake")
    split = tmp_path / "split"
    train(run_cfg(split, max_update=5, save_interval_updates=5), data, "fake")
    ck = load_checkpoint(split / "checkpoint_last.pt")
    assert ck["progress"]["update"] == 5 and 0 < ck["progress"]["epoch_batches_done"]
    train(run_cfg(split, max_update=13, save_interval_updates=5), data, "fake")
    a = _final_weights(straight / "checkpoint_last.pt")
    b = _final_weights(split / "checkpoint_last.pt")
    assert load_checkpoint(split / "checkpoint_last.pt")["progress"]["update"] == 13
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the same lr after resuming: the schedule state travelled
    assert load_checkpoint(split / "checkpoint_last.pt")["scheduler"]["step_num"] == 13


def test_no_resume_starts_afresh(tmp_path):
    data = FakeData(n_train=20)
    train(run_cfg(tmp_path, max_update=3), data, "fake")
    train(run_cfg(tmp_path, max_update=2, resume=False), data, "fake")
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["progress"]["update"] == 2


def test_average_last_and_max_epoch(tmp_path):
    data = FakeData(n_train=30)
    out = train(run_cfg(tmp_path, max_epoch=2, max_tokens=40, save_interval_updates=2,
                        average_last=3), data,
                "fake")
    assert out.name == "checkpoint_avg3.pt"
    ck = load_checkpoint(out)
    assert len(ck["averaged_from"]) == 3 and "optimizer" not in ck
    last = load_checkpoint(tmp_path / "checkpoint_last.pt")
    assert last["progress"]["epoch"] == 3 and last["progress"]["epoch_batches_done"] == 0


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_fused_loss_matches_the_reference_and_its_gradient(eps):
    from nmt.training.loss import smoothed_cross_entropy

    torch.manual_seed(1)
    z1 = torch.randn(6, 9, dtype=torch.float64, requires_grad=True)
    z2 = z1.detach().clone().requires_grad_(True)
    tgt = torch.tensor([0, 8, 3, 3, 5, 1])
    l1, n1 = smoothed_cross_entropy(z1, tgt, eps)
    l2, n2 = label_smoothed_nll_loss(torch.log_softmax(z2, -1), tgt, eps)
    assert l1.item() == pytest.approx(l2.item(), rel=1e-12)
    assert n1.item() == pytest.approx(n2.item(), rel=1e-12)
    (3 * l1).backward()
    (3 * l2).backward()
    assert torch.allclose(z1.grad, z2.grad, rtol=1e-10, atol=1e-13)
    assert torch.autograd.gradcheck(lambda z: smoothed_cross_entropy(z, tgt, eps)[0],
                                    (z1.detach().requires_grad_(),))
    # a second backward through the same graph gives the same gradient again
    z3 = z1.detach().clone().requires_grad_(True)
    l3, _ = smoothed_cross_entropy(z3, tgt, eps)
    l3.backward(retain_graph=True)
    l3.backward()
    assert torch.allclose(z3.grad, 2 * z2.grad / 3, rtol=1e-10, atol=1e-13)


def test_time_based_saving_and_stopping(tmp_path):
    data = FakeData(n_train=30)
    # a tiny interval: every update is due for a save; max_time stops after the first update
    train(run_cfg(tmp_path / "a", max_update=3, save_interval_minutes=1e-9, keep_last=10),
          data, "fake")
    assert sorted(p.name for p in (tmp_path / "a").glob("checkpoint_[0-9]*.pt")) == [
        "checkpoint_1.pt", "checkpoint_2.pt", "checkpoint_3.pt"]
    train(run_cfg(tmp_path / "b", max_update=50, max_time=1e-9), data, "fake")
    assert load_checkpoint(tmp_path / "b" / "checkpoint_last.pt")["progress"]["update"] == 1


def test_keep_last_prunes_old_checkpoints(tmp_path):
    train(run_cfg(tmp_path, max_update=6, save_interval_updates=1, keep_last=2), FakeData(), "f")
    assert sorted(p.name for p in tmp_path.glob("checkpoint_[0-9]*.pt")) == [
        "checkpoint_5.pt", "checkpoint_6.pt"]


def test_rerun_after_max_update_trains_nothing(tmp_path):
    data = FakeData(n_train=20)
    train(run_cfg(tmp_path, max_update=3), data, "fake")
    before = load_checkpoint(tmp_path / "checkpoint_last.pt")["model"]
    out = train(run_cfg(tmp_path, max_update=3), data, "fake")
    after = load_checkpoint(out)
    assert after["progress"]["update"] == 3
    assert all(torch.equal(before[k], after["model"][k]) for k in before)


def test_train_log_continues_on_resume_and_restarts_without(tmp_path):
    data = FakeData(n_train=20)
    train(run_cfg(tmp_path, max_update=2), data, "fake")
    train(run_cfg(tmp_path, max_update=4), data, "fake")
    log = [json.loads(l) for l in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["update"] for r in log if r["kind"] == "train"] == [1, 2, 3, 4]
    train(run_cfg(tmp_path, max_update=1, resume=False), data, "fake")
    log = [json.loads(l) for l in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["update"] for r in log if r["kind"] == "train"] == [1]
