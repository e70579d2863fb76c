"""The WMT 2014 recipes of the paper (section 5.1, 6.1), shared by wmt14_en_de and wmt14_en_fr.

Stages, each resumable (a completed stage leaves a marker under WORK/.done and is skipped):

  data        download (or take from --data-dir) and verify the archives, extract the corpora,
              normalise punctuation and drop empty pairs (train); newstest2013 (valid) and
              newstest2014 (test) from the sgm files, every line kept
  preprocess  nmt-preprocess: Moses tokenization, the joined subword model, binarization
  train       nmt-train (torchrun for several GPUs); resumes from checkpoint_last.pt
  average     nmt-train --average over the last 5 (base) / 20 (big) checkpoints
  generate    nmt-generate on newstest2014: beam 4, alpha 0.6, max length input + 50
  score       nmt-score: tokenized compound-split BLEU (the paper's) and sacreBLEU
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shlex
import tarfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from nmt.errors import NmtError

from common import fetch, textprep
from common.recipe import REPO_ROOT, Recipe, run_main, setup_logging, validate_command

log = logging.getLogger("recipe.wmt14")

STAGES = ("data", "preprocess", "train", "average", "generate", "score")
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "examples" / "wmt14"

# Published checksums: sacrebleu 2.6's dataset table (sacrebleu/dataset/__init__.py) lists the
# md5 of the WMT test archives it downloads. The training archives have none published; they
# are verified by archive integrity and line counts (see common/fetch.py).
SACREBLEU_MD5 = {
    "test.tgz": "48eca5d02f637af44e85186847141f67",        # "wmt13": newstest2013
    "test-full.tgz": "a8cd784e006feb32ac6f3d9ec7eb389a",   # "wmt14/full": newstest2014
}

ARCHIVE_URLS = {
    "training-parallel-europarl-v7.tgz": "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz",
    "training-parallel-commoncrawl.tgz": "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz",
    "training-parallel-nc-v12.tgz": "https://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz",
    "training-parallel-nc-v9.tgz": "https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz",
    "training-parallel-un.tgz": "https://www.statmt.org/wmt13/training-parallel-un.tgz",
    "training-giga-fren.tar": "https://www.statmt.org/wmt10/training-giga-fren.tar",
    "test.tgz": "https://statmt.org/wmt13/test.tgz",
    "test-full.tgz": "https://statmt.org/wmt14/test-full.tgz",
}


@dataclass(frozen=True)
class Corpus:
    """A parallel corpus: files PREFIX.SRC and PREFIX.TGT (PREFIX.L.gz inside the archive
    when ``gz``) somewhere in ``archive``."""
    archive: str
    prefix: str
    gz: bool = False


@dataclass(frozen=True)
class EvalSet:
    archive: str
    src_sgm: str
    ref_sgm: str
    lines: int | None      # segments in the official release (sacrebleu gives the same)


@dataclass(frozen=True)
class ModelPreset:
    arch: str
    max_update: int
    average_last: int
    # The paper saved every 10 minutes (base: 100k updates in 12 h; big: 300k in 84 h). In
    # updates that is ~1400 (base) and ~600 (big): hardware-independent, so averaging covers
    # the same stretch of training on 1 GPU as on 8.
    save_interval_updates: int
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class PairSpec:
    src: str
    tgt: str
    train: tuple[Corpus, ...]
    valid: EvalSet
    test: EvalSet
    subword: str            # "bpe" or "wordpiece"
    vocab_size: int
    paper_pairs: int        # training pairs the paper reports (section 5.1)
    models: dict = field(default_factory=dict)
    # Table 2's BLEU of each model (tokenized, compound split): printed beside the scores
    paper_bleu: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.src}-{self.tgt}"


BASE = ModelPreset("transformer_base", 100_000, 5, 1400)
BIG = ModelPreset("transformer_big", 300_000, 20, 600)

EN_DE = PairSpec(
    "en", "de",
    train=(Corpus("training-parallel-europarl-v7.tgz", "europarl-v7.de-en"),
           Corpus("training-parallel-commoncrawl.tgz", "commoncrawl.de-en"),
           Corpus("training-parallel-nc-v12.tgz", "news-commentary-v12.de-en")),
    valid=EvalSet("test.tgz", "newstest2013-src.en.sgm", "newstest2013-src.de.sgm", 3000),
    test=EvalSet("test-full.tgz", "newstest2014-deen-src.en.sgm", "newstest2014-deen-ref.de.sgm",
                 3003),
    subword="bpe", vocab_size=37000, paper_pairs=4_500_000,
    models={"base": BASE, "big": BIG},
    paper_bleu={"base": 27.3, "big": 28.4},
)

EN_FR = PairSpec(
    "en", "fr",
    train=(Corpus("training-parallel-europarl-v7.tgz", "europarl-v7.fr-en"),
           Corpus("training-parallel-commoncrawl.tgz", "commoncrawl.fr-en"),
           Corpus("training-parallel-un.tgz", "undoc.2000.fr-en"),
           Corpus("training-parallel-nc-v9.tgz", "news-commentary-v9.fr-en"),
           Corpus("training-giga-fren.tar", "giga-fren.release2.fixed", gz=True)),
    valid=EvalSet("test.tgz", "newstest2013-src.en.sgm", "newstest2013-src.fr.sgm", 3000),
    test=EvalSet("test-full.tgz", "newstest2014-fren-src.en.sgm", "newstest2014-fren-ref.fr.sgm",
                 3003),
    subword="wordpiece", vocab_size=32000, paper_pairs=36_000_000,
    # "The Transformer (big) model trained for English-to-French used dropout rate 0.1".
    models={"base": BASE, "big": replace(BIG, overrides=("dropout=0.1",))},
    paper_bleu={"base": 38.1, "big": 41.8},
)

# Tiny mode: the whole chain for real on tests/fixtures/examples/wmt14, in seconds on a CPU.
TINY_MODEL = ModelPreset("transformer_tiny", 6, 2, 2)
TINY_VOCAB = 250


# --- data ------------------------------------------------------------------------------------

def build_tiny_archives(spec: PairSpec, out: Path) -> Path:
    """Pack the fixture files into archives named and laid out like the real ones."""
    out.mkdir(parents=True, exist_ok=True)
    for name in sorted({c.archive for c in spec.train} | {spec.valid.archive, spec.test.archive}):
        src_dir = FIXTURES / name
        if not src_dir.is_dir():
            raise NmtError(f"missing fixture folder {src_dir}")
        dest = out / name
        tmp = dest.with_name(dest.name + ".tmp")
        with tarfile.open(tmp, "w" if name.endswith(".tar") else "w:gz") as tar:
            for p in sorted(src_dir.rglob("*")):
                if p.is_file():
                    tar.add(p, arcname=str(p.relative_to(src_dir)))
        os.replace(tmp, dest)
    return out


def data_stage(r: Recipe, spec: PairSpec, data_dir: Path | None, jobs: int, tiny: bool) -> None:
    downloads, orig, text = r.work_dir / "downloads", r.work_dir / "orig", r.work_dir / "text"
    wanted: dict[str, list[str]] = {}
    for c in spec.train:
        wanted.setdefault(c.archive, []).extend(f"{c.prefix}.{l}" for l in (spec.src, spec.tgt))
    for e in (spec.valid, spec.test):
        wanted.setdefault(e.archive, []).extend([e.src_sgm, e.ref_sgm])

    for name, members in wanted.items():
        url = ARCHIVE_URLS[name]
        dest = downloads / name
        sums = {} if tiny else ({"md5": SACREBLEU_MD5[name]} if name in SACREBLEU_MD5 else {})
        where = f"from {data_dir}" if data_dir else f"from {url}"
        r.step(f"fetch-{name}", [dest], lambda url=url, dest=dest, sums=sums:
               fetch.obtain(url, dest, data_dir, sums),
               params={"url": url, "checksums": sums, "data_dir": str(data_dir or "")},
               describe=f"get {name} {where}" + (f", check md5 {sums['md5']}" if sums else ""),
               python=True)
        outs = [orig / m for m in members]
        r.step(f"extract-{name}", outs, lambda dest=dest, members=members:
               _extract(r, dest, members, orig, spec),
               params={"members": members}, inputs=[dest],
               describe=f"read all of {name} (integrity), extract {', '.join(members)}",
               python=True)

    outputs = [text / f"{split}.{l}" for split in ("train", "valid", "test")
               for l in (spec.src, spec.tgt)] + [text / f"test.ref.{spec.tgt}"]
    extracted = [orig / m for members in wanted.values() for m in members]
    r.step("text", outputs, lambda: _make_text(spec, orig, text, jobs, tiny), inputs=extracted,
           params={"pair": spec.name, "train": [c.prefix for c in spec.train]},
           describe="normalise punctuation, drop empty training pairs, extract newstest2013/2014 "
                    f"from sgm into {text}", python=True)


def _extract(r: Recipe, archive: Path, members: list[str], orig: Path, spec: PairSpec) -> None:
    try:
        files = fetch.extract_members(archive, members, orig)
    except NmtError:
        if not archive.is_symlink():     # our own download: fetch it again next time
            r.forget(f"fetch-{archive.name}")
            archive.unlink(missing_ok=True)
        raise
    pairs = [(f"{c.prefix}.{spec.src}", f"{c.prefix}.{spec.tgt}") for c in spec.train
             if c.archive == archive.name]
    counts = fetch.check_line_counts(files, parallel=pairs)
    for name, n in counts.items():
        log.info("%s: %d lines", name, n)


def _make_text(spec: PairSpec, orig: Path, text: Path, jobs: int, tiny: bool) -> None:
    text.mkdir(parents=True, exist_ok=True)
    corpora = [(orig / f"{c.prefix}.{spec.src}", orig / f"{c.prefix}.{spec.tgt}")
               for c in spec.train]
    read, kept = textprep.clean_parallel(corpora, text / f"train.{spec.src}",
                                         text / f"train.{spec.tgt}", spec.src, spec.tgt,
                                         jobs=jobs)
    log.info("training data: %d pairs read, %d kept", read, kept)
    if not tiny and kept < 0.9 * spec.paper_pairs:
        log.warning("only %d training pairs; the paper reports about %d. Check the archives.",
                    kept, spec.paper_pairs)
    for split, e in (("valid", spec.valid), ("test", spec.test)):
        src = fetch.sgm_segments(orig / e.src_sgm)
        ref = fetch.sgm_segments(orig / e.ref_sgm)
        if len(src) != len(ref):
            raise NmtError(f"{e.src_sgm} has {len(src)} segments but {e.ref_sgm} has {len(ref)}")
        if not tiny and e.lines is not None and len(src) != e.lines:
            raise NmtError(f"{e.src_sgm}: {len(src)} segments, expected {e.lines}")
        textprep.write_lines(text / f"{split}.{spec.src}",
                             (textprep.clean_line(s, spec.src) for s in src))
        textprep.write_lines(text / f"{split}.{spec.tgt}",
                             (textprep.clean_line(s, spec.tgt) for s in ref))
        if split == "test":
            # The reference exactly as sacreBLEU's wmt14/full has it: scores are comparable.
            textprep.write_lines(text / f"test.ref.{spec.tgt}", ref)


# --- model stages ------------------------------------------------------------------------------

def last_checkpoints(save_dir: Path, n: int) -> list[Path]:
    from nmt.training.savedir import numbered_checkpoints

    cks = numbered_checkpoints(save_dir)
    if not cks:
        raise NmtError(f"no checkpoint_<update>.pt in {save_dir}: has training run?")
    if len(cks) < n:
        log.warning("only %d checkpoints in %s; averaging those instead of %d", len(cks),
                    save_dir, n)
    return cks[-n:]


def model_stages(r: Recipe, spec: PairSpec, args: argparse.Namespace, stages: set[str]) -> None:
    text, data_bin = r.work_dir / "text", r.work_dir / "data-bin"
    preset = TINY_MODEL if args.tiny else spec.models[args.model]
    vocab = TINY_VOCAB if args.tiny else spec.vocab_size
    run_name = "tiny" if args.tiny else args.model
    save_dir = r.work_dir / f"checkpoints-{run_name}"
    avg = save_dir / f"averaged_last{preset.average_last}.pt"
    results = r.work_dir / f"results-{run_name}"
    hyp = results / f"newstest2014.hyp.{spec.tgt}"

    if "preprocess" in stages:
        cmd = ["nmt-preprocess", "-s", spec.src, "-t", spec.tgt,
               "--trainpref", text / "train", "--validpref", text / "valid",
               "--testpref", text / "test", "--destdir", data_bin, "--overwrite",
               "--moses", "--subword", spec.subword, "--joined-dictionary",
               "--vocab-size", vocab,
               # Moses clean-corpus-n as the fairseq recipe applies it, on subword tokens.
               "--max-len", 250, "--max-len-ratio", 1.5, "--workers", args.jobs]
        r.step("preprocess", [data_bin], lambda: r.sh(cmd), inputs=[text],
               params={"cmd": cmd}, describe=f"{spec.subword} {vocab}, joined, Moses tokens")

    if "train" in stages:
        gpus = max(1, args.gpus)
        if args.tiny:
            max_tokens, update_freq = 512, 1
        else:
            max_tokens, update_freq = update_batches(args.tokens_per_update, gpus,
                                                     args.max_tokens)
        cmd = ["nmt-train", data_bin, "--arch", preset.arch,
               *[w for o in preset.overrides for w in ("--override", o)],
               "--max-tokens", max_tokens, "--update-freq", update_freq,
               "--max-update", preset.max_update, "--save-dir", save_dir,
               "--save-interval-updates", preset.save_interval_updates,
               "--keep-last", preset.average_last, "--seed", args.seed]
        if args.tiny:
            cmd += ["--warmup", 4, "--device", "cpu", "--threads", 1]
        else:
            cmd += ["--precision", args.precision]
        if gpus > 1:
            cmd = ["torchrun", "--standalone", "--nproc_per_node", gpus, "--no-python", *cmd]
        cmd += shlex.split(args.train_args or "")
        r.step(f"train-{run_name}", [save_dir / "checkpoint_last.pt"],
               lambda: r.sh(cmd), inputs=[data_bin], params={"cmd": cmd},
               describe=f"{preset.arch}, {preset.max_update} updates of ~"
                        f"{gpus * max_tokens * update_freq} tokens on {gpus} device(s); "
                        f"resumes from {save_dir}/checkpoint_last.pt")

    if "average" in stages:
        def average() -> None:
            if r.dry_run:
                # The checkpoints exist only after training: show the shell that picks them.
                validate_command(["nmt-train", "--average", "CKPT", "--output", str(avg)])
                # Numbered ones only: checkpoint_best/last.pt would count a checkpoint twice.
                print(f"nmt-train --average $(ls {save_dir}/checkpoint_[0-9]*.pt | sort -V | "
                      f"tail -n {preset.average_last}) --output {avg}")
                return
            cks = last_checkpoints(save_dir, preset.average_last)
            r.sh(["nmt-train", "--average", *cks, "--output", avg])
        r.step(f"average-{run_name}", [avg], average, inputs=[save_dir / "checkpoint_last.pt"],
               params={"n": preset.average_last, "dir": str(save_dir)},
               describe=f"average the last {preset.average_last} checkpoints")

    if "generate" in stages:
        cmd = ["nmt-generate", avg, "--input", text / f"test.{spec.src}", "--output", hyp,
               "--beam", 4, "--lenpen", 0.6, "--max-len-a", 1, "--max-len-b", 50]
        cmd += ["--device", "cpu", "--threads", 1] if args.tiny else ["--precision", args.precision]
        def generate() -> None:
            if not r.dry_run:
                results.mkdir(parents=True, exist_ok=True)
            r.sh(cmd)
        r.step(f"generate-{run_name}", [hyp], generate, inputs=[avg],
               params={"cmd": cmd}, describe="translate newstest2014 (beam 4, alpha 0.6, +50)")

    if "score" in stages:
        # tok-bleu: the paper's BLEU (Moses-tokenized, hyphenated compounds split, as
        # tensor2tensor's get_ende_bleu.sh); bleu: sacreBLEU on the detokenized output against
        # the reference exactly as sacreBLEU's wmt14/full has it.
        score_file = results / "scores.txt"
        cmd = ["nmt-score", "--hyp", hyp, "--ref", text / f"test.ref.{spec.tgt}",
               "--metric", "tok-bleu,bleu", "--lang", spec.tgt]

        def score() -> None:
            r.sh(cmd, stdout=score_file)
        r.step(f"score-{run_name}", [score_file], score, params={"cmd": cmd},
               inputs=[hyp, text / f"test.ref.{spec.tgt}"],
               describe="tokenized compound-split BLEU and sacreBLEU on newstest2014")
        if not r.dry_run:
            print(score_file.read_text(encoding="utf-8"), end="")
            print(f"the paper (Table 2), transformer_{args.model}: tok-BLEU "
                  f"{spec.paper_bleu[args.model]} (examples/wmt14_{spec.src}_{spec.tgt}/"
                  f"README.md, Targets: how it compares with the figures above)")


def update_batches(tokens_per_update: int, gpus: int, cap: int) -> tuple[int, int]:
    """(--max-tokens, --update-freq) for about ``tokens_per_update`` tokens per update on
    ``gpus`` GPUs with micro-batches of at most ``cap`` tokens: the fewest micro-batches per
    update, each as large as an even split needs (25,000 on 1 GPU with a cap of 4,096: 7 x
    3,572, not 7 x 4,096 = 28,672). A cap that alone exceeds the update on every GPU is an
    error: the batch would grow past the paper's while its learning-rate schedule stays."""
    if gpus * cap > tokens_per_update * 1.05:
        raise NmtError(f"--gpus {gpus} x --max-tokens {cap} = {gpus * cap:,} tokens per "
                       f"update, more than --tokens-per-update {tokens_per_update:,}: the "
                       f"paper's learning-rate schedule goes with its batch; lower --max-tokens "
                       f"to {tokens_per_update // gpus} or less, or raise --tokens-per-update "
                       f"if a larger batch is what you want")
    update_freq = max(1, math.ceil(tokens_per_update / (gpus * cap)))
    return math.ceil(tokens_per_update / (gpus * update_freq)), update_freq


