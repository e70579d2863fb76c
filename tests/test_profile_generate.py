"""benchmarks/profile_generate.py end to end in its --quick mode (a random tiny model)."""

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "profile_generate.py"


@pytest.mark.slow        # a benchmark's quick mode, 5-12 s; CI runs it (.ci/run: -m slow)
def test_profile_generate_quick(tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--limit", "20", "--threads",
                        "1", "--json", str(out)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["sentences"] == 20 and res["beam"] == 4 and res["decoder_steps"] > 0

    cells = defaultdict(float)
    phases = defaultdict(float)
    for key, ms in res["ms_per_sentence"].items():
        cat, phase = key.split(" | ")
        assert ms >= 0
        cells[(cat, phase)] += ms
        phases[phase] += ms
    # Every event's self time lands in one cell: together they are the profiled call, which
    # the root region spans (the rest of the profiled wall is two perf_counter reads).
    wall_ms = 1e3 * res["profiled_wall_s"] / res["sentences"]
    assert abs(sum(phases.values()) - wall_ms) <= 0.05 * wall_ms, (phases, wall_ms)
    # The model's work is inside the marked regions, the beam bookkeeping outside them.
    assert cells[("matmul kernels", "decoder steps")] > 0
    assert cells[("attention (SDPA kernels)", "decoder steps")] > 0
    assert cells[("matmul kernels", "encoder")] > 0
    # every model call is marked: no matmul runs in the search itself
    assert cells[("matmul kernels", "search and the rest")] < 0.01 * phases["decoder steps"]
    assert phases["search and the rest"] > 0
    assert set(phases) == {"decoder steps", "encoder", "search and the rest"}
    # The printed table ends with the totals row.
    assert r.stdout.strip().splitlines()[-1].startswith("| **all** |")


def test_profile_generate_needs_a_model(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "give CHECKPOINT(s) and --input" in r.stderr
    assert "Traceback" not in r.stderr


def test_int8_products_count_as_matmul_kernels():
    """--precision int8's linear layers run as quantized::linear_dynamic: counted as matrix
    products, not as time outside the ops (Python)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import profile_train
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert profile_train.is_op("quantized::linear_dynamic")
    assert profile_train.own_category("quantized::linear_dynamic") == profile_train.MATMUL
    assert profile_train.own_category("quantized::linear_prepack") != profile_train.MATMUL
    assert profile_train.generic_category("quantized::linear_prepack") == profile_train.OTHER
