"""The Transformer model, its layers and its explicit decoder state."""

from nmt.models.state import DecoderState, EncoderOut
from nmt.models.transformer import (BOS, EOS, PAD, UNK, Transformer, build_model, count_parameters,
                                    parameter_count)

__all__ = ["Transformer", "build_model", "count_parameters", "parameter_count", "DecoderState",
           "EncoderOut", "PAD", "BOS", "EOS", "UNK"]
