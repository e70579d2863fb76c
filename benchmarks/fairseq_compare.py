#!/usr/bin/env python3
"""fairseq 0.12.2 side by side with nmt, in its own virtual environment, or recorded reference figures.

    python benchmarks/fairseq_compare.py --work /tmp/fs --bin DATA_BIN            # JSON on stdout
    python benchmarks/fairseq_compare.py --work /tmp/fs --setup-only

fairseq 0.12.2 is never a dependency of nmt. Its last binary wheels are for Python 3.8, so with
a Python 3.8 (pyenv) the venv gets that wheel and torch 2.4.1, the last torch release for 3.8
(nothing is compiled). Without one it needs Python 3.10 and torch 2.5, and is built from its
source package, which lacks a C++ source of one extension (the extensions whose sources are
missing are dropped from setup.py, and it is built with --no-build-isolation against the venv's
torch and Cython). Either way omegaconf 2.0 has metadata that pip >= 24.1 rejects (pip is
pinned below that), and the BetterTransformer fast path of its encoder fails with current torch
at generation (it is switched off in the installed copy). Any failure (no Python 3.8 or 3.10,
no network, only CUDA builds of torch reachable, a build error, a time limit) skips with a
one-line reason, and the harness compares with REFERENCE, figures recorded once on a 2-core AMD EPYC.

The measured run uses the nmt binarized data (DATA_BIN from nmt-preprocess): its subword ids
are written back as symbols, binarized by fairseq-preprocess with nmt's own dictionary, and
fairseq-train runs the same architecture (post-norm Transformer, shared embeddings, Adam,
inverse-sqrt schedule, label smoothing 0.1, same --max-tokens), timed from its per-update log
after the warm-up updates. fairseq-generate then decodes the test split with beam 4 using the
checkpoint of that short run: its output lengths differ from a trained model's, so compare its
tokens/s rather than its sentences/s.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FAIRSEQ_VERSION = "0.12.2"
TORCH_VERSION = "2.5.1"          # built from source on Python 3.10
WHEEL_TORCH_VERSION = "2.4.1"    # the binary wheel on Python 3.8: the last torch for 3.8
REF_SOURCE = "recorded reference figures, a 2-core AMD EPYC, not measured in this run"
# The M30K-small runs (transformer_small size, Multi30k en-de, 2 threads, max tokens 4096).
REFERENCE = {
    "fairseq": {"train_tgt_tokens_per_s": 2036.0, "train_updates": 1000, "train_seconds": 1739.0,
                "train_peak_rss_gb": 1.78, "gen_beam4_sentences_per_s": 66.4,
                "gen_peak_rss_mb": 694.0, "bleu": 19.43},
    "joeynmt": {"version": "2.3.0", "train_tgt_tokens_per_s": 732.0,
                "gen_sentences_per_s": 6.65, "bleu": 9.87},
    "ctranslate2": {"version": "4.8.5", "fp32_sentences_per_s": 123.0, "fp32_model_mb": 164.0,
                    "int8_sentences_per_s": 146.0},
}


class Skip(Exception):
    """fairseq cannot run here; the message is the one-line reason."""


def log(msg: str) -> None:
    print(f"fairseq_compare: {msg}", file=sys.stderr, flush=True)


# --- installation -------------------------------------------------------------------------------
def find_python(minor: str) -> Path | None:
    """A python``minor`` (e.g. "3.8") from pyenv's versions or PATH, or None."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for cand in sorted(glob.glob(str(root / f"{minor}.*" / "bin" / f"python{minor}")),
                       reverse=True):
        return Path(cand)
    found = shutil.which(f"python{minor}")
    return Path(found) if found else None


