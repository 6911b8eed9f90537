"""The wire formats of the torch ``DistributedOptimizer``: hvdtrain's compression names
and Horovod's objects for them, and bfloat16 on the wire through Horovod's allgather."""

from __future__ import annotations

from typing import Any

import torch
from horovod.torch import Compression

from hvdtrain.collective import ReduceOp, TensorCollective
from hvdtrain.validation import require_compression

# bf16 travels through Horovod's allgather (bf16_allreduce_async), so Horovod sees none.
HOROVOD_COMPRESSION = {None: Compression.none, "fp16": Compression.fp16,
                       "bf16": Compression.none}


def bf16_allreduce_async(gradient: torch.Tensor, name: str, op: ReduceOp,
                         tensors: TensorCollective) -> Any:
    """Average (or sum, by ``op``) ``gradient`` across the workers of ``tensors`` with
    bfloat16 on the wire.

    Horovod 0.28.1 has no bfloat16 reduction, so the bfloat16 bits travel as int16
    through Horovod's allgather and each rank adds the ranks' values in rank order
    in the gradient's own dtype: every rank gets the identical result.
    """
    bits = gradient.detach().to(torch.bfloat16).reshape(1, -1).view(torch.int16)
    handle = tensors.allgather(bits, f"{name}.bf16")

    def reduced() -> torch.Tensor:
        gathered = tensors.wait(handle).view(torch.bfloat16).to(gradient.dtype)
        total = gathered.sum(dim=0)
        if op == "average":
            total /= gathered.shape[0]
        return total.view_as(gradient)

    return reduced


def compression_name(compression: Any) -> str | None:
    """hvdtrain's name for ``compression``, which may also be Horovod's object."""
    if compression is Compression.none:
        return None
    if compression is Compression.fp16:
        return "fp16"
    require_compression(compression)
    return compression
