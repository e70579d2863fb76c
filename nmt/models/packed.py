"""Linear layers with weights packed once for oneDNN, for decoding on a CPU in float32.

    from nmt.models.packed import pack_linears
    pack_linears(model)          # in place, inference only; False where it does not apply

``F.linear`` on a CPU lays the weight out for the matrix kernel at every call. Decoding calls
each layer once per step with a few hundred rows at most, so that costs a good part of the
product: oneDNN's linear on a weight reordered once (``torch.ops.mkldnn._reorder_linear_weight``
and ``_linear_pointwise``, what torch.compile's CPU backend calls for frozen weights) takes
10-35% less time for the shapes of a decoding step of transformer_small, and 20-50% less for
its pre-softmax projection (AMD EPYC, one thread). Each row's result does not depend on the
other rows of the call, so a sentence's translation still does not depend on its batch.

Every ``nn.Linear`` of the model is replaced by a PackedLinear holding only the packed weight
and the bias, and the tied pre-softmax projection gets a packed copy of its own
(``Transformer.packed_output``; the embedding lookups keep the plain matrix). A packed model
cannot be trained, saved, moved or converted: checkpoints stay as they are, and packing
happens when one is loaded for decoding (``Translator.from_checkpoint``).
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import Tensor, nn

log = logging.getLogger("nmt")


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether this PyTorch has oneDNN's packed linear and it computes what F.linear does (a
    small self-check, once per process)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        g = torch.Generator().manual_seed(0)
        w, b, x = (torch.randn(*s, generator=g) for s in ((24, 16), (24,), (5, 16)))
        y = torch.ops.mkldnn._linear_pointwise(
            x, torch.ops.mkldnn._reorder_linear_weight(w, None), b, "none", [], "")
        return bool(torch.allclose(y, nn.functional.linear(x, w, b), rtol=1e-4, atol=1e-5))
    except (AttributeError, RuntimeError) as e:
        log.debug("packed linear layers unavailable: %s", e)
        return False


class PackedLinear(nn.Module):
    """``x W^T + b`` with W packed for oneDNN; for inference on a CPU only."""

    def __init__(self, weight: Tensor, bias: Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # plain attributes, not buffers: a packed tensor has no place in a state_dict or on a
        # GPU, and nothing should try to move it there
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self.bias = None if bias is None else bias.detach().clone()

    def forward(self, x: Tensor, then: str = "none") -> Tensor:
        """x W^T + b; ``then`` "relu": relu of it, in the same call."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, then, [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


# Where packing pays (fp32, 1 thread, Multi30k val, beam 4 / greedy, same output): d_model 256
# (transformer_small) 11% / 19% less CPU time; d_model 64 (transformer_tiny) 13% more, its
# products too small to outweigh the call's own cost. bf16 at d_model 256: no gain.
PACK_MIN_WIDTH = 256


def pack_linears(model: nn.Module) -> bool:
    """Pack ``model``'s linear layers in place (see the module docstring); False, and the model
    unchanged, where that does not apply or pay: not on a CPU, not float32, d_model below
    PACK_MIN_WIDTH, or no packed linear in this PyTorch."""
    first = next(model.parameters(), None)
    cfg = getattr(model, "cfg", None)
    if (first is None or first.device.type != "cpu" or first.dtype != torch.float32
            or cfg is None or cfg.d_model < PACK_MIN_WIDTH or not available()):
        return False
    model.eval()
    with torch.no_grad():
        for module in list(model.modules()):
            for name, child in list(module.named_children()):
                if type(child) is nn.Linear:
                    setattr(module, name, PackedLinear(child.weight, child.bias))
        if hasattr(model, "packed_output") and getattr(model, "quantized_output", None) is None:
            model.packed_output = PackedLinear(model.projection_weight, None)
    return True


__all__ = ["PackedLinear", "pack_linears", "available"]
