"""The tally that rides behind the gradients in the torch optimizer's flat allreduce
(and behind each worker's slice of them in the reduce-scatter of ``shard_gradients``),
written and read as :mod:`hvdtrain.tally` lays it out: each rank's 1, then the L2
norm of its gradients, so the non-finite check reads one number instead of every
gradient.
"""

from __future__ import annotations

import math

import torch

from hvdtrain import tally as rules
from hvdtrain.sharding import ShardLayout
from hvdtrain.tally import TALLY

try:  # built by setup.py when a C compiler is there
    from hvdtrain import _packing
except ImportError:  # pragma: no cover - depends on the installation
    _packing = None


def flat_with_tally(gradients: list[torch.Tensor], dtype: torch.dtype, device: torch.device,
                    *, bound: bool, fused: bool = True) -> torch.Tensor:
    """``gradients`` copied into one buffer, followed by the tally: 1, then their L2 norm
    (:func:`write_bound`) or, without ``bound``, infinity (no bound).

    Float32 gradients on the CPU are copied and their squares summed in one pass by
    ``hvdtrain._packing`` (when it was built): the bound then costs almost nothing
    beyond the copy, where ``torch.dot`` would read the whole buffer a second time.

    Args:
        gradients: the tensors to send, any shapes, all of ``dtype`` on ``device``.
        dtype: the buffer's dtype.
        device: the buffer's device.
        bound: whether to compute the norm.
        fused: use ``hvdtrain._packing`` where it applies; False always takes torch's
            ``cat`` and ``dot`` (as when it is not built; the benchmarks compare both).

    Returns:
        The buffer: every gradient flattened in order, then the ``TALLY`` numbers.
    """
    size = sum(g.numel() for g in gradients)
    flat = torch.empty(size + TALLY, dtype=dtype, device=device)
    flat[size + rules.COUNT] = 1
    if bound and fused and _packs_in_one_pass(gradients, flat):
        square_sum = _packing.pack_float32(tuple(g.data_ptr() for g in gradients),
                                           tuple(g.numel() for g in gradients), flat.data_ptr())
        flat[size + rules.BOUND] = math.sqrt(square_sum)  # NaN and infinity stay what they are
        return flat
    torch.cat([g.reshape(-1) for g in gradients], out=flat[:size])
    if bound:
        write_bound(flat[:size], flat[size + rules.BOUND])
    else:
        flat[size + rules.BOUND] = math.inf
    return flat


def rows_with_tally(gradients: list[torch.Tensor], layout: ShardLayout, *, bound: bool
                    ) -> torch.Tensor:
    """``gradients`` laid end to end and cut into the workers' slices of ``layout``, one
    row per worker (the last ones padded with zeros), each row followed by the tally: 1,
    then the L2 norm of all the gradients (or, without ``bound``, infinity). A
    reduce-scatter of the rows leaves each worker its slice with the tally reduced
    over the workers, which :func:`split_tally` reads as after the allreduce.

    Args:
        gradients: one tensor per size of ``layout.sizes``, all of one dtype and device.
        layout: how the buffer is split among the workers.
        bound: whether to compute the norm.

    Returns:
        A ``(layout.world_size, layout.shard_length + TALLY)`` tensor.
    """
    first, length = gradients[0], layout.shard_length
    rows = torch.empty((layout.world_size, length + TALLY), dtype=first.dtype,
                       device=first.device)
    one_pass = bound and _packs_in_one_pass(gradients, rows)
    square_sum = 0.0
    for rank in range(layout.world_size):
        row = rows[rank]
        start, end = layout.bounds(rank)
        pieces = layout.pieces(rank)
        if one_pass:
            square_sum += _packing.pack_float32(
                tuple(gradients[p.tensor].data_ptr() + p.tensor_offset * 4 for p in pieces),
                tuple(p.length for p in pieces), row.data_ptr())
        else:
            for piece in pieces:
                row[piece.shard_offset:piece.shard_offset + piece.length].copy_(
                    gradients[piece.tensor].reshape(-1)[
                        piece.tensor_offset:piece.tensor_offset + piece.length])
            if bound:
                square_sum += float(torch.dot(row[:end - start], row[:end - start]))
        row[end - start:length].zero_()
    rows[:, length + rules.COUNT] = 1
    rows[:, length + rules.BOUND] = math.sqrt(square_sum) if bound else math.inf
    return rows


def _packs_in_one_pass(gradients: list[torch.Tensor], flat: torch.Tensor) -> bool:
    """Whether ``hvdtrain._packing`` can fill ``flat`` from ``gradients``: it is built,
    and all are contiguous float32 tensors in the CPU's memory."""
    return (_packing is not None and flat.dtype == torch.float32 and flat.device.type == "cpu"
            and all(g.dtype == torch.float32 and g.device.type == "cpu" and g.is_contiguous()
                    for g in gradients))


def write_bound(gradients: torch.Tensor, out: torch.Tensor) -> None:
    """Write the L2 norm of ``gradients`` to ``out``: at least their largest magnitude,
    NaN if any is NaN, infinite if any is (or the norm overflows)."""
    # BLAS's dot reads the buffer at sum's speed; vector_norm is several times slower.
    torch.dot(gradients, gradients, out=out)
    out.sqrt_()


def split_tally(flat: torch.Tensor, unit: float, prescale: float,
                largest: float | None = None) -> tuple[torch.Tensor, int, bool]:
    """Split a reduced buffer of :func:`flat_with_tally` into the gradients and what its
    tally says (:func:`hvdtrain.tally.read_tally`).

    Args:
        flat: the buffer after the allreduce.
        unit: what a rank's 1 became in the reduction (postscale, over the size for an
            average).
        prescale: the factor each rank's values were multiplied by before the sum.
        largest: the largest finite number on the wire (None: that of ``flat``'s dtype).

    Returns:
        The reduced gradients (a view), the number of ranks that sent gradients, and
        whether the reduced bound proves every reduced element finite.
    """
    numbers = flat[-TALLY:].tolist()
    reading = rules.read_tally(
        numbers[rules.COUNT], numbers[rules.BOUND], unit=unit, prescale=prescale,
        largest=torch.finfo(flat.dtype).max if largest is None else largest)
    return flat[:-TALLY], reading.contributors, reading.proves_finite
