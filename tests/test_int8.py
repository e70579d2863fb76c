"""int8 CPU decoding: nmt-generate --precision int8 (dynamic quantization, nmt.models.quantize).

Through the real commands (CliRunner) on the tiny checkpoint of test_translator; no speed is
asserted here (benchmarks/bench_int8.py measures it).
"""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from click.testing import CliRunner
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from nmt.cli.generate import main as generate_main
from nmt.cli.train import main as train_main
from nmt.errors import UsageError
from nmt.models.quantize import is_quantized
from nmt.runtime import PRECISIONS, check_precision, precision_dtype
from nmt.search.translator import Translator

from test_generate import run_quick_benchmark, write
from test_translator import make_checkpoint, mixed_lines


def one_line_error(res, prog, *needles):
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    err = res.stderr.strip()
    assert err.startswith(f"{prog}: error:") and "\n" not in err, err
    assert "Traceback" not in res.output + res.stderr
    for n in needles:
        assert n in err, err
    assert res.stdout == ""


def linears(model):
    """(plain nn.Linear modules, quantized dynamic Linear modules) of a model."""
    plain = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    quant = [n for n, m in model.named_modules() if isinstance(m, DynamicLinear)]
    return plain, quant


def test_generate_int8_one_line_per_input_line_with_a_quantized_model(ckpt, tmp_path,
                                                                      monkeypatch):
    built = []
    real = Translator.from_checkpoint.__func__

    def spy(cls, *args, **kwargs):
        t = real(cls, *args, **kwargs)
        built.append(t)
        return t

    monkeypatch.setattr(Translator, "from_checkpoint", classmethod(spy))
    lines = mixed_lines(30, seed=3)
    src = write(tmp_path / "in.txt", lines)
    res = CliRunner().invoke(generate_main, [str(ckpt), "-i", str(src), "--precision", "int8",
                                             "--device", "cpu", "--threads", "1", "-q"])
    assert res.exit_code == 0, (res.stderr, res.exception)
    out = res.stdout.split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    (t,) = built
    # What the library's int8 decoder gives, line for line (and some line is not empty).
    want = Translator.from_checkpoint(ckpt, precision="int8", device="cpu").translate(lines)
    assert out[:-1] == want and any(want)

    # The model the command decoded with: every linear layer quantized, the output
    # projection too; the embeddings float32 and untouched.
    (model,) = t.ensemble.models
    plain, quant = linears(model)
    assert plain == [] and is_quantized(model)
    cfg = model.cfg
    per_encoder, per_decoder = 4, 7   # in_proj out_proj fc1 fc2 (+ q_proj kv_proj out_proj)
    assert len(quant) == (cfg.encoder_layers * per_encoder + cfg.decoder_layers * per_decoder
                          + 1)
    assert "quantized_output" in quant
    assert model.quantized_output.weight().dtype == torch.qint8
    v, d = model.tgt_embed.weight.shape
    assert (model.quantized_output.in_features, model.quantized_output.out_features) == (d, v)
    assert model.tgt_embed.weight.dtype == torch.float32
    fp32 = Translator.from_checkpoint(ckpt, device="cpu").ensemble.models[0]
    assert torch.equal(model.tgt_embed.weight, fp32.tgt_embed.weight)


def test_int8_logits_are_close_to_fp32_and_fp32_is_unchanged(ckpt):
    fp32 = Translator.from_checkpoint(ckpt, device="cpu").ensemble.models[0]
    assert fp32.quantized_output is None
    plain, quant = linears(fp32)
    assert plain and not quant and not is_quantized(fp32)
    keys = set(fp32.state_dict())
    assert not any("quantized" in k for k in keys)     # checkpoints keep their format
    q = Translator.from_checkpoint(ckpt, precision="int8").ensemble.models[0]

    src = torch.tensor([[5, 9, 13, 7, 2], [6, 8, 2, 1, 1]])
    prev = torch.tensor([[2, 5, 11], [2, 7, 7]])
    with torch.no_grad():
        a = fp32(src, prev)
        b = q(src, prev)
        # incremental decoding uses the same projection
        state = q.init_state(q.encode(src))
        c, _ = q.decode(prev, state)
    assert b.dtype == torch.float32 and b.shape == a.shape
    assert torch.allclose(b, c, atol=1e-4)
    scale = a.abs().max().item()
    assert (a - b).abs().max().item() < 0.05 * scale     # measured: ~0.017 * scale
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.8


