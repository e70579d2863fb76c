"""benchmarks/run_all.py --device cuda: transformer_base and transformer_big trained in bf16, their
target tokens/s and MFU over the bf16 matmul rate measured in the same run, written into the
gpu-train and gpu-memory sections of --out without touching the CPU sections.

A short run on the bundled quickstart corpus (5 timed updates after 3): it checks the harness
on a GPU, it is not a benchmark and asserts no speed beyond plausibility.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nmt.data.resources import quickstart_dir

from gpu_support import GPU, run
from test_benchmarks import number, section, table_rows

pytestmark = GPU

ROOT = Path(__file__).resolve().parents[2]


def test_run_all_cuda_trains_base_and_big_in_bf16_with_mfu(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    cpu_train = "<!-- bench:train -->\nCPU figures, kept\n<!-- /bench:train -->"
    out.write_text(f"# Benchmarks\n\n{cpu_train}\n", encoding="utf-8")
    proc = run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"),
                "--data", str(quickstart_dir()), "--device", "cuda", "--only", "train",
                "--updates", "5", "--warm-updates", "3", "--max-tokens", "4096",
                "--vocab-size", "1000", "--out", str(out), "--work", str(tmp_path / "work")],
               timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text(encoding="utf-8")
    assert cpu_train in text                                  # the CPU section is untouched
    body = section(text, "gpu-train")
    assert "GPU " in body and "CUDA " in body                  # the header names the GPU
    assert "bf16 rate of 8192x8192 torch.matmul timed with CUDA events" in body
    rows = table_rows(body)
    assert [r[0].split()[0] for r in rows] == ["transformer_base", "transformer_big"]
    for r in rows:
        assert r[1] == "bf16" and r[3] == "5 (+3)"
        tokens_s, achieved, matmul, mfu = (number(r[i]) for i in (4, 6, 7, 8))
        assert tokens_s > 0 and achieved > 0
        assert matmul > 1000              # GFLOP/s: any CUDA GPU's bf16 matmul beats 1 TFLOP/s
        # MFU is achieved / matmul rate, both measured: above 100% would be a timing error
        assert 0 < mfu < 100 and abs(mfu - 100 * achieved / matmul) < 0.1
    mem = table_rows(section(text, "gpu-memory"))
    assert sum("GPU max allocated" in r[1] for r in mem) == 2
    for name in ("train", "memory", "preprocess", "generate", "fairseq"):
        assert f"<!-- bench:{name} -->" not in text or name == "train"
