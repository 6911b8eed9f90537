"""Launches shared by the adapter tests: one per controller (and Keras backend) per session."""

import pytest
from harness import Run, launch

from hvdtrain.jobs.launch import CONTROLLERS


def _launch(tmp_path_factory, script, controller, **env):
    out_dir = tmp_path_factory.mktemp(f"{script}-{controller}")
    return Run(launch(script, str(out_dir), controller=controller, env=env), out_dir)


@pytest.fixture(scope="session", params=CONTROLLERS)
def torch_run(request, tmp_path_factory):
    """Every scenario of tests/workers/torch_adapter.py."""
    return _launch(tmp_path_factory, "torch_adapter.py", request.param)


@pytest.fixture(scope="session", params=CONTROLLERS)
def keras_run(request, tmp_path_factory):
    """Every Keras and TensorFlow scenario, Keras on its TensorFlow backend (Horovod's
    timeline can be started, to count collectives)."""
    return _launch(tmp_path_factory, "keras_adapter.py", request.param,
                   KERAS_BACKEND="tensorflow", HOROVOD_TIMELINE="DYNAMIC")


@pytest.fixture(scope="session", params=CONTROLLERS)
def keras_torch_run(request, tmp_path_factory):
    """The fit scenarios with Keras on its torch backend (through horovod.torch)."""
    return _launch(tmp_path_factory, "keras_adapter.py", request.param, KERAS_BACKEND="torch")
