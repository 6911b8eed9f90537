"""LinearScalingWarmup (hvdtrain/adapters/torch/scheduler.py)
on 2 real ranks (Gloo and MPI), and its change of world size in one process.

The launch, shared by tests/adapters/test_torch_*.py: conftest.py's ``torch_run``.
"""

import pytest
import torch
from workers.torch_common import (
    STEPS,
    schedule,
)

from hvdtrain.adapters.torch import LinearScalingWarmup


@pytest.mark.parametrize(("name", "passes"), [("sgd", 1), ("adam", 1), ("sgd_accumulate", 2)])
def test_learning_rate_follows_the_schedule_step_by_step(torch_run, name, passes):
    eta = {"sgd": 0.05, "adam": 0.01, "sgd_accumulate": 0.05}[name]
    expected = schedule(passes, base_lr=eta)
    assert torch_run.report(name)["lrs"] == [expected.lr_at(step) for step in range(STEPS)]
    assert expected.scale == 2 * passes


def one_process_scheduler(world_size: int = 3):
    """A scheduler in this process (no Horovod): 240 samples per epoch at batch 4 per
    worker, η = 0.05 for a batch of 4, 2 warmup epochs, a milestone at epoch 3."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    return optimizer, LinearScalingWarmup(
        optimizer, batch_size_per_worker=4, base_batch_size=4, warmup_epochs=2,
        milestones=(3,), steps_per_epoch=240 // (4 * world_size), world_size=world_size)


def test_a_new_world_size_continues_the_rule_from_the_samples_seen():
    optimizer, scheduler = one_process_scheduler(world_size=3)
    for _ in range(12):
        optimizer.step()
        scheduler.step()
    assert scheduler.samples_seen == 12 * 12
    scheduler.set_world_size(2)
    # 144 of 240 samples = 0.6 epochs; k = 2: 0.05 + (0.1 - 0.05) x 0.6 / 2.
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.065, rel=1e-12)
    for _ in range(12):  # 12 steps of 8 samples: 240 samples = 1 epoch
        optimizer.step()
        scheduler.step()
    assert scheduler.samples_seen == 240
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05 + 0.05 * 1 / 2, rel=1e-12)
    for _ in range(30 * 2):  # to epoch 3: past the warmup and the milestone
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.1, rel=1e-12)


def test_the_same_world_size_changes_nothing():
    optimizer, scheduler = one_process_scheduler()
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    before = optimizer.param_groups[0]["lr"]
    scheduler.set_world_size(3)
    assert scheduler.resized_at is None and optimizer.param_groups[0]["lr"] == before


def test_the_progress_after_a_resize_survives_a_state_dict():
    optimizer, scheduler = one_process_scheduler()
    for _ in range(12):
        optimizer.step()
        scheduler.step()
    scheduler.set_world_size(2)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    resumed_optimizer, resumed = one_process_scheduler()  # built for 3, as a joiner would be
    resumed.load_state_dict(scheduler.state_dict())
    assert (resumed.world_size, resumed.samples_seen) == (2, 12 * 12 + 3 * 8)
    assert resumed_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_a_world_size_that_is_not_a_count_is_refused(bad):
    _, scheduler = one_process_scheduler()
    with pytest.raises(ValueError, match="world_size"):
        scheduler.set_world_size(bad)
