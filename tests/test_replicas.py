"""hvdtrain.replicas: checksums and the mismatch report every adapter raises."""

import numpy as np
import pytest

from hvdtrain.replicas import (
    ReplicaMismatchError,
    array_checksum,
    checksums,
    fingerprint,
    first_checksum_difference,
    raise_on_mismatch,
)


def test_checksum_is_bitwise():
    a = np.array([1.0, -0.0, 3.5])
    assert array_checksum(a) == array_checksum(a.copy())
    assert array_checksum(a) != array_checksum(np.array([1.0, 0.0, 3.5]))  # -0.0 vs 0.0
    assert array_checksum(a) != array_checksum(a.astype(np.float32))
    assert array_checksum(a) != array_checksum(a.reshape(3, 1))
    assert array_checksum(np.arange(6).reshape(2, 3).T) == array_checksum(
        np.ascontiguousarray(np.arange(6).reshape(2, 3).T))


def test_identical_ranks_pass():
    mine = checksums({"w": np.ones(3), "b": np.zeros(1)})
    assert first_checksum_difference([mine, mine, mine]) is None
    raise_on_mismatch([mine, mine])


def test_a_differing_tensor_is_named_with_the_ranks():
    good = checksums({"w": np.ones(3), "b": np.zeros(1)})
    bad = checksums({"w": np.ones(3), "b": np.full(1, 1e-300)})
    with pytest.raises(ReplicaMismatchError, match=r"rank\(s\) \[2\].*on rank 2: b"):
        raise_on_mismatch([good, good, bad])


def test_different_names_or_counts_are_reported():
    good = checksums({"w": np.ones(3), "b": np.zeros(1)})
    assert "differ in name or order" in first_checksum_difference(
        [good, checksums({"b": np.zeros(1), "w": np.ones(3)})])
    assert "different number of tensors (2 on rank 0, 1)" in first_checksum_difference(
        [good, checksums({"w": np.ones(3)})])


def test_fingerprint_is_equal_exactly_for_bit_identical_arrays():
    arrays = {"w": np.arange(6.0).reshape(2, 3), "b": np.zeros(2)}
    same = {name: array.copy() for name, array in arrays.items()}
    assert fingerprint(arrays) == fingerprint(same)
    same["b"][1] = 1e-300
    assert fingerprint(arrays) != fingerprint(same)
    assert len(fingerprint(arrays)) == 8
