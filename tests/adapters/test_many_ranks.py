"""The equivalence tests beyond 2 ranks: 5 and 8 workers under Gloo and MPI, the torch
DistributedOptimizer (flat, accumulated, overlapped, ZeRO stages 1 and 2) and Keras's
``fit`` against one process on the concatenated batch of all the workers.

At N ranks the rank arithmetic takes paths 2 ranks never do: uneven shards of 53
parameters over 5 and 8 ranks (11, 11, 11, 11, 9 and 7 x 7, 4), rings of 5 and 8
steps, and the rate of k = N x passes. This machine has 2 cores, so the ranks are
oversubscribed (slow, not different): marked ``scale``, deselected locally with
``-m "not scale"``; CI runs them. One launch per (ranks, controller) and framework runs
every scenario.
"""

import pytest
from harness import Run, launch
from harness import max_difference as array_difference
from torch_results import max_difference, tensors
from workers.keras_common import reference_fit
from workers.torch_common import STEPS, make_model, reference_run

from hvdtrain.jobs.launch import CONTROLLERS

pytestmark = pytest.mark.scale

RANKS = (5, 8)
FLOAT64_TOLERANCE = 1e-10
# A Keras launch of 8 TensorFlow processes on 2 cores takes about 50 s.
LAUNCH_TIMEOUT = 280

TORCH_CASES = [  # (scenario of tests/workers/torch_adapter.py, optimizer, backward passes)
    ("sgd", "sgd", 1), ("sgd_accumulate", "sgd", 2), ("sgd_overlap", "sgd", 1),
    ("sgd_sharded", "sgd", 1), ("adamw_sharded", "adamw", 1),
    ("sgd_grad_sharded", "sgd", 1), ("adamw_grad_sharded", "adamw", 1),
    ("adamw_grad_sharded_accumulate", "adamw", 2),
]
SHARDED = [name for name, *_ in TORCH_CASES if "sharded" in name]
KERAS_CASES = [("sgd", "sgd", 1), ("adam", "adam", 1), ("sgd_accumulate", "sgd", 2)]
LAUNCHES = [pytest.param((ranks, controller), id=f"{ranks}-{controller}")
            for ranks in RANKS for controller in CONTROLLERS]


def _run(tmp_path_factory, script: str, launch_id: tuple[int, str], scenarios, **env) -> Run:
    ranks, controller = launch_id
    out = tmp_path_factory.mktemp(f"{script}-{ranks}-{controller}")
    env = {"HVDTRAIN_TEST_SCENARIOS": ",".join(name for name, *_ in scenarios), **env}
    return Run(launch(script, str(out), controller=controller, np=ranks, env=env,
                      timeout=LAUNCH_TIMEOUT), out)


@pytest.fixture(scope="module", params=LAUNCHES)
def torch_many(request, tmp_path_factory) -> tuple[int, Run]:
    return request.param[0], _run(tmp_path_factory, "torch_adapter.py", request.param,
                                  TORCH_CASES)


@pytest.fixture(scope="module", params=LAUNCHES)
def keras_many(request, tmp_path_factory) -> tuple[int, Run]:
    return request.param[0], _run(tmp_path_factory, "keras_adapter.py", request.param,
                                  KERAS_CASES, KERAS_BACKEND="tensorflow")


@pytest.mark.parametrize(("name", "kind", "passes"), TORCH_CASES)
def test_torch_workers_equal_one_process_on_the_concatenated_batch(torch_many, name, kind,
                                                                   passes):
    ranks, run = torch_many
    reference = reference_run(kind, passes=passes, workers=ranks)
    # The rate really is k = ranks x passes: the 2-rank reference is another run.
    assert max_difference(reference_run(kind, passes=passes), reference) > 1e-3
    for rank in range(ranks):
        assert max_difference(tensors(run, name, rank), reference) <= FLOAT64_TOLERANCE, rank
        assert run.report(name, rank)["checksums"] == run.report(name, 0)["checksums"], rank
    assert len(set(run.report(name)["checksums"])) == STEPS
    assert run.report(name)["lrs"][-1] == pytest.approx(
        (0.05 if kind == "sgd" else 0.01) * ranks * passes, rel=1e-12)


@pytest.mark.parametrize("name", SHARDED)
def test_each_of_the_ranks_holds_its_slice_of_the_state(torch_many, name):
    """The split docs/torch.md states: shards of ceil(53 / N) elements, the last rank's
    holding what is left."""
    ranks, run = torch_many
    parameters = sum(p.numel() for p in make_model().parameters())
    shard_length = -(-parameters // ranks)
    assert [run.report(name, rank)["state_sizes"] for rank in range(ranks)] == [
        [min(shard_length, parameters - rank * shard_length)] for rank in range(ranks)]


@pytest.mark.parametrize(("name", "kind", "passes"), KERAS_CASES)
def test_keras_fit_on_the_workers_equals_one_process(keras_many, name, kind, passes):
    ranks, run = keras_many
    reference = reference_fit(kind, passes, workers=ranks)
    for rank in range(ranks):
        assert array_difference(run.arrays(name, rank), reference) <= FLOAT64_TOLERANCE, rank
        assert run.report(name, rank)["epoch_sums"] == run.report(name, 0)["epoch_sums"], rank
