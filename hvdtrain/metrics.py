"""Metrics averaged over ranks, framework-free.

Every adapter's metric averaging (``hvt.average_metrics``, ``hvk.MetricAverage``)
gathers each rank's named numbers and calls :func:`average_by_key`, so that every
rank logs, and acts on, the same values.

Example::

    from hvdtrain.metrics import average_by_key

    average_by_key([{"loss": 1.0}, {"loss": 3.0}])   # {'loss': 2.0}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def average_by_key(values_by_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The mean over ranks of each named number (as gathered from every rank).

    Args:
        values_by_rank: each rank's ``{name: number}``, in rank order.

    Returns:
        ``{name: mean}``, with the names sorted.

    Raises:
        ValueError: when the ranks report different names, for example validation
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
