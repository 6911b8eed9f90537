"""The tally behind the gradients in the flat allreduce (hvdtrain/adapters/torch/tally.py),
in one process: a 2-rank average emulated by summing two buffers and scaling them as
Horovod does, and the fused packing (hvdtrain._packing) against torch's two passes."""

import math

import pytest
import torch

from hvdtrain.adapters.torch import tally
from hvdtrain.adapters.torch.tally import flat_with_tally, rows_with_tally, split_tally, write_bound
from hvdtrain.sharding import ShardLayout

LARGEST = torch.finfo(torch.float32).max


def averaged(*ranks: list[torch.Tensor], size: int = 2) -> torch.Tensor:
    """What Horovod's average over ``size`` ranks leaves in each rank's buffer; ranks not
    given have joined and send zeros."""
    buffers = [flat_with_tally(r, torch.float32, torch.device("cpu"), bound=True)
               for r in ranks]
    return sum(buffers[1:], buffers[0]) / size


def test_the_gradients_come_back_in_order_and_the_tally_counts_the_ranks():
    one = [torch.tensor([[1.0, 2.0]]), torch.tensor([3.0])]
    two = [torch.tensor([[3.0, 4.0]]), torch.tensor([5.0])]
    gradients, contributors, finite = split_tally(averaged(one, two), 0.5, prescale=1.0)
    assert gradients.tolist() == [2.0, 3.0, 4.0]
    assert (contributors, finite) == (2, True)
    _, contributors, _ = split_tally(averaged(one), 0.5, prescale=1.0)  # the other joined
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
    assert split_tally(reduced, 0.5, prescale=1.0)[2] is finite


def test_the_fused_packing_is_built_and_equals_the_two_pass_one():
    """setup.py builds hvdtrain._packing (a C compiler is part of the setup); its one
    pass copies exactly what torch.cat copies and sums the same squares."""
    assert tally._packing is not None, "hvdtrain._packing was not built: run scripts/setup.sh"
    generator = torch.Generator().manual_seed(3)
    gradients = [torch.randn(shape, generator=generator) * 100
                 for shape in [(37, 5), (1,), (0,), (1000,), (3, 4, 5)]]
    fused = flat_with_tally(gradients, torch.float32, torch.device("cpu"), bound=True)
    two_pass = flat_with_tally(gradients, torch.float32, torch.device("cpu"), bound=True,
                               fused=False)
    assert torch.equal(fused[:-1], two_pass[:-1])
    assert fused[-1].item() == pytest.approx(two_pass[-1].item(), rel=1e-6)
    unbounded = flat_with_tally(gradients, torch.float32, torch.device("cpu"), bound=False)
    assert torch.equal(unbounded[:-1], two_pass[:-1]) and unbounded[-1].item() == math.inf


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_the_fused_bound_carries_nan_and_inf(bad):
    for where in range(33):  # in the blocks of 16 the C loop sums lane-wise, and after
        gradients = [torch.ones(2), torch.ones(33)]
        gradients[1][where] = bad
        flat = flat_with_tally(gradients, torch.float32, torch.device("cpu"), bound=True)
        assert not math.isfinite(flat[-1].item()), where
    gradients = [torch.ones(40), torch.ones(33)]
    gradients[0][5] = bad
    flat = flat_with_tally(gradients, torch.float32, torch.device("cpu"), bound=True)
    assert not math.isfinite(flat[-1].item())
    assert torch.allclose(flat[:-2], torch.cat(gradients), rtol=0, atol=0, equal_nan=True)


def test_gradients_the_fused_packing_cannot_take_go_the_two_pass_way():
    """float64, and a transposed (non-contiguous) float32 gradient."""
    for gradients, dtype in [([torch.ones(3, dtype=torch.float64) * 2], torch.float64),
                             ([torch.arange(6.0).reshape(2, 3).t(), torch.ones(2)],
                              torch.float32)]:
        flat = flat_with_tally(gradients, dtype, torch.device("cpu"), bound=True)
        assert flat[:-2].tolist() == torch.cat([g.reshape(-1) for g in gradients]).tolist()
        expected = math.sqrt(sum(float((g * g).sum()) for g in gradients))
        assert flat[-1].item() == pytest.approx(expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("world_size", [2, 3])
def test_the_rows_are_the_slices_of_the_flat_buffer_each_with_the_whole_tally(dtype,
                                                                              world_size):
    """rows_with_tally (what shard_gradients reduce-scatters): row r holds worker r's
    slice of the flat gradients (zero-padded), then 1 and the norm of all of them; a
    2-rank reduce-scatter (the rows summed, each rank reading its own) gives each rank
    what split_tally gives for the allreduced flat buffer, sliced."""
    generator = torch.Generator().manual_seed(3)
    layout = ShardLayout((6, 1, 4), world_size, 0)  # 11 elements
    one, two = ([torch.randn(size, generator=generator, dtype=dtype) for size in layout.sizes]
                for _ in range(2))
    rows = rows_with_tally(one, layout, bound=True)
    flat = flat_with_tally(one, dtype, torch.device("cpu"), bound=True)
    length = layout.shard_length
    assert rows.shape == (world_size, length + tally.TALLY)
    padded = torch.cat([flat[:-tally.TALLY], flat.new_zeros(layout.padded_total - 11)])
    assert torch.equal(rows[:, :length], padded.view(world_size, length))
    assert torch.equal(rows[:, length], torch.ones(world_size, dtype=dtype))
    assert torch.allclose(rows[:, length + 1], flat[-1].expand(world_size), rtol=1e-6)
    summed_rows = (rows + rows_with_tally(two, layout, bound=True)) / 2
    summed_flat = (flat + flat_with_tally(two, dtype, torch.device("cpu"), bound=True)) / 2
    whole, _, _ = split_tally(summed_flat, 0.5, prescale=1.0)
    for rank in range(world_size):
        start, end = layout.bounds(rank)
        mine, contributors, finite = split_tally(summed_rows[rank], 0.5, prescale=1.0)
        assert torch.equal(mine[:end - start], whole[start:end])
        assert (contributors, finite) == (2, True)


def test_the_rows_carry_a_nan_into_every_tally_and_no_bound_without_asking():
    layout = ShardLayout((2, 2), 2, 0)
    rows = rows_with_tally([torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0])],
                           layout, bound=True)
    assert all(math.isnan(value) for value in rows[:, -1].tolist())
    unbounded = rows_with_tally([torch.ones(2), torch.ones(2)], layout, bound=False)
    assert all(math.isinf(value) for value in unbounded[:, -1].tolist())
