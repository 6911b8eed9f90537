"""The tally that rides behind the gradients in the torch optimizer's flat allreduce.

Two numbers follow the gradients in the same buffer: each rank's 1, which the reduction
turns into the number of ranks that sent gradients (a rank that called ``join()`` sends
zeros), and the L2 norm of its gradients, which becomes a bound on every reduced
element, so the non-finite check reads one number instead of every gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

TALLY = 2  # numbers behind the gradients


def flat_with_tally(gradients: list[torch.Tensor], dtype: torch.dtype, device: torch.device,
                    bound: Callable[[torch.Tensor, torch.Tensor], None]) -> torch.Tensor:
    """``gradients`` copied into one buffer, followed by the tally: 1, then what
    ``bound(copied_gradients, out)`` writes (:func:`write_bound`, or infinity for none).

    Args:
        gradients: the tensors to send, any shapes, all of ``dtype`` on ``device``.
        dtype: the buffer's dtype.
        device: the buffer's device.
        bound: writes the bound of the copied gradients into its 0-d ``out``.

    Returns:
        The buffer: every gradient flattened in order, then the ``TALLY`` numbers.
    """
    size = sum(g.numel() for g in gradients)
    flat = torch.empty(size + TALLY, dtype=dtype, device=device)
    torch.cat([g.reshape(-1) for g in gradients], out=flat[:size])
    flat[size] = 1
    bound(flat[:size], flat[size + 1])
    return flat


def write_bound(gradients: torch.Tensor, out: torch.Tensor) -> None:
    """Write the L2 norm of ``gradients`` to ``out``: at least their largest magnitude,
    NaN if any is NaN, infinite if any is (or the norm overflows)."""
    # BLAS's dot reads the buffer at sum's speed; vector_norm is several times slower.
    torch.dot(gradients, gradients, out=out)
    out.sqrt_()


def read_tally(flat: torch.Tensor, unit: float, prescale: float
               ) -> tuple[torch.Tensor, int, bool]:
    """Read a reduced buffer of :func:`flat_with_tally`.

    Args:
        flat: the buffer after the allreduce.
        unit: what a rank's 1 became in the reduction (postscale, over the size for an
            average).
        prescale: the factor each rank's values were multiplied by before the sum.

    Returns:
        The reduced gradients (a view), the number of ranks that sent gradients, and
        whether the reduced bound proves every reduced element (and every partial sum
        of the reduction) finite: the sum of the ranks' norms, with room for the
        scalings, is below half the dtype's largest number.
    """
    contributors, bound = (value / unit for value in flat[-TALLY:].tolist())
    scaling = max(1.0, prescale, abs(unit))
    finite = bound * scaling < torch.finfo(flat.dtype).max / 2
    return flat[:-TALLY], round(contributors), finite
