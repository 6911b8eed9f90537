"""Metrics averaged over ranks, framework-free.

Every adapter's metric averaging (``hvt.average_metrics``, ``hvk.MetricAverage``)
goes through :func:`average_over_ranks`, which gathers each rank's named numbers and
averages them with :func:`average_by_key`, so that every rank logs, and acts on, the
same values. When the ranks' shares differ in size (an
evaluation set that does not divide evenly), each rank's mean is weighted by the
number of examples it covers, which makes the result the mean over all the examples.

Example::

    from hvdtrain.metrics import average_by_key

    average_by_key([{"loss": 1.0}, {"loss": 3.0}])   # {'loss': 2.0}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hvdtrain.collective import Collective, gather


def average_by_key(values_by_rank: Sequence[Mapping[str, float]],
                   weights_by_rank: Sequence[Mapping[str, float]] | None = None
                   ) -> dict[str, float]:
    """The mean over ranks of each named number (as gathered from every rank).

    Args:
        values_by_rank: each rank's ``{name: number}``, in rank order.
        weights_by_rank: each rank's ``{name: weight}`` (the examples its number is a
            mean over; 0 for a rank with none), or None for equal weights.

    Returns:
        ``{name: mean}``, with the names sorted: sum(weight x value) / sum(weight).

    Raises:
        ValueError: when the ranks report different names, for example validation
            metrics on one rank only, the classic cause of Horovod hangs; or when a
            weight is negative, or a name's weights are all 0.
    """
    keys = sorted(values_by_rank[0])
    for rank, values in enumerate(values_by_rank[1:], start=1):
        if sorted(values) != keys:
            raise ValueError(
                f"the metrics differ between ranks: {keys} on rank 0 but {sorted(values)} on "
                f"rank {rank}; every rank must report the same metrics (give every rank "
                "validation data, or none)"
            )
    if weights_by_rank is None:
        return {key: sum(values[key] for values in values_by_rank) / len(values_by_rank)
                for key in keys}
    averages = {}
    for key in keys:
        weights = [weights[key] for weights in weights_by_rank]
        if any(weight < 0 for weight in weights) or sum(weights) <= 0:
            raise ValueError(f"the weights of metric {key!r} must be >= 0 with a positive sum "
                             f"(the examples each rank's value covers), got {weights}")
        total = sum(weight * values[key]
                    for weight, values in zip(weights, values_by_rank, strict=True) if weight)
        averages[key] = total / sum(weights)
    return averages


def average_gathered(gathered: Sequence[tuple[Mapping[str, float],
                                             Mapping[str, float] | None]]) -> dict[str, float]:
    """:func:`average_by_key` of what each rank sent as ``(values, weights)``: the
    weighted mean when the ranks sent weights, else the plain mean."""
    values = [numbers for numbers, _ in gathered]
    weights = [rank_weights for _, rank_weights in gathered]
    return average_by_key(values, None if weights[0] is None else weights)


def average_over_ranks(collective: Collective, values: Mapping[str, float],
                       weights: Mapping[str, float] | None = None) -> dict[str, float]:
    """The mean of each named number over every rank of ``collective``, identical on
    every rank, weighted by ``weights`` (each rank's examples per name) when given."""
    mine = {key: float(value) for key, value in values.items()}
    return average_gathered(gather(collective, (mine, weights), "hvdtrain.metrics"))
