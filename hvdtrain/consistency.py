"""Do the ranks agree on how they train? Framework-free comparison of per-rank facts.

Adapters gather a small dict of facts from every rank (optimizer class, number of
param groups, per-worker batch size, versions, ...) with :func:`check_ranks_agree`,
which compares them with :func:`raise_on_disagreement`, so that a mismatch
stops every rank before the first step with the rank, the field and both values,
instead of hanging or silently training something else.

Example::

    from hvdtrain.consistency import raise_on_disagreement

    raise_on_disagreement([{"batch_size_per_worker": 32}, {"batch_size_per_worker": 16}],
                          "LinearScalingWarmup")   # ValueError naming rank 1 and both values
"""

from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Mapping, Sequence
from typing import Any

import hvdtrain
from hvdtrain.collective import Collective, gather


class RankDisagreementError(ValueError):
    """Ranks started with different settings, models or software."""


def software_versions(*distributions: str) -> dict[str, str]:
    """Python, hvdtrain and the given installed distributions' versions (or 'absent')."""
    versions = {"python": platform.python_version(), "hvdtrain": hvdtrain.__version__}
    for name in distributions:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def first_fact_difference(facts_by_rank: Sequence[Mapping[str, Any]]) -> str | None:
    """None when every rank's facts equal rank 0's, else the first field that differs."""
    reference = facts_by_rank[0]
    for rank, facts in enumerate(facts_by_rank[1:], start=1):
        for field in sorted(set(reference) | set(facts)):
            if reference.get(field) != facts.get(field):
                return (f"{field} is {reference.get(field)!r} on rank 0 but "
                        f"{facts.get(field)!r} on rank {rank}")
    return None


def first_parameter_difference(specs_by_rank: Sequence[Sequence[tuple[str, Any, Any]]]
                               ) -> str | None:
    """None when every rank lists the same parameters as rank 0, else the first difference.

    Args:
        specs_by_rank: per rank, ``(name, shape, dtype)`` of each parameter, in order.

    Returns:
        None, or a sentence naming the rank, the parameter and both values.
    """
    reference = specs_by_rank[0]
    reference_by_name = {name: (shape, dtype) for name, shape, dtype in reference}
    for other_rank, specs in enumerate(specs_by_rank[1:], start=1):
        by_name = {name: (shape, dtype) for name, shape, dtype in specs}
        for name, (shape, dtype) in reference_by_name.items():
            if name not in by_name:
                return f"rank {other_rank} has no parameter {name!r}, which rank 0 has"
            other_shape, other_dtype = by_name[name]
            if other_shape != shape:
                return (f"parameter {name!r} has shape {shape} on rank 0 "
                        f"but {other_shape} on rank {other_rank}")
            if other_dtype != dtype:
                return (f"parameter {name!r} has dtype {dtype} on rank 0 "
                        f"but {other_dtype} on rank {other_rank}")
        extra = [name for name in by_name if name not in reference_by_name]
        if extra:
            return f"rank {other_rank} has parameter {extra[0]!r}, which rank 0 lacks"
        if [spec[0] for spec in specs] != [spec[0] for spec in reference]:
            return f"rank {other_rank} lists the parameters in a different order than rank 0"
    return None


def raise_on_disagreement(facts_by_rank: Sequence[Mapping[str, Any]], where: str) -> None:
    """Raise :class:`RankDisagreementError` (on every rank) unless all ranks agree."""
    problem = first_fact_difference(facts_by_rank)
    if problem:
        raise RankDisagreementError(
            f"{where}: the ranks disagree: {problem}. Every rank must run the same code, "
            "settings and software; check rank-dependent arguments and each host's environment."
        )


def check_ranks_agree(collective: Collective, facts: Mapping[str, Any], where: str,
                      name: str = "hvdtrain.consistency") -> None:
    """Gather every rank's ``facts`` and raise :class:`RankDisagreementError` on every
    rank unless they all equal rank 0's.

    Args:
        collective: the adapter's workers (:mod:`hvdtrain.collective`).
        facts: this rank's settings, e.g. ``{"batch_size_per_worker": 32}``.
        where: the function or class checking, for the message.
        name: the collective's name, the same on every rank.
    """
    raise_on_disagreement(gather(collective, dict(facts), name), where)
