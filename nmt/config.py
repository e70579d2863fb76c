"""Typed model configuration and validated overrides.

A ``ModelConfig`` fully describes a Transformer and its decoding defaults. Architecture presets
in :mod:`nmt.registry` return one; users change fields with ``KEY=VALUE`` overrides, which are
type-checked here: an unknown key is an error with a suggestion, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping

from nmt.errors import UsageError, suggest
from nmt.specials import START_IDS


# Upper bounds, checked by ModelConfig.validate: generous for real models (the presets stay far
# below), and what keeps a checkpoint's configuration from asking for an absurd allocation
# that no tensor shape shows (sinusoid tables of max_positions rows, export's position rows
# from max_len_a/max_len_b, beams); nmt.checkpoint_shapes checks the rest against the tensors.
LIMITS = {"encoder_layers": 1024, "decoder_layers": 1024, "d_model": 65536, "d_ff": 1 << 20,
          "heads": 4096, "d_k": 65536, "d_v": 65536, "max_positions": 65536, "beam": 1024,
          "max_len_a": 64, "max_len_b": 65536, "min_len": 65536}


@dataclass
class ModelConfig:
    # --- which preset this came from (informational; overrides do not change it) ---
    arch: str = "transformer_base"
    # --- sizes (paper, section 3 and Table 3) ---
    encoder_layers: int = 6          # N for the encoder
    decoder_layers: int = 6          # N for the decoder
    d_model: int = 512
    d_ff: int = 2048                 # inner size of the position-wise feed-forward network
    heads: int = 8                   # h
    d_k: int | None = None           # query/key size per head; None means d_model // heads
    d_v: int | None = None           # value size per head; None means d_model // heads
    # --- regularisation (section 5.4) ---
    dropout: float = 0.1             # P_drop: residual dropout and embedding+position dropout
    attention_dropout: float = 0.0   # dropout on attention weights (not used in the paper's MT)
    activation_dropout: float = 0.0  # dropout after the FFN's ReLU (not used in the paper)
    label_smoothing: float = 0.1     # epsilon_ls
    # --- variants ---
    positional: str = "sinusoidal"   # "sinusoidal" (eq. 4) or "learned" (Table 3 row E)
    max_positions: int = 1024        # longest sequence (in subwords) the model accepts
    pre_norm: bool = False           # False: LayerNorm(x + Dropout(Sublayer(x))) as the paper
    activation: str = "relu"         # "relu" (paper), "gelu" (exact, erf) or "swish" (SiLU)
    layer_norm_eps: float = 1e-5
    # --- what imported models (fairseq, Marian/OPUS-MT) need; the defaults are the paper's ---
    scale_embedding: bool = True     # multiply embeddings by sqrt(d_model) (section 3.4)
    sinusoid_layout: str = "interleaved"   # see nmt.models.layers.SINUSOID_LAYOUTS
    position_offset: int = 0         # index of the first real position (fairseq: pad + 1 = 2)
    layernorm_embedding: bool = False   # LayerNorm after embeddings + positions, before dropout
    output_bias: bool = False        # a bias on the output logits (Marian's final_logits_bias)
    tie_output: bool = True          # output projection = target embedding (section 3.4)
    decoder_start: str = "bos"       # what the decoder reads first: "bos", "eos" (fairseq), "pad"
    # --- decoding defaults carried by the preset (section 6.1 / 6.3) ---
    beam: int = 4
    lenpen: float = 0.6              # alpha of the length penalty
    lenpen_formula: str = "gnmt"     # nmt.search.length_penalty.FORMULAS
    max_len_a: float = 1.0           # max output length = a * source length + b
    max_len_b: int = 50
    min_len: int = 0                 # no eos before this many tokens (fairseq's generator: 1)

    def __post_init__(self) -> None:
        self.validate()

    # Derived sizes -------------------------------------------------------------------------
    @property
    def head_dim_k(self) -> int:
        return self.d_k if self.d_k is not None else self.d_model // self.heads

    @property
    def head_dim_v(self) -> int:
        return self.d_v if self.d_v is not None else self.d_model // self.heads

    @property
    def decoder_width(self) -> int:
        """Decoder layers x d_model: what a decoding row holds per position, and what a step
        computes, grow with it (nmt.search.config.default_source_tokens)."""
        return self.decoder_layers * self.d_model

    @property
    def start_id(self) -> int:
        """Id of the symbol the decoder starts from (nmt.specials.START_IDS)."""
        return START_IDS[self.decoder_start]

    def validate(self) -> None:
        def bad(msg: str) -> UsageError:
            return UsageError(f"invalid model configuration: {msg}")

        for name in ("encoder_layers", "decoder_layers", "d_model", "d_ff", "heads",
                     "max_positions", "beam"):
            if getattr(self, name) < 1:
                raise bad(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_k is None and self.d_model % self.heads:
            raise bad(f"d_model={self.d_model} is not divisible by heads={self.heads}; "
                      f"set d_k and d_v explicitly")
        if self.d_v is None and self.d_model % self.heads:
            raise bad(f"d_model={self.d_model} is not divisible by heads={self.heads}")
        for name in ("d_k", "d_v"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise bad(f"{name} must be >= 1, got {v}")
        for name in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise bad(f"{name} must be in [0, 1), got {v}")
        if self.positional not in ("sinusoidal", "learned"):
            raise bad(f"positional must be 'sinusoidal' or 'learned', got '{self.positional}'")
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise bad(f"{name} must be one of {', '.join(allowed)}, "
                          f"got '{getattr(self, name)}'")
        for name in ("position_offset", "min_len", "max_len_a", "max_len_b"):
            if getattr(self, name) < 0:
                # (a negative length limit trains, then nmt-generate refuses the checkpoint)
                raise bad(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.lenpen < 0:
            raise bad(f"lenpen must be >= 0, got {self.lenpen}")
        for name in ("lenpen", "max_len_a", "layer_norm_eps"):
            if not math.isfinite(getattr(self, name)):
                raise bad(f"{name} must be a finite number, got {getattr(self, name)}")
        for name, limit in LIMITS.items():
            v = getattr(self, name)
            if v is not None and v > limit:
                raise bad(f"{name} {v} is beyond the limit {limit}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        """Rebuild from ``to_dict`` output (e.g. from a checkpoint); unknown keys are an error."""
        return apply_overrides(cls(), dict(d), source="checkpoint")


# The string fields' values (defaults first). Kept here, not imported from the modules that
# implement them, so that this module stays importable without torch.
CHOICES: dict[str, tuple[str, ...]] = {
    "activation": ("relu", "gelu", "swish"),
    "sinusoid_layout": ("interleaved", "fairseq", "marian"),
    "decoder_start": ("bos", "eos", "pad"),
    "lenpen_formula": ("gnmt", "fairseq", "hf"),
}


# Keys accepted by overrides that are not fields: they set several fields at once.
ALIASES: dict[str, tuple[str, ...]] = {
    "layers": ("encoder_layers", "decoder_layers"),   # Table 3's N
    "d_kv": ("d_k", "d_v"),
}


def config_keys() -> list[str]:
    return [f.name for f in fields(ModelConfig)] + list(ALIASES)


def _coerce(name: str, raw: Any, annotation: Any) -> Any:
    """Convert an override value (often a string from the command line) to the field's type."""
    hints = typing.get_type_hints(ModelConfig)
    tp = hints[name]
    args = typing.get_args(tp)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp) if args else tp
    if isinstance(raw, str):
        s = raw.strip()
        if optional and s.lower() in ("none", "null", ""):
            return None
        try:
            if base is bool:
                if s.lower() in ("true", "1", "yes", "on"):
                    return True
                if s.lower() in ("false", "0", "no", "off"):
                    return False
                raise ValueError
            if base is int:
                return int(s)
            if base is float:
                return float(s)
            return s
        except ValueError:
            raise UsageError(f"override {name}={raw}: expected {base.__name__}") from None
    if raw is None:
        if optional:
            return None
        raise UsageError(f"override {name}: None is not allowed")
    if base is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if base is int and isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if not isinstance(raw, base) or (base is int and isinstance(raw, bool)):
        raise UsageError(f"override {name}={raw!r}: expected {base.__name__}")
    return raw


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """Parse ``["dropout=0.3", "heads=16"]`` into a dict; malformed items are usage errors."""
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"override '{item}' must look like KEY=VALUE (e.g. dropout=0.3)")
        k, v = item.split("=", 1)
        k = k.strip().replace("-", "_")
        if k.startswith("model."):
            k = k[len("model."):]
        out[k] = v
    return out


def apply_overrides(cfg: ModelConfig, overrides: Mapping[str, Any],
                    source: str = "override") -> ModelConfig:
    """Return a copy of ``cfg`` with ``overrides`` applied and validated."""
    names = {f.name for f in fields(ModelConfig)}
    updates: dict[str, Any] = {}
    for key, raw in overrides.items():
        targets = ALIASES.get(key, (key,))
        for t in targets:
            if t == "arch" and source == "override":
                # the preset's name, a label: --override arch=X would only rename the model
                raise UsageError(f"'{key}' is not an override: choose the preset with --arch")
            if t not in names:
                raise UsageError(f"unknown {source} key '{key}'{suggest(key, config_keys())}; "
                                 f"valid keys: {', '.join(sorted(config_keys()))}")
            updates[t] = _coerce(t, raw, None)
    return dataclasses.replace(cfg, **updates)


# Training and data configs live beside the code that uses them (nmt.training, nmt.data), but
# the model config is here because every command needs it.
__all__ = ["ModelConfig", "CHOICES", "LIMITS", "apply_overrides", "parse_overrides", "config_keys",
           "field"]
