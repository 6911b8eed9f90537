"""Data and metrics across ranks: each rank's share of the data set, and metrics
averaged so that every rank logs and acts on the same numbers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import horovod.torch as _hvd
import torch

from hvdtrain.adapters.torch._horovod import collective
from hvdtrain.collective import require_initialized
from hvdtrain.metrics import average_over_ranks
from hvdtrain.validation import require_instance, require_non_negative_int

__all__ = ["average_metrics", "distributed_sampler"]


def average_metrics(metrics: Mapping[str, float | torch.Tensor], *,
                    examples: int | None = None) -> dict[str, float]:
    """The mean of each metric over all ranks, identical on every rank.

    Example::

        logs = hvt.average_metrics({"loss": total_loss / batches, "accuracy": accuracy})
        # Shares of different sizes (distributed_sampler(..., pad=False)):
        logs = hvt.average_metrics({"loss": mean_loss}, examples=len(sampler))

    Args:
        metrics: this rank's named numbers or one-element tensors; every rank passes
            the same names.
        examples: the examples this rank's metrics are means over; given on every rank,
            each rank's mean counts in proportion, which makes the result the mean over
            all the examples (as one process would compute it). None: equal weights.

    Returns:
        ``{name: mean over ranks}``.

    Raises:
        ValueError: on every rank, when the ranks pass different names (or a negative
            ``examples``, or all 0).
        TypeError: when a value is not a number.
    """
    require_initialized(collective(), "average_metrics")
    if examples is not None:
        require_non_negative_int("examples", examples)
    mine = {key: _metric_value(key, value) for key, value in metrics.items()}
    weights = None if examples is None else dict.fromkeys(mine, examples)
    return average_over_ranks(collective(), mine, weights)


def _metric_value(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"average_metrics: metric {key!r} must be a number or a one-element "
                        f"tensor, got {value!r}") from None


def distributed_sampler(dataset: torch.utils.data.Dataset, *, shuffle: bool = True,
                        seed: int = 0, pad: bool = True) -> torch.utils.data.Sampler:
    """A sampler giving this rank its share of one shuffle per epoch (Goyal et al. §3).

    Every rank draws the same permutation (from ``seed`` and the epoch) and takes
    every size()-th index of it. Call ``sampler.set_epoch(epoch)`` at the start of
    each epoch, or every epoch repeats the first one's order.

    Args:
        dataset: the data set (every rank passes the same).
        shuffle: a new permutation every epoch (else the data set's order).
        seed: the permutations' seed; the same on every rank.
        pad: when the data set does not divide evenly, repeat a few examples so that
            every rank has as many batches (needed for training, whose steps pair up
            across ranks: torch's DistributedSampler). ``pad=False`` for evaluation:
            every example exactly once, shares differing by at most one; average the
            results with ``average_metrics(..., examples=len(sampler))``.
    """
    require_initialized(collective(), "distributed_sampler")
    require_instance("seed", seed, int, "an int (the same on every rank)")
    if not pad:
        return _ShareSampler(len(dataset), _hvd.rank(), _hvd.size(), shuffle, seed)
    return torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=_hvd.size(), rank=_hvd.rank(), shuffle=shuffle, seed=seed
    )


class _ShareSampler(torch.utils.data.Sampler):
    """Every size()-th index of the epoch's permutation from ``rank`` on, no repeats
    (the permutation is DistributedSampler's: ``randperm`` seeded with seed + epoch)."""

    def __init__(self, length: int, rank: int, size: int, shuffle: bool, seed: int) -> None:
        self.length, self.rank, self.size = length, rank, size
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.length))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.length, generator=generator).tolist()

    def __iter__(self):
        return iter(self._order()[self.rank::self.size])

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.size))
