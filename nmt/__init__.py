"""nmt: the Transformer of "Attention Is All You Need" as a command-line toolkit and library.

Python API::

    import nmt
    nmt.list_archs()                       # ['transformer_base', 'transformer_big', ...]
    cfg = nmt.get_arch("transformer_base", {"dropout": 0.3})
    model = nmt.build_model(cfg, src_vocab_size=37000, tgt_vocab_size=37000)
    nmt.Translator.from_checkpoint("checkpoint.pt").translate(["Hello world"])

    from nmt.search.config import BatchConfig, SearchConfig   # unset: the checkpoint's preset
    nmt.Translator.from_checkpoint("checkpoint.pt", search=SearchConfig(beam=5),
                                   batch=BatchConfig(max_tokens=4096), device="auto")
"""

from nmt.config import ModelConfig
from nmt.errors import NmtError
from nmt.registry import get_arch, list_archs, register_arch
from nmt.version import __version__

__all__ = ["ModelConfig", "NmtError", "get_arch", "list_archs", "register_arch", "build_model",
           "Translator", "__version__"]


def __getattr__(name):
    # Lazy imports keep `import nmt` cheap for the CLIs that do not need torch models.
    if name == "build_model":
        from nmt.models.transformer import build_model
        return build_model
    if name == "Translator":
        from nmt.search.translator import Translator
        return Translator
    raise AttributeError(f"module 'nmt' has no attribute '{name}'")


def __dir__():
    """The public API first among the module's names, the lazy ones included."""
    return sorted(set(globals()) | set(__all__))
