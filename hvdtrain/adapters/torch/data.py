"""Data and metrics across ranks: each rank's share of the data set, and metrics
averaged so that every rank logs and acts on the same numbers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import horovod.torch as _hvd
import torch

from hvdtrain.adapters.torch._horovod import allgather_object, require_initialized
from hvdtrain.metrics import average_by_key
from hvdtrain.validation import require_instance

__all__ = ["average_metrics", "distributed_sampler"]


def average_metrics(metrics: Mapping[str, float | torch.Tensor]) -> dict[str, float]:
    """The mean of each metric over all ranks, identical on every rank.

    Example::

        logs = hvt.average_metrics({"loss": total_loss / batches, "accuracy": accuracy})

    Args:
        metrics: this rank's named numbers or one-element tensors; every rank passes
            the same names.

    Returns:
        ``{name: mean over ranks}``.

    Raises:
        ValueError: on every rank, when the ranks pass different names.
        TypeError: when a value is not a number.
    """
    require_initialized("average_metrics")
    mine = {key: _metric_value(key, value) for key, value in metrics.items()}
    return average_by_key(allgather_object(mine, "hvdtrain.metrics"))


def _metric_value(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"average_metrics: metric {key!r} must be a number or a one-element "
                        f"tensor, got {value!r}") from None


def distributed_sampler(dataset: torch.utils.data.Dataset, *, shuffle: bool = True,
                        seed: int = 0) -> torch.utils.data.distributed.DistributedSampler:
    """A sampler giving this rank its share of one shuffle per epoch (Goyal et al. §3).

    Every rank draws the same permutation (from ``seed`` and the epoch) and takes
    every size()-th index of it. Call ``sampler.set_epoch(epoch)`` at the start of
    each epoch, or every epoch repeats the first one's order. If the dataset does not
    divide evenly, a few examples are repeated so every rank has as many batches.
    """
    require_initialized("distributed_sampler")
    require_instance("seed", seed, int, "an int (the same on every rank)")
    return torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=_hvd.size(), rank=_hvd.rank(), shuffle=shuffle, seed=seed
    )
