#!/usr/bin/env python3
"""Multi30k English-German or English-French on a CPU: raw text to sacreBLEU.

The recipes (``--recipe``; README.md next to this file says why each value):

* ``small`` (M30K-small, the speed reference): transformer_small, 1,000 updates of 4096
  tokens, the paper's warm-up of 4000, about half an hour on 2 threads;
* ``converge``: transformer_small trained to convergence within 2 hours on 2 threads;
* ``literature``: Wu et al. (2021)'s text-only Transformer-tiny, scored as the Multi30k
  literature scores (lowercased multi-bleu) beside sacreBLEU; ``literature-rdrop`` adds R-Drop;
* ``base``: transformer_base's size, the model of the CTranslate2 decoding benchmark.

Then beam search on test_2016_flickr, or on the test sets ``--test-sets`` names (beam and
alpha tuned on val where the recipe has a grid, and with ``--tune-windows`` the number of
checkpoints averaged) -> sacreBLEU, chrF, tokenized BLEU and lowercased multi-bleu;
``--seeds N`` adds an ensemble of N runs beside the single model. Every stage is resumable;
``--dry-run`` prints the commands, ``--tiny`` runs them on the shipped fixtures in seconds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import fetch  # noqa: E402
from common.recipe import REPO_ROOT, Recipe, log, run_main, setup_logging  # noqa: E402
from nmt.errors import NmtError  # noqa: E402

STAGES = ("data", "preprocess", "train", "tune", "generate", "score")
RAW_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.gz"
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "examples" / "multi30k"

# Lines and sha256 of the decompressed files of multi30k/dataset data/task1/raw/, measured on
# a copy of that repository's files (the gzip files themselves are not hashed: gzip headers
# may differ between copies while the text is the same).
EXPECTED = {
    "train.en": (29000, "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6"),
    "train.de": (29000, "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72"),
    "val.en": (1014, "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227"),
    "val.de": (1014, "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660"),
    "test_2016_flickr.en": (1000, "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182"),
    "test_2016_flickr.de": (1000, "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16"),
    # The French files: sha256 of the decompressed release files as copied into this
    # project's data folder (the German sums above match that copy too).
    "train.fr": (29000, "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d"),
    "val.fr": (1014, "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc"),
    "test_2016_flickr.fr": (1000, "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6"),
}
# The release's other test sets (--test-sets), measured on a copy of multi30k/dataset at
# commit a3d2e0d.
EXPECTED.update({
    "test_2017_flickr.en": (1000, "ce1450ddc5ab0834502579d77a170849952e15a2938b34cc503bdc25ebb4fb98"),
    "test_2017_flickr.de": (1000, "c3078bc3b36808bf9d20eb2347ed6137016179ef59ec0d2b9b8ecc3fb2880081"),
    "test_2017_flickr.fr": (1000, "6f3764e31dac41e9455e612958bcfd4e877c5e15cd66df2c2b2be6d9bd83e5b6"),
    "test_2017_mscoco.en": (461, "43051fdfa86fd5395182e718a94ca67b1b227b9f7c79596ff0f6b813216981d2"),
    "test_2017_mscoco.de": (461, "58277df3c75f92f7145a11b910b553d1cf82c439249d4dc237c899609eafac22"),
    "test_2017_mscoco.fr": (461, "39cde3f43f32b0a6bf29ce4917a46329ff32e53070c2fac87506695a740ae0a0"),
    "test_2018_flickr.en": (1071, "4e585c2dd525911a6ea7730e9d0b516239af3f1b1ffae6a2130223cfb639f25e"),
    "test_2018_flickr.de": (1071, "39fcc8b3331d76fb42d648d019c6898b0d5e58baac87bc2a0bb93f44ec8db207"),
    "test_2018_flickr.fr": (1071, "234b4a887da0da4801a3e2c6f21336231ff7dd46daeb80cfa1b551c8bbb78239"),
})
TEST_SET = "test_2016_flickr"       # the test set of every figure in BENCHMARKS.md
RELEASE_TEST_SETS = (TEST_SET, "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")


@dataclass(frozen=True, kw_only=True)
class TrainingRecipe:
    """One training recipe: what differs between M30K-small and the converging run."""

    arch: str
    overrides: tuple[str, ...]
    max_update: int
    warmup: int
    lr_scale: float
    extra: tuple[str, ...]         # checkpointing and validation options
    average: bool                  # decode the averaged checkpoint
    vocab: int = 8000              # joined sentencepiece BPE vocabulary
    average_n: int = 5             # checkpoints in the average (--average-last)
    beam: int = 4                  # test decoding: the paper's beam 4, alpha 0.6
    lenpen: float = 0.6
    # (beam, alpha) pairs tried on the validation split by the tune stage; the best by the
    # literature's metric (lowercased multi-bleu) decodes the test set. Empty: beam, lenpen.
    tune: tuple[tuple[int, float], ...] = ()
    max_tokens: int = 4096         # nmt-train --max-tokens
    rdrop_alpha: float = 0.0       # nmt-train --rdrop-alpha (R-Drop; 0: off)


RECIPES = {
    "small": TrainingRecipe(arch="transformer_small", overrides=(), max_update=1000, warmup=4000,
                            lr_scale=1.0, extra=("--keep-last", "1"), average=False),
    # Why these values: examples/multi30k/README.md, "The converging recipe".
    "converge": TrainingRecipe(
        arch="transformer_small", overrides=("dropout=0.3",), max_update=3000, warmup=1000,
        lr_scale=1.5, extra=("--save-interval-updates", "250", "--keep-last", "6",
                             "--average-last", "5", "--valid-bleu"), average=True),
    # Wu et al. 2021's text-only Transformer-tiny on nmt: 4+4 layers, d_model 128, FFN 256,
    # 4 heads, dropout 0.3, peak learning rate 0.005 after 2,000 warm-up updates (eq. 5 peaks
    # at 128^-0.5 * 2000^-0.5 = 0.001976, x2.53), 8,000 updates of 4,096 tokens (theirs: of
    # 2 x 4,096, on two GPUs), all embeddings shared, a joined vocabulary of 10k,
    # the last 10 checkpoints averaged.
    # Why: examples/multi30k/README.md, "The literature recipe".
    "literature": TrainingRecipe(
        arch="transformer_tiny", overrides=("encoder_layers=4", "decoder_layers=4",
                                            "d_model=128", "d_ff=256", "heads=4",
                                            "dropout=0.3"),
        max_update=8000, warmup=2000, lr_scale=2.53,
        extra=("--save-interval-updates", "200", "--keep-last", "12", "--average-last", "10",
               "--valid-bleu", "--validate-interval-updates", "1000"),
        average=True, vocab=10000, average_n=10,
        tune=tuple((b, a) for b in (4, 5) for a in (0.6, 1.0, 1.5))),
    # transformer_base's size (d_model 512, 6+6 layers, 8 heads, FFN 2048) on Multi30k, sized
    # for a 2-core CPU, where an update of 2,500 tokens takes ~5 s: 600 updates (~4 epochs),
    # eq. 5 peaking at 0.001 after 200 updates (x0.32), the paper's dropout 0.1, and the layer
    # norm before each sublayer (pre_norm): with the paper's post-norm, 2,500-token batches
    # and a peak of 0.0011 after 400 updates, the loss rose from update 300 on (validation
    # 6.08 -> 6.91 at 400). It is the model of the transformer_base decoding benchmark against
    # CTranslate2 (BENCHMARKS.md), not a quality recipe: converge and literature are better
    # on this small corpus.
    "base": TrainingRecipe(arch="transformer_base", overrides=("pre_norm=true", "dropout=0.1"),
                           max_update=600, warmup=200, lr_scale=0.32,
                           extra=("--save-interval-updates", "100", "--keep-last", "2"),
                           average=False, max_tokens=2500),
}
# The literature grid with alpha 2.0 added: on the literature run, val rose with alpha up to
# the grid's end (1.5).
WIDE_TUNE = tuple((b, a) for b in (4, 5) for a in (0.6, 1.0, 1.5, 2.0))
# R-Drop (Liang et al. 2021) on the literature recipe: each batch twice through the model with
# different dropout masks, alpha 5 (the paper's for its small-data IWSLT translation tasks)
# times the symmetric KL divergence of the two passes added to the loss. To keep the update's
# compute and the 2-hour budget, the batch holds 2,048 tokens, each seen twice (4,096 rows, as
# the plain recipe's), for the plain recipe's 8,000 updates and schedule: 1.1-1.26 updates/s
# on 2 threads of an AMD EPYC, about 1.9 hours. Measured once: test multi-bleu 37.54, 2.63
# below the plain recipe (examples/multi30k/README.md, "Variants").
RECIPES["literature-rdrop"] = replace(RECIPES["literature"], rdrop_alpha=5.0, max_tokens=2048,
                                      tune=WIDE_TUNE)


def get_raw(name: str, dest: Path, source_dir: Path | None, verify: bool) -> None:
    """Copy NAME (or decompress NAME.gz) from ``source_dir``, or download NAME.gz; verify."""
    tmp = dest.with_name(dest.name + ".tmp")
    if source_dir is not None:
        plain, gz = source_dir / name, source_dir / f"{name}.gz"
        if plain.is_file():
            shutil.copyfile(plain, tmp)
        elif gz.is_file():
            _gunzip(gz, tmp)
        else:
            raise NmtError(f"{source_dir} has neither {name} nor {name}.gz (the Multi30k raw "
                           f"files: train, val and each test set, .en and the target)")
    elif name.split(".")[0] not in ("train", "val", *RELEASE_TEST_SETS):
        raise NmtError(f"{name} is not a file of the Multi30k release: give MULTI30K_DIR, the "
                       f"folder that holds it")
    else:
        gz = dest.with_name(f"{name}.gz")
        fetch.download(RAW_URL.format(name=name), gz)
        _gunzip(gz, tmp)
        gz.unlink()
    if verify:
        lines, sha = EXPECTED[name]
        got_lines, got_sha = fetch.count_lines(tmp), fetch.file_digest(tmp, "sha256")
        if (got_lines, got_sha) != (lines, sha):
            tmp.unlink()
            raise NmtError(f"{name}: {got_lines} lines, sha256 {got_sha[:12]}..., expected "
                           f"{lines} lines, sha256 {sha[:12]}... (a different or damaged copy; "
                           f"use --no-verify to accept it)")
    os.replace(tmp, dest)


def _gunzip(src: Path, dest: Path) -> None:
    try:
        with gzip.open(src, "rb") as f, open(dest, "wb") as out:
            shutil.copyfileobj(f, out, fetch.CHUNK)
    except (OSError, EOFError) as e:
        raise NmtError(f"{src}: corrupt or truncated gzip file ({e})") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="multi30k/run.py",
        description="Multi30k en-de or en-fr on a CPU: subwords, training, beam search, "
                    "sacreBLEU (see --recipe). Resumable: run it again after an interruption.")
    ap.add_argument("multi30k_dir", nargs="?", type=Path,
                    default=os.environ.get("NMT_MULTI30K_DIR") or None,   # (empty: unset)
                    help="folder with the raw Multi30k files train/val/test_2016_flickr "
                         "(and the other --test-sets) .en/.de/.fr (or their .gz); downloaded "
                         "from github.com/multi30k/dataset when omitted (default: "
                         "$NMT_MULTI30K_DIR)")
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="small",
                    help="small: the 1000-update speed reference (M30K-small); converge: "
                         "transformer_small trained to convergence in under 2 hours on 2 "
                         "threads; literature: Wu et al. 2021's Transformer-tiny (about 1.4 "
                         "hours), literature-rdrop: with R-Drop; base: transformer_base's size, "
                         "for the decoding benchmark (default: %(default)s)")
    ap.add_argument("--target", "-t", choices=("de", "fr"), default="de",
                    help="target language (default: %(default)s)")
    ap.add_argument("--work-dir", type=Path, default=None,
                    help="where everything is written (default: multi30k_en_TARGET)")
    ap.add_argument("--stages", default="all", help=f"comma-separated subset of {','.join(STAGES)}")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (default: 2)")
    ap.add_argument("--max-update", type=int, default=None,
                    help="change the recipe's number of updates (small: 1000, converge: 3000)")
    ap.add_argument("--seeds", type=int, default=1,
                    help="train the recipe N times with seeds 1..N, one after another (seed "
                         "1's run is the single model), and report their ensemble beside the "
                         "single model, its decoding tuned on val (default: 1)")
    ap.add_argument("--test-sets", default=TEST_SET, metavar="NAME[,NAME...]",
                    help="the test sets to translate and score, once each, with the decoding "
                         "chosen on val: the release's test_2016_flickr, "
                         "test_2017_flickr, test_2017_mscoco and test_2018_flickr (downloaded "
                         "when MULTI30K_DIR is not given), or NAME.en and NAME.TARGET of your "
                         "own in MULTI30K_DIR (default: %(default)s)")
    ap.add_argument("--tune-beams", type=grid_values("beam", int), default=None,
                    metavar="B[,B...]",
                    help="the beams the tune stage tries on val (default: the recipe's; "
                         "with --tune-alphas alone, the recipe's beams)")
    ap.add_argument("--tune-alphas", type=grid_values("lenpen", float), default=None,
                    metavar="A[,A...]",
                    help="the length-penalty alphas the tune stage tries on val, each with "
                         "each beam (default: the recipe's); a recipe without a grid tunes "
                         "when either is given")
    ap.add_argument("--tune-windows", type=window_values, default=None, metavar="N[,N...]",
                    help="the averages the tune stage chooses from on val, each tried with "
                         "each beam and alpha: N, the last N checkpoints the run keeps "
                         "(at most --keep-last: literature 12, converge 6, --tiny 3; default: "
                         "the recipe's own average alone); a recipe without a grid tries them "
                         "with its own beam and alpha")
    ap.add_argument("--keep-last", type=int, default=None, metavar="K",
                    help="the last K checkpoints the training run keeps, for --tune-windows "
                         "up to K (default: the recipe's; literature 12, converge 6); at "
                         "least the recipe's average; the model trained is the same")
    ap.add_argument("--vocab-size", type=int, default=None, metavar="N",
                    help="the joined BPE vocabulary (default: the recipe's; literature 10000, "
                         "others 8000); another size trains into checkpoints-RECIPE-vocabN "
                         "and reports in results-RECIPE-vocabN")
    ap.add_argument("--label-smoothing", type=float, default=None, metavar="E",
                    help="the label smoothing epsilon of training (default: the recipe's, the "
                         "paper's 0.1); another value trains into checkpoints-RECIPE-lsE and "
                         "reports in results-RECIPE-lsE")
    ap.add_argument("--no-verify", action="store_true",
                    help="accept Multi30k files whose line counts/sha256 differ from the release")
    ap.add_argument("--force", action="store_true", help="redo stages even when complete")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the commands instead of running them (checks their options)")
    ap.add_argument("--tiny", action="store_true",
                    help="the whole chain for real on the shipped fixtures, transformer_tiny, "
                         "a few updates (seconds)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.work_dir is None:
        args.work_dir = Path(f"multi30k_en_{args.target}")
    return args


def comma_values(text: str, kind, expected: str) -> tuple:
    """'4,5,4' -> (4, 5), each converted by ``kind``, in order, once each; an argparse error
    naming ``expected`` ("numbers") when one does not convert."""
    try:
        values = tuple(kind(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {expected}, got "
                                         f"{text!r}") from None
    return tuple(dict.fromkeys(values))


def grid_values(field: str, kind):
    """argparse type: '4,5,8' -> (4, 5, 8), each a value nmt-generate takes for the
    SearchConfig ``field`` (beam or lenpen), checked by SearchConfig itself."""
    from nmt.search.config import LENPEN_MAX, SearchConfig

    what = "beam (>= 1)" if field == "beam" else f"length-penalty alpha (0-{LENPEN_MAX:g})"

    def parse(text: str) -> tuple:
        values = comma_values(text, kind, "numbers")
        for v in values:
            try:
                SearchConfig(**{field: v})
            except NmtError:
                raise argparse.ArgumentTypeError(f"{v} is not a {what}") from None
        return values
    return parse


def window_values(text: str) -> tuple[int, ...]:
    """argparse type: '5,10,20' -> (5, 10, 20), each >= 1."""
    values = comma_values(text, int, "whole numbers")
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"{min(values)} is not a number of checkpoints (>= 1)")
    return values


def tune_grid(rec: TrainingRecipe, beams: tuple[int, ...] | None,
              alphas: tuple[float, ...] | None,
              own: tuple[tuple[int, float], ...] | None = None) -> tuple[tuple[int, float], ...]:
    """The recipe's (beam, alpha) grid (``own``: another, e.g. --tiny's), or the one
    --tune-beams/--tune-alphas give: each beam with each alpha, what is not given taken from
    that grid, else from the recipe's decoding pair."""
    own = rec.tune if own is None else own
    if beams is None and alphas is None:
        return own
    own_beams = tuple(dict.fromkeys(b for b, _ in own)) or (rec.beam,)
    own_alphas = tuple(dict.fromkeys(a for _, a in own)) or (rec.lenpen,)
    return tuple((b, a) for b in beams or own_beams for a in alphas or own_alphas)


