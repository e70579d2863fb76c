#!/usr/bin/env python3
"""Run the whole benchmark suite and write its sections of BENCHMARKS.md.

    python benchmarks/run_all.py --data MULTI30K --checkpoint CKPT
    python benchmarks/run_all.py --data DIR --quick --out /tmp/B.md     # < 1 minute, for tests
    python benchmarks/run_all.py --data DIR --only train,generate --device cuda --checkpoint CKPT

DATA holds raw parallel text: train.SRC/TGT, val.* (or valid.*) and test_2016_flickr.* (or
test.*). Each step runs the per-topic script in its own process (so that peak RSS is that
step's alone) and reads back its JSON:

  preprocess  bench_preprocess.py: lines/s and peak RSS of nmt-preprocess at 1x, 10x, 50x train;
  train       DATA binarized once by nmt-preprocess (joined BPE), then bench_train.py per model:
              target tokens/s, updates/s, MFU over --updates timed after --warm-updates;
  generate    bench_generate.py on the test set with --checkpoint, beams 1 and 4, time per
              sentence by source length, sacreBLEU when the reference is there;
  fairseq     fairseq_compare.py: fairseq 0.12.2 in its own venv when it can be installed,
              otherwise reference figures from other runs; a ratio nmt/other only for
              figures measured in this run on the same model.

Only the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` is replaced (sections
missing from the file are appended); everything else in --out is kept. ``--device cuda`` runs
the GPU variant (by default the train and generate steps: transformer_base and transformer_big
in bf16 with MFU over the bf16 rate of 8192x8192 matmuls measured on the same GPU, beam-4
generation) into the ``gpu-train``, ``gpu-generate`` and ``gpu-memory`` sections of the same
file (every section of a CUDA run is named ``gpu-STEP``: the CPU sections are left alone), and
skips it with one line when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fairseq_compare  # noqa: E402  (a sibling script)

STEPS = ("preprocess", "train", "generate", "fairseq")
VALID_NAMES = ("val", "valid", "dev")
TEST_NAMES = ("test_2016_flickr", "test")


class BenchError(Exception):
    """A step failed; the message is one line."""


# --- the machine --------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(threads: int, device: str) -> dict:
    import psutil
    import torch

    info = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "cpu": cpu_model(), "cores": psutil.cpu_count(logical=False) or os.cpu_count(),
            "logical_cpus": os.cpu_count(), "threads": threads, "torch": torch.__version__,
            "python": platform.python_version(),
            "memory_gb": round(psutil.virtual_memory().total / 2 ** 30, 1), "gpu": None}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    return info


def machine_line(m: dict) -> str:
    gpu = f", GPU {m['gpu']} (CUDA {m.get('cuda')})" if m.get("gpu") else ""
    return (f"Measured {m['date']} on {m['cpu']} ({m['cores']} cores, {m['logical_cpus']} logical "
            f"CPUs, {m['memory_gb']} GB){gpu}; torch {m['torch']}, Python {m['python']}, "
            f"{m['threads']} threads.")


# --- BENCHMARKS.md sections ---------------------------------------------------------------------
def replace_section(text: str, name: str, body: str) -> str:
    """Put ``body`` between this section's markers, appending the section if it is missing."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    sep = "" if not text or text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n"
    return f"{text}{sep}{block}\n"


def write_sections(path: Path, sections: dict[str, str]) -> None:
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n\n"
    for name, body in sections.items():
        text = replace_section(text, name, body)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


# --- running the per-topic scripts --------------------------------------------------------------
def run_script(cmd: list[str], log: Path, timeout: float, threads: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    with open(log, "w", encoding="utf-8") as f:
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                  timeout=timeout, cwd=HERE.parent)
        except subprocess.TimeoutExpired:
            raise BenchError(f"{Path(cmd[1]).name} ran past {timeout:.0f}s (log: {log})") from None
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
        raise BenchError(f"{Path(cmd[1]).name} failed ({proc.returncode}): "
                         f"{tail[0] if tail else ''} (log: {log})")


def find_text(data: Path, names: tuple[str, ...], lang: str) -> Path | None:
    for name in names:
        if (data / f"{name}.{lang}").is_file():
            return data / f"{name}.{lang}"
    return None


