"""hvdtrain.deprecation: old names keep working, warning with the new name; each name an
issue renamed is checked here."""

import subprocess
import sys

import pytest
import torch

import hvdtrain.consistency
import hvdtrain.replicas
from hvdtrain.adapters.torch import LinearScalingWarmup
from hvdtrain.adapters.torch.elastic import TorchState


@pytest.mark.parametrize(("module", "old", "new"), [
    (hvdtrain.consistency, "first_disagreement", "first_fact_difference"),
    (hvdtrain.replicas, "first_mismatch", "first_checksum_difference"),
])
def test_an_old_function_name_warns_and_is_the_new_function(module, old, new):
    with pytest.warns(DeprecationWarning, match=f"{module.__name__}.{old} is now "
                                                f"{module.__name__}.{new}"):
        assert getattr(module, old) is getattr(module, new)
    with pytest.raises(AttributeError, match="has no attribute 'first_nothing'"):
        module.first_nothing  # noqa: B018


def _warmup() -> tuple[torch.nn.Module, torch.optim.Optimizer, LinearScalingWarmup]:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    warmup = LinearScalingWarmup(optimizer, batch_size_per_worker=4, steps_per_epoch=3,
                                 world_size=1)
    return model, optimizer, warmup


def test_the_elastic_torch_state_takes_its_warmup_under_the_keras_name_and_the_old_one():
    model, optimizer, warmup = _warmup()
    assert TorchState(model, optimizer, warmup=warmup).warmup is warmup
    with pytest.warns(DeprecationWarning, match=r"TorchState\(scheduler=...\) is now "
                                                r"TorchState\(warmup=...\)"):
        state = TorchState(model, optimizer, scheduler=warmup)
    assert state.warmup is warmup
    with pytest.warns(DeprecationWarning, match="TorchState.scheduler is now TorchState.warmup"):
        assert state.scheduler is warmup
    with pytest.raises(TypeError, match="got both scheduler= and warmup="):
        TorchState(model, optimizer, warmup=warmup, scheduler=warmup)


MOVED = ["cli", "doctor", "launch", "local_hosts", "slurm", "_rank_entry", "_smoke", "plot"]


@pytest.mark.parametrize("name", MOVED)
def test_a_moved_module_imports_by_its_old_path_warning_with_the_new_one(name):
    """In a fresh interpreter (an earlier import would leave nothing to warn about)."""
    script = (f"import warnings, importlib\n"
              f"warnings.simplefilter('error', DeprecationWarning)\n"
              f"try:\n"
              f"    importlib.import_module('hvdtrain.{name}')\n"
              f"except DeprecationWarning as warning:\n"
              f"    print('warned:', warning)\n"
              f"warnings.simplefilter('ignore')\n"
              f"old = importlib.import_module('hvdtrain.{name}')\n"
              f"print('same:', old is importlib.import_module('hvdtrain.jobs.{name}'))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert f"warned: hvdtrain.{name} is now hvdtrain.jobs.{name}" in done.stdout, done.stderr
    assert "same: True" in done.stdout, done.stderr


def test_the_public_ray_path_stays_without_a_warning():
    script = ("import warnings\n"
              "warnings.simplefilter('error')\n"
              "from hvdtrain.ray import run\n"
              "import hvdtrain.jobs.ray\n"
              "print(run is hvdtrain.jobs.ray.run)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "True", done.stderr
