#!/usr/bin/env python3
"""JoeyNMT 2.3.0 measured side by side with nmt, in its own virtual environment.

    python benchmarks/joeynmt_compare.py --work /tmp/joey --data MULTI30K   # JSON
    python benchmarks/joeynmt_compare.py --work /tmp/joey --setup-only
    python benchmarks/joeynmt_compare.py --work /tmp/joey --data DIR --updates 10 --threads 1 \\
        --gen-limit 100                                     # a quick check of the harness

JoeyNMT is never a dependency of nmt. It is installed from the registry into WORK/venv with
the torch release running this script: ``pip install torch==V joeynmt==2.3.0 importlib-metadata
"sentencepiece<0.2.2"`` (JoeyNMT asks only for torch >= 1.12; it imports importlib_metadata
without requiring it and calls a method that sentencepiece 0.2.2 removed). Before installing,
pip resolves torch alone with --dry-run: if only a CUDA build is reachable (nvidia-* wheels,
several GB) it skips unless given --torch-index URL (a CPU build) or --allow-cuda-torch. A venv
that installed once is reused. Any failure (no network, a resolver conflict, a time limit, a
JoeyNMT error) skips with a one-line reason: {"status": "skipped", "reason": ...}, never a
traceback.

What runs: the M30K-small setting of examples/multi30k on the raw text of DATA (train,
val, test_2016_flickr .en/.de). One joined sentencepiece BPE of 8000 is learned here with nmt's
own learner (nmt.data.subword.train_sentencepiece, as nmt-preprocess calls it: on Multi30k the
model file is byte for byte nmt-preprocess's), and given to JoeyNMT as its tokenizer model and
its shared vocabulary. JoeyNMT trains the size nmt calls
transformer_small (3+3 post-norm layers, d_model 256, d_ff 1024, 4 heads, dropout 0.1, label
smoothing 0.1, source, target and output embeddings tied, Adam with the paper's schedule,
"noam", warm-up 4000) with token batches of 4096 for --warm-updates + --updates updates on
--threads threads, through its own command line (``python -m joeynmt train``), no validation.

How it is timed: JoeyNMT's log line of each update ("Tokens per Sec", logging_freq 1) divides
the target tokens of the update (non-padding, eos included: the count nmt's bench_train.py uses)
by the seconds since the previous log line (batching, forward, backward, Adam). A small runner
(WORK/joey_runner.py, run by the venv's python) wraps that logging method and prints the two
numbers behind each figure; target tokens/s = the sum of tokens over the sum of seconds of the
updates after the warm-up, updates/s = timed updates / the same seconds. Peak RSS is that of
the training process tree, sampled every 20 ms. Start-up (data loading, tokenization) is not
in the timed window.

Generation (unless --no-generate): ``python -m joeynmt test`` decodes test_2016_flickr (the
first --gen-limit lines when given) with beam 4, alpha 0.6, 64 sentences a batch, using the
checkpoint of that short run. Its seconds are JoeyNMT's own "Generation took" figure (the
decoding loop); tokens are the subwords it output, eos included. Its length limit is 1.5 x the
longest source of the batch (nmt's: source + 50). The model is barely trained, so its outputs
run long: compare target tokens/s, not sentences/s.

Caveats that stay: JoeyNMT's token batches count padding like nmt's (sentences x the longer
side + 1) but are filled in random order without length bucketing, and close once they reach
4096 rather than before passing it. On Multi30k its updates of 4096 hold about 1,800 real target
tokens, nmt's about 3,840 (--max-tokens 9500 gives JoeyNMT as many): compare tokens/s, not
updates/s, and know that smaller batches also run less efficiently. It applies its dropout also
to attention weights and inside the feed-forward block (nmt's transformer_small: 0 there), and
its decoder has no cache of past keys and values.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fairseq_compare import (Skip, _run, _timed, install_only,  # noqa: E402 (a sibling)
                             refuse_cuda_torch)

JOEYNMT_VERSION = "2.3.0"
# What joeynmt 2.3.0 needs beyond its declared requirements: helpers.py imports
# importlib_metadata, and its tokenizer calls SentencePieceProcessor.SetVocabulary, which
# sentencepiece 0.2.2 removed.
EXTRA_REQUIREMENTS = ("importlib-metadata", "sentencepiece<0.2.2")
MARK = "NMTBENCH "
SPLITS = {"train": "train", "dev": "val", "test": "test_2016_flickr"}

# Runs in the JoeyNMT venv: JoeyNMT's own command line, with its per-update log and its
# prediction function wrapped to print the numbers behind them (one JSON line each).
RUNNER = f'''"""python joey_runner.py THREADS MODE CONFIG [OPTIONS]: see joeynmt_compare.py"""
import json
import sys
import time

import torch
from joeynmt import __main__ as cli, prediction, training

MARK = {MARK!r}


def emit(kind, **fields):
    print(MARK + json.dumps(dict(kind=kind, **fields)), flush=True)


log_scores = training.TrainManager._log_scores


def logged(self, epoch_no, elapsed_time, start_tokens, start_correct, total_batch_loss):
    emit("update", step=self.stats.steps, tokens=self.stats.total_tokens - start_tokens,
         seconds=elapsed_time)
    return log_scores(self, epoch_no, elapsed_time, start_tokens, start_correct,
                      total_batch_loss)


predict = prediction.predict


def predicted(*args, **kwargs):
    out = predict(*args, **kwargs)
    if out is not None and out[3] is not None:
        emit("predict", sentences=len(out[3]), tokens=sum(len(h) for h in out[3]))
    return out


training.TrainManager._log_scores = logged
prediction.predict = predicted
torch.set_num_threads(int(sys.argv.pop(1)))
sys.argv[0] = "joeynmt"
cli.main()
'''


def log(msg: str) -> None:
    print(f"joeynmt_compare: {msg}", file=sys.stderr, flush=True)


def local_torch_version() -> str:
    """The torch release this script runs with, without a local tag (2.13.0+cpu -> 2.13.0)."""
    import torch

    return torch.__version__.split("+")[0]


# --- installation -------------------------------------------------------------------------------
def setup_venv(work: Path, timeout: float, torch_version: str, allow_cuda_torch: bool = False,
               torch_index: str | None = None) -> Path:
    """A venv with torch ``torch_version`` and JoeyNMT under ``work``; returns its python."""
    deadline = time.monotonic() + timeout
    venv = work / "venv"
    py = venv / "bin" / "python"
    ok_file = venv / ".nmt-bench-ok"
    want = {"joeynmt": JOEYNMT_VERSION, "torch": torch_version, "extra": list(EXTRA_REQUIREMENTS)}
    try:
        if py.exists() and json.loads(ok_file.read_text()) == want:
            return py
    except (OSError, ValueError):
        pass
    work.mkdir(parents=True, exist_ok=True)
    log(f"creating {venv}")
    _run([sys.executable, "-m", "venv", "--clear", venv], deadline, "python -m venv")
    pip = [py, "-m", "pip", "--disable-pip-version-check"]
    index = ["--extra-index-url", torch_index] if torch_index else []
    refuse_cuda_torch(pip, work, torch_version, index, deadline, allow_cuda_torch,
                      "--torch-index")
    log(f"installing torch {torch_version} and joeynmt {JOEYNMT_VERSION}")
    _run(pip + ["install", "-q", f"torch=={torch_version}", f"joeynmt=={JOEYNMT_VERSION}",
                *EXTRA_REQUIREMENTS, *index], deadline, f"pip install joeynmt=={JOEYNMT_VERSION}")
    out = _run([py, "-c", "import joeynmt, torch, sentencepiece, joeynmt.training; "
                          "sentencepiece.SentencePieceProcessor.SetVocabulary; "
                          "print(joeynmt.__version__, torch.__version__)"],
               deadline, "import joeynmt")
    got = out.split()
    if len(got) < 2 or got[0] != JOEYNMT_VERSION or got[1].split("+")[0] != torch_version:
        raise Skip(f"the venv has joeynmt/torch {' '.join(got) or '?'}, not "
                   f"{JOEYNMT_VERSION}/{torch_version}")
    ok_file.write_text(json.dumps(want))
    return py


# --- data and configuration ---------------------------------------------------------------------
def find_splits(data: Path, src: str, tgt: str) -> dict[str, Path]:
    """The prefix (path without .LANG) of train, dev and test in ``data``."""
    found = {}
    for split, name in SPLITS.items():
        prefix = data / name
        missing = [f"{name}.{lang}" for lang in (src, tgt)
                   if not (data / f"{name}.{lang}").is_file()]
        if missing:
            raise Skip(f"{data}: no {', '.join(missing)}")
        found[split] = prefix
    return found


def learn_bpe(train: Path, src: str, tgt: str, vocab_size: int, out: Path,
              threads: int) -> tuple[Path, Path]:
    """nmt's joined sentencepiece BPE on train.SRC + train.TGT: (model file, JoeyNMT vocab)."""
    from nmt.data.subword import train_sentencepiece
    from nmt.specials import SPECIALS

    out.mkdir(parents=True, exist_ok=True)
    model_file, vocab_file = out / "spm.model", out / "vocab.txt"
    stamp = out / "spm.json"
    key = {"train": str(train), "langs": [src, tgt], "vocab_size": vocab_size}
    try:
        if json.loads(stamp.read_text()) == key and model_file.exists() and vocab_file.exists():
            return model_file, vocab_file
    except (OSError, ValueError):
        pass
    lines = []
    for lang in (src, tgt):
        with open(f"{train}.{lang}", encoding="utf-8") as f:
            lines += [x.rstrip("\n") for x in f]
    model = train_sentencepiece(lines, vocab_size, threads=threads)
    model_file.write_bytes(model.proto)
    # JoeyNMT puts its own four specials first and looks pieces up by their text.
    pieces = [model.sp.id_to_piece(i) for i in range(len(SPECIALS), model.sp.get_piece_size())]
    vocab_file.write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
    stamp.write_text(json.dumps(key))
    return model_file, vocab_file


