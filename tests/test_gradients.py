"""hvdtrain.gradients: the rules of the averaged step, in one process.

The proof of finiteness is checked against a float32 reduction emulated with numpy (the
ranks' values summed in float32 as a ring would, then scaled as Horovod scales), for
values drawn near the largest float32; the adapters' own tests run the same cases on
real ranks (tests/adapters/test_torch_optimizer.py, test_keras_optimizer.py).
"""

import math

import numpy as np
import pytest

from hvdtrain import gradients, horovod_patches
from hvdtrain.collective import any_rank
from hvdtrain.compression import WIRE_FORMATS, wire_format
from hvdtrain.nonfinite import NonFinitePolicy
from hvdtrain.step_events import StepObservers
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


class OtherRanks:
    """The part of a TensorCollective the vote uses, for one process: the sum adds the
    flags of the other ranks given. The adapters' own tensors() are checked on real
    ranks (test_torch_optimizer.py, test_keras_optimizer.py, test_numpy.py)."""

    def __init__(self, *flags: float) -> None:
        self.flags = flags

    def allreduce(self, tensor, name, *, op="sum", prescale=1.0, postscale=1.0):
        assert op == "sum" and name == "vote"
        return tensor + sum(self.flags)

    def wait(self, handle):
        return handle


def test_the_vote_is_any_rank():
    assert any_rank(np.array([1.0]), OtherRanks(0.0), "vote").tolist() == [True]
    assert any_rank(np.array([0.0]), OtherRanks(0.0, 0.0), "vote").tolist() == [False]
    # another rank raised its flag
    assert any_rank(np.array([0.0]), OtherRanks(0.0, 1.0), "vote").tolist() == [True]


@pytest.mark.parametrize(("skip", "check", "policy"), [
    (True, True, NonFinitePolicy.SKIP), (True, False, NonFinitePolicy.SKIP),
    (False, True, NonFinitePolicy.RAISE), (False, False, NonFinitePolicy.IGNORE)])
def test_the_two_arguments_make_one_policy(skip, check, policy):
    assert NonFinitePolicy.of(skip, check) is policy
    assert policy.checks is (policy is not NonFinitePolicy.IGNORE)
    assert policy.skips is (policy is NonFinitePolicy.SKIP)
    assert NonFinitePolicy(policy.value) is policy and policy == policy.value


def test_the_wire_formats_and_their_largest_numbers():
    assert list(WIRE_FORMATS) == [None, "fp16", "bf16"]
    assert wire_format("fp16").largest == float(np.finfo(np.float16).max)
    assert wire_format("fp16").largest_for(LARGEST32) == 65504.0
    assert wire_format(None).largest_for(LARGEST32) == LARGEST32
    assert wire_format("bf16").largest < LARGEST32
    assert wire_format("bf16").bytes_per_element == 2 and wire_format(None).bytes_per_element \
        is None
    assert wire_format("fp16").reduced_natively and wire_format(None).reduced_natively
    # bf16 is reduced natively exactly when the installed Horovod carries patch 0011
    assert wire_format("bf16").needs_patch == horovod_patches.BFLOAT16
    assert wire_format("bf16").reduced_natively == horovod_patches.has_patch(
        horovod_patches.BFLOAT16)


@pytest.mark.parametrize("bad", ["zip", 16, ["fp16"]])
def test_an_unknown_wire_format_is_refused_naming_the_choices(bad):
    with pytest.raises(ValueError, match=r"compression must be None, 'fp16' or 'bf16', got "):
        wire_format(bad)


class Recorder:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def reduction_started(self, step):
        self.log.append((self.name, "started", step))

    def reduction_finished(self, step):
        self.log.append((self.name, "finished", step))

    def step_finished(self, step, applied):
        self.log.append((self.name, "step", step, applied))


def test_observers_hear_every_event_in_order_until_removed():
    observers, log = StepObservers(), []
    assert not observers
    stop_first = observers.add(Recorder(log, "first"))
    second = Recorder(log, "second")
    observers.add(second)
    assert observers
    observers.reduction_started(0)
    observers.reduction_finished(0)
    observers.step_finished(0, applied=False)
    stop_first()
    observers.step_finished(1, applied=True)
    observers.remove(second)
    observers.remove(second)  # nothing the second time
    observers.step_finished(2, applied=True)
    assert log == [("first", "started", 0), ("second", "started", 0),
                   ("first", "finished", 0), ("second", "finished", 0),
                   ("first", "step", 0, False), ("second", "step", 0, False),
                   ("second", "step", 1, True)]
    assert not observers
    assert isinstance(gradients.step_observers, StepObservers)
