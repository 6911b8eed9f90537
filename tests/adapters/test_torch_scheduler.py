"""LinearScalingWarmup (hvdtrain/adapters/torch/scheduler.py)
on 2 real ranks (Gloo and MPI).

The launch, shared by tests/adapters/test_torch_*.py: conftest.py's ``torch_run``.
"""

import pytest
from workers.torch_common import (
    STEPS,
    schedule,
)


@pytest.mark.parametrize(("name", "passes"), [("sgd", 1), ("adam", 1), ("sgd_accumulate", 2)])
def test_learning_rate_follows_the_schedule_step_by_step(torch_run, name, passes):
    eta = {"sgd": 0.05, "adam": 0.01, "sgd_accumulate": 0.05}[name]
    expected = schedule(passes, base_lr=eta)
    assert torch_run.report(name)["lrs"] == [expected.lr_at(step) for step in range(STEPS)]
    assert expected.scale == 2 * passes