def average_windows(rec: TrainingRecipe, given: tuple[int, ...] | None,
                    tiny: bool) -> tuple[int, ...]:
    """The windows of the averages the tune stage tries (--tune-windows; none: the recipe's
    own average alone, untuned); refused before anything runs for a recipe that averages
    nothing, or larger than the checkpoints a run keeps."""
    if given is None:
        return ()
    if not rec.average:
        raise NmtError("--tune-windows: this recipe averages no checkpoints (converge and "
                       "the literature recipes do)")
    keep = TINY_KEEP if tiny else kept_checkpoints(rec)
    if max(given) > keep:
        raise NmtError(f"--tune-windows: the run keeps its last {keep} checkpoints, fewer "
                       f"than {max(given)}" + ("" if tiny else " (--keep-last keeps more)"))
    return given


def kept_checkpoints(rec: TrainingRecipe) -> int:
    """The --keep-last of a recipe's training command."""
    return int(rec.extra[rec.extra.index("--keep-last") + 1])


def keeping(rec: TrainingRecipe, keep: int | None) -> TrainingRecipe:
    """``rec`` with its training run keeping the last ``keep`` checkpoints (run.py
    --keep-last; None: the recipe's own), refused below the checkpoints its average takes."""
    if keep is None:
        return rec
    least = rec.average_n if rec.average else 1
    if keep < least:
        raise NmtError(f"--keep-last {keep}: the recipe averages its last {least} checkpoints"
                       if rec.average else f"--keep-last must be >= 1, got {keep}")
    i = rec.extra.index("--keep-last") + 1
    return replace(rec, extra=(*rec.extra[:i], str(keep), *rec.extra[i + 1:]))