def joey_config(splits: dict[str, Path], src: str, tgt: str, spm_model: Path, vocab: Path,
                model_dir: Path, arch: dict, max_tokens: int, updates: int, warmup: int = 4000,
                beam: int = 4, lenpen: float = 0.6, gen_batch: int = 64, seed: int = 1) -> dict:
    """A JoeyNMT 2.3 configuration (a dict; written as JSON, which YAML reads) for ``arch``.

    ``arch`` holds nmt's ModelConfig fields (encoder_layers, decoder_layers, d_model, d_ff,
    heads, dropout, label_smoothing, pre_norm, activation). Training runs ``updates`` updates with
    no validation (its interval is never reached) and logs every update.
    """
    def side(lang: str) -> dict:
        return {"lang": lang, "level": "bpe", "lowercase": False, "max_length": -1,
                "voc_file": str(vocab), "tokenizer_type": "sentencepiece",
                "tokenizer_cfg": {"model_file": str(spm_model)}}

    def stack(layers: int) -> dict:
        return {"type": "transformer", "num_layers": layers, "num_heads": arch["heads"],
                "hidden_size": arch["d_model"], "ff_size": arch["d_ff"],
                "dropout": arch["dropout"],
                "embeddings": {"embedding_dim": arch["d_model"], "scale": True,
                               "dropout": arch["dropout"]},
                "layer_norm": "pre" if arch.get("pre_norm") else "post",
                "activation": arch.get("activation", "relu")}

    d = arch["d_model"]
    return {
        "name": "nmt-bench", "joeynmt_version": JOEYNMT_VERSION, "model_dir": str(model_dir),
        "use_cuda": False, "fp16": False, "random_seed": seed, "num_workers": 0,
        "data": {**{k: str(v) for k, v in splits.items()}, "dataset_type": "plain",
                 "src": side(src), "trg": side(tgt)},
        "training": {
            "optimizer": "adam", "adam_betas": [0.9, 0.98], "scheduling": "noam",
            "learning_rate_factor": 1, "learning_rate_warmup": warmup,
            # The first update runs before the schedule sets a rate: give it eq. 5's rate at 1.
            "learning_rate": d ** -0.5 * warmup ** -1.5,
            # JoeyNMT stops once the rate falls below this; eq. 5 starts near 2e-7.
            "learning_rate_min": 0.0,
            "loss": "crossentropy", "label_smoothing": arch["label_smoothing"],
            "normalization": "tokens", "batch_type": "token", "batch_size": max_tokens,
            "batch_multiplier": 1, "updates": updates, "epochs": 1000, "shuffle": True,
            "logging_freq": 1, "validation_freq": 10 ** 9, "keep_best_ckpts": 1,
            "overwrite": True, "print_valid_sents": []},
        "testing": {"beam_size": beam, "beam_alpha": lenpen, "batch_size": gen_batch,
                    "batch_type": "sentence", "eval_metrics": ["bleu"],
                    "sacrebleu_cfg": {"tokenize": "13a"},
                    "load_model": str(model_dir / "latest.ckpt")},
        "model": {"initializer": "xavier_uniform", "embed_initializer": "xavier_uniform",
                  "bias_initializer": "zeros", "tied_embeddings": True, "tied_softmax": True,
                  "encoder": stack(arch["encoder_layers"]),
                  "decoder": stack(arch["decoder_layers"])},
    }


