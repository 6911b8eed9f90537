"""Horovod's public API on hvdtrain.adapters.torch: a ``horovod.torch`` script runs with
its import changed. The names are Horovod's own objects (checked in one process); the
multi-rank scenario (tests/workers/torch_adapter.py, ``horovod_api``) calls them
through hvdtrain's module on 2 real ranks and is checked against closed forms here;
tests/workers/torch_process_sets.py runs DistributedOptimizer's ``process_set``.
"""

import types

import horovod.torch as horovod_torch
import pytest
import torch
from harness import Run, launch
from torch_results import max_difference, tensors
from workers.torch_common import STEPS, loss_fn, make_data, make_model, make_optimizer, rows

import hvdtrain.adapters.torch as hvt
from hvdtrain import horovod_patches, runtime
from hvdtrain.jobs.launch import CONTROLLERS

# hvdtrain's own versions (docs/torch.md, "Coming from horovod.torch"); elastic is a module.
OURS = {"init", "DistributedOptimizer", "join"}
PUBLIC = sorted(name for name in dir(horovod_torch) if not name.startswith("_")
                and not isinstance(getattr(horovod_torch, name), types.ModuleType))


def test_every_public_name_of_horovod_torch_is_here():
    missing = [name for name in PUBLIC if not hasattr(hvt, name)]
    assert not missing, f"horovod.torch names missing from hvdtrain.adapters.torch: {missing}"
    assert set(PUBLIC) <= set(hvt.__all__)


def test_the_elastic_module_keeps_horovods_names_with_hvdtrains_state():
    # run is Horovod's loop with hvdtrain's bound on a reset (its behaviour:
    # tests/adapters/test_torch_elastic.py, below --min-np with a leaky launcher).
    assert hvt.elastic.run.__module__ == "hvdtrain.adapters.torch.elastic"
    assert hvt.elastic.ElasticSampler is horovod_torch.elastic.ElasticSampler
    assert issubclass(hvt.elastic.TorchState, horovod_torch.elastic.TorchState)
    assert set(horovod_torch.elastic.__all__) <= set(hvt.elastic.__all__)


def test_join_takes_horovods_arguments():
    import inspect

    assert inspect.signature(hvt.join).parameters.keys() == \
        inspect.signature(horovod_torch.join).parameters.keys()
    assert inspect.signature(hvt.join).parameters["device"].default == \
        inspect.signature(horovod_torch.join).parameters["device"].default


@pytest.mark.parametrize("name", [name for name in PUBLIC if name not in OURS])
def test_horovod_names_are_horovods_own_objects(name):
    assert getattr(hvt, name) is getattr(horovod_torch, name)


def test_horovod_collectives_work_through_hvdtrains_module(torch_run):
    ranks = torch_run.both("horovod_api")
    rank_values = [[float(i + 10 * r) for i in range(4)] for r in (0, 1)]
    total = [a + b for a, b in zip(*rank_values, strict=True)]
    reference = hvt.state_fingerprint(make_model(seed=40))  # rank 0's model, broadcast
    for rank, report in enumerate(ranks):
        assert report["checksum"] == reference, f"rank {rank} did not get rank 0's weights"
        assert report["summed"] == [total, [2 * v for v in total]]
        assert report["scattered"] == total[2 * rank:2 * rank + 2]
        assert report["exchanged"] == rank_values[0][2 * rank:2 * rank + 2] + \
            rank_values[1][2 * rank:2 * rank + 2]
        assert report["largest"] == [max(a, b) for a, b in zip(*rank_values, strict=True)]
        assert report["cross"] == [0, 1]
        assert report["controllers"].count(True) == 1
        assert len(report["warnings"]) == 1, report["warnings"]
        # Horovod's test_synchronize_step_warning looks for this phrase.
        assert "optimizer.step() called without optimizer.skip_synchronize()" in \
            report["warnings"][0]


def test_state_fingerprint_tells_different_models_apart():
    """The broadcast check above relies on rank 1's own model differing from rank 0's."""
    assert hvt.state_fingerprint(make_model(seed=40)) != \
        hvt.state_fingerprint(make_model(seed=41))


def own_rows_reference(rank: int) -> dict[str, torch.Tensor]:
    """One plain-PyTorch process on ``rank``'s rows only: what a rank averaging over no
    one else must end with."""
    x, y = make_data()
    model = make_model()
    optimizer = make_optimizer("sgd", model.parameters())
    for step in range(STEPS):
        optimizer.zero_grad()
        part = rows(step, 0, rank, 1)
        loss_fn(model, x[part], y[part]).backward()
        optimizer.step()
    return {name: p.detach() for name, p in model.named_parameters()}


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_a_process_set_limits_the_average_to_its_ranks(controller, tmp_path):
    run = Run(launch("torch_process_sets.py", str(tmp_path), controller=controller), tmp_path)
    run.require_clean()
    for rank in (0, 1):
        for scenario in ("process_set", "process_set_sharded"):
            report = run.report(scenario, rank)
            assert report["included"] is (rank == 0)
            assert report["skipped"] == 0
            assert max_difference(tensors(run, scenario, rank), own_rows_reference(rank)) \
                <= 1e-12, scenario
    # and the two ranks did train apart (their rows differ)
    assert max_difference(own_rows_reference(0), own_rows_reference(1)) > 1e-3


def test_init_chooses_the_idle_wait_defaults_on_the_patched_build(torch_run):
    """The build setup.sh installs carries every patch (its marker says so): init() sets
    the idle wait and, on this CPU-only machine, the 0.1 ms cycle; nothing is announced
    as missing. tests/test_stock_horovod.py checks the opposite on a stock build."""
    for report in torch_run.both("runtime_defaults"):
        assert report["patches"] == [patch.name for patch in horovod_patches.PATCHES]
        for name, value in {**runtime.IDLE_WAIT_DEFAULTS, **runtime.CPU_ONLY_DEFAULTS}.items():
            assert report[name] == value, name
    assert "built without hvdtrain's patches" not in torch_run.result.report()