def _run(cmd: list, deadline: float, what: str, cwd: Path | None = None,
         env: dict | None = None) -> str:
    left = deadline - time.monotonic()
    if left <= 0:
        raise Skip(f"install time limit reached before {what}")
    try:
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=left,
                           cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        raise Skip(f"install time limit reached during {what}") from None
    if p.returncode != 0:
        lines = [x for x in (p.stderr + p.stdout).strip().splitlines()
                 if x.strip() and not x.startswith("WARNING")]
        errs = [x for x in lines if "error" in x.lower()]
        raise Skip(f"{what} failed: {(errs or lines or ['?'])[-1].strip()[:200]}")
    return p.stdout


def patch_setup(src: Path) -> list[str]:
    """Drop extensions whose sources the sdist lacks, and the speech-only torchaudio requirement.

    Returns the sources found missing. The patch filters the ``extensions`` list just before
    ``setup()`` is called, so it works whatever the list holds.
    """
    setup = src / "setup.py"
    text = setup.read_text(encoding="utf-8")
    missing = sorted({m for m in re.findall(r'"((?:fairseq|examples)/[^"]+\.(?:cpp|cu|pyx))"', text)
                      if not (src / m).exists()})
    marker = "def do_setup("
    if "nmt-bench patch" not in text and marker in text:
        filt = ("# nmt-bench patch: skip extensions whose sources are missing from the sdist\n"
                "extensions = [e for e in extensions if all(os.path.exists(s) for s in e.sources)]"
                "\n\n\n")
        text = text.replace(marker, filt + marker, 1)
        text = re.sub(r'\s*"torchaudio[^"]*",', "", text)
        setup.write_text(text, encoding="utf-8")
    return missing


def disable_fast_path(venv_py: Path, deadline: float) -> int:
    """Switch off the BetterTransformer encoder path (BT_version) in the installed fairseq."""
    out = _run([venv_py, "-c", "import fairseq, os; print(os.path.dirname(fairseq.__file__))"],
               deadline, "locating fairseq")
    pkg = Path(out.strip().splitlines()[-1])
    n = 0
    for rel in ("modules/transformer_layer.py", "models/transformer/transformer_encoder.py"):
        f = pkg / rel
        if f.exists():
            text = f.read_text(encoding="utf-8")
            new, k = re.subn(r"\bBT_version = True\b", "BT_version = False", text)
            if k:
                f.write_text(new, encoding="utf-8")
                n += k
    return n


def refuse_cuda_torch(pip: list, work: Path, torch_version: str, index: list[str],
                      deadline: float, allow_cuda_torch: bool, index_option: str) -> None:
    """Resolve torch==``torch_version`` with pip --dry-run; Skip when that would install a CUDA
    build (nvidia-* wheels, several GB) and ``allow_cuda_torch`` is not given."""
    report = work / "torch-plan.json"
    _run(pip + ["install", "--dry-run", "--ignore-installed", "-q", "--report", report,
                f"torch=={torch_version}", *index], deadline, f"resolving torch {torch_version}")
    plan = json.loads(report.read_text())["install"]
    cuda = sorted(p["metadata"]["name"] for p in plan
                  if p["metadata"]["name"].lower().startswith("nvidia-"))
    if cuda and not allow_cuda_torch:
        raise Skip(f"only a CUDA build of torch {torch_version} is reachable (it pulls "
                   f"{len(cuda)} nvidia-* packages, several GB: {', '.join(cuda[:3])}, ...); "
                   f"give {index_option} URL of a CPU build, or --allow-cuda-torch")


def install_only(setup) -> dict:
    """--setup-only: run ``setup`` (which returns the venv's python) and say how it went."""
    try:
        return {"status": "installed", "python": str(setup())}
    except Skip as e:
        log(f"skipped: {e}")
        return {"status": "skipped", "reason": str(e)}


