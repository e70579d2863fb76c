"""``TrainConfig``: every option of a training run that is not the model, written once.

Each field carries its default and its help (``nmt.fields.option``); ``nmt-train`` builds its
command-line options from these fields, and the config is saved in every checkpoint.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from nmt.config import CHOICES
from nmt.errors import UsageError
from nmt.metrics.table import VALIDATION_METRICS as METRICS
from nmt.fields import option
from nmt.search.config import PRESET_FIELDS, SearchConfig

OPTIMIZERS = ("adam", "adamw")
SCHEDULES = ("noam", "inverse_sqrt", "cosine")
DEFAULT_ARCH = "transformer_base"   # --arch when neither it nor --init-from is given


def parse_duration(text: str | float | None) -> float:
    """'3600', '90s', '45m', '10h', '1d' or 'HH:MM:SS' -> seconds."""
    if text is None or text == "":
        return 0.0
    if isinstance(text, (int, float)):
        return float(text)
    s = text.strip().lower()
    bad = UsageError(f"--max-time '{text}': expected e.g. 90m, 10h or HH:MM:SS")
    if ":" in s:
        try:
            vals = [float(p) for p in s.split(":")]
        except ValueError:
            raise bad from None
        secs = 0.0
        for v in vals:
            secs = secs * 60 + v
        return secs
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([smhd]?)", s)
    if not m:
        raise bad
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


# Options whose "not given" (None) stands for a value: the run is the one that value gives
# (a resumed run compares them so: checkpoints before they could be unset hold the value).
UNSET_MEANS = {"lr_scale": 1.0}


@dataclass
class TrainConfig:
    """Everything about a run that is not the model architecture (saved in checkpoints)."""

    # --- model -----------------------------------------------------------------------------
    arch: str | None = option(None, "Registered architecture (see --list-archs) [default: "
                              f"{DEFAULT_ARCH}; with --init-from, the checkpoint's].",
                              short="-a")
    overrides: dict = option(None, "Change a model hyperparameter, e.g. --override dropout=0.3 "
                             "--override layers=4 (repeatable; unknown keys are an error).",
                             cli=False)
    user_dir: str | None = option(
        None, "Import this folder (a package with an __init__.py) or .py file first: it "
        "registers architectures with nmt.register_arch, e.g. for --arch my_arch. Installed "
        "packages can do the same through the 'nmt.plugins' entry-point group.", metavar="DIR")
    init_from: str | None = option(
        None, "Start from this checkpoint's weights (fine-tuning, domain adaptation): the "
        "model configuration comes from it (only dropout, attention_dropout, "
        "activation_dropout and label_smoothing may be changed with --override); the "
        "optimizer, learning-rate schedule (--warmup, --lr-scale) and data position start afresh. "
        "DATA_DIR must have the checkpoint's vocabularies (nmt-preprocess --reuse-vocab). "
        "Ignored when the run resumes from SAVE_DIR.", metavar="CKPT")
    share_all_embeddings: bool | None = option(
        None, "Tie source/target embeddings and the output projection [default: when the "
        "vocabulary is joined].", negatable=True)
    # --- batches and optimisation ----------------------------------------------------------
    max_tokens: int = option(4096, "Tokens per micro-batch and rank (padded, the longer side; "
                             "the paper used about 25000 source + 25000 target tokens per step).")
    max_sentences: int | None = option(None, "Also cap sentences per batch.")
    update_freq: int = option(1, "Accumulate gradients over N micro-batches per update (a "
                              "bigger batch on fewer devices).")
    lr_scale: float | None = option(None, "Multiplies the learning rate of eq. 5 (--lr-scheduler "
                                    "noam only; not with --lr) [default: 1].",
                                    show_default=False)
    warmup: int = option(4000, "warmup_steps of eq. 5.")
    lr_period: int = option(0, "After the warm-up, run the learning rate in cosine cycles of N "
                            "updates (warm restarts): each cycle starts at eq. 5's rate and "
                            "anneals to near zero, so the checkpoint at a cycle's end is an "
                            "annealed snapshot; make --save-interval-updates divide N and "
                            "--warmup (0: eq. 5 alone, as the paper).", metavar="N")
    lr: float | None = option(None, "Peak learning rate, reached at the end of the warm-up (as "
                              "fairseq's --lr): with --lr-scheduler noam it replaces "
                              "--lr-scale (eq. 5 scaled to peak at LR); inverse_sqrt and cosine "
                              "need it.", metavar="LR")
    lr_scheduler: str = option(
        "noam", "noam (the paper's eq. 5, with --lr-scale or --lr, and --lr-period), "
        "inverse_sqrt (fairseq's: linear warm-up from --warmup-init-lr to --lr, then lr * "
        "sqrt(warmup / updates)) or cosine (the same warm-up, then half a cosine down to "
        "--min-lr at --max-update).", choices=SCHEDULES)
    warmup_init_lr: float = option(0.0, "inverse_sqrt and cosine: the learning rate of the "
                                   "first update (fairseq's default, 0).")
    min_lr: float = option(0.0, "cosine: the learning rate reached at --max-update.")
    optimizer: str = option("adam", "adam (the paper's; --weight-decay adds an L2 term to the "
                            "gradients) or adamw (decoupled weight decay, which is what "
                            "fairseq's adam does with --weight-decay).", choices=OPTIMIZERS)
    weight_decay: float = option(0.0, "Weight decay (0: none, as the paper).")
    clip_norm: float = option(0.0, "Clip the gradient norm to this value (0: no clipping, as "
                              "the paper).")
    seed: int = option(1, "Seed for initialisation, dropout and batch order.")
    dropout_masks: str = option(
        "torch", "How dropout masks are drawn on a CPU: torch (F.dropout's own masks, bit for "
        "bit; every figure nmt publishes) or fast (15 random bits per element, four elements "
        "per generator call; the rate rounds to a multiple of 2^-15): faster training, but a "
        "run differs from a torch-mask run as a run with another seed would. A GPU uses its "
        "fused dropout either way.", choices=("torch", "fast"))
    loss_chunk: int = option(
        0, "Compute the output projection and the loss this many target tokens at a time, the "
        "[tokens, vocabulary] logits never whole in memory (float32 without autocast; the "
        "gradients are the same to float rounding). Cuts peak memory by about three times "
        "tokens x vocabulary x 4 bytes (Multi30k literature model: 1.44 -> 0.91 GB), at about "
        "the same speed on a CPU. 0: off, the logits whole.", metavar="TOKENS")
    rdrop_alpha: float = option(
        0.0, "R-Drop (Liang et al. 2021): every batch goes through the model twice in one "
        "forward, with different dropout masks, and the loss adds ALPHA times the symmetric "
        "KL divergence between the two passes' output distributions (logged as kl); a "
        "regularizer for small data (the paper: 5 on IWSLT). Each update costs about twice "
        "the compute and activation memory. 0: off, the paper's loss.", metavar="ALPHA")
    # --- when to stop --------------------------------------------------------------------------
    max_update: int = option(0, "Stop after this many updates (0: no limit; the paper: 100000 "
                             "base, 300000 big).")
    max_epoch: int = option(0, "Stop after this many epochs (0: no limit).")
    max_time: float = option(0.0, "Stop after this much wall time of this run: 3600, 90m, 12h, "
                             "HH:MM:SS.", metavar="DURATION", parse=parse_duration,
                             show_default=False)
    patience: int = option(0, "Stop when this many validations at saves in a row did not "
                           "improve --best-checkpoint-metric (0: never); the validations of "
                           "--validate-interval-updates between saves are logged only.")
    # --- checkpoints ---------------------------------------------------------------------------
    save_dir: str = option("checkpoints", "Where checkpoints, train_log.jsonl and curves.png go.")
    save_interval_updates: int = option(0, "Save every N updates (0: at the end of each epoch "
                                        "unless --save-interval-minutes is given).")
    save_interval_minutes: float = option(0.0, "Save every N minutes (the paper: 10).")
    keep_last: int = option(5, "Keep the last K checkpoint_<update>.pt files (at least "
                            "--average-last; the --average-best and --ensemble-best ones are "
                            "kept too).")
    average_last: int = option(0, "At the end, average the last N checkpoints (paper: 5 base, "
                               "20 big) into checkpoint_avg<N>.pt (N: the number averaged, "
                               "fewer when fewer were saved; stdout names the file).")
    average_best: int = option(0, "At the end, average the N best checkpoints by "
                               "--best-checkpoint-metric into checkpoint_avg_best<N>.pt.")
    ensemble_best: int = option(0, "Keep the N best checkpoints by --best-checkpoint-metric and "
                                "list them at the end in ensemble_best<N>.txt, one path per "
                                "line, for nmt-generate to ensemble: nmt-generate $(cat "
                                "ensemble_best<N>.txt) ... With a decoding metric the "
                                "ensemble is validated too.")
    best_checkpoint_metric: str = option(
        "loss", "Validation score that picks checkpoint_best.pt, --patience and --average-best: "
        "loss (lower is better), bleu or chrf (sacreBLEU of the decoded validation split "
        "against its raw references, higher is better), bracket-f1 (parsing data).",
        choices=METRICS)
    resume: bool = option(True, "Continue from the newest intact checkpoint in SAVE_DIR "
                          "(checkpoint_last.pt or checkpoint_<update>.pt; unreadable ones are "
                          "skipped with a warning): same weights, optimizer, learning rate, RNG "
                          "and next batch. --no-resume starts afresh and first moves the "
                          "previous run's files (checkpoints, train_log.jsonl, curves.png, "
                          "ensemble listings) into SAVE_DIR/previous-<date>-<time>/, so that a "
                          "later resume cannot mix the two runs; nothing is deleted.",
                          negatable=True)
    # --- validation ----------------------------------------------------------------------------
    validate_interval_updates: int | None = option(None, "Also validate every N updates between "
                                                   "saves (every save is validated) [default: "
                                                   "only at saves].")
    validate_after_updates: int = option(0, "Validate only from update N on; saves before it "
                                         "are not validated (an untrained model decodes every "
                                         "sentence to the length limit, which makes early "
                                         "decoding validations slow). The last save of a run "
                                         "is always validated.")
    valid_subset: str = option("valid", "Split used for validation.")
    valid_bleu: bool = option(False, "Also report BLEU and chrF of the decoded validation split "
                              "at each validation (implied by --best-checkpoint-metric "
                              "bleu/chrf).")
    # Validation decoding: one --valid-<field> option per SearchConfig field that defaults to
    # the preset (search.config.PRESET_FIELDS); valid_search builds the SearchConfig from them.
    valid_beam: int | None = option(None, "Beam size of validation decoding [default: the "
                                    "preset's, as nmt-generate].")
    valid_lenpen: float | None = option(None, "Length penalty of validation decoding "
                                        "[default: the preset's].")
    valid_lenpen_formula: str | None = option(
        None, "Length penalty formula of validation decoding, as nmt-generate's "
        "--lenpen-formula [default: the preset's].", choices=CHOICES["lenpen_formula"],
        show_default=False)
    valid_max_len_a: float | None = option(None, "Validation output length limit a * source "
                                           "+ b, a [default: the preset's].")
    valid_max_len_b: int | None = option(None, "... and b [default: the preset's].")
    valid_min_len: int | None = option(None, "No eos before this many tokens in validation "
                                       "decoding [default: the preset's].")
    # --- machine -------------------------------------------------------------------------------
    precision: str = option("fp32", "bf16 or fp16 (dynamic loss scaling, overflowing steps "
                            "skipped) need CUDA.", cli=False)
    device: str = option("auto", "cpu, cuda, cuda:N or auto.", cli=False)
    log_interval: int = option(100, "Log training statistics every N updates.")
    tensorboard_logdir: str | None = option(
        None, "Also write the training statistics (loss, nll, ppl, lr, gnorm, tokens/s) and the "
        "validation scores as TensorBoard scalars to DIR (needs the tensorboard package: pip "
        "install 'nmt[tensorboard]').", metavar="DIR")
    ddp_timeout: float = option(30.0, "Minutes a rank waits for the others in a collective "
                                "before it exits with an error (torchrun runs: a dead or hung "
                                "rank stops the whole job).")
    max_nonfinite: int = option(10, "Stop with an error after this many updates in a row with "
                                "a NaN/inf loss or gradient (each is skipped, never applied; "
                                "fp16 also lowers the loss scale).")

    def __post_init__(self) -> None:
        if self.overrides is None:
            self.overrides = {}
        self.max_time = parse_duration(self.max_time)

    @property
    def eq5_scale(self) -> float:
        """The factor on eq. 5's learning rate (--lr-scale; 1 when not given)."""
        return UNSET_MEANS["lr_scale"] if self.lr_scale is None else self.lr_scale

    @property
    def arch_name(self) -> str:
        """--arch, or the default preset when it was not given."""
        return self.arch or DEFAULT_ARCH

    @property
    def metric_needs_decoding(self) -> bool:
        return self.best_checkpoint_metric != "loss" or self.valid_bleu

    @property
    def valid_search(self) -> SearchConfig:
        """Validation decoding: each field of SearchConfig that defaults to the model's preset
        from its --valid-<field> option (unset: the preset's, once resolved, as nmt-generate)."""
        return SearchConfig(**{name: getattr(self, f"valid_{name}") for name in PRESET_FIELDS})

    def check(self) -> None:
        """Every option of the run, checked once: here (nmt-train checks the machine part
        before it reads any data; ``train`` checks the whole when the run starts)."""
        self.check_machine()
        for name in ("max_tokens", "update_freq", "warmup", "log_interval", "max_nonfinite",
                     "keep_last"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
        for name in ("max_sentences", "validate_interval_updates"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1 (leave it out for "
                                 f"none)")
        for name in ("clip_norm", "lr_scale", "max_time", "save_interval_minutes",
                     "rdrop_alpha"):
            if getattr(self, name) is not None and not math.isfinite(getattr(self, name)):
                raise UsageError(f"--{name.replace('_', '-')} must be a finite number, got "
                                 f"{getattr(self, name)}")
        for name in ("max_update", "max_epoch", "save_interval_updates",
                     "average_last", "average_best", "ensemble_best", "patience", "lr_period",
                     "validate_after_updates", "loss_chunk"):
            if getattr(self, name) < 0:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 0")
        if self.max_time < 0 or self.save_interval_minutes < 0 or self.clip_norm < 0:
            raise UsageError("--max-time, --save-interval-minutes and --clip-norm must be >= 0")
        if self.rdrop_alpha < 0:
            raise UsageError(f"--rdrop-alpha must be >= 0, got {self.rdrop_alpha}")
        if self.seed < 0:
            raise UsageError(f"--seed must be >= 0, got {self.seed}")
        if self.lr_scale is not None and self.lr_scale <= 0:
            raise UsageError("--lr-scale must be > 0")
        self._check_schedule()
        if (self.max_update == 0 and self.max_epoch == 0 and self.max_time == 0
                and self.patience == 0):
            raise UsageError("give a stopping criterion: --max-update, --max-epoch, --max-time "
                             "or --patience")
        if not self.ddp_timeout > 0:
            raise UsageError("--ddp-timeout must be > 0")
        if self.best_checkpoint_metric not in METRICS:
            raise UsageError(f"--best-checkpoint-metric must be one of {', '.join(METRICS)}")
        if self.valid_beam is not None and self.valid_beam < 1:
            raise UsageError("--valid-beam must be >= 1")
        self.valid_search    # builds it: the other --valid-* values meet SearchConfig's checks
        if self.init_from == "":
            raise UsageError("--init-from needs a checkpoint path")

    def check_machine(self) -> None:
        """--precision, --arch with its -o overrides, and --device: a run that cannot start on
        this machine fails before any data is read (int8 decodes only; bf16/fp16 need CUDA)."""
        from nmt.registry import get_arch
        from nmt.runtime import check_precision, check_training_precision, resolve_device

        check_training_precision(self.precision)
        # With --init-from the model configuration comes from the checkpoint, checked when it
        # is read; a --arch given with it must still name a preset.
        if self.init_from is None:
            get_arch(self.arch_name, self.overrides)
        elif self.arch is not None:
            get_arch(self.arch)
        check_precision(self.precision, resolve_device(self.device), training=True)

    def _check_schedule(self) -> None:
        if self.lr is not None and not self.lr > 0:
            raise UsageError("--lr must be > 0")
        if self.weight_decay < 0 or self.warmup_init_lr < 0 or self.min_lr < 0:
            raise UsageError("--weight-decay, --warmup-init-lr and --min-lr must be >= 0")
        if self.lr_scheduler == "noam":
            # Given at all, whatever its value: 1.0 beside --lr is as ambiguous as 2.
            if self.lr is not None and self.lr_scale is not None:
                raise UsageError("--lr and --lr-scale both set the peak of eq. 5: give one")
            return
        name = f"--lr-scheduler {self.lr_scheduler}"
        for flag, given in (("--lr-scale", self.lr_scale is not None),
                            ("--lr-period", self.lr_period)):
            if given:
                raise UsageError(f"{flag} goes with --lr-scheduler noam, not "
                                 f"{self.lr_scheduler}")
        if self.lr is None:
            raise UsageError(f"{name} needs --lr, the peak learning rate")
        if self.warmup_init_lr > self.lr or self.min_lr > self.lr:
            raise UsageError("--warmup-init-lr and --min-lr must not exceed --lr")
        if self.lr_scheduler == "cosine" and self.max_update <= self.warmup:
            raise UsageError(f"{name} needs --max-update beyond --warmup (where the cosine "
                             f"reaches --min-lr)")


__all__ = ["TrainConfig", "UNSET_MEANS", "METRICS", "OPTIMIZERS", "SCHEDULES", "DEFAULT_ARCH",
           "parse_duration"]
