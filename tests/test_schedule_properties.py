"""Property-based tests (hypothesis): the schedule and its validators on random and
extreme input, against Goyal et al.'s rules written out here."""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hvdtrain.schedule import LinearScalingSchedule

positive_ints = st.integers(min_value=1, max_value=10**6)
rates = st.floats(min_value=1e-8, max_value=1e3, allow_nan=False, allow_infinity=False)
valid = st.builds(
    LinearScalingSchedule,
    base_lr=rates,
    batch_size_per_worker=st.integers(1, 4096),
    world_size=st.integers(1, 4096),
    steps_per_epoch=st.integers(1, 5000),
    base_batch_size=st.integers(1, 8192),
    warmup_epochs=st.floats(min_value=0, max_value=20, allow_nan=False),
    milestones=st.lists(st.integers(0, 200), max_size=5, unique=True).map(sorted).map(tuple),
    gamma=st.floats(min_value=1e-4, max_value=1.0),
    backward_passes_per_step=st.integers(1, 64),
)


@settings(max_examples=300, deadline=None)
@given(schedule=valid, step=st.integers(0, 10**7))
def test_rate_is_the_ramp_times_the_decay(schedule, step):
    k = schedule.global_batch_size / schedule.base_batch_size
    assert schedule.scale == k
    eta, target, w = schedule.base_lr, k * schedule.base_lr, schedule.warmup_steps
    ramp = eta + (target - eta) * step / w if step < w else target
    decays = sum(1 for m in schedule.milestones if step // schedule.steps_per_epoch >= m)
    expected = ramp * schedule.gamma**decays
    assert schedule.lr_at(step) == pytest.approx(expected, rel=1e-12, abs=0)
    assert schedule.lr_at(step) > 0 or expected == 0  # underflow of gamma**decays only


@settings(max_examples=200, deadline=None)
@given(schedule=valid)
def test_warmup_starts_at_eta_rises_monotonically_and_lands_on_k_eta(schedule):
    w = schedule.warmup_steps
    if schedule.scale <= 1:
        assert w == 0
        return
    no_decay = not schedule.milestones or schedule.milestones[0] * schedule.steps_per_epoch > w
    if not no_decay:
        return
    assert schedule.lr_at(0) == schedule.base_lr or w == 0
    probes = sorted({0, min(1, w), w // 3, w // 2, max(w - 1, 0), w})
    values = [schedule.lr_at(t) for t in probes]
    assert values == sorted(values)
    assert schedule.lr_at(w) == pytest.approx(schedule.target_lr, rel=1e-12)


bad_numbers = st.one_of(st.just(0), st.integers(max_value=0), st.just(math.nan),
                        st.just(math.inf), st.just(-math.inf), st.floats(max_value=0))
bad_counts = st.one_of(st.integers(max_value=0), st.floats(allow_nan=True), st.just(True),
                       st.text(max_size=3), st.none())
VALID = dict(base_lr=0.1, batch_size_per_worker=32, world_size=8, steps_per_epoch=100)


@settings(max_examples=200, deadline=None)
@given(argument=st.sampled_from(["batch_size_per_worker", "world_size", "steps_per_epoch",
                                 "base_batch_size", "backward_passes_per_step"]),
       value=bad_counts)
def test_every_bad_count_is_refused_by_name(argument, value):
    with pytest.raises(ValueError, match=argument):
        LinearScalingSchedule(**{**VALID, argument: value})


@settings(max_examples=200, deadline=None)
@given(argument=st.sampled_from(["base_lr", "gamma"]), value=bad_numbers)
def test_every_bad_rate_is_refused_by_name(argument, value):
    with pytest.raises(ValueError, match=argument):
        LinearScalingSchedule(**{**VALID, argument: value})


@settings(max_examples=200, deadline=None)
@given(milestones=st.lists(st.integers(-5, 100), min_size=2, max_size=6))
def test_milestones_must_be_strictly_ascending_non_negative(milestones):
    good = all(m >= 0 for m in milestones) and all(
        b > a for a, b in itertools.pairwise(milestones))
    if good:
        assert LinearScalingSchedule(**VALID, milestones=milestones).milestones == tuple(
            milestones)
    else:
        with pytest.raises(ValueError, match="milestones"):
            LinearScalingSchedule(**VALID, milestones=milestones)


@settings(max_examples=100, deadline=None)
@given(value=st.one_of(st.floats(max_value=-1e-9), st.just(math.nan), st.just(math.inf)))
def test_bad_warmup_is_refused(value):
    with pytest.raises(ValueError, match="warmup_epochs"):
        LinearScalingSchedule(**VALID, warmup_epochs=value)