class Suite:
    def __init__(self, args):
        self.a = args
        self.py = sys.executable
        self.work = args.work
        self.cuda = args.device.startswith("cuda")
        self.results: dict = {}
        self.notes: dict[str, str] = {}          # step -> one-line reason it was skipped

    # -- data ---------------------------------------------------------------------------------
    def binarized(self) -> Path:
        """DATA binarized by nmt-preprocess once per suite run (joined BPE vocabulary)."""
        dest = self.work / "bin"
        if (dest / "meta.json").exists():
            return dest
        a = self.a
        cmd = [self.py, "-m", "nmt.cli.preprocess", "-s", a.src, "-t", a.tgt,
               "--trainpref", str(a.data / "train"), "--destdir", str(dest), "--overwrite",
               "--joined-dictionary", "--subword", "bpe", "--vocab-size", str(a.vocab_size),
               "--workers", str(a.threads), "-q"]
        valid = find_text(a.data, VALID_NAMES, a.src)
        test = find_text(a.data, TEST_NAMES, a.src)
        if valid is not None:
            cmd += ["--validpref", str(valid.with_suffix(""))]
        if test is not None:
            cmd += ["--testpref", str(test.with_suffix(""))]
        run_script(cmd, self.work / "binarize.log", a.timeout, a.threads)
        return dest

    # -- steps --------------------------------------------------------------------------------
    def preprocess(self) -> None:
        a = self.a
        out = self.work / "preprocess.json"
        cmd = [self.py, str(HERE / "bench_preprocess.py"), str(a.data), "--src", a.src,
               "--tgt", a.tgt, "--vocab-size", str(a.vocab_size), "--json", str(out),
               "--workers", str(a.threads)]
        if a.quick:
            cmd.append("--quick")
        run_script(cmd, self.work / "preprocess.log", a.timeout, a.threads)
        self.results["preprocess"] = json.loads(out.read_text())

    def train(self) -> None:
        a = self.a
        data = self.binarized()
        rows = []
        for arch in a.archs:
            out = self.work / f"train_{arch}.json"
            cmd = [self.py, str(HERE / "bench_train.py"), str(data), "--arch", arch,
                   "--max-tokens", str(a.max_tokens), "--warm-updates", str(a.warm_updates),
                   "--updates", str(a.updates), "--threads", str(a.threads),
                   "--device", a.device, "--precision", a.precision, "--json", str(out)]
            if a.quick:
                cmd.append("--quick")       # a short matmul-rate measurement
                if arch == "transformer_tiny" and not a.checkpoint:
                    cmd += ["--save-dir", str(self.work / "quick_ckpt")]  # reused by generate
            run_script(cmd, self.work / f"train_{arch}.log", a.timeout, a.threads)
            rows.append(json.loads(out.read_text()))
        self.results["train"] = rows

    def checkpoint(self) -> Path | None:
        if self.a.checkpoint:
            return self.a.checkpoint
        if not self.a.quick:
            return None
        # --quick only: a tiny model trained from scratch on DATA, enough to exercise search.
        save = self.work / "quick_ckpt"
        if not (save / "checkpoint_last.pt").exists():
            cmd = [self.py, str(HERE / "bench_train.py"), str(self.binarized()), "--quick",
                   "--arch", "transformer_tiny", "--max-tokens", "1024", "--warm-updates", "1",
                   "--updates", "10", "--warmup", "10", "--threads", str(self.a.threads),
                   "--save-dir", str(save), "--json", str(self.work / "quick_ckpt.json")]
            run_script(cmd, self.work / "quick_ckpt.log", self.a.timeout, self.a.threads)
        return save / "checkpoint_last.pt"

    def generate(self) -> None:
        a = self.a
        ckpt = self.checkpoint()
        if ckpt is None:
            self.notes["generate"] = "no --checkpoint given (only --quick trains one)"
            return
        src = find_text(a.data, TEST_NAMES, a.src)
        if src is None:
            raise BenchError(f"{a.data}: no {'/'.join(TEST_NAMES)}.{a.src} to translate")
        out = self.work / "generate.json"
        hyp = self.work / "hyp"
        cmd = [self.py, str(HERE / "bench_generate.py"), str(ckpt), "--input", str(src),
               "--beams", ",".join(map(str, a.beams)), "--threads", str(a.threads),
               "--device", a.device, "--json", str(out), "--hyp-prefix", str(hyp)]
        if self.cuda:
            cmd += ["--precision", a.precision]
        if a.quick:
            cmd += ["--limit", "24"]
        run_script(cmd, self.work / "generate.log", a.timeout, a.threads)
        rep = json.loads(out.read_text())
        rep["checkpoint"] = str(ckpt)
        rep["input"] = str(src)
        ref = src.with_suffix(f".{a.tgt}")
        if ref.is_file() and not a.quick:
            rep["bleu"] = {b: sacrebleu_of(Path(f"{hyp}.beam{b}.txt"), ref, rep["sentences"])
                           for b in rep["beams"]}
        self.results["generate"] = rep

    def fairseq(self) -> None:
        a = self.a
        if self.cuda:
            # Its ratios are against the CPU reference figures: leave the CPU section alone.
            self.notes["fairseq"] = "the fairseq comparison is CPU only"
            return
        if a.fairseq == "reference":
            self.results["fairseq"] = {"status": "skipped", "reason": "--fairseq reference"}
            return
        self.results["fairseq"] = fairseq_compare.compare(
            work=self.work / "fairseq", bin_dir=self.binarized(), arch="transformer_small",
            threads=a.threads, warm_updates=a.warm_updates, updates=a.updates,
            max_tokens=a.max_tokens, install_timeout=a.fairseq_timeout,
            allow_cuda_torch=a.allow_cuda_torch, torch_index=a.fairseq_torch_index)


