"""Do the ranks agree on how they train? Framework-free comparison of per-rank facts.

Adapters gather a small dict of facts from every rank (optimizer class, number of
param groups, per-worker batch size, versions, ...) with Horovod's
``allgather_object`` and call :func:`raise_on_disagreement`, so that a mismatch
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


def first_disagreement(facts_by_rank: Sequence[Mapping[str, Any]]) -> str | None:
    """None when every rank's facts equal rank 0's, else the first field that differs."""
    reference = facts_by_rank[0]
    for rank, facts in enumerate(facts_by_rank[1:], start=1):
        for field in sorted(set(reference) | set(facts)):
            if reference.get(field) != facts.get(field):
                return (f"{field} is {reference.get(field)!r} on rank 0 but "
                        f"{facts.get(field)!r} on rank {rank}")
    return None


def raise_on_disagreement(facts_by_rank: Sequence[Mapping[str, Any]], where: str) -> None:
    """Raise :class:`RankDisagreementError` (on every rank) unless all ranks agree."""
    problem = first_disagreement(facts_by_rank)
    if problem:
        raise RankDisagreementError(
            f"{where}: the ranks disagree: {problem}. Every rank must run the same code, "
            "settings and software; check rank-dependent arguments and each host's environment."
        )


def average_by_key(values_by_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The mean over ranks of each named number (as gathered from every rank).

    Raises ValueError when the ranks report different names, for example validation
    metrics on one rank only, the classic cause of Horovod hangs.
    """
    keys = sorted(values_by_rank[0])
    for rank, values in enumerate(values_by_rank[1:], start=1):
        if sorted(values) != keys:
            raise ValueError(
                f"the metrics differ between ranks: {keys} on rank 0 but {sorted(values)} on "
                f"rank {rank}; every rank must report the same metrics (give every rank "
                "validation data, or none)"
            )
    return {key: sum(values[key] for values in values_by_rank) / len(values_by_rank)
            for key in keys}
