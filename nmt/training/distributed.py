"""torchrun integration: read RANK/WORLD_SIZE/LOCAL_RANK, pick the device and the backend.

``torchrun --nproc_per_node 8 --no-python nmt-train ...`` sets the environment; without it
training runs in one process and nothing here talks to the network.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from nmt.errors import NmtError
# torchrun's ranks and the device of one: the runtime's, shared with translation
from nmt.runtime import DistInfo, env_dist_info, pick_device  # noqa: F401 (re-exported)

log = logging.getLogger("nmt.train")


def init_distributed(info: DistInfo, device: torch.device, timeout_minutes: float) -> None:
    """Join the process group torchrun prepared: NCCL on GPUs, gloo on CPU."""
    if not info.enabled or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise NmtError(f"WORLD_SIZE={info.world_size} but {var} is not set; "
                           f"launch with torchrun")
    try:
        dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size,
                                timeout=datetime.timedelta(minutes=timeout_minutes),
                                device_id=device if device.type == "cuda" else None)
    except (RuntimeError, ValueError) as e:
        raise NmtError(f"cannot join the process group ({backend}): "
                       f"{' '.join(str(e).split())[:200]}") from None
    log.info("rank %d/%d joined the %s process group", info.rank, info.world_size, backend)


def collective_failure(e: BaseException, timeout_minutes: float) -> str | None:
    """A one-line message when ``e`` is a failed collective (a rank died, hung past the
    timeout or lost its connection), else None."""
    if not dist.is_initialized():
        return None
    text = " ".join(str(e).split())
    low = text.lower()
    if not (isinstance(e, dist.DistError) or any(
            k in low for k in ("gloo", "nccl", "timed out", "timeout", "connection closed",
                               "connection reset", "broken pipe"))):
        return None
    rank = dist.get_rank()
    return (f"rank {rank}: a collective operation failed: another rank died, hung or lost "
            f"its connection (--ddp-timeout {timeout_minutes:g} min) ({text[:200]})")


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_object(obj: Any, info: DistInfo) -> list[Any]:
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def sum_allreduce_hook(state, bucket):  # no annotations: DDP inspects them at runtime
    """DDP communication hook: sum gradients (DDP's default averages them).

    The trainer divides the summed gradient by the update's total number of target tokens, so
    each token weighs the same whatever rank or micro-batch it came from.
    """
    fut = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])
