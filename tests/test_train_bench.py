import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow        # a benchmark's quick mode, 5-12 s; CI runs it (.ci/run: -m slow)
def test_bench_train_quick_mode():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), "--quick",
                        "--threads", "1"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["updates"] == 8
    assert res["tgt_tokens_per_s"] > 0 and res["updates_per_s"] > 0
    assert 0 < res["mfu"] < 1 and res["matmul_peak_gflops"] > 0 and res["peak_rss_gb"] > 0
