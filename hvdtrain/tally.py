"""The tally: the numbers that ride behind the gradients in one flat reduction, and what
they say once reduced (framework-free; every adapter's flat reduction carries it).

Each rank sends a 1 (:data:`COUNT`), which the sum turns into the number of ranks that
sent gradients (a rank that called ``join()`` sends zeros), and the L2 norm of its
gradients (:data:`BOUND`), whose sum bounds every reduced element and every partial sum
of the reduction. Read back, the count gives the rescaling after ``join()``
(:func:`joined_rescale`) and the bound proves the reduced gradients finite without
reading them (:func:`finite_bound_limit`, :func:`read_tally`).

:func:`joined_rescale` and :func:`some_ranks_joined` use only arithmetic and comparison
and take the framework's ``maximum``, so the same rule serves Python numbers and every
framework's tensors (in graphs too). ``setup.py`` gives the TensorFlow op the layout
(:data:`TALLY`, :data:`COUNT`, :data:`BOUND`) from this module.

Example::

    >>> reading = read_tally(2.0 * 0.5, 10.0 * 0.5, unit=0.5, prescale=1.0,
    ...                      largest=3.4028234663852886e38)
    >>> reading.contributors, reading.proves_finite
    (2, True)
    >>> joined_rescale(1, 2)
    2.0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TALLY = 2
"""How many numbers ride behind the gradients: the count, then the bound."""
COUNT = 0
"""The tally's position of each rank's 1 (after the reduction: the contributors)."""
BOUND = 1
"""The tally's position of each rank's gradient norm (after the reduction: the bound)."""


def finite_bound_limit(largest: float, *, prescale: float, unit: float) -> float:
    """The reduced bound (as the reduction leaves it) below which every reduced gradient
    element is finite, proved without reading them.

    Each rank's norm is at least the magnitude of each of its elements, so the sum of
    the norms bounds every element of the sum and every partial sum a ring or tree takes
    on the way, before and after the scalings. Half the wire's largest number leaves
    room for the rounding of those sums and of the norms themselves.

    Args:
        largest: the largest finite number of the dtype on the wire.
        prescale: the factor each rank's values were multiplied by before the sum.
        unit: what one rank's 1 became in the reduction (every scaling applied, over the
            number of ranks for an average).

    Returns:
        The limit, in the units of the reduced buffer (a bound exactly at it is not a
        proof; NaN and infinity are never below it).
    """
    return largest / 2 / max(1.0, prescale, abs(unit)) * abs(unit)


@dataclass(frozen=True)
class TallyReading:
    """What a reduced tally says.

    Attributes:
        contributors: the number of ranks that sent gradients.
        proves_finite: whether the reduced bound proves every reduced gradient finite;
            when False the gradients must be read to decide.
    """

    contributors: int
    proves_finite: bool


def read_tally(count: float, bound: float, *, unit: float, prescale: float,
               largest: float) -> TallyReading:
    """Read the reduced tally: its :data:`COUNT` and :data:`BOUND` numbers as the
    reduction left them (``unit``, ``prescale``: as in :func:`finite_bound_limit`;
    ``largest``: the wire's largest number)."""
    return TallyReading(
        contributors=round(count / unit),
        proves_finite=bool(abs(bound) < finite_bound_limit(largest, prescale=prescale,
                                                           unit=unit)))


def joined_rescale(contributors: Any, size: int, *, maximum: Callable[[Any, Any], Any] = max
                   ) -> Any:
    """The factor that turns an average over all ``size`` ranks into the average over
    the ``contributors`` that sent gradients (ranks that called ``join()`` sent zeros):
    1 when every rank did; ``size`` when none did (the gradients are then zeros).

    ``contributors`` may be a tensor; pass the framework's element-wise ``maximum``.
    """
    return size / maximum(contributors, 1)


def some_ranks_joined(contributors: Any, size: int) -> Any:
    """Whether fewer than ``size`` ranks sent gradients (a bool, or a boolean tensor),
    i.e. whether :func:`joined_rescale` is not 1 and the gradients need the pass."""
    return contributors < size - 0.5
