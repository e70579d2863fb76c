"""Generation on a CUDA GPU against the CPU: greedy search in fp32 gives the same translations;
bf16 gives nearly the same.

The checkpoint is tests/test_translator.py's tiny untrained model (its eos made a little likelier
so that outputs vary in length), over 200+ non-empty lines of up to 13 words.
"""

from __future__ import annotations

import pytest
import torch

from nmt.search.translator import BatchConfig, SearchConfig, Translator

from gpu_support import GPU
from test_translator import mixed_lines

pytestmark = GPU

GREEDY = SearchConfig(beam=1)
# bf16 against fp32: the share of lines that must be identical, and the largest difference of
# a hypothesis score (log P / lp) on identical lines. bf16 keeps 8 significant bits (relative
# rounding ~0.4% per operation), so greedy search picks another token wherever the two best
# candidates are about that close, and the rest of the line follows. Measured with bf16 on a CPU
# with native bf16 (AVX512-BF16) for this model family (6 seeds x 213 lines): 97.2-100% of the
# lines identical, score differences at most 0.074. 90% and 0.2 leave room for the GPU's other
# kernels; a broken bf16 path (wrong dtype, garbage activations) lands far below both.
BF16_MIN_SAME = 0.90
BF16_MAX_SCORE_DIFF = 0.2


@pytest.fixture(scope="module")
def lines():
    return [line for line in mixed_lines(240, seed=11) if line.strip()]


@pytest.fixture
def no_tf32(monkeypatch):
    """fp32 must mean fp32 on the GPU too (TF32 matmuls round to 10 bits)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def best(results):
    return [r.hypotheses[0] for r in results]


def translate(ckpt, lines, device, precision="fp32"):
    tr = Translator.from_checkpoint(ckpt, search=GREEDY, batch=BatchConfig(batch_size=32),
                                    device=device, precision=precision)
    model = tr.ensemble.models[0]
    p = next(model.parameters())
    assert p.device.type == torch.device(device).type       # it really ran there ...
    assert p.dtype == {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]  # ... so
    return best(tr.translate_results(lines))


def test_greedy_fp32_on_cuda_equals_cpu(ckpt, lines, no_tf32):
    cpu = translate(ckpt, lines, "cpu")
    gpu = translate(ckpt, lines, "cuda")
    assert len(set(h.text for h in cpu)) > 10              # not one degenerate output
    diff = [i for i, (a, b) in enumerate(zip(cpu, gpu)) if a.ids != b.ids]
    assert not diff, (f"{len(diff)}/{len(lines)} lines differ, first: {lines[diff[0]]!r}: "
                      f"cpu {cpu[diff[0]].text!r} vs cuda {gpu[diff[0]].text!r}")
    assert [h.text for h in cpu] == [h.text for h in gpu]
    for a, b in zip(cpu, gpu):
        assert b.score == pytest.approx(a.score, abs=1e-3)
        assert b.token_scores == pytest.approx(a.token_scores, abs=1e-3)


def test_greedy_bf16_on_cuda_is_close_to_fp32(ckpt, lines, no_tf32):
    ref = translate(ckpt, lines, "cpu")
    bf16 = translate(ckpt, lines, "cuda", "bf16")
    same = [i for i, (a, b) in enumerate(zip(ref, bf16)) if a.ids == b.ids]
    share = len(same) / len(lines)
    assert share >= BF16_MIN_SAME, f"only {share:.1%} of the lines identical in bf16"
    worst = max(abs(ref[i].score - bf16[i].score) for i in same)
    assert worst <= BF16_MAX_SCORE_DIFF, worst
    # bf16 is not silently fp32: some score differs by more than fp32 rounding
    assert worst > 1e-5