def test_int8_library_api_ensemble_and_auto_device(ckpt, tmp_path, monkeypatch):
    other = make_checkpoint(tmp_path / "other.pt", seed=1)
    t = Translator.from_checkpoint([ckpt, other], precision="int8")
    assert all(linears(m)[0] == [] and linears(m)[1] for m in t.ensemble.models)
    lines = mixed_lines(12, seed=4)
    assert len(t.translate(lines)) == len(lines)
    # int8 runs on the CPU only, so "auto" means the CPU even where a GPU would be picked.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert Translator.from_checkpoint(ckpt, precision="int8", device="auto").device.type == "cpu"


def test_precision_table_knows_int8():
    cpu = torch.device("cpu")
    assert "int8" in PRECISIONS
    assert precision_dtype("int8") is torch.float32
    assert check_precision("int8", cpu) is torch.float32
    with pytest.raises(UsageError, match="decoding only"):
        check_precision("int8", cpu, training=True)
    with pytest.raises(UsageError, match="CPU only"):
        check_precision("int8", torch.device("cuda"))
    from nmt.training.config import TrainConfig

    # A run's precision is checked with its other options, before anything is built.
    with pytest.raises(UsageError, match="decoding only"):
        TrainConfig(precision="int8", device="cpu", max_update=1).check()


def test_int8_on_cuda_is_a_one_line_error(ckpt, monkeypatch):
    # A machine with a GPU (pretended: the error comes before any CUDA work).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    res = CliRunner().invoke(generate_main, [str(ckpt), "--precision", "int8", "--device",
                                             "cuda"], input="w1 w2\n")
    one_line_error(res, "nmt-generate", "--precision int8", "CPU only", "--device cpu")


@pytest.mark.parametrize("args", [["DATA", "--max-update", "1"],
                                  ["DATA", "--max-update", "1", "--device", "cpu"],
                                  []])                       # no DATA_DIR: stdin is not read
def test_int8_training_is_a_one_line_error(tmp_path, args):
    args = [str(tmp_path) if a == "DATA" else a for a in args]
    res = CliRunner().invoke(train_main, [*args, "--precision", "int8",
                                          "--save-dir", str(tmp_path / "s")],
                             input=str(tmp_path) + "\n")
    one_line_error(res, "nmt-train", "--precision int8 is for decoding only", "fp32")
    assert not (tmp_path / "s").exists()


@pytest.mark.slow        # a benchmark's quick mode, 5-12 s; CI runs it (.ci/run: -m slow)
def test_bench_int8_quick_mode(tmp_path):
    """benchmarks/bench_int8.py --quick runs end to end and reports what it promises."""
    stdout, rep = run_quick_benchmark("bench_int8.py", tmp_path, "--rounds", "2",
                                      "--hyp-prefix", str(tmp_path / "hyp"))
    assert "time ratio to fp32" in stdout
    assert set(rep["variants"]) == {"fp32", "int8", "int8-linear"}
    ref = tmp_path / "hyp.fp32.txt"                      # --quick scores against fp32's output
    for variant, row in rep["variants"].items():
        assert len(row["wall_s"]) == 2 and row["median_wall_s"] > 0
        assert row["same_output_every_round"]
        # The BLEU reported is nmt-score's on the translations kept, run here on its own.
        hyp = tmp_path / f"hyp.{variant}.txt"
        sc = subprocess.run(["nmt-score", "--ref", str(ref), "--hyp", str(hyp), "--metric",
                             "bleu", "--json", "-q"], capture_output=True, text=True,
                            timeout=120)
        assert sc.returncode == 0, sc.stderr
        assert row["bleu"] == round(json.loads(sc.stdout)["score_exact"], 2), variant
        same = [a == b for a, b in zip(hyp.read_text().splitlines(),
                                       ref.read_text().splitlines())]
        assert row["identical_to_fp32"] == round(sum(same) / len(same), 4), variant
    assert rep["variants"]["fp32"]["bleu"] == 100.0      # scored against itself in --quick


def test_bench_int8_linear_variant_quantizes_the_linear_layers_only(tmp_path):
    """bench_int8's int8-linear decoder: int8 linear layers and the fp32 output projection,
    also at a width where an fp32 load packs the linear layers (nothing left to quantize)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "bench_int8", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_int8.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = make_checkpoint(tmp_path / "wide.pt", d_model=256, d_ff=512, heads=4)
    tr = bench.load("int8-linear", [str(path)], beam=2, batch_size=None)
    (model,) = tr.ensemble.models
    assert is_quantized(model) and model.quantized_output is None
    assert not is_quantized(bench.load("fp32", [str(path)], beam=2, batch_size=None
                                       ).ensemble.models[0])