# --- reading JoeyNMT's output -------------------------------------------------------------------
def records(text: str, kind: str) -> list[dict]:
    """The runner's JSON lines of one kind, in order."""
    out = []
    for line in text.splitlines():
        if line.startswith(MARK):
            rec = json.loads(line[len(MARK):])
            if rec.get("kind") == kind:
                out.append(rec)
    return out


def train_figures(text: str, warm_updates: int) -> dict:
    """Target tokens/s and updates/s over the updates after ``warm_updates``."""
    timed = [r for r in records(text, "update") if r["step"] > warm_updates]
    secs = sum(r["seconds"] for r in timed)
    if not timed or secs <= 0:
        raise Skip(f"JoeyNMT logged no update after the {warm_updates} warm-up updates")
    tokens = sum(r["tokens"] for r in timed)
    m = re.search(r"Total params: (\d+)", text)
    return {"updates": len(timed), "warm_updates": warm_updates, "seconds": secs,
            "tgt_tokens": tokens, "tgt_tokens_per_update": tokens / len(timed),
            "tgt_tokens_per_s": tokens / secs, "updates_per_s": len(timed) / secs,
            "params": int(m.group(1)) if m else None}


def generate_figures(text: str) -> dict:
    """Sentences, output tokens and JoeyNMT's decoding seconds of the one test set decoded."""
    preds = records(text, "predict")
    took = re.findall(r"Generation took ([\d.]+)\[sec\]", text)
    if len(preds) != 1 or len(took) != 1:
        raise Skip(f"expected one decoded set, JoeyNMT reported {len(preds)} ({len(took)} "
                   f"'Generation took' lines)")
    secs, p = float(took[0]), preds[0]
    if secs <= 0:
        raise Skip("JoeyNMT reported a decoding time of 0 s")
    bleu = re.search(r"Evaluation result \(beam search\).*?bleu:\s*([\d.]+)", text)
    return {"sentences": p["sentences"], "target_tokens": p["tokens"], "seconds": secs,
            "sentences_per_s": p["sentences"] / secs, "target_tokens_per_s": p["tokens"] / secs,
            "bleu": float(bleu.group(1)) if bleu else None}


