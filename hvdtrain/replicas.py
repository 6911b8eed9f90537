"""Replica checks, framework-free: checksums of named arrays and where ranks disagree.

Every adapter's ``verify_replicas`` computes :func:`checksums` of its tensors (as
NumPy arrays) and calls :func:`verify_checksums` with its
:class:`~hvdtrain.collective.Collective`, which gathers them from every rank and
raises :func:`raise_on_mismatch`'s error, so the rule and the message are the same
everywhere.

Example::

    import numpy as np
    from hvdtrain.replicas import checksums, raise_on_mismatch

    mine = checksums({"w": np.zeros(3)})
    raise_on_mismatch([mine, mine])          # identical on both "ranks": returns
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from hvdtrain.collective import Collective, gather

Checksums = list[tuple[str, str]]


class ReplicaMismatchError(RuntimeError):
    """The replicas' parameters, buffers or optimizer state are no longer identical."""


def array_checksum(array: np.ndarray) -> str:
    """Shape, dtype and crc32 of the bytes: equal exactly when the arrays are bit-identical."""
    data = np.ascontiguousarray(array)
    return f"{data.shape}:{data.dtype}:{zlib.crc32(data.reshape(-1).view(np.uint8)):08x}"


def checksums(named_arrays: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]]
              ) -> Checksums:
    """``(name, checksum)`` for each array, in the given order."""
    items = named_arrays.items() if isinstance(named_arrays, Mapping) else named_arrays
    return [(name, array_checksum(np.asarray(array))) for name, array in items]


def fingerprint(named_arrays: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]]
                ) -> str:
    """One short digest of :func:`checksums`, for a log line: two replicas print the
    same fingerprint when their arrays are bit-identical (and, but for crc32's rare
    collisions, only then)."""
    return f"{zlib.crc32(repr(checksums(named_arrays)).encode()):08x}"


def first_checksum_difference(by_rank: Sequence[Checksums],
                              labels: Mapping[str, str] | None = None) -> str | None:
    """None when every rank's checksums equal rank 0's, else what differs and where.

    ``labels`` (optional) describes names on this rank, for names that are only
    positions because the real names may differ between ranks (Keras numbers its
    layers and optimizers per process).
    """
    reference = by_rank[0]
    differing = [rank for rank, sums in enumerate(by_rank) if sums != reference]
    if not differing:
        return None
    first_rank = differing[0]
    other = by_rank[first_rank]
    for (name, checksum), (other_name, other_checksum) in zip(reference, other, strict=False):
        if name != other_name:
            where = f"the tensors differ in name or order ({name!r} on rank 0, {other_name!r})"
            break
        if checksum != other_checksum:
            where = name if name not in (labels or {}) else f"{name} ({labels[name]} here)"
            break
    else:
        where = f"a different number of tensors ({len(reference)} on rank 0, {len(other)})"
    return (f"rank(s) {differing} disagree with rank 0; "
            f"first difference on rank {first_rank}: {where}")


def raise_on_mismatch(by_rank: Sequence[Checksums],
                      labels: Mapping[str, str] | None = None) -> None:
    """Raise :class:`ReplicaMismatchError` unless all ranks' checksums agree."""
    problem = first_checksum_difference(by_rank, labels)
    if problem:
        raise ReplicaMismatchError(
            f"replicas differ: {problem}. Broadcast the initial state from rank 0 and look for "
            "rank-dependent code paths that touch the model or optimizer."
        )


def verify_checksums(collective: Collective, mine: Checksums,
                     labels: Mapping[str, str] | None = None) -> None:
    """Gather every rank's ``mine`` and raise :class:`ReplicaMismatchError` on every rank
    unless they all equal rank 0's (``labels``: names to show for checksum keys)."""
    raise_on_mismatch(gather(collective, mine, "hvdtrain.replica_checksums"), labels)
