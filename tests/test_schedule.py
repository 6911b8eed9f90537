"""hvdtrain.schedule against Goyal et al. 2017's rules, computed independently here."""

import json
import math

import pytest

from hvdtrain.schedule import LinearScalingSchedule, WarmupProgress

# The paper's 8k run: eta = 0.1 for 256, 8192 = 32 per worker x 256 workers.
PAPER = dict(base_lr=0.1, batch_size_per_worker=32, world_size=256, steps_per_epoch=156)


def paper_schedule(**overrides):
    return LinearScalingSchedule(**{**PAPER, **overrides})


def incremental_warmup(eta, k, warmup_steps):
    """The paper's wording: start at eta, add a constant amount each iteration, reach k*eta."""
    increment = (k * eta - eta) / warmup_steps
    lrs = [eta]
    for _ in range(warmup_steps):
        lrs.append(lrs[-1] + increment)
    return lrs


def test_linear_scaling_rule_from_the_global_batch():
    s = paper_schedule()
    assert s.global_batch_size == 32 * 256
    assert s.scale == 32 * 256 / 256
    assert s.target_lr == pytest.approx(0.1 * 32)  # the paper's 3.2
    assert s.warmup_steps == 5 * 156


def test_warmup_starts_at_eta_and_reaches_k_eta_at_w():
    s = paper_schedule()
    expected = incremental_warmup(0.1, s.scale, s.warmup_steps)
    assert s.lr_at(0) == 0.1
    assert s.lr_at(s.warmup_steps) == pytest.approx(3.2, rel=1e-12)
    for t in (1, 2, s.warmup_steps // 2, s.warmup_steps - 1):
        assert s.lr_at(t) == pytest.approx(expected[t], rel=1e-9)
    mid = s.warmup_steps // 2
    assert s.lr_at(mid) == pytest.approx((0.1 + 3.2) / 2, rel=1e-12)


def test_warmup_increment_is_constant_per_iteration():
    s = paper_schedule()
    steps = [s.lr_at(t + 1) - s.lr_at(t) for t in range(s.warmup_steps)]
    assert max(steps) - min(steps) < 1e-12
    assert steps[0] == pytest.approx((3.2 - 0.1) / s.warmup_steps, rel=1e-9)


def test_constant_after_warmup_without_milestones():
    s = paper_schedule()
    for t in (s.warmup_steps, s.warmup_steps + 1, 89 * 156):
        assert s.lr_at(t) == s.target_lr


def test_milestones_multiply_by_gamma_at_each_epoch_boundary():
    s = paper_schedule(milestones=(30, 60, 80), gamma=0.1)
    spe = 156
    for epoch, decays in ((29, 0), (30, 1), (59, 1), (60, 2), (79, 2), (80, 3), (89, 3)):
        first, last = epoch * spe, (epoch + 1) * spe - 1
        expected = s.target_lr * 0.1**decays
        assert s.lr_at(first) == pytest.approx(expected, rel=1e-12), epoch
        assert s.lr_at(last) == pytest.approx(expected, rel=1e-12), epoch
    assert s.lr_at(30 * spe - 1) == s.target_lr


def test_milestone_inside_warmup_scales_the_ramp():
    s = LinearScalingSchedule(base_lr=1.0, batch_size_per_worker=64, world_size=8,
                              steps_per_epoch=10, warmup_epochs=5, milestones=(2,), gamma=0.5)
    ramp = incremental_warmup(1.0, 2.0, 50)
    assert s.lr_at(19) == pytest.approx(ramp[19], rel=1e-12)
    assert s.lr_at(20) == pytest.approx(ramp[20] * 0.5, rel=1e-12)


def test_accumulation_multiplies_the_global_batch():
    plain = LinearScalingSchedule(base_lr=0.1, batch_size_per_worker=32, world_size=4,
                                  steps_per_epoch=100)
    accumulated = LinearScalingSchedule(base_lr=0.1, batch_size_per_worker=32, world_size=4,
                                        steps_per_epoch=100, backward_passes_per_step=4)
    assert plain.global_batch_size == 128
    assert accumulated.global_batch_size == 512
    assert accumulated.scale == 4 * plain.scale
    assert accumulated.target_lr == pytest.approx(0.2)
    assert accumulated.lr_at(accumulated.warmup_steps) == pytest.approx(0.2)


def test_no_ramp_when_the_global_batch_is_not_larger_than_the_base():
    s = LinearScalingSchedule(base_lr=0.1, batch_size_per_worker=16, world_size=2,
                              steps_per_epoch=10, base_batch_size=64)
    assert s.scale == 0.5
    assert s.warmup_steps == 0
    assert s.lr_at(0) == pytest.approx(0.05)
    assert s.lr_at(49) == pytest.approx(0.05)


def test_warmup_disabled_and_fractional():
    assert paper_schedule(warmup_epochs=0).lr_at(0) == pytest.approx(3.2)
    half = paper_schedule(warmup_epochs=0.5)
    assert half.warmup_steps == 78
    assert half.lr_at(78) == pytest.approx(3.2)


def test_epoch_table_rows():
    s = paper_schedule()
    rows = s.epoch_table(7)
    assert [r.epoch for r in rows] == list(range(7))
    assert rows[0].first_lr == 0.1
    assert rows[5].first_step == 5 * 156 and rows[5].first_lr == pytest.approx(3.2)
    assert rows[4].last_step == 5 * 156 - 1
    assert rows[4].last_lr == pytest.approx(s.lr_at(5 * 156 - 1))


@pytest.mark.parametrize(
    ("argument", "value", "reason"),
    [
        ("base_lr", 0, "> 0"),
        ("base_lr", -0.1, "> 0"),
        ("base_lr", math.nan, "finite"),
        ("base_lr", math.inf, "finite"),
        ("batch_size_per_worker", 0, "> 0"),
        ("batch_size_per_worker", -8, "> 0"),
        ("batch_size_per_worker", 2.5, "int"),
        ("world_size", 0, "> 0"),
        ("steps_per_epoch", 0, "> 0"),
        ("steps_per_epoch", -1, "> 0"),
        ("base_batch_size", 0, "> 0"),
        ("backward_passes_per_step", 0, "> 0"),
        ("warmup_epochs", -1, ">= 0"),
        ("warmup_epochs", math.inf, "finite"),
        ("milestones", (60, 30), "ascending"),
        ("milestones", (30, 30), "ascending"),
        ("milestones", (-1, 30), ">= 0"),
        ("milestones", (1.5,), "ints"),
        ("gamma", 0, "> 0"),
        ("gamma", -0.1, "> 0"),
    ],
)
def test_invalid_arguments_name_the_argument_and_reason(argument, value, reason):
    with pytest.raises(ValueError, match=argument) as raised:
        paper_schedule(**{argument: value})
    assert reason in str(raised.value)


@pytest.mark.parametrize("step", [-1, 1.5, True])
def test_invalid_step(step):
    with pytest.raises(ValueError, match="step"):
        paper_schedule().lr_at(step)


def test_the_rule_in_epochs_agrees_with_the_rule_in_steps():
    s = paper_schedule(milestones=(30, 60, 80))
    for t in (0, 1, 390, s.warmup_steps - 1, s.warmup_steps, 30 * 156 - 1, 30 * 156, 85 * 156):
        assert s.lr_at_epoch(t / 156) == pytest.approx(s.lr_at(t), rel=1e-12, abs=0)


def test_the_rule_in_epochs_after_a_change_of_world_size():
    """256 workers for 2.5 epochs, then 192: the rate is the 192-worker rule at 2.5 epochs,
    written out from the paper's formula."""
    eta, epoch = 0.1, 2.5
    k = 32 * 192 / 256
    shrunk = paper_schedule(world_size=192, milestones=(30,))
    assert shrunk.lr_at_epoch(epoch) == pytest.approx(eta + (k * eta - eta) * epoch / 5,
                                                      rel=1e-12)
    assert shrunk.lr_at_epoch(7.0) == pytest.approx(k * eta, rel=1e-12)
    assert shrunk.lr_at_epoch(30.0) == pytest.approx(k * eta * 0.1, rel=1e-12)


def test_progress_is_the_step_rule_until_a_resize_then_the_rule_at_the_samples_seen():
    """256 workers x 32 for 390 steps (of 156 per epoch), then 192 workers: samples and
    rates written out from the definitions."""
    before = WarmupProgress.begin(paper_schedule())
    per_epoch = 156 * 256 * 32
    assert before.samples_per_epoch == per_epoch and before.resized_at is None
    assert before.samples_seen(390) == 390 * 8192
    assert before.lr_at(390) == paper_schedule().lr_at(390)
    assert before.lr_at(390, base_lr=0.2) == paper_schedule(base_lr=0.2).lr_at(390)
    after = before.resized(390, 192)
    assert after.resized_at == (390, 390 * 8192) and after.world_size == 192
    assert after.samples_seen(400) == 390 * 8192 + 10 * 192 * 32
    epoch = (390 * 8192 + 10 * 6144) / per_epoch
    k = 32 * 192 / 256
    assert after.lr_at(400) == pytest.approx(0.1 + (k * 0.1 - 0.1) * epoch / 5, rel=1e-12)
    assert after.lr_at(400, base_lr=0.2) == pytest.approx(2 * after.lr_at(400), rel=1e-12)
    assert before.resized(390, 256) is before


def test_progress_round_trips_through_plain_values():
    """What a checkpoint or an elastic sync carries (JSON turns the tuple into a list)."""
    progress = WarmupProgress.begin(paper_schedule()).resized(390, 192)
    state = json.loads(json.dumps(progress.state_dict()))
    assert state == {"world_size": 192, "samples_per_epoch": 156 * 256 * 32,
                     "resized_at": [390, 390 * 8192]}
    assert WarmupProgress.from_state_dict(paper_schedule(), state) == progress


@pytest.mark.parametrize("world_size", [0, -1, 2.5, True])
def test_progress_rejects_a_world_size_that_is_not_one(world_size):
    with pytest.raises(ValueError, match="world_size"):
        WarmupProgress.begin(paper_schedule()).resized(10, world_size)


@pytest.mark.parametrize("epoch", [-0.5, math.nan, math.inf, True, "1"])
def test_the_rule_in_epochs_rejects_a_point_that_is_not_one(epoch):
    with pytest.raises(ValueError, match="epoch must be a finite number >= 0"):
        paper_schedule().lr_at_epoch(epoch)
