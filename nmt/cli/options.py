"""Click options built from typed configs, and the options every command shares.

``@config_options(TrainConfig)`` adds one click option per field declared with
``nmt.fields.option``; ``build_config(TrainConfig, kwargs)`` turns the parsed values back into
the config (running each field's ``parse``). Defaults and help therefore live in the config
alone. ``runtime_options`` / ``log_options`` are the options shared by the commands.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable, Iterable, TypeVar

import click

from nmt.fields import flag_name, option_meta
from nmt.runtime import PRECISIONS

F = TypeVar("F", bound=Callable)


def _base_type(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (list, tuple):
        return args[0] if args else str
    return args[0] if args else tp


def _click_option(f: dataclasses.Field, hints: dict[str, Any]) -> Callable[[F], F]:
    meta = option_meta(f) or {}
    tp = _base_type(hints[f.name])
    long = flag_name(f)
    names = [long, *meta.get("aliases", ())] + ([meta["short"]] if meta.get("short") else [])
    kwargs: dict[str, Any] = {"help": meta.get("help", ""), "metavar": meta.get("metavar")}
    default = (f.default_factory() if f.default_factory is not dataclasses.MISSING
               else f.default)
    if tp is bool and meta.get("cli_type") is None:
        if meta.get("negatable"):
            names = [f"{long}/--no-{long[2:]}"] + names[1:]
        else:
            kwargs["is_flag"] = True
        kwargs["default"] = default
        kwargs["show_default"] = meta.get("negatable", False) and meta.get("show_default", True)
    else:
        if meta.get("choices"):
            kwargs["type"] = click.Choice(list(meta["choices"]))
        else:
            kwargs["type"] = meta.get("cli_type") or (tp if tp in (int, float, str) else str)
        if meta.get("multiple"):
            kwargs["multiple"] = True
            # No default (a required repeatable option, e.g. nmt-score --ref): click's ().
            kwargs["default"] = () if default is dataclasses.MISSING else tuple(default or ())
            kwargs["show_default"] = False
        else:
            kwargs["default"] = None if default is dataclasses.MISSING else default
            shown = meta.get("show_default", True)
            # A string is shown as it is (click: "[default: (text)]"), even for a None default.
            kwargs["show_default"] = (shown if isinstance(shown, str) else
                                      bool(shown) and default not in (None, dataclasses.MISSING))
        if meta.get("parse") is not None and kwargs["type"] is not str:
            kwargs["type"] = str
    kwargs["required"] = default is dataclasses.MISSING
    return click.option(*names, f.name, **kwargs)


def config_options(cls: type, exclude: Iterable[str] = ()) -> Callable[[F], F]:
    """Decorator: the click options of every ``option`` field of the dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    skip = set(exclude)
    chosen = [f for f in dataclasses.fields(cls)
              if option_meta(f) is not None and option_meta(f).get("cli", True)
              and f.name not in skip]

    def deco(fn: F) -> F:
        for f in reversed(chosen):       # click lists options in decoration order
            fn = _click_option(f, hints)(fn)
        return fn

    return deco


def build_config(cls: type, values: dict[str, Any], **extra: Any):
    """An instance of ``cls`` from parsed click values (fields absent from ``values`` keep
    their defaults); ``extra`` sets fields directly. Consumes the keys it uses."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in extra:
            kwargs[f.name] = extra.pop(f.name)
            values.pop(f.name, None)
        elif f.name in values:
            v = values.pop(f.name)
            meta = option_meta(f) or {}
            if meta.get("multiple"):
                v = list(v)
            if meta.get("parse") is not None and v is not None:
                v = meta["parse"](v)
            kwargs[f.name] = v
    if extra:
        raise TypeError(f"{cls.__name__} has no field(s) {', '.join(extra)}")
    return cls(**kwargs)


# --- options every command shares ---------------------------------------------------------------

def log_options(fn: F) -> F:
    """-v/--verbose and -q/--quiet (all four commands)."""
    fn = click.option("--quiet", "-q", is_flag=True,
                      help="Warnings and errors only (no progress bar or summary).")(fn)
    fn = click.option("--verbose", "-v", is_flag=True, help="Debug logging.")(fn)
    return fn


def runtime_options(command: str) -> Callable[[F], F]:
    """--device, --precision and --threads (the commands that run a model), then -v/-q, with
    help written for ``command``: "train", "generate" or "serve"."""
    if command not in ("train", "generate", "serve"):
        raise ValueError(f"runtime_options: unknown command {command!r}")
    if command == "train":
        precision = ("fp32, or bf16/fp16: mixed precision on a GPU (weights and optimizer "
                     "state stay fp32). int8 and auto are decoding settings, refused here.")
        device = ("cpu, cuda, cuda:N or auto (a GPU when there is one; under torchrun each "
                  "rank takes cuda:LOCAL_RANK).")
    else:
        what = "decoding" if command == "generate" else "serving"
        precision = (f"fp32; bf16/fp16 (on a GPU; bf16 also on a CPU with native bf16, e.g. "
                     f"AVX512-BF16/AMX); int8 (on a CPU: linear layers dynamically quantized "
                     f"to int8); or auto: bf16 on a GPU with bf16 and, for models of d_model "
                     f">= 512, on a CPU with native bf16, fp32 elsewhere (the choice is "
                     f"logged). With --engine ctranslate2, the weight type {what} uses.")
        device = ("cpu, cuda, cuda:N or auto (a GPU when there is one" +
                  ("; under torchrun each rank takes cuda:LOCAL_RANK)." if command == "generate"
                   else ")."))

    def add(fn: F) -> F:
        fn = log_options(fn)
        fn = click.option("--threads", type=int, default=None,
                          help="CPU threads (for PyTorch, or CTranslate2 with --engine "
                               "ctranslate2)." if command != "train"
                          else "CPU threads for PyTorch (torch.set_num_threads).")(fn)
        fn = click.option("--precision", type=click.Choice(list(PRECISIONS)), default="fp32",
                          show_default=True, help=precision)(fn)
        return click.option("--device", default="auto", show_default=True, help=device)(fn)

    return add


__all__ = ["config_options", "build_config", "log_options", "runtime_options"]
