"""Argument checks shared by the schedule, the adapters and the CLI (framework-free).

Each raises an error that says which argument is wrong, what it got and what it
needs, so that a bad call fails at once with a fix in the message::

    from hvdtrain.validation import require_positive_int

    require_positive_int("batch_size_per_worker", 0)
    # ValueError: batch_size_per_worker must be an int > 0, got 0
"""

from __future__ import annotations

import math
from typing import Any

from hvdtrain.compression import wire_format


def is_finite_number(value: object) -> bool:
    """True for a finite int or float (bool excluded)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def require_positive_number(name: str, value: object) -> None:
    """Raise ValueError unless ``value`` is a finite number > 0."""
    if not is_finite_number(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def require_positive_int(name: str, value: object) -> None:
    """Raise ValueError unless ``value`` is an int > 0 (bool excluded)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be an int > 0, got {value!r}")


def require_non_negative_int(name: str, value: object) -> None:
    """Raise ValueError unless ``value`` is an int >= 0 (bool excluded)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def require_root_rank(root_rank: object, size: int) -> None:
    """Raise ValueError unless ``root_rank`` names one of ``size`` workers."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, int) \
            or not 0 <= root_rank < size:
        raise ValueError(f"root_rank must be an int in [0, {size}) for {size} workers, "
                         f"got {root_rank!r}")


def require_same_world_size(world_size: int, launched: int, size_function: str) -> None:
    """Raise ValueError when a ``world_size`` given explicitly is not the number of
    workers the launcher started (``size_function`` names where that comes from)."""
    if world_size != launched:
        raise ValueError(f"world_size={world_size} contradicts the launcher's {launched} "
                         f"workers ({size_function}); leave world_size=None to use the "
                         "launcher's")


def require_instance(name: str, value: Any, expected: type | tuple[type, ...],
                     hint: str) -> None:
    """Raise TypeError unless ``value`` is an instance of ``expected``; ``hint`` says
    what to pass instead."""
    if not isinstance(value, expected):
        raise TypeError(f"{name} must be {hint}, got {type(value).__name__}")


def require_compression(compression: object) -> None:
    """Raise ValueError unless ``compression`` names one of
    :data:`hvdtrain.compression.WIRE_FORMATS`."""
    wire_format(compression)
