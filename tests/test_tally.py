"""hvdtrain.tally: the count and bound behind the gradients, in one process.

The proof of finiteness is checked against a float32 reduction emulated with numpy (the
ranks' values summed in float32 as a ring would, then scaled as Horovod scales), for
values drawn near the largest float32; the adapters' own tests run the same cases on
real ranks (tests/adapters/test_torch_optimizer.py, test_keras_optimizer.py).
"""

import math

import numpy as np
import pytest

from hvdtrain.tally import (
    BOUND,
    COUNT,
    TALLY,
    finite_bound_limit,
    joined_rescale,
    read_tally,
    some_ranks_joined,
)

LARGEST32 = float(np.finfo(np.float32).max)


def test_the_tally_is_the_count_then_the_bound():
    assert (TALLY, COUNT, BOUND) == (2, 0, 1)


def reduce_like_horovod(ranks: list[np.ndarray], prescale: float, postscale: float
                        ) -> tuple[np.ndarray, float]:
    """Each rank's values and tally (1, its L2 norm), prescaled, summed in float32 in
    rank order, postscaled; returns the reduced values and the reduced bound, and
    whether any partial sum overflowed on the way."""
    buffers = []
    for values in ranks:
        norm = np.float32(math.sqrt(float(np.dot(values.astype(np.float64),
                                                 values.astype(np.float64)))))
        buffers.append(np.concatenate([values, [1.0, norm]]).astype(np.float32)
                       * np.float32(prescale))
    total = buffers[0]
    with np.errstate(over="ignore", invalid="ignore"):
        for buffer in buffers[1:]:
            total = (total + buffer).astype(np.float32)
        total = (total * np.float32(postscale)).astype(np.float32)
    return total[:-TALLY], float(total[-TALLY + BOUND]), float(total[-TALLY + COUNT])


@pytest.mark.parametrize("ranks", [2, 3, 5])
@pytest.mark.parametrize(("prescale", "postscale"), [(1.0, 1.0), (1.0, 0.5), (0.5, 2.0),
                                                     (4.0, 1.0)])
def test_a_proof_is_never_wrong_near_the_largest_float32(ranks, prescale, postscale):
    """Whatever the proof says is finite is finite (it may defer what is finite too)."""
    rng = np.random.default_rng(ranks * 100 + int(prescale * 10) + int(postscale))
    proved = deferred = 0
    for _ in range(400):
        scale = LARGEST32 * rng.choice([1e-30, 1e-3, 0.05, 0.2, 0.4, 0.6])
        values = [(rng.standard_normal(4) * scale / 4).astype(np.float32)
                  for _ in range(ranks)]
        reduced, bound, count = reduce_like_horovod(values, prescale, postscale)
        unit = prescale * postscale
        reading = read_tally(count, bound, unit=unit, prescale=prescale, largest=LARGEST32)
        assert reading.contributors == ranks
        if reading.proves_finite:
            proved += 1
            assert np.isfinite(reduced).all(), (values, prescale, postscale)
        else:
            deferred += 1
    assert proved and deferred  # both outcomes were exercised


def test_nan_and_infinity_are_never_proved_finite():
    for bound in (math.nan, math.inf, -math.inf):
        assert not read_tally(2.0, bound, unit=1.0, prescale=1.0,
                              largest=LARGEST32).proves_finite


def test_the_limit_leaves_room_for_every_scaling():
    assert finite_bound_limit(100.0, prescale=1.0, unit=1.0) == 50.0
    assert finite_bound_limit(100.0, prescale=4.0, unit=1.0) == 12.5  # prescaled sums
    assert finite_bound_limit(100.0, prescale=1.0, unit=0.5) == 25.0  # in reduced units
    assert finite_bound_limit(100.0, prescale=1.0, unit=8.0) == 50.0  # scaled up after


def test_a_joined_rank_makes_the_average_over_the_others():
    assert joined_rescale(2, 2) == 1.0
    assert joined_rescale(1, 4) == 4.0
    assert joined_rescale(3, 4) == pytest.approx(4 / 3)
    assert joined_rescale(0, 4) == 4.0  # every rank joined: the zeros stay zeros
    assert not some_ranks_joined(4, 4) and some_ranks_joined(3, 4)
    assert some_ranks_joined(0, 4)


def test_the_rescale_rules_serve_arrays_with_the_frameworks_maximum():
    contributors = np.array([0.0, 1.0, 2.0])
    assert joined_rescale(contributors, 2, maximum=np.maximum).tolist() == [2.0, 2.0, 1.0]
    assert some_ranks_joined(contributors, 2).tolist() == [True, True, False]
