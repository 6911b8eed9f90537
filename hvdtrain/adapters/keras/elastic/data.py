"""``ElasticData``: the samples of each epoch, shared among however many workers there
are now, for ``model.fit`` in an elastic job."""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np

from hvdtrain.adapters.keras import backend
from hvdtrain.validation import require_positive_int

__all__ = ["ElasticData"]


class ElasticData(keras.utils.PyDataset):
    """In-memory arrays served to ``fit`` as this worker's share of what is left of the
    epoch, re-shared whenever the number of workers changes.

    Every epoch is one permutation of the samples (the same on every worker, from
    ``seed`` and the epoch). A step consumes the next ``batch_size x size()`` samples
    of it: worker r takes every size()-th one starting at r. :attr:`position` counts
    the samples of the epoch consumed by the steps taken; after a reset the rest of
    the epoch from there is shared among the new set of workers, so no sample is
    skipped and none is repeated, except that the rest is padded with at most
    size() - 1 of its first samples so that every worker has as many batches (as
    torch's samplers do). The elastic ``KerasState`` commits and syncs
    :attr:`epoch` and :attr:`position`; the ``CommitState`` callback advances them.

    Args:
        x: an array, or a list, tuple or dict of arrays, of the same length.
        y: the targets (an array or a structure of arrays), or None.
        batch_size: samples per worker per step.
        shuffle: a new permutation every epoch (else the samples' order).
        seed: the permutations' seed; give every worker the same.
    """

    def __init__(self, x: Any, y: Any = None, *, batch_size: int, shuffle: bool = True,
                 seed: int = 0) -> None:
        super().__init__()
        require_positive_int("batch_size", batch_size)
        self._inputs = x if y is None else (x, y)
        lengths = {len(array) for array in keras.tree.flatten(self._inputs)}
        if len(lengths) != 1:
            raise ValueError(f"x and y must hold the same number of samples, got lengths "
                             f"{sorted(lengths)}")
        self.samples = lengths.pop()
        if self.samples == 0:
            raise ValueError("ElasticData got no samples")
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._segment: tuple[int, np.ndarray] | None = None  # (size, this worker's share)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first sample."""
        self.epoch, self.position, self._segment = epoch, 0, None

    def record_batch(self) -> None:
        """Count one step of every worker as done: its samples are consumed."""
        size, _ = self._current_segment()
        self.position = min(self.samples, self.position + self.batch_size * size)

    def state_dict(self) -> dict[str, int]:
        """Where the data stands: the epoch and the samples of it consumed."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`, maybe another rank's)."""
        self.epoch, self.position, self._segment = state["epoch"], state["position"], None

    def batch_indices(self, index: int) -> np.ndarray:
        """The samples of this worker's batch ``index`` of the current pass."""
        _, indices = self._current_segment()
        return indices[index * self.batch_size:(index + 1) * self.batch_size]

    def __len__(self) -> int:
        """This worker's batches in what is left of the epoch."""
        _, indices = self._current_segment()
        return math.ceil(len(indices) / self.batch_size)

    def __getitem__(self, index: int) -> Any:
        """This worker's batch ``index`` of what was left of the epoch when it began."""
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        chosen = self.batch_indices(index)
        return keras.tree.map_structure(lambda array: array[chosen], self._inputs)

    def on_epoch_begin(self) -> None:
        """Fix this pass's share of the rest of the epoch (Keras calls it)."""
        self._segment = None
        self._current_segment()

    def on_epoch_end(self) -> None:
        """Forget the pass's share: the next is computed from the position then."""
        self._segment = None

    def share(self, rank: int, size: int) -> np.ndarray:
        """The samples left of the epoch that worker ``rank`` of ``size`` trains on, in
        order (padded, with the others, to a multiple of ``size``)."""
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(self.samples)
                 if self.shuffle else np.arange(self.samples))
        rest = order[self.position:]
        rest = np.resize(rest, len(rest) + -len(rest) % size)  # pads cyclically
        return rest[rank::size]

    def _current_segment(self) -> tuple[int, np.ndarray]:
        """(size, this worker's share) of the pass under way, fixed when it began."""
        if self._segment is None:
            hvd = backend.horovod()
            rank, size = (hvd.rank(), hvd.size()) if hvd.is_initialized() else (0, 1)
            self._segment = (size, self.share(rank, size))
        return self._segment
