"""nmt-train's optimisation controls for fairseq users: --lr, --lr-scheduler
noam|inverse_sqrt|cosine with --warmup-init-lr and --min-lr, --optimizer adam|adamw with
--weight-decay; each reaches the update through the real command, is recorded in the
checkpoint and named when a resumed run changes it."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from nmt.checkpoint import load_checkpoint
from nmt.cli.train import main as train_main
from nmt.training.optim import LRSchedule, ScheduleSpec, make_optimizer
from test_resume_checks import corpus

TINY = ["--arch", "transformer_tiny", "--max-tokens", "100", "--threads", "1",
        "--log-interval", "1"]


def cli(args):
    r = CliRunner().invoke(train_main, [str(a) for a in args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def logged_lrs(save) -> list[float]:
    recs = [json.loads(x) for x in (save / "train_log.jsonl").read_text().splitlines()]
    return [r["lr"] for r in recs if r.get("kind") == "train"]


class FairseqInverseSqrt:
    """fairseq's inverse_sqrt scheduler, stepped the way fairseq's trainer steps it: the rate
    is set at construction and after each update from the number of updates made."""

    def __init__(self, lr, warmup, warmup_init_lr):
        self.lr_step = (lr - warmup_init_lr) / warmup
        self.decay = lr * warmup ** 0.5
        self.warmup, self.init = warmup, warmup_init_lr
        self.current = warmup_init_lr

    def step_update(self, num_updates):
        if num_updates < self.warmup:
            self.current = self.init + num_updates * self.lr_step
        else:
            self.current = self.decay * num_updates ** -0.5


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("controls") / "a", [f"w{i}" for i in range(16)])


def test_inverse_sqrt_follows_fairseq_update_by_update(data, tmp_path):
    save = tmp_path / "ck"
    code, _, err = cli([data, *TINY, "--lr-scheduler", "inverse_sqrt", "--lr", 0.002,
                        "--warmup", 4, "--warmup-init-lr", 1e-4, "--max-update", 9,
                        "--save-dir", save])
    assert code == 0, err
    ref, expected = FairseqInverseSqrt(0.002, 4, 1e-4), []
    for n in range(9):
        expected.append(ref.current)          # the rate the update n + 1 runs at
        ref.step_update(n + 1)
    assert logged_lrs(save) == pytest.approx(expected, rel=1e-6)
    ck = load_checkpoint(save / "checkpoint_last.pt")
    assert ck["train_config"]["lr_scheduler"] == "inverse_sqrt"
    assert ck["scheduler"]["kind"] == "inverse_sqrt" and ck["scheduler"]["lr"] == 0.002


def test_lr_sets_the_peak_of_eq5(data, tmp_path):
    save = tmp_path / "ck"
    code, _, err = cli([data, *TINY, "--lr", 0.003, "--warmup", 4, "--max-update", 6,
                        "--save-dir", save])
    assert code == 0, err
    lrs = logged_lrs(save)
    assert max(lrs) == pytest.approx(0.003, rel=1e-6) and lrs.index(max(lrs)) == 3
    # the shape stays eq. 5's: update 6 runs at peak * sqrt(4 / 6)
    assert lrs[5] == pytest.approx(0.003 * math.sqrt(4 / 6), rel=1e-6)


def test_cosine_warms_up_then_reaches_min_lr_at_max_update():
    opt = make_optimizer([torch.nn.Parameter(torch.zeros(2))])
    sched = LRSchedule(opt, d_model=64, spec=ScheduleSpec("cosine", warmup=10, lr=1e-3,
                                                          min_lr=1e-5, total=110))
    lrs = [sched.lr_at(s) for s in range(1, 112)]
    assert lrs[0] == 0.0 and lrs[10] == pytest.approx(1e-3)          # update 11: the peak
    assert lrs[60] == pytest.approx(1e-5 + (1e-3 - 1e-5) / 2)        # halfway down
    assert lrs[110] == pytest.approx(1e-5) and lrs[109] > lrs[110]
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_adamw_decays_weights_decoupled_and_adam_adds_l2():
    def one_step(kind):
        p = torch.nn.Parameter(torch.full((3,), 2.0))
        opt = make_optimizer([p], kind=kind, weight_decay=0.1)
        for g in opt.param_groups:
            g["lr"] = 0.01
        p.grad = torch.zeros(3)
        opt.step()
        return p.detach()

    # AdamW with a zero gradient: p * (1 - lr * wd), Adam's moments untouched
    assert torch.allclose(one_step("adamw"), torch.full((3,), 2.0 * (1 - 0.01 * 0.1)))
    # Adam's L2 term is a gradient: its normalised first step moves p by about lr
    assert torch.allclose(one_step("adam"), torch.full((3,), 2.0 - 0.01), atol=1e-6)


def test_adamw_through_the_command_and_named_on_resume(data, tmp_path):
    save = tmp_path / "ck"
    args = [data, *TINY, "--warmup", 4, "--save-dir", save, "--save-interval-updates", 2]
    code, _, err = cli([*args, "--optimizer", "adamw", "--weight-decay", 0.01, "--max-update", 2])
    assert code == 0, err
    ck = load_checkpoint(save / "checkpoint_last.pt")
    assert ck["train_config"]["optimizer"] == "adamw"
    assert ck["optimizer"]["param_groups"][0]["weight_decay"] == 0.01
    code, _, err = cli([*args, "--optimizer", "adam", "--weight-decay", 0.01, "--max-update", 4])
    assert code == 0, err
    assert "--optimizer adam (was adamw)" in err
    ck = load_checkpoint(save / "checkpoint_last.pt")
    assert ck["train_config"]["optimizer"] == "adam" and ck["progress"]["update"] == 4


@pytest.mark.parametrize("extra,message", [
    (["--lr-scheduler", "inverse_sqrt"], "--lr-scheduler inverse_sqrt needs --lr"),
    (["--lr", "0.001", "--lr-scale", "2"], "--lr and --lr-scale both set the peak"),
    # given explicitly, the default value is given too
    (["--lr", "0.001", "--lr-scale", "1.0"], "--lr and --lr-scale both set the peak"),
    (["--lr-scheduler", "inverse_sqrt", "--lr", "0.001", "--lr-scale", "1"],
     "--lr-scale goes with --lr-scheduler noam, not inverse_sqrt"),
    (["--lr-scheduler", "cosine", "--lr", "0.001", "--warmup", "10"],
     "needs --max-update beyond --warmup"),
    (["--lr", "-1"], "--lr must be > 0"),
    (["--weight-decay", "-0.1"], "must be >= 0"),
])
def test_bad_schedule_options_are_usage_errors(data, tmp_path, extra, message):
    code, out, err = cli([data, *TINY, "--max-update", 5, "--save-dir", tmp_path / "ck", *extra])
    assert code == 2 and out == ""
    assert message in err and "Traceback" not in err


def test_lr_scale_given_is_told_from_lr_scale_unset_in_the_library_and_on_resume():
    """TrainConfig, not only the command line, refuses --lr-scale beside --lr or another
    scheduler whatever its value; unset means 1, and a checkpoint that stored 1 (before it
    could be unset) resumes with it unset as the same run."""
    from nmt.errors import UsageError
    from nmt.training.config import TrainConfig
    from nmt.training.resume import changed_options

    def check(**kw):
        TrainConfig(max_update=5, **kw).check()

    check(lr=0.001)
    check(lr_scale=1.0)
    with pytest.raises(UsageError, match="--lr and --lr-scale both set the peak"):
        check(lr=0.001, lr_scale=1.0)
    with pytest.raises(UsageError, match="--lr-scale goes with --lr-scheduler noam, not cosine"):
        check(lr_scheduler="cosine", lr=0.001, warmup=2, lr_scale=1.0)
    with pytest.raises(UsageError, match="--lr-period goes with --lr-scheduler noam, not cosine"):
        check(lr_scheduler="cosine", lr=0.001, warmup=2, lr_period=4)
    assert TrainConfig().eq5_scale == 1.0
    assert TrainConfig(lr_scale=2.5).eq5_scale == 2.5
    unset, two = TrainConfig(), TrainConfig(lr_scale=2.0)
    assert changed_options({"lr_scale": 1.0}, unset) == []
    assert changed_options({"lr_scale": None}, TrainConfig(lr_scale=1.0)) == []
    assert changed_options({"lr_scale": None}, two) == ["--lr-scale 2 (was 1)"]
    assert changed_options({"lr_scale": 2.0}, unset) == ["--lr-scale 1 (was 2)"]
