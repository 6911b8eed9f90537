"""hvdtrain.adapters.numpy on 2 real MPI ranks, against values computed here."""

import numpy as np
import pytest
from harness import Run, launch, max_difference
from workers.numpy_common import STEPS, reference_sgd
from workers.scenarios import expected_tensor_collective

from hvdtrain.schedule import LinearScalingSchedule


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("numpy")
    return Run(launch("numpy_adapter.py", str(out_dir), controller="mpi"), out_dir)


def rank_values(rank, dtype, shape):
    count = int(np.prod(shape))
    return (np.arange(count) * (rank + 1) + 3 * rank).astype(dtype).reshape(shape)


@pytest.mark.parametrize(("label", "dtype", "shape", "mean_dtype"), [
    ("float32", np.float32, (3, 4), np.float32),
    ("float64", np.float64, (5,), np.float64),
    ("int32", np.int32, (2, 3), np.float64),
    ("empty", np.float64, (0, 3), np.float64),
])
def test_allreduce_mean_and_broadcast(run, label, dtype, shape, mean_dtype):
    expected_mean = (rank_values(0, np.float64, shape) + rank_values(1, np.float64, shape)) / 2
    for rank in (0, 1):
        saved = np.load(run.out_dir / f"collectives-rank{rank}.npz")
        mean, root = saved[f"{label}_mean"], saved[f"{label}_broadcast"]
        assert mean.dtype == mean_dtype and mean.shape == shape
        np.testing.assert_array_equal(mean, expected_mean.astype(mean_dtype))
        assert root.dtype == dtype
        np.testing.assert_array_equal(root, rank_values(0, dtype, shape))


def test_non_contiguous_input_is_copied_correctly(run):
    bases = [np.arange(24, dtype=np.float64).reshape(4, 6) * (r + 1) for r in (0, 1)]
    for rank in (0, 1):
        saved = np.load(run.out_dir / f"collectives-rank{rank}.npz")
        np.testing.assert_array_equal(saved["strided_mean"],
                                      (bases[0][:, ::2].T + bases[1][:, ::2].T) / 2)
        np.testing.assert_array_equal(saved["strided_broadcast"], bases[0][::2, 1::2].T)


def test_64_megabyte_arrays(run):
    for report in run.both("large"):
        assert report["nbytes"] == 64 * 1024 * 1024
        assert report["mean_min"] == report["mean_max"] == (1.0 + 2.0) / 2
        assert report["broadcast_unique"] == [2.0]  # rank 0's values, doubled


def test_mismatched_shapes_raise_on_every_rank(run):
    for report in run.both("mismatch"):
        assert ("allreduce_mean: the ranks disagree: array shape is (3,) on rank 0 but (4,) "
                "on rank 1") in report["message"]
        assert ("params[0] (shape, dtype) is ((3,), '<f8') on rank 0 but ((4,), '<f8') on "
                "rank 1") in report["model_message"]


def test_distributed_sgd_equals_one_process_on_the_concatenated_batch(run):
    reference = reference_sgd()
    for rank in (0, 1):
        assert max_difference(run.arrays("sgd", rank), reference) <= 1e-12
    plan = LinearScalingSchedule(base_lr=0.1, batch_size_per_worker=4, world_size=2,
                                 steps_per_epoch=5, base_batch_size=4, warmup_epochs=2)
    assert run.both("sgd")[0]["lrs"] == [plan.lr_at(step) for step in range(STEPS)]


def test_step_observers_hear_every_step(run):
    """hvdtrain.step_events' observers hear each reduction and each applied step."""
    for report in run.both("sgd"):
        assert report["events"] == [
            event for step in range(STEPS) for event in (
                ["reduction_started", step], ["reduction_finished", step],
                ["step_finished", step, True])]


def test_verify_replicas_names_the_rank_and_array(run):
    for report in run.both("verify"):
        assert "rank(s) [1]" in report["message"] and "array[1]" in report["message"]


def test_gloo_launch_gets_a_clear_error(tmp_path):
    result = launch("numpy_under_gloo.py", str(tmp_path), controller="gloo", timeout=120)
    # The first rank to exit records 3; horovodrun may stop the other before it records its own.
    codes = [rank.exit_code for rank in result.ranks]
    assert 3 in codes and set(codes) <= {3, None}, codes
    for rank in result.ranks:
        assert "horovodrun --gloo" in rank.output
        assert "horovodrun --mpi -np N" in rank.output and "mpirun -np N" in rank.output


def test_the_tensor_collective_moves_arrays_as_the_core_expects(run):
    """tensors(): the core's TensorCollective over mpi4py, each operation against the
    ranks' values combined here."""
    for rank, report in enumerate(run.both("tensor_collective")):
        report = {key: value for key, value in report.items() if key not in ("scenario", "rank")}
        assert report == expected_tensor_collective(2, rank)
