"""benchmarks/bench_ct2.py end to end on a model trained in seconds: every engine, precision
and beam gets a row, CTranslate2's tuned setting and each default batch are named, and the
ratio table has a line per beam. No timing assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.runtime import cpu_has_native_bf16

pytest.importorskip("ctranslate2")

from test_export import quickstart_dir, trained  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow        # about a minute; CI runs it (.ci/run: -m slow)
def test_one_run_rows_every_engine_and_names_the_batches(trained, tmp_path):
    lines = (quickstart_dir() / "test.en").read_text(encoding="utf-8").splitlines()[:24]
    refs = (quickstart_dir() / "test.de").read_text(encoding="utf-8").splitlines()[:24]
    (tmp_path / "in.en").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    (tmp_path / "ref.de").write_text("".join(x + "\n" for x in refs), encoding="utf-8")
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_ct2.py"), str(trained),
                        "--input", str(tmp_path / "in.en"), "--ref", str(tmp_path / "ref.de"),
                        "--threads", "1", "--rounds", "1", "--tune-passes", "1",
                        "--beams", "1,2", "--json", str(out), "--markdown", str(md)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    rows = {(r["engine"], r["precision"], r["beam"]): r for r in report["rows"]}
    ours = ["fp32", "bf16", "int8"] if cpu_has_native_bf16() else ["fp32", "int8"]
    want = {("nmt", q, b) for q in ours for b in (1, 2)}
    want |= {("ct2", ct, b) for ct in ("float32", "int8", "int8_float32") for b in (1, 2)}
    want |= {("nmt-ct2", ct, b) for ct in ("float32", "int8") for b in (1, 2)}
    want |= {("ct2-search", ct, 2) for ct in ("float32", "int8")}
    assert set(rows) == want
    assert report["sentences"] == 24
    for r in rows.values():
        assert r["sentences_per_s"] > 0 and r["rss_mb"] > 0 and r["bleu"] is not None
    # transformer_tiny is narrower than transformer_small: nmt's own engine and CTranslate2's
    # int8 through nmt take the larger default batch, CTranslate2's float32 through nmt not
    assert rows[("nmt", "fp32", 2)]["setting"] == "defaults (8192 source tokens per batch)"
    assert rows[("nmt-ct2", "int8", 2)]["setting"].startswith(
        "defaults (8192 source tokens per batch), ")
    assert rows[("nmt-ct2", "float32", 2)]["setting"].startswith(
        "defaults (4096 source tokens per batch), ")
    env = ("shipped", "CT2_PACKED_GEMM=0", "CT2_USE_MKL=0")
    assert all(rows[("ct2", ct, b)]["setting"].startswith(env) for ct, b in
               [("float32", 1), ("int8", 2)])
    table = md.read_text(encoding="utf-8").splitlines()
    assert [x.split("|")[1].strip() for x in table if x.startswith("| 1 |") or
            x.startswith("| 2 |")] == ["1", "2"]
    assert p.stderr.count("CTranslate2 ") >= 6         # the tuning's choice per type and beam
