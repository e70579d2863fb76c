"""Typed configs that describe their own command-line options.

A config dataclass (``TrainConfig``, ``PreprocessConfig``, ``GenerateConfig``) declares each
field with :func:`option`: its default and its help are written once, here, and the console
script builds its click options from the fields (``config_options`` in the CLI package). The
library never imports click; the metadata below is plain data.

    @dataclass
    class TrainConfig:
        max_tokens: int = option(4096, "Tokens per micro-batch and rank.")
        precision: str = option("fp32", "...", choices=("fp32", "bf16", "fp16"))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence


def option(default: Any = dataclasses.MISSING, help: str = "", *,  # noqa: A002 - click's name
           flag: str | None = None, short: str | None = None, negatable: bool = False,
           choices: Sequence[str] | None = None, metavar: str | None = None,
           multiple: bool = False, parse: Callable[[Any], Any] | None = None,
           cli_type: Any = None, show_default: bool | str = True, cli: bool = True,
           default_factory: Callable[[], Any] | None = None,
           aliases: Sequence[str] = ()) -> Any:
    """A dataclass field that is also a command-line option.

    ``flag``: the long option (default ``--field-name``); ``short``: e.g. ``-a``;
    ``negatable``: a boolean shown as ``--x/--no-x`` (otherwise a boolean is a plain flag);
    ``choices``: allowed values; ``multiple``: repeatable, collected into a list;
    ``parse``: converts the command-line value (e.g. '90m' -> 5400.0) before it is stored;
    ``cli_type``: the value type on the command line when it differs from the field's;
    ``cli=False``: a field with no option (set by the program, not the user);
    ``aliases``: other long names of the option (the spelling another nmt command uses).
    """
    meta = {"help": help, "flag": flag, "short": short, "negatable": negatable,
            "choices": tuple(choices) if choices else None, "metavar": metavar,
            "multiple": multiple, "parse": parse, "cli_type": cli_type,
            "show_default": show_default, "cli": cli, "aliases": tuple(aliases)}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata={"nmt": meta})
    return dataclasses.field(default=default, metadata={"nmt": meta})


def option_meta(f: dataclasses.Field) -> dict[str, Any] | None:
    """The :func:`option` metadata of a field, or None for a plain field."""
    return f.metadata.get("nmt")


def flag_name(f: dataclasses.Field) -> str:
    """The long option of a field: ``--max-tokens`` for ``max_tokens``."""
    meta = option_meta(f) or {}
    return meta.get("flag") or "--" + f.name.replace("_", "-")


__all__ = ["option", "option_meta", "flag_name"]
