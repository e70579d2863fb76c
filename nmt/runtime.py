"""Where a model runs and in what precision: the one device resolver and precision table.

nmt-train (``nmt.training``) and nmt-generate / ``Translator`` (``nmt.search``) both resolve
``--device`` and ``--precision`` here, so the names mean the same everywhere and fail with the
same messages:

    dev = resolve_device("auto")                         # cuda when there is a GPU, else cpu
    dev = resolve_device("cuda", local_rank=3)           # under torchrun: cuda:3 (mod #GPUs)
    dtype = check_precision("bf16", dev)                 # inference: CPU bf16 allowed if native
    check_precision("fp16", dev, training=True)          # training: bf16/fp16 need CUDA
    check_precision("int8", dev)                         # decoding on a CPU only: float32,
                                                         # then nmt.models.quantize.quantize_int8

Importing this module does not import torch (the command-line options list ``PRECISIONS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nmt.errors import NmtError, UsageError

if TYPE_CHECKING:
    import torch

# The precision table: name -> torch dtype (by name, so that importing it stays cheap).
# int8 is dynamic quantization for CPU decoding: the model is loaded in float32 and its linear
# layers are then quantized (nmt.models.quantize); it cannot train.
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "float32"}
# "auto" (decoding only): resolved by auto_precision() once the device and model are known.
PRECISIONS: tuple[str, ...] = (*_DTYPES, "auto")
TRAINING_PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
QUANTIZED_PRECISIONS: tuple[str, ...] = ("int8",)
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
    """torch.float32 / bfloat16 / float16 for fp32 / bf16 / fp16; float32 for int8 (the dtype
    the model is loaded in before its linear layers are quantized)."""
    import torch

    if precision not in _DTYPES:
        raise UsageError(f"unknown precision '{precision}' (choose from {', '.join(PRECISIONS)})")
    return getattr(torch, _DTYPES[precision])


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (taskset, a container's cpuset),
    not every CPU of the host (what --workers 0 means in nmt-preprocess and nmt-generate)."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):          # not Linux
        return max(1, os.cpu_count() or 1)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has native bf16 matrix units (AVX512-BF16/AMX), where bf16 decoding is
    about twice the fp32 speed (opt-in: it rounds weights and activations to 8 significant
    bits, so check BLEU)."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# --precision auto takes bf16 on a CPU only for models at least this wide. Measured on an AMD
# EPYC with AVX512-BF16 against fp32 with its linear layers packed (nmt.models.packed;
# BENCHMARKS.md): transformer_tiny (d_model 64) decodes 1.7x slower in bf16, transformer_small
# (256) at the same speed with 300-400 MB more memory, the OPUS-MT architecture (512) 1.3x
# faster.
AUTO_BF16_MIN_WIDTH = 512


def auto_precision(device: "torch.device", d_model: int | None) -> tuple[str, str]:
    """What --precision auto decodes with on ``device`` for a model of width ``d_model``, and
    why: bf16 on a GPU that has it, and on a CPU with native bf16 (AVX512-BF16 or AMX) for a
    model of d_model >= AUTO_BF16_MIN_WIDTH; fp32 otherwise."""
    import torch

    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", "this GPU computes in bf16"
        return "fp32", "this GPU has no bf16"
    if device.type != "cpu":
        return "fp32", f"no bf16 choice is made for {device.type}"
    if not cpu_has_native_bf16():
        return "fp32", "this CPU has no native bf16 (AVX512-BF16 or AMX)"
    if d_model is not None and d_model < AUTO_BF16_MIN_WIDTH:
        return "fp32", (f"d_model {d_model} < {AUTO_BF16_MIN_WIDTH}: too small for bf16 to "
                        f"be faster on this CPU")
    return "bf16", "this CPU has native bf16 (AVX512-BF16 or AMX) and the model is wide"


def check_training_precision(precision: str) -> None:
    """UsageError for a precision that cannot train (int8, auto: decoding only), before any
    device is looked at."""
    if precision == "auto":
        raise UsageError("--precision auto is for decoding; train in fp32, or bf16/fp16 on a "
                         "GPU")
    precision_dtype(precision)
    if precision not in TRAINING_PRECISIONS:
        raise UsageError(f"--precision {precision} is for decoding only (nmt-generate on a "
                         f"CPU); train in fp32, or bf16/fp16 on a GPU")


def check_precision(precision: str, device: "torch.device", *,
                    training: bool = False) -> "torch.dtype":
    """The dtype of ``precision`` after checking that it can run on ``device``.

    fp32 runs anywhere. Training in bf16/fp16 (autocast, and a GradScaler for fp16) needs a
    CUDA device. Inference in fp16 needs a GPU; in bf16 a GPU or a CPU with native bf16.
    int8 (dynamic quantization) is inference on a CPU only; it returns float32, the dtype to
    load the model in before quantizing it.
    """
    dtype = precision_dtype(precision)
    if training:
        check_training_precision(precision)
    if precision in QUANTIZED_PRECISIONS:
        if device.type != "cpu":
            raise UsageError(f"--precision {precision} runs on the CPU only (dynamic "
                             f"quantization); use --device cpu, or fp16/bf16 on "
                             f"{device.type}")
        return dtype
    if precision == "fp32" or device.type == "cuda":
        return dtype
    if training:
        raise UsageError(f"--precision {precision} needs a CUDA device; use fp32 on "
                         f"{device.type}")
    if not (precision == "bf16" and cpu_has_native_bf16()):
        raise UsageError(f"--precision {precision} needs a GPU{_CPU_BF16_HINT}; "
                         f"on this CPU use fp32")
    return dtype


# --- torchrun: the ranks it announces, and the device of one (training and translation) ---

@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def env_dist_info() -> DistInfo:
    """The ranks torchrun announces through the environment (one process if it does not)."""
    import os

    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise NmtError("RANK/WORLD_SIZE/LOCAL_RANK must be integers") from None
    if world < 1 or not 0 <= rank < world:
        raise NmtError(f"inconsistent RANK={rank} WORLD_SIZE={world}")
    return DistInfo(rank, world, local)


def pick_device(requested: str, info: DistInfo) -> "torch.device":
    """The device of a rank (resolve_device): 'auto' or 'cuda' mean cuda:LOCAL_RANK when CUDA
    is available ('auto': else cpu); a GPU becomes the current one."""
    device = resolve_device(requested, local_rank=info.local_rank)
    if device.type == "cuda":
        import torch

        torch.cuda.set_device(device)
    return device


__all__ = ["PRECISIONS", "TRAINING_PRECISIONS", "QUANTIZED_PRECISIONS", "resolve_device",
           "DistInfo", "env_dist_info", "pick_device", "precision_dtype", "check_precision", "check_training_precision",
           "cpu_has_native_bf16", "auto_precision", "AUTO_BF16_MIN_WIDTH", "usable_cpus"]
