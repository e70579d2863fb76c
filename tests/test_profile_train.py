"""benchmarks/profile_train.py end to end in its --quick mode (a tiny synthetic run)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "profile_train.py"
START, END = "<!-- bench:train-profile -->", "<!-- /bench:train-profile -->"


@pytest.mark.slow        # a benchmark's quick mode, 5-12 s; CI runs it (.ci/run: -m slow)
def test_profile_train_quick(tmp_path):
    md = tmp_path / "B.md"
    md.write_text(f"# Benchmarks\n\nabove\n\n{START}\nstale table\n{END}\n\nbelow\n")
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--threads", "1",
                        "--warm-updates", "1", "--updates", "3", "--json", str(out),
                        "--write", str(md)],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())

    # Every profiled event's self time lands in exactly one category: together they make
    # the profiled wall time (only the loop between updates is outside every event).
    cats, wall = res["categories_ms"], res["profiled_ms_per_update"]
    assert min(cats.values()) >= 0
    assert abs(sum(cats.values()) - wall) <= 0.1 * wall, (cats, wall)
    for name in ("matmul kernels", "attention (SDPA kernels)", "dropout", "layer norm", "loss",
                 "data (collate)", "optimizer (grad norm, Adam, zero_grad)"):
        assert cats[name] > 0, name
    assert sum(res["phases_plain_ms"].values()) == pytest.approx(res["plain_ms_per_update"],
                                                                  rel=1e-3)

    # The analytic FLOPs of the padded shapes are the ones the matmul kernels compute, and
    # the split into projections and attention adds up to bench_train's count.
    f = res["flops_per_update"]
    assert f["useful_linear"] + f["useful_attention"] == pytest.approx(f["useful_total"])
    assert f["executed_linear"] > f["useful_linear"] > 0 < f["useful_attention"]
    split = res["mfu_split"]
    assert 0.98 < split["profiler_flops_over_analytic"] < 1.02
    assert 0 < split["matmul_kernel_gflops"] and 0 < split["mfu"] < 1
    shares = [split[k] for k in ("share_matmul_at_peak_useful", "share_matmul_padding",
                                 "share_matmul_below_peak", "share_outside_matmul")]
    assert abs(sum(shares) - 1) < 1e-3

    # The markdown table on stdout lists the matmul category with a number.
    assert re.search(r"^\| matmul kernels \| \d+\.\d \| \d+\.\d%", r.stdout, re.M), r.stdout
    assert len(res["top_ops"]) == 20

    # --write replaced only its own section.
    text = md.read_text()
    assert "above" in text and "below" in text and "stale table" not in text
    assert text.count(START) == 1 and text.count(END) == 1
    assert "| matmul kernels |" in text.split(START)[1].split(END)[0]