def sacrebleu_of(hyp: Path, ref: Path, n: int) -> float:
    import sacrebleu

    hyps = hyp.read_text(encoding="utf-8").splitlines()
    refs = ref.read_text(encoding="utf-8").splitlines()[:n]
    return round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)


# --- rendering ------------------------------------------------------------------------------
def command_line() -> str:
    # Absolute paths name a build machine's folders: show them relative to the working directory.
    args = [os.path.relpath(a) if os.path.isabs(a) and os.path.exists(a) else a
            for a in sys.argv[1:]]
    return "python benchmarks/run_all.py " + " ".join(args)


def render_preprocess(r: dict, head: str) -> str:
    lines = [head, "",
             "| corpus | pairs | wall (s) | lines/s | peak RSS, process tree (MiB) |",
             "|---|---:|---:|---:|---:|"]
    for row in r["rows"]:
        lines.append(f"| {r['corpus']} train x{row['scale']} | {row['pairs']:,} | "
                     f"{row['wall']:.1f} | {row['lines_per_s']:,.0f} | {row['peak_rss_mb']:.0f} |")
    lines += ["", "lines/s counts the whole nmt-preprocess command (start-up, subword learning on "
              "a bounded sample, binarization with all workers)."]
    return "\n".join(lines)


def render_train(rows: list[dict], head: str, limit: str, cuda: bool = False) -> str:
    lines = [head, "",
             f"| model | precision | max tokens | timed updates (after warm-up) | target tokens/s "
             f"| updates/s | achieved GFLOP/s | {limit} matmul GFLOP/s | MFU | peak RSS (GB) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['arch']} ({r.get('params', 0) / 1e6:.1f}M) | {r['precision']} | "
                     f"{r['max_tokens']} | {r['updates']} (+{r['warm_updates']}) | "
                     f"{r['tgt_tokens_per_s']:,.0f} | {r['updates_per_s']:.3f} | "
                     f"{r['achieved_gflops']:.1f} | {r['matmul_peak_gflops']:.1f} | "
                     f"{r['mfu']:.1%} | {r['peak_rss_gb']:.2f} |")
    if cuda:
        n = rows[0].get("matmul_n", "NxN") if rows else "NxN"
        lines += ["", f"MFU = achieved FLOP/s (analytic matmul FLOPs of the timed batches, "
                  f"nmt/training/flops.py, x3 for forward+backward) / the best {limit} rate of "
                  f"{n}x{n} torch.matmul timed with CUDA events on the same GPU, measured by "
                  f"the same process just before training."]
    else:
        lines += ["", f"MFU = achieved FLOP/s (analytic matmul FLOPs of the timed batches, "
                  f"nmt/training/flops.py, x3 for forward+backward) / the {limit} matmul rate "
                  f"measured in the same run, same threads."]
    return "\n".join(lines)


def render_generate(rep: dict, head: str) -> str:
    beams = list(rep["beams"])
    lines = [head, "", f"Checkpoint `{Path(rep['checkpoint']).name}`, input "
             f"`{Path(rep['input']).name}` ({rep['sentences']} sentences), {rep['precision']}.", "",
             "| beam | sentences/s | target tokens/s | wall (s) | in decoder | in search |"
             + (" sacreBLEU |" if "bleu" in rep else ""),
             "|---:|---:|---:|---:|---:|---:|" + ("---:|" if "bleu" in rep else "")]
    for b in beams:
        r = rep["beams"][b]
        bleu = f" {rep['bleu'][b]:.2f} |" if "bleu" in rep else ""
        lines.append(f"| {b} | {r['sentences_per_s']:,.1f} | {r['target_tokens_per_s']:,.0f} | "
                     f"{r['wall_s']:.2f} | {r['decoder_share']:.0%} | {r['search_share']:.0%} |"
                     f"{bleu}")
    buckets = rep["beams"][beams[0]].get("ms_per_sentence_by_source_length", {})
    if buckets:
        lines += ["", "Time per sentence by source length (subwords; each bucket translated on "
                  "its own):", "",
                  "| source length | " + " | ".join(f"beam {b} ms/sentence" for b in beams)
                  + " | sentences |", "|---|" + "---:|" * (len(beams) + 1)]
        for key in buckets:
            cells = [rep["beams"][b]["ms_per_sentence_by_source_length"].get(key, {}) for b in beams]
            lines.append(f"| {key} | " + " | ".join(f"{c.get('ms', float('nan')):.1f}"
                                                   for c in cells) + f" | {buckets[key]['n']} |")
    return "\n".join(lines)


