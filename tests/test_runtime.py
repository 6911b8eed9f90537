"""hvdtrain.runtime: launcher variables, the init check, defaults (in one process), and
init() after shutdown() round after round (on 2 and 3 ranks)."""

import os

import pytest
from harness import launch, reports

from hvdtrain import runtime
from hvdtrain.jobs.launch import CONTROLLERS


@pytest.mark.parametrize(("variables", "rank", "size"), [
    ({}, None, None),
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4"}, 1, 4),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"}, 2, 3),
    ({"PMI_RANK": "0", "PMI_SIZE": "2"}, 0, 2),
])
def test_launcher_rank_and_size_come_from_whichever_launcher_set_them(monkeypatch, variables,
                                                                      rank, size):
    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "PMI_RANK", "PMI_SIZE", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert runtime.launcher_rank() == rank
    assert runtime.launcher_size() == size
    assert runtime.under_launcher() == (rank is not None)


def test_missing_defaults_leave_what_the_user_set(monkeypatch):
    environ = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "99"}
    missing = runtime.missing_defaults(environ)
    assert "HOROVOD_STALL_CHECK_TIME_SECONDS" not in missing
    assert missing["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "30"


@pytest.mark.parametrize("elastic", [True, False])
def test_elastic_jobs_get_a_short_gloo_timeout_unless_the_user_set_one(monkeypatch, elastic):
    for name in {**runtime.RUNTIME_DEFAULTS, **runtime.IDLE_WAIT_DEFAULTS,
                 **runtime.CPU_ONLY_DEFAULTS, **runtime.ELASTIC_DEFAULTS}:
        # setenv first, so that monkeypatch restores the variable's absence afterwards
        # (a bare delenv of an absent variable records nothing, and what
        # apply_runtime_defaults sets would leak into every later launch of the session).
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    if elastic:
        monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    else:
        monkeypatch.delenv("HOROVOD_ELASTIC", raising=False)
    runtime.apply_runtime_defaults(accelerator=False)
    assert runtime.elastic_job() is elastic
    assert ("HOROVOD_GLOO_TIMEOUT_SECONDS" in os.environ) is elastic
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "99")
    runtime.apply_runtime_defaults(accelerator=False)
    assert os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "99"


@pytest.mark.parametrize("accelerator", [True, False])
@pytest.mark.parametrize("idle_wait", [True, False])
def test_the_short_cycle_comes_only_with_the_idle_wait_and_without_an_accelerator(
        accelerator, idle_wait):
    """On a Horovod without the idle-wait patch a 0.1 ms cycle would make idle ranks
    synchronise ten times as often: Horovod's own cycle stays there."""
    defaults = runtime.runtime_defaults(accelerator, idle_wait, elastic=False)
    assert ("HVDTRAIN_IDLE_WAIT_MS" in defaults) is idle_wait
    assert ("HOROVOD_CYCLE_TIME" in defaults) is (idle_wait and not accelerator)
    assert runtime.RUNTIME_DEFAULTS.items() <= defaults.items()


@pytest.mark.parametrize(("variables", "expected"), [
    ({}, True),  # Horovod's default controller when built with MPI
    ({"HOROVOD_CONTROLLER": "MPI"}, True),
    ({"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}, False),  # horovodrun --gloo
    ({"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "mpi"}, True),
])
def test_mpi_is_used_by_the_default_controller_or_when_asked_for(variables, expected):
    assert runtime.uses_mpi(variables) is expected


ROUNDS = 100


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("controller", CONTROLLERS)
def test_init_works_again_after_shutdown_round_after_round(controller, np):
    """100 rounds of ``init()``, collectives checked against each rank's own computation
    (allreduces, an alltoall, an allgather, a broadcast, an allreduce in a process set of
    every rank but 0) and ``shutdown()``, as Horovod's own test suite and a user's restarts
    do. Under Gloo such rounds aborted now and then in init() (gloo::IoException) before
    patch 0010 (tests/test_horovod_patches.py has the deterministic test). Under MPI the
    worker starts MPI through mpi4py first, as the docs say to (the next test is why)."""
    done = reports(launch("reinit.py", str(ROUNDS), controller=controller, np=np).check())
    assert sorted(report["rank"] for report in done) == list(range(np))
    for report in done:
        assert report["rounds"] == ROUNDS, report
        assert report["first_wrong"] is None, report


def test_init_after_shutdown_under_an_mpi_horovod_started_is_refused_saying_how():
    """Horovod finalizes at shutdown() an MPI it started itself, and MPI cannot start
    twice: the next init() died inside MPI ("The MPI_Query_thread() function was called
    after MPI_FINALIZE was invoked ... Your MPI job will now abort"). hvdtrain's init()
    refuses it instead, saying how to start MPI so that it stays up."""
    done = reports(launch("reinit.py", "1", "--mpi-started-by-horovod", controller="mpi")
                   .check())
    assert sorted(report["rank"] for report in done) == [0, 1]
    for report in done:
        assert report["first_wrong"] is None, report
        assert report["refused"] == runtime.MPI_REINIT_MESSAGE
