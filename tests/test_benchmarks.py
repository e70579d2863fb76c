"""The benchmark harness (benchmarks/run_all.py) works end to end in its quick mode.

No timing assertions: only that every section is written, holds positive numbers, and that
text outside the harness's markers survives.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.data.resources import quickstart_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fairseq_compare  # noqa: E402
import run_all  # noqa: E402


def section(text: str, name: str) -> str:
    m = re.search(rf"<!-- bench:{name} -->\n(.*?)\n<!-- /bench:{name} -->", text, re.S)
    assert m, f"section {name} missing"
    return m.group(1)


def table_rows(body: str) -> list[list[str]]:
    """Data rows of the markdown tables in a section (header and rule lines dropped)."""
    rows, lines = [], body.splitlines()
    for i, line in enumerate(lines):
        header = i + 1 < len(lines) and lines[i + 1].startswith("|---")
        if line.startswith("|") and not line.startswith("|---") and not header:
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def number(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%").split()[0])


@pytest.mark.slow        # a benchmark's quick mode, 5-12 s; CI runs it (.ci/run: -m slow)
def test_run_all_quick(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\nHand-written intro.\n\n<!-- bench:train -->\nold\n"
                   "<!-- /bench:train -->\n\n## Notes by hand\n\nkeep me\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"),
                           "--data", str(quickstart_dir()), "--quick", "--threads", "1",
                           "--out", str(out), "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text(encoding="utf-8")
    assert "Hand-written intro." in text and "keep me" in text and "\nold\n" not in text
    assert text.index("<!-- bench:train -->") < text.index("## Notes by hand")  # replaced in place

    for name in ("preprocess", "train", "generate", "memory", "fairseq"):
        body = section(text, name)
        assert "torch " in body and "threads" in body and re.search(r"\d{4}-\d\d-\d\d", body)

    pre = table_rows(section(text, "preprocess"))
    assert len(pre) == 1 and number(pre[0][1]) == 2000
    assert number(pre[0][3]) > 0 and number(pre[0][4]) > 10

    train = table_rows(section(text, "train"))
    assert len(train) == 1 and train[0][0].startswith("transformer_tiny")
    for col in (4, 5, 6, 7, 8, 9):                      # tokens/s .. peak RSS
        assert number(train[0][col]) > 0

    gen_body = section(text, "generate")
    gen = table_rows(gen_body)
    beams = [r for r in gen if r[0] in ("1", "4")]
    assert [r[0] for r in beams] == ["1", "4"]
    assert all(number(r[1]) > 0 and number(r[2]) >= 0 for r in beams)
    buckets = [r for r in gen if re.match(r"^(\d+-\d+|>=\d+)$", r[0])]
    assert buckets and all(number(r[1]) > 0 and number(r[2]) > 0 for r in buckets)

    mem = table_rows(section(text, "memory"))
    assert {r[0].split(",")[0] for r in mem} >= {"training transformer_tiny", "generation"}
    assert all(number(r[1]) > 0 for r in mem)

    fs = section(text, "fairseq")
    assert "not measured in this run" in fs
    b4 = [r for r in table_rows(fs) if r[0] == "generation beam 4, sentences/s"
          and r[3].startswith("fairseq")]
    assert b4 and b4[0][4] == "-"          # a figure from another run: no ratio


def test_replace_section_keeps_other_text():
    text = "intro\n<!-- bench:a -->\nx\n<!-- /bench:a -->\nmiddle\n"
    out = run_all.replace_section(text, "a", "new $1 \\1")     # no regex escapes in the body
    assert out == "intro\n<!-- bench:a -->\nnew $1 \\1\n<!-- /bench:a -->\nmiddle\n"
    out = run_all.replace_section(out, "b", "bee")
    assert out.endswith("middle\n\n<!-- bench:b -->\nbee\n<!-- /bench:b -->\n")
    assert out.startswith("intro\n<!-- bench:a -->\nnew")


def test_bad_arguments(tmp_path):
    script = str(ROOT / "benchmarks" / "run_all.py")
    for args in (["--data", str(quickstart_dir()), "--only", "train,bogus"],
                 ["--data", str(tmp_path)]):
        proc = subprocess.run([sys.executable, script, *args, "--out", str(tmp_path / "B.md")],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "error:" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "B.md").exists()


def test_cuda_path_skips_cleanly_without_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"),
                           "--data", str(quickstart_dir()), "--device", "cuda",
                           "--out", str(tmp_path / "B.md")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "skipped" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "B.md").exists()


def test_reference_figures_get_no_ratio_and_same_run_ones_do():
    small = {"tgt_tokens_per_s": 4072.0, "peak_rss_gb": 0.89}
    gen = {"beams": {"4": {"sentences_per_s": 33.2, "target_tokens_per_s": 500.0}},
           "peak_rss_mib": 347.0, "bleu": {"4": 19.43}}
    rows = fairseq_compare.comparison_rows({"status": "skipped", "reason": "x"}, small, gen)
    assert rows and all(r["ratio"] is None and r["nmt"] is not None for r in rows)
    assert all(fairseq_compare.REF_SOURCE in r["source"] for r in rows)
    measured = {"status": "measured", "version": "0.12.2",
                "train": {"tgt_tokens_per_s": 2036.0, "peak_rss_gb": 1.78},
                "generate": {"model_updates": 35, "target_tokens_per_s": 600.0,
                             "sentences_per_s": 3.0, "peak_rss_mb": 300.0}}
    rows = fairseq_compare.comparison_rows(measured, small, gen)
    here = [r for r in rows if r["source"].startswith("fairseq 0.12.2, measured")]
    ratios = {r["figure"]: r["ratio"] for r in here}
    assert ratios["training target tokens/s, transformer_small"] == 4072.0 / 2036.0
    assert ratios["generation beam 4, sentences/s"] is None       # another model: no ratio
    assert all(r["ratio"] is None for r in rows if r not in here)
    none = fairseq_compare.comparison_rows({"status": "skipped", "reason": "x"}, None, None)
    assert all(r["ratio"] is None and r["nmt_text"] is None for r in none)


def test_patch_setup_drops_extensions_with_missing_sources(tmp_path, monkeypatch):
    (tmp_path / "fairseq" / "clib").mkdir(parents=True)
    (tmp_path / "fairseq" / "clib" / "present.cpp").write_text("")
    (tmp_path / "setup.py").write_text(
        'import os\nextensions = [E("a", sources=["fairseq/clib/present.cpp"]),\n'
        '              E("b", sources=["fairseq/clib/missing.cpp"])]\n'
        'install_requires = ["torch", "torchaudio>=0.8.0", "tqdm"]\n'
        'def do_setup(x):\n    return extensions\n')
    missing = fairseq_compare.patch_setup(tmp_path)
    assert missing == ["fairseq/clib/missing.cpp"]
    monkeypatch.chdir(tmp_path)                            # pip builds in the source dir
    ns = {"E": lambda name, sources: type("Ext", (), {"name": name, "sources": sources})()}
    exec((tmp_path / "setup.py").read_text(), ns)
    assert [e.name for e in ns["do_setup"](None)] == ["a"]
    assert ns["install_requires"] == ["torch", "tqdm"]
    fairseq_compare.patch_setup(tmp_path)                  # idempotent
    assert (tmp_path / "setup.py").read_text().count("nmt-bench patch") == 1


def test_fairseq_setup_skips_with_one_line_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.setenv("PATH", str(tmp_path))
    res = fairseq_compare.compare(tmp_path / "fs", tmp_path / "bin", install_timeout=30)
    assert res["status"] == "skipped" and "no Python 3.8 or 3.10" in res["reason"]
    assert "\n" not in res["reason"]


def test_cuda_defaults_and_sections_without_a_gpu():
    """The --device cuda path's defaults and rendering, checked on a CPU (the run itself needs a
    GPU: tests/gpu/test_gpu_benchmarks.py)."""
    data = str(quickstart_dir())
    cpu = run_all.parse_args(["--data", data])
    assert cpu.only == list(run_all.STEPS) and cpu.precision == "fp32"
    a = run_all.parse_args(["--data", data, "--device", "cuda"])
    assert a.only == ["train", "generate"] and a.precision == "bf16"
    assert a.archs == ["transformer_base", "transformer_big"]
    assert (a.max_tokens, a.warm_updates, a.updates, a.beams) == (8192, 20, 30, [4])
    assert run_all.parse_args(["--data", data, "--device", "cuda", "--only", "train"]).only == [
        "train"]

    def row(arch, params, mfu):
        return {"arch": arch, "params": params, "precision": "bf16", "max_tokens": 8192,
                "updates": 30, "warm_updates": 20, "tgt_tokens_per_s": 123456.0,
                "updates_per_s": 15.1, "achieved_gflops": 300000.0,
                "matmul_peak_gflops": 700000.0, "mfu": mfu, "peak_rss_gb": 3.2,
                "gpu_max_gb": 20.5, "matmul_n": 8192}

    class FakeSuite:
        cuda = True
        results = {"train": [row("transformer_base", 61e6, 0.4286),
                             row("transformer_big", 210e6, 0.45)]}
        notes = {"generate": "no --checkpoint given (only --quick trains one)",
                 "fairseq": "the fairseq comparison is CPU only"}

    FakeSuite.a = run_all.parse_args(["--data", data, "--device", "cuda", "--only",
                                      "train,generate,fairseq"])
    machine = {"date": "2026-01-01 00:00", "cpu": "X", "cores": 16, "logical_cpus": 16,
               "memory_gb": 128.0, "torch": "2.13.0", "python": "3.11.7", "threads": 16,
               "gpu": "NVIDIA H100", "cuda": "12.8"}
    out = run_all.render_all(FakeSuite(), machine)
    assert set(out) == {"gpu-train", "gpu-generate", "gpu-memory", "gpu-fairseq"}
    assert "GPU NVIDIA H100 (CUDA 12.8)" in out["gpu-train"]
    rows = table_rows(out["gpu-train"])
    assert [r[0].split()[0] for r in rows] == ["transformer_base", "transformer_big"]
    assert [r[1] for r in rows] == ["bf16", "bf16"] and rows[0][8] == "42.9%"
    assert number(rows[1][4]) == 123456 and number(rows[1][7]) == 700000
    assert "bf16 rate of 8192x8192 torch.matmul timed with CUDA events" in out["gpu-train"]
    assert "GPU max allocated 20.50 GB" in out["gpu-memory"]
    assert "Not measured: the fairseq comparison is CPU only" in out["gpu-fairseq"]


@pytest.mark.slow        # a benchmark's quick mode, 5-12 s; CI runs it (.ci/run: -m slow)
def test_bench_versions_compares_trees_side_by_side(tmp_path, ckpt):
    """Two versions (here the same tree twice) decode the same input in turns; the output of
    each is compared with the first's, and a version that is not a tree nor a revision is a
    one-line error."""
    src = tmp_path / "in.txt"
    src.write_text("a b c\nd e\nf\n", encoding="utf-8")
    repo = str(Path(__file__).resolve().parent.parent)
    out = tmp_path / "r.json"
    cmd = [sys.executable, "benchmarks/bench_versions.py", str(ckpt), "--input", str(src),
           "--versions", f"{repo},{repo}", "--rounds", "2", "--threads", "1", "--beam", "2",
           "--work", str(tmp_path / "w"), "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=repo, timeout=300)
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())
    assert [len(r["walls"]) for r in rows] == [2, 2]
    assert all(r["identical_to_first"] for r in rows)
    assert "| version | median wall s | sentences/s | vs first |" in res.stdout
    bad = subprocess.run(cmd[:5] + ["--versions", "no-such-rev-xyz", "--work",
                                    str(tmp_path / "w")], capture_output=True, text=True,
                         cwd=repo, timeout=120)
    assert bad.returncode != 0 and "not a directory with an nmt package" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_bench_versions_train_mode_times_each_version_and_compares_weights(tmp_path):
    """--train runs bench_train.py with each version's nmt; the same tree twice trains the
    same weights bit for bit (the digest of the weights is compared, not assumed), and the
    same tree with other dropout masks (REV+ARGS) trains others."""
    from test_train_cli import run
    from train_support import write_reversal_corpus

    data = write_reversal_corpus(tmp_path, run, ())
    repo = str(ROOT)
    out = tmp_path / "r.json"
    cmd = [sys.executable, "benchmarks/bench_versions.py", "--train", data, "--arch",
           "transformer_tiny", "--warm-updates", "1", "--updates", "2", "--versions",
           f"{repo},{repo},{repo}+--dropout-masks=fast", "--rounds", "1", "--threads", "1",
           "--work", str(tmp_path / "w"), "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=repo, timeout=300)
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())
    assert [len(r["runs"]) for r in rows] == [1, 1, 1]
    assert [r["identical_to_first"] for r in rows] == [True, True, False]
    assert [r["runs"][0]["dropout_masks"] for r in rows] == ["torch", "torch", "fast"]
    assert all(r["tgt_tokens_per_s"] > 0 and 0 < r["mfu"] for r in rows)
    assert len(rows[0]["runs"][0]["weights_sha256"]) == 64
    assert "| version | target tokens/s (median) | vs first | achieved GFLOP/s (median) | MFU |" \
        in res.stdout
    bad = subprocess.run([sys.executable, "benchmarks/bench_versions.py", "--versions", repo],
                         capture_output=True, text=True, cwd=repo, timeout=60)
    assert bad.returncode == 2 and "--train DATA_DIR" in bad.stderr


def test_check_literature_tokenization_compares_token_by_token(tmp_path):
    raw, tok = tmp_path / "raw", tmp_path / "tok"
    raw.mkdir(), tok.mkdir()
    (raw / "test_2016_flickr.de").write_text('Ein Mann sagt "Hallo".\nZwei Hunde.\n',
                                              encoding="utf-8")
    # the release as the literature has it: lowercased, tokenized, quotes escaped; the
    # second line differs from what nmt makes of the raw one
    (tok / "test_2016_flickr.lc.norm.tok.de").write_text(
        "ein mann sagt &quot; hallo &quot; .\nzwei katzen .\n", encoding="utf-8")
    def check() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable,
                               str(ROOT / "benchmarks/check_literature_tokenization.py"),
                               str(raw), str(tok), "--split", "test_2016_flickr", "--lang", "de"],
                              capture_output=True, text=True, timeout=60)
    p = check()
    assert p.returncode == 0, p.stderr
    assert "| test_2016_flickr.de | 2 | 1 | 10 | 10 |" in p.stdout
    assert "nmt:      zwei hunde ." in p.stdout and "release:  zwei katzen ." in p.stdout
    (tok / "test_2016_flickr.lc.norm.tok.de").write_text("zwei hunde .\n", encoding="utf-8")
    p = check()
    assert p.returncode == 1 and "has 2 lines" in p.stderr and "Traceback" not in p.stderr
