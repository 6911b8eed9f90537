"""The tally behind the gradients in the flat allreduce (hvdtrain/adapters/torch/tally.py),
in one process: a 2-rank average emulated by summing two buffers and scaling them as
Horovod does."""

import pytest
import torch

from hvdtrain.adapters.torch.tally import flat_with_tally, read_tally, write_bound

LARGEST = torch.finfo(torch.float32).max


def averaged(*ranks: list[torch.Tensor], size: int = 2) -> torch.Tensor:
    """What Horovod's average over ``size`` ranks leaves in each rank's buffer; ranks not
    given have joined and send zeros."""
    buffers = [flat_with_tally(r, torch.float32, torch.device("cpu"), write_bound)
               for r in ranks]
    return sum(buffers[1:], buffers[0]) / size


def test_the_gradients_come_back_in_order_and_the_tally_counts_the_ranks():
    one = [torch.tensor([[1.0, 2.0]]), torch.tensor([3.0])]
    two = [torch.tensor([[3.0, 4.0]]), torch.tensor([5.0])]
    gradients, contributors, finite = read_tally(averaged(one, two), 0.5, prescale=1.0)
    assert gradients.tolist() == [2.0, 3.0, 4.0]
    assert (contributors, finite) == (2, True)
    _, contributors, _ = read_tally(averaged(one), 0.5, prescale=1.0)  # the other joined
    assert contributors == 1


def test_the_bound_is_the_l2_norm_and_carries_nan_and_inf():
    out = torch.empty(())
    write_bound(torch.tensor([3.0, -4.0]), out)
    assert out.item() == 5.0
    for bad in (float("nan"), float("inf")):
        write_bound(torch.tensor([1.0, bad]), out)
        assert not torch.isfinite(out)


@pytest.mark.parametrize(("one", "two", "finite"), [
    (1.0, -2.0, True),
    (0.75 * LARGEST, 0.75 * LARGEST, False),  # the sum overflows on the wire
    (0.75 * LARGEST, -0.75 * LARGEST, False),  # cancels, but a partial sum is near it
    (1e18, -1e18, True),
    # the norm's squares overflow above sqrt(largest): no proof, the read decides
    (0.2 * LARGEST, 0.2 * LARGEST, False),
    (0.0, float("nan"), False),
])
def test_the_bound_proves_finite_only_what_cannot_overflow(one, two, finite):
    reduced = averaged([torch.tensor([one])], [torch.tensor([two])])
    assert read_tally(reduced, 0.5, prescale=1.0)[2] is finite
