"""--precision auto: bf16 where it pays (a GPU with bf16; a CPU with native bf16 and a wide
model), fp32 elsewhere; the choice is logged, and training refuses it."""

import subprocess

import pytest
import torch

import nmt.runtime as runtime
from nmt.errors import UsageError
from nmt.search.translator import Translator

from test_translator import make_checkpoint

CPU = torch.device("cpu")


@pytest.mark.parametrize("native, width, want", [(True, 512, "bf16"), (True, 1024, "bf16"),
                                                 (True, 256, "fp32"), (True, 128, "fp32"),
                                                 (False, 512, "fp32")])
def test_auto_on_a_cpu(monkeypatch, native, width, want):
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native)
    precision, why = runtime.auto_precision(CPU, width)
    assert precision == want and why


def test_training_refuses_auto():
    with pytest.raises(UsageError, match="for decoding"):
        runtime.check_training_precision("auto")


def test_the_translator_says_what_it_chose(tmp_path, monkeypatch, caplog):
    caplog.set_level("INFO", logger="nmt")
    ckpt = make_checkpoint(tmp_path / "m.pt")
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: False)
    t = Translator.from_checkpoint(ckpt, precision="auto", device="cpu")
    assert t.precision == "fp32"
    assert next(t.ensemble.models[0].parameters()).dtype == torch.float32
    assert "precision auto: fp32" in caplog.text
    assert t.translate(["w1 w2"]) == Translator.from_checkpoint(ckpt).translate(["w1 w2"])


def test_nmt_generate_logs_the_choice(tmp_path):
    ckpt = make_checkpoint(tmp_path / "m.pt")
    p = subprocess.run(["nmt-generate", str(ckpt), "--precision", "auto", "--threads", "1"],
                       input="w1 w2\n", capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "precision auto: fp32" in p.stderr        # the test model is 64 wide
    assert len(p.stdout.splitlines()) == 1