def render_memory(res: dict, head: str) -> str:
    lines = [head, "", "| stage | peak RSS |", "|---|---:|"]
    for row in res.get("preprocess", {}).get("rows", []):
        lines.append(f"| nmt-preprocess, train x{row['scale']} (process tree) | "
                     f"{row['peak_rss_mb']:.0f} MiB |")
    for r in res.get("train", []):
        gpu = f" (GPU max allocated {r['gpu_max_gb']:.2f} GB)" if r.get("gpu_max_gb") else ""
        lines.append(f"| training {r['arch']}, max tokens {r['max_tokens']} | "
                     f"{r['peak_rss_gb'] * 1024:.0f} MiB{gpu} |")
    if "generate" in res:
        g = res["generate"]
        lines.append(f"| generation, beams {', '.join(g['beams'])} | {g['peak_rss_mib']:.0f} MiB |")
    return "\n".join(lines)


def render_fairseq(res: dict, head: str) -> str:
    fs = res.get("fairseq", {"status": "skipped", "reason": "not run"})
    small = next((r for r in res.get("train", []) if r["arch"] == "transformer_small"), None)
    gen = res.get("generate")
    rows = fairseq_compare.comparison_rows(fs, small, gen)
    lines = [head, ""]
    if fs["status"] == "measured":
        lines.append(f"fairseq {fs.get('version', '0.12.2')} measured in this run "
                     f"(torch {fs.get('torch')}, its own virtual environment).")
    else:
        lines.append(f"fairseq not measured: {fs['reason']}.")
    lines += ["", "| figure | nmt (this run) | other | source of the other figure | nmt / other |",
              "|---|---:|---:|---|---:|"]
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        ours = r["nmt_text"] if r["nmt"] is not None else "not measured"
        lines.append(f"| {r['figure']} | {ours} | {r['other_text']} | {r['source']} | {ratio} |")
    lines += ["", "Reference figures come from other runs (transformer_small size, Multi30k "
              "en-de, 2 threads, max tokens 4096) and get no ratio; a ratio (both measured in "
              "this run, on the same model) above 1 means nmt is faster, or for memory, uses "
              "more."]
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True,
                    help="raw parallel text: train.SRC/TGT, val.*, test_2016_flickr.* (or test.*)")
    ap.add_argument("--src", default="en", help="source language suffix")
    ap.add_argument("--tgt", default="de", help="target language suffix")
    ap.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"),
                    help="markdown file whose bench:NAME sections are (re)written")
    ap.add_argument("--checkpoint", type=Path, help="model for the generation benchmark")
    ap.add_argument("--only", default=None,
                    help=f"comma-separated steps to run, from {', '.join(STEPS)} (default: all; "
                         f"with --device cuda: train,generate)")
    ap.add_argument("--quick", action="store_true",
                    help="seconds, not minutes: 2000-line preprocess, transformer_tiny, 5 timed "
                         "updates, 40 test sentences, a tiny checkpoint trained here if none given")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU variant")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch threads and preprocessing workers")
    ap.add_argument("--archs", help="comma-separated models to train (default: transformer_small,"
                                    "transformer_base on CPU; transformer_base,transformer_big "
                                    "on CUDA)")
    ap.add_argument("--updates", type=int, help="timed updates per model (default 30)")
    ap.add_argument("--warm-updates", type=int, help="untimed updates first (default 5; GPU 20)")
    ap.add_argument("--max-tokens", type=int, help="tokens per batch (default 4096; GPU 8192)")
    ap.add_argument("--vocab-size", type=int, help="joined BPE vocabulary (default 8000)")
    ap.add_argument("--beams", default=None, help="beam sizes (default 1,4; GPU 4)")
    ap.add_argument("--fairseq", choices=["auto", "reference"], default=None,
                    help="auto: try to install and run fairseq 0.12.2 (default without --quick); "
                         "reference: use the recorded reference figures")
    ap.add_argument("--fairseq-timeout", type=float, default=900,
                    help="seconds allowed for the fairseq install")
    ap.add_argument("--allow-cuda-torch", action="store_true",
                    help="let the fairseq venv download a CUDA build of torch (2.4.1 on "
                         "Python 3.8, 2.5.1 on 3.10; several GB)")
    ap.add_argument("--fairseq-torch-index", help="pip index URL for a CPU build of that torch")
    ap.add_argument("--work", type=Path, help="keep intermediate files here (default: a temp dir)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds allowed per step (default 3600; --quick 300)")
    a = ap.parse_args(argv)
    cuda = a.device.startswith("cuda")
    if a.only is None:
        a.only = "train,generate" if cuda else ",".join(STEPS)
    a.only = [s.strip() for s in a.only.split(",") if s.strip()]
    bad = [s for s in a.only if s not in STEPS]
    if bad:
        ap.error(f"--only: unknown step {bad[0]!r} (choose from {', '.join(STEPS)})")
    if a.archs:
        a.archs = a.archs.split(",")
    else:
        a.archs = (["transformer_tiny"] if a.quick else
                   ["transformer_base", "transformer_big"] if cuda else
                   ["transformer_small", "transformer_base"])
    a.updates = a.updates or (5 if a.quick else 30)
    a.warm_updates = a.warm_updates if a.warm_updates is not None else (
        2 if a.quick else 20 if cuda else 5)
    a.max_tokens = a.max_tokens or (1024 if a.quick else 8192 if cuda else 4096)
    a.vocab_size = a.vocab_size or (500 if a.quick else 8000)
    a.beams = [int(b) for b in (a.beams or ("4" if cuda else "1,4")).split(",")]
    a.precision = "bf16" if cuda else "fp32"
    a.fairseq = a.fairseq or ("reference" if a.quick else "auto")
    a.timeout = a.timeout or (300 if a.quick else 3600)
    if not (a.data / f"train.{a.src}").is_file() or not (a.data / f"train.{a.tgt}").is_file():
        ap.error(f"--data {a.data}: needs train.{a.src} and train.{a.tgt}")
    if a.checkpoint and not a.checkpoint.is_file():
        ap.error(f"--checkpoint {a.checkpoint}: no such file")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    a.data = a.data.resolve()
    a.out = a.out.resolve()
    if a.device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            print("run_all: skipped: --device cuda but no CUDA device is available",
                  file=sys.stderr)
            return 0
    tmp = None
    if a.work is None:
        tmp = tempfile.mkdtemp(prefix="nmt-bench-")
        a.work = Path(tmp)
    a.work.mkdir(parents=True, exist_ok=True)
    suite = Suite(a)
    machine = machine_info(a.threads, a.device)
    failed = []
    t0 = time.perf_counter()
    try:
        for step in STEPS:
            if step not in a.only:
                continue
            try:
                getattr(suite, step)()
            except BenchError as e:
                failed.append(step)
                suite.notes[step] = str(e)
                print(f"run_all: {step}: {e}", file=sys.stderr)
        sections = render_all(suite, machine)
        write_sections(a.out, sections)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"run_all: wrote {', '.join(sections)} to {a.out} in "
          f"{time.perf_counter() - t0:.0f}s", file=sys.stderr)
    return 1 if failed else 0


def render_all(suite: Suite, machine: dict) -> dict[str, str]:
    a, res = suite.a, suite.results
    head = machine_line(machine) + f" Command: `{command_line()}`" + (
        " (**--quick**: checks the harness, not a benchmark)" if a.quick else "")
    out: dict[str, str] = {}
    limit = a.precision
    prefix = "gpu-" if suite.cuda else ""       # a CUDA run never rewrites a CPU section
    for step in a.only:
        if step in suite.notes and step not in res:
            out[prefix + step] = f"{head}\n\nNot measured: {suite.notes[step]}."
    if "preprocess" in res:
        out[prefix + "preprocess"] = render_preprocess(res["preprocess"], head)
    if "train" in res:
        out[prefix + "train"] = render_train(res["train"], head, limit, suite.cuda)
    if "generate" in res:
        out[prefix + "generate"] = render_generate(res["generate"], head)
    if "train" in res or "generate" in res:
        out[prefix + "memory"] = render_memory(res, head)
    if "fairseq" in res:
        out[prefix + "fairseq"] = render_fairseq(res, head)
    return out


if __name__ == "__main__":
    sys.exit(main())
