"""How one flat buffer is split among workers when each holds only a shard of the
optimizer state, and of the averaged gradients (ZeRO stages 1-2, Rajbhandari et al.
2020), as pure arithmetic.

The tensors of one parameter group are laid end to end in one buffer; worker r owns
the r-th of its shards, all of one length but the last (which hold what is left).
Each worker steps its shard with its shard of the optimizer state, and the shards are
then shared back into every worker's tensors. The adapters do the moving; this module
says what goes where.

Example::

    >>> from hvdtrain.sharding import ShardLayout
    >>> layout = ShardLayout(sizes=(3, 4), world_size=2, rank=1)
    >>> layout.shard_length, (layout.start, layout.end)
    (4, (4, 7))
    >>> layout.pieces()  # tensor 1's elements 1-3 fill this rank's shard
    (Piece(tensor=1, tensor_offset=1, shard_offset=0, length=3),)
"""

from __future__ import annotations

from dataclasses import dataclass

from hvdtrain.validation import require_positive_int


@dataclass(frozen=True)
class Piece:
    """The part of one tensor that lies inside a worker's shard."""

    tensor: int
    tensor_offset: int
    shard_offset: int
    length: int


@dataclass(frozen=True)
class ShardLayout:
    """The split of one flat buffer among ``world_size`` workers, seen from ``rank``.

    Args:
        sizes: the number of elements of each tensor, in buffer order.
        world_size: the number of workers sharing the buffer.
        rank: this worker's place among them (0-based).

    Raises:
        ValueError: for an empty ``sizes``, a size below 1, or a rank outside the world.
    """

    sizes: tuple[int, ...]
    world_size: int
    rank: int

    def __post_init__(self) -> None:
        require_positive_int("world_size", self.world_size)
        if not self.sizes:
            raise ValueError("a shard layout needs at least one tensor")
        for size in self.sizes:
            require_positive_int("every tensor's number of elements", size)
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) \
                or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be an int in [0, {self.world_size}), got {self.rank!r}")

    @property
    def total(self) -> int:
        """Elements of all tensors together."""
        return sum(self.sizes)

    @property
    def shard_length(self) -> int:
        """Elements of a worker's shard: every shard's but the last ones', which hold
        what is left (fewer, or none when there are more workers than elements)."""
        return -(-self.total // self.world_size)

    @property
    def padded_total(self) -> int:
        """Elements of a buffer in which every shard has ``shard_length`` elements (the
        last ones padded), as a collective that splits a buffer evenly needs."""
        return self.shard_length * self.world_size

    def bounds(self, rank: int) -> tuple[int, int]:
        """Where worker ``rank``'s shard begins and ends in the buffer."""
        return (min(rank * self.shard_length, self.total),
                min((rank + 1) * self.shard_length, self.total))

    @property
    def start(self) -> int:
        """Where this worker's shard begins in the buffer."""
        return self.bounds(self.rank)[0]

    @property
    def end(self) -> int:
        """Where this worker's shard ends in the buffer."""
        return self.bounds(self.rank)[1]

    def offsets(self) -> tuple[int, ...]:
        """Where each tensor begins in the buffer."""
        starts, position = [], 0
        for size in self.sizes:
            starts.append(position)
            position += size
        return tuple(starts)

    def pieces(self, rank: int | None = None) -> tuple[Piece, ...]:
        """The parts of the tensors that lie in worker ``rank``'s shard (default: this
        worker's), in order."""
        start, end = self.bounds(self.rank if rank is None else rank)
        found = []
        for index, (begin, size) in enumerate(zip(self.offsets(), self.sizes, strict=True)):
            low, high = max(begin, start), min(begin + size, end)
            if low < high:
                found.append(Piece(index, low - begin, low - start, high - low))
        return tuple(found)