def own_smoothing(rec: TrainingRecipe) -> float:
    """The label smoothing epsilon a recipe trains with: its override, or its architecture's."""
    from nmt.registry import get_arch

    given = [o.split("=", 1)[1] for o in rec.overrides if o.startswith("label_smoothing=")]
    return float(given[-1]) if given else get_arch(rec.arch).label_smoothing


def smoothing(rec: TrainingRecipe, eps: float | None) -> TrainingRecipe:
    """``rec`` trained with label smoothing ``eps`` (run.py --label-smoothing; None or the
    recipe's own: the recipe itself), refused outside [0, 1) as nmt-train refuses it."""
    if eps is None or eps == own_smoothing(rec):
        return rec
    if not 0.0 <= eps < 1.0:
        raise NmtError(f"--label-smoothing must be in [0, 1), got {eps:g}")
    kept = tuple(o for o in rec.overrides if not o.startswith("label_smoothing="))
    return replace(rec, overrides=(*kept, f"label_smoothing={eps:g}"))


def at_the_top(grid, pair: tuple[int, float]) -> bool:
    """Whether a tuned pair's alpha is the largest of several the grid tried: validation may
    still rise past it."""
    alphas = {a for _, a in grid}
    return len(alphas) > 1 and pair[1] == max(alphas)