def setup_venv(work: Path, timeout: float, allow_cuda_torch: bool = False,
               torch_index: str | None = None) -> Path:
    """A venv with fairseq 0.12.2 under ``work`` (the Python 3.8 wheel, or a build from source
    on Python 3.10); returns its python."""
    deadline = time.monotonic() + timeout
    venv = work / "venv"
    py = venv / "bin" / "python"
    ok_file = venv / ".nmt-bench-ok"
    if ok_file.exists() and py.exists():
        return py
    base = find_python("3.8") or find_python("3.10")
    if base is None:
        raise Skip("no Python 3.8 or 3.10 (looked in ~/.pyenv/versions and PATH)")
    wheel = base.name == "python3.8"
    torch_version = WHEEL_TORCH_VERSION if wheel else TORCH_VERSION
    work.mkdir(parents=True, exist_ok=True)
    log(f"creating {venv} with {base}")
    _run([base, "-m", "venv", "--clear", venv], deadline, f"{base.name} -m venv")
    pip = [py, "-m", "pip", "--disable-pip-version-check"]
    # omegaconf 2.0.x (fairseq's hydra-core 1.0) has metadata that pip >= 24.1 refuses.
    _run(pip + ["install", "-q", "pip<24.1"], deadline, "pip install pip<24.1")
    index = ["--index-url", torch_index] if torch_index else []
    refuse_cuda_torch(pip, work, torch_version, index, deadline, allow_cuda_torch,
                      "--fairseq-torch-index")
    log(f"installing torch {torch_version}")
    _run(pip + ["install", "-q", f"torch=={torch_version}", *index], deadline,
         f"pip install torch=={torch_version}")
    if wheel:
        # The wheel asks for torchaudio too; numpy < 1.24 keeps the np.float fairseq uses.
        log(f"installing fairseq {FAIRSEQ_VERSION} (binary wheel)")
        _run(pip + ["install", "-q", "--only-binary", "fairseq", f"fairseq=={FAIRSEQ_VERSION}",
                    f"torch=={torch_version}", f"torchaudio=={torch_version}", "numpy<1.24",
                    *index], deadline, f"pip install fairseq=={FAIRSEQ_VERSION}")
    else:
        _build_from_source(pip, work, deadline)
    n = disable_fast_path(py, deadline)
    log(f"encoder fast path disabled ({n} switch{'es' if n != 1 else ''})")
    _run([py, "-c", "import fairseq, torch; from fairseq.models.transformer import "
                    "TransformerModel"], deadline, "import fairseq")
    ok_file.write_text("ok\n")
    return py


def _build_from_source(pip: list, work: Path, deadline: float) -> None:
    """fairseq 0.12.2 from its source package, against the venv's torch (Python 3.10)."""
    _run(pip + ["install", "-q", "numpy<2", "cython<3.1", "setuptools<70", "wheel"], deadline,
         "pip install build requirements")
    sdist_dir = work / "sdist"
    sdist_dir.mkdir(exist_ok=True)
    _run(pip + ["download", "-q", "--no-deps", "--no-binary", ":all:", "-d", sdist_dir,
                f"fairseq=={FAIRSEQ_VERSION}"], deadline, "pip download fairseq")
    archives = sorted(sdist_dir.glob(f"fairseq-{FAIRSEQ_VERSION}.tar.gz"))
    if not archives:
        raise Skip(f"no fairseq-{FAIRSEQ_VERSION}.tar.gz after pip download")
    with tarfile.open(archives[0]) as tar:
        tar.extractall(sdist_dir, filter="data") if sys.version_info >= (3, 12) \
            else tar.extractall(sdist_dir)
    src = sdist_dir / f"fairseq-{FAIRSEQ_VERSION}"
    missing = patch_setup(src)
    if missing:
        log(f"sdist lacks {', '.join(missing)}: building without those extensions")
    log("building fairseq (--no-build-isolation)")
    _run(pip + ["install", "-q", "--no-build-isolation", src], deadline,
         f"pip install fairseq {FAIRSEQ_VERSION}")


