"""The wire formats of the torch ``DistributedOptimizer``: hvdtrain's compression names
and Horovod's compressor objects for them, and, on a Horovod without hvdtrain's bfloat16
patch, bfloat16 on the wire through Horovod's allgather."""

from __future__ import annotations

from typing import Any

import torch
from horovod.torch import Compression

from hvdtrain.collective import ReduceOp, TensorCollective
from hvdtrain.compression import wire_format
from hvdtrain.validation import require_compression


class BFloat16Compressor:
    """Horovod's compressor interface for bfloat16 on the wire: floating-point tensors
    are sent as bfloat16 (Horovod with hvdtrain's patch 0011-bfloat16 reduces them
    natively) and come back in their own dtype; other tensors travel unchanged."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        """``tensor`` as bfloat16 (when it is floating point), and its dtype."""
        if tensor.dtype.is_floating_point and tensor.dtype != torch.bfloat16:
            return tensor.to(torch.bfloat16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``tensor`` back in ``dtype``, the dtype :meth:`compress` was given."""
        return tensor if tensor.dtype == dtype else tensor.to(dtype)


def horovod_compression(name: str | None) -> Any:
    """Horovod's compressor for hvdtrain's ``compression`` called ``name``. Without the
    bfloat16 patch, "bf16" travels through Horovod's allgather
    (:func:`bf16_allreduce_async`), so Horovod sees no compression."""
    if name == "fp16":
        return Compression.fp16
    if name == "bf16" and wire_format(name).reduced_natively:
        return BFloat16Compressor
    return Compression.none


def bf16_allreduce_async(gradient: torch.Tensor, name: str, op: ReduceOp,
                         tensors: TensorCollective) -> Any:
    """Average (or sum, by ``op``) ``gradient`` across the workers of ``tensors`` with
    bfloat16 on the wire, on a Horovod without hvdtrain's bfloat16 patch.

    The bfloat16 bits travel as int16 through Horovod's allgather and each rank adds
    the ranks' values in rank order in the gradient's own dtype: every rank gets the
    identical result.
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
    if compression is BFloat16Compressor:
        return "bf16"
    require_compression(compression)
    return compression
