"""nmt-train: train a Transformer on a data directory from nmt-preprocess (paper, section 5).

Prints exactly one line on stdout: the path of the final checkpoint, so that

    nmt-preprocess ... | nmt-train --arch transformer_small ... | nmt-generate ...

works. Logs, progress and tables go to stderr.
"""

from __future__ import annotations

import logging
import sys

import click

from nmt.cli.console import (Command, console, handle_errors, make_progress, read_path_from_stdin,
                            setup_runtime)
from nmt.cli.options import build_config, config_options, runtime_options
from nmt.errors import NmtError, UsageError
from nmt.io import print_line
from nmt.training.config import TrainConfig

log = logging.getLogger("nmt.train")


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


def _training_options_given(names: set[str]) -> list[str]:
    """The options among ``names`` the command line (or the environment) gave, whatever their
    value: a default given explicitly is given too."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return ["/".join([max(p.opts, key=len), *p.secondary_opts])
            for p in ctx.command.params if p.name in names
            and ctx.get_parameter_source(p.name) not in (ParameterSource.DEFAULT,
                                                         ParameterSource.DEFAULT_MAP, None)]


@click.command(cls=Command, prog="nmt-train",
               context_settings={"help_option_names": ["-h", "--help"],
                                 "max_content_width": 100})
@click.argument("inputs", nargs=-1, type=click.Path(), metavar="[DATA_DIR | --average CKPT...]")
@config_options(TrainConfig)
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Change a model hyperparameter, e.g. --override dropout=0.3 --override "
                   "layers=4 (repeatable; unknown keys are an error).")
# -o was --override's short name; in every other command -o is --output. Still accepted here,
# hidden, with a warning, so that existing scripts keep working.
@click.option("-o", "old_overrides", multiple=True, hidden=True, metavar="KEY=VALUE")
@click.option("--list-archs", is_flag=True,
              help="Print a table of the architectures with parameter counts and exit.")
@click.option("--vocab-size", default=37000, show_default=True, type=int,
              help="Vocabulary size used for --list-archs parameter counts.")
@click.option("--average", "average_mode", is_flag=True,
              help="Averaging mode: INPUTS are checkpoints; write their mean to --output and "
                   "print its path. No training.")
@click.option("--output", type=click.Path(), help="Output checkpoint of --average.")
@runtime_options("train")
@handle_errors("nmt-train")
def main(inputs, overrides, old_overrides, list_archs, vocab_size, average_mode, output, device,
         precision, threads, verbose, quiet, **options):
    """Train a Transformer on DATA_DIR (from nmt-preprocess; read from stdin when omitted).

    \b
    Examples:
      nmt-train data/ --arch transformer_small --max-update 1000 --save-dir ckpt
      nmt-preprocess ... | nmt-train --arch transformer_base --max-update 100000 \\
          --save-interval-minutes 10 --average-last 5 | nmt-generate ...
      nmt-train data/ --best-checkpoint-metric bleu --patience 5 --average-best 5 ...
      nmt-train indomain/ --init-from base.pt --warmup 500 --max-update 5000 --save-dir ft
      torchrun --nproc_per_node 8 --no-python nmt-train data/ --max-tokens 3125 ...
      nmt-train --average ckpt/checkpoint_98000.pt ckpt/checkpoint_99000.pt --output avg.pt

    \b
    Multi-node: run the same torchrun command on every machine with --nnodes N
    --rdzv_id ID --rdzv_backend c10d --rdzv_endpoint HOST:PORT; DATA_DIR and --save-dir
    must be at the same path on every machine (every rank reads checkpoint_last.pt to
    resume; only rank 0 writes).

    Adam (0.9, 0.98, 1e-9), eq. 5 learning rate, label-smoothed cross entropy normalised by
    the number of target tokens of each update. Losses are in nats; ppl = exp(nll).
    Prints the path of the checkpoint to use on stdout: the average when --average-last or
    --average-best is given, else checkpoint_best.pt when --best-checkpoint-metric is not
    loss or --patience is given, else checkpoint_last.pt. The final log line compares the
    validation scores of checkpoint_best.pt and the averages.

    \b
    Interruptions: SIGINT (Ctrl-C) or SIGTERM finish the current update, save a checkpoint
    and exit with 130 or 143 (nothing on stdout); a second signal stops at once. After any
    stop, even kill -9, the same command resumes from the newest intact checkpoint.

    \b
    One writer per directory: a second nmt-train (or nmt-train --average) into a SAVE_DIR
    in use stops at once, naming the running one's PID.
    """
    setup_runtime(verbose, quiet, threads)
    if old_overrides and overrides:
        raise UsageError("-o and --override both given: write every override as "
                         "--override KEY=VALUE")
    if options.get("user_dir"):
        from nmt.plugins import load_user_dir

        load_user_dir(options["user_dir"])
    if list_archs or average_mode:
        # These modes train nothing: a training option or -o given with them would be ignored.
        given = _training_options_given(set(options) - {"user_dir"}
                                        | {"overrides", "old_overrides", "device", "precision"})
        if given:
            raise UsageError(f"{'--list-archs' if list_archs else '--average'} trains nothing: "
                             f"{', '.join(given)} would be ignored; leave "
                             f"{'it' if len(given) == 1 else 'them'} out")
    if list_archs:
        list_archs_table(vocab_size)
        return
    if average_mode:
        average_mode_main(inputs, output)
        return
    if output:
        raise UsageError("--output is only for --average")
    if len(inputs) > 1:
        raise UsageError(f"expected one data directory, got {len(inputs)} arguments "
                         f"(use --average to average checkpoints)")
    from nmt.config import parse_overrides

    if old_overrides:
        logging.getLogger("nmt").warning("-o is the old name of --override; it still works "
                                         "(in the other commands -o is --output)")
        overrides = old_overrides
    cfg = build_config(TrainConfig, options, overrides=parse_overrides(overrides),
                       device=device, precision=precision)
    cfg.check_machine()     # precision, arch, device: fail before reading stdin or data
    data_dir = inputs[0] if inputs else read_path_from_stdin("data directory")

    train_with_progress(cfg, data_dir)


def train_with_progress(cfg: TrainConfig, data_dir: str) -> None:
    """Train on DATA_DIR with a progress bar on stderr; rank 0 prints the checkpoint to use."""
    from pathlib import Path

    from nmt.data.datadir import DataDir
    from nmt.runtime import env_dist_info
    from nmt.training.loop import train

    data = DataDir.open(data_dir)
    # (no progress lines off a terminal: the run logs every --log-interval updates)
    with make_progress(transient=True, log_every=0) as bar:
        task = bar.add_task("train", total=cfg.max_update or None, rate="")

        def progress(update: int, total: int | None, text: str) -> None:
            bar.update(task, completed=update, rate=text)

        path = train(cfg, data, str(Path(data_dir).resolve()), progress)
    if env_dist_info().is_main:
        print_line(str(path))


def average_mode_main(inputs, output) -> None:
    if not inputs:
        raise UsageError("--average needs checkpoint paths")
    if not output:
        raise UsageError("--average needs --output FILE")
    from pathlib import Path

    from nmt.lock import LOCK_NAME, WriterLock, make_directories, remove_if_empty
    from nmt.training.average import average_to_file

    # One writer per directory: not into the save directory of a running nmt-train (its
    # files, or its clean-up of temporaries, would meet this write), nor beside another one.
    where = Path(output).absolute().parent
    try:
        created = make_directories(where)
    except OSError as e:
        raise NmtError(f"{where}: cannot create directory ({e.strerror or e})") from None
    try:
        with WriterLock(where / LOCK_NAME, where, "nmt-train --average",
                        "wait for it to finish, or write the average elsewhere"):
            path = average_to_file(list(inputs), output)
    finally:
        remove_if_empty(created)
    print_line(str(path.resolve()))


if __name__ == "__main__":
    main()