# --- measuring ------------------------------------------------------------------------------
def export_text(bin_dir: Path, out: Path) -> tuple[str, str, list[str]]:
    """nmt's binarized splits as subword symbols, one sentence a line (fairseq's input)."""
    from nmt.data.datadir import DataDir

    dd = DataDir.open(str(bin_dir))
    out.mkdir(parents=True, exist_ok=True)
    splits = [s for s in ("train", "valid", "test") if s in dd.splits]
    for split in splits:
        ds = dd.load_split(split)
        for lang, codec, get in ((dd.src_lang, dd.src_codec, ds.src),
                                 (dd.tgt_lang, dd.tgt_codec, ds.tgt)):
            sym = codec.dictionary.symbols
            with open(out / f"{split}.{lang}", "w", encoding="utf-8") as f:
                for i in range(len(ds)):
                    f.write(" ".join(sym[int(t)] for t in get(i)) + "\n")
    return dd.src_lang, dd.tgt_lang, splits


def _timed(cmd: list, env: dict, timeout: float, logf: Path) -> tuple[str, float]:
    """Run a command, return (its output, peak RSS in MiB of its process tree)."""
    import psutil

    from bench_preprocess import TreeRss

    with open(logf, "w", encoding="utf-8") as f:
        proc = psutil.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env)
        with TreeRss(proc.pid) as rss:
            try:
                code = proc.wait(timeout)
            except psutil.TimeoutExpired:
                proc.kill()
                raise Skip(f"{Path(str(cmd[0])).name} ran past {timeout:.0f}s") from None
    text = logf.read_text(encoding="utf-8", errors="replace")
    if code != 0:
        tail = [x for x in text.strip().splitlines() if x.strip()][-1:] or ["?"]
        raise Skip(f"{Path(str(cmd[0])).name} failed ({code}): {tail[0][:200]}")
    return text, rss.peak / 2 ** 20


def measure(py: Path, bin_dir: Path, work: Path, arch: str, threads: int, warm_updates: int,
            updates: int, max_tokens: int, timeout: float = 3600) -> dict:
    import nmt

    cfg = nmt.get_arch(arch)
    bindir = py.parent
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "CUDA_VISIBLE_DEVICES": ""}
    text = work / "text"
    src, tgt, splits = export_text(bin_dir, text)
    if "test" not in splits:
        raise Skip(f"{bin_dir}: no test split to decode")
    fbin = work / "fairseq-bin"
    shutil.rmtree(fbin, ignore_errors=True)
    cmd = [bindir / "fairseq-preprocess", "--source-lang", src, "--target-lang", tgt,
           "--destdir", fbin, "--joined-dictionary", "--srcdict", bin_dir / f"dict.{src}.txt",
           "--workers", str(threads)]
    for split in splits:
        cmd += [f"--{split}pref", text / split]
    _timed(cmd, env, timeout, work / "fairseq-preprocess.log")

    ckpt = work / "checkpoints"
    shutil.rmtree(ckpt, ignore_errors=True)
    total = warm_updates + updates
    layer = ["--encoder-layers", cfg.encoder_layers, "--decoder-layers", cfg.decoder_layers,
             "--encoder-embed-dim", cfg.d_model, "--decoder-embed-dim", cfg.d_model,
             "--encoder-ffn-embed-dim", cfg.d_ff, "--decoder-ffn-embed-dim", cfg.d_ff,
             "--encoder-attention-heads", cfg.heads, "--decoder-attention-heads", cfg.heads]
    cmd = [bindir / "fairseq-train", fbin, "--arch", "transformer", *layer,
           "--share-all-embeddings", "--dropout", cfg.dropout, "--optimizer", "adam",
           "--adam-betas", "(0.9, 0.98)", "--lr", "7e-4", "--lr-scheduler", "inverse_sqrt",
           "--warmup-updates", "4000", "--criterion", "label_smoothed_cross_entropy",
           "--label-smoothing", cfg.label_smoothing, "--max-tokens", max_tokens,
           "--max-update", total, "--log-format", "json", "--log-interval", "1", "--cpu",
           "--num-workers", "0", "--seed", "1", "--disable-validation", "--save-dir", ckpt,
           "--no-epoch-checkpoints"]
    out, train_rss = _timed(cmd, env, timeout, work / "fairseq-train.log")
    recs = [json.loads(m) for m in re.findall(r"\| train_inner \| (\{.*\})", out)]
    timed = [r for r in recs if int(float(r.get("num_updates", 0))) > warm_updates]
    if not timed:
        raise Skip("fairseq-train logged no timed updates (see fairseq-train.log)")
    ntok = sum(float(r["wpb"]) for r in timed)
    secs = sum(float(r["wpb"]) / float(r["wps"]) for r in timed)

    cmd = [bindir / "fairseq-generate", fbin, "--path", ckpt / "checkpoint_last.pt",
           "--gen-subset", "test", "--beam", "4", "--batch-size", "128", "--cpu", "--quiet"]
    out, gen_rss = _timed(cmd, env, timeout, work / "fairseq-generate.log")
    m = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s "
                  r"\(([\d.]+) sentences/s, ([\d.]+) tokens/s\)", out)
    if not m:
        raise Skip("fairseq-generate printed no 'Translated ...' summary")
    version = _run([py, "-c", "import fairseq, torch; print(fairseq.__version__, torch.__version__)"],
                   time.monotonic() + 120, "fairseq version").split()
    return {"status": "measured", "version": version[0], "torch": version[1], "arch": arch,
            "train": {"updates": len(timed), "warm_updates": warm_updates,
                      "tgt_tokens_per_s": ntok / secs, "updates_per_s": len(timed) / secs,
                      "peak_rss_gb": train_rss / 1024},
            "generate": {"beam": 4, "sentences": int(m.group(1).replace(",", "")),
                         "sentences_per_s": float(m.group(4)),
                         "target_tokens_per_s": float(m.group(5)),
                         "peak_rss_mb": gen_rss, "model_updates": total}}