# --- command line ------------------------------------------------------------------------------

def parse_stages(text: str) -> set[str]:
    chosen = {s.strip() for s in text.split(",") if s.strip()}
    if "all" in chosen:
        return set(STAGES)
    bad = chosen - set(STAGES)
    if bad:
        raise NmtError(f"unknown stage(s) {', '.join(sorted(bad))}; choose from "
                       f"{', '.join(STAGES)} or all")
    return chosen


def main(spec: PairSpec, prog: str, argv: list[str] | None = None) -> None:
    default_models = ", ".join(f"{k}: {v.arch} {v.max_update} updates, average last "
                               f"{v.average_last}" for k, v in spec.models.items())
    ap = argparse.ArgumentParser(
        prog=prog, description=f"WMT14 {spec.name}: the paper's data, training, averaging, "
        f"decoding and scoring. Every stage is resumable; run it again after an interruption.",
        epilog=f"models: {default_models}")
    ap.add_argument("--work-dir", type=Path, default=Path(f"wmt14_{spec.src}_{spec.tgt}"),
                    help="where everything is written (default: %(default)s)")
    ap.add_argument("--data-dir", type=Path, default=os.environ.get("NMT_WMT14_DATA"),
                    help="folder holding the downloaded archives under their usual names "
                         "(training-parallel-europarl-v7.tgz, ...); nothing is downloaded then "
                         "(default: $NMT_WMT14_DATA)")
    ap.add_argument("--model", choices=sorted(spec.models), default="base")
    ap.add_argument("--stages", default="all",
                    help=f"comma-separated subset of {','.join(STAGES)} (default: all)")
    ap.add_argument("--gpus", type=int, default=1,
                    help="GPUs on this machine; >1 launches torchrun (default: 1)")
    ap.add_argument("--max-tokens", type=int, default=3125,
                    help="the most tokens per micro-batch and GPU; raise it on big-memory GPUs "
                         "to take fewer, larger micro-batches per update (the update stays "
                         "--tokens-per-update) (default: %(default)s, i.e. 25000 on 8 GPUs)")
    ap.add_argument("--tokens-per-update", type=int, default=25000,
                    help="the paper's batch, in nmt-train's --max-tokens units (padded "
                         "positions of each pair's longer side); --max-tokens and --update-freq "
                         "are derived from it (default: 25000)")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                    help="fp32 as the paper; bf16 is ~2x faster on A100/H100")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--train-args", default="", help="extra nmt-train options, quoted")
    ap.add_argument("--jobs", type=int, default=max(1, min(8, os.cpu_count() or 1)),
                    help="processes for text cleaning and nmt-preprocess")
    ap.add_argument("--force", action="store_true", help="redo stages even when complete")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the commands instead of running them (checks their options)")
    ap.add_argument("--tiny", action="store_true",
                    help="run the whole chain for real on the shipped fixtures with "
                         "transformer_tiny and a few updates (seconds, CPU)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)

    def body() -> None:
        setup_logging(args.verbose)
        stages = parse_stages(args.stages)
        if args.gpus < 1 or args.max_tokens < 1 or args.tokens_per_update < 1:
            raise NmtError("--gpus, --max-tokens and --tokens-per-update must be >= 1")
        r = Recipe(args.work_dir, dry_run=args.dry_run, force=args.force)
        data_dir = args.data_dir
        if args.tiny:
            if args.gpus > 1:
                raise NmtError("--tiny runs on one CPU; drop --gpus")
            data_dir = r.work_dir / "tiny-archives"
            if not args.dry_run and not (data_dir / ".complete").exists():
                build_tiny_archives(spec, data_dir)
                (data_dir / ".complete").touch()
        elif data_dir is not None and not Path(data_dir).is_dir():
            raise NmtError(f"--data-dir {data_dir}: no such folder")
        if "data" in stages:
            data_stage(r, spec, data_dir, args.jobs, args.tiny)
        model_stages(r, spec, args, stages)

    run_main(prog, body)
