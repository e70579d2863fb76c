"""Where a model runs and in what precision: the one device resolver and precision table.

nmt-train (``nmt.training``) and nmt-generate / ``Translator`` (``nmt.search``) both resolve
``--device`` and ``--precision`` here, so the names mean the same everywhere and fail with the
same messages:

    dev = resolve_device("auto")                         # cuda when there is a GPU, else cpu
    dev = resolve_device("cuda", local_rank=3)           # under torchrun: cuda:3 (mod #GPUs)
    dtype = check_precision("bf16", dev)                 # inference: CPU bf16 allowed if native
    check_precision("fp16", dev, training=True)          # training: bf16/fp16 need CUDA

Importing this module does not import torch (the command-line options list ``PRECISIONS``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nmt.errors import UsageError

if TYPE_CHECKING:
    import torch

# The precision table: name -> torch dtype (by name, so that importing it stays cheap).
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
PRECISIONS: tuple[str, ...] = tuple(_DTYPES)
DEVICE_HELP = "cpu, cuda, cuda:N or auto"
_CPU_BF16_HINT = " (bf16 also runs on CPUs with native bf16 support, e.g. AVX512-BF16)"


def resolve_device(device: "str | torch.device | None" = "auto",
                   local_rank: int | None = None) -> "torch.device":
    """The torch device ``device`` names: cpu, cuda, cuda:N, or auto/None (a GPU when CUDA is
    available, else the CPU).

    With ``local_rank`` (torchrun), a CUDA device without an index becomes
    ``cuda:local_rank`` (modulo the number of GPUs); without it, it stays ``cuda``.
    Raises UsageError for an unknown name or a CUDA device on a machine without one.
    """
    import torch

    if device is None or str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UsageError(f"unknown device '{device}' (use {DEVICE_HELP})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device '{device}' requested but no CUDA GPU is available")
        if dev.index is None and local_rank is not None:
            dev = torch.device("cuda", local_rank % torch.cuda.device_count())
    return dev


def precision_dtype(precision: str) -> "torch.dtype":
    """torch.float32 / bfloat16 / float16 for fp32 / bf16 / fp16."""
    import torch

    if precision not in _DTYPES:
        raise UsageError(f"unknown precision '{precision}' (choose from {', '.join(PRECISIONS)})")
    return getattr(torch, _DTYPES[precision])


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has native bf16 matrix units (AVX512-BF16/AMX), where bf16 decoding is
    about twice the fp32 speed (opt-in: it rounds weights and activations to 8 significant
    bits, so check BLEU)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def check_precision(precision: str, device: "torch.device", *,
                    training: bool = False) -> "torch.dtype":
    """The dtype of ``precision`` after checking that it can run on ``device``.

    fp32 runs anywhere. Training in bf16/fp16 (autocast, and a GradScaler for fp16) needs a
    CUDA device. Inference in fp16 needs a GPU; in bf16 a GPU or a CPU with native bf16.
    """
    dtype = precision_dtype(precision)
    if precision == "fp32" or device.type == "cuda":
        return dtype
    if training:
        raise UsageError(f"--precision {precision} needs a CUDA device; use fp32 on "
                         f"{device.type}")
    if not (precision == "bf16" and cpu_has_native_bf16()):
        raise UsageError(f"--precision {precision} needs a GPU{_CPU_BF16_HINT}; "
                         f"on this CPU use fp32")
    return dtype


__all__ = ["PRECISIONS", "resolve_device", "precision_dtype", "check_precision",
           "cpu_has_native_bf16"]
