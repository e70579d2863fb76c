"""fairseq Transformer args -> nmt ModelConfig, and its weights -> nmt's parameter names.

Every fairseq option that changes what the model computes at inference either maps to a
ModelConfig field or is refused, with one line naming every such option the model sets.
Options that only act in training (layerdrop, quant noise, checkpoint activations, alignment
supervision) change no weight and no translation, so they are accepted.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch

from nmt.errors import NmtError
from nmt.interop.foreign import permute_rows, probability, refuse
from nmt.specials import BOS, EOS, PAD, UNK

# fairseq's transformer family: one model class, these presets (same modules, other sizes).
TRANSFORMER_ARCHS = frozenset({
    "transformer", "transformer_iwslt_de_en", "transformer_wmt_en_de",
    "transformer_vaswani_wmt_en_de_big", "transformer_vaswani_wmt_en_fr_big",
    "transformer_wmt_en_de_big", "transformer_wmt_en_de_big_t2t", "transformer_tiny",
    "transformer_align", "transformer_wmt_en_de_big_align"})
# fairseq's dictionary puts its specials first, in this order (ids 0-3) ...
FAIRSEQ_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
# ... and nmt's special id -> fairseq's id of the same symbol (then the same symbols follow).
NMT_FROM_FAIRSEQ = {PAD: 1, BOS: 0, EOS: 2, UNK: 3}


def nmt_rows(fairseq_rows: torch.Tensor) -> torch.Tensor:
    """Embedding/output rows in nmt's order: fairseq's with <s> and <pad> swapped (what
    nmt_dictionary's order is for every fairseq dictionary)."""
    n = fairseq_rows.size(0)
    order = [NMT_FROM_FAIRSEQ[i] for i in range(4)] + list(range(4, n))
    return permute_rows(fairseq_rows, order)


ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish"}
# Options that make the model compute something nmt does not: refused when set.
UNSUPPORTED = {
    "adaptive_softmax_cutoff": "adaptive softmax",
    "adaptive_input": "adaptive input embeddings",
    "cross_self_attention": "cross+self attention",
    "no_cross_attention": "a decoder without encoder attention",
    "no_token_positional_embeddings": "no positional embeddings",
    "encoder_layers_to_keep": "pruned encoder layers",
    "decoder_layers_to_keep": "pruned decoder layers",
    "char_inputs": "character inputs",
    "scale_attn": "NormFormer attention LayerNorm",
    "scale_fc": "NormFormer FFN LayerNorm",
    "scale_heads": "NormFormer head scaling",
    "scale_resids": "NormFormer residual scaling",
    "base_layers": "BASE layers",
}
# Ignored state-dict entries: version counters, the sinusoids' device marker, and fairseq
# 0.12's copies of encoder weights for torch's BetterTransformer fast path (duplicates).
BT_COPIES = ("in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias",
             "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")


SIZES = ("encoder_embed_dim", "encoder_layers", "decoder_layers", "encoder_ffn_embed_dim",
         "encoder_attention_heads")


def _set(value: Any) -> bool:
    return value not in (None, False, 0, "", "None", "none", "0") and value != []


def model_fields(args: Mapping[str, Any]) -> dict:
    """ModelConfig fields of a fairseq transformer's args (flat, legacy names)."""

    arch = args.get("arch") or args.get("_name")
    if arch not in TRANSFORMER_ARCHS:
        raise NmtError(f"cannot import fairseq architecture '{arch}': nmt imports the "
                       f"transformer family ({', '.join(sorted(TRANSFORMER_ARCHS))})")
    missing = [k for k in SIZES if not isinstance(args.get(k), int)]
    if missing:
        raise NmtError(f"not a fairseq transformer's arguments: no {', '.join(missing)}")
    d = args["encoder_embed_dim"]
    pre_norm = bool(args.get("encoder_normalize_before", False))
    act = args.get("activation_fn", "relu")
    learned = bool(args.get("encoder_learned_pos", False))
    src_pos = int(args.get("max_source_positions") or 1024)
    tgt_pos = int(args.get("max_target_positions") or 1024)
    refuse("cannot import this fairseq model (no exact equivalent in nmt)",
           unsupported(args, pre_norm, act, (src_pos, tgt_pos) if learned else None))
    where = "the fairseq checkpoint"
    dropout = probability(args.get("dropout", 0.1), "dropout", where)
    return dict(
        arch=f"fairseq_{arch}", encoder_layers=int(args["encoder_layers"]),
        decoder_layers=int(args["decoder_layers"]), d_model=int(d),
        d_ff=int(args["encoder_ffn_embed_dim"]), heads=int(args["encoder_attention_heads"]),
        dropout=dropout,
        attention_dropout=probability(args.get("attention_dropout") or 0.0, "attention_dropout",
                                      where),
        activation_dropout=probability(args.get("activation_dropout")
                                       or args.get("relu_dropout") or 0.0, "activation_dropout",
                                       where),
        label_smoothing=float(args.get("label_smoothing", 0.1) or 0.0),
        positional="learned" if learned else "sinusoidal", sinusoid_layout="fairseq",
        position_offset=2,       # fairseq: positions start after padding_idx (1)
        max_positions=tgt_pos, pre_norm=pre_norm, activation=ACTIVATIONS[act],
        scale_embedding=not bool(args.get("no_scale_embedding", False)),
        layernorm_embedding=bool(args.get("layernorm_embedding", False)),
        tie_output=bool(args.get("share_decoder_input_output_embed", False)
                        or args.get("share_all_embeddings", False)),
        output_bias=False, decoder_start="eos",
        # fairseq-generate's defaults: beam 5, score / len^1.0, at most 200 tokens (and the
        # decoder's positions), eos never first (SequenceGenerator's min_len 1: without it a
        # short source can translate to nothing, which fairseq never outputs).
        beam=5, lenpen=1.0, lenpen_formula="fairseq", max_len_a=0.0,
        max_len_b=min(200, tgt_pos - 1), min_len=1)


def unsupported(args: Mapping[str, Any], pre_norm: bool, act: Any,
                learned_positions: tuple[int, int] | None) -> list[str]:
    """What a fairseq transformer's ``args`` make it compute that nmt does not, each named
    with the options that say so (``learned_positions``: the source and target tables' rows,
    None for sinusoids)."""
    problems = [f"{what} ({option})" for option, what in UNSUPPORTED.items()
                if _set(args.get(option))]
    for a, b in (("encoder_embed_dim", "decoder_embed_dim"),
                 ("decoder_embed_dim", "decoder_input_dim"),
                 ("decoder_embed_dim", "decoder_output_dim"),
                 ("encoder_ffn_embed_dim", "decoder_ffn_embed_dim"),
                 ("encoder_attention_heads", "decoder_attention_heads"),
                 ("encoder_normalize_before", "decoder_normalize_before"),
                 ("encoder_learned_pos", "decoder_learned_pos")):
        if args.get(b, args.get(a)) != args.get(a):
            problems.append(f"encoder and decoder differing ({a}={args.get(a)}, "
                            f"{b}={args.get(b)})")
    if pre_norm and _set(args.get("no_decoder_final_norm")):
        problems.append("a pre-norm decoder without its final LayerNorm "
                        "(no_decoder_final_norm)")
    if act not in ACTIVATIONS:
        problems.append(f"the {act} activation (activation_fn={act})")
    if learned_positions and learned_positions[0] != learned_positions[1]:
        problems.append("learned position tables of different sizes (max_source_positions="
                        "{}, max_target_positions={})".format(*learned_positions))
    return problems


class _Source:
    """The fairseq state dict, remembering which entries were used."""

    def __init__(self, state: Mapping[str, torch.Tensor]):
        self.state, self.used = state, set()

    def has(self, key: str) -> bool:
        return key in self.state

    def __call__(self, key: str) -> torch.Tensor:
        if key not in self.state:
            raise NmtError(f"fairseq checkpoint lacks the weight '{key}' its arguments imply")
        self.used.add(key)
        return self.state[key]

    def unused(self) -> list[str]:
        return [k for k in self.state if k not in self.used and not _ignorable(k)]


def _ignorable(key: str) -> bool:
    parts = key.split(".")
    # embed_positions.weights: the cached sinusoid table of old checkpoints, which fairseq
    # itself drops on load (learned positions are embed_positions.weight).
    return (parts[-1] in ("version", "_float_tensor") or parts[-2:] == ["embed_positions", "weights"]
            or (parts[0] == "encoder" and len(parts) == 4 and parts[1] == "layers"
                and parts[3] in BT_COPIES))


def _attention(src: _Source, p: str, kind: str) -> torch.Tensor:
    """Projection ``kind`` ('qkv', 'q' or 'kv', 'weight'/'bias' appended by the caller) of the
    attention at prefix ``p``: fused as nmt keeps it. Old checkpoints hold one in_proj."""
    proj, param = kind.rsplit(".", 1)
    if src.has(f"{p}.in_proj_{param}"):
        full = src(f"{p}.in_proj_{param}")
        d = full.size(0) // 3
        return {"qkv": full, "q": full[:d], "kv": full[d:]}[proj].clone()
    return torch.cat([src(f"{p}.{c}_proj.{param}") for c in proj])     # proj: "qkv" ...


def _norm(src: _Source, new: str, old: str) -> Callable[[str], torch.Tensor]:
    return lambda param: src(f"{new}.{param}" if src.has(f"{new}.{param}") else f"{old}.{param}")


def nmt_state(src: _Source, keys: list[str], share_all: bool) -> dict[str, torch.Tensor]:
    """nmt's state dict (``keys``: an nmt model's state_dict keys) from fairseq's weights."""

    direct = {"src_embed.weight": lambda: nmt_rows(src("encoder.embed_tokens.weight")),
              "tgt_embed.weight": lambda: nmt_rows(src("decoder.embed_tokens.weight")),
              "output_weight": lambda: nmt_rows(src("decoder.output_projection.weight"
                                                    if src.has("decoder.output_projection.weight")
                                                    else "decoder.embed_out")),
              "src_pos.weight": lambda: src("encoder.embed_positions.weight"),
              "tgt_pos.weight": lambda: src("decoder.embed_positions.weight")}
    prefixes = {"encoder_norm.": "encoder.layer_norm.", "decoder_norm.": "decoder.layer_norm.",
                "src_embed_norm.": "encoder.layernorm_embedding.",
                "tgt_embed_norm.": "decoder.layernorm_embedding."}
    out = {}
    for key in keys:
        if key in direct:
            out[key] = direct[key]()
        elif key.startswith(("encoder_layers.", "decoder_layers.")):
            out[key] = layer_weight(src, key)
        else:
            prefix = next((p for p in prefixes if key.startswith(p)), None)
            if prefix is None:
                raise NmtError(f"no fairseq weight for nmt's {key}")
            out[key] = src(prefixes[prefix] + key[len(prefix):])
    if share_all:       # one matrix: fairseq's encoder and decoder embeddings are the same
        src("decoder.embed_tokens.weight")
    # A tied output projection is the decoder embedding itself (fairseq saves both names).
    if "output_weight" not in out and src.has("decoder.output_projection.weight"):
        src("decoder.output_projection.weight")
    left = src.unused()
    if left:
        raise NmtError(f"cannot import this fairseq model: weights nmt has no place for "
                       f"({', '.join(left[:4])}{' ...' if len(left) > 4 else ''})")
    return {k: v.float().contiguous() for k, v in out.items()}


def layer_weight(src: _Source, key: str) -> torch.Tensor:
    """The fairseq tensor for nmt's ``{encoder,decoder}_layers.I.<module>.<param>``."""
    side, i, rest = key.split(".", 2)
    p = f"{side.split('_')[0]}.layers.{i}"
    module, param = rest.rsplit(".", 1)
    enc = side == "encoder_layers"
    table = {
        "self_attn.in_proj": lambda: _attention(src, f"{p}.self_attn", f"qkv.{param}"),
        "self_attn.out_proj": lambda: src(f"{p}.self_attn.out_proj.{param}"),
        "cross_attn.q_proj": lambda: _attention(src, f"{p}.encoder_attn", f"q.{param}"),
        "cross_attn.kv_proj": lambda: _attention(src, f"{p}.encoder_attn", f"kv.{param}"),
        "cross_attn.out_proj": lambda: src(f"{p}.encoder_attn.out_proj.{param}"),
        "ffn.fc1": lambda: src(f"{p}.fc1.{param}"),
        "ffn.fc2": lambda: src(f"{p}.fc2.{param}"),
        # Old checkpoints number a layer's norms (fairseq's upgrade_state_dict_named): the
        # encoder's layer_norms.0/1, the decoder's layer_norms.0/1/2, in sublayer order.
        "res1.norm": lambda: _norm(src, f"{p}.self_attn_layer_norm", f"{p}.layer_norms.0")(param),
        "res2.norm": lambda: _norm(src, f"{p}.final_layer_norm" if enc else
                                   f"{p}.encoder_attn_layer_norm", f"{p}.layer_norms.1")(param),
        "res3.norm": lambda: _norm(src, f"{p}.final_layer_norm", f"{p}.layer_norms.2")(param),
    }
    if module not in table:
        raise NmtError(f"no fairseq weight for nmt's {key}")
    return table[module]()


__all__ = ["model_fields", "nmt_state", "layer_weight", "_Source", "unsupported",
           "UNSUPPORTED"]
