"""The core imports no framework: `import hvdtrain` works without torch, TensorFlow or Horovod."""

import doctest
import os
import subprocess
import sys
import textwrap

import pytest

from hvdtrain import (
    collective,
    compression,
    elastic,
    horovod_patches,
    runtime,
    schedule,
    tally,
    warmup,
)
from hvdtrain.jobs import doctor, slurm


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
        import hvdtrain.jobs.launch, hvdtrain.jobs.cli, hvdtrain.jobs.doctor
        import hvdtrain.elastic, hvdtrain.jobs.slurm, hvdtrain.jobs.local_hosts
        import hvdtrain.horovod_patches, hvdtrain.collective, hvdtrain.tally
        assert hvdtrain.jobs.cli.main(["schedule", "--base-lr", "0.1",
                                       "--batch-size-per-worker", "32", "--workers", "16",
                                       "--steps-per-epoch", "5", "--epochs", "6"]) == 0
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


@pytest.mark.parametrize("module", [schedule, warmup, elastic, slurm, horovod_patches, runtime,
                                    collective, doctor, tally, compression])
def test_the_examples_in_the_core_docstrings_hold(module):
    results = doctest.testmod(module)
    assert results.attempted > 0 and results.failed == 0


_IMPORT_EVERYTHING = textwrap.dedent("""
    import importlib, os, sys
    from pathlib import Path

    keras_family = sys.argv[1] == "keras"
    frameworks = ["keras", "tensorflow", "horovod.tensorflow"] if keras_family else [
        "torch", "horovod.torch"]
    for framework in frameworks:  # frameworks may set variables of their own on import
        importlib.import_module(framework)
    import hvdtrain

    root = Path(hvdtrain.__file__).parent
    names = sorted(".".join(("hvdtrain", *path.relative_to(root).with_suffix("").parts))
                   .removesuffix(".__init__") for path in root.rglob("*.py"))
    names = [name for name in names
             if name not in ("hvdtrain.jobs._rank_entry", "hvdtrain.jobs._smoke")
             and ("adapters.keras" in name or "adapters.tensorflow" in name) == keras_family]
    before = dict(os.environ)
    for name in names:
        importlib.import_module(name)
    changed = sorted(key for key in {*before, *os.environ}
                     if before.get(key) != os.environ.get(key))
    print("imported", len(names), "changed", changed, "mpi4py", "mpi4py" in sys.modules)
""")


@pytest.mark.parametrize("family", ["torch", "keras"])
def test_importing_any_hvdtrain_module_changes_no_environment_variable(family):
    """Runtime defaults (and the allocator) apply in init(), never on import; the NumPy
    adapter does not even import mpi4py (which would start MPI) before its init()."""
    done = subprocess.run([sys.executable, "-c", _IMPORT_EVERYTHING, family],
                          capture_output=True, text=True, timeout=180,
                          env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    assert done.returncode == 0, done.stderr
    summary = done.stdout.splitlines()[-1]
    assert summary.endswith("changed [] mpi4py False"), summary
    assert int(summary.split()[1]) > (5 if family == "keras" else 20), summary