# --- measuring ----------------------------------------------------------------------------------
def thread_env(threads: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}


def arch_fields(arch: str) -> dict:
    """nmt's configuration of ``arch``, the fields joey_config reads."""
    import nmt

    cfg = nmt.get_arch(arch)
    names = ("encoder_layers", "decoder_layers", "d_model", "d_ff", "heads", "dropout",
             "label_smoothing", "pre_norm", "activation")
    return {k: getattr(cfg, k) for k in names}


def limited_test(prefix: Path, langs: tuple[str, str], limit: int | None, out: Path) -> Path:
    """``prefix`` itself, or a copy of its first ``limit`` lines under ``out``."""
    if not limit:
        return prefix
    out.mkdir(parents=True, exist_ok=True)
    for lang in langs:
        with open(f"{prefix}.{lang}", encoding="utf-8") as f:
            head = [line for _, line in zip(range(limit), f)]
        (out / f"{prefix.name}.{lang}").write_text("".join(head), encoding="utf-8")
    return out / prefix.name


def measure_generate(py: Path, runner: Path, conf: dict, work: Path, threads: int,
                     limit: int | None, langs: tuple[str, str], timeout: float) -> dict:
    """``python -m joeynmt test`` on the test set with the checkpoint of the training run."""
    gen = json.loads(json.dumps(conf))
    del gen["data"]["dev"], gen["data"]["train"]
    gen["data"]["test"] = str(limited_test(Path(conf["data"]["test"]), langs, limit,
                                           work / "gen-data"))
    cfg_file = work / "generate.yaml"
    cfg_file.write_text(json.dumps(gen, indent=1), encoding="utf-8")
    text, rss = _timed([py, runner, threads, "test", cfg_file], thread_env(threads), timeout,
                       work / "joeynmt-test.log")
    fig = generate_figures(text)
    return {"beam": conf["testing"]["beam_size"], "batch_sentences": conf["testing"]["batch_size"],
            **fig, "peak_rss_mb": rss}


