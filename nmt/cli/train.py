"""nmt-train: train a Transformer on a data directory from nmt-preprocess (paper, section 5).

Prints exactly one line on stdout: the path of the final checkpoint, so that

    nmt-preprocess ... | nmt-train --arch transformer_small ... | nmt-generate ...

works. Logs, progress and tables go to stderr.
"""

from __future__ import annotations

import logging
import re
import sys

import click

from nmt.cli.common import console, handle_errors, read_path_from_stdin, setup_runtime
from nmt.errors import UsageError

log = logging.getLogger("nmt.train")


def parse_duration(text: str | None) -> float:
    """'3600', '90s', '45m', '10h', '1d' or 'HH:MM:SS' -> seconds."""
    if text is None or text == "":
        return 0.0
    s = text.strip().lower()
    if ":" in s:
        parts = s.split(":")
        try:
            vals = [float(p) for p in parts]
        except ValueError:
            raise UsageError(f"--max-time '{text}': expected e.g. 90m, 10h or HH:MM:SS") from None
        secs = 0.0
        for v in vals:
            secs = secs * 60 + v
        return secs
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([smhd]?)", s)
    if not m:
        raise UsageError(f"--max-time '{text}': expected e.g. 90m, 10h or HH:MM:SS")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def list_archs_table(vocab_size: int) -> None:
    """Every registered preset with its sizes and parameter count (built on the meta device)."""
    from rich.console import Console
    from rich.table import Table

    from nmt.models.transformer import parameter_count
    from nmt.registry import arch_entries, get_arch

    table = Table(title=f"architectures (parameters with a shared vocabulary of {vocab_size})")
    for col in ("name", "layers", "d_model", "d_ff", "heads", "dropout", "parameters",
                "description"):
        table.add_column(col, justify="right" if col in ("layers", "d_model", "d_ff", "heads",
                                                         "dropout", "parameters") else "left")
    for entry in arch_entries():
        cfg = get_arch(entry.name)
        n = parameter_count(cfg, vocab_size, vocab_size, share_all_embeddings=True)
        table.add_row(entry.name, f"{cfg.encoder_layers}+{cfg.decoder_layers}", str(cfg.d_model),
                      str(cfg.d_ff), str(cfg.heads), f"{cfg.dropout:g}", f"{n / 1e6:.1f}M",
                      entry.description)
    # The listing is the data this mode asks for: stdout.
    Console(file=sys.stdout, width=max(120, console.width)).print(table)


@click.command(context_settings={"help_option_names": ["-h", "--help"],
                                 "max_content_width": 100})
@click.argument("inputs", nargs=-1, type=click.Path(), metavar="[DATA_DIR | --average CKPT...]")
@click.option("--arch", "-a", default="transformer_base", show_default=True,
              help="Registered architecture (see --list-archs).")
@click.option("--override", "-o", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Change a model hyperparameter, e.g. -o dropout=0.3 -o layers=4 "
                   "(repeatable; unknown keys are an error).")
@click.option("--list-archs", is_flag=True,
              help="Print a table of the architectures with parameter counts and exit.")
@click.option("--vocab-size", default=37000, show_default=True, type=int,
              help="Vocabulary size used for --list-archs parameter counts.")
@click.option("--share-all-embeddings/--no-share-all-embeddings", default=None,
              help="Tie source/target embeddings and the output projection "
                   "[default: when the vocabulary is joined].")
@click.option("--max-tokens", default=4096, show_default=True, type=int,
              help="Tokens per micro-batch and rank (padded, the longer side; the paper used "
                   "about 25000 source + 25000 target tokens per step).")
@click.option("--max-sentences", default=None, type=int, help="Also cap sentences per batch.")
@click.option("--update-freq", default=1, show_default=True, type=int,
              help="Accumulate gradients over N micro-batches per update (a bigger batch on "
                   "fewer devices).")
@click.option("--lr-scale", default=1.0, show_default=True, type=float,
              help="Multiplies the learning rate of eq. 5.")
@click.option("--warmup", default=4000, show_default=True, type=int,
              help="warmup_steps of eq. 5.")
@click.option("--clip-norm", default=0.0, show_default=True, type=float,
              help="Clip the gradient norm to this value (0: no clipping, as the paper).")
@click.option("--seed", default=1, show_default=True, type=int,
              help="Seed for initialisation, dropout and batch order.")
@click.option("--max-update", default=0, show_default=True, type=int,
              help="Stop after this many updates (0: no limit; the paper: 100000 base, "
                   "300000 big).")
@click.option("--max-epoch", default=0, show_default=True, type=int,
              help="Stop after this many epochs (0: no limit).")
@click.option("--max-time", default=None, metavar="DURATION",
              help="Stop after this much wall time of this run: 3600, 90m, 12h, HH:MM:SS.")
@click.option("--save-dir", default="checkpoints", show_default=True, type=click.Path(),
              help="Where checkpoints, train_log.jsonl and curves.png go.")
@click.option("--save-interval-updates", default=0, show_default=True, type=int,
              help="Save every N updates (0: at the end of each epoch unless "
                   "--save-interval-minutes is given).")
@click.option("--save-interval-minutes", default=0.0, show_default=True, type=float,
              help="Save every N minutes (the paper: 10).")
@click.option("--keep-last", default=5, show_default=True, type=int,
              help="Keep the last K checkpoint_<update>.pt files (at least --average-last).")
@click.option("--average-last", default=0, show_default=True, type=int,
              help="At the end, average the last N checkpoints (paper: 5 base, 20 big) and "
                   "print that checkpoint's path.")
@click.option("--validate-interval-updates", default=None, type=int,
              help="Validate every N updates [default: at every save].")
@click.option("--valid-subset", default="valid", show_default=True,
              help="Split used for validation.")