def compare(work: Path, bin_dir: Path, arch: str = "transformer_small", threads: int = 2,
            warm_updates: int = 5, updates: int = 30, max_tokens: int = 4096,
            install_timeout: float = 900, allow_cuda_torch: bool = False,
            torch_index: str | None = None) -> dict:
    """Measured fairseq figures, or {"status": "skipped", "reason": one line}."""
    try:
        py = setup_venv(Path(work), install_timeout, allow_cuda_torch, torch_index)
        return measure(py, Path(bin_dir), Path(work), arch, threads, warm_updates, updates,
                       max_tokens)
    except Skip as e:
        log(f"skipped: {e}")
        return {"status": "skipped", "reason": str(e)}
    except (OSError, ValueError, KeyError) as e:    # a broken venv or an unexpected log format
        reason = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        log(f"skipped: {reason}")
        return {"status": "skipped", "reason": reason}


# --- the comparison table -----------------------------------------------------------------------
def comparison_rows(fs: dict, small: dict | None, gen: dict | None) -> list[dict]:
    """Rows of (figure, nmt value, other value, source, ratio nmt/other). A ratio only where
    both were measured in this run on the same model (training: the same data and
    architecture); the other figures are references, printed without one."""
    rows: list[dict] = []

    def add(figure, ours, other, source, fmt="{:,.1f}", unit="", same_run=False):
        rows.append({"figure": figure, "nmt": ours, "other": other, "source": source,
                     "nmt_text": None if ours is None else fmt.format(ours) + unit,
                     "other_text": fmt.format(other) + unit,
                     "ratio": ours / other if same_run and ours is not None and other
                     else None})

    tok = small["tgt_tokens_per_s"] if small else None
    rss = small["peak_rss_gb"] if small else None
    b4 = (gen or {}).get("beams", {}).get("4")
    sent4 = b4["sentences_per_s"] if b4 else None
    tps4 = b4["target_tokens_per_s"] if b4 else None
    grss = gen["peak_rss_mib"] if gen else None
    bleu4 = (gen or {}).get("bleu", {}).get("4")
    ref, joey, ct2 = REFERENCE["fairseq"], REFERENCE["joeynmt"], REFERENCE["ctranslate2"]

    if fs.get("status") == "measured":
        here = f"fairseq {fs['version']}, measured in this run"
        add("training target tokens/s, transformer_small", tok,
            fs["train"]["tgt_tokens_per_s"], here, same_run=True)
        add("training peak RSS (GB)", rss, fs["train"]["peak_rss_gb"], here, "{:.2f}",
            same_run=True)
        g = fs["generate"]
        note = f"{here} (model after {g['model_updates']} updates)"
        add("generation beam 4, target tokens/s", tps4, g["target_tokens_per_s"], note)
        add("generation beam 4, sentences/s", sent4, g["sentences_per_s"], note)
        add("generation peak RSS (MiB)", grss, g["peak_rss_mb"], here, "{:,.0f}")
    add("training target tokens/s, transformer_small", tok, ref["train_tgt_tokens_per_s"],
        f"fairseq 0.12.2: {REF_SOURCE}", "{:,.0f}")
    add("training target tokens/s, transformer_small", tok, joey["train_tgt_tokens_per_s"],
        f"JoeyNMT {joey['version']}: {REF_SOURCE}", "{:,.0f}")
    add("training peak RSS (GB)", rss, ref["train_peak_rss_gb"],
        f"fairseq 0.12.2: {REF_SOURCE}", "{:.2f}")
    add("generation beam 4, sentences/s", sent4, ref["gen_beam4_sentences_per_s"],
        f"fairseq 0.12.2: {REF_SOURCE}")
    add("generation, sentences/s", sent4, joey["gen_sentences_per_s"],
        f"JoeyNMT {joey['version']} (no KV cache): {REF_SOURCE}", "{:,.2f}")
    add("generation beam 4, sentences/s", sent4, ct2["fp32_sentences_per_s"],
        f"CTranslate2 {ct2['version']} float32 on the fairseq model: {REF_SOURCE}")
    add("generation beam 4, sentences/s", sent4, ct2["int8_sentences_per_s"],
        f"CTranslate2 {ct2['version']} int8: {REF_SOURCE}")
    add("generation peak RSS (MiB)", grss, ref["gen_peak_rss_mb"],
        f"fairseq 0.12.2: {REF_SOURCE}", "{:,.0f}")
    add("sacreBLEU, test_2016_flickr, beam 4", bleu4, ref["bleu"],
        f"fairseq 0.12.2 (its M30K-small model): {REF_SOURCE}", "{:.2f}")
    add("sacreBLEU, test_2016_flickr", bleu4, joey["bleu"],
        f"JoeyNMT {joey['version']}: {REF_SOURCE}", "{:.2f}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="venv and files go here")
    ap.add_argument("--bin", type=Path, help="nmt-preprocess output to train and decode on")
    ap.add_argument("--arch", default="transformer_small", help="nmt architecture to mirror")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warm-updates", type=int, default=5)
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--install-timeout", type=float, default=900)
    ap.add_argument("--allow-cuda-torch", action="store_true",
                    help="download torch (2.4.1 on Python 3.8, 2.5.1 on 3.10) even if only its "
                         "CUDA build (several GB) is reachable")
    ap.add_argument("--torch-index", help="pip index URL with a CPU build of that torch")
    ap.add_argument("--setup-only", action="store_true", help="install, do not measure")
    a = ap.parse_args(argv)
    if a.setup_only:
        res = install_only(lambda: setup_venv(a.work, a.install_timeout, a.allow_cuda_torch,
                                              a.torch_index))
    else:
        if a.bin is None:
            ap.error("--bin is required unless --setup-only")
        res = compare(a.work, a.bin, a.arch, a.threads, a.warm_updates, a.updates,
                      a.max_tokens, a.install_timeout, a.allow_cuda_torch, a.torch_index)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
