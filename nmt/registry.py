"""The one registry of named architectures, shared by every CLI and the Python API.

A preset is a plain function returning a :class:`~nmt.config.ModelConfig`::

    @register_arch("transformer_base", "the paper's base model (Table 3)")
    def transformer_base() -> ModelConfig: ...
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from nmt.config import ModelConfig, apply_overrides
from nmt.errors import UsageError, suggest


@dataclass(frozen=True)
class ArchEntry:
    name: str
    description: str
    builder: Callable[[], ModelConfig]


_REGISTRY: dict[str, ArchEntry] = {}


def register_arch(name: str, description: str = "") -> Callable[[Callable[[], ModelConfig]],
                                                                 Callable[[], ModelConfig]]:
    def deco(fn: Callable[[], ModelConfig]) -> Callable[[], ModelConfig]:
        if name in _REGISTRY:
            raise ValueError(f"architecture '{name}' is registered twice")
        _REGISTRY[name] = ArchEntry(name, description or (fn.__doc__ or "").strip(), fn)
        return fn

    return deco


def _with_plugins() -> dict[str, ArchEntry]:
    """The registry after the installed plugins (nmt.plugins) have registered theirs."""
    from nmt.plugins import load_entry_points

    load_entry_points()
    return _REGISTRY


def list_archs() -> list[str]:
    return list(_with_plugins())


def arch_entries() -> list[ArchEntry]:
    return list(_with_plugins().values())


def get_arch(name: str, overrides: Mapping[str, Any] | None = None) -> ModelConfig:
    """A fresh config for preset ``name``, with optional validated overrides."""
    if name not in _REGISTRY and name not in _with_plugins():
        raise UsageError(f"unknown architecture '{name}'{suggest(name, _REGISTRY)}; "
                         f"choose from: {', '.join(_REGISTRY)}")
    cfg = dataclasses.replace(_REGISTRY[name].builder(), arch=name)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    return cfg


# --- presets ------------------------------------------------------------------------------------

@register_arch("transformer_base", "paper's base model: N=6, d_model 512, d_ff 2048, h 8")
def transformer_base() -> ModelConfig:
    return ModelConfig(encoder_layers=6, decoder_layers=6, d_model=512, d_ff=2048, heads=8,
                       dropout=0.1, label_smoothing=0.1)


@register_arch("transformer_big", "paper's big model: N=6, d_model 1024, d_ff 4096, h 16, dropout 0.3")
def transformer_big() -> ModelConfig:
    return ModelConfig(encoder_layers=6, decoder_layers=6, d_model=1024, d_ff=4096, heads=16,
                       dropout=0.3, label_smoothing=0.1)


@register_arch("transformer_parse",
               "section 6.3 parser: 4 layers, d_model 1024; decodes with beam 21, alpha 0.3, +300")
def transformer_parse() -> ModelConfig:
    # "all other parameters remained unchanged from the English-to-German base translation
    # model": d_ff 2048 and 8 heads (so d_k = d_v = 128), dropout 0.1.
    return ModelConfig(encoder_layers=4, decoder_layers=4, d_model=1024, d_ff=2048, heads=8,
                       dropout=0.1, label_smoothing=0.1,
                       beam=21, lenpen=0.3, max_len_a=1.0, max_len_b=300)


@register_arch("transformer_small", "CPU-sized: 3+3 layers, d_model 256, d_ff 1024, h 4")
def transformer_small() -> ModelConfig:
    return ModelConfig(encoder_layers=3, decoder_layers=3, d_model=256, d_ff=1024, heads=4,
                       dropout=0.1, label_smoothing=0.1)


@register_arch("transformer_tiny", "for tests: 2+2 layers, d_model 64, d_ff 128, h 4")
def transformer_tiny() -> ModelConfig:
    return ModelConfig(encoder_layers=2, decoder_layers=2, d_model=64, d_ff=128, heads=4,
                       dropout=0.1, label_smoothing=0.1, max_positions=512)
