"""The core imports no framework: `import hvdtrain` works without torch, TensorFlow or Horovod."""

import doctest
import subprocess
import sys
import textwrap

import pytest

from hvdtrain import elastic, schedule, slurm


def test_core_modules_import_without_any_framework():
    script = textwrap.dedent("""
        import sys

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {"torch", "tensorflow", "keras", "horovod", "mpi4py"}:
                    raise ImportError(f"{name} is blocked for this test")

        sys.meta_path.insert(0, Blocker())
        import hvdtrain, hvdtrain.adapters, hvdtrain.schedule, hvdtrain.checkpoint
        import hvdtrain.consistency, hvdtrain.replicas, hvdtrain.runtime, hvdtrain.watchdog
        import hvdtrain.allocator
        import hvdtrain.validation, hvdtrain.metrics, hvdtrain.nonfinite, hvdtrain.trees
        import hvdtrain.launch, hvdtrain.cli, hvdtrain.doctor
        import hvdtrain.elastic, hvdtrain.slurm, hvdtrain.local_hosts
        assert hvdtrain.cli.main(["schedule", "--base-lr", "0.1", "--batch-size-per-worker",
                                  "32", "--workers", "16", "--steps-per-epoch", "5",
                                  "--epochs", "6"]) == 0
        print("imported", hvdtrain.__version__)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "imported" in done.stdout


def test_the_torch_adapter_says_what_is_missing_before_init():
    script = textwrap.dedent("""
        import torch
        import hvdtrain.adapters.torch as hvt
        try:
            hvt.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1))
        except RuntimeError as error:
            print(error)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "call hvt.init() first" in done.stdout, done.stderr


@pytest.mark.parametrize("module", [schedule, elastic, slurm])
def test_the_examples_in_the_core_docstrings_hold(module):
    results = doctest.testmod(module)
    assert results.attempted > 0 and results.failed == 0
