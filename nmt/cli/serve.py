"""nmt-serve: translate over HTTP with one or more checkpoints (nmt.serve does the work)."""

from __future__ import annotations

import click

from nmt.cli.console import Command, handle_errors, setup_runtime
from nmt.cli.options import build_config, config_options, runtime_options
from nmt.errors import NmtError
from nmt.serve.config import ServeConfig


@click.command(cls=Command, prog="nmt-serve",
               context_settings={"help_option_names": ["-h", "--help"],
                                 "max_content_width": 100})
@click.argument("checkpoints", nargs=-1, type=click.Path(), metavar="CHECKPOINT...")
@config_options(ServeConfig)
@runtime_options("serve")
@handle_errors("nmt-serve")
def main(checkpoints, device, precision, threads, verbose, quiet, **options):
    """Serve CHECKPOINT (several: several models, each named by its file's stem, or
    NAME=CHECKPOINT) over HTTP until SIGTERM or Ctrl-C.

    POST /translate with {"text": [...]} (and "model" when several are served; "beam",
    "lenpen", "max_len_a", "max_len_b", "min_len", "no_repeat_ngram_size", "unkpen",
    "replace_unk", "diverse_beam_groups", "diverse_beam_strength", "nbest" as nmt-generate's
    options, "sampling": true with "topk", "topp", "temperature", "seed" as its --sampling,
    "prefix" and "constraints" as its jsonl fields) answers {"translations": [...]}, in order,
    as nmt-generate translates them; with "nbest" N > 1 also {"nbest": [...]}, each
    sentence's N best {"translation", "score"} (sampling: N samples, in the order drawn).
    Concurrent requests with equal decoding options are decoded together (--max-batch-tokens,
    --max-wait-ms). GET /health: alive; GET /ready: models loaded. Logs go to stderr.

    \b
      nmt-serve ckpt/checkpoint_best.pt --port 8080
      curl -s localhost:8080/translate -d '{"text": ["A man rides a bike ."]}'
      nmt-serve en-de=ende/checkpoint_best.pt de-en=deen/checkpoint_best.pt
    """
    setup_runtime(verbose, quiet, threads, torch_threads=options.get("engine", "nmt") == "nmt")
    cfg: ServeConfig = build_config(ServeConfig, options)
    from nmt.serve.models import parse_specs

    specs = parse_specs(checkpoints)
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise NmtError(f"nmt-serve needs the serve extra ({e.name} is missing): "
                       f"pip install 'nmt[serve]'") from None
    from nmt.serve.server import serve

    serve(specs, cfg, device=device, precision=precision, threads=threads)


if __name__ == "__main__":
    main()