@click.option("--valid-bleu", is_flag=True,
              help="Also compute BLEU of greedy translations of the validation split "
                   "(against the decoded references).")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32",
              show_default=True,
              help="bf16 or fp16 (dynamic loss scaling, overflowing steps skipped) need CUDA.")
@click.option("--device", default="auto", show_default=True,
              help="cpu, cuda, cuda:N or auto (cuda:LOCAL_RANK when available).")
@click.option("--threads", default=None, type=int,
              help="CPU threads for PyTorch (torch.set_num_threads).")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Continue from the newest intact checkpoint in SAVE_DIR (checkpoint_last.pt "
                   "or checkpoint_<update>.pt; unreadable ones are skipped with a warning): "
                   "same weights, optimizer, learning rate, RNG and next batch.")
@click.option("--log-interval", default=100, show_default=True, type=int,
              help="Log training statistics every N updates.")
@click.option("--ddp-timeout", default=30.0, show_default=True, type=float,
              help="Minutes a rank waits for the others in a collective before it exits with "
                   "an error (torchrun runs: a dead or hung rank stops the whole job).")
@click.option("--max-nonfinite", default=10, show_default=True, type=int,
              help="Stop with an error after this many updates in a row with a NaN/inf loss or "
                   "gradient (each is skipped, never applied; fp16 also lowers the loss scale).")
@click.option("--average", "average_mode", is_flag=True,
              help="Averaging mode: INPUTS are checkpoints; write their mean to --output and "
                   "print its path. No training.")
@click.option("--output", type=click.Path(), help="Output checkpoint of --average.")
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
@click.option("--quiet", "-q", is_flag=True, help="Warnings and errors only.")
@handle_errors("nmt-train")
def main(inputs, arch, overrides, list_archs, vocab_size, share_all_embeddings, max_tokens,
         max_sentences, update_freq, lr_scale, warmup, clip_norm, seed, max_update, max_epoch,
         max_time, save_dir, save_interval_updates, save_interval_minutes, keep_last,
         average_last, validate_interval_updates, valid_subset, valid_bleu, precision, device,
         threads, resume, log_interval, ddp_timeout, max_nonfinite, average_mode, output,
         verbose, quiet):
    """Train a Transformer on DATA_DIR (from nmt-preprocess; read from stdin when omitted).

    \b
    Examples:
      nmt-train data/ --arch transformer_small --max-update 1000 --save-dir ckpt
      nmt-preprocess ... | nmt-train --arch transformer_base --max-update 100000 \\
          --save-interval-minutes 10 --average-last 5 | nmt-generate ...
      torchrun --nproc_per_node 8 --no-python nmt-train data/ --max-tokens 3125 ...
      nmt-train --average ckpt/checkpoint_98000.pt ckpt/checkpoint_99000.pt --output avg.pt

    \b
    Multi-node: run the same torchrun command on every machine with --nnodes N
    --rdzv_id ID --rdzv_backend c10d --rdzv_endpoint HOST:PORT; DATA_DIR and --save-dir
    must be at the same path on every machine (every rank reads checkpoint_last.pt to
    resume; only rank 0 writes).

    Adam (0.9, 0.98, 1e-9), eq. 5 learning rate, label-smoothed cross entropy normalised by
    the number of target tokens of each update. Losses are in nats; ppl = exp(nll).
    Prints the final checkpoint's path on stdout.

    \b
    Interruptions: SIGINT (Ctrl-C) or SIGTERM finish the current update, save a checkpoint
    and exit with 130 or 143 (nothing on stdout); a second signal stops at once. After any
    stop, even kill -9, the same command resumes from the newest intact checkpoint.
    """
    setup_runtime(verbose, quiet, threads)

    if list_archs:
        list_archs_table(vocab_size)
        return

    if average_mode:
        if not inputs:
            raise UsageError("--average needs checkpoint paths")
        if not output:
            raise UsageError("--average needs --output FILE")
        from nmt.training.average import average_to_file
        path = average_to_file(list(inputs), output)
        click.echo(str(path.resolve()))
        return
    if output:
        raise UsageError("--output is only for --average")

    if len(inputs) > 1:
        raise UsageError(f"expected one data directory, got {len(inputs)} arguments "
                         f"(use --average to average checkpoints)")
    data_dir = inputs[0] if inputs else read_path_from_stdin("data directory")

    from nmt.config import parse_overrides
    from nmt.registry import get_arch
    from nmt.training.loop import TrainConfig, train

    ov = parse_overrides(overrides)
    get_arch(arch, ov)   # unknown arch / key / bad value: fail before opening data

    from nmt.data.datadir import DataDir
    data = DataDir.open(data_dir)
    cfg = TrainConfig(
        arch=arch, overrides=ov, share_all_embeddings=share_all_embeddings,
        max_tokens=max_tokens, max_sentences=max_sentences, update_freq=update_freq,
        lr_scale=lr_scale, warmup=warmup, clip_norm=clip_norm, seed=seed,
        max_update=max_update, max_epoch=max_epoch, max_time=parse_duration(max_time),
        save_dir=save_dir, save_interval_updates=save_interval_updates,
        save_interval_minutes=save_interval_minutes, keep_last=keep_last,
        average_last=average_last, validate_interval_updates=validate_interval_updates,
        valid_subset=valid_subset, valid_bleu=valid_bleu, precision=precision, device=device,
        resume=resume, log_interval=log_interval, ddp_timeout=ddp_timeout,
        max_nonfinite=max_nonfinite)
    from pathlib import Path
    path = train(cfg, data, str(Path(data_dir).resolve()))
    from nmt.training.distributed import env_dist_info
    if env_dist_info().is_main:
        click.echo(str(path))


if __name__ == "__main__":
    main()