def split_dir(raw: Path, split: str) -> Path:
    """Where the files of SPLIT go: train, val and test_2016_flickr in RAW (which
    nmt-preprocess reads), the other test sets beside it in test-sets/, so that adding one to
    a finished work folder leaves RAW, and with it every step that reads it, as it was."""
    return raw if split in ("train", "val", TEST_SET) else raw.parent / "test-sets"


def get_data(r: Recipe, raw: Path, source, tgt: str, test_sets: list[str], tiny: bool,
             no_verify: bool) -> None:
    # test_2016_flickr always: nmt-preprocess binarizes it as the data directory's test split
    splits = list(dict.fromkeys(["train", "val", TEST_SET, *test_sets]))
    files = {f"{s}.{lang}": split_dir(raw, s) / f"{s}.{lang}"
             for s in splits for lang in ("en", tgt)}
    for name, dest in files.items():
        where = f"from {source}" if source else f"from {RAW_URL.format(name=name)}"
        # a file of the release is checked (lines and sha256); a test set of your own is not
        verify = name in EXPECTED and not (tiny or no_verify)

        def get(name=name, dest=dest, verify=verify) -> None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            get_raw(name, dest, Path(source) if source else None, verify)
        r.step(f"data-{name}", [dest], get, python=True,
               params={"source": str(source or ""), "verify": verify},
               describe=f"get {name} {where}" + (", check lines and sha256" if verify else ""))
    if not r.dry_run:
        fetch.check_line_counts(files, parallel=[(f"{s}.en", f"{s}.{tgt}") for s in splits])


