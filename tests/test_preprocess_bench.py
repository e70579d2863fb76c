"""The preprocessing benchmark runs end to end in its quick mode (on the bundled corpus)."""

import subprocess
import sys
from pathlib import Path

from nmt.data.resources import quickstart_dir

ROOT = Path(__file__).resolve().parent.parent


def test_bench_preprocess_quick(tmp_path):
    out = tmp_path / "BENCH.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_preprocess.py"), str(quickstart_dir()),
         "--quick", "--workers", "1", "--vocab-size", "500", "--write", str(out)],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| quickstart")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1] == "2,000" and float(cells[3].replace(",", "")) > 0
    assert float(cells[4]) > 10                      # MiB of a real Python process tree
    assert "## nmt-preprocess throughput and memory" in out.read_text()
