"""int8 CPU decoding (``nmt-generate --precision int8``): dynamic quantization of a Transformer.

    from nmt.models.quantize import quantize_int8
    model = quantize_int8(model)             # in place, eval mode, CPU only; inference only

Every ``nn.Linear`` of the model (the attention projections ``in_proj``, ``q_proj``,
``kv_proj``, ``out_proj`` and the feed-forward ``fc1``/``fc2``) is replaced by
``torch.ao.nn.quantized.dynamic.Linear``: its weights are stored in int8 (one scale per output
row, symmetric), its input is quantized to uint8 on the fly for each call (dynamic
quantization: no calibration data) and the product accumulates in int32 before it is scaled
back to float32 (fbgemm/onednn kernels on x86, qnnpack on ARM).

The pre-softmax projection is tied to the target embedding and computed with
``F.linear(x, tgt_embed.weight)``, not an ``nn.Linear``; with ``output_projection=True`` (the
default) the model gets an int8 copy of that matrix in ``Transformer.quantized_output``, which
``output_projection`` then uses. The embedding lookups keep the float32 matrix. Embeddings,
positional encodings, layer norms, attention scores and softmax stay float32. On
transformer_small (d_model 256, 8,000 subwords) the output projection is the largest product
of a decoding step and where int8 gains: quantizing the nn.Linear layers alone did not make
beam search measurably faster (benchmarks/bench_int8.py, variant int8-linear).

Each call quantizes its whole input [rows, ..., D] with one scale, so a sentence's int8
translation can depend on the other sentences of its batch (fp32's does not): the same input
with the same batching options gives the same output, another --batch-size may change a few
lines (on Multi30k test, 253 of 300 lines identical between batches of 1 and of 64 sentences).

A quantized model cannot be trained, moved to a GPU or converted to another dtype; its
``state_dict`` is not a checkpoint. Checkpoints stay float32: quantization happens when one is
loaded (``Translator.from_checkpoint(..., precision="int8")``).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from nmt.errors import UsageError


def quantized_engine() -> str:
    """The quantized CPU engine PyTorch will use (x86/fbgemm/onednn/qnnpack); UsageError when
    this build of PyTorch has none."""
    engines = [e for e in torch.backends.quantized.supported_engines if e != "none"]
    if not engines:
        raise UsageError("--precision int8 needs a PyTorch build with quantized CPU kernels "
                         "(fbgemm/x86 or qnnpack); this one has none, use fp32")
    engine = torch.backends.quantized.engine
    if engine == "none" or engine not in engines:
        engine = "x86" if "x86" in engines else engines[0]
        torch.backends.quantized.engine = engine
    return engine


def _qconfig(per_channel: bool):
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig

    return per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig


def quantize_int8(model: nn.Module, *, output_projection: bool = True,
                  per_channel: bool = True) -> nn.Module:
    """Quantize ``model``'s linear layers to int8 in place (see the module docstring) and return
    it, in eval mode.

    ``output_projection``: also give a Transformer an int8 copy of its tied pre-softmax
    projection (``Transformer.quantized_output``). ``per_channel``: one weight scale per output
    row (False: one per matrix).
    """
    from torch.ao.quantization import quantize_dynamic

    quantized_engine()
    first = next(model.parameters(), None)
    if first is not None and (first.device.type != "cpu" or first.dtype != torch.float32):
        raise UsageError(f"int8 quantization needs a float32 model on the CPU, not "
                         f"{first.dtype} on {first.device.type}")
    model.eval()
    if output_projection and hasattr(model, "quantized_output") and hasattr(model, "tgt_embed"):
        weight = model.projection_weight       # the output bias, if any, is added after it
        proj = nn.Linear(weight.size(1), weight.size(0), bias=False)
        proj.weight = weight            # shared until quantize_dynamic takes its int8 copy
        model.quantized_output = proj
    qconfig = _qconfig(per_channel)
    with torch.no_grad(), warnings.catch_warnings():
        # torch >= 2.10 announces that quantized tensor types will move out of PyTorch; the
        # kernels work, and a warning on every nmt-generate run would only be noise.
        warnings.filterwarnings("ignore", message=r".*quantize_per_(tensor|channel).*",
                                category=UserWarning)
        warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization.*",
                                category=DeprecationWarning)
        quantize_dynamic(model, {nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)
    return model


def is_quantized(model: nn.Module) -> bool:
    """Whether ``model`` holds dynamically quantized linear layers."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    return any(isinstance(m, DynamicLinear) for m in model.modules())


__all__ = ["quantize_int8", "is_quantized", "quantized_engine"]
