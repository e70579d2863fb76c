"""transformers' Marian (MarianMTModel, MarianConfig) and nmt's Transformer, written once for
both ways: ``nmt-export --format huggingface`` (nmt.interop.hf_export) writes these names and
keys, ``nmt-import huggingface`` (nmt.interop.hf_import) reads them.

- the parameters: each nmt module's Marian name, layer by layer (:func:`layer_modules`); nmt
  fuses projections that Marian keeps apart: self-attention's [q; k; v] (``in_proj``) and
  encoder-decoder attention's [k; v] (``kv_proj``) are Marian's ``q_proj``, ``k_proj`` and
  ``v_proj`` stacked along the output rows (:func:`marian_names`);
- the embeddings, the output projection and bias (:data:`EMBEDDINGS`, :data:`OUTPUT`,
  :data:`OUTPUT_BIAS`); the position tables are nmt.interop.hf_positions';
- the configuration: MarianConfig's keys of ModelConfig's fields (:data:`CONFIG_FIELDS`), and
  config.json built from a ModelConfig (:func:`marian_config`).
"""

from __future__ import annotations

from typing import Iterator

from nmt.interop.hf_positions import MARK, positions_mark
from nmt.specials import EOS, PAD

# The one embedding matrix under each of Marian's names: transformers ties the encoder's and
# decoder's to the shared one only when tie_word_embeddings is true.
EMBEDDINGS = ("model.shared.weight", "model.encoder.embed_tokens.weight",
              "model.decoder.embed_tokens.weight")
OUTPUT = "lm_head.weight"             # the output projection, when not tied to the embeddings
OUTPUT_BIAS = "final_logits_bias"     # [1, vocabulary]

# One layer's modules, each with a weight and a bias: (Marian's name, nmt's name, the
# projections Marian keeps apart that nmt's module fuses, in its row order; "" for none).
ENCODER_LAYER = (("self_attn", "self_attn.in_proj", "qkv"),
                 ("self_attn_layer_norm", "res1.norm", ""),
                 ("self_attn.out_proj", "self_attn.out_proj", ""),
                 ("fc1", "ffn.fc1", ""), ("fc2", "ffn.fc2", ""),
                 ("final_layer_norm", "res2.norm", ""))
DECODER_LAYER = (("self_attn", "self_attn.in_proj", "qkv"),
                 ("encoder_attn", "cross_attn.kv_proj", "kv"),
                 ("self_attn_layer_norm", "res1.norm", ""),
                 ("self_attn.out_proj", "self_attn.out_proj", ""),
                 ("encoder_attn.q_proj", "cross_attn.q_proj", ""),
                 ("encoder_attn.out_proj", "cross_attn.out_proj", ""),
                 ("encoder_attn_layer_norm", "res2.norm", ""),
                 ("fc1", "ffn.fc1", ""), ("fc2", "ffn.fc2", ""),
                 ("final_layer_norm", "res3.norm", ""))
PARTS = ("weight", "bias")

# MarianConfig's keys that hold a ModelConfig field, in config.json's order; a size nmt has
# once for both sides (heads, d_ff) is the encoder's key and the decoder's.
CONFIG_FIELDS = (("d_model", "d_model"), ("encoder_layers", "encoder_layers"),
                 ("decoder_layers", "decoder_layers"), ("encoder_attention_heads", "heads"),
                 ("decoder_attention_heads", "heads"), ("encoder_ffn_dim", "d_ff"),
                 ("decoder_ffn_dim", "d_ff"), ("activation_function", "activation"),
                 ("scale_embedding", "scale_embedding"),
                 ("max_position_embeddings", "max_positions"), ("dropout", "dropout"),
                 ("attention_dropout", "attention_dropout"),
                 ("activation_dropout", "activation_dropout"))


def layer_modules(cfg) -> Iterator[tuple[str, str, str]]:
    """(Marian's module, nmt's module, fused projections) of every layer of a model of
    ``cfg``, the encoder's first."""
    for side, layers, table in (("encoder", cfg.encoder_layers, ENCODER_LAYER),
                                ("decoder", cfg.decoder_layers, DECODER_LAYER)):
        for i in range(layers):
            for marian, nmt, fused in table:
                yield f"model.{side}.layers.{i}.{marian}", f"{side}_layers.{i}.{nmt}", fused


def marian_names(module: str, fused: str, part: str) -> list[str]:
    """Marian's names of ``part`` ("weight" or "bias") of ``module``: one, or one per
    projection that nmt fuses (``fused``), in nmt's row order."""
    return [f"{module}.{p}_proj.{part}" for p in fused] if fused else [f"{module}.{part}"]


def marian_config(cfg, vocab_size: int) -> dict:
    """config.json: the MarianConfig of a model of ``cfg`` (nmt.config.ModelConfig)."""
    return {
        "architectures": ["MarianMTModel"], "model_type": "marian",
        "vocab_size": vocab_size, "decoder_vocab_size": vocab_size,
        **{key: getattr(cfg, field) for key, field in CONFIG_FIELDS}, "init_std": 0.02,
        "pad_token_id": PAD, "eos_token_id": EOS, "forced_eos_token_id": EOS,
        "bos_token_id": None, "decoder_start_token_id": cfg.start_id,
        "share_encoder_decoder_embeddings": True, "tie_word_embeddings": cfg.tie_output,
        "is_encoder_decoder": True, "use_cache": True, "dtype": "float32",
        MARK: positions_mark(cfg),
    }


__all__ = ["EMBEDDINGS", "OUTPUT", "OUTPUT_BIAS", "CONFIG_FIELDS", "layer_modules",
           "marian_names", "marian_config"]