def measure(py: Path, data: Path, work: Path, arch: str = "transformer_small", threads: int = 2,
            warm_updates: int = 5, updates: int = 35, max_tokens: int = 4096,
            vocab_size: int = 8000, generate: bool = True, gen_limit: int | None = None,
            src: str = "en", tgt: str = "de", timeout: float = 3600) -> dict:
    """Train (and decode with) JoeyNMT in the venv of ``py`` on the raw text of ``data``."""
    splits = find_splits(data, src, tgt)
    t0 = time.monotonic()
    spm_model, vocab = learn_bpe(splits["train"], src, tgt, vocab_size, work / "bpe", threads)
    log(f"BPE ready in {time.monotonic() - t0:.0f}s; training {warm_updates}+{updates} updates")
    runner = work / "joey_runner.py"
    runner.write_text(RUNNER, encoding="utf-8")
    total = warm_updates + updates
    conf = joey_config(splits, src, tgt, spm_model, vocab, work / "model", arch_fields(arch),
                       max_tokens, total)
    cfg_file = work / "train.yaml"
    cfg_file.write_text(json.dumps(conf, indent=1), encoding="utf-8")
    text, rss = _timed([py, runner, threads, "train", cfg_file, "--skip-test"],
                       thread_env(threads), timeout, work / "joeynmt-train.log")
    train = {**train_figures(text, warm_updates), "max_tokens": max_tokens,
             "peak_rss_gb": rss / 1024}
    versions = _run([py, "-c", "import joeynmt, torch; print(joeynmt.__version__, "
                               "torch.__version__)"], time.monotonic() + 120, "versions").split()
    res = {"status": "measured", "version": versions[0], "torch": versions[1], "arch": arch,
           "threads": threads, "train": train,
           "timing": "target tokens and seconds behind JoeyNMT's per-update 'Tokens per Sec' "
                     "log, summed over the timed updates"}
    if generate:
        log("decoding the test set with the short run's checkpoint")
        res["generate"] = {**measure_generate(py, runner, conf, work, threads, gen_limit,
                                              (src, tgt), timeout), "model_updates": total}
    return res


def compare(work: Path, data: Path, arch: str = "transformer_small", threads: int = 2,
            warm_updates: int = 5, updates: int = 35, max_tokens: int = 4096,
            vocab_size: int = 8000, generate: bool = True, gen_limit: int | None = None,
            src: str = "en", tgt: str = "de", install_timeout: float = 900,
            torch_version: str | None = None, allow_cuda_torch: bool = False,
            torch_index: str | None = None, timeout: float = 3600) -> dict:
    """Measured JoeyNMT figures, or {"status": "skipped", "reason": one line}."""
    try:
        work = Path(work).resolve()
        py = setup_venv(work, install_timeout, torch_version or local_torch_version(),
                        allow_cuda_torch, torch_index)
        return measure(py, Path(data).resolve(), work, arch, threads, warm_updates, updates,
                       max_tokens, vocab_size, generate, gen_limit, src, tgt, timeout)
    except Skip as e:
        reason = str(e)
    except (OSError, ValueError, KeyError, IndexError, RuntimeError, ImportError) as e:
        # a broken venv, an unexpected log format, a sentencepiece error
        reason = f"{type(e).__name__}: {e}"
    reason = (reason.strip().splitlines() or ["?"])[0][:300]
    log(f"skipped: {reason}")
    return {"status": "skipped", "reason": reason}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="venv and files go here")
    ap.add_argument("--data", type=Path,
                    help="raw Multi30k: train, val, test_2016_flickr .SRC/.TGT")
    ap.add_argument("--src", default="en")
    ap.add_argument("--tgt", default="de")
    ap.add_argument("--arch", default="transformer_small", help="nmt architecture to mirror")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warm-updates", type=int, default=5, help="untimed updates first")
    ap.add_argument("--updates", type=int, default=35, help="timed updates")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--vocab-size", type=int, default=8000, help="joined BPE size")
    ap.add_argument("--no-generate", action="store_true", help="train only")
    ap.add_argument("--gen-limit", type=int, help="decode only the first N test sentences")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per JoeyNMT command")
    ap.add_argument("--install-timeout", type=float, default=900)
    ap.add_argument("--torch", dest="torch_version",
                    help="torch release for the venv (default: the one running this script)")
    ap.add_argument("--allow-cuda-torch", action="store_true",
                    help="install torch even if only its CUDA build (several GB) is reachable")
    ap.add_argument("--torch-index", help="extra pip index URL with a CPU build of torch")
    ap.add_argument("--setup-only", action="store_true", help="install, do not measure")
    a = ap.parse_args(argv)
    if a.threads < 1 or a.updates < 1 or a.warm_updates < 0:
        ap.error("--threads and --updates must be >= 1, --warm-updates >= 0")
    if a.setup_only:
        res = install_only(lambda: setup_venv(a.work.resolve(), a.install_timeout,
                                              a.torch_version or local_torch_version(),
                                              a.allow_cuda_torch, a.torch_index))
    else:
        if a.data is None:
            ap.error("--data is required unless --setup-only")
        res = compare(a.work, a.data, a.arch, a.threads, a.warm_updates, a.updates,
                      a.max_tokens, a.vocab_size, not a.no_generate, a.gen_limit, a.src, a.tgt,
                      a.install_timeout, a.torch_version, a.allow_cuda_torch, a.torch_index,
                      a.timeout)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
