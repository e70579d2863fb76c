"""benchmarks/bench_import_speed.py in its quick mode: the harness runs all the
engines (nmt, transformers, CTranslate2 and nmt --engine ctranslate2), every sentence gets the fixed output length from each, and nmt, transformers and
CTranslate2 give the same output in fp32 greedy decoding on the same weights, which is what
makes their speeds comparable. No timing assertions."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.runtime import cpu_has_native_bf16

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_quick_run_compares_like_with_like(tmp_path):
    out, md = tmp_path / "speed.json", tmp_path / "speed.md"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_import_speed.py"),
                        "--quick", "--threads", "1", "--keep-outputs", "--json", str(out),
                        "--markdown", str(md)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    s = report["settings"]
    rows = {(r["engine"], r["precision"], r["beam"]): r for r in report["rows"]}
    engines = ("nmt", "hf", "ct2", "ct2-nopack", "ct2-nomkl",     # CTranslate2 in 3 settings
               "nmt-ct2", "nmt-ct2-nopack", "nmt-ct2-nomkl")    # and nmt's engine over it
    bf16 = {("nmt", "bf16", b) for b in (1, 4)} if cpu_has_native_bf16() else set()
    assert set(rows) == {(e, q, b) for e in engines for q in ("fp32", "int8")
                         for b in (1, 4)} | bf16
    for r in rows.values():
        assert len(r["outputs"]) == s["sentences"]
        assert all(len(o) == s["length"] for o in r["outputs"]), r["engine"]
        assert r["target_tokens"] == s["sentences"] * s["length"]
        assert r["tokens_per_s"] > 0 and r["sentences_per_s"] > 0
    greedy = [rows[(e, "fp32", 1)]["outputs"] for e in engines]
    assert all(g == greedy[0] for g in greedy)
    assert len({tuple(o) for o in greedy[0]}) > 1          # not one output for every input
    assert rows[("ct2", "fp32", 1)]["same_as_nmt_fp32"] == 1.0
    assert len(report["loadavg_before"]) == len(report["loadavg_after"]) == 3
    lines = md.read_text(encoding="utf-8").splitlines()
    body = [x for x in lines if x.startswith("| ") and not x.startswith("| engine")]
    assert len(body) == 32 + len(bf16) and "| CTranslate2 | int8 | 4 |" in "\n".join(body)
    # nmt's rows name CTranslate2's fastest setting at the same precision
    nmt_int8 = next(x for x in body if x.startswith("| nmt | int8 | 4 |"))
    assert "x (int8, CTranslate2" in nmt_int8
    # the engine's rows, CTranslate2 in the same environment
    engine = next(x for x in body
                  if x.startswith("| nmt --engine ctranslate2 (CT2_USE_MKL=0) | fp32 | 4 |"))
    assert "x (fp32, CTranslate2 (CT2_USE_MKL=0))" in engine