def test_set_names(value: str, have_folder: bool) -> list[str]:
    """--test-sets: the names, each once, in the order given; train and val are refused (the
    model learns from one and is tuned on the other), and so is a set of one's own when the
    files are to be downloaded (``have_folder`` False)."""
    names = list(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    if not names:
        raise NmtError("--test-sets needs at least one name")
    for n in names:
        if n in ("train", "val"):
            raise NmtError(f"--test-sets: {n} is not a test set (the model is trained on "
                           f"train and its beam and alpha are chosen on val)")
        if not n.replace("_", "").replace("-", "").isalnum():
            raise NmtError(f"--test-sets: {n!r} is not a file name stem such as "
                           f"test_2017_flickr (letters, digits, _ and -)")
        if n not in RELEASE_TEST_SETS and not have_folder:
            raise NmtError(f"--test-sets: {n} is not a test set of the Multi30k release "
                           f"({', '.join(RELEASE_TEST_SETS)}): give MULTI30K_DIR, the folder "
                           f"that holds {n}.en")
    return names


def train_command(args, data_bin: Path, save_dir: Path, threads: int, rec: TrainingRecipe,
                  max_update: int | None, seed: int = 1) -> list:
    """The nmt-train command of recipe ``rec`` with ``max_update`` updates (None: the recipe's)
    and ``seed`` (1, nmt-train's default, is not written: a run started before --seeds
    existed is the same run)."""
    seeded = ["--seed", seed] if seed != 1 else []
    if args.tiny:
        # a checkpoint every 2 updates where the tune stage tries averages of the last ones
        keep = (["--save-interval-updates", 2, "--keep-last", TINY_KEEP]
                if args.tune_windows else ["--keep-last", 1])
        return ["nmt-train", data_bin, "--arch", "transformer_tiny", "--max-tokens", 512,
                "--max-update", max_update or 6, "--warmup", 4, "--save-dir", save_dir,
                "--device", "cpu", "--threads", threads, *keep, *seeded]
    overrides = [x for o in rec.overrides for x in ("--override", o)]
    return ["nmt-train", data_bin, "--arch", rec.arch, *overrides, "--max-tokens", rec.max_tokens,
            "--max-update", max_update or rec.max_update, "--warmup", rec.warmup,
            *(["--lr-scale", rec.lr_scale] if rec.lr_scale != 1.0 else []),
            *(["--rdrop-alpha", rec.rdrop_alpha] if rec.rdrop_alpha else []),
            "--save-dir", save_dir, *rec.extra, "--device", "cpu", "--threads", threads,
            *seeded]


# --tiny tries two settings, so that the tune stage runs for real in seconds.
TINY_TUNE = ((1, 0.6), (2, 1.0))
TINY_KEEP = 3        # checkpoints --tiny keeps where it tries averages


@dataclass(frozen=True)
class Choice:
    """What the tune stage chose on val: an average's window (None: the decoding's own
    models), a beam and an alpha."""

    window: int | None
    beam: int
    alpha: float


def tune(r: Recipe, name: str, grid: tuple[tuple[int, float], ...], default: Choice,
         d: Decoding, raw: Path, tgt: str, threads: int) -> Choice:
    """Decode the validation split with each window of ``d`` (none: its models; several
    models: their ensemble) and each (beam, alpha) of ``grid``, score it as the literature
    does (lowercased, Moses-tokenized multi-bleu) and return the best (ties: the first;
    ``default`` in a dry run); the table goes to RESULTS/tuning.json. The test set is not
    looked at."""
    results = d.results
    out = results / "tuning.json"
    candidates = list(d.windows.items()) or [(None, d.models)]

    def action() -> None:
        if not r.dry_run:
            results.mkdir(parents=True, exist_ok=True)
        rows = []
        for window, models in candidates:
            for beam, alpha in grid:
                avg = "" if window is None else f"avg{window}."
                hyp = results / f"val.{avg}beam{beam}.alpha{alpha}.hyp.{tgt}"
                score = hyp.with_name(hyp.name + ".multi-bleu.json")
                r.sh(["nmt-generate", *models, "--input", raw / "val.en", "--output", hyp,
                      "--beam", beam, "--lenpen", alpha, "--max-len-a", 1, "--max-len-b", 50,
                      "--device", "cpu", "--threads", threads, "--overwrite"])
                r.sh(["nmt-score", "--hyp", hyp, "--ref", raw / f"val.{tgt}", "--metric",
                      "multi-bleu", "--lowercase", "--lang", tgt, "--json"], stdout=score)
                if not r.dry_run:
                    rows.append({**({} if window is None else {"window": window}),
                                 "beam": beam, "alpha": alpha,
                                 "multi_bleu": json.loads(score.read_text())["score"]})
        if not r.dry_run:
            best = max(rows, key=lambda x: x["multi_bleu"])   # max keeps the first of ties
            out.write_text(json.dumps({"rows": rows, "best": best}, indent=2) + "\n")
            print("".join(f"valid {describe_row(x)}: multi-bleu {x['multi_bleu']:.2f}\n"
                          for x in rows), end="")
    what = "the average's window, " if d.windows else ""
    r.step(name, [out], action, inputs=[m for _, ms in candidates for m in ms],
           params={"grid": [list(x) for x in grid],
                   **({"windows": list(d.windows)} if d.windows else {})},
           describe=f"{what}beam and alpha by lowercased multi-bleu on the validation split")
    if r.dry_run or not out.exists():
        return default
    return tuned_choice(out)


def describe_row(row: dict) -> str:
    """'window 20 beam 4 alpha 0.6' (a row or best of tuning.json; no window: none tuned)."""
    window = f"window {row['window']} " if "window" in row else ""
    return f"{window}beam {row['beam']} alpha {row['alpha']}"


def tuned_choice(tuning: Path) -> Choice:
    """What a tune stage chose, from its RESULTS/tuning.json."""
    best = json.loads(tuning.read_text())["best"]
    return Choice(best.get("window"), int(best["beam"]), float(best["alpha"]))


def windowed(save_dir: Path, window: int) -> Path:
    """The average of the last ``window`` checkpoints of SAVE_DIR (nmt-train --average-last's
    name for it)."""
    return save_dir / f"checkpoint_avg{window}.pt"


def write_average(r: Recipe, save_dir: Path, window: int, seed_step: str) -> None:
    """A step: SAVE_DIR/checkpoint_avgN.pt, the average of its last N numbered checkpoints
    (refused when fewer are kept), written under the directory's writer lock."""
    out = windowed(save_dir, window)

    def action() -> None:
        from nmt.lock import LOCK_NAME, WriterLock
        from nmt.training.average import average_to_file
        from nmt.training.savedir import numbered_checkpoints

        with WriterLock(save_dir / LOCK_NAME, save_dir, "multi30k/run.py",
                        "wait for the training run to finish"):
            kept = numbered_checkpoints(save_dir)
            if len(kept) < window:
                # e.g. a folder trained before its recipe kept this many
                raise NmtError(f"{save_dir} holds {len(kept)} numbered checkpoints, fewer "
                               f"than the {window} of an average the tune stage tries: give "
                               f"--tune-windows with at most {len(kept)}")
            average_to_file(kept[-window:], out)
    r.step(f"average-{save_dir.name}-{window}", [out], action, python=True,
           inputs=[save_dir / "checkpoint_last.pt"], params={"window": window},
           describe=f"average the last {window} checkpoints of {save_dir.name} ({seed_step})")


def final_model(save_dir: Path, rec: TrainingRecipe, tiny: bool) -> Path:
    """The checkpoint a recipe's run decodes with: its average, or the last one."""
    return (windowed(save_dir, rec.average_n) if rec.average and not tiny
            else save_dir / "checkpoint_last.pt")


def drop_partial(output: Path) -> None:
    """For Recipe.step(on_stale=...) of a decoding step whose command changed: remove what an
    interrupted run of the old command left beside OUTPUT (nmt-generate refuses to resume it
    with another command), so that the new one starts afresh."""
    from nmt.batch.resumable import JOURNAL, PARTIAL

    for suffix in (JOURNAL, PARTIAL):
        output.with_name(output.name + suffix).unlink(missing_ok=True)


def not_past(save_dir: Path, max_update: int):
    """For Recipe.step(on_stale=...): a changed training command resumes the run in SAVE_DIR
    (a larger --max-update continues it exactly); refuse when that run is already past
    ``max_update``: nmt-train would train nothing, and its longer run's results would be
    reported as this command's."""
    def refuse() -> None:
        last = save_dir / "checkpoint_last.pt"
        if not last.exists():
            return
        from nmt.checkpoint import load_checkpoint

        done = load_checkpoint(last, mmap=True).get("progress", {}).get("update", 0)
        if done > max_update:
            raise NmtError(f"{save_dir} holds a run at update {done}, past --max-update "
                           f"{max_update}; delete that folder to train {max_update} updates, "
                           f"or use another --work-dir")
    return refuse


@dataclass(frozen=True)
class Decoding:
    """What the tune, generate and score stages decode with, and under which names."""

    name: str                 # step names: generate-NAME, score-NAME, score-multi-bleu-NAME
    tune_name: str
    models: list[Path]        # one checkpoint, or several decoded as an ensemble
    results: Path
    # the averages the tune stage tries instead, by window (each: one per model); empty: none
    windows: dict[int, list[Path]] = field(default_factory=dict)


def decode_and_score(r: Recipe, stages: set[str], d: Decoding, grid, default: tuple[int, float],
                     raw: Path, tgt: str, test_sets: list[str], threads: int) -> None:
    """Tune the average's window (when ``d`` has windows), beam and alpha on val (when the
    recipe has a grid), translate each test set once with the choice, score it; print the
    scores."""
    choice = Choice(None, *default)
    if "tune" in stages and grid:
        choice = tune(r, d.tune_name, grid, choice, d, raw, tgt, threads)
        if not r.dry_run and at_the_top(grid, (choice.beam, choice.alpha)):
            log.warning("alpha %g, chosen on val, is the largest the tune grid tries: val may "
                        "rise past it (try --tune-alphas with larger ones)", choice.alpha)
    elif grid and (d.results / "tuning.json").exists() and not r.dry_run:
        # --stages without tune: what an earlier tune stage chose, not the defaults
        choice = tuned_choice(d.results / "tuning.json")
        log.info("%s: chosen on val by the tune stage (%s)",
                 describe_row(vars(choice)) if choice.window else
                 f"beam {choice.beam}, alpha {choice.alpha:g}", d.results / "tuning.json")
    if choice.window is not None:
        if choice.window not in d.windows:
            raise NmtError(f"{d.results / 'tuning.json'} chose the average of the last "
                           f"{choice.window} checkpoints, which the tune stage no longer tries: "
                           f"run the tune stage again")
        d = replace(d, models=d.windows[choice.window])
    if len(d.models) > 1 and "score" in stages and not r.dry_run:
        print(f"ensemble of {len(d.models)} seeds:")
    for test_set in test_sets:
        decode_test_set(r, stages, d, test_set, (choice.beam, choice.alpha), raw, tgt, threads)


def decode_test_set(r: Recipe, stages: set[str], d: Decoding, test_set: str,
                    pair: tuple[int, float], raw: Path, tgt: str, threads: int) -> None:
    """Translate TEST_SET once with ``pair`` (beam, alpha) and score it: sacreBLEU, chrF and
    tokenized BLEU, and the literature's lowercased multi-bleu. test_2016_flickr keeps the
    names it had before --test-sets existed (scores.txt, generate-NAME), so that a finished
    work folder stays finished; another set's files and steps carry its name."""
    results, (beam, lenpen) = d.results, pair
    hyp = results / f"{test_set}.hyp.{tgt}"
    tag = "" if test_set == TEST_SET else f".{test_set}"
    step = d.name if test_set == TEST_SET else f"{d.name}-{test_set}"
    scores, lit = results / f"scores{tag}.txt", results / f"scores-multi-bleu{tag}.txt"
    if "generate" in stages:
        src = split_dir(raw, test_set) / f"{test_set}.en"
        cmd = ["nmt-generate", *d.models, "--input", src, "--output", hyp, "--beam", beam,
               "--lenpen", lenpen, "--max-len-a", 1, "--max-len-b", 50, "--device", "cpu",
               "--threads", threads]

        def generate() -> None:
            if not r.dry_run:
                results.mkdir(parents=True, exist_ok=True)
            r.sh(cmd)
        what = f"an ensemble of {len(d.models)}, " if len(d.models) > 1 else ""
        r.step(f"generate-{step}", [hyp], generate, inputs=d.models, params={"cmd": cmd},
               on_stale=lambda: drop_partial(hyp),
               describe=f"{test_set}: {what}beam {beam}, alpha {lenpen}, max length source + 50")
    if "score" in stages:
        ref = split_dir(raw, test_set) / f"{test_set}.{tgt}"
        cmd = ["nmt-score", "--hyp", hyp, "--ref", ref, "--metric", "bleu,chrf,tok-bleu",
               "--lang", tgt]
        r.step(f"score-{step}", [scores], lambda: r.sh(cmd, stdout=scores), inputs=[hyp],
               params={"cmd": cmd}, describe=f"sacreBLEU, chrF, tokenized BLEU on {test_set}")
        # The literature's footing (Wu et al. 2021 and the Multi30k papers): lowercased,
        # punctuation-normalized, Moses-tokenized multi-bleu.
        lit_cmd = ["nmt-score", "--hyp", hyp, "--ref", ref, "--metric", "multi-bleu",
                   "--lowercase", "--lang", tgt]
        r.step(f"score-multi-bleu-{step}", [lit], lambda: r.sh(lit_cmd, stdout=lit),
               inputs=[hyp], params={"cmd": lit_cmd},
               describe=f"lowercased, Moses-tokenized multi-bleu on {test_set}")
        if not r.dry_run:
            print(f"{test_set}:")
            print(scores.read_text(encoding="utf-8"), end="")
            print(lit.read_text(encoding="utf-8"), end="")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    def body() -> None:
        setup_logging(args.verbose)
        stages = set(STAGES) if args.stages == "all" else {s for s in args.stages.split(",") if s}
        if stages - set(STAGES):
            raise NmtError(f"unknown stage(s) {', '.join(sorted(stages - set(STAGES)))}; "
                           f"choose from {', '.join(STAGES)} or all")
        if args.threads < 1 or args.seeds < 1 or (args.max_update is not None
                                                  and args.max_update < 1):
            raise NmtError("--threads, --seeds and --max-update must be >= 1")
        source = FIXTURES if args.tiny else args.multi30k_dir
        test_sets = test_set_names(args.test_sets, have_folder=source is not None)
        if source is not None and not Path(source).is_dir():
            raise NmtError(f"{source}: no such folder")
        threads = 1 if args.tiny else args.threads
        tgt = args.target
        if args.tiny and args.keep_last is not None:
            raise NmtError("--keep-last does not go with --tiny, which keeps its own "
                           f"{TINY_KEEP} checkpoints where --tune-windows is given")
        for flag, value in (("--vocab-size", args.vocab_size),
                            ("--label-smoothing", args.label_smoothing)):
            if args.tiny and value is not None:
                raise NmtError(f"{flag} does not go with --tiny")
        if args.vocab_size is not None and args.vocab_size < 100:
            raise NmtError(f"--vocab-size must be >= 100, got {args.vocab_size}")
        chosen = RECIPES[args.recipe]
        rec = chosen if args.tiny else smoothing(keeping(chosen, args.keep_last),
                                                 args.label_smoothing)
        eps = own_smoothing(rec)
        windows = average_windows(rec, args.tune_windows, args.tiny)
        r = Recipe(args.work_dir, dry_run=args.dry_run, force=args.force,
                   env={"OMP_NUM_THREADS": str(threads)})
        vocab = 250 if args.tiny else args.vocab_size or rec.vocab
        raw = r.work_dir / "raw"
        data_bin = r.work_dir / ("data-bin" if vocab in (250, 8000) else f"data-bin-{vocab}")
        run = "tiny" if args.tiny else (args.recipe
                                        + (f"-vocab{vocab}" if vocab != rec.vocab else "")
                                        + (f"-ls{eps:g}" if eps != own_smoothing(chosen)
                                           else ""))
        # seed k's run; seed 1's is the single-model run, in the folder it always had
        save_dirs = [r.work_dir / (f"checkpoints-{run}" if k == 1
                                   else f"checkpoints-{run}-seed{k}")
                     for k in range(1, args.seeds + 1)]
        models = [final_model(d, rec, args.tiny) for d in save_dirs]

        if "data" in stages:
            get_data(r, raw, source, tgt, test_sets, args.tiny, args.no_verify)
        if "preprocess" in stages:
            cmd = ["nmt-preprocess", "-s", "en", "-t", tgt, "--trainpref", raw / "train",
                   "--validpref", raw / "val", "--testpref", raw / "test_2016_flickr",
                   "--destdir", data_bin, "--overwrite", "--subword", "bpe",
                   "--joined-dictionary", "--vocab-size", vocab, "--workers", threads]
            r.step("preprocess", [data_bin], lambda: r.sh(cmd), inputs=[raw],
                   params={"cmd": cmd}, describe="joined sentencepiece BPE, binarize")

        def train(seed: int) -> None:
            save_dir, model = save_dirs[seed - 1], models[seed - 1]
            cmd = train_command(args, data_bin, save_dir, threads, rec,
                                args.max_update, seed)
            r.step(f"train-{run}" + (f"-seed{seed}" if seed > 1 else ""), [model],
                   lambda: r.sh(cmd), inputs=[data_bin], params={"cmd": cmd},
                   on_stale=not_past(save_dir,
                                     args.max_update or (6 if args.tiny else rec.max_update)),
                   describe=f"train (seed {seed}); resumes from checkpoint_last.pt after an "
                            f"interruption")

        grid = tune_grid(rec, args.tune_beams, args.tune_alphas,
                         TINY_TUNE if args.tiny else None)
        grid = grid or (((rec.beam, rec.lenpen),) if windows else ())

        def averages(seeds: range) -> dict[int, list[Path]]:
            """Each window's averages of the seeds' runs, written by a step where training
            did not write them."""
            if "tune" in stages:
                for seed in seeds:
                    for w in windows:
                        if windowed(save_dirs[seed - 1], w) != models[seed - 1]:
                            write_average(r, save_dirs[seed - 1], w, f"seed {seed}")
            return {w: [windowed(save_dirs[k - 1], w) for k in seeds] for w in windows}

        if "train" in stages:
            train(1)
        single = Decoding(name=run, tune_name=f"tune-{save_dirs[0].name}", models=models[:1],
                          results=r.work_dir / f"results-{run}", windows=averages(range(1, 2)))
        decode_and_score(r, stages, single, grid, (rec.beam, rec.lenpen), raw, tgt,
                         test_sets, threads)
        if args.seeds > 1:
            # The ensemble: a second result after the single model's, never instead of it.
            if "train" in stages:
                for seed in range(2, args.seeds + 1):
                    train(seed)
            name = f"{run}-ensemble{args.seeds}"
            ensemble = Decoding(name=name, tune_name=f"tune-{name}", models=models,
                                results=r.work_dir / f"results-{name}",
                                windows=averages(range(1, args.seeds + 1)))
            decode_and_score(r, stages, ensemble, grid, (rec.beam, rec.lenpen), raw, tgt,
                             test_sets, threads)

    run_main("multi30k/run.py", body)


if __name__ == "__main__":
    main()
